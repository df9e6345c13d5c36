//! `fleet` over three real kube-apiservers at once (1.19 and 1.36), each with its own
//! kvstore etcd: one whose sync reached cutover, one whose sync waits on a decision with a
//! node still on the kvstore, one with no sync; and a server that accepts connections and
//! never answers. Each shows as it is, within its timeout; a change shows at the next read.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{A, P, printed, spawn_sync_with};
use crate::harness::{Etcd, run};
use crate::support::control_plane::ControlPlane;

async fn fleet(dir: &std::path::Path, kubeconfigs: &[&std::path::Path]) -> Vec<serde_json::Value> {
    fleet_with(dir, kubeconfigs, &[]).await
}

/// `fleet` over `kubeconfigs`, with `extra` flags.
async fn fleet_with(
    dir: &std::path::Path,
    kubeconfigs: &[&std::path::Path],
    extra: &[String],
) -> Vec<serde_json::Value> {
    let mut args: Vec<String> = vec!["fleet".into()];
    args.extend(extra.iter().cloned());
    for kc in kubeconfigs {
        args.push("--kubeconfig".into());
        args.push(kc.display().to_string());
    }
    args.extend(["--timeout", "3s", "--output", "json"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run(dir, &args).await;
    assert!(r.code == 0 || r.code == 1, "{}{}", r.stdout, r.stderr);
    serde_json::from_str(&r.stdout).expect(&r.stdout)
}

/// Each row by the kubeconfig it came from (the control planes' contexts share a name, so
/// their rows are named by file) or by its context's name.
fn by_file<'a>(rows: &'a [serde_json::Value], kc: &std::path::Path) -> &'a serde_json::Value {
    let name = kc.display().to_string();
    rows.iter()
        .find(|r| r["cluster"].as_str().unwrap().starts_with(&name))
        .or_else(|| rows.iter().find(|r| r["cluster"] == "silent"))
        .unwrap_or_else(|| panic!("{name} not among {rows:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn fleet_shows_three_real_clusters_and_a_silent_one_each_as_it_stands() {
    let test = "real::fleet::fleet_shows_three_real_clusters";
    let Some(done) = ControlPlane::start(test) else {
        return;
    };
    let Some(waiting) = ControlPlane::start_with(test, &[("KUBE_VERSION", "1.36")]) else {
        return;
    };
    let Some(bare) = ControlPlane::start(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    // Reached cutover: no node on its kvstore, one identity copied.
    let etcd_done = Etcd::start().await;
    etcd_done.put(&format!("{P}/id/300"), A.as_bytes()).await;
    let out = d.join("done.out");
    let mut sync_done = spawn_sync_with(
        d,
        &done.kubeconfig,
        &etcd_done,
        "done.jsonl",
        &out,
        &["--until-cutover", "--cutover-grace", "1s"],
    );
    let ended = tokio::time::timeout(Duration::from_secs(90), sync_done.wait())
        .await
        .unwrap_or_else(|_| panic!("no cutover: {}", printed(&out)))
        .unwrap();
    assert!(ended.success(), "{}", printed(&out));

    // Waits on a decision: Kubernetes holds 300 for other labels (a remap to decide), and
    // node 10.0.0.9 still allocates from the kvstore.
    waiting.apply(
        "apiVersion: cilium.io/v2\nkind: CiliumIdentity\nmetadata: {name: \"300\"}\nsecurity-labels: {k8s:app: b, k8s:io.kubernetes.pod.namespace: shop}\n",
    );
    let etcd_waiting = Etcd::start().await;
    etcd_waiting.put(&format!("{P}/id/300"), A.as_bytes()).await;
    etcd_waiting
        .put(&format!("{P}/value/{A}/10.0.0.9"), b"300")
        .await;
    let out_w = d.join("waiting.out");
    let _sync_waiting = spawn_sync_with(
        d,
        &waiting.kubeconfig,
        &etcd_waiting,
        "waiting.jsonl",
        &out_w,
        &[],
    );

    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_kc = d.join("silent.yaml");
    std::fs::write(
        &silent_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: silent\n  cluster:\n    server: http://{}\ncontexts:\n- name: silent\n  context:\n    cluster: silent\n    user: u\ncurrent-context: silent\nusers:\n- name: u\n  user: {{}}\n",
            silent.local_addr().unwrap()
        ),
    )
    .unwrap();
    let files = [
        done.kubeconfig.as_path(),
        waiting.kubeconfig.as_path(),
        bare.kubeconfig.as_path(),
        silent_kc.as_path(),
    ];

    // The waiting sync publishes within its pace (at most every 5 s).
    let start = Instant::now();
    let rows = loop {
        let started = Instant::now();
        let rows = fleet(d, &files).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the silent one held the rest up: {:?}",
            started.elapsed()
        );
        let w = by_file(&rows, &waiting.kubeconfig);
        if w["facts"]["sync"]["phase"] == "waiting-for-decisions" {
            break rows;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{w}\n{}",
            printed(&out_w)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let row = |kc| by_file(&rows, kc);
    assert_eq!(
        row(&done.kubeconfig)["facts"]["sync"]["phase"],
        "cutover-reached"
    );
    assert_eq!(row(&done.kubeconfig)["attention"], serde_json::Value::Null);
    assert_eq!(row(&done.kubeconfig)["facts"]["identities"], 1);
    let w = row(&waiting.kubeconfig);
    assert_eq!(w["facts"]["sync"]["kvstore_nodes"], 1, "{w}");
    assert!(
        w["attention"]
            .as_str()
            .unwrap()
            .starts_with("1 decision(s) wait"),
        "{w}"
    );
    assert!(
        row(&bare.kubeconfig)["attention"]
            .as_str()
            .unwrap()
            .starts_with("no sync"),
    );
    assert!(
        row(&silent_kc)["error"]
            .as_str()
            .unwrap()
            .contains("no answer within 3s"),
        "{}",
        row(&silent_kc)
    );

    // Each cluster's own kvstore, named by its row's name (the control planes share a
    // context's name), is counted beside its Kubernetes identities.
    let kvstore_of = |kc: &std::path::Path, etcd: &Etcd| {
        let name = by_file(&rows, kc)["cluster"].as_str().unwrap().to_string();
        vec![
            "--etcd-config-for".to_string(),
            format!("{name}={}", etcd.config_file().display()),
        ]
    };
    let extra = [
        kvstore_of(&done.kubeconfig, &etcd_done),
        kvstore_of(&waiting.kubeconfig, &etcd_waiting),
    ]
    .concat();
    let counted = fleet_with(d, &files[..3], &extra).await;
    for kc in [&done.kubeconfig, &waiting.kubeconfig] {
        let r = by_file(&counted, kc);
        assert_eq!(r["facts"]["kvstore"]["identities"], 1, "{r}");
    }
    assert!(
        by_file(&counted, &bare.kubeconfig)["facts"]
            .get("kvstore")
            .is_none()
    );

    // The node leaves the kvstore: the next read says so.
    etcd_waiting
        .delete(&format!("{P}/value/{A}/10.0.0.9"))
        .await;
    let start = Instant::now();
    loop {
        let rows = fleet(d, &files[1..2]).await;
        let w = &rows[0];
        let now: BTreeMap<&str, &serde_json::Value> = [
            ("phase", &w["facts"]["sync"]["phase"]),
            ("nodes", &w["facts"]["sync"]["kvstore_nodes"]),
        ]
        .into();
        if now["nodes"] == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{now:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
