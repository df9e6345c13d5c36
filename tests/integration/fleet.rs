//! `fleet` over several clusters at once: sandboxes standing where a sync would have left
//! them, and a server that accepts connections and never answers. Each is a row within the
//! timeout; the exit says whether every cluster reached cutover.

use std::path::Path;
use std::time::{Duration, Instant};

use cilium_idmig::sandbox::{Sandbox, SandboxConfig};

use crate::harness::run;

/// A kubeconfig with one context per `(name, server)`.
fn kubeconfig(path: &Path, clusters: &[(&str, String)]) {
    let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for (name, server) in clusters {
        text.push_str(&format!(
            "- name: {name}\n  cluster:\n    server: {server}\n"
        ));
    }
    text.push_str("contexts:\n");
    for (name, _) in clusters {
        text.push_str(&format!(
            "- name: {name}\n  context:\n    cluster: {name}\n    user: u\n"
        ));
    }
    text.push_str(&format!(
        "current-context: {}\nusers:\n- name: u\n  user: {{}}\n",
        clusters[0].0
    ));
    std::fs::write(path, text).unwrap();
}

/// What a sync in `phase` would have published, written `age` ago.
fn standing(sb: &Sandbox, phase: &str, pending: &str, age: Duration) {
    let updated = jiff::Timestamp::now() - jiff::SignedDuration::try_from(age).unwrap();
    let updated = updated.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    sb.add_config_map(
        "kube-system",
        "cilium-idmig-sync-status",
        &[
            ("phase", phase),
            ("pending-decisions", pending),
            ("kvstore-nodes", "0"),
            ("updated", &updated),
        ],
    );
}

/// A server that takes connections and never says a word.
fn silent_server() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    (l, url)
}

fn rows(stdout: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<Vec<serde_json::Value>>(stdout).expect(stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_cluster_is_a_row_within_its_timeout_and_the_exit_counts_cutover() {
    let reached = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let waiting = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let no_sync = Sandbox::start(SandboxConfig::default()).await.unwrap();
    standing(&reached, "cutover-reached", "0", Duration::from_secs(3600));
    standing(
        &waiting,
        "waiting-for-decisions",
        "2",
        Duration::from_secs(5),
    );
    no_sync.add_config_map(
        "kube-system",
        "cilium-config",
        &[("identity-allocation-mode", "crd")],
    );
    let (_held, silent) = silent_server();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("fleet.yaml");
    kubeconfig(
        &kc,
        &[
            ("reached", reached.url()),
            ("waiting", waiting.url()),
            ("no-sync", no_sync.url()),
            ("silent", silent),
        ],
    );
    let kc = kc.display().to_string();
    let args = [
        "fleet",
        "--kubeconfig",
        &kc,
        "--all-contexts",
        "--timeout",
        "2s",
        "--output",
        "json",
    ];
    let started = Instant::now();
    let r = run(dir.path(), &args).await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the silent one held the rest up: {:?}",
        started.elapsed()
    );
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    let rows = rows(&r.stdout);
    let by: std::collections::BTreeMap<&str, &serde_json::Value> = rows
        .iter()
        .map(|r| (r["cluster"].as_str().unwrap(), r))
        .collect();
    assert_eq!(rows[0]["cluster"], "reached", "in the order named");
    assert_eq!(by["reached"]["attention"], serde_json::Value::Null);
    assert_eq!(by["reached"]["facts"]["sync"]["phase"], "cutover-reached");
    assert!(
        by["waiting"]["attention"]
            .as_str()
            .unwrap()
            .starts_with("2 decision(s) wait"),
        "{}",
        by["waiting"]
    );
    assert_eq!(by["no-sync"]["facts"]["identity_allocation_mode"], "crd");
    assert!(
        by["no-sync"]["attention"]
            .as_str()
            .unwrap()
            .starts_with("no sync"),
        "{}",
        by["no-sync"]
    );
    assert!(
        by["silent"]["error"]
            .as_str()
            .unwrap()
            .contains("no answer within 2s"),
        "{}",
        by["silent"]
    );

    // The text: a row each and the counts; a state change shows at the next read.
    standing(&waiting, "cutover-reached", "0", Duration::ZERO);
    standing(&no_sync, "cutover-reached", "0", Duration::ZERO);
    let ok = ["fleet", "--kubeconfig", &kc, "--context", "reached"];
    let r = run(
        dir.path(),
        &[&ok[..], &["--context", "waiting", "--context", "no-sync"]].concat(),
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("3 clusters: 3 reached cutover, 0 need attention"),
        "{}",
        r.stdout
    );
    // A context that does not exist is a usage error, named.
    let r = run(
        dir.path(),
        &["fleet", "--kubeconfig", &kc, "--context", "nope"],
    )
    .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("no context nope"), "{}", r.stderr);
}
