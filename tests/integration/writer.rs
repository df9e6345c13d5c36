//! One writer per cluster: the sync that holds the Lease writes, a second one follows and
//! waits, takes over within the lease's duration when the first is killed and at once when
//! it stops cleanly; one decision log has one sync; a lease the credentials may not take
//! is an error that says what to grant.

use std::time::{Duration, Instant};

use cilium_idmig::app::lease::{LeaseKeeper, LeaseOptions, Writer};
use cilium_idmig::io::k8s::K8sTarget;
use cilium_idmig::io::lease::LeaseApi;
use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::{World, log_records};
use crate::sync::{Sync, wait_for};

const P: &str = "cilium/state/identities/v1";

fn created_by(w: &World, log: &str) -> Vec<u64> {
    let path = std::path::PathBuf::from(w.path(log));
    if !path.exists() {
        return Vec::new();
    }
    log_records(&path)
        .iter()
        .filter(|r| r["outcome"] == "created")
        .filter_map(|r| r["target_id"].as_u64())
        .collect()
}

/// A Lease keeper in this process on the sandbox's Lease, as `who`.
pub(crate) fn keeper(w: &World, opts: &LeaseOptions, who: &str) -> LeaseKeeper {
    let target = K8sTarget::from_url(&w.sb.url()).unwrap();
    LeaseKeeper::start(
        LeaseApi::new(&target, &opts.namespace, &opts.name),
        opts.clone(),
        who.into(),
    )
}

/// Waits at most 10 s until `keeper` sees the writer as `is` says (`what`, if it does not).
pub(crate) async fn until_writer(
    keeper: &LeaseKeeper,
    what: &str,
    mut is: impl FnMut(&Writer) -> bool,
) {
    let mut writer = keeper.writer.clone();
    tokio::time::timeout(Duration::from_secs(10), writer.wait_for(|w| is(w)))
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 10 s"))
        .unwrap();
}

fn holder(w: &World) -> Option<String> {
    let leases = w.sb.leases();
    let lease = leases.get(&("kube-system".to_string(), "cilium-idmig-sync".to_string()))?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_sync_writes_and_a_second_waits_then_takes_over() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/900"), b"k8s:app=first;").await;
    let first = Sync::start_with_log(&w, "first.jsonl", &[]);
    wait_for(20, "900 mirrored", || w.sb.objects().get("900").cloned()).await;
    assert!(
        holder(&w).unwrap().ends_with("first.jsonl"),
        "{:?}",
        holder(&w)
    );

    let second = Sync::start_with_log(&w, "second.jsonl", &[]);
    second
        .wait_for_line("first.jsonl holds the lease", 15)
        .await;
    w.etcd.put(&format!("{P}/id/901"), b"k8s:app=second;").await;
    wait_for(10, "901 mirrored", || w.sb.objects().get("901").cloned()).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(created_by(&w, "first.jsonl"), vec![900, 901]);
    assert!(
        created_by(&w, "second.jsonl").is_empty(),
        "the waiting sync wrote"
    );
    // The standby writes nothing but says what it sees.
    let seen = second.wait_for_line("· 2 identities", 15).await;
    assert!(seen.contains("standby"), "{seen}");

    // The holder dies without a word: the second takes over within the lease's 15 s.
    first.kill().await;
    let killed = Instant::now();
    second.wait_for_line("taken: this sync writes", 25).await;
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(20), "took over after {took:?}");
    w.etcd.put(&format!("{P}/id/902"), b"k8s:app=third;").await;
    wait_for(10, "902 mirrored", || w.sb.objects().get("902").cloned()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(created_by(&w, "second.jsonl"), vec![902]);

    // A clean stop gives the lease up: a waiting sync takes it at once.
    let third = Sync::start_with_log(&w, "third.jsonl", &[]);
    third
        .wait_for_line("second.jsonl holds the lease", 15)
        .await;
    let (code, text) = second.stop().await;
    assert_eq!(code, 0, "{text}");
    let stopped = Instant::now();
    third.wait_for_line("taken: this sync writes", 10).await;
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
    let (code, text) = third.stop().await;
    assert_eq!(code, 0, "{text}");
    assert_eq!(holder(&w), None, "released at the clean stop");
    eprintln!("took over {took:?} after a SIGKILL");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_log_has_one_sync_and_a_refused_lease_says_what_to_grant() {
    let w = World::new(SandboxConfig::default()).await;
    let first = Sync::start_with_log(&w, "sync.jsonl", &[]);
    first.wait_for_line("taken: this sync writes", 15).await;
    let log = w.path("sync.jsonl");
    let again = w.cli(&["sync", "--decision-log", &log]).await;
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(
        again.stderr.contains("in use by another process"),
        "{}",
        again.stderr
    );
    // Refused before its first line: the first sync's log holds one session, its own.
    let sessions = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"session\":"))
        .count();
    assert_eq!(sessions, 1, "{}", std::fs::read_to_string(&log).unwrap());
    let (code, _) = first.stop().await;
    assert_eq!(code, 0);

    let denied = World::new(SandboxConfig {
        denied: vec![
            ("create".into(), "leases".into()),
            ("get".into(), "leases".into()),
        ],
        ..SandboxConfig::default()
    })
    .await;
    let refused = denied.cli(&["sync"]).await;
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("lease kube-system/cilium-idmig-sync")
            && refused
                .stderr
                .contains("grant get, create and update on leases"),
        "{}",
        refused.stderr
    );
    assert!(denied.sb.objects().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_holder_whose_renewals_hang_stops_writing_before_anyone_may_take_over() {
    let w = World::new(SandboxConfig::default()).await;
    let keeper = keeper(&w, &LeaseOptions::default(), "first");
    until_writer(&keeper, "the lease taken", |w| *w == Writer::Us).await;
    assert!(keeper.holding() && keeper.gate.open());
    // The lease endpoint stops answering (identities are still served): renewals hang.
    let hung = Instant::now();
    w.sb.set_lease_delay(Duration::from_secs(600));
    // Writes stop within two thirds of the duration of the last renewal (10 s), before a
    // standby may take over (15 s after the record last changed), however long a renewal
    // hangs.
    wait_for(12, "writes stop", || (!keeper.gate.open()).then_some(())).await;
    assert!(!keeper.holding());
    assert!(
        hung.elapsed() < Duration::from_secs(11),
        "{:?}",
        hung.elapsed()
    );
    // The answers come back: held again.
    w.sb.set_lease_delay(Duration::ZERO);
    wait_for(15, "held again", || keeper.holding().then_some(())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keepers_try_at_their_cadence_and_a_dropped_one_lets_the_lease_go() {
    let w = World::new(SandboxConfig::default()).await;
    // A short lease, so the holder renews every second and a standby tries as often.
    let opts = LeaseOptions {
        duration: Duration::from_secs(3),
        ..LeaseOptions::default()
    };
    let first = keeper(&w, &opts, "first");
    until_writer(&first, "the lease taken", |w| *w == Writer::Us).await;
    // Created as client-go's leader election creates it: its holder, duration and times.
    let spec =
        |w: &World| w.sb.leases()[&(opts.namespace.clone(), opts.name.clone())]["spec"].clone();
    let created = spec(&w);
    assert_eq!(created["holderIdentity"], "first", "{created}");
    assert_eq!(created["leaseDurationSeconds"], 3, "{created}");
    assert_eq!(created["leaseTransitions"], 0, "{created}");
    assert!(
        created["acquireTime"].is_string() && created["renewTime"].is_string(),
        "{created}"
    );
    let second = keeper(&w, &opts, "second");
    let sees_holder = |w: &Writer| matches!(w, Writer::Other { .. });
    until_writer(&second, "the second sees the holder", sees_holder).await;

    // Between tries each keeper waits: over 6 s a holder renews about six times (a read
    // and a replace each) and a standby reads about six times, never in a busy loop.
    w.sb.reset_counts();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let requests: u64 = ["GET", "PUT", "POST"]
        .iter()
        .map(|m| {
            w.sb.request_count(&format!("{m} {}", opts.name))
                + w.sb.request_count(&format!("{m} leases"))
        })
        .sum();
    assert!(
        (6..=40).contains(&requests),
        "{requests} Lease requests in 6 s from a holder and a standby"
    );

    // The holder's task ends with it, though nobody released it (its sync's task aborted,
    // or unwound in a panic): it gives the lease up, and the standby takes over at its next
    // try, well within the lease's duration.
    drop(first);
    let dropped = Instant::now();
    let what = "the standby takes the lease a dropped keeper held";
    until_writer(&second, what, |w| *w == Writer::Us).await;
    assert!(
        dropped.elapsed() < Duration::from_secs(6),
        "{:?}",
        dropped.elapsed()
    );
    let taken = spec(&w);
    assert_eq!(taken["holderIdentity"], "second", "{taken}");
    assert_eq!(taken["leaseTransitions"], 1, "{taken}");
    assert_eq!(taken["leaseDurationSeconds"], 3, "{taken}");
    second.release().await;
    assert_eq!(holder(&w), None, "released");
}
