//! `sync` against the real etcd and the sandbox: new identities mirrored, a remap arriving
//! live, split allocations, malformed entries, metrics and health, SIGKILL and restart, a
//! compaction, and `--until-cutover` ending when the last `value/` key goes.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

use cilium_idmig::core::labels::{parse_label_key, to_security_labels};
use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::World;
use crate::harness::{bin, free_port, http};

const P: &str = "cilium/state/identities/v1";

/// A running `sync`, its output collected line by line.
pub(crate) struct Sync {
    pub(crate) child: tokio::process::Child,
    out: Arc<Mutex<Vec<String>>>,
}

impl Sync {
    pub(crate) fn start(w: &World, extra: &[&str]) -> Sync {
        Sync::start_via(w, &w.etcd.endpoint, &w.path("kubeconfig"), extra)
    }

    /// Started with its own etcd endpoint and kubeconfig (e.g. through a proxy).
    pub(crate) fn start_via(w: &World, etcd: &str, kc: &str, extra: &[&str]) -> Sync {
        Sync::spawn(w, etcd, kc, "sync.jsonl", extra, None)
    }

    /// Started with its own decision log (a second sync).
    pub(crate) fn start_with_log(w: &World, log: &str, extra: &[&str]) -> Sync {
        let kc = w.path("kubeconfig");
        Sync::spawn(w, &w.etcd.endpoint, &kc, log, extra, None)
    }

    /// Started with every file it writes limited to `bytes` (`RLIMIT_FSIZE`): a write past
    /// it fails as on a full disk.
    pub(crate) fn start_with_file_limit(w: &World, extra: &[&str], bytes: u64) -> Sync {
        Sync::spawn(
            w,
            &w.etcd.endpoint,
            &w.path("kubeconfig"),
            "sync.jsonl",
            extra,
            Some(bytes),
        )
    }

    fn spawn(
        w: &World,
        etcd: &str,
        kc: &str,
        log: &str,
        extra: &[&str],
        file_limit: Option<u64>,
    ) -> Sync {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.current_dir(w.dir.path())
            .arg("sync")
            .args(["--etcd-endpoints", etcd, "--kubeconfig", kc])
            .args(["--decision-log", &w.path(log)])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(bytes) = file_limit {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    // A write past the limit then fails with EFBIG instead of killing.
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    let lim = libc::rlimit {
                        rlim_cur: bytes,
                        rlim_max: bytes,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let out = out.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(pipe).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    out.lock().unwrap().push(l);
                }
            });
        }
        Sync { child, out }
    }

    pub(crate) fn text(&self) -> String {
        self.out.lock().unwrap().join("\n")
    }

    pub(crate) async fn wait_for_line(&self, text: &str, secs: u64) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.out.lock().unwrap().iter().find(|l| l.contains(text)) {
                return l.clone();
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "waited for {text:?}; output:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: nothing is released.
    /// Waits for the cutover line (up to `secs`), then for the process to end by itself with
    /// exit 0 within `exit_secs` (`--until-cutover`); the cutover line.
    pub(crate) async fn ends_at_cutover(&mut self, secs: u64, exit_secs: u64) -> String {
        let line = self.wait_for_line("cutover reached", secs).await;
        let status = tokio::time::timeout(Duration::from_secs(exit_secs), self.child.wait())
            .await
            .expect("sync ends at cutover")
            .unwrap();
        assert_eq!(status.code(), Some(0), "{}", self.text());
        line
    }

    /// Waits for the process to end by itself within `secs`: its exit code and output.
    pub(crate) async fn exits_within(&mut self, secs: u64) -> (i32, String) {
        let status = tokio::time::timeout(Duration::from_secs(secs), self.child.wait())
            .await
            .expect("sync ends by itself")
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        (status.code().unwrap_or(-1), self.text())
    }

    pub(crate) async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }

    pub(crate) async fn stop(mut self) -> (i32, String) {
        let pid = self.child.id().unwrap() as i32;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = self.child.wait().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        (status.code().unwrap_or(-1), self.text())
    }
}

pub(crate) async fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "waited for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn labels(key: &str) -> cilium_idmig::core::labels::SecurityLabels {
    to_security_labels(&parse_label_key(key).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_mirrors_reports_and_reaches_cutover() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/10.0.0.1"), b"300")
        .await;
    // 302 is taken in Kubernetes by other labels: a remap, which waits for a decision.
    w.sb.seed_identity(302, &labels("k8s:app=squatter;"));
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = Sync::start(&w, &["--status-addr", &addr]);
    wait_for(20, "300 mirrored", || w.sb.objects().get("300").cloned()).await;
    // New kvstore identities are mirrored within seconds.
    let t = Instant::now();
    w.etcd.put(&format!("{P}/id/301"), b"k8s:app=b;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=b;/10.0.0.2"), b"301")
        .await;
    wait_for(10, "301 mirrored", || w.sb.objects().get("301").cloned()).await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "mirrored in {:?}",
        t.elapsed()
    );
    // A remap arriving live waits for a decision; the object at 302 is never touched. A
    // kvstore-mode agent took an id CRD-mode agents already use: a split allocation too.
    w.etcd.put(&format!("{P}/id/302"), b"k8s:app=c;").await;
    s.wait_for_line("conflict: 302 is a remap", 10).await;
    s.wait_for_line("split allocation at id 302", 10).await;
    // A CRD-mode agent allocated 305 for other labels, then a kvstore-mode agent 305 too.
    w.sb.seed_identity(305, &labels("k8s:app=crd-side;"));
    w.etcd
        .put(&format!("{P}/value/k8s:app=kv-side;/10.0.0.9"), b"305")
        .await;
    w.etcd
        .put(&format!("{P}/id/305"), b"k8s:app=kv-side;")
        .await;
    let split = s.wait_for_line("split allocation at id 305", 10).await;
    assert!(split.contains("roll 10.0.0.9 to CRD mode next"), "{split}");
    // Each label set on a line of its own.
    s.wait_for_line("  Kubernetes holds   k8s:app=crd-side;", 10)
        .await;
    // Malformed entries are recorded, never written.
    w.etcd.put(&format!("{P}/id/0306"), b"k8s:app=d;").await;
    s.wait_for_line("invalid: 0306", 10).await;
    // A label set Kubernetes holds at 307 arrives in the kvstore at 308: a double.
    w.sb.seed_identity(307, &labels("k8s:app=e;"));
    w.etcd.put(&format!("{P}/id/308"), b"k8s:app=e;").await;
    s.wait_for_line("conflict: 308 is a duplicate", 10).await;
    // Health and metrics.
    let (code, _, health) = http(&format!("http://{addr}"), "GET", "/healthz", None).await;
    assert_eq!((code, health.trim()), (200, "ok"));
    let wanted = [
        "cilium_idmig_kvstore_nodes 3",
        "cilium_idmig_identities_mirrored_total 2",
        "cilium_idmig_pending_decisions",
        "cilium_idmig_split_allocations 2",
        "cilium_idmig_doubles 1",
        "cilium_idmig_sync_lag_seconds_bucket",
        "cilium_idmig_write_failures_total 0",
        "cilium_idmig_watch_up{source=\"etcd\"} 1",
        "cilium_idmig_watch_up{source=\"kubernetes\"} 1",
        "cilium_idmig_last_event_age_seconds{source=\"etcd\"}",
        "cilium_idmig_last_event_age_seconds{source=\"kubernetes\"}",
    ];
    // The gauges follow the events within a round.
    let start = Instant::now();
    loop {
        let (code, _, metrics) = http(&format!("http://{addr}"), "GET", "/metrics", None).await;
        assert_eq!(code, 200);
        let missing: Vec<&str> = wanted
            .iter()
            .copied()
            .filter(|n| !metrics.contains(n))
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{missing:?} not in\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Where it stands, published beside its Lease (at most every 5 s): decisions wait,
    // three nodes are left, two ids are split, one label set is under two ids.
    let standing = wait_for(15, "the standing published", || {
        let d =
            w.sb.config_map_data("kube-system", "cilium-idmig-sync-status")?;
        let now = (
            d["kvstore-nodes"].as_str(),
            d["splits"].as_str(),
            d["doubles"].as_str(),
        );
        (d["phase"] == "waiting-for-decisions" && now == ("3", "2", "1")).then_some(d)
    })
    .await;
    assert_eq!(
        standing["waiting"],
        "waits for 3 kvstore-mode nodes to move"
    );
    assert_eq!(standing["version"], env!("CARGO_PKG_VERSION"));
    assert!(standing["updated"].ends_with('Z'), "{standing:?}");
    let objects = w.sb.objects();
    assert_eq!(
        objects["302"]["security-labels"]["k8s:app"], "squatter",
        "never overwritten"
    );
    assert!(!objects.contains_key("0306") && !objects.contains_key("306"));
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "a stop with nothing failed exits 0:\n{text}");
    assert!(text.contains("sync: "), "status lines: {text}");

    // A restart resumes; with --accept-proposals the remaps are written, and once the last
    // value/ key is gone cutover ends the run.
    let s = Sync::start(
        &w,
        &[
            "--accept-proposals",
            "--until-cutover",
            "--cutover-grace",
            "1s",
        ],
    );
    // The splits still there are named again, with the node to roll (runbook step 6).
    let split = s.wait_for_line("split allocation at id 305", 20).await;
    assert!(split.contains("roll 10.0.0.9 to CRD mode next"), "{split}");
    wait_for(20, "remaps written", || {
        let o = w.sb.objects();
        (o.len() >= 5).then_some(())
    })
    .await;
    let mut c = w.etcd.client().await.unwrap();
    c.delete(
        format!("{P}/value/"),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), s.child.wait_with_output())
        .await
        .expect("sync ends at cutover")
        .unwrap();
    assert_eq!(status.status.code(), Some(0));
    let standing =
        w.sb.config_map_data("kube-system", "cilium-idmig-sync-status")
            .expect("published");
    assert_eq!(
        (standing["phase"].as_str(), standing["error"].as_str()),
        ("cutover-reached", "")
    );
    let mut by_labels: std::collections::BTreeMap<String, u32> = Default::default();
    for o in w.sb.objects().values() {
        let key = cilium_idmig::core::labels::canonical_key(
            &cilium_idmig::core::identity::parse_identity(o)
                .unwrap()
                .labels,
        );
        *by_labels.entry(key).or_default() += 1;
    }
    assert_eq!(by_labels["k8s:app=c;"], 1, "the remap, once");
    assert_eq!(
        by_labels["k8s:app=a;"], 1,
        "no second object after the restart"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_killed_and_restarted_converges_and_survives_a_compaction() {
    let w = World::new(SandboxConfig::default()).await;
    let s = Sync::start(&w, &[]);
    s.wait_for_line("sync: ", 20).await;
    for i in 0..40u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 1000 + i),
                format!("k8s:app=k{i};").as_bytes(),
            )
            .await;
    }
    wait_for(20, "some mirrored", || {
        (w.sb.objects().len() >= 10).then_some(())
    })
    .await;
    let mut s = s;
    s.child.start_kill().unwrap();
    s.child.wait().await.unwrap();
    // More arrive while no sync runs, and etcd compacts its history.
    for i in 40..60u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 1000 + i),
                format!("k8s:app=k{i};").as_bytes(),
            )
            .await;
    }
    let mut c = w.etcd.client().await.unwrap();
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, None).await.unwrap();
    let s = Sync::start(&w, &[]);
    wait_for(30, "all 60 mirrored", || {
        (w.sb.objects().len() == 60).then_some(())
    })
    .await;
    // Compacted again while following: a fresh snapshot, nothing lost.
    for i in 60..70u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 1000 + i),
                format!("k8s:app=k{i};").as_bytes(),
            )
            .await;
    }
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, None).await.unwrap();
    wait_for(30, "all 70 mirrored", || {
        (w.sb.objects().len() == 70).then_some(())
    })
    .await;
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
    let names: std::collections::BTreeSet<String> = w.sb.objects().into_keys().collect();
    assert_eq!(names.len(), 70, "one object per identity");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compaction_while_etcd_is_out_of_reach_keeps_what_sync_reported_and_counted() {
    let w = World::new(SandboxConfig::default()).await;
    let kv = crate::proxy::Proxy::start(&w.etcd.endpoint).await;
    w.etcd.put(&format!("{P}/id/600"), b"k8s:app=first;").await;
    // A duplicate that waits for a decision.
    w.sb.seed_identity(900, &labels("k8s:app=dup;"));
    w.etcd.put(&format!("{P}/id/601"), b"k8s:app=dup;").await;
    let s = Sync::start_via(&w, &kv.url(), &w.path("kubeconfig"), &[]);
    wait_for(20, "600 mirrored", || w.sb.objects().get("600").cloned()).await;
    s.wait_for_line("conflict: 601", 20).await;
    // A second duplicate (so sync writes nothing at 602), then a CRD-mode agent's object
    // at the same id: a split.
    w.sb.seed_identity(901, &labels("k8s:app=dup2;"));
    w.etcd.put(&format!("{P}/id/602"), b"k8s:app=dup2;").await;
    s.wait_for_line("conflict: 602", 20).await;
    assert!(
        w.sb.agent()
            .create(602, &labels("k8s:app=crd-side;"), "cilium-agent")
    );
    s.wait_for_line("split allocation at id 602", 20).await;
    // etcd out of reach; meanwhile an identity arrives and the history is compacted, so
    // the watch cannot resume: a fresh snapshot.
    kv.set(crate::proxy::Mode::Down);
    w.etcd.put(&format!("{P}/id/603"), b"k8s:app=later;").await;
    // Past 603, so the watch's next revision is gone too.
    w.etcd.put("unrelated", b"x").await;
    let mut c = w.etcd.client().await.unwrap();
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, None).await.unwrap();
    kv.set(crate::proxy::Mode::Forward);
    s.wait_for_line("compacted past the watched revision", 60)
        .await;
    wait_for(30, "603 mirrored", || w.sb.objects().get("603").cloned()).await;
    // The count goes on (600 and 603), and nothing is reported twice.
    s.wait_for_line("· 2 mirrored", 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let text = s.text();
    assert_eq!(text.matches("conflict: 601").count(), 1, "{text}");
    assert_eq!(
        text.matches("split allocation at id 602").count(),
        1,
        "{text}"
    );
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_outlives_an_etcd_restart_and_reports_a_split_after_the_kvstore() {
    let mut w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/600"), b"k8s:app=first;").await;
    // Already in Kubernetes under another id: a kvstore copy of these labels is a duplicate,
    // which waits for a decision (so sync does not write it).
    w.sb.seed_identity(900, &labels("k8s:app=dup;"));
    let s = Sync::start(&w, &[]);
    wait_for(20, "600 mirrored", || w.sb.objects().get("600").cloned()).await;
    // The kvstore's allocation first, then a CRD-mode agent's at the same id.
    w.etcd.put(&format!("{P}/id/601"), b"k8s:app=dup;").await;
    s.wait_for_line("conflict: 601 is a duplicate", 10).await;
    w.sb.seed_identity(601, &labels("k8s:app=crd-side;"));
    s.wait_for_line("split allocation at id 601", 10).await;
    // etcd goes away and comes back: sync catches up from where its watch was.
    w.etcd.restart().await;
    w.etcd
        .put(&format!("{P}/id/602"), b"k8s:app=after-restart;")
        .await;
    wait_for(60, "602 mirrored after the restart", || {
        w.sb.objects().get("602").cloned()
    })
    .await;
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("retrying"),
        "the outage was reported:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_objects_come_back_once_and_an_outage_is_caught_up() {
    use cilium_idmig::sandbox::FaultConfig;
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/400"), b"k8s:app=used;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=used;/10.0.0.1"), b"400")
        .await;
    w.etcd.put(&format!("{P}/id/401"), b"k8s:app=unused;").await;
    let s = Sync::start(&w, &[]);
    wait_for(20, "both mirrored", || {
        (w.sb.objects().len() == 2).then_some(())
    })
    .await;
    let url = w.sb.url();
    let ids = "/apis/cilium.io/v2/ciliumidentities";
    // The cluster's GC (or a person) deletes what sync created: an identity still used by a
    // kvstore-mode node comes back once; an unused one does not.
    http(&url, "DELETE", &format!("{ids}/400"), None).await;
    http(&url, "DELETE", &format!("{ids}/401"), None).await;
    wait_for(10, "400 created again", || {
        w.sb.objects().get("400").cloned()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !w.sb.objects().contains_key("401"),
        "unused: not created again"
    );
    http(&url, "DELETE", &format!("{ids}/400"), None).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!w.sb.objects().contains_key("400"), "once, never in a loop");
    // The API server fails every write for a while: nothing is dropped, and the identities
    // that arrived meanwhile are written once it is back.
    w.sb.set_faults(FaultConfig {
        p_500: 1.0,
        writes_only: true,
        ..Default::default()
    });
    for i in 0..5u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 500 + i),
                format!("k8s:app=o{i};").as_bytes(),
            )
            .await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !w.sb.objects().contains_key("500"),
        "nothing gets through the outage"
    );
    w.sb.set_faults(FaultConfig::default());
    wait_for(60, "caught up", || {
        let o = w.sb.objects();
        (0..5u32)
            .all(|i| o.contains_key(&(500 + i).to_string()))
            .then_some(())
    })
    .await;
    let (code, text) = s.stop().await;
    // The retries outlasted the outage: nothing failed for good.
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("8 mirrored"),
        "two, one created again, five after the outage:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_before_cutover_is_clean_and_a_damaged_log_is_refused_everywhere() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/1000"), b"k8s:app=x;").await;
    // Malformed entries of the first read are said once, as a count.
    for bad in ["0999", "+998"] {
        w.etcd.put(&format!("{P}/id/{bad}"), b"k8s:app=bad;").await;
    }
    w.etcd
        .put(&format!("{P}/value/k8s:app=x;/node-1"), b"1000")
        .await;
    let s = Sync::start(&w, &["--until-cutover"]);
    // "started" is said once both watches are established.
    s.wait_for_line("sync started: following both sides", 20)
        .await;
    wait_for(20, "mirrored", || {
        w.sb.objects().contains_key("1000").then_some(())
    })
    .await;
    let (code, text) = s.stop().await;
    assert_eq!(code, 0, "a stop is a clean shutdown:\n{text}");
    assert!(
        text.contains("cutover not reached: 1 kvstore-mode node, 0 pending decisions"),
        "{text}"
    );
    // What sync wrote as it started is said, not only counted.
    assert!(
        text.contains("wrote 1 CiliumIdentity object: decided, or missing in Kubernetes, when sync read both sides"),
        "{text}"
    );
    assert!(
        text.contains("invalid: 2 malformed entries in the kvstore, never written"),
        "{text}"
    );
    assert!(!text.contains("invalid: 0999"), "{text}");
    // Before both sides are read, no counts ("0 identities, no kvstore-mode node left").
    let before = text.split("sync started").next().unwrap_or("");
    assert!(!before.contains("0 identities"), "{text}");

    // A log with a damaged line (not a torn last one) is refused by every command that
    // reads logs, naming the file and the line, before anything is done.
    let good = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    let bad = w.path("damaged.jsonl");
    std::fs::write(&bad, format!("{good}this is not a decision\n{good}")).unwrap();
    let line = good.lines().count() + 1;
    let before = w.sb.request_count("POST ciliumidentities");
    for args in [
        vec![
            "sync",
            "--resume",
            bad.as_str(),
            "--accept-proposals",
            "--until-cutover",
        ],
        vec!["apply", "--yes", "--resume", bad.as_str()],
        vec!["verify", "--decision-log", bad.as_str()],
        vec!["rollback", "--decision-log", bad.as_str()],
    ] {
        let r = tokio::time::timeout(Duration::from_secs(30), w.cli(&args))
            .await
            .unwrap_or_else(|_| panic!("{args:?} went on with a damaged log"));
        assert_eq!(r.code, 2, "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stderr.contains("damaged.jsonl") && r.stderr.contains(&format!("line {line} ")),
            "{args:?}: {}",
            r.stderr
        );
    }
    assert_eq!(
        w.sb.request_count("POST ciliumidentities"),
        before,
        "nothing written"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cutover_arrives_once_no_node_uses_what_still_waits_for_a_decision() {
    let w = World::new(SandboxConfig::default()).await;
    // The kvstore holds 400 for `a`, used by node-1; Kubernetes holds 400 for other labels:
    // a remap that waits for a decision (no --accept-proposals).
    w.etcd.put(&format!("{P}/id/400"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/node-1"), b"400")
        .await;
    w.sb.seed_identity(
        400,
        &to_security_labels(&parse_label_key("k8s:app=squatter;").unwrap()),
    );
    let mut s = Sync::start(&w, &["--until-cutover", "--cutover-grace", "2s"]);
    s.wait_for_line("conflict: 400", 20).await;
    // node-1 moves to CRD mode: its key goes, and nothing uses `a` any more.
    let mut c = w.etcd.client().await.unwrap();
    c.delete(
        format!("{P}/value/"),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let line = s.ends_at_cutover(60, 20).await;
    assert!(line.contains("1 closed as moot"), "{line}");
    assert!(s.text().contains("moot: 400"), "{}", s.text());
    // Closed without a write, and recorded.
    assert_eq!(w.sb.objects().len(), 1);
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    assert!(log.contains("moot (rule)"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cutover_arrives_when_a_mapping_points_at_a_proposal_that_became_moot() {
    let w = World::new(SandboxConfig::default()).await;
    // Two kvstore-mode agents allocated `r` at 300 and 301; CRD-mode agents hold both ids
    // for other labels. 300 gets a remap proposal; 301 is mapped to where that would go.
    let r = "k8s:app=r;";
    w.etcd.put(&format!("{P}/id/300"), r.as_bytes()).await;
    w.etcd.put(&format!("{P}/id/301"), r.as_bytes()).await;
    w.etcd.put(&format!("{P}/value/{r}/node-1"), b"300").await;
    for (id, other) in [(300, "k8s:app=x;"), (301, "k8s:app=y;")] {
        w.sb.seed_identity(id, &to_security_labels(&parse_label_key(other).unwrap()));
    }
    let mut s = Sync::start(&w, &["--until-cutover", "--cutover-grace", "2s"]);
    s.wait_for_line("conflict: 300", 20).await;
    // node-1 moves: nothing uses `r`, neither the proposal nor the mapping to it holds.
    let mut c = w.etcd.client().await.unwrap();
    c.delete(format!("{P}/value/{r}/node-1"), None)
        .await
        .unwrap();
    s.ends_at_cutover(90, 20).await;
    assert!(s.text().contains("moot: 301"), "{}", s.text());
    assert_eq!(w.sb.objects().len(), 2, "closed without a write");
}

#[tokio::test(flavor = "multi_thread")]
async fn reserving_in_the_kvstore_prevents_the_split_allocations_sync_alone_reports() {
    // The same rollout twice (same seed): two blind allocators in a narrow pool, with sync
    // alone, then with sync reserving in the kvstore what Kubernetes holds.
    let alone = crate::support::play_rollout(300, 4, 8.0, 11, false).await;
    assert!(alone.cutover);
    let alone_total = alone.divergence.splits.len() + alone.divergence.doubles.len();
    assert!(
        !alone.divergence.splits.is_empty() && alone.reported_splits > 0,
        "sync alone: kvstore-mode agents hand out ids Kubernetes holds ({:?}, {} reported)",
        alone.divergence,
        alone.reported_splits
    );
    let reserved = crate::support::play_rollout(300, 4, 8.0, 11, true).await;
    assert!(reserved.cutover);
    assert!(reserved.counts.kvstore_allocations > 0 && reserved.counts.crd_allocations > 0);
    // What Kubernetes held when sync started is reserved first thing (the first batch goes
    // before its watches begin): never handed out again. What is left are races within
    // sync's own lag (an id allocated on one side and taken on the other before sync saw
    // it): far fewer.
    assert_eq!(reserved.splits_at_held_ids, 0, "{:?}", reserved.divergence);
    let reserved_total = reserved.divergence.splits.len() + reserved.divergence.doubles.len();
    assert!(
        reserved_total * 3 <= alone_total,
        "with reservation {reserved_total} ({:?}), alone {alone_total}",
        reserved.divergence
    );
    assert!(reserved.took > std::time::Duration::ZERO);
}

/// Every key in etcd with its version and mod revision.
pub(crate) async fn all_keys(w: &World) -> std::collections::BTreeMap<String, (i64, i64)> {
    let mut c = w.etcd.client().await.unwrap();
    c.get("", Some(etcd_client::GetOptions::new().with_all_keys()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                (kv.version(), kv.mod_revision()),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn reservations_in_a_real_etcd_are_found_by_agents_and_released_at_cutover() {
    let w = World::new(SandboxConfig::default()).await;
    let sl = |k: &str| to_security_labels(&parse_label_key(k).unwrap());
    let (a, b, e) = ("k8s:app=a;", "k8s:app=b;", "k8s:app=e;");
    w.etcd.put(&format!("{P}/id/300"), a.as_bytes()).await;
    w.etcd.put(&format!("{P}/value/{a}/node-1"), b"300").await;
    // The kvstore holds 5000 for `e`; a CRD-mode agent created 5000 for other labels.
    w.etcd.put(&format!("{P}/id/5000"), e.as_bytes()).await;
    w.etcd
        .put("cilium/state/nodes/v1/default/node-1", b"{}")
        .await;
    w.sb.seed_identity(300, &sl(a));
    w.sb.seed_identity(4000, &sl(b)); // created by a CRD-mode agent: not in the kvstore
    w.sb.seed_identity(5000, &sl("k8s:app=other;"));
    let before = all_keys(&w).await;
    let mut s = Sync::start(
        &w,
        &[
            "--reserve-in-kvstore",
            "--until-cutover",
            "--cutover-grace",
            "1s",
            "--accept-proposals",
        ],
    );
    let reserved_master = format!("{P}/id/4000");
    let reserved_slave = format!("{P}/value/{b}/cilium-idmig-sync");
    let start = Instant::now();
    loop {
        let keys = all_keys(&w).await;
        if keys.contains_key(&reserved_master) && keys.contains_key(&reserved_slave) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not reserved:\n{}",
            s.text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = w.etcd.client().await.unwrap();
    let get = |r: etcd_client::GetResponse| r.kvs().first().map(|kv| kv.value().to_vec());
    assert_eq!(
        get(c.get(reserved_master.as_str(), None).await.unwrap()),
        Some(b.as_bytes().to_vec())
    );
    // A kvstore-mode agent allocating `b` looks the labels up under value/ and finds 4000.
    let users = c
        .get(
            format!("{P}/value/{b}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(users.kvs()[0].value(), b"4000");
    // Its pool, fed by id/, no longer offers 4000 for other labels; and an agent that picked
    // 4000 anyway (from a stale pool) finds its create-only write of the master key refused,
    // as Cilium's allocator does, and takes another id.
    assert!(c.get(reserved_master.as_str(), None).await.unwrap().count() == 1);
    let create_only = etcd_client::Txn::new()
        .when([etcd_client::Compare::create_revision(
            reserved_master.as_str(),
            etcd_client::CompareOp::Equal,
            0,
        )])
        .and_then([etcd_client::TxnOp::put(
            reserved_master.as_str(),
            "k8s:app=late;",
            None,
        )]);
    assert!(!c.txn(create_only).await.unwrap().succeeded());
    // 5000 is held for other labels: nothing written there.
    assert_eq!(
        get(c.get(format!("{P}/id/5000"), None).await.unwrap()),
        Some(e.as_bytes().to_vec())
    );
    // Sync's key is no node: one kvstore-mode node, not two.
    s.wait_for_line("sync: 1 kvstore-mode node ·", 20).await;
    s.wait_for_line("reserved in the kvstore", 20).await;

    // node-1 moves to CRD mode: cutover, and the reservation is released.
    c.delete(format!("{P}/value/{a}/node-1"), None)
        .await
        .unwrap();
    s.ends_at_cutover(60, 30).await;
    // 4000, and the id sync remapped `e` to (its own remap target, also not in the kvstore).
    assert!(
        s.text()
            .contains("lease revoked, 2 of 2 master keys deleted"),
        "{}",
        s.text()
    );
    // Every other key, inside the prefix and outside, is exactly as it was.
    let after = all_keys(&w).await;
    let mut expected = before.clone();
    expected.remove(&format!("{P}/value/{a}/node-1"));
    assert_eq!(after, expected);
    // Each kvstore write and delete is a decision-log line with its revision.
    let log = std::fs::read_to_string(w.path("sync.jsonl")).unwrap();
    let reserve_line = log
        .lines()
        .find(|l| l.contains("reserve-in-kvstore (rule)") && l.contains("\"4000\""))
        .expect("reservation logged");
    assert!(reserve_line.contains("at revision"), "{reserve_line}");
    assert!(
        log.contains("release-reservation (rule)") && log.contains("deleted id/4000"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_api_server_failing_past_the_retry_budget_does_not_end_sync() {
    use cilium_idmig::sandbox::FaultConfig;
    let w = World::new(SandboxConfig::default()).await;
    let mut s = Sync::start(&w, &[]);
    s.wait_for_line("sync started: following both sides", 20)
        .await;
    // Every create fails, for longer than apply's retry budget (about 13 s).
    w.sb.set_faults(FaultConfig {
        p_500: 1.0,
        writes_only: true,
        ..Default::default()
    });
    w.etcd.put(&format!("{P}/id/700"), b"k8s:app=late;").await;
    s.wait_for_line("kept failing", 40).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "sync ended on the outage:\n{}",
        s.text()
    );
    // The server recovers: what arrived meanwhile is written on sync's timer.
    w.sb.set_faults(FaultConfig::default());
    wait_for(45, "700 mirrored after the outage", || {
        w.sb.objects().contains_key("700").then_some(())
    })
    .await;
    assert!(s.text().contains("trying again in 10 s"), "{}", s.text());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_410_is_one_consistent_relist_that_feeds_the_state_and_the_watch() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/800"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/node-1"), b"800")
        .await;
    let s = Sync::start(&w, &[]);
    s.wait_for_line("sync started: following both sides", 20)
        .await;
    wait_for(20, "800 mirrored", || {
        w.sb.objects().contains_key("800").then_some(())
    })
    .await;
    w.sb.reset_counts();
    // The watch ends and its resourceVersion is too old by the time it comes back; a
    // CRD-mode agent creates 801 meanwhile.
    w.sb.expire_watches();
    w.sb.seed_identity(
        801,
        &to_security_labels(&parse_label_key("k8s:app=crd-side;").unwrap()),
    );
    // The kvstore then holds 801 for other labels: sync sees the split only if the object
    // it created meanwhile reached its state.
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.etcd
        .put(&format!("{P}/id/801"), b"k8s:app=kv-side;")
        .await;
    s.wait_for_line("split allocation at id 801", 20).await;
    // One list after the 410, a consistent one, and the watch resumed from it.
    assert_eq!(w.sb.request_count("LIST quorum"), 1, "{}", s.text());
    assert_eq!(w.sb.request_count("LIST from cache"), 0);
    // And sync goes on watching: a later object arrives as an event.
    w.sb.seed_identity(
        802,
        &to_security_labels(&parse_label_key("k8s:app=later;").unwrap()),
    );
    w.etcd
        .put(&format!("{P}/id/802"), b"k8s:app=kv-later;")
        .await;
    s.wait_for_line("split allocation at id 802", 20).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_split_names_the_nodes_whose_keys_arrive_after_the_master_key() {
    let w = World::new(SandboxConfig::default()).await;
    w.sb.seed_identity(
        900,
        &to_security_labels(&parse_label_key("k8s:app=crd-side;").unwrap()),
    );
    let s = Sync::start(&w, &[]);
    s.wait_for_line("sync started: following both sides", 20)
        .await;
    // A kvstore-mode agent writes the master key, then (a moment later) its value/ key.
    w.etcd
        .put(&format!("{P}/id/900"), b"k8s:app=kv-side;")
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=kv-side;/node-7"), b"900")
        .await;
    let line = s.wait_for_line("split allocation at id 900", 20).await;
    assert!(
        line.contains("roll node-7 to CRD mode next"),
        "the node to roll next is named: {line}"
    );
    s.stop().await;
}

/// The loop never waits on what is slow: a front end that takes none of sync's events (a
/// terminal paused with Ctrl-S, a pager left open) does not hold sync up. With a channel of
/// one event that nobody reads, sync still mirrors every identity and reaches cutover.
#[tokio::test(flavor = "multi_thread")]
async fn a_front_end_that_reads_nothing_never_holds_sync_up() {
    use cilium_idmig::app::metrics::Metrics;
    use cilium_idmig::app::sync::{self, SyncOptions};
    use cilium_idmig::apply::executor::StopFlag;
    use cilium_idmig::sandbox::demo::{self, DemoConfig};

    let world = demo::world(DemoConfig {
        identities: 300,
        seed: 21,
        nodes: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::support::sync_config(&world, (&dir.path().join("sync.jsonl"), "sync"), false);
    // Every node has moved to CRD mode: no `value/` key is left, so cutover can be reached.
    let prefix = format!("{}/value/", cilium_idmig::core::kvstore::DEFAULT_PREFIX);
    for (key, _) in world.kv.range(prefix.as_bytes()).0 {
        world.kv.delete(&key);
    }
    let (tx, unread) = tokio::sync::mpsc::channel(1);
    let opts = SyncOptions {
        accept_proposals: true,
        until_cutover: true,
        cutover_grace: Duration::from_secs(1),
        ..Default::default()
    };
    let run = sync::run(
        cfg,
        opts,
        Arc::new(Metrics::new().unwrap()),
        tx,
        StopFlag::default(),
        None,
    );
    let end = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("sync waited on a front end that reads nothing")
        .unwrap();
    assert!(end.cutover, "{end:?}");
    assert!(end.status.mirrored > 0, "{end:?}");
    assert_eq!(end.unwritten, 0);
    drop(unread);
}

/// The runbook as printed: apply with its own log, sync resuming it to cutover with
/// `--decision-log rollout.jsonl`, then README step 9's `verify --decision-log rollout.jsonl`
/// passes: sync's log carries the decisions it resumed, each saying who decided it and when.
#[tokio::test(flavor = "multi_thread")]
async fn the_runbooks_verify_with_syncs_log_alone_passes_after_cutover() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd.put(&format!("{P}/id/301"), b"k8s:app=b;").await;
    // 301 is taken in Kubernetes by other labels: a remap, decided by apply.
    w.sb.seed_identity(301, &labels("k8s:app=squatter;"));
    let apply_log = w.path("apply.jsonl");
    let r = w.apply_accepting(&apply_log).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let mut s = Sync::start_with_log(
        &w,
        "rollout.jsonl",
        &[
            "--resume",
            &apply_log,
            "--until-cutover",
            "--cutover-grace",
            "1s",
        ],
    );
    let (code, text) = s.exits_within(60).await;
    assert_eq!(code, 0, "sync reaches cutover:\n{text}");
    let rollout = w.path("rollout.jsonl");
    let r = w.cli(&["verify", "--decision-log", &rollout]).await;
    assert_eq!(
        r.code,
        0,
        "{}{}\n{}\n{}",
        r.stdout,
        r.stderr,
        std::fs::read_to_string(&apply_log).unwrap(),
        std::fs::read_to_string(&rollout).unwrap()
    );
    // The carried line says whose decision it is.
    let carried = crate::e2e::log_records(std::path::Path::new(&rollout))
        .into_iter()
        .find(|l| l["id"] == "301" && l["decided_by"] == "accept-proposals")
        .expect("the remap's decision in sync's log");
    assert!(
        carried["decision"]
            .as_str()
            .unwrap()
            .contains("carried from a log it resumed"),
        "{carried}"
    );
    // A second restart carries nothing again.
    let before = std::fs::read_to_string(&rollout).unwrap().lines().count();
    let mut s = Sync::start_with_log(
        &w,
        "rollout.jsonl",
        &[
            "--resume",
            &apply_log,
            "--until-cutover",
            "--cutover-grace",
            "1s",
        ],
    );
    let (code, text) = s.exits_within(60).await;
    assert_eq!(code, 0, "{text}");
    let again: Vec<serde_json::Value> = crate::e2e::log_records(std::path::Path::new(&rollout))
        .into_iter()
        .skip(before)
        .filter(|l| {
            l["decision"]
                .as_str()
                .is_some_and(|d| d.contains("carried"))
        })
        .collect();
    assert!(again.is_empty(), "{again:?}");
}

/// The malformed entries of the first read are one count, as the docs promise; one that
/// arrives later is listed on its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_reads_malformed_entries_are_one_count_and_a_later_one_its_own_line() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    for bad in ["0301", "0302", "0303"] {
        w.etcd.put(&format!("{P}/id/{bad}"), b"k8s:app=b;").await;
    }
    let s = Sync::start(&w, &[]);
    s.wait_for_line("invalid: 3 malformed entries in the kvstore", 20)
        .await;
    wait_for(20, "300 mirrored", || w.sb.objects().get("300").cloned()).await;
    w.etcd.put(&format!("{P}/id/0304"), b"k8s:app=c;").await;
    s.wait_for_line("invalid: 0304:", 20).await;
    let text = s.text();
    for bad in ["0301", "0302", "0303"] {
        assert!(
            !text.contains(&format!("invalid: {bad}:")),
            "{bad} listed on its own:\n{text}"
        );
    }
    let (code, _) = s.stop().await;
    assert_eq!(code, 0);
}

/// README's steps as printed: apply, then `sync --decision-log rollout.jsonl --until-cutover`
/// with no `--resume`, then step 9's `verify --decision-log rollout.jsonl`: the remap apply
/// made is a reuse to sync, which records the mapping its cutover relied on in its own log.
#[tokio::test(flavor = "multi_thread")]
async fn the_readmes_steps_as_printed_verify_with_syncs_log() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd.put(&format!("{P}/id/301"), b"k8s:app=b;").await;
    w.sb.seed_identity(301, &labels("k8s:app=squatter;"));
    let r = w.apply_accepting(&w.path("apply.jsonl")).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let mut s = Sync::start_with_log(
        &w,
        "rollout.jsonl",
        &["--until-cutover", "--cutover-grace", "1s"],
    );
    let (code, text) = s.exits_within(60).await;
    assert_eq!(code, 0, "sync reaches cutover:\n{text}");
    let rollout = w.path("rollout.jsonl");
    let r = w.cli(&["verify", "--decision-log", &rollout]).await;
    assert_eq!(
        r.code,
        0,
        "{}{}\n{}",
        r.stdout,
        r.stderr,
        std::fs::read_to_string(&rollout).unwrap()
    );
    assert!(
        r.stdout.contains("1 via a recorded mapping"),
        "{}",
        r.stdout
    );
    // The line is a record of a proposal carried out, never a decision to resume.
    let mapped = crate::e2e::log_records(std::path::Path::new(&rollout))
        .into_iter()
        .find(|l| l["id"] == "301" && l["outcome"] == "mapped")
        .expect("the mapping in sync's log");
    assert_eq!(mapped["decided_by"], "proposal", "{mapped}");
    assert_eq!(mapped["target_id"], 256, "{mapped}");
}
