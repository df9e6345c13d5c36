//! `fleet` over several clusters at once: sandboxes standing where a sync would have left
//! them, and a server that accepts connections and never answers. Each is a row within the
//! timeout; the exit says whether every cluster reached cutover.

use std::path::Path;
use std::time::{Duration, Instant};

use cilium_idmig::sandbox::{Sandbox, SandboxConfig};

use crate::harness::{Etcd, Tmux, bin, run};

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

/// Three sandboxes: one whose sync reached cutover an hour ago, one waiting on `pending`
/// decisions, one with no sync.
async fn three_clusters(pending: &str) -> (Sandbox, Sandbox, Sandbox) {
    let reached = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let waiting = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let no_sync = Sandbox::start(SandboxConfig::default()).await.unwrap();
    standing(&reached, "cutover-reached", "0", Duration::from_secs(3600));
    standing(
        &waiting,
        "waiting-for-decisions",
        pending,
        Duration::from_secs(5),
    );
    (reached, waiting, no_sync)
}

fn rows(stdout: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<Vec<serde_json::Value>>(stdout).expect(stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_cluster_is_a_row_within_its_timeout_and_the_exit_counts_cutover() {
    let (reached, waiting, no_sync) = three_clusters("2").await;
    no_sync.add_config_map(
        "kube-system",
        "cilium-config",
        &[("identity-allocation-mode", "crd")],
    );
    let (_held, silent) = silent_server();
    // waiting's kvstore holds two identities; no-sync's is named but down.
    let etcd = Etcd::start().await;
    for id in ["300", "301"] {
        let key = format!("cilium/state/identities/v1/id/{id}");
        etcd.put(&key, b"k8s:app=a;").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let down = dir.path().join("down.yaml");
    let port = crate::harness::free_port();
    std::fs::write(&down, format!("endpoints:\n- http://127.0.0.1:{port}\n")).unwrap();
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
    let waiting_kv = format!("waiting={}", etcd.config_file().display());
    let no_sync_kv = format!("no-sync={}", down.display());
    let args = [
        "fleet",
        "--kubeconfig",
        &kc,
        "--all-contexts",
        "--timeout",
        "2s",
        "--etcd-config-for",
        &waiting_kv,
        "--etcd-config-for",
        &no_sync_kv,
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
    assert_eq!(by["waiting"]["facts"]["kvstore"]["identities"], 2);
    assert!(
        by["no-sync"]["facts"]["kvstore"]["error"].is_string(),
        "{}",
        by["no-sync"]
    );
    assert!(
        by["reached"]["facts"].get("kvstore").is_none(),
        "none named"
    );
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
    // So is a kvstore named for a context not read.
    let r = run(
        dir.path(),
        &[&ok[..], &["--etcd-config-for", "nope=x.yaml"]].concat(),
    )
    .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("--etcd-config-for names context nope"),
        "{}",
        r.stderr
    );
    // Only `tui` and `fleet` take several contexts; the rest refuse a second by name.
    let two = ["--context", "reached", "--context", "waiting"];
    let r = run(
        dir.path(),
        &[&["switch-report", "--kubeconfig", &kc][..], &two[..]].concat(),
    )
    .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("--context is given 2 times (reached, waiting)"),
        "{}",
        r.stderr
    );
}

/// The real binary's TUI over three contexts, under tmux: the Fleet screen first, `n` to the
/// cluster that needs attention, Enter opens its screens on its own kvstore, a commit there,
/// Esc back to the fleet (read again, the visit said), a filter, a cluster with no kvstore
/// named that is not opened and says why, and `q` with each cluster's log named.
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_screen_opens_a_cluster_and_esc_comes_back_under_tmux() {
    const P: &str = "cilium/state/identities/v1";
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    etcd.put(&format!("{P}/id/301"), b"k8s:app=b;").await;
    let (reached, waiting, no_sync) = three_clusters("1").await;
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("fleet.yaml");
    kubeconfig(
        &kc,
        &[
            ("reached", reached.url()),
            ("waiting", waiting.url()),
            ("no-sync", no_sync.url()),
        ],
    );
    let cmd = format!(
        "cd {} && {} tui --kubeconfig {} --all-contexts --etcd-config-for waiting={}; echo EXITED $?; sleep 600",
        dir.path().display(),
        bin(),
        kc.display(),
        etcd.config_file().display()
    );
    let t = Tmux::start("fleet", &cmd);
    t.wait_for("3 clusters: 1 reached cutover, 2 need attention", 30);
    // `n` skips `reached` (nothing to do) for `waiting`; Enter opens it.
    t.keys(&["n", "Enter"]);
    let opened = t.wait_for("scanned 2 identities", 30);
    assert!(
        opened.contains(" waiting ·"),
        "the header names it:\n{opened}"
    );
    t.keys(&["4", "Enter"]);
    t.wait_for("Type yes", 10);
    t.keys(&["y", "e", "s", "Enter"]);
    t.wait_for("verified: ", 30);
    t.keys(&["Escape"]);
    let back = t.wait_for("back from waiting: commit: 2 created", 10);
    assert!(back.contains("Fleet"), "{back}");
    let ids = |sb: &Sandbox| sb.objects().into_keys().collect::<Vec<String>>();
    assert_eq!(ids(&waiting), ["300", "301"], "created in waiting");
    assert!(ids(&reached).is_empty(), "and nowhere else");
    // The filter narrows the rows; a cluster with no kvstore named says so, and stays.
    t.keys(&["/", "n", "o", "-", "s", "Enter"]);
    let filtered = t.wait_for("filter: no-s", 5);
    assert!(
        !filtered.lines().any(|l| l.starts_with("reached ")),
        "{filtered}"
    );
    t.keys(&["Enter"]);
    t.wait_for("no-sync was not opened: no kvstore is named for it", 10);
    t.wait_for("--etcd-config-for no-sync=FILE", 1);
    t.keys(&["q"]);
    let end = t.wait_for("EXITED 0", 10);
    assert!(end.contains("waiting: commit: 2 created"), "{end}");
    let log_line = end
        .lines()
        .find(|l| l.starts_with("waiting: decision log: "))
        .unwrap_or_else(|| panic!("no log named:\n{end}"));
    let log = dir.path().join(
        log_line
            .trim_start_matches("waiting: decision log: ")
            .trim(),
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("\"outcome\":\"created\""), "{text}");
    assert!(
        log.file_name()
            .unwrap()
            .to_string_lossy()
            .contains("-waiting-"),
        "the cluster's name is in its log's: {}",
        log.display()
    );
}
