//! Sync's reservations in a real etcd where they race, stall and lapse: an agent that takes
//! the id between sync's view and its write (nothing written, the log says by whom), a
//! kvstore that stops answering while sync reserves (the loop that follows both watches goes
//! on), an id Cilium's GC frees while Kubernetes holds it (reserved again), and a lease that
//! expired while etcd was out of reach (a new one, every reservation back on it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cilium_idmig::app::config::ServiceConfig;
use cilium_idmig::app::metrics::Metrics;
use cilium_idmig::app::reserve::{self, ReservationTask, Reservations};
use cilium_idmig::apply::executor::ApplyOptions;
use cilium_idmig::core::labels::{parse_label_key, to_security_labels};
use cilium_idmig::core::range::ClusterScope;
use cilium_idmig::core::sync::SyncState;
use cilium_idmig::core::sync::reserve::Queue;
use cilium_idmig::io::decision_log::DecisionLog;
use cilium_idmig::io::etcd::EtcdOptions;
use cilium_idmig::io::k8s::K8sTarget;
use cilium_idmig::io::kv_source::KvSource;
use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::World;
use crate::harness::free_port;
use crate::proxy::{Mode, Proxy};
use crate::sync::{Sync, all_keys, wait_for};
use crate::writer::{keeper, until_writer};

const P: &str = "cilium/state/identities/v1";

/// Has the task look at the whole view (as the shell's queue asks it to) and waits for its
/// answer: what it reports.
async fn reserve_view(
    task: &mut Option<ReservationTask>,
    queue: &mut Queue,
    state: &SyncState,
    cfg: &ServiceConfig,
) -> Option<reserve::Said> {
    queue.view_changed();
    queue.pump(state, cfg.scope.range, Instant::now());
    task.as_ref().unwrap().send(queue.take_requests());
    let heard = tokio::time::timeout(Duration::from_secs(20), reserve::next_reply(task))
        .await
        .expect("the task answers");
    let reserve::Heard::Reply(reply) = heard else {
        panic!("the writer is gone: {heard:?}");
    };
    queue.on_reply(reply, Instant::now())
}

/// A reservation writer on the test's etcd, started as sync starts one, logging to
/// `reserve.jsonl`: its configuration, the writer and the log's path.
async fn started_writer(w: &World) -> (Arc<ServiceConfig>, Reservations, String) {
    let kv = KvSource::Etcd(EtcdOptions {
        endpoints: vec![w.etcd.endpoint.clone()],
        ..Default::default()
    });
    let log_path = w.path("reserve.jsonl");
    let cfg = Arc::new(ServiceConfig {
        kv: kv.clone(),
        target: K8sTarget::from_url(&w.sb.url()).unwrap(),
        scope: ClusterScope::new(0, Default::default()).unwrap(),
        log: Arc::new(DecisionLog::open(std::path::Path::new(&log_path)).unwrap()),
        apply: ApplyOptions::default(),
        command: "test",
        resume: Vec::new(),
        sync_reserve_in_kvstore: true,
        cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
    });
    let conn = kv.follower().await.unwrap();
    let metrics = Arc::new(Metrics::new().unwrap());
    let r = Reservations::start(&conn, P, cfg.clone(), metrics)
        .await
        .unwrap();
    (cfg, r, log_path)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_id_an_agent_took_after_syncs_view_is_left_alone_and_logged() {
    let w = World::new(SandboxConfig::default()).await;
    let (cfg, r, log_path) = started_writer(&w).await;
    let mut task = Some(ReservationTask::spawn(r));
    let mut queue = Queue::default();

    // Sync's view: Kubernetes holds 4000 (`b`) and 4001 (`c`), the kvstore neither. Between
    // that view and the write, a kvstore-mode agent takes 4001 for `d`.
    let k8s = [(4000, "k8s:app=b;".into()), (4001, "k8s:app=c;".into())];
    let state = SyncState::default().with_kubernetes(k8s.into(), String::new());
    w.etcd.put(&format!("{P}/id/4001"), b"k8s:app=d;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=d;/node-1"), b"4001")
        .await;
    let before = all_keys(&w).await;

    assert_eq!(
        reserve_view(&mut task, &mut queue, &state, &cfg).await,
        None
    );
    assert_eq!(queue.held(), 1);

    // 4000 reserved; 4001 and every other key exactly as the agent left them.
    let after = all_keys(&w).await;
    let mut added: Vec<&String> = after.keys().filter(|k| !before.contains_key(*k)).collect();
    added.sort();
    assert_eq!(
        added,
        [
            &format!("{P}/id/4000"),
            &format!("{P}/value/k8s:app=b;/cilium-idmig-sync")
        ]
    );
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "{k} changed");
    }
    let log = std::fs::read_to_string(&log_path).unwrap();
    // The intent first, then what happened.
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("\"4001\"")).collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].contains("next: put id/4001"), "{}", lines[0]);
    assert!(
        lines[1].contains("id/4001 already held for k8s:app=d;: nothing written"),
        "{}",
        lines[1]
    );
    // Asked again (a fresh view still without the agent's key), it is not tried again.
    assert_eq!(
        reserve_view(&mut task, &mut queue, &state, &cfg).await,
        None
    );
    assert_eq!(all_keys(&w).await, after);

    // Released: the lease's key goes, the master key written goes, the agent's stays.
    let r = task.take().unwrap().finish(Duration::from_secs(10)).await;
    let deleted = r.unwrap().release().await.unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(all_keys(&w).await, before);
}

/// Polls `check` until it holds; fails after `secs`, showing what sync printed.
async fn until<F: std::future::Future<Output = bool>>(
    secs: u64,
    what: &str,
    s: &Sync,
    mut check: impl FnMut() -> F,
) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what}: not after {secs} s\n{}",
            s.text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A metric (a plain gauge or counter) from `/metrics`.
async fn metric(addr: &str, name: &str) -> Option<i64> {
    let (code, _, body) = crate::harness::http(addr, "GET", "/metrics", None).await;
    (code == 200).then_some(())?;
    let prefix = format!("{name} ");
    body.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// `cilium_idmig_split_allocations` from `/metrics`.
async fn splits_metric(addr: &str) -> Option<i64> {
    metric(addr, "cilium_idmig_split_allocations").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kvstore_that_stalls_while_sync_reserves_does_not_hold_up_the_loop() {
    let w = World::new(SandboxConfig::default()).await;
    let sl = |k: &str| to_security_labels(&parse_label_key(k).unwrap());
    w.etcd.put(&format!("{P}/id/5000"), b"k8s:app=e;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=e;/node-1"), b"5000")
        .await;
    let kv = Proxy::start(&w.etcd.endpoint).await;
    let status = format!("127.0.0.1:{}", free_port());
    let s = Sync::start_via(
        &w,
        &kv.url(),
        &w.path("kubeconfig"),
        &["--reserve-in-kvstore", "--status-addr", &status],
    );
    s.wait_for_line("sync started: following both sides", 30)
        .await;
    assert_eq!(splits_metric(&status).await, Some(0));

    // etcd stops answering. A CRD-mode agent creates 4000 (sync reserves it: the write
    // hangs until the client's timeout), then another creates 5000 for other labels than the
    // kvstore's (a split). The loop sees the split at once, not after the hung write.
    kv.set(Mode::Stall);
    w.sb.seed_identity(4000, &sl("k8s:app=b;"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.sb.seed_identity(5000, &sl("k8s:app=other;"));
    until(
        8,
        "the split seen while the reservation hangs",
        &s,
        || async { splits_metric(&status).await == Some(1) },
    )
    .await;

    // etcd answers again: the reservation is made.
    kv.set(Mode::Forward);
    let reserved = format!("{P}/id/4000");
    until(90, "4000 reserved after the stall", &s, || async {
        let mut c = w.etcd.client().await.unwrap();
        let r = c.get(reserved.as_str(), None).await.unwrap();
        r.kvs()
            .first()
            .is_some_and(|kv| kv.value() == b"k8s:app=b;")
    })
    .await;
    wait_for(30, "the split reported", || {
        s.text().contains("split allocation").then_some(())
    })
    .await;
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_id_the_kvstores_gc_frees_while_kubernetes_holds_it_is_reserved_again() {
    let w = World::new(SandboxConfig::default()).await;
    let a = "k8s:app=a;";
    w.etcd.put(&format!("{P}/id/300"), a.as_bytes()).await;
    w.etcd.put(&format!("{P}/value/{a}/node-1"), b"300").await;
    w.sb.seed_identity(300, &to_security_labels(&parse_label_key(a).unwrap()));
    let s = Sync::start(&w, &["--reserve-in-kvstore"]);
    s.wait_for_line("sync started: following both sides", 30)
        .await;
    // Migrated, so nothing to reserve yet.
    let slave = format!("{P}/value/{a}/cilium-idmig-sync");
    assert!(!all_keys(&w).await.contains_key(&slave));

    // node-1 moves to CRD mode and Cilium's kvstore GC removes the master key it left: 300
    // is free again in a kvstore-mode agent's pool while CRD-mode agents use the object.
    let mut c = w.etcd.client().await.unwrap();
    c.delete(format!("{P}/value/{a}/node-1"), None)
        .await
        .unwrap();
    c.delete(format!("{P}/id/300"), None).await.unwrap();
    until(20, "300 reserved again", &s, || async {
        let keys = all_keys(&w).await;
        keys.contains_key(&format!("{P}/id/300")) && keys.contains_key(&slave)
    })
    .await;
    let r = c.get(format!("{P}/id/300"), None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), a.as_bytes());
    let r = c.get(slave.as_str(), None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), b"300");
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("reserve-in-kvstore (rule)") && l.contains("put id/300")),
        "{log}"
    );
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

/// The lease a key is bound to (0: none), and whether the key exists.
async fn lease_of(w: &World, key: &str) -> Option<i64> {
    let mut c = w.etcd.client().await.unwrap();
    let r = c.get(key, None).await.unwrap();
    r.kvs().first().map(|kv| kv.lease())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_that_expired_while_etcd_was_out_of_reach_is_taken_again() {
    let w = World::new(SandboxConfig::default()).await;
    let sl = |k: &str| to_security_labels(&parse_label_key(k).unwrap());
    let (b, c) = ("k8s:app=b;", "k8s:app=c;");
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/node-1"), b"300")
        .await;
    w.sb.seed_identity(4000, &sl(b)); // a CRD-mode agent's: reserved at start
    let s = Sync::start(&w, &["--reserve-in-kvstore"]);
    let slave_b = format!("{P}/value/{b}/cilium-idmig-sync");
    until(20, "4000 reserved", &s, || async {
        lease_of(&w, &slave_b).await.is_some()
    })
    .await;
    let old = lease_of(&w, &slave_b).await.unwrap();
    assert_ne!(old, 0, "sync's value/ key is on its lease");

    // The lease expires (as it would after 15 minutes without etcd): its keys go.
    let mut client = w.etcd.client().await.unwrap();
    client.lease_revoke(old).await.unwrap();
    assert_eq!(lease_of(&w, &slave_b).await, None);
    // The next write finds the lease gone: a new one is taken, 4000's key goes back on it,
    // and the new object is reserved too (after the wait that follows a failed write).
    w.sb.seed_identity(4001, &sl(c));
    let slave_c = format!("{P}/value/{c}/cilium-idmig-sync");
    until(40, "both reservations on a new lease", &s, || async {
        let (lb, lc) = (lease_of(&w, &slave_b).await, lease_of(&w, &slave_c).await);
        lb.is_some_and(|l| l != old && l != 0) && lb == lc
    })
    .await;
    s.wait_for_line("a new lease holds 1 reservations again", 10)
        .await;
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("\"4000\"") && l.contains("again on a new lease")),
        "{log}"
    );
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn objects_that_arrive_while_etcd_is_gone_for_a_minute_are_reserved_when_it_is_back() {
    let mut w = World::new(SandboxConfig::default()).await;
    let sl = |k: &str| to_security_labels(&parse_label_key(k).unwrap());
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/node-1"), b"300")
        .await;
    w.sb.seed_identity(4000, &sl("k8s:app=b;"));
    let s = Sync::start(&w, &["--reserve-in-kvstore"]);
    let slave = |l: &str| format!("{P}/value/{l}/cilium-idmig-sync");
    until(20, "4000 reserved", &s, || async {
        lease_of(&w, &slave("k8s:app=b;")).await.is_some()
    })
    .await;

    // etcd goes for a minute; CRD-mode agents go on creating objects meanwhile.
    w.etcd.kill();
    let gone = Instant::now();
    for id in 4001..4004u32 {
        w.sb.seed_identity(id, &sl(&format!("k8s:app=during-{id};")));
    }
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(gone.elapsed())).await;
    w.etcd.restart().await;
    let back = Instant::now();
    until(45, "the outage's objects reserved", &s, || async {
        let mut all = true;
        for id in 4001..4004u32 {
            all &= lease_of(&w, &slave(&format!("k8s:app=during-{id};")))
                .await
                .is_some();
        }
        all
    })
    .await;
    eprintln!("reserved {:?} after etcd came back", back.elapsed());
    // The reservation from before the outage is still on a live lease.
    assert!(
        lease_of(&w, &slave("k8s:app=b;"))
            .await
            .is_some_and(|l| l != 0)
    );
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

const A: &str = "k8s:app=a;";
const B: &str = "k8s:app=b;";

/// node-1 uses 300 (`A`) in kvstore mode, migrated; a CRD-mode agent made 4000 (`B`), which
/// the kvstore does not hold.
async fn seed_kvstore_node_and_crd_object(w: &World) {
    w.etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    w.etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    w.sb.seed_identity(300, &to_security_labels(&parse_label_key(A).unwrap()));
    w.sb.seed_identity(4000, &to_security_labels(&parse_label_key(B).unwrap()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_sync_takes_over_the_reservations_its_predecessor_left() {
    let w = World::new(SandboxConfig::default()).await;
    let (a, b) = (A, B);
    seed_kvstore_node_and_crd_object(&w).await;
    let slave = format!("{P}/value/{b}/cilium-idmig-sync");
    let first = Sync::start(&w, &["--reserve-in-kvstore"]);
    until(20, "4000 reserved", &first, || async {
        lease_of(&w, &slave).await.is_some()
    })
    .await;
    let old = lease_of(&w, &slave).await.unwrap();
    first.kill().await;
    // Its lease lapses (15 minutes later): the value/ key goes, the master key stays.
    let mut c = w.etcd.client().await.unwrap();
    c.lease_revoke(old).await.unwrap();
    assert_eq!(lease_of(&w, &slave).await, None);
    assert!(lease_of(&w, &format!("{P}/id/4000")).await.is_some());

    // The same sync, restarted: from its decision log it finds 4000 reserved at a revision
    // the master key still has, and puts the value/ key back on its own lease.
    let second = Sync::start(
        &w,
        &[
            "--reserve-in-kvstore",
            "--until-cutover",
            "--cutover-grace",
            "1s",
            "--accept-proposals",
        ],
    );
    until(
        20,
        "4000's value/ key back on a new lease",
        &second,
        || async {
            lease_of(&w, &slave)
                .await
                .is_some_and(|l| l != old && l != 0)
        },
    )
    .await;
    second
        .wait_for_line("took over 1 reservations an earlier sync made", 10)
        .await;
    // Its own now: released at cutover like the rest.
    c.delete(format!("{P}/value/{a}/node-1"), None)
        .await
        .unwrap();
    second.wait_for_line("cutover reached", 60).await;
    second
        .wait_for_line("lease revoked, 1 of 1 master keys deleted", 20)
        .await;
    assert_eq!(lease_of(&w, &format!("{P}/id/4000")).await, None);
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    assert!(log.contains("adopted from an earlier sync"), "{log}");
    let (code, text) = second.stop().await;
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reserved_object_the_operators_gc_deletes_is_never_created_again() {
    let w = World::new(SandboxConfig::default()).await;
    let (a, b) = (A, B);
    // node-1 still runs in kvstore mode (it keeps cutover away); a CRD-mode agent made 4000,
    // which the kvstore does not hold: sync reserves it.
    seed_kvstore_node_and_crd_object(&w).await;
    let mut s = Sync::start(
        &w,
        &[
            "--reserve-in-kvstore",
            "--until-cutover",
            "--cutover-grace",
            "2s",
        ],
    );
    let slave = format!("{P}/value/{b}/cilium-idmig-sync");
    until(30, "4000 reserved", &s, || async {
        all_keys(&w).await.contains_key(&slave)
    })
    .await;

    // The operator's GC deletes the object: sync's `value/` key goes, its master key stays
    // until the release. That master key is sync's own, never a kvstore identity to copy.
    assert!(w.sb.delete_object("4000"));
    until(20, "value/ key removed", &s, || async {
        !all_keys(&w).await.contains_key(&slave)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        !w.sb.objects().contains_key("4000"),
        "sync created an object for its own reservation\n{}",
        s.text()
    );
    assert!(!s.text().contains("conflict: 4000"), "{}", s.text());

    // node-1 moves: cutover arrives (verify expects nothing for the reservation), and the
    // release deletes the master key sync wrote.
    let mut c = w.etcd.client().await.unwrap();
    c.delete(format!("{P}/value/{a}/node-1"), None)
        .await
        .unwrap();
    s.ends_at_cutover(90, 30).await;
    assert!(!w.sb.objects().contains_key("4000"));
    assert!(!all_keys(&w).await.contains_key(&format!("{P}/id/4000")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_keeps_a_reservation_a_node_uses_checked_in_the_delete_itself() {
    use cilium_idmig::io::reservation::{Released, Reserved};
    let etcd = crate::harness::Etcd::start().await;
    let kv = KvSource::Etcd(EtcdOptions {
        endpoints: vec![etcd.endpoint.clone()],
        ..Default::default()
    });
    let reserver = kv.follower().await.unwrap().reserver();
    let lease = reserver.grant_lease().await.unwrap();
    let Reserved::Written { revision } = reserver
        .reserve(P, 4000, B.as_bytes(), lease)
        .await
        .unwrap()
    else {
        panic!("4000 was free");
    };
    // A kvstore-mode agent allocating `B` found the master key and uses it now: the release
    // (no separate read first: the check is part of the delete) keeps it.
    etcd.put(&format!("{P}/value/{B}/node-1"), b"4000").await;
    // As at cutover: the lease goes first, and with it sync's own `value/` key.
    reserver.revoke(lease).await.unwrap();
    let kept = reserver
        .release(P, 4000, B.as_bytes(), revision)
        .await
        .unwrap();
    assert_eq!(kept, Released::Kept("a node's value/ key uses it"));
    let mut c = etcd.client().await.unwrap();
    let master = format!("{P}/id/4000");
    assert_eq!(c.get(master.as_str(), None).await.unwrap().kvs().len(), 1);
    // The agent moves on: released then.
    c.delete(format!("{P}/value/{B}/node-1"), None)
        .await
        .unwrap();
    let gone = reserver
        .release(P, 4000, B.as_bytes(), revision)
        .await
        .unwrap();
    assert_eq!(gone, Released::Deleted);
    assert!(c.get(master.as_str(), None).await.unwrap().kvs().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sync_that_does_not_hold_the_lease_reserves_nothing_until_it_takes_it() {
    use cilium_idmig::app::lease::{LeaseOptions, Writer};
    let w = World::new(SandboxConfig::default()).await;
    // Another sync (another host) holds the one-writer Lease.
    let opts = LeaseOptions::default();
    let other = keeper(&w, &opts, "another-host:sync.jsonl");
    until_writer(&other, "the other sync takes the lease", |w| {
        *w == Writer::Us
    })
    .await;
    seed_kvstore_node_and_crd_object(&w).await;
    let master = format!("{P}/id/4000");
    let status = format!("127.0.0.1:{}", free_port());
    let s = Sync::start(&w, &["--reserve-in-kvstore", "--status-addr", &status]);
    s.wait_for_line("is held by another-host:sync.jsonl", 15)
        .await;
    // Many settles and writer turns later, the standby has written nothing to etcd.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(lease_of(&w, &master).await, None, "a standby reserved 4000");
    let (held, writes) = (
        "cilium_idmig_kvstore_reservations",
        "cilium_idmig_kvstore_writes_total",
    );
    assert_eq!(metric(&status, held).await, Some(0));
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    assert!(!log.contains("reserve-in-kvstore"), "{log}");
    // The other gives the Lease up: this sync takes it and reserves at once.
    other.release().await;
    until(20, "4000 reserved once the lease is taken", &s, || async {
        lease_of(&w, &master).await.is_some()
    })
    .await;
    // Counted where Prometheus reads it: one id held, its writes made (the probe's and the
    // reservation's).
    until(10, "the reservation counted", &s, || async {
        metric(&status, held).await == Some(1)
    })
    .await;
    assert!(metric(&status, writes).await.unwrap_or(0) >= 1);
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_writer_writes_nothing_while_the_leases_gate_is_shut_and_what_was_asked_once_open() {
    use cilium_idmig::apply::executor::WriteGate;
    let w = World::new(SandboxConfig::default()).await;
    let (cfg, mut r, _) = started_writer(&w).await;
    // The Lease's gate, shut: a renewal late, or the Lease taken over since the batch left.
    let gate = WriteGate::default();
    r.gate_writes(gate.clone());
    let mut task = Some(ReservationTask::spawn(r));
    let mut queue = Queue::default();
    let k8s = [(4000, "k8s:app=b;".into())];
    let state = SyncState::default().with_kubernetes(k8s.into(), String::new());
    let before = all_keys(&w).await;
    reserve_view(&mut task, &mut queue, &state, &cfg).await;
    assert_eq!(all_keys(&w).await, before, "written with the gate shut");
    assert_eq!(queue.held(), 0);
    // Open again: the whole view is looked at and 4000 reserved.
    gate.set(Some(std::time::Instant::now() + Duration::from_secs(60)));
    reserve_view(&mut task, &mut queue, &state, &cfg).await;
    assert_eq!(queue.held(), 1);
    assert!(all_keys(&w).await.contains_key(&format!("{P}/id/4000")));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_makes_nothing_the_gc_deleted_and_a_clean_stop_releases_what_was_left() {
    let w = World::new(SandboxConfig::default()).await;
    seed_kvstore_node_and_crd_object(&w).await;
    w.sb.seed_identity(
        4002,
        &to_security_labels(&parse_label_key("k8s:app=c;").unwrap()),
    );
    let (master, other) = (format!("{P}/id/4000"), format!("{P}/id/4002"));
    let first = Sync::start(&w, &["--reserve-in-kvstore"]);
    until(20, "4000 and 4002 reserved", &first, || async {
        lease_of(&w, &master).await.is_some() && lease_of(&w, &other).await.is_some()
    })
    .await;
    let old = lease_of(&w, &format!("{P}/value/k8s:app=b;/cilium-idmig-sync"))
        .await
        .unwrap();
    first.kill().await;
    // While no sync runs, its lease lapses (15 minutes later) and the object goes (the
    // operator's GC): the master keys stay, as written, recorded in the decision log as
    // reserved and not released.
    let mut c = w.etcd.client().await.unwrap();
    c.lease_revoke(old).await.unwrap();
    assert!(w.sb.delete_object("4000"));
    // The same sync, started again, then stopped cleanly: its release takes along what the
    // run before left (4000's key still as written, though its object is gone), as
    // cutover's would.
    let second = Sync::start(&w, &["--reserve-in-kvstore", "--release-reservations"]);
    second.wait_for_line("taken: this sync writes", 20).await;
    second.wait_for_line("took over 1 reservations", 20).await;
    // Its first plans knew 4000 as its own before the writer took it over: the object the
    // GC deleted is not made again (ten settles later).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!w.sb.objects().contains_key("4000"), "made again");
    let (code, text) = second.stop().await;
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("wrote 1 CiliumIdentity"), "{text}");
    assert!(
        text.contains("lease revoked, 2 of 2 master keys deleted"),
        "{text}"
    );
    assert_eq!(lease_of(&w, &master).await, None, "left behind");
    assert_eq!(lease_of(&w, &other).await, None, "left behind");
}
