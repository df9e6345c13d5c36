//! `audit` as a user runs it, against a real etcd and the sandbox (and, in `real.rs`, a real
//! kube-apiserver): each kind of finding with its nodes and endpoints, the JSON contract, the
//! exit codes, and nothing written.

use serde_json::Value;

use cilium_idmig::core::identity::identity_object;
use cilium_idmig::core::labels::{SecurityLabels, parse_label_key, to_security_labels};
use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::World;
use crate::harness::Etcd;

const P: &str = "cilium/state/identities/v1";

pub(crate) fn sl(key: &str) -> SecurityLabels {
    to_security_labels(&parse_label_key(key).unwrap())
}

pub(crate) const A: &str = "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;";
pub(crate) const B: &str = "k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;";
pub(crate) const C: &str = "k8s:app=c;k8s:io.kubernetes.pod.namespace=shop;";
pub(crate) const F: &str = "k8s:app=f;k8s:io.kubernetes.pod.namespace=shop;";
pub(crate) const G: &str = "k8s:app=g;k8s:io.kubernetes.pod.namespace=shop;";
pub(crate) const X: &str = "k8s:app=x;k8s:io.kubernetes.pod.namespace=shop;";
pub(crate) const Y: &str = "k8s:app=y;k8s:io.kubernetes.pod.namespace=shop;";

/// The kvstore's side of a double-write rollout gone wrong (reference section F in small):
/// 300 `A` (node-1), 301 `B` (node-2), 302 `C`, 310 `G` (node-4); node-3's `value/` key for
/// `F` points at 302.
pub(crate) async fn seed_kvstore(etcd: &Etcd) {
    for (id, l) in [("300", A), ("301", B), ("302", C), ("310", G)] {
        etcd.put(&format!("{P}/id/{id}"), l.as_bytes()).await;
    }
    for (l, node, id) in [
        (A, "node-1", "300"),
        (B, "node-2", "301"),
        (F, "node-3", "302"),
        (G, "node-4", "310"),
    ] {
        etcd.put(&format!("{P}/value/{l}/{node}"), id.as_bytes())
            .await;
    }
}

/// Checks what `audit --output json` found on the seeded stores: Kubernetes holds 300 for
/// `X` (split), `B` at 401 (double; an endpoint uses it), 302 `C` (agrees), 500 `Y` (one
/// side), and 310 `G` marked by the GC while node-4 uses it.
pub(crate) fn check_findings(json: &Value) {
    let counts = &json["counts"];
    for (kind, n) in [
        ("split", 1),
        ("double", 1),
        ("duplicate", 0),
        ("one-side", 3),
        ("stale-value", 1),
        ("gc-marked", 1),
    ] {
        assert_eq!(counts[kind], n, "{kind}: {json:#}");
    }
    let findings = json["findings"].as_array().unwrap();
    let of =
        |kind: &str| -> Vec<&Value> { findings.iter().filter(|f| f["kind"] == kind).collect() };
    let split = of("split")[0];
    assert_eq!(split["id"], 300);
    assert_eq!(split["labels"], A);
    assert_eq!(split["other_labels"], X);
    assert_eq!(split["nodes"], serde_json::json!(["node-1"]));
    assert!(split["action"].as_str().unwrap().contains("roll node-1"));
    let double = of("double")[0];
    assert_eq!(
        (double["id"].as_u64(), double["other_id"].as_u64()),
        (Some(301), Some(401))
    );
    assert_eq!(double["nodes"], serde_json::json!(["node-2"]));
    assert_eq!(double["endpoints"], serde_json::json!(["shop/cart-1"]));
    let stale = of("stale-value")[0];
    assert_eq!(
        (stale["id"].as_u64(), stale["labels"].as_str()),
        (Some(302), Some(F))
    );
    assert_eq!(stale["other_labels"], C);
    let gc = of("gc-marked")[0];
    assert_eq!(
        (gc["id"].as_u64(), gc["nodes"].clone()),
        (Some(310), serde_json::json!(["node-4"]))
    );
    let one_side: Vec<u64> = of("one-side")
        .iter()
        .map(|f| f["id"].as_u64().unwrap())
        .collect();
    assert_eq!(one_side, [301, 401, 500]);
    for f in findings {
        for field in ["kind", "id", "labels", "nodes", "endpoints", "action"] {
            assert!(!f[field].is_null(), "{field} missing: {f}");
        }
    }
}

fn marked(id: u32, labels: &str) -> Value {
    let mut o = identity_object(id, &sl(labels));
    o["metadata"]["annotations"] =
        serde_json::json!({"io.cilium.heartbeat": "2026-12-01T00:00:00Z"});
    o
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_finds_each_kind_names_who_is_behind_it_and_writes_nothing() {
    let w = World::new(SandboxConfig::default()).await;
    seed_kvstore(&w.etcd).await;
    w.sb.seed_identity(300, &sl(X));
    w.sb.seed_identity(401, &sl(B));
    w.sb.seed_identity(302, &sl(C));
    w.sb.seed_identity(500, &sl(Y));
    w.sb.seed_raw("310", marked(310, G));
    w.sb.add_endpoint("shop", "cart-1", 401);
    let before = w.sb.objects();
    w.sb.reset_counts();

    let r = w.cli(&["audit", "--output", "json"]).await;
    assert_eq!(r.code, 1, "findings exit 1: {}{}", r.stdout, r.stderr);
    let json: Value = serde_json::from_str(&r.stdout).unwrap();
    check_findings(&json);
    assert!(
        json["not_checked"].as_array().unwrap().is_empty(),
        "{json:#}"
    );

    let text = w.cli(&["audit"]).await;
    assert_eq!(text.code, 1);
    for line in [
        "findings: 1 split, 1 double, 0 duplicate, 3 one-side, 1 stale-value, 1 gc-marked",
        "split 300: k8s:app=a;",
        "nodes: node-2 · endpoints: shop/cart-1",
        "do: node node-3 tags these labels with 302",
    ] {
        assert!(text.stdout.contains(line), "{line}:\n{}", text.stdout);
    }
    // Nothing written anywhere: only reads reached the API server.
    assert_eq!(w.sb.objects(), before);
    assert_eq!(w.sb.request_count("POST ciliumidentities"), 0);
    assert_eq!(w.sb.request_count("DELETE ciliumidentities"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_of_agreeing_stores_is_clean_and_a_bad_flag_is_exit_2() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    w.etcd.put(&format!("{P}/value/{A}/node-1"), b"300").await;
    w.sb.seed_identity(300, &sl(A));
    let r = w.cli(&["audit"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("clean: the two stores agree by labels"),
        "{}",
        r.stdout
    );
    let bad = w.cli(&["audit", "--output", "jsn"]).await;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
}

/// `cilium_idmig_audit_findings{kind}` as `/metrics` says it now.
async fn findings_metric(addr: &str, kind: &str) -> Option<i64> {
    // Not listening yet: nothing to read.
    tokio::net::TcpStream::connect(addr).await.ok()?;
    let (code, _, body) =
        crate::harness::http(&format!("http://{addr}"), "GET", "/metrics", None).await;
    if code != 200 {
        return None;
    }
    let name = format!("cilium_idmig_audit_findings{{kind=\"{kind}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(name.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_watch_exports_the_findings_as_they_change() {
    use std::time::{Duration, Instant};
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), A.as_bytes()).await;
    w.sb.seed_identity(300, &sl(A));
    let addr = format!("127.0.0.1:{}", crate::harness::free_port());
    let kc = w.path("kubeconfig");
    let child = tokio::process::Command::new(crate::harness::bin())
        .args(["audit", "--watch", "--every", "1s", "--status-addr", &addr])
        .args(["--etcd-endpoints", &w.etcd.endpoint, "--kubeconfig", &kc])
        .current_dir(w.dir.path())
        .env_remove("KUBECONFIG")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let until = |kind: &'static str, n: i64| {
        let addr = addr.clone();
        async move {
            let start = Instant::now();
            while findings_metric(&addr, kind).await != Some(n) {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "{kind} never {n}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    until("split", 0).await;
    // A kvstore-mode agent takes 301 while a CRD-mode agent holds it for other labels.
    w.etcd.put(&format!("{P}/id/301"), B.as_bytes()).await;
    w.sb.seed_identity(301, &sl(X));
    until("split", 1).await;
    let (code, _, _) =
        crate::harness::http(&format!("http://{addr}"), "GET", "/healthz", None).await;
    assert_eq!(code, 200);
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("ends on SIGTERM")
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("audit: 0 split"), "{text}");
    assert!(text.contains("audit: 1 split"), "{text}");
    assert!(w.sb.request_count("POST ciliumidentities") == 0);
}

/// After a deliberate remap, `verify` and `audit` read the same decision log and agree: the
/// split, the double and the object alone in Kubernetes are what was decided.
#[tokio::test(flavor = "multi_thread")]
async fn audit_with_the_decision_log_agrees_with_verify_after_a_remap() {
    let w = World::new(SandboxConfig::default()).await;
    // kvstore 1005 holds A; Kubernetes holds X there, so A is remapped (to 5000, edited).
    w.etcd.put(&format!("{P}/id/1005"), A.as_bytes()).await;
    w.etcd.put(&format!("{P}/value/{A}/node-1"), b"1005").await;
    w.sb.seed_identity(1005, &sl(X));
    let plan = w.path("plan.json");
    let r = w.cli(&["plan", "--output", &plan]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mut p: Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let item = &mut p["items"][0];
    assert_eq!(item["kind"], "remap", "{item}");
    item["target_id"] = 5000.into();
    item["decided"] = true.into();
    let edited = w.path("edited.json");
    std::fs::write(&edited, p.to_string()).unwrap();
    let log = w.path("remap.jsonl");
    let r = w
        .cli(&["apply", "--plan", &edited, "--yes", "--decision-log", &log])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let r = w.cli(&["verify", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "verify passes: {}{}", r.stdout, r.stderr);

    // Without the log the remap reads as findings; with it, as decided.
    let r = w.cli(&["audit", "--output", "json"]).await;
    assert_eq!(r.code, 1, "{}", r.stdout);
    let json: Value = serde_json::from_str(&r.stdout).unwrap();
    for kind in ["split", "double", "one-side"] {
        assert!(json["counts"][kind].as_u64() > Some(0), "{kind}: {json:#}");
    }
    let r = w
        .cli(&["audit", "--output", "json", "--decision-log", &log])
        .await;
    assert_eq!(
        r.code, 0,
        "the stores agree with the decision: {}",
        r.stdout
    );
    let json: Value = serde_json::from_str(&r.stdout).unwrap();
    assert!(json["findings"].as_array().unwrap().is_empty(), "{json:#}");
    let decided: Vec<(&str, u64)> = json["decided"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["kind"].as_str().unwrap(), d["id"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        decided,
        [("split", 1005), ("double", 1005), ("one-side", 5000)],
        "{json:#}"
    );
    let text = w.cli(&["audit", "--decision-log", &log]).await;
    assert_eq!(text.code, 0);
    assert!(
        text.stdout
            .contains("remapped by decision: kvstore 1005 is served at 5000"),
        "{}",
        text.stdout
    );
}
