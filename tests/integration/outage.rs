//! `sync` as production fails it: the API server and etcd gone for a minute and for five
//! (it never gives up, `/healthz` says so within 10 s and recovers within 10 s, and what
//! arrived meanwhile is mirrored within 30 s), connections that stay open and carry nothing
//! (seen within 60 s, replaced, caught up), a decision log that cannot be written, and one
//! gone when the cutover check reads it.

use std::time::{Duration, Instant};

use cilium_idmig::core::labels::{parse_label_key, to_security_labels};
use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::World;
use crate::harness::free_port;
use crate::proxy::{Mode, Proxy};
use crate::sync::{Sync, wait_for};

const P: &str = "cilium/state/identities/v1";

/// `GET path` on sync's status server: the status and body, or `None` when unreachable.
async fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .ok()?
        .ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Some((code, body))
}

/// Waits until `/healthz` answers `healthy` (200) or not (503); how long it took.
async fn health_turns(addr: &str, healthy: bool, within: Duration, why: &str) -> Duration {
    let start = Instant::now();
    loop {
        let code = get(addr, "/healthz").await.map(|(c, _)| c);
        if code.is_some_and(|c| (c == 200) == healthy) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{why}: /healthz still {code:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `cilium_idmig_watch_up{source}` from `/metrics`.
async fn watch_up(addr: &str, source: &str) -> Option<i64> {
    let (_, body) = get(addr, "/metrics").await?;
    let key = format!("cilium_idmig_watch_up{{source=\"{source}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

/// A kubeconfig for the sandbox reached at `url` (a proxy).
fn kubeconfig_via(w: &World, url: &str) -> String {
    let text = std::fs::read_to_string(w.path("kubeconfig")).unwrap();
    let path = w.path("kubeconfig-via-proxy");
    std::fs::write(&path, text.replace(&w.sb.url(), url)).unwrap();
    path
}

async fn mirrored(w: &World, ids: std::ops::Range<u32>, within: Duration, what: &str) {
    wait_for(within.as_secs(), what, || {
        let o = w.sb.objects();
        ids.clone()
            .all(|i| o.contains_key(&i.to_string()))
            .then_some(())
    })
    .await;
}

/// The API server (behind a proxy that drops every connection) and etcd (killed) gone for
/// `outage`; identities arrive in etcd while the API server is gone.
async fn outage_is_outlived(outage: Duration) {
    let mut w = World::new(SandboxConfig::default()).await;
    let api = Proxy::start(&w.sb.url()).await;
    let kc = kubeconfig_via(&w, &api.url());
    let status = format!("127.0.0.1:{}", free_port());
    w.etcd.put(&format!("{P}/id/800"), b"k8s:app=before;").await;
    let s = Sync::start_via(&w, &w.etcd.endpoint, &kc, &["--status-addr", &status]);
    mirrored(&w, 800..801, Duration::from_secs(30), "800 mirrored").await;
    health_turns(&status, true, Duration::from_secs(30), "started").await;

    api.set(Mode::Down);
    let gone = Instant::now();
    for i in 801..806u32 {
        let key = format!("{P}/id/{i}");
        w.etcd
            .put(&key, format!("k8s:app=during-{i};").as_bytes())
            .await;
    }
    let seen = health_turns(&status, false, Duration::from_secs(10), "API server gone").await;
    assert_eq!(watch_up(&status, "kubernetes").await, Some(0));
    w.etcd.kill();
    let remaining = outage.saturating_sub(gone.elapsed());
    tokio::time::sleep(remaining).await;
    assert!(
        !w.sb.objects().contains_key("801"),
        "nothing got through the outage"
    );
    // Not ready, but alive: a liveness probe must not restart a sync that rides an outage out.
    assert_eq!(get(&status, "/readyz").await.map(|(c, _)| c), Some(503));
    assert_eq!(get(&status, "/livez").await.map(|(c, _)| c), Some(200));

    w.etcd.restart().await;
    api.set(Mode::Forward);
    let back = health_turns(&status, true, Duration::from_secs(10), "both back").await;
    let mirrored_at = Instant::now();
    mirrored(
        &w,
        801..806,
        Duration::from_secs(30),
        "the outage's identities",
    )
    .await;
    let caught_up = mirrored_at.elapsed() + back;
    // And it goes on: a new identity after the outage.
    w.etcd.put(&format!("{P}/id/806"), b"k8s:app=after;").await;
    mirrored(
        &w,
        806..807,
        Duration::from_secs(10),
        "806 after the outage",
    )
    .await;
    assert_eq!(watch_up(&status, "etcd").await, Some(1));
    assert_eq!(watch_up(&status, "kubernetes").await, Some(1));

    let (code, text) = s.stop().await;
    // Failed writes during the outage were made afterwards: nothing left failing.
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("7 mirrored"), "{text}");
    eprintln!(
        "outage {outage:?}: unhealthy after {seen:?}, healthy {back:?} after the return, caught up in {caught_up:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_outlives_a_one_minute_outage_of_both_servers() {
    outage_is_outlived(Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_outlives_a_five_minute_outage_of_both_servers() {
    outage_is_outlived(Duration::from_secs(300)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_that_carry_nothing_are_seen_replaced_and_caught_up() {
    let w = World::new(SandboxConfig::default()).await;
    let kv = Proxy::start(&w.etcd.endpoint).await;
    let api = Proxy::start(&w.sb.url()).await;
    let kc = kubeconfig_via(&w, &api.url());
    let status = format!("127.0.0.1:{}", free_port());
    w.etcd.put(&format!("{P}/id/700"), b"k8s:app=before;").await;
    let s = Sync::start_via(&w, &kv.url(), &kc, &["--status-addr", &status]);
    mirrored(&w, 700..701, Duration::from_secs(30), "700 mirrored").await;
    health_turns(&status, true, Duration::from_secs(30), "started").await;
    // Quiet for longer than a watch's rotation: a healthy quiet watch stays healthy.
    tokio::time::sleep(Duration::from_secs(50)).await;
    health_turns(&status, true, Duration::from_secs(1), "quiet but alive").await;

    kv.set(Mode::Stall);
    api.set(Mode::Stall);
    let stalled = Instant::now();
    w.etcd.put(&format!("{P}/id/701"), b"k8s:app=during;").await;
    // Each watch sees its stall within 60 s.
    let (mut etcd_seen, mut k8s_seen) = (None, None);
    while etcd_seen.is_none() || k8s_seen.is_none() {
        if etcd_seen.is_none() && watch_up(&status, "etcd").await == Some(0) {
            etcd_seen = Some(stalled.elapsed());
        }
        if k8s_seen.is_none() && watch_up(&status, "kubernetes").await == Some(0) {
            k8s_seen = Some(stalled.elapsed());
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(62),
            "a stall unseen after 60 s: etcd {etcd_seen:?}, kubernetes {k8s_seen:?}\n{}",
            s.text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    health_turns(&status, false, Duration::from_secs(1), "stalled").await;
    assert!(!w.sb.objects().contains_key("701"));

    kv.set(Mode::Forward);
    api.set(Mode::Forward);
    let back = Instant::now();
    mirrored(&w, 701..702, Duration::from_secs(30), "701 caught up").await;
    health_turns(&status, true, Duration::from_secs(30), "reconnected").await;
    eprintln!(
        "stall seen by etcd after {etcd_seen:?}, by kubernetes after {k8s_seen:?}; caught up in {:?}",
        back.elapsed()
    );
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("stalled"), "the stall was reported:\n{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn when_every_connection_to_the_api_server_goes_dead_writes_and_the_lease_go_on_within_a_minute()
 {
    let w = World::new(SandboxConfig::default()).await;
    let api = Proxy::start(&w.sb.url()).await;
    let kc = kubeconfig_via(&w, &api.url());
    w.etcd.put(&format!("{P}/id/700"), b"k8s:app=before;").await;
    let s = Sync::start_via(&w, &w.etcd.endpoint, &kc, &[]);
    mirrored(&w, 700..701, Duration::from_secs(30), "700 mirrored").await;
    let renewed = || {
        w.sb.leases()
            .values()
            .next()
            .and_then(|l| l["spec"]["renewTime"].as_str().map(str::to_string))
    };
    // Every pooled connection (the watch's, the lease's, the creates') goes dead without
    // closing; a new connection would work.
    api.kill_existing();
    let dead = Instant::now();
    let before = renewed();
    w.etcd.put(&format!("{P}/id/701"), b"k8s:app=during;").await;
    // Each measured from the moment the connections died.
    let (mut created, mut lease) = (None, None);
    while created.is_none() || lease.is_none() {
        if created.is_none() && w.sb.objects().contains_key("701") {
            created = Some(dead.elapsed());
        }
        if lease.is_none() && renewed() != before {
            lease = Some(dead.elapsed());
        }
        assert!(
            dead.elapsed() < Duration::from_secs(60),
            "create {created:?}, lease {lease:?} after 60 s\n{}",
            s.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A split: an agent's object at an id the kvstore holds for other labels, seen through
    // a watch that must itself have moved to a live connection.
    w.etcd.put(&format!("{P}/id/702"), b"k8s:app=kv;").await;
    w.sb.agent().create(
        702,
        &to_security_labels(&parse_label_key("k8s:app=crd;").unwrap()),
        "cilium-agent",
    );
    s.wait_for_line("split allocation at id 702", 60).await;
    let split = dead.elapsed();
    eprintln!(
        "after every connection went dead: create {created:?}, lease {lease:?}, split {split:?}"
    );
    assert!(split < Duration::from_secs(70), "{split:?}");
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decision_log_that_cannot_be_written_stops_the_writes_it_would_record() {
    let w = World::new(SandboxConfig::default()).await;
    let status = format!("127.0.0.1:{}", free_port());
    // Room for the session line and a few dozen records, then writes fail as on a full disk.
    let limit = 6_000;
    let s = Sync::start_with_file_limit(&w, &["--status-addr", &status], limit);
    health_turns(&status, true, Duration::from_secs(30), "started").await;
    // A few written while the log has room, then many more than it can record.
    for i in 0..100u32 {
        let key = format!("{P}/id/{}", 1000 + i);
        w.etcd
            .put(&key, format!("k8s:app=full-{i};").as_bytes())
            .await;
        if i == 4 {
            mirrored(&w, 1000..1005, Duration::from_secs(20), "the first five").await;
        }
    }
    s.wait_for_line("writes not made", 30).await;
    let (_, metrics) = get(&status, "/metrics").await.unwrap();
    let failures: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cilium_idmig_write_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(failures > 0, "counted:\n{metrics}");
    // A malformed entry arrives: its skip cannot be logged, so it is not said as recorded
    // (it is tried again at a later round).
    w.etcd.put(&format!("{P}/id/01200"), b"k8s:app=e;").await;
    // Still following, and still not writing what it cannot record.
    tokio::time::sleep(Duration::from_secs(12)).await;
    health_turns(&status, true, Duration::from_secs(1), "still following").await;
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    assert!(log.len() as u64 <= limit);
    let objects = w.sb.objects();
    assert!(
        !objects.is_empty() && objects.len() < 100,
        "{} objects",
        objects.len()
    );
    for name in objects.keys() {
        assert!(
            log.contains(&format!("\"target_id\":{name}")),
            "{name} was created without its log line"
        );
    }
    let (code, text) = s.stop().await;
    assert_eq!(code, 1, "writes were left unmade:\n{text}");
    assert!(text.contains("writes failed and were not made"), "{text}");
    assert!(
        !text.contains("invalid: 01200"),
        "said though not logged:\n{text}"
    );
}

/// The cutover check reads every decision log it was given when it runs: one that cannot be
/// read then (moved, its volume gone) holds cutover back, said with the file's name, though
/// all else is quiet; once it is back, the next check passes.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_log_gone_when_the_cutover_check_runs_holds_cutover_back_until_it_is_back() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/node-1"), b"300")
        .await;
    // The review's log, given with --resume: read at the start and at each check.
    let review = w.path("review.jsonl");
    std::fs::write(&review, "").unwrap();
    let args = [
        "--resume",
        &review,
        "--until-cutover",
        "--cutover-grace",
        "1s",
    ];
    let mut s = Sync::start(&w, &args);
    mirrored(&w, 300..301, Duration::from_secs(20), "300").await;
    let moved = w.path("review.jsonl.moved");
    std::fs::rename(&review, &moved).unwrap();
    // The last node moves to CRD mode: the rollout is over, and nothing else waits.
    w.etcd.delete(&format!("{P}/value/k8s:app=a;/node-1")).await;
    let line = s.wait_for_line("cutover not yet", 30).await;
    assert!(
        line.contains("the decision logs cannot be read") && line.contains("review.jsonl"),
        "{line}"
    );
    assert!(!s.text().contains("cutover reached"), "{}", s.text());
    std::fs::rename(&moved, &review).unwrap();
    // The next check (within VERIFY_EVERY, 30 s) passes.
    let line = s.ends_at_cutover(60, 20).await;
    assert!(line.contains("verify passes (1 mirrored by sync"), "{line}");
    // Said once for the check that failed, not at every tick.
    let waits = s.text().matches("cutover not yet").count();
    assert_eq!(waits, 1, "{}", s.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_both_sides_are_read_ends_sync_at_once() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/700"), b"k8s:app=a;").await;
    // The lease is served, the identities answer after two minutes: the start-up list hangs.
    w.sb.set_faults(cilium_idmig::sandbox::FaultConfig {
        latency: Duration::from_secs(120),
        ..Default::default()
    });
    let s = Sync::start(&w, &[]);
    // The lease taken, then the round's start-up read under way.
    wait_for(15, "the lease taken", || {
        (!w.sb.leases().is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!s.text().contains("sync started"), "{}", s.text());
    let stopping = Instant::now();
    let (code, text) = s.stop().await;
    let took = stopping.elapsed();
    assert_eq!(code, 0, "{text}");
    assert!(
        took < Duration::from_secs(5),
        "SIGTERM waited {took:?} for the read\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn etcds_progress_moves_the_revision_a_watch_resumes_from() {
    let w = World::new(SandboxConfig::default()).await;
    let kv = Proxy::start(&w.etcd.endpoint).await;
    let kc = w.path("kubeconfig");
    w.etcd.put(&format!("{P}/id/700"), b"k8s:app=before;").await;
    let s = Sync::start_via(&w, &kv.url(), &kc, &[]);
    mirrored(&w, 700..701, Duration::from_secs(30), "700 mirrored").await;
    // Other writes move the store on while the identities stay quiet; a progress answer
    // (asked every 10 s) vouches for all of it.
    for i in 0..5 {
        w.etcd.put(&format!("elsewhere/{i}"), b"x").await;
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    let mut c = w.etcd.client().await.unwrap();
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, None).await.unwrap();
    // The watch has to open again: from the progress revision, past the compaction.
    kv.set(Mode::Down);
    tokio::time::sleep(Duration::from_secs(1)).await;
    kv.set(Mode::Forward);
    w.etcd.put(&format!("{P}/id/701"), b"k8s:app=after;").await;
    mirrored(&w, 701..702, Duration::from_secs(60), "701 mirrored").await;
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
    assert!(
        !text.contains("compacted past the watched revision"),
        "a fresh snapshot although nothing the watch needed was compacted:\n{text}"
    );
}
