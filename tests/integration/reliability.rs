//! Nothing lost, nothing overwritten: SIGKILL at random points, etcd gone mid-read, a
//! read-only etcd user with auth and TLS, secrets kept out of every file, signals in the TUI.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use cilium_idmig::core::labels::SecurityLabels;
use cilium_idmig::sandbox::generator;
use cilium_idmig::sandbox::{FaultConfig, Sandbox, SandboxConfig};

use crate::harness::{Etcd, Tmux, bin, free_port, load_dataset, run};

const P: &str = "cilium/state/identities/v1";

fn state(sb: &Sandbox) -> BTreeMap<String, SecurityLabels> {
    sb.objects()
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

async fn fresh_sandbox(data: &generator::Generated, dir: &std::path::Path) -> Sandbox {
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    for (id, labels) in &data.k8s {
        sb.seed_identity(*id, labels);
    }
    sb.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
    sb
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_anywhere_then_rerun_converges_to_the_uninterrupted_state() {
    let etcd = Etcd::start().await;
    let data = load_dataset(&etcd, 300, 3, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kc = d.join("kubeconfig").display().to_string();
    let args = |log: &str| -> Vec<String> {
        [
            "apply",
            "--yes",
            "--accept-proposals",
            "--concurrency",
            "4",
            "--etcd-endpoints",
            &etcd.endpoint,
            "--kubeconfig",
            &kc,
            "--decision-log",
            log,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    // The uninterrupted run.
    let clean = fresh_sandbox(&data, d).await;
    let r = run(
        d,
        &args("clean.jsonl")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let expected = state(&clean);
    drop(clean);

    for (i, delay_ms) in [40u64, 90, 140, 200, 260, 330, 410, 500, 620, 760]
        .into_iter()
        .enumerate()
    {
        let sb = fresh_sandbox(&data, d).await;
        sb.set_faults(FaultConfig {
            latency: Duration::from_millis(8),
            ..Default::default()
        });
        let log = format!("kill{i}.jsonl");
        let mut child = tokio::process::Command::new(bin())
            .current_dir(d)
            .args(args(&log))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        child.start_kill().unwrap();
        let status = child.wait().await.unwrap();
        // Whatever was written so far is exactly what an uninterrupted run writes there.
        let partial = state(&sb);
        for (name, labels) in &partial {
            assert_eq!(
                expected.get(name),
                Some(labels),
                "run {i}: {name} is not what an uninterrupted run writes"
            );
        }
        if d.join(&log).exists() {
            let c = cilium_idmig::io::decision_log::read(&d.join(&log)).unwrap();
            assert!(
                c.bad_lines.is_empty(),
                "run {i}: only the last line may be torn"
            );
        }
        sb.set_faults(FaultConfig::default());
        let r = run(
            d,
            &args(&log).iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await;
        assert_eq!(
            r.code, 0,
            "run {i} (killed: {status}): {}{}",
            r.stdout, r.stderr
        );
        assert_eq!(state(&sb), expected, "run {i}: the rerun converges");
        let v = run(
            d,
            &[
                "verify",
                "--etcd-endpoints",
                &etcd.endpoint,
                "--kubeconfig",
                &kc,
                "--decision-log",
                &log,
            ],
        )
        .await;
        assert_eq!(v.code, 0, "run {i}: {}", v.stdout);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_stopped_during_the_snapshot_read_writes_nothing() {
    let mut etcd = Etcd::start().await;
    let data = load_dataset(&etcd, 4000, 4, 0).await;
    let dir = tempfile::tempdir().unwrap();
    let sb = fresh_sandbox(&data, dir.path()).await;
    let kc = dir.path().join("kubeconfig").display().to_string();
    let endpoint = etcd.endpoint.clone();
    let child = tokio::spawn({
        let dir = dir.path().to_path_buf();
        async move {
            run(
                &dir,
                &[
                    "apply",
                    "--yes",
                    "--accept-proposals",
                    "--etcd-page-size",
                    "1",
                    "--etcd-endpoints",
                    &endpoint,
                    "--kubeconfig",
                    &kc,
                ],
            )
            .await
        }
    });
    // Killed once the read has begun (both sides are read at once: the first list marks it),
    // not after a fixed time, which a fast run could finish within.
    let start = std::time::Instant::now();
    while sb.request_count("GET ciliumidentities") == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "apply never read"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    etcd.kill();
    let r = child.await.unwrap();
    // A server gone is failed work (1), not a usage error (2).
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains(etcd.endpoint.trim_start_matches("http://")),
        "{}",
        r.stderr
    );
    assert_eq!(
        sb.request_count("POST ciliumidentities"),
        0,
        "nothing written to Kubernetes"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_etcd_user_over_tls_suffices_and_secrets_stay_out_of_files() {
    let etcd = Etcd::start_tls().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    etcd.put(&format!("{P}/id/301"), b"k8s:app=b;").await;
    let password = "p4ss-word-xyz";
    let token = "s3cret-token-xyz";
    {
        let mut c = etcd.client().await.unwrap();
        c.role_add("root").await.unwrap();
        c.user_add("root", "root-pw-xyz", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.role_add("reader").await.unwrap();
        c.role_grant_permission("reader", etcd_client::Permission::read(P).with_prefix())
            .await
            .unwrap();
        c.user_add("idmig", password, None).await.unwrap();
        c.user_grant_role("idmig", "reader").await.unwrap();
        c.auth_enable().await.unwrap();
    }
    let t = etcd.tls.as_ref().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cfg = d.join("etcd.yaml");
    std::fs::write(
        &cfg,
        format!(
            "endpoints: [{}]\ntrusted-ca-file: {}\ncert-file: {}\nkey-file: {}\nusername: idmig\npassword: {password}\n",
            etcd.endpoint,
            t.ca.display(),
            t.cert.display(),
            t.key.display()
        ),
    )
    .unwrap();
    // Proof that these credentials cannot write.
    {
        let mut c = etcd.client_as(Some(("idmig", password))).await.unwrap();
        let err = c
            .put(format!("{P}/id/999"), "k8s:app=x;", None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("permission denied"), "{err}");
        assert_eq!(
            c.get(format!("{P}/id/300"), None)
                .await
                .unwrap()
                .kvs()
                .len(),
            1
        );
    }
    let sb = Sandbox::start(SandboxConfig {
        token: Some(token.into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let kc = d.join("kubeconfig");
    sb.write_kubeconfig(&kc).unwrap();
    let kc = kc.display().to_string();
    let cfg = cfg.display().to_string();
    let common = [
        "--etcd-config",
        cfg.as_str(),
        "--kubeconfig",
        kc.as_str(),
        "--log-file",
        "tool.log",
        "--log-level",
        "debug",
    ];
    let mut plan = vec!["plan", "--output", "plan.json"];
    plan.extend(common);
    let r = run(d, &plan).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let mut apply = vec![
        "apply",
        "--plan",
        "plan.json",
        "--yes",
        "--decision-log",
        "d.jsonl",
    ];
    apply.extend(common);
    let r = run(d, &apply).await;
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(sb.objects().len(), 2);
    // The session line names the kvstore the config file pointed at.
    let session = &crate::e2e::log_records(&d.join("d.jsonl"))[0]["session"];
    assert_eq!(
        session["kvstore_endpoints"],
        serde_json::json!([etcd.endpoint]),
        "{session}"
    );
    // Read-only credentials cannot reserve: sync says what to grant and writes nothing.
    let mut reserve = vec!["sync", "--reserve-in-kvstore", "--decision-log", "s.jsonl"];
    reserve.extend(common);
    let r = tokio::time::timeout(Duration::from_secs(60), run(d, &reserve))
        .await
        .expect("sync refuses at once");
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("--reserve-in-kvstore")
            && r.stderr.contains("grant-permission")
            && r.stderr.contains("readwrite"),
        "{}",
        r.stderr
    );
    let log = std::fs::read_to_string(d.join("tool.log")).unwrap();
    assert!(
        log.contains("read kvstore snapshot"),
        "the log file is written: {log}"
    );
    for file in ["tool.log", "plan.json", "d.jsonl"] {
        let text = std::fs::read_to_string(d.join(file)).unwrap();
        for secret in [password, token, "BEGIN PRIVATE KEY", "BEGIN EC PRIVATE KEY"] {
            assert!(
                !text.contains(secret),
                "{file} contains a secret ({secret})"
            );
        }
    }
    use std::os::unix::fs::PermissionsExt;
    for file in ["plan.json", "d.jsonl"] {
        assert_eq!(
            std::fs::metadata(d.join(file))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600,
            "{file}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_and_sigterm_during_a_tui_commit_stop_it_cleanly() {
    for (n, signal) in [(1, libc::SIGHUP), (2, libc::SIGTERM)] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("d.jsonl");
        let cmd = format!(
            "{} demo --identities 2000 --seed 8 --sandbox-latency 40ms --port {} --decision-log {}; echo EXITED $?; sleep 600",
            bin(),
            free_port(),
            log.display()
        );
        let t = Tmux::start(&format!("sig{n}"), &cmd);
        t.wait_for("scanned 2000", 60);
        t.keys(&["3", "A", "y", "4", "Enter", "y", "e", "s", "Enter"]);
        t.wait_for("Commit: Running", 60);
        std::thread::sleep(Duration::from_millis(300));
        let shell: i32 = t
            .cmd(&["display", "-p", "-t", "t", "#{pane_pid}"])
            .trim()
            .parse()
            .unwrap();
        let out = std::process::Command::new("pgrep")
            .args(["-P", &shell.to_string()])
            .output()
            .unwrap();
        let pid: i32 = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: sending a signal to a process this test started.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let s = t.wait_for("EXITED", 60);
        // Stopped with writes not made: exit 1, the same as a headless apply.
        assert!(s.contains("EXITED 1"), "signal {signal}: {s}");
        assert_eq!(t.alternate_on(), "0", "terminal restored");
        let records: Vec<Value> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let created = records.iter().filter(|r| r["outcome"] == "created").count();
        let not_attempted = records
            .iter()
            .filter(|r| r["outcome"] == "not-attempted")
            .count();
        assert!(
            created > 0 && not_attempted > 0,
            "signal {signal}: the log says where it stopped ({created} created, {not_attempted} not attempted)"
        );
    }
}
