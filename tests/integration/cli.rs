//! The command line as a new user meets it: mesh layouts, oversized entries, who is
//! recorded as the operator, progress in a headless run, completions, the manual page,
//! `--version`, and the kubectl plugin name.

use cilium_idmig::sandbox::SandboxConfig;

use crate::e2e::{World, log_records, seed_every_kind};
use crate::harness::{bin, run};

const P: &str = "cilium/state/identities/v1";

#[tokio::test(flavor = "multi_thread")]
async fn a_511_cluster_mesh_has_its_own_range_and_plans_record_it() {
    let w = World::new(SandboxConfig::default()).await;
    // Cluster 0 of a 511-cluster mesh ends at 32767: 40000 belongs to cluster 1 there.
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    w.etcd.put(&format!("{P}/id/40000"), b"k8s:app=b;").await;
    let plan = w.path("plan-511.json");
    let r = w
        .cli(&["plan", "--max-connected-clusters", "511", "--output", &plan])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("max-connected-clusters 511), range 256..=32767"),
        "{}",
        r.stdout
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert_eq!(v["max_connected_clusters"], 511);
    assert_eq!(v["range"]["max"], 32767);
    let item = |id: &str| {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(item("40000")["kind"], "invalid");
    assert_eq!(item("300")["kind"], "create");
    // The classic layout takes 40000 as a cluster-0 id.
    let classic = w.path("plan-255.json");
    let r = w.cli(&["plan", "--output", &classic]).await;
    assert!(r.stdout.contains("range 256..=65535"), "{}", r.stdout);
    let c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&classic).unwrap()).unwrap();
    assert_eq!(c["max_connected_clusters"], 255);
    assert!(
        c["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["kind"] == "create"),
        "{c}"
    );
    // A plan made for one layout is refused by a run of the other.
    let r = w.cli(&["apply", "--plan", &plan, "--yes"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("max-connected-clusters 511"),
        "{}",
        r.stderr
    );
    assert!(w.sb.objects().is_empty(), "nothing written");
    let r = w
        .cli(&[
            "apply",
            "--plan",
            &plan,
            "--yes",
            "--max-connected-clusters",
            "511",
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(
        w.sb.objects().len(),
        1,
        "only 300 is in this cluster's range"
    );
    // Cluster IDs past 255 need the 511 layout, and the error says so.
    let r = w.cli(&["plan", "--cluster-id", "300"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("--max-connected-clusters 511"),
        "{}",
        r.stderr
    );
    let r = w.cli(&["plan", "--max-connected-clusters", "400"]).await;
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("255 (the default) or 511"),
        "{}",
        r.stderr
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_implausibly_large_entry_is_invalid_and_never_written() {
    let w = World::new(SandboxConfig::default()).await;
    let big = format!("k8s:app={};", "x".repeat(400 << 10));
    w.etcd.put(&format!("{P}/id/300"), big.as_bytes()).await;
    w.etcd.put(&format!("{P}/id/301"), b"k8s:app=ok;").await;
    let plan = w.path("plan.json");
    let r = w.cli(&["plan", "--output", &plan]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let item = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "300")
        .unwrap();
    assert_eq!(item["kind"], "invalid");
    assert!(
        item["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("{} bytes", big.len())),
        "{item}"
    );
    let r = w.cli(&["apply", "--yes"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(w.sb.objects().keys().collect::<Vec<_>>(), ["301"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_decision_log_names_the_person() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let log = w.path("log.jsonl");
    let kc = w.path("kubeconfig");
    // Under sudo, with USER unset (tmux, cron): the person behind sudo, and the account.
    let out = tokio::process::Command::new(bin())
        .current_dir(w.dir.path())
        .args([
            "apply",
            "--yes",
            "--accept-proposals",
            "--decision-log",
            &log,
        ])
        .args(["--etcd-endpoints", &w.etcd.endpoint, "--kubeconfig", &kc])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .env_remove("CILIUM_IDMIG_OPERATOR")
        .env("SUDO_USER", "alice")
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records = log_records(std::path::Path::new(&log));
    let op = records[0]["operator"].as_str().unwrap();
    // The tests run as root here, as CI does; the account comes from the password database.
    assert!(
        op.starts_with("alice@") && op.ends_with(" (via sudo as root)"),
        "{op}"
    );
    assert!(records.iter().all(|r| r["operator"] == op));
    // --operator names a person on a shared account, and the plan records who made it.
    let plan = w.path("plan.json");
    let r = w
        .cli(&["plan", "--output", &plan, "--operator", "bob"])
        .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    assert!(
        v["created_by"].as_str().unwrap().starts_with("bob@"),
        "{}",
        v["created_by"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_headless_apply_reports_progress() {
    let dir = tempfile::tempdir().unwrap();
    // About 4,500 creates at 30 ms each, 32 in flight: several seconds of writes.
    let r = run(
        dir.path(),
        &[
            "demo",
            "--headless",
            "--identities",
            "5000",
            "--seed",
            "3",
            "--sandbox-latency",
            "30ms",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains(" items done · "))
        .collect();
    assert!(
        !lines.is_empty(),
        "no progress line on stderr:\n{}",
        r.stderr
    );
    assert!(lines[0].contains("/s"), "{}", lines[0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn completions_manual_version_and_the_kubectl_plugin() {
    let dir = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let r = run(dir.path(), &["completions", shell]).await;
        assert_eq!(r.code, 0, "{shell}: {}", r.stderr);
        assert!(r.stdout.contains("cilium-idmig"), "{shell}");
        assert!(r.stdout.contains("max-connected-clusters"), "{shell}");
    }
    let r = run(dir.path(), &["man"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains(".TH cilium-idmig"),
        "{}",
        &r.stdout[..200.min(r.stdout.len())]
    );
    assert!(r.stdout.contains("CiliumIdentity"));
    // The exit codes are a contract: every page states them, and its examples, as sections
    // of their own.
    for page in ["apply", "sync", "audit"] {
        let r = run(dir.path(), &["man", page]).await;
        assert_eq!(r.code, 0, "{}", r.stderr);
        for section in [".SH \"EXAMPLES\"", ".SH \"EXIT STATUS\""] {
            assert!(r.stdout.contains(section), "{page}: {}", r.stdout);
        }
        assert!(!r.stdout.contains(".SH EXTRA"), "{page}: {}", r.stdout);
        assert!(r.stdout.contains("  2  usage"), "{page}: {}", r.stdout);
    }
    let r = run(dir.path(), &["--version"]).await;
    assert!(r.stdout.contains("Cilium: 1.6 and later"), "{}", r.stdout);
    assert!(
        r.stdout.contains("Kubernetes: 1.16 and later"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("Tested with: Cilium 1.9's and 1.18's own identity allocators"),
        "{}",
        r.stdout
    );
    // Installed as kubectl-cilium_idmig, it is a kubectl plugin and says so.
    let plugin = dir.path().join("kubectl-cilium_idmig");
    std::os::unix::fs::symlink(bin(), &plugin).unwrap();
    let out = tokio::process::Command::new(&plugin)
        .arg("--help")
        .output()
        .await
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: kubectl cilium-idmig"), "{help}");
}

#[tokio::test(flavor = "multi_thread")]
async fn plans_read_the_cache_and_verdicts_read_consistently() {
    use cilium_idmig::sandbox::ReadModel;
    let w = World::new(SandboxConfig {
        reads: ReadModel {
            watch_list: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let quorum = |w: &World| w.sb.request_count("LIST quorum");
    let cached = |w: &World| {
        w.sb.request_count("WATCH with initial events") + w.sb.request_count("LIST from cache")
    };
    let r = w.cli(&["plan"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!((cached(&w), quorum(&w)), (1, 0), "plan reads the cache");
    w.sb.reset_counts();
    let r = w.cli(&["apply", "--yes", "--accept-proposals"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        (cached(&w), quorum(&w)),
        (1, 0),
        "apply's re-read too: a create is guarded by its 409"
    );
    w.sb.reset_counts();
    let r = w.cli(&["verify"]).await;
    assert!(
        quorum(&w) >= 1 && cached(&w) == 0,
        "verify reads consistently: {}",
        r.stdout
    );
    w.sb.reset_counts();
    let r = w.cli(&["plan", "--consistent-reads"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(cached(&w), 0, "--consistent-reads forces quorum reads");
    assert!(quorum(&w) >= 1);
}

/// Runs the binary with its stdout a pipe whose reading end is already closed, as
/// `cilium-idmig ... | head -0` leaves it; returns the exit code and stderr.
async fn into_closed_pipe(dir: &std::path::Path, args: &[&str]) -> (i32, String) {
    let mut child = tokio::process::Command::new(bin())
        .current_dir(dir)
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn output_to_a_closed_pipe_ends_quietly_with_status_0() {
    let w = World::new(SandboxConfig::default()).await;
    seed_every_kind(&w.etcd, &w.sb).await;
    let kc = w.path("kubeconfig");
    for args in [
        vec!["man"],
        vec!["completions", "bash"],
        vec![
            "plan",
            "--etcd-endpoints",
            &w.etcd.endpoint,
            "--kubeconfig",
            &kc,
        ],
    ] {
        let (code, stderr) = into_closed_pipe(w.dir.path(), &args).await;
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(
            !stderr.contains("error") && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_failure_is_one_line_in_one_style_naming_what_to_do() {
    let w = World::new(SandboxConfig::default()).await;
    let kc = w.path("kubeconfig");
    let dead = format!("http://127.0.0.1:{}", crate::harness::free_port());
    let dead_kc = w.path("dead-kubeconfig");
    std::fs::write(
        &dead_kc,
        std::fs::read_to_string(&kc)
            .unwrap()
            .replace(&w.sb.url(), &dead),
    )
    .unwrap();
    let etcd = w.etcd.endpoint.clone();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["plan", "--kubeconfig", &kc], "--etcd-endpoints"),
        (vec!["plan", "--etcd-endpoints", &etcd], "--kubeconfig"),
        (
            vec!["plan", "--etcd-endpoints", &dead, "--kubeconfig", &kc],
            "check that etcd is up",
        ),
        (
            vec!["plan", "--etcd-endpoints", &etcd, "--kubeconfig", &dead_kc],
            "check that the API server is up",
        ),
        (vec!["plan", "--log-level", "==="], "--log-level"),
        // Sync without a kvstore is a configuration error, not an outage to wait out.
        (vec!["sync", "--kubeconfig", &kc], "--etcd-endpoints"),
    ];
    for (args, names) in cases {
        let r = tokio::time::timeout(std::time::Duration::from_secs(60), run(w.dir.path(), &args))
            .await
            .unwrap_or_else(|_| panic!("{args:?} did not end"));
        assert_ne!(r.code, 0, "{args:?}");
        let stderr = r.stderr.trim();
        let last = stderr.lines().last().unwrap_or("");
        assert!(
            last.starts_with("error: ") && last.contains(names),
            "{args:?}: {stderr}"
        );
        // Progress lines may come first on a slow read; the failure itself is one line,
        // in plain words (no client library's debug form).
        assert_eq!(
            stderr.lines().filter(|l| l.contains("error")).count(),
            1,
            "{args:?}: {stderr}"
        );
        for noise in ["Error:", "tonic", "ConnectError", "Os {"] {
            assert!(!stderr.contains(noise), "{args:?}: {stderr}");
        }
    }
}

/// An API server that refuses the first connection is not there: `plan` and `verify` fail
/// as etcd's client does, without the read's retries, and say what to check.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_api_server_fails_without_retrying() {
    let w = World::new(SandboxConfig::default()).await;
    let dead = format!("http://127.0.0.1:{}", crate::harness::free_port());
    let dead_kc = w.path("dead-kubeconfig");
    std::fs::write(
        &dead_kc,
        std::fs::read_to_string(w.path("kubeconfig"))
            .unwrap()
            .replace(&w.sb.url(), &dead),
    )
    .unwrap();
    for cmd in ["plan", "verify"] {
        let log = w.path(&format!("{cmd}.log"));
        let args = [
            cmd,
            "--etcd-endpoints",
            &w.etcd.endpoint,
            "--kubeconfig",
            &dead_kc,
            "--log-file",
            &log,
            "--log-level",
            "cilium_idmig=debug",
        ];
        let r = run(w.dir.path(), &args).await;
        assert_eq!(r.code, 1, "{cmd}: {}", r.stderr);
        assert!(r.stderr.contains(&dead), "{cmd}: {}", r.stderr);
        assert!(
            r.stderr.contains("check that the API server is up"),
            "{cmd}: {}",
            r.stderr
        );
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        for retry in ["retrying read", "listing again"] {
            assert!(
                !logged.contains(retry),
                "{cmd} retried a refusal:\n{logged}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_plays_a_whole_rollout_to_cutover() {
    let dir = tempfile::tempdir().unwrap();
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        run(
            dir.path(),
            &[
                "demo",
                "--headless",
                "--sync",
                "--identities",
                "300",
                "--nodes",
                "4",
                "--rollout-speed",
                "20",
            ],
        ),
    )
    .await
    .expect("the demo's rollout reaches cutover");
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for n in 1..=4 {
        assert!(
            r.stdout
                .contains(&format!("rollout: node-{n} moved to CRD mode")),
            "node-{n}: {}",
            r.stdout
        );
    }
    // Sync follows the nodes as they drain, mirrors what kvstore-mode nodes allocate, and
    // reports the split allocations the two blind allocators make in a narrow pool.
    assert!(r.stdout.contains("sync started: following both sides"));
    assert!(r.stdout.contains("split allocation at id"), "{}", r.stdout);
    assert!(r.stdout.contains("cutover reached"), "{}", r.stdout);
    assert!(
        r.stdout.contains("next: `verify --decision-log`"),
        "{}",
        r.stdout
    );
    let last_status = r
        .stdout
        .lines()
        .rfind(|l| l.starts_with("sync: "))
        .unwrap_or_default();
    assert!(
        last_status.starts_with("sync: 0 kvstore-mode nodes"),
        "{last_status}"
    );
    // As with Cilium's allocators (a random free id each), most new identities are simply
    // mirrored and a few split; blind agents taking the lowest free id split them all. The
    // splits the generated world held before sync started (its remaps) count from the
    // first status line on: the rollout's are those added since.
    let count_of = |line: &str, what: &str| -> u64 {
        line.split(" · ")
            .find_map(|part| part.strip_suffix(what)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{what} in {line}"))
    };
    let first_status = r
        .stdout
        .lines()
        .find(|l| l.starts_with("sync: ") && l.contains(" split · "))
        .unwrap_or_default();
    let at_start = count_of(first_status, " split");
    let (mirrored, split) = (
        count_of(last_status, " mirrored"),
        count_of(last_status, " split"),
    );
    assert!(
        at_start > 0,
        "the world's remaps are splits: {first_status}"
    );
    assert!(
        (split - at_start) * 3 < mirrored,
        "{first_status}\n{last_status}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_plan_names_every_refused_item() {
    let w = World::new(SandboxConfig::default()).await;
    for i in 0..30u32 {
        w.etcd
            .put(
                &format!("{P}/id/{}", 500 + i),
                format!("k8s:app=a{i};").as_bytes(),
            )
            .await;
    }
    let p = w.path("p.json");
    let r = w.cli(&["plan", "--output", &p]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    // Since the plan, CRD-mode agents took every id for other labels.
    for i in 0..30u32 {
        w.sb.seed_identity(
            500 + i,
            &cilium_idmig::core::labels::to_security_labels(
                &cilium_idmig::core::labels::parse_label_key(&format!("k8s:app=other{i};"))
                    .unwrap(),
            ),
        );
    }
    let r = w.cli(&["apply", "--plan", &p, "--yes"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("30 item(s) refused"), "{}", r.stderr);
    for i in 0..30u32 {
        assert!(
            r.stderr.contains(&format!("{}", 500 + i)),
            "item {} not named:\n{}",
            500 + i,
            r.stderr
        );
    }
    assert!(!r.stderr.contains("more"), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mistakes_people_make_get_a_clear_answer() {
    let w = crate::e2e::World::new(cilium_idmig::sandbox::SandboxConfig::default()).await;
    w.etcd
        .put("cilium/state/identities/v1/id/300", b"k8s:app=a;")
        .await;
    // Two letters swapped: a tip, exit 2.
    let r = w.cli(&["apply", "--yse"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("did you mean '--yes'"), "{}", r.stderr);
    // A kubeconfig that is not there: said plainly.
    let dir = tempfile::tempdir().unwrap();
    let r = crate::harness::run(
        dir.path(),
        &[
            "plan",
            "--kubeconfig",
            "/tmp/nope/kc",
            "--etcd-endpoints",
            &w.etcd.endpoint,
        ],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("kubeconfig /tmp/nope/kc: no such file") && !r.stderr.contains("'\""),
        "{}",
        r.stderr
    );
    // A log to resume in the TUI that is not there: refused as the headless commands do,
    // before the terminal is taken.
    for flag in ["--resume", "--rollback"] {
        let r = w.cli(&["tui", flag, "/tmp/nope/review.jsonl"]).await;
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr
                .contains("/tmp/nope/review.jsonl: no such decision log; check the path"),
            "{}",
            r.stderr
        );
    }
    // A plan onto an existing file is refused before anything is read or printed.
    let out = w.path("plan.json");
    std::fs::write(&out, "mine").unwrap();
    w.sb.reset_counts();
    let r = w.cli(&["plan", "--output", &out]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("already exists"), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "mine");
    assert_eq!(w.sb.request_count("GET ciliumidentities"), 0);
    // Two runs in the same second write two logs; verify reads both when a glob names them.
    let (a, b) = tokio::join!(w.cli(&["apply", "--yes"]), w.cli(&["apply", "--yes"]));
    assert!(a.code == 0 && b.code == 0, "{}{}", a.stderr, b.stderr);
    let logs: Vec<String> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().display().to_string())
        .filter(|p| p.contains("cilium-idmig-decisions-"))
        .collect();
    // Each run that wrote has a log of its own (a run that found everything in place, as
    // the second may, leaves none).
    assert!((1..=2).contains(&logs.len()), "{logs:?}");
    let mut args = vec!["verify", "--decision-log"];
    args.extend(logs.iter().map(String::as_str));
    let r = w.cli(&args).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    // A plan given as a log, and a log as a plan: each names the flag it belongs to.
    let plan = w.path("p2.json");
    let r = w.cli(&["plan", "--output", &plan]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = w.cli(&["apply", "--resume", &plan, "--yes"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("this is a plan file, not a decision log: give it to --plan"),
        "{}",
        r.stderr
    );
    let r = w.cli(&["apply", "--plan", &logs[0], "--yes"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("this is a decision log, not a plan: give it to --resume"),
        "{}",
        r.stderr
    );
}

/// Each command lists only the flags it uses: `--operator` where decisions are recorded,
/// the log flags where something runs, neither on `man` and `completions`; and flags typed
/// before the command are refused with where they go, not silently dropped.
#[tokio::test(flavor = "multi_thread")]
async fn each_command_offers_only_the_flags_it_uses() {
    let dir = tempfile::tempdir().unwrap();
    let records = ["plan", "apply", "rollback", "sync", "demo", "tui"];
    let runs = ["audit", "verify", "sandbox"];
    let prints = ["man", "completions"];
    for cmd in records.iter().chain(&runs).chain(&prints) {
        let r = run(dir.path(), &[cmd, "--help"]).await;
        assert_eq!(r.code, 0, "{cmd}: {}", r.stderr);
        assert_eq!(
            r.stdout.contains("--operator"),
            records.contains(cmd),
            "{cmd}: {}",
            r.stdout
        );
        assert_eq!(
            r.stdout.contains("--log-level") && r.stdout.contains("--log-file"),
            !prints.contains(cmd),
            "{cmd}: {}",
            r.stdout
        );
    }
    let r = run(dir.path(), &["--log-level", "debug", "plan"]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("flags go after its name: cilium-idmig plan"),
        "{}",
        r.stderr
    );
    // The flag where it belongs reaches the command: a bad filter is named.
    let r = run(dir.path(), &["sandbox", "--log-level", "==="]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("--log-level"), "{}", r.stderr);
}

/// A page per command, as the main page's SUBCOMMANDS section names them; an unknown one is
/// refused with the list.
#[tokio::test(flavor = "multi_thread")]
async fn every_command_the_manual_names_has_a_page_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let main = run(dir.path(), &["man"]).await;
    let named: Vec<String> = main
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("cilium\\-idmig\\-"))
        .filter_map(|l| l.strip_suffix("(1)"))
        .map(|n| n.replace("\\-", "-"))
        .collect();
    assert!(
        named.len() >= 8 && named.contains(&"apply".to_string()),
        "{named:?}"
    );
    for name in named.iter().filter(|n| *n != "help") {
        let r = run(dir.path(), &["man", name]).await;
        assert_eq!(r.code, 0, "{name}: {}", r.stderr);
        assert!(
            r.stdout.contains(&format!(".TH cilium-idmig-{name} 1")),
            "{name}"
        );
    }
    let r = run(dir.path(), &["man", "aply"]).await;
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("apply, rollback"), "{}", r.stderr);
}

/// A rehearsal from a dump of a cluster set up with another kvstore prefix: refused as
/// another prefix's dump without --kvstore-prefix, rehearsed with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_rehearsal_reads_a_dump_made_under_another_kvstore_prefix() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let labels = "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;";
    let dump = serde_json::json!({
        "header": {"revision": 9},
        "kvs": [
            {"key": b64("custom/ids/v1/id/300"), "value": b64(labels)},
            {"key": b64(&format!("custom/ids/v1/value/{labels}/10.0.0.1")), "value": b64("300")},
        ],
        "count": 2,
    });
    let file = dir.path().join("kvstore.json");
    std::fs::write(&file, dump.to_string()).unwrap();
    let file = file.to_str().unwrap();
    let r = run(dir.path(), &["demo", "--headless", "--from-snapshot", file]).await;
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("another prefix"), "{}", r.stderr);
    let r = run(
        dir.path(),
        &[
            "demo",
            "--headless",
            "--from-snapshot",
            file,
            "--kvstore-prefix",
            "custom/ids/v1",
        ],
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("created 1,"), "{}", r.stdout);
    assert!(r.stdout.contains("1 ok"), "{}", r.stdout);
    let r = run(
        dir.path(),
        &["demo", "--headless", "--kvstore-prefix", "custom/ids/v1"],
    )
    .await;
    assert_eq!(
        r.code, 2,
        "without a dump the prefix means nothing: {}",
        r.stderr
    );
}

/// No kubeconfig to be found: said plainly, with what was looked at, and exit 2.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_kubeconfig_is_said_plainly() {
    let dir = tempfile::tempdir().unwrap();
    for (kubeconfig, said) in [
        (None, "KUBECONFIG is not set"),
        (
            Some("/tmp/nope/kc"),
            "KUBECONFIG names /tmp/nope/kc, which does not exist",
        ),
    ] {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.current_dir(dir.path())
            .args(["rollback", "--decision-log", "x.jsonl"])
            .env("HOME", dir.path())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG");
        if let Some(k) = kubeconfig {
            cmd.env("KUBECONFIG", k);
        }
        let out = cmd.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(said) && stderr.contains("--kubeconfig"),
            "{stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

/// `log` prints whole lines only (a write in progress is not half-printed), refuses a log it
/// cannot read or with a damaged line with exit 2 naming the file, and `--decisions-only`
/// leaves the decisions alone.
#[tokio::test(flavor = "multi_thread")]
async fn log_prints_whole_lines_and_refuses_what_does_not_read_as_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let line = |id: &str, action: &str, outcome: &str| {
        format!(
            "{{\"ts\":\"2026-12-02T10:00:00Z\",\"operator\":\"alice\",\"id\":\"{id}\",\"labels\":\"k8s:app=a;\",\"kind\":\"remap\",\"decision\":\"{action} (operator)\",\"decided_by\":\"operator\",\"action\":\"{action}\",\"target_id\":4000,\"outcome\":{outcome},\"error\":null}}\n"
        )
    };
    let whole = format!(
        "{}{}",
        line("300", "create", "null"),
        line("300", "create", "\"created\"")
    );
    std::fs::write(
        d.join("rollout.jsonl"),
        format!("{whole}{{\"ts\":\"2026-12"),
    )
    .unwrap();
    let printed = run(d, &["log", "rollout.jsonl"]).await;
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    assert_eq!(printed.stdout, whole);
    let compact = run(d, &["log", "--decisions-only", "rollout.jsonl"]).await;
    assert_eq!(compact.code, 0, "{}", compact.stderr);
    assert_eq!(compact.stdout.lines().count(), 1, "{}", compact.stdout);
    assert!(
        compact.stdout.contains("\"outcome\":null"),
        "{}",
        compact.stdout
    );

    let missing = run(d, &["log", "nowhere.jsonl"]).await;
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("nowhere.jsonl"),
        "{}",
        missing.stderr
    );
    std::fs::write(d.join("damaged.jsonl"), format!("not json\n{whole}")).unwrap();
    let damaged = run(d, &["log", "damaged.jsonl"]).await;
    assert_eq!(damaged.code, 2, "{}", damaged.stderr);
    assert!(
        damaged
            .stderr
            .contains("line 1 of the decision log is damaged"),
        "{}",
        damaged.stderr
    );
    assert!(
        damaged.stdout.is_empty(),
        "nothing printed of a damaged log"
    );
}

/// Only a remap may choose another id: a plain create edited to 6000, an identity already
/// migrated at its own id given a second create, and a kind changed by hand are each refused
/// by name, and nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_hand_edit_moves_no_identity_off_its_own_id() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/1001"), b"k8s:app=a;").await;
    w.etcd.put(&format!("{P}/id/1002"), b"k8s:app=b;").await;
    w.etcd.put(&format!("{P}/id/1003"), b"k8s:app=c;").await;
    w.sb.seed_identity(
        1002,
        &cilium_idmig::core::labels::to_security_labels(
            &cilium_idmig::core::labels::parse_label_key("k8s:app=b;").unwrap(),
        ),
    );
    let p = w.path("p.json");
    let r = w.cli(&["plan", "--output", &p]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    for item in plan["items"].as_array_mut().unwrap() {
        match item["id"].as_str().unwrap() {
            "1001" => {
                item["target_id"] = 6000.into();
                item["decided"] = true.into();
            }
            "1002" => {
                item["action"] = "create".into();
                item["target_id"] = 6001.into();
                item["decided"] = true.into();
            }
            "1003" => item["kind"] = "remap".into(),
            _ => {}
        }
    }
    std::fs::write(&p, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
    w.sb.reset_counts();
    let r = w.cli(&["apply", "--plan", &p, "--yes"]).await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    for said in [
        "item 1001: is created at its own id 1001 (that id is free in Kubernetes); only a remap",
        "item 1002: is created at its own id 1002 (Kubernetes already holds these labels there)",
        "item 1003: the plan says it is a remap, but it is a create now",
    ] {
        assert!(r.stderr.contains(said), "{said:?} not in:\n{}", r.stderr);
    }
    assert_eq!(w.sb.request_count("POST ciliumidentities"), 0);
    assert_eq!(w.sb.objects().len(), 1, "only the seeded 1002");
    // An item taken out of the plan by hand is not said to have appeared since.
    plan["items"]
        .as_array_mut()
        .unwrap()
        .retain(|i| i["id"] == "1003");
    std::fs::write(&p, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
    let r = w.cli(&["apply", "--plan", &p, "--yes"]).await;
    assert!(r.code != 0, "1003's kind is still changed: {}", r.stderr);
    plan["items"][0]["kind"] = "create".into();
    std::fs::write(&p, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
    let r = w.cli(&["apply", "--plan", &p, "--yes"]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(
            "note: kvstore identity 1001 is not in the plan (it appeared after the plan was made, or its item was taken out of the plan)"
        ),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("appeared after the plan was made;"));
}

/// A server with no streaming lists (1.19) is read in pages without a warning: an expected
/// fallback is no warning.
#[tokio::test(flavor = "multi_thread")]
async fn an_expected_fallback_warns_of_nothing_and_a_pipe_gets_no_colour() {
    let w = World::new(SandboxConfig::answering_as(
        cilium_idmig::sandbox::Release::V1_19,
    ))
    .await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    let r = w.cli(&["plan"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!r.stderr.contains("WARN"), "{}", r.stderr);
    assert!(!r.stderr.contains("streaming list"), "{}", r.stderr);
}

/// A torn last line (a write cut short) is left out by `log` and `verify`, and each says so
/// on stderr in a line of its own, without colour codes in a pipe; stdout keeps only whole
/// lines.
#[tokio::test(flavor = "multi_thread")]
async fn a_torn_last_line_is_said_by_log_and_verify() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    let log = w.path("a.jsonl");
    let r = w.apply_accepting(&log).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(br#"{"ts":"2026-12-06T07:28:09.786Z","operator":"ro"#);
    std::fs::write(&log, &bytes).unwrap();
    let said = "a.jsonl ends in a torn line (a write cut short, or one still being written); it was left out";
    let r = crate::harness::run(w.dir.path(), &["log", &log]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains(said), "{}", r.stderr);
    assert!(r.stdout.ends_with('\n') && !r.stdout.contains("07:28:09.786Z"));
    let r = w.cli(&["verify", "--decision-log", &log]).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains(said), "{}", r.stderr);
    assert!(!r.stderr.contains('\u{1b}'), "{:?}", r.stderr);
}

/// A node uses the id its `value/` key names: where the kvstore holds one label set under
/// two ids, each id is used by its own node, in `plan` and in `audit`.
#[tokio::test(flavor = "multi_thread")]
async fn nodes_are_counted_per_id_in_plan_and_audit() {
    let w = World::new(SandboxConfig::default()).await;
    w.etcd.put(&format!("{P}/id/1100"), b"k8s:app=a;").await;
    w.etcd.put(&format!("{P}/id/1101"), b"k8s:app=a;").await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/10.0.0.1"), b"1100")
        .await;
    w.etcd
        .put(&format!("{P}/value/k8s:app=a;/10.0.0.2"), b"1101")
        .await;
    let r = w.cli(&["plan", "--output", "json"]).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    let plan: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    for item in plan["items"].as_array().unwrap() {
        assert_eq!(item["nodes"], 1, "{item}");
    }
    // Kubernetes holds 1101 for other labels: the node to roll is 10.0.0.2 alone.
    w.sb.seed_identity(
        1101,
        &cilium_idmig::core::labels::to_security_labels(
            &cilium_idmig::core::labels::parse_label_key("k8s:app=other;").unwrap(),
        ),
    );
    let r = w.cli(&["audit", "--output", "json"]).await;
    let audit: serde_json::Value = serde_json::from_str(&r.stdout).expect(&r.stdout);
    let split = audit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "split")
        .expect("a split");
    assert_eq!(split["nodes"], serde_json::json!(["10.0.0.2"]), "{split}");
}

/// The switch in a mesh cluster prepares in that cluster's own range, as cilium-config sets
/// it; a flag that contradicts the ConfigMap is refused naming both; and nothing is written
/// on a guess (no cilium-config found) unless the operator says to assume the defaults.
#[tokio::test(flavor = "multi_thread")]
async fn switch_prepare_uses_the_meshs_range_and_writes_nothing_on_a_guess() {
    use cilium_idmig::sandbox::pods::{namespace_object, pod_object};
    let w = World::new(SandboxConfig::default()).await;
    let labels = |app: &str| -> std::collections::BTreeMap<String, String> {
        [("app".to_string(), app.to_string())].into()
    };
    w.sb.add_namespace("shop", namespace_object("shop", &Default::default()));
    w.sb.add_pod(pod_object("shop", "new-1", &labels("new"), "default"));
    w.sb.add_config_map(
        "kube-system",
        "cilium-config",
        &[("cluster-id", "3"), ("max-connected-clusters", "511")],
    );
    // A flag that contradicts the ConfigMap: refused, both named, nothing written.
    let r = w
        .cli(&["switch-prepare", "--cluster-id", "5", "--yes"])
        .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("--cluster-id 5 contradicts kube-system/cilium-config (cluster-id 3)"),
        "{}",
        r.stderr
    );
    assert!(w.sb.objects().is_empty());
    // Cluster 3 with 511 clusters owns 98304..=131071: the identity lands there.
    let log = w.path("prepare.jsonl");
    let r = w
        .cli(&["switch-prepare", "--decision-log", &log, "--yes"])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let ids: Vec<u32> = w.sb.objects().keys().map(|k| k.parse().unwrap()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!((98304..=131071).contains(&ids[0]), "{ids:?}");
    let session = &crate::e2e::log_records(std::path::Path::new(&log))[0]["session"];
    assert_eq!(
        (&session["cluster_id"], &session["max_connected_clusters"]),
        (&serde_json::json!(3), &serde_json::json!(511)),
        "{session}"
    );
    // Cilium elsewhere, the namespace mistyped: the plan says what it cannot know, and
    // --yes writes nothing until the operator names the namespace or assumes the defaults.
    w.sb.add_pod(pod_object("shop", "new-2", &labels("other"), "default"));
    let r = w
        .cli(&["switch-prepare", "--cilium-namespace", "cilium"])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("cannot know: namespace cilium does not exist"),
        "{}",
        r.stdout
    );
    let before = w.sb.objects().len();
    let r = w
        .cli(&["switch-prepare", "--cilium-namespace", "cilium", "--yes"])
        .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("nothing is written on a guess")
            && r.stderr.contains("--cilium-namespace")
            && r.stderr.contains("--assume-defaults"),
        "{}",
        r.stderr
    );
    assert_eq!(w.sb.objects().len(), before);
    let r = w
        .cli(&[
            "switch-prepare",
            "--cilium-namespace",
            "cilium",
            "--yes",
            "--assume-defaults",
        ])
        .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(w.sb.objects().len(), before + 1);
}

/// A range with no free id leaves the switch drawing: said, and a failure (exit 1), never
/// "nothing to prepare"; a grace past counting is refused by name, not wrapped.
#[tokio::test(flavor = "multi_thread")]
async fn switch_prepare_with_no_free_id_fails_and_a_grace_past_counting_is_refused() {
    use cilium_idmig::sandbox::pods::{namespace_object, pod_object};
    let w = World::new(SandboxConfig::default()).await;
    w.sb.add_namespace("shop", namespace_object("shop", &Default::default()));
    let app: std::collections::BTreeMap<String, String> =
        [("app".to_string(), "new".to_string())].into();
    w.sb.add_pod(pod_object("shop", "new-1", &app, "default"));
    // Cluster 3 of 511 owns 98304..=131071: every id held by an identity of other labels.
    w.sb.add_config_map(
        "kube-system",
        "cilium-config",
        &[("cluster-id", "3"), ("max-connected-clusters", "511")],
    );
    for id in 98304..=131071u32 {
        let labels: std::collections::BTreeMap<String, String> = [
            ("k8s:app".to_string(), format!("held-{id}")),
            (
                "k8s:io.kubernetes.pod.namespace".to_string(),
                "shop".to_string(),
            ),
        ]
        .into();
        w.sb.seed_identity(id, &labels);
    }
    for yes in [false, true] {
        let args: &[&str] = if yes {
            &["switch-prepare", "--yes"]
        } else {
            &["switch-prepare"]
        };
        let r = w.cli(args).await;
        assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
        assert!(
            r.stdout.contains("1 label sets get no identity"),
            "{}",
            r.stdout
        );
        assert!(!r.stdout.contains("nothing to prepare"), "{}", r.stdout);
    }
    assert_eq!(w.sb.objects().len(), 32768, "nothing written");
    let r = w
        .cli(&[
            "switch-prepare",
            "--remove-unused-after",
            "100000000000000000000h",
        ])
        .await;
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("too long"), "{}", r.stderr);
}
