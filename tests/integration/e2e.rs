//! End to end: the real binary against a real etcd and the sandbox API server.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use cilium_idmig::core::labels::{SecurityLabels, parse_label_key, to_security_labels};
use cilium_idmig::sandbox::{FaultConfig, Sandbox, SandboxConfig};

use crate::harness::{Etcd, Run, run};

const P: &str = "cilium/state/identities/v1";

fn sl(key: &str) -> SecurityLabels {
    to_security_labels(&parse_label_key(key).unwrap())
}

const A: &str = "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;";
const B: &str = "k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;";
const C: &str = "k8s:app=c;k8s:io.kubernetes.pod.namespace=shop;";
const D: &str = "k8s:app=d;k8s:io.kubernetes.pod.namespace=shop;";
const E: &str = "k8s:app=e;reserved:host=;k8s:io.kubernetes.pod.namespace=shop;";

/// One identity of every kind, in etcd and the sandbox.
pub(crate) async fn seed_every_kind(etcd: &Etcd, sb: &Sandbox) {
    for (id, labels) in [
        ("300", A),
        ("301", B),
        ("302", C),
        ("303", D),
        ("304", E),
        ("0305", A),
        ("5", B),
        ("306", ""),
        ("307", "k8s:app;"),
    ] {
        etcd.put(&format!("{P}/id/{id}"), labels.as_bytes()).await;
    }
    etcd.put(&format!("{P}/value/{B}/node-1"), b"301").await;
    etcd.put(&format!("{P}/value/{B}/node-2"), b"301").await;
    sb.seed_identity(300, &sl(A)); // already migrated
    sb.seed_identity(302, &sl("k8s:app=squatter;")); // remap
    sb.seed_identity(303, &sl("k8s:app=squatter2;")); // reuse...
    sb.seed_identity(900, &sl(D)); // ...of 900
    sb.seed_identity(901, &sl(E)); // duplicate
}

pub(crate) struct World {
    pub(crate) etcd: Etcd,
    pub(crate) sb: Sandbox,
    pub(crate) dir: tempfile::TempDir,
}

impl World {
    pub(crate) async fn new(cfg: SandboxConfig) -> World {
        let etcd = Etcd::start().await;
        let sb = Sandbox::start(cfg).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        sb.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
        World { etcd, sb, dir }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    pub(crate) async fn cli(&self, args: &[&str]) -> Run {
        let kc = self.path("kubeconfig");
        let mut full: Vec<&str> = args.to_vec();
        // Rollback reads no kvstore, and takes no etcd flag.
        if args.first() != Some(&"rollback") {
            full.extend(["--etcd-endpoints", &self.etcd.endpoint]);
        }
        full.extend(["--kubeconfig", &kc]);
        run(self.dir.path(), &full).await
    }

    /// `apply --yes --accept-proposals` with its decisions and outcomes in `log`.
    pub(crate) async fn apply_accepting(&self, log: &str) -> Run {
        self.cli(&[
            "apply",
            "--yes",
            "--accept-proposals",
            "--decision-log",
            log,
        ])
        .await
    }

    pub(crate) fn state(&self) -> BTreeMap<String, SecurityLabels> {
        self.sb
            .objects()
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    cilium_idmig::core::identity::parse_identity(&v)
                        .unwrap()
                        .labels,
                )
            })
            .collect()
    }
}

pub(crate) fn log_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_then_apply_a_reviewed_plan() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let plan_path = w.path("plan.json");
    let r = w.cli(&["plan", "--output", &plan_path]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("remap"), "{}", r.stdout);
    let mut plan: Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    assert_eq!(plan["version"], 1);
    assert_eq!(plan["target"]["server"], w.sb.url());
    assert_eq!(plan["range"]["min"], 256);
    let kind_of = |plan: &Value, id: &str| {
        plan["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(kind_of(&plan, "300")["kind"], "already-migrated");
    assert_eq!(kind_of(&plan, "301")["kind"], "create");
    assert_eq!(kind_of(&plan, "301")["nodes"], 2);
    assert_eq!(kind_of(&plan, "302")["kind"], "remap");
    assert_eq!(kind_of(&plan, "302")["target_id"], 256);
    assert_eq!(
        kind_of(&plan, "302")["existing_labels"],
        "k8s:app=squatter;"
    );
    assert_eq!(kind_of(&plan, "303")["kind"], "reuse");
    assert_eq!(kind_of(&plan, "303")["target_id"], 900);
    assert_eq!(kind_of(&plan, "304")["kind"], "duplicate");
    for bad in ["0305", "5", "306", "307"] {
        assert_eq!(kind_of(&plan, bad)["kind"], "invalid", "{bad}");
        assert_eq!(kind_of(&plan, bad)["action"], "skip");
    }
    assert_eq!(plan["summary"]["invalid"], 4);
    assert_eq!(
        w.sb.request_count("POST ciliumidentities"),
        0,
        "plan writes nothing"
    );

    // Without --yes: refused, exit 2.
    let r = w.cli(&["apply", "--plan", &plan_path]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--yes"));
    // The remap and the duplicate have no decision yet: refused, naming them, nothing written.
    let r = w.cli(&["apply", "--plan", &plan_path, "--yes"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("item 302") && r.stderr.contains("item 304"),
        "{}",
        r.stderr
    );
    assert_eq!(w.sb.request_count("POST ciliumidentities"), 0);
    // Refused before anything was decided or written: no decision log is left behind.
    assert!(r.stderr.contains("none kept"), "{}", r.stderr);
    let logs: Vec<_> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("cilium-idmig-decisions-")
        })
        .collect();
    assert!(logs.is_empty(), "{logs:?}");

    // An edit that collides with Kubernetes is refused with the item and the reason.
    let edited = w.path("edited.json");
    let items = plan["items"].as_array_mut().unwrap();
    for item in items.iter_mut() {
        match item["id"].as_str().unwrap() {
            "302" => {
                item["decided"] = true.into();
                item["target_id"] = 901.into();
            }
            "304" => item["action"] = "skip".into(),
            _ => {}
        }
    }
    std::fs::write(&edited, serde_json::to_string(&plan).unwrap()).unwrap();
    let r = w.cli(&["apply", "--plan", &edited, "--yes"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("item 302") && r.stderr.contains("taken in Kubernetes"),
        "{}",
        r.stderr
    );

    // The operator picks 4000 for the remap and skips the duplicate.
    for item in plan["items"].as_array_mut().unwrap() {
        if item["id"] == "302" {
            item["target_id"] = 4000.into();
        }
    }
    let decided = w.path("decided.json");
    std::fs::write(&decided, serde_json::to_string(&plan).unwrap()).unwrap();
    let log = w.path("decisions.jsonl");
    let r = w
        .cli(&["apply", "--plan", &decided, "--yes", "--decision-log", &log])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let s = w.state();
    assert_eq!(s["301"], sl(B));
    assert_eq!(s["4000"], sl(C));
    assert_eq!(s["302"], sl("k8s:app=squatter;"), "never overwritten");
    assert!(!s.contains_key("304") && !s.contains_key("305") && !s.contains_key("5"));
    assert_eq!(s.len(), 7);

    let records = log_records(Path::new(&log));
    let outcome = |id: &str| {
        records
            .iter()
            .rev()
            .find(|r| r["id"] == id && !r["outcome"].is_null())
            .unwrap()
            .clone()
    };
    assert_eq!(outcome("302")["outcome"], "created");
    assert_eq!(outcome("302")["target_id"], 4000);
    assert_eq!(outcome("303")["outcome"], "mapped");
    assert_eq!(outcome("304")["outcome"], "skipped");
    // Each run opens with a session line naming what it worked on; every other line is a
    // decision or an outcome.
    let (sessions, lines): (Vec<&Value>, Vec<&Value>) =
        records.iter().partition(|r| r.get("session").is_some());
    assert_eq!(sessions[0]["session"]["command"], "apply");
    assert_eq!(sessions[0]["session"]["server"], w.sb.url());
    assert_eq!(sessions[0]["session"]["kvstore_prefix"], P);
    for r in &lines {
        for field in ["ts", "operator", "id", "labels", "kind", "decision"] {
            assert!(r[field].is_string(), "{field} in {r}");
        }
    }
    // Verify follows the recorded mappings, and names the duplicate skipped by decision
    // (no problem: the operator chose it).
    let r = w.cli(&["verify", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stdout.contains("skipped     id 304 by decision")
            && r.stdout.contains("1 skipped by decision, 0 problems"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("id 302 "), "{}", r.stdout);
    assert!(std::fs::metadata(&log).unwrap().len() > 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_in_one_go_then_verify_and_a_rerun_writes_nothing() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    // Each step says what comes next.
    let r = w.cli(&["plan"]).await;
    assert!(
        r.stdout.contains("next: decide the 2 conflicts"),
        "{}",
        r.stdout
    );
    let r = w.cli(&["apply", "--yes"]).await;
    assert_eq!(r.code, 2, "undecided proposals refuse: {}", r.stderr);
    let log = w.path("d.jsonl");
    let r = w.apply_accepting(&log).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("next: `sync --until-cutover`"),
        "{}",
        r.stdout
    );
    let s = w.state();
    assert_eq!(s["256"], sl(C), "remap at the lowest free id");
    assert_eq!(s["304"], sl(E), "duplicate created at its own id");
    assert_eq!(s["301"], sl(B));
    let r = w
        .cli(&["verify", "--decision-log", &log, "--output", "json"])
        .await;
    assert_eq!(r.code, 0, "{}", r.stdout);
    let v: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        (
            v["checked"].as_u64(),
            v["ok"].as_u64(),
            v["mapped"].as_u64()
        ),
        (Some(5), Some(5), Some(2))
    );
    // Without the decision log the remap and the reuse are not at their own ids.
    let r = w.cli(&["verify"]).await;
    assert_eq!(r.code, 1);
    assert!(
        r.stdout.contains("id 302") && r.stdout.contains("id 303"),
        "{}",
        r.stdout
    );

    let before = w.state();
    w.sb.reset_counts();
    let r = w.apply_accepting(&log).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        w.sb.request_count("POST ciliumidentities"),
        0,
        "a rerun sends no create"
    );
    assert_eq!(w.state(), before);
    // A rerun with a log of its own writes nothing, but decides: its mappings (the remap
    // and the reuse, which verify needs) are its record, so its log is kept and verify
    // passes on it alone.
    let again = w.path("again.jsonl");
    let r = w.apply_accepting(&again).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("it records the decisions; nothing needed writing"),
        "{}",
        r.stdout
    );
    assert!(std::path::Path::new(&again).exists());
    let r = w.cli(&["verify", "--decision-log", &again]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = crate::harness::run(w.dir.path(), &["log", &again]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_the_crd_when_missing() {
    let w = World::new(SandboxConfig {
        with_crd: false,
        ..Default::default()
    })
    .await;
    w.etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    let r = w.cli(&["plan"]).await;
    assert!(
        r.stdout
            .contains("CRD ciliumidentities.cilium.io is missing"),
        "{}",
        r.stdout
    );
    assert!(!w.sb.crd_installed());
    let r = w
        .cli(&["apply", "--yes", "--decision-log", &w.path("l.jsonl")])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(w.sb.crd_installed());
    assert_eq!(w.state()["300"], sl(A));
}

async fn load_dataset(w: &World, n: usize, seed: u64) {
    let data = crate::harness::load_dataset(&w.etcd, n, seed, 3).await;
    for (id, labels) in &data.k8s {
        w.sb.seed_identity(*id, labels);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_mid_apply_are_retried_to_the_same_final_state() {
    let clean = World::new(SandboxConfig::default()).await;
    load_dataset(&clean, 400, 7).await;
    let r = clean
        .cli(&[
            "apply",
            "--yes",
            "--accept-proposals",
            "--decision-log",
            &clean.path("l"),
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);

    let w = World::new(SandboxConfig {
        seed: 99,
        ..Default::default()
    })
    .await;
    load_dataset(&w, 400, 7).await;
    w.sb.set_faults(FaultConfig {
        p_500: 0.10,
        p_429: 0.10,
        retry_after_secs: 1,
        p_drop: 0.02,
        p_spike: 0.02,
        spike: Duration::from_millis(1500),
        ..Default::default()
    });
    let r = w
        .cli(&[
            "apply",
            "--yes",
            "--accept-proposals",
            "--decision-log",
            &w.path("l"),
            "--op-timeout",
            "500ms",
            "--max-attempts",
            "12",
            "--json",
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let report = json_report(&r.stdout);
    assert!(
        report["retries"].as_u64().unwrap() > 10,
        "retries are counted: {}",
        report["retries"]
    );
    let failed = with_outcome(&report, &["failed"]);
    assert_eq!(failed, 0);
    w.sb.set_faults(FaultConfig::default());
    assert_eq!(
        w.state(),
        clean.state(),
        "same final state as a run without faults"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn api_server_gone_mid_apply_stops_cleanly_and_a_rerun_finishes() {
    let w = World::new(SandboxConfig::default()).await;
    load_dataset(&w, 300, 11).await;
    w.sb.set_faults(FaultConfig {
        latency: Duration::from_millis(20),
        ..Default::default()
    });
    let port: u16 = w.sb.url().rsplit(':').next().unwrap().parse().unwrap();
    let log = w.path("l.jsonl");
    let kc = w.path("kubeconfig");
    let args = [
        "apply",
        "--yes",
        "--accept-proposals",
        "--decision-log",
        &log,
        "--concurrency",
        "2",
        "--max-attempts",
        "3",
        "--etcd-endpoints",
        &w.etcd.endpoint,
        "--kubeconfig",
        &kc,
    ];
    let dir = w.dir.path().to_path_buf();
    let child = tokio::spawn({
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            run(&dir, &a).await
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let partial = w.sb.objects();
    w.sb.shutdown();
    let r = child.await.unwrap();
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("stopped") && r.stdout.contains("rerun"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("not attempted"), "{}", r.stdout);

    // The API server comes back (same address, same objects); the rerun finishes the job.
    let sb2 = Sandbox::start(SandboxConfig {
        port,
        ..Default::default()
    })
    .await
    .unwrap();
    let written_before_loss = w.sb.objects();
    assert!(written_before_loss.len() > partial.len() - 1);
    for (name, obj) in &written_before_loss {
        sb2.seed_raw(name, obj.clone());
    }
    let r = run(w.dir.path(), &args).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = run(
        w.dir.path(),
        &[
            "verify",
            "--decision-log",
            &log,
            "--etcd-endpoints",
            &w.etcd.endpoint,
            "--kubeconfig",
            &kc,
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stdout);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_one_clear_line_with_exit_2_and_a_dead_server_exit_1() {
    let w = World::new(SandboxConfig::default()).await;
    let dead = format!("http://127.0.0.1:{}", crate::harness::free_port());
    let kc = w.path("kubeconfig");
    let r = run(
        w.dir.path(),
        &["plan", "--etcd-endpoints", &dead, "--kubeconfig", &kc],
    )
    .await;
    // Unreachable is failed work, not a usage error: a script retries it.
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains(&dead.replace("http://", "")),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);

    let r = run(
        w.dir.path(),
        &[
            "plan",
            "--etcd-endpoints",
            &w.etcd.endpoint,
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ],
    )
    .await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("/nonexistent/kubeconfig"), "{}", r.stderr);

    let garbage = w.path("garbage.json");
    std::fs::write(&garbage, "{ not json").unwrap();
    let r = w.cli(&["apply", "--plan", &garbage, "--yes"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("garbage.json") && r.stderr.contains("JSON"),
        "{}",
        r.stderr
    );
    let r = w
        .cli(&["apply", "--plan", &w.path("missing.json"), "--yes"])
        .await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("missing.json"), "{}", r.stderr);

    let p = w.path("p.json");
    assert_eq!(w.cli(&["plan", "--output", &p]).await.code, 0);
    let r = w.cli(&["plan", "--output", &p]).await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("never overwritten"), "{}", r.stderr);
    let r = w.cli(&["plan", "--cluster-id", "300"]).await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("cluster ID 300"), "{}", r.stderr);
    // A typo in a value is refused, not printed as text.
    let r = w.cli(&["verify", "--output", "jsn"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("jsn") && r.stderr.contains("json"),
        "{}",
        r.stderr
    );
    // A server that refuses the credentials is configuration (2); one that fails, work (1).
    let locked = World::new(SandboxConfig {
        token: Some("right".into()),
        ..SandboxConfig::default()
    })
    .await;
    let wrong = w.path("wrong-token");
    std::fs::write(
        &wrong,
        std::fs::read_to_string(locked.path("kubeconfig"))
            .unwrap()
            .replace("token: right", "token: wrong"),
    )
    .unwrap();
    let r = run(
        w.dir.path(),
        &[
            "plan",
            "--etcd-endpoints",
            &w.etcd.endpoint,
            "--kubeconfig",
            &wrong,
        ],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("401"), "{}", r.stderr);
    w.sb.set_faults(cilium_idmig::sandbox::FaultConfig {
        p_500: 1.0,
        ..Default::default()
    });
    let r = w.cli(&["plan"]).await;
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("500"), "{}", r.stderr);
}

/// Runs a dump command of the operator's (etcdctl, kubectl) and writes its output to `path`.
async fn dump_to(path: &str, program: &str, args: &[&str]) {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{program} ({e}); scripts/need test installs it"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(path, &out.stdout).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rehearsal_plays_the_clusters_own_dumps() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let (kv, ids, kc) = (w.path("kv.json"), w.path("ids.json"), w.path("kubeconfig"));
    // Exactly the read-only commands the guide gives (docs/src/rehearsal.md).
    dump_to(
        &kv,
        "etcdctl",
        &[
            "--endpoints",
            &w.etcd.endpoint,
            "get",
            "--prefix",
            P,
            "-w",
            "json",
        ],
    )
    .await;
    let cache = w.path("kube-cache");
    dump_to(
        &ids,
        "kubectl",
        &[
            "--kubeconfig",
            &kc,
            "--cache-dir",
            &cache,
            "get",
            "ciliumidentities",
            "-o",
            "json",
        ],
    )
    .await;
    // The plan of the real cluster, and the rehearsal's plan of its dumps, are the same.
    let real = w.cli(&["plan"]).await;
    assert_eq!(real.code, 0, "{}", real.stderr);
    let log = w.path("rehearsal.jsonl");
    let r = run(
        w.dir.path(),
        &[
            "demo",
            "--headless",
            "--from-snapshot",
            &kv,
            "--k8s-snapshot",
            &ids,
            "--decision-log",
            &log,
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let counts = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("create") || l.contains("remap") || l.contains("invalid"))
            .map(str::to_string)
            .take(3)
            .collect()
    };
    assert!(!counts(&real.stdout).is_empty(), "{}", real.stdout);
    assert_eq!(counts(&r.stdout), counts(&real.stdout), "{}", r.stdout);
    assert!(
        r.stdout.contains("rehearsal on the identities in"),
        "{}",
        r.stdout
    );
    // Nothing of the real cluster was touched: the rehearsal wrote to its own sandbox.
    assert_eq!(w.sb.request_count("POST ciliumidentities"), 0);
    assert!(!log_records(std::path::Path::new(&log)).is_empty());

    // A dump of another prefix, a partial dump, and a file that is no dump are refused.
    w.etcd
        .put("cilium/state/nodes/v1/default/node-1", b"{}")
        .await;
    let nodes = w.path("nodes.json");
    dump_to(
        &nodes,
        "etcdctl",
        &[
            "--endpoints",
            &w.etcd.endpoint,
            "get",
            "--prefix",
            "cilium/state/nodes",
            "-w",
            "json",
        ],
    )
    .await;
    let partial = w.path("partial.json");
    dump_to(
        &partial,
        "etcdctl",
        &[
            "--endpoints",
            &w.etcd.endpoint,
            "get",
            "--prefix",
            P,
            "--limit",
            "2",
            "-w",
            "json",
        ],
    )
    .await;
    for (file, why) in [
        (&nodes, "another prefix"),
        (&partial, "partial"),
        (&ids, "no header"),
    ] {
        let r = run(
            w.dir.path(),
            &["demo", "--headless", "--from-snapshot", file],
        )
        .await;
        assert_eq!(r.code, 2, "{file}: {}", r.stderr);
        assert!(
            r.stderr.starts_with("error: ")
                && r.stderr.contains(file.as_str())
                && r.stderr.contains(why),
            "{file}: {}",
            r.stderr
        );
        assert!(r.stderr.contains("etcdctl get --prefix"), "{}", r.stderr);
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn plan_o_json_prints_the_plan_and_a_plan_not_written_says_how_to_write_one() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    // kubectl's habit: `-o json` is the plan as JSON on stdout, no file named json.
    let r = w.cli(&["plan", "-o", "json"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let v: Value = serde_json::from_str(&r.stdout).expect("the plan as JSON");
    assert_eq!(v["version"], 1);
    assert_eq!(v["items"].as_array().unwrap().len(), 9);
    assert!(!w.dir.path().join("json").exists());
    // Without a file, the next step writes one first (there is no plan.json to apply yet).
    let r = w.cli(&["plan"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(
            "next: decide the 2 conflicts: write the plan with `plan --output plan.json`"
        ),
        "{}",
        r.stdout
    );
    assert!(
        !r.stdout
            .contains("next: `apply --plan plan.json --yes` writes it"),
        "{}",
        r.stdout
    );
}

/// Throttling is not failure: in a storm of 429s on the writes (eight in ten, more than the
/// attempts a create has), every identity is still created, the push-back is counted apart
/// and said; and a storm that asks for long waits still stops on SIGINT within a second.
#[tokio::test(flavor = "multi_thread")]
async fn a_429_storm_slows_an_apply_without_failing_it_and_a_stop_still_ends_it() {
    let w = World::new(SandboxConfig {
        seed: 5,
        ..Default::default()
    })
    .await;
    load_dataset(&w, 60, 3).await;
    w.sb.set_faults(FaultConfig {
        p_429: 0.8,
        retry_after_secs: 0,
        writes_only: true,
        ..Default::default()
    });
    let (report, _) = apply_finishing(&w, "3").await;
    assert!(
        report["throttled"].as_u64().unwrap() > 60,
        "{}",
        report["throttled"]
    );
    // The decision log's record of the run says how the server met it.
    let log = std::fs::read_to_string(w.path("l")).unwrap();
    let said: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("server_said").is_some())
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert_eq!(said[0]["server_said"]["throttled"], report["throttled"]);
    // A storm that asks for 30 s waits: SIGINT ends the apply within a second or two.
    let w = World::new(SandboxConfig::default()).await;
    load_dataset(&w, 20, 4).await;
    w.sb.set_faults(FaultConfig {
        p_429: 1.0,
        retry_after_secs: 30,
        writes_only: true,
        ..Default::default()
    });
    let mut child = tokio::process::Command::new(crate::harness::bin())
        .current_dir(w.dir.path())
        .args([
            "apply",
            "--yes",
            "--accept-proposals",
            "--decision-log",
            &w.path("s"),
        ])
        .args([
            "--etcd-endpoints",
            &w.etcd.endpoint,
            "--kubeconfig",
            &w.path("kubeconfig"),
        ])
        .env_remove("KUBECONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pid = child.id().unwrap() as i32;
    let sent = std::time::Instant::now();
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("stopped within 10 s")
        .unwrap();
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(status.code(), Some(1), "writes left not made: exit 1");
}

/// The report `apply --json` prints before its closing lines.
fn json_report(stdout: &str) -> Value {
    let json_end = stdout.rfind("\n}").unwrap() + 2;
    serde_json::from_str(&stdout[..json_end]).unwrap()
}

/// How many of a report's results have one of `outcomes`.
fn with_outcome(report: &Value, outcomes: &[&str]) -> usize {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| outcomes.iter().any(|o| x["outcome"] == *o))
        .count()
}

/// Throttling on the reads is not failure either: with seven in ten requests on identities
/// answered 429 (the streaming list, each page, the re-reads), plan reads everything and
/// says how often it was pushed back; apply after it creates every identity.
#[tokio::test(flavor = "multi_thread")]
async fn a_429_storm_on_the_reads_slows_plan_and_apply_without_failing_them() {
    let w = World::new(SandboxConfig {
        seed: 9,
        ..Default::default()
    })
    .await;
    load_dataset(&w, 40, 3).await;
    w.sb.set_faults(FaultConfig {
        p_429: 0.7,
        retry_after_secs: 0,
        ..Default::default()
    });
    let r = w.cli(&["plan"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("the API server pushed back")
            && r.stdout
                .contains("each waited out as it asked, none a failure"),
        "{}",
        r.stdout
    );
    let (report, _) = apply_finishing(&w, "2").await;
    assert!(report["throttled"].as_u64().unwrap() > 0);
}

/// `apply --yes --accept-proposals --json` with at most `attempts` per write, its log in
/// `l`: it exits 0 with every identity written (a 429 is no failure); its JSON report and run.
async fn apply_finishing(w: &World, attempts: &str) -> (Value, Run) {
    let r = w
        .cli(&[
            "apply",
            "--yes",
            "--accept-proposals",
            "--decision-log",
            &w.path("l"),
            "--max-attempts",
            attempts,
            "--json",
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let report = json_report(&r.stdout);
    assert_eq!(
        with_outcome(&report, &["failed", "not-attempted"]),
        0,
        "a 429 is no failure"
    );
    (report, r)
}

/// The server's `Warning` headers are shown once per distinct text, as kubectl shows them
/// (`Warning: TEXT` on stderr), kept in the JSON report and in the decision log's record of
/// the run.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_warning_is_shown_once_and_recorded() {
    let w = World::new(SandboxConfig::default()).await;
    load_dataset(&w, 30, 2).await;
    let text = r#"cilium.io/v2 CiliumIdentity is deprecated; use "v3""#;
    w.sb.set_faults(FaultConfig {
        warning: Some(text.into()),
        ..Default::default()
    });
    let (report, r) = apply_finishing(&w, "5").await;
    let shown = format!("Warning: {text}");
    assert_eq!(r.stderr.matches(&shown).count(), 1, "{}", r.stderr);
    assert_eq!(report["server_warnings"], serde_json::json!([text]));
    let log = std::fs::read_to_string(w.path("l")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("server_said"))
        .unwrap_or_else(|| panic!("no record of what the server said: {log}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["server_said"]["warnings"], serde_json::json!([text]));
    // Every reader of the log still reads it.
    let r = run(w.dir.path(), &["log", "--decisions-only", &w.path("l")]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = w.cli(&["verify", "--decision-log", &w.path("l")]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}
