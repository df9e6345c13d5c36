//! `fleet` over many clusters: `IDMIG_FLEET_CLUSTERS` sandbox API servers (default 50) in
//! this process, each with `IDMIG_FLEET_IDENTITIES` CiliumIdentity objects (default 2,000),
//! 200 pods and a sync's published standing, as contexts of one kubeconfig. Three rounds of
//! `fleet --all-contexts --output json` as a whole process under `/usr/bin/time`, then three
//! with `--switch` (every pod read too): the median wall time and the peak RSS.
//!
//! `cargo bench --bench fleet`. Prints a Markdown report.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cilium_idmig::sandbox::pods::{namespace_object, pod_object};
use cilium_idmig::sandbox::{Sandbox, SandboxConfig};

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::proc_stats::bench_bin;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace(['_', ','], "").parse().ok())
        .unwrap_or(default)
}

/// One cluster: identities, pods in one namespace, the standing its sync published.
async fn cluster(identities: usize, i: usize) -> Sandbox {
    let sb = Sandbox::start(SandboxConfig::default())
        .await
        .expect("sandbox");
    for id in 0..identities {
        let labels = [
            ("k8s:app".to_string(), format!("app-{id}")),
            (
                "k8s:io.kubernetes.pod.namespace".to_string(),
                "shop".to_string(),
            ),
        ]
        .into();
        sb.seed_identity(1000 + id as u32, &labels);
    }
    sb.add_namespace("shop", namespace_object("shop", &Default::default()));
    for p in 0..200 {
        let labels = [("app".to_string(), format!("app-{p}"))].into();
        sb.add_pod(pod_object("shop", &format!("p-{p}"), &labels, "default"));
    }
    let phase = [
        "cutover-reached",
        "following-rollout",
        "waiting-for-decisions",
    ][i % 3];
    let updated = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    sb.add_config_map(
        "kube-system",
        "cilium-idmig-sync-status",
        &[("phase", phase), ("updated", &updated)],
    );
    sb
}

/// `fleet` under `/usr/bin/time`: wall time, peak RSS (MiB), rows.
fn fleet(dir: &Path, kc: &Path, switch: bool) -> (Duration, f64, usize) {
    let start = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "IDMIG_MAXRSS=%M"])
        .arg(bench_bin())
        .args([
            "fleet",
            "--all-contexts",
            "--output",
            "json",
            "--kubeconfig",
        ])
        .arg(kc)
        .args(switch.then_some("--switch"))
        .current_dir(dir)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("/usr/bin/time (Debian package time)");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rss = support::proc_stats::max_rss_mib(&stderr).unwrap_or(0.0);
    let rows: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("fleet: {e}: {stderr}"));
    let read = rows.iter().filter(|r| r["error"].is_null()).count();
    (took, rss, read)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("fleet benchmark: run it with `cargo bench --bench fleet`");
        return;
    }
    let n = env_usize("IDMIG_FLEET_CLUSTERS", 50);
    let identities = env_usize("IDMIG_FLEET_IDENTITIES", 2000);
    let mut clusters = Vec::new();
    for i in 0..n {
        clusters.push(cluster(identities, i).await);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let kc = dir.path().join("fleet.yaml");
    let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for (i, sb) in clusters.iter().enumerate() {
        text.push_str(&format!(
            "- name: c{i}\n  cluster:\n    server: {}\n",
            sb.url()
        ));
    }
    text.push_str("contexts:\n");
    for i in 0..n {
        text.push_str(&format!(
            "- name: c{i}\n  context:\n    cluster: c{i}\n    user: u\n"
        ));
    }
    text.push_str("current-context: c0\nusers:\n- name: u\n  user: {}\n");
    std::fs::write(&kc, text).expect("kubeconfig");
    println!(
        "| `fleet --all-contexts` over {n} clusters of {identities} identities | median | peak RSS | clusters read |"
    );
    println!("|---|---|---|---|");
    for switch in [false, true] {
        let d = dir.path().to_path_buf();
        let kc = kc.clone();
        let rounds = tokio::task::spawn_blocking(move || {
            (0..3).map(|_| fleet(&d, &kc, switch)).collect::<Vec<_>>()
        })
        .await
        .expect("rounds");
        let took = median(rounds.iter().map(|r| r.0.as_secs_f64()).collect());
        let rss = rounds.iter().map(|r| r.1).fold(0.0, f64::max);
        let read = rounds.iter().map(|r| r.2).min().unwrap_or(0);
        println!(
            "| {} | {took:.2} s | {rss:.0} MiB | {read} of {n} |",
            if switch { "with `--switch`" } else { "plain" }
        );
    }
}
