//! Scale benchmarks at 1,000, 10,000 and 65,280 identities, all in one run: etcd snapshot
//! read (real etcd), Kubernetes list (sandbox), plan, apply against 1 ms of injected latency
//! (defaults versus one request at a time), TUI frame and filter, peak RSS of `plan`, and a
//! rerun after a finished migration. `cargo bench` runs it; `IDMIG_BENCH_SIZES=1000,10000`
//! picks sizes, `IDMIG_BENCH_NODES` the nodes per identity (`IDMIG_BENCH_ALL_NODES=1`: every identity on
//! every node), `IDMIG_BENCH_SEQ_MAX` the largest
//! size that runs the sequential baseline, and `IDMIG_BENCH_HOLD=1` keeps each size's etcd and
//! API server up for profiling `plan` by hand. Prints a Markdown report.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cilium_idmig::apply::executor::{self, ApplyOptions, StopFlag, Watchers};
use cilium_idmig::core::planner::{self, reconcile};
use cilium_idmig::core::range::IdRange;
use cilium_idmig::io::etcd::{EtcdConnection, EtcdOptions};
use cilium_idmig::io::k8s::{K8sTarget, ReadMode};
use cilium_idmig::sandbox::generator::{self, GenConfig};
use cilium_idmig::sandbox::{FaultConfig, Sandbox, SandboxConfig};

use cilium_idmig::tui::model::Model;

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::{Etcd, load_etcd};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

async fn time_async<T, F: std::future::Future<Output = T>>(
    runs: usize,
    mut f: impl FnMut() -> F,
) -> (Duration, T) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        last = Some(f().await);
        times.push(t.elapsed());
    }
    (median(times), last.expect("at least one run"))
}

/// Runs a command to completion under `/usr/bin/time` and returns (wall time, peak RSS in
/// KiB, success). `time` forks a small process before exec; measuring our own child directly
/// would report this benchmark's RSS, which Linux carries across a vfork+exec.
fn run_measured(cmd: &mut Command) -> (Duration, i64, bool) {
    let start = Instant::now();
    let mut timed = Command::new("/usr/bin/time");
    timed
        .arg("-f")
        .arg("IDMIG_MAXRSS=%M")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        timed.current_dir(dir);
    }
    let out = timed
        .stdout(Stdio::null())
        .output()
        .expect("run /usr/bin/time (Debian package `time`)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rss = stderr
        .lines()
        .find_map(|l| l.strip_prefix("IDMIG_MAXRSS="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1);
    (start.elapsed(), rss, out.status.success())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
            })
        })
        .unwrap_or(0);
    format!(
        "{cpu}, {cores} cores, {:.0} GiB RAM, {}",
        mem as f64 / 1048576.0,
        std::env::consts::OS
    )
}

struct Row {
    n: usize,
    value_keys: u64,
    etcd_read: Duration,
    node_count: Duration,
    k8s_list: Duration,
    plan: Duration,
    apply_default: Duration,
    apply_seq: Option<Duration>,
    frame: Duration,
    filter: Duration,
    plan_rss_kib: i64,
    plan_wall: Duration,
    rerun_wall: Duration,
    reads_after: Duration,
    rerun_posts: u64,
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` does not, and gets a quick exit.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("scale benchmark: run it with `cargo bench --bench scale`");
        return;
    }
    let sizes: Vec<usize> = std::env::var("IDMIG_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000,65280".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let nodes: u32 = std::env::var("IDMIG_BENCH_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let every_node = std::env::var_os("IDMIG_BENCH_ALL_NODES").is_some();
    let skip_seq_above: usize = std::env::var("IDMIG_BENCH_SEQ_MAX")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    let bin = env!("CARGO_BIN_EXE_cilium-idmig");
    let etcd = Etcd::start().await;
    let range = IdRange::for_cluster(0).expect("range");
    let mut rows = Vec::new();
    for &n in &sizes {
        eprintln!("== {n} identities");
        let prefix = format!("bench{n}/cilium/state/identities/v1");
        let data = generator::generate(&GenConfig {
            identities: n,
            nodes,
            seed: n as u64,
            every_node,
            ..Default::default()
        })
        .expect("generate");
        let mut client = etcd.client().await.expect("etcd client");
        let t = Instant::now();
        load_etcd(&mut client, &prefix, &data).await;
        eprintln!("   loaded etcd in {:.1}s", t.elapsed().as_secs_f64());
        let eopts = EtcdOptions {
            endpoints: vec![etcd.endpoint.clone()],
            prefix: prefix.clone(),
            ..Default::default()
        };
        let conn = EtcdConnection::connect(&eopts).await.expect("etcd");
        let (etcd_read, snap) = time_async(5, || conn.read_masters(&prefix, eopts.page_size)).await;
        let mut snap = snap.expect("snapshot");
        let (node_count, counts) = time_async(3, || conn.count_nodes(&snap, eopts.page_size)).await;
        snap.node_counts = counts.expect("node counts");
        let value_keys: u64 = snap.node_counts.total();
        assert_eq!(snap.masters.len(), n);

        let seeded = Sandbox::start(SandboxConfig::default())
            .await
            .expect("sandbox");
        for (id, labels) in &data.k8s {
            seeded.seed_identity(*id, labels);
        }
        let target = K8sTarget::from_url(&seeded.url()).expect("target");
        let (k8s_list, k8s) =
            time_async(5, || target.list_identities(ReadMode::Consistent, None)).await;
        let k8s = k8s.expect("list");

        let mut plan_times = Vec::new();
        let mut items = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            items = planner::plan(&snap.masters, &snap.node_counts, &k8s.identities, range);
            plan_times.push(t.elapsed());
        }
        let plan = median(plan_times);
        let ops = reconcile(&items, &items, &k8s.identities, range, true)
            .expect("reconcile")
            .ops;
        let writes = ops
            .iter()
            .filter(|o| o.op == planner::OpKind::Create)
            .count();

        // Apply: defaults versus one request at a time, each on a fresh seeded sandbox with 1 ms latency.
        let apply_with = |concurrency: usize| {
            let ops = ops.clone();
            let data = &data;
            async move {
                let sb = Sandbox::start(SandboxConfig::default())
                    .await
                    .expect("sandbox");
                for (id, labels) in &data.k8s {
                    sb.seed_identity(*id, labels);
                }
                sb.set_faults(FaultConfig {
                    latency: Duration::from_millis(1),
                    ..Default::default()
                });
                let target = K8sTarget::from_url(&sb.url()).expect("target");
                let opts = ApplyOptions {
                    concurrency,
                    ..Default::default()
                };
                let t = Instant::now();
                let report = executor::apply(
                    &target,
                    ops,
                    false,
                    &opts,
                    None,
                    Watchers::default(),
                    StopFlag::default(),
                )
                .await
                .expect("apply");
                let took = t.elapsed();
                assert_eq!(
                    report.count(cilium_idmig::core::outcome::Outcome::Created),
                    writes
                );
                (took, sb)
            }
        };
        let (apply_default, migrated) = apply_with(ApplyOptions::default().concurrency).await;
        eprintln!("   apply default {}", ms(apply_default));
        let apply_seq = if n <= skip_seq_above {
            let (d, _) = apply_with(1).await;
            eprintln!("   apply sequential {}", ms(d));
            Some(d)
        } else {
            None
        };

        // TUI: one frame of the identities screen, and a `/` filter, at N rows.
        let mut model = Model::new(range, false);
        model.table.page = 45;
        model.set_items(items.clone());
        model.screen = cilium_idmig::tui::model::Screen::Identities;
        model.table.selected = n / 2;
        model.clamp_offset();
        let mut term =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(200, 50)).expect("terminal");
        let mut frames = Vec::new();
        for _ in 0..50 {
            let t = Instant::now();
            term.draw(|f| cilium_idmig::tui::view::view(&model, f))
                .expect("draw");
            frames.push(t.elapsed());
        }
        let frame = median(frames);
        let mut filters = Vec::new();
        for q in [
            "payments",
            "web-1",
            "istio",
            "zzz-none",
            "kube-system",
            "app=ledger",
            "v3",
            "default",
            "backend",
            "cache",
        ] {
            model.table.search = q.into();
            let t = Instant::now();
            model.rebuild_view();
            filters.push(t.elapsed());
        }
        let filter = median(filters);

        // Peak RSS and wall time of the real `plan` process, and a rerun after the migration.
        let dir = tempfile::tempdir().expect("tempdir");
        let kc = dir.path().join("kubeconfig");
        seeded.write_kubeconfig(&kc).expect("kubeconfig");
        if std::env::var_os("IDMIG_BENCH_HOLD").is_some() {
            // Keep this size's etcd and API server up, to profile `plan` by hand.
            eprintln!(
                "holding: {bin} plan --etcd-endpoints {} --kvstore-prefix {prefix} --kubeconfig {}",
                etcd.endpoint,
                kc.display()
            );
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let (plan_wall, plan_rss_kib, ok) = run_measured(
            Command::new(bin)
                .args([
                    "plan",
                    "--etcd-endpoints",
                    &etcd.endpoint,
                    "--kvstore-prefix",
                    &prefix,
                    "--kubeconfig",
                ])
                .arg(&kc),
        );
        assert!(ok, "plan failed");
        migrated.set_faults(FaultConfig::default());
        // The two reads a rerun makes, now that Kubernetes holds every identity.
        let migrated_target = K8sTarget::from_url(&migrated.url()).expect("target");
        let (list_after, _) = time_async(3, || {
            migrated_target.list_identities(ReadMode::Consistent, None)
        })
        .await;
        let reads_after = etcd_read + list_after;
        migrated.write_kubeconfig(&kc).expect("kubeconfig");
        migrated.reset_counts();
        let (rerun_wall, _, ok) = run_measured(
            Command::new(bin)
                .current_dir(dir.path())
                .args([
                    "apply",
                    "--yes",
                    "--accept-proposals",
                    "--etcd-endpoints",
                    &etcd.endpoint,
                    "--kvstore-prefix",
                    &prefix,
                    "--kubeconfig",
                ])
                .arg(&kc),
        );
        assert!(ok, "rerun failed");
        let rerun_posts = migrated.request_count("POST ciliumidentities");
        rows.push(Row {
            n,
            value_keys,
            etcd_read,
            node_count,
            k8s_list,
            plan,
            apply_default,
            apply_seq,
            frame,
            filter,
            plan_rss_kib,
            plan_wall,
            rerun_wall,
            reads_after,
            rerun_posts,
        });
    }

    println!("Machine: {}\n", machine());
    println!(
        "Up to {nodes} nodes per identity; 5% of each conflict kind and 5% malformed entries; apply against 1 ms of injected latency per request.\n"
    );
    println!(
        "| N | value/ keys | etcd read (identities) | node-count pass | k8s list | plan (pure) | `plan` process | `plan` peak RSS | rerun after migration (POSTs) | the two reads after migration |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} MiB | {} ({}) | {} |",
            r.n,
            r.value_keys,
            ms(r.etcd_read),
            ms(r.node_count),
            ms(r.k8s_list),
            ms(r.plan),
            ms(r.plan_wall),
            r.plan_rss_kib as f64 / 1024.0,
            ms(r.rerun_wall),
            r.rerun_posts,
            ms(r.reads_after)
        );
    }
    println!();
    println!(
        "| N | apply, defaults (32 in flight) | apply, one at a time | speed-up | identities frame | `/` filter |"
    );
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        let (seq, ratio) = match r.apply_seq {
            Some(s) => (
                ms(s),
                format!("{:.1}x", s.as_secs_f64() / r.apply_default.as_secs_f64()),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {} | {} | {:.3} ms | {} |",
            r.n,
            ms(r.apply_default),
            seq,
            ratio,
            r.frame.as_secs_f64() * 1000.0,
            ms(r.filter)
        );
    }
}
