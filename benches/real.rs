//! Figures on a real kube-apiserver 1.19 and etcd 3.4 (the shared control plane), side by
//! side in one run, each a whole process timed with its peak RSS:
//! - Cilium 1.6.11's own `preflight migrate-identity` and this tool's `apply` copying the
//!   same kvstore of `IDMIG_REAL_MIGRATOR_SIZE` identities (default 1,000: the migrator
//!   creates one at a time at its client's 5 per second, so 65,280 would take hours), each
//!   onto a fresh server;
//! - at `IDMIG_REAL_SIZE` (default 62,280: the rest of cluster 0's 65,280 ids come during
//!   the sync phase): the server's own create ceiling (concurrent creates from a plain
//!   client), `apply`, then on the migrated cluster `plan`, a rerun of `apply` and `verify`;
//! - `sync` following that cluster: start-up until both watches follow; the CPU one change
//!   costs it (200 new identities, one every 0.25 s); lag p50/p99 while 50 new identities a
//!   second arrive for a minute (filling cluster 0's range), its peak RSS and CPU; then the
//!   CPU one change costs at a full range (200 ids the kvstore's GC freed, handed out again
//!   for new labels: each needs a remap and finds no id free).
//!
//! - with `IDMIG_REAL_SOAK_SECS=N` (7200 for the 2 hours), that sync then soaked for N s at
//!   about 65,000 live identities, 20 allocated and 20 collected a second: its resident
//!   memory every 30 s and the slope after warm-up. `IDMIG_REAL_SOAK_ONLY=1` skips the
//!   migrator, the ceiling, plan, rerun and verify (the apply and sync's start stay).
//!
//! `IDMIG_REAL_BEFORE=<binary>` times an older build of the tool beside this one for `plan`,
//! the rerun and `verify` (best of 3 each, in turn on the same cluster, against the floor:
//! both stores' reads started together with no tool).
//!
//! `IDMIG_REAL_HOLD=1` keeps the migrated cluster up after `verify`, its connection flags
//! on stderr, for profiling by hand. `KUBE_VERSION=1.36` runs it all on kube-apiserver 1.36
//! over etcd 3.6.
//!
//! `cargo bench --bench real` (with `KUBEBUILDER_ASSETS` and `CONTROL_PLANE` set as for
//! the tests; without them it says so and ends). Prints a Markdown report.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cilium_idmig::sandbox::generator::{self, GenConfig, Generated};

#[path = "real/limit.rs"]
mod limit;
#[path = "real/per_change.rs"]
mod per_change;
#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::control_plane::ControlPlane;
use support::proc_stats::{cpu_seconds, peak_mib, rss_mib, slope_per_hour};
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
    Timed {
        took,
        rss_mib: support::proc_stats::max_rss_mib(&stderr).unwrap_or(0.0),
        code: out.status.code().unwrap_or(-1),
        output: format!("{}{stderr}", String::from_utf8_lossy(&out.stdout)),
    }
}

/// Clean kvstore identities (every one a plain create), each used by every one of `nodes`
/// nodes (a `value/` key per node).
fn clean(n: usize, seed: u64, nodes: u32) -> Generated {
    generator::generate(&GenConfig {
        identities: n,
        nodes,
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
    use kube::api::{DynamicObject, PostParams};
    let api = identities_api(cp).await;
    let resource = identity_resource();
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
    let bin_path = support::proc_stats::bench_bin();
    let bin = Path::new(&bin_path);
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    println!("| step | identities | wall | per second | peak RSS | exit |");
    println!("|---|---|---|---|---|---|");

    // Cilium's migrator and this tool, each copying the same small kvstore to a fresh server.
    // A soak alone skips the figures before sync's.
    let soak_only = std::env::var("IDMIG_REAL_SOAK_ONLY").is_ok();
    match support::control_plane::cilium_bin("cilium-1.6.11") {
        _ if soak_only => {}
        Err(why) => eprintln!("Cilium 1.6.11's migrator skipped: {why}"),
        Ok(migrator) => {
            let etcd = Etcd::start().await;
            let data = clean(small, 11, 1);
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
    // As a cluster of 8 nodes leaves it: a `value/` key per node for every identity.
    let data = clean(size, 12, 8);
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
    if !soak_only {
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
    if !soak_only {
        let limit = limit::measure(&cp, &etcd.endpoint, PREFIX).await;
        // Best of 3, as the limit's reads are: on 2 cores shared with both servers, one run
        // of a read swings by half. With `IDMIG_REAL_BEFORE=<binary>` an older build runs
        // each step in turn with this one, on the same cluster, for a before and after.
        let before = std::env::var("IDMIG_REAL_BEFORE").ok();
        let builds: Vec<(&str, &Path)> = match &before {
            Some(b) => vec![("before: ", Path::new(b)), ("", bin)],
            None => vec![("", bin)],
        };
        let of_floor = |t: &Timed| t.took.as_secs_f64() / limit.together.as_secs_f64();
        let steps: [(&str, Vec<&str>); 4] = [
            ("`plan` of the migrated cluster", vec!["plan"]),
            (
                "`plan -o json` (its document streamed)",
                vec!["plan", "-o", "json"],
            ),
            ("`apply` again (nothing to do)", apply.to_vec()),
            ("`verify`", vec!["verify", "--decision-log", "large.jsonl"]),
        ];
        for (what, args) in &steps {
            let mut best: Vec<Option<Timed>> = builds.iter().map(|_| None).collect();
            for _ in 0..3 {
                for (i, (_, b)) in builds.iter().enumerate() {
                    let args = with(args);
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let t = timed(d, b, &args);
                    assert_eq!(t.code, 0, "{}", t.output);
                    best[i] = Some(match best[i].take() {
                        None => t,
                        Some(old) => Timed {
                            took: old.took.min(t.took),
                            rss_mib: old.rss_mib.max(t.rss_mib),
                            ..old
                        },
                    });
                }
            }
            for ((label, _), t) in builds.iter().zip(best.into_iter().flatten()) {
                println!(
                    "{} {:.2}x the floor |",
                    row(&format!("{label}{what}, best of 3"), size, &t).trim_end_matches(" |"),
                    of_floor(&t)
                );
            }
        }
        println!();
        println!(
            "the reads' limit on {} ({:.0} MB of identities as JSON):",
            cp.version(),
            limit.bytes as f64 / 1e6
        );
        println!();
        println!("| read | best of 3 |");
        println!("|---|---|");
        println!(
            "{}",
            limit::row(
                "the server's list, consistent, pages of 500",
                Some(limit.paged)
            )
        );
        println!(
            "{}",
            limit::row(
                "the server's list from its watch cache (`resourceVersion=0`)",
                Some(limit.cached)
            )
        );
        println!(
            "{}",
            limit::row(
                "the server's streaming list (`sendInitialEvents`)",
                limit.streamed
            )
        );
        println!(
            "{}",
            limit::row(
                "etcd's own client: `etcdctl get --prefix` of the kvstore",
                Some(limit.etcd)
            )
        );
        println!(
            "{}",
            limit::row(
                "the reads' limit: the slower of the fastest list and etcd's read",
                Some(limit.reads())
            )
        );
        println!(
            "{}",
            limit::row(
                "both reads at once (the cached list while `etcdctl` runs): the two servers alone",
                Some(limit.together)
            )
        );
        println!();
        if std::env::var("IDMIG_REAL_HOLD").is_ok() {
            // For profiling by hand: the migrated cluster stays up until the bench is killed.
            eprintln!("holding: {}", conn.join(" "));
            std::future::pending::<()>().await;
        }
    }

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
    let rss_at_start = peak_mib(pid);
    let mut client = etcd.client().await.expect("etcd");
    let first = 256 + size as u32;
    // What sync costs while nothing changes, then what one change costs while it follows the
    // migrated cluster: new identities, each mirrored at its own id.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = per_change::idle(pid, 30).await;
    let n = per_change::CHANGES;
    let new_ms = per_change::run(
        &mut client,
        pid,
        &out,
        "new",
        first..first + n,
        |id| format!("k8s:app=one{id};k8s:io.kubernetes.pod.namespace=bench;"),
        &format!("{n} mirrored"),
    )
    .await;
    let first = first + n;
    let cpu_at_start = cpu_seconds(pid);
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
    let mirrored = format!("{} mirrored", written + n);
    let drained = wait_for(&out, &mirrored, 120);
    let cpu = cpu_seconds(pid) - cpu_at_start;
    let rss = peak_mib(pid);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let last = text
        .lines()
        .rfind(|l| l.starts_with("sync:"))
        .unwrap_or("")
        .to_string();
    println!();
    println!(
        "sync at {size} identities: following both sides {:.1} s after start (peak RSS {rss_at_start:.0} MiB then); {written} new identities at 50/s over {:.0} s, all mirrored {:.1} s after the last; {cpu:.1} CPU-seconds in that time ({:.0}% of one core); peak RSS {rss:.0} MiB; its last status: `{last}`",
        startup.as_secs_f64(),
        window.as_secs_f64(),
        drained.as_secs_f64(),
        100.0 * cpu / (window + drained).as_secs_f64()
    );
    // And once the range is full: the kvstore's GC takes some identities (their objects
    // stay), and kvstore-mode agents hand their ids out again for new labels. Each new one
    // finds its id held in Kubernetes by other labels and no id free for a remap.
    let full = first + written > 65_535;
    if full {
        let ids = || 1_000..1_000 + n;
        per_change::collect(&mut client, ids()).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let last = ids().last().unwrap_or(0);
        let full_ms = per_change::run(
            &mut client,
            pid,
            &out,
            "full",
            ids(),
            |id| format!("k8s:app=again{id};k8s:io.kubernetes.pod.namespace=bench;"),
            &format!("invalid: {last}: "),
        )
        .await;
        println!(
            "sync's CPU per change, one every 0.25 s with its node's key: {new_ms:.2} ms for a new identity at {} identities; {full_ms:.2} ms for one that finds the range full (65,280 identities, no id free for its remap); idle, {:.2}% of a core ({:.2} ms of each 0.25 s)",
            size + n as usize,
            100.0 * idle,
            250.0 * idle,
        );
    } else {
        println!(
            "sync's CPU per change, one every 0.25 s with its node's key: {new_ms:.2} ms for a new identity at {} identities (the range did not fill: no figure at a full range); idle, {:.2}% of a core",
            size + n as usize,
            100.0 * idle,
        );
    }
    let soak_secs: u64 = std::env::var("IDMIG_REAL_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if soak_secs > 0 {
        let live = (first + written - 256) as usize;
        soak(&cp, &mut client, pid, &out, live, soak_secs).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A kube client for the control plane's admin kubeconfig, and the `CiliumIdentity` API.
async fn identities_api(cp: &ControlPlane) -> kube::Api<kube::api::DynamicObject> {
    kube::Api::all_with(cp.client().await, &identity_resource())
}

fn identity_resource() -> kube::discovery::ApiResource {
    kube::discovery::ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumIdentity".into(),
        plural: "ciliumidentities".into(),
    }
}

/// The soak on the real server: the running sync follows a full cluster (ids 256 up to
/// 256 + `live`, all mirrored, each used by a kvstore-mode node) while, every second, the
/// two GCs take the oldest 20 identities from both stores and agents allocate 20 new ones
/// in the ids freed 14 s before (cluster 0's range holds 65,280 ids, so about 65,000 stay
/// live and ids wrap round it). Samples the process's resident memory every 30 s; prints
/// the samples, the slope after the first 10 minutes, the lag and the CPU.
async fn soak(
    cp: &ControlPlane,
    etcd: &mut etcd_client::Client,
    pid: u32,
    out: &Path,
    live: usize,
    secs: u64,
) {
    use etcd_client::{DeleteOptions, Txn, TxnOp};
    const RANGE: u32 = 65_280;
    const PER_SECOND: u32 = 20;
    const GAP_SECONDS: u32 = 14;
    let api = identities_api(cp).await;
    let gc_etcd = etcd.clone();
    let id_at = |seq: u32| 256 + seq % RANGE;
    // The two GCs, for the identity at `seq`: the kvstore's (its master key and its node's
    // use), then the cluster's (its object).
    let collect = |seq: u32| {
        let api = api.clone();
        let mut etcd = gc_etcd.clone();
        async move {
            let id = id_at(seq);
            let key = format!("{PREFIX}/id/{id}");
            let labels = etcd
                .get(key.clone(), None)
                .await
                .expect("get")
                .kvs()
                .first()
                .map(|kv| kv.value_str().unwrap_or_default().to_string());
            let mut ops = vec![TxnOp::delete(key, None)];
            if let Some(labels) = labels {
                ops.push(TxnOp::delete(
                    format!("{PREFIX}/value/{labels}/"),
                    Some(DeleteOptions::new().with_prefix()),
                ));
            }
            etcd.txn(Txn::new().and_then(ops)).await.expect("txn");
            match api
                .delete(&id.to_string(), &kube::api::DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => panic!("delete {id}: {e}"),
            }
        }
    };
    let mut oldest = 0u32;
    let mut newest = live as u32;
    // First the gap: the range is full after the 50/s minute.
    while newest - oldest > RANGE - GAP_SECONDS * PER_SECOND {
        futures::future::join_all((oldest..oldest + PER_SECOND).map(collect)).await;
        oldest += PER_SECOND;
    }
    eprintln!("soak: {} live, starting", newest - oldest);
    let cpu_at_start = cpu_seconds(pid);
    let start = Instant::now();
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut next_sample = Duration::ZERO;
    let mut late_ticks = 0u32;
    while start.elapsed() < Duration::from_secs(secs) {
        let tick = Instant::now();
        futures::future::join_all((oldest..oldest + PER_SECOND).map(collect)).await;
        oldest += PER_SECOND;
        let mut ops = Vec::new();
        for seq in newest..newest + PER_SECOND {
            let id = id_at(seq);
            let labels = format!("k8s:app=soak-{seq};k8s:io.kubernetes.pod.namespace=bench;");
            ops.push(TxnOp::put(
                format!("{PREFIX}/id/{id}"),
                labels.clone(),
                None,
            ));
            ops.push(TxnOp::put(
                format!("{PREFIX}/value/{labels}/10.0.0.9"),
                id.to_string(),
                None,
            ));
        }
        etcd.txn(Txn::new().and_then(ops)).await.expect("txn");
        newest += PER_SECOND;
        if start.elapsed() >= next_sample {
            next_sample += Duration::from_secs(30);
            let s = (start.elapsed().as_secs_f64(), rss_mib(pid));
            eprintln!("soak: {:.0} s, RSS {:.1} MiB", s.0, s.1);
            samples.push(s);
        }
        match Duration::from_secs(1).checked_sub(tick.elapsed()) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => late_ticks += 1,
        }
    }
    let took = start.elapsed();
    let cpu = cpu_seconds(pid) - cpu_at_start;
    // Until the last allocated is mirrored.
    let last_id = id_at(newest - 1).to_string();
    let mut caught_up = false;
    for _ in 0..600 {
        if api.get_opt(&last_id).await.ok().flatten().is_some() {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let last = text
        .lines()
        .rfind(|l| l.starts_with("sync:"))
        .unwrap_or("")
        .to_string();
    // Objects beyond the live identities: ones that outlived their identity.
    let objects = count(cp);
    let splits_reported = text
        .lines()
        .filter(|l| l.starts_with("split allocation at id"))
        .count();
    let settled: Vec<(f64, f64)> = samples.iter().copied().filter(|s| s.0 >= 600.0).collect();
    let (lo, hi) = settled
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), s| (lo.min(s.1), hi.max(s.1)));
    let lo = if settled.is_empty() { 0.0 } else { lo };
    println!();
    println!("| soaked | RSS |");
    println!("|---|---|");
    for (t, mib) in samples.iter().filter(|s| (s.0 as u64) % 600 < 30) {
        println!("| {:.0} min | {mib:.1} MiB |", t / 60.0);
    }
    println!();
    println!(
        "soak on the real server: {:.0} s, {} identities allocated and {} collected at {PER_SECOND}/s ({} live); RSS {:.1} MiB at the first sample, {:.1} MiB at the last, {lo:.1} to {hi:.1} MiB after 10 minutes, slope {:.2} MiB/hour there; {cpu:.0} CPU-seconds ({:.1}% of one core); {late_ticks} seconds the load itself ran late; the last new identity mirrored: {caught_up}; {objects} objects at the end for {} live identities; {splits_reported} splits reported; peak RSS {:.0} MiB; its last status: `{last}`",
        took.as_secs_f64(),
        newest - live as u32,
        oldest,
        newest - oldest,
        samples.first().map_or(0.0, |s| s.1),
        samples.last().map_or(0.0, |s| s.1),
        slope_per_hour(&settled),
        100.0 * cpu / took.as_secs_f64(),
        newest - oldest,
        peak_mib(pid),
    );
}
