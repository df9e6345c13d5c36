//! Figures on a real kube-apiserver 1.19 and etcd 3.4 (the shared control plane), side by
//! side in one run, each a whole process timed with its peak RSS:
//! - Cilium 1.6.11's own `preflight migrate-identity` and this tool's `apply` copying the
//!   same kvstore of `IDMIG_REAL_MIGRATOR_SIZE` identities (default 1,000: the migrator
//!   creates one at a time at its client's 5 per second, so 65,280 would take hours), each
//!   onto a fresh server;
//! - at `IDMIG_REAL_SIZE` (default 62,280: the rest of cluster 0's 65,280 ids come during
//!   the sync phase): the server's own create ceiling (concurrent creates from a plain
//!   client), `apply`, then on the migrated cluster `plan`, a rerun of `apply` and `verify`;
//! - `sync` following that cluster: start-up until both watches follow, then lag p50/p99
//!   while 50 new identities a second arrive for a minute, its peak RSS and CPU.
//!
//! `cargo bench --bench real` (with `KUBEBUILDER_ASSETS` and `CONTROL_PLANE` set as for
//! the tests; without them it says so and ends). Prints a Markdown report.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cilium_idmig::sandbox::generator::{self, GenConfig, Generated};

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::control_plane::ControlPlane;
use support::{Etcd, load_etcd};

const PREFIX: &str = "cilium/state/identities/v1";

/// A whole process's wall time, peak RSS and exit code, from `/usr/bin/time`.
struct Timed {
    took: Duration,
    rss_mib: f64,
    code: i32,
    output: String,
}

fn timed(dir: &Path, program: &Path, args: &[&str]) -> Timed {
    let start = Instant::now();
    let out = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("IDMIG_MAXRSS=%M")
        .arg(program)
        .args(args)
        .current_dir(dir)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("/usr/bin/time (Debian package time)");
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let kib: f64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("IDMIG_MAXRSS="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Timed {
        took,
        rss_mib: kib / 1024.0,
        code: out.status.code().unwrap_or(-1),
        output: format!("{}{stderr}", String::from_utf8_lossy(&out.stdout)),
    }
}

/// Clean kvstore identities (every one a plain create), each used by one node.
fn clean(n: usize, seed: u64) -> Generated {
    generator::generate(&GenConfig {
        identities: n,
        nodes: 1,
        seed,
        every_node: true,
        migrated: 0.0,
        remap: 0.0,
        reuse: 0.0,
        duplicate: 0.0,
        invalid: 0.0,
        ..Default::default()
    })
    .expect("generate")
}

fn count(cp: &ControlPlane) -> usize {
    cp.kubectl(&["get", "ciliumidentities", "-o", "name"])
        .lines()
        .count()
}

fn row(what: &str, n: usize, t: &Timed) -> String {
    format!(
        "| {what} | {n} | {:.1} s | {:.0}/s | {:.0} MiB | {} |",
        t.took.as_secs_f64(),
        n as f64 / t.took.as_secs_f64(),
        t.rss_mib,
        t.code
    )
}

/// Creates `n` objects named `ceiling-<i>` through a plain client (kube's dynamic `Api`,
/// one connection pool, 32 in flight): the most the server takes; then deletes them.
async fn ceiling(cp: &ControlPlane, n: usize) -> Duration {
    use futures::StreamExt;
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::discovery::ApiResource;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&cp.kubeconfig).expect("kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let resource = ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumIdentity".into(),
        plural: "ciliumidentities".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let resource = resource.clone();
            async move {
                let mut o = DynamicObject::new(&format!("ceiling-{i}"), &resource);
                o.metadata.labels = Some(BTreeMap::from([("bench".into(), "ceiling".into())]));
                o.data = serde_json::json!({"security-labels": {"k8s:bench": format!("c{i}")}});
                api.create(&PostParams::default(), &o)
                    .await
                    .expect("create");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let took = start.elapsed();
    cp.kubectl(&[
        "delete",
        "ciliumidentities",
        "-l",
        "bench=ceiling",
        "--wait=false",
    ]);
    took
}

/// The sync process's CPU seconds so far (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (11 and 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

/// Peak RSS (VmHWM) of a running process, in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Waits until `file` holds `text`; how long that took.
fn wait_for(file: &Path, text: &str, secs: u64) -> Duration {
    let start = Instant::now();
    loop {
        if std::fs::read_to_string(file)
            .unwrap_or_default()
            .contains(text)
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{text:?} not said in {secs} s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("real-server benchmark: run it with `cargo bench --bench real`");
        return;
    }
    let size: usize = std::env::var("IDMIG_REAL_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(62_280);
    let small: usize = std::env::var("IDMIG_REAL_MIGRATOR_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000);
    let bin = Path::new(env!("CARGO_BIN_EXE_cilium-idmig"));
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    println!("| step | identities | wall | per second | peak RSS | exit |");
    println!("|---|---|---|---|---|---|");

    // Cilium's migrator and this tool, each copying the same small kvstore to a fresh server.
    match support::control_plane::cilium_bin("cilium-1.6.11") {
        Err(why) => eprintln!("Cilium 1.6.11's migrator skipped: {why}"),
        Ok(migrator) => {
            let etcd = Etcd::start().await;
            let data = clean(small, 11);
            load_etcd(&mut etcd.client().await.expect("etcd"), PREFIX, &data).await;
            let etcd_config = d.join("etcd.yaml");
            std::fs::write(
                &etcd_config,
                format!("endpoints: [\"{}\"]\n", etcd.endpoint),
            )
            .expect("etcd config");
            let Some(cp) = ControlPlane::start("bench real: Cilium's migrator") else {
                return;
            };
            let opt = format!("etcd.config={}", etcd_config.display());
            let kc = cp.kubeconfig.display().to_string();
            let t = timed(
                d,
                &migrator,
                &[
                    "preflight",
                    "migrate-identity",
                    "--kvstore",
                    "etcd",
                    "--kvstore-opt",
                    &opt,
                    "--k8s-kubeconfig-path",
                    &kc,
                ],
            );
            println!(
                "{} objects: {} |",
                row("Cilium 1.6.11 `preflight migrate-identity`", small, &t).trim_end_matches(" |"),
                count(&cp)
            );
            drop(cp);
            let Some(cp) = ControlPlane::start("bench real: apply beside the migrator") else {
                return;
            };
            let kc = cp.kubeconfig.display().to_string();
            let args = [
                "apply",
                "--yes",
                "--accept-proposals",
                "--decision-log",
                "small.jsonl",
                "--etcd-endpoints",
                &etcd.endpoint,
                "--kubeconfig",
                &kc,
            ];
            let t = timed(d, bin, &args);
            println!(
                "{} objects: {} |",
                row("cilium-idmig `apply`", small, &t).trim_end_matches(" |"),
                count(&cp)
            );
        }
    }

    // The large cluster.
    let etcd = Etcd::start().await;
    let data = clean(size, 12);
    let t = Instant::now();
    load_etcd(&mut etcd.client().await.expect("etcd"), PREFIX, &data).await;
    eprintln!(
        "loaded {size} identities into etcd in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let Some(cp) = ControlPlane::start("bench real") else {
        return;
    };
    let kc = cp.kubeconfig.display().to_string();
    let ceiling_n = size.min(10_000);
    let took = ceiling(&cp, ceiling_n).await;
    println!(
        "| the server's ceiling: creates from a plain client, 32 in flight | {ceiling_n} | {:.1} s | {:.0}/s | | |",
        took.as_secs_f64(),
        ceiling_n as f64 / took.as_secs_f64()
    );
    // The ceiling's objects are gone before the tool reads the cluster.
    while count(&cp) > 0 {
        std::thread::sleep(Duration::from_millis(500));
    }
    let conn = ["--etcd-endpoints", &etcd.endpoint, "--kubeconfig", &kc];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(conn.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run = |args: &[&str]| {
        let args = with(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        timed(d, bin, &args)
    };
    let apply = [
        "apply",
        "--yes",
        "--accept-proposals",
        "--decision-log",
        "large.jsonl",
    ];
    let t = run(&apply);
    println!("{}", row("cilium-idmig `apply`", size, &t));
    assert_eq!(t.code, 0, "{}", t.output);
    let t = run(&["plan", "--output", "plan.json"]);
    println!("{}", row("`plan` of the migrated cluster", size, &t));
    let t = run(&apply);
    println!("{}", row("`apply` again (nothing to do)", size, &t));
    let t = run(&["verify", "--decision-log", "large.jsonl"]);
    println!("{}", row("`verify`", size, &t));

    // Sync following it, then 50 new identities a second for a minute.
    let out = d.join("sync.out");
    let mut child = Command::new(bin)
        .current_dir(d)
        .args(with(&["sync", "--decision-log", "sync.jsonl"]))
        .env_remove("KUBECONFIG")
        .env("HOME", d)
        .stdout(std::fs::File::create(&out).expect("sync.out"))
        .stderr(Stdio::null())
        .spawn()
        .expect("sync");
    let pid = child.id();
    let startup = wait_for(&out, "following both sides", 300);
    let cpu_at_start = cpu_seconds(pid);
    let rss_at_start = peak_rss_mib(pid);
    let mut client = etcd.client().await.expect("etcd");
    let first = 256 + size as u32;
    let fed = Instant::now();
    let mut written = 0u32;
    while fed.elapsed() < Duration::from_secs(60) && first + written <= 65_535 {
        for _ in 0..5 {
            let id = first + written;
            let labels = format!("k8s:app=new{id};k8s:io.kubernetes.pod.namespace=bench;");
            client
                .put(format!("{PREFIX}/id/{id}"), labels.clone(), None)
                .await
                .expect("put");
            client
                .put(
                    format!("{PREFIX}/value/{labels}/10.0.0.9"),
                    id.to_string(),
                    None,
                )
                .await
                .expect("put");
            written += 1;
        }
        // 5 every 100 ms: 50 a second.
        let due = Duration::from_millis(100) * (written / 5);
        if let Some(wait) = due.checked_sub(fed.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    let window = fed.elapsed();
    // Until every one is mirrored.
    let mirrored = format!("{written} mirrored");
    let drained = wait_for(&out, &mirrored, 120);
    let cpu = cpu_seconds(pid) - cpu_at_start;
    let rss = peak_rss_mib(pid);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let last = text
        .lines()
        .rfind(|l| l.starts_with("sync:"))
        .unwrap_or("")
        .to_string();
    let _ = child.kill();
    let _ = child.wait();
    println!();
    println!(
        "sync at {size} identities: following both sides {:.1} s after start (peak RSS {rss_at_start:.0} MiB then); {written} new identities at 50/s over {:.0} s, all mirrored {:.1} s after the last; {cpu:.1} CPU-seconds in that time ({:.0}% of one core); peak RSS {rss:.0} MiB; its last status: `{last}`",
        startup.as_secs_f64(),
        window.as_secs_f64(),
        drained.as_secs_f64(),
        100.0 * cpu / (window + drained).as_secs_f64()
    );
}
