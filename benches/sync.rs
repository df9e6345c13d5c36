//! `sync` under load, against a real etcd and the sandbox (no injected latency): the lag
//! from a kvstore identity appearing to its CiliumIdentity created, for a burst of 2,000 new
//! identities and for a steady 50 a second for a minute, and (with `IDMIG_SOAK_SECS`, e.g.
//! 1800) the resident memory of the real `sync` process over a soak of 20 new identities a
//! second while the oldest 20 go (the kvstore's and the cluster's GC, so the live set stays
//! at about 7,000), used by one kvstore-mode node (so the rollout is not over), sampled
//! every 30 s, with its slope. A phase at the scale of a full cluster (62,280 identities
//! mirrored, then 50/s to 65,280): start-up, CPU while quiet and under load, lag, peak RSS.
//! `cargo bench --bench sync`.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};

use cilium_idmig::sandbox::{Sandbox, SandboxConfig};

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;
use support::Etcd;
use support::proc_stats::{bench_bin as bin, cpu_seconds, peak_mib, rss_mib, slope_per_hour};

const P: &str = "cilium/state/identities/v1";

struct Run {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

/// A real etcd, the sandbox, and a kubeconfig and decision log for `sync` in a temp dir.
struct World {
    etcd: Etcd,
    sb: Sandbox,
    dir: tempfile::TempDir,
    kc: String,
    log: String,
}

impl World {
    async fn new() -> World {
        let etcd = Etcd::start().await;
        let sb = Sandbox::start(SandboxConfig::default())
            .await
            .expect("sandbox");
        let dir = tempfile::tempdir().expect("tempdir");
        let kc = dir.path().join("kubeconfig");
        sb.write_kubeconfig(&kc).expect("kubeconfig");
        let kc = kc.display().to_string();
        let log = dir.path().join("sync.jsonl").display().to_string();
        World {
            etcd,
            sb,
            dir,
            kc,
            log,
        }
    }
}

/// Writes `per_second` new identities a second for `seconds` from id `next`; the id after.
async fn steady(etcd: &Etcd, mut next: u32, per_second: u32, seconds: u32) -> u32 {
    for _ in 0..seconds {
        let tick = Instant::now();
        put_range(etcd, next, per_second).await;
        next += per_second;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    next
}

fn start(etcd: &Etcd, kubeconfig: &str, log: &str) -> Run {
    let mut child = tokio::process::Command::new(bin())
        .args([
            "sync",
            "--etcd-endpoints",
            &etcd.endpoint,
            "--kubeconfig",
            kubeconfig,
        ])
        .args(["--decision-log", log])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("sync");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = child.stdout.take().expect("stdout");
    let l = lines.clone();
    tokio::spawn(async move {
        let mut r = BufReader::new(out).lines();
        while let Ok(Some(line)) = r.next_line().await {
            l.lock().expect("lines").push(line);
        }
    });
    Run { child, lines }
}

/// Stops a run and returns its last status line's lag: (p50, p99) in ms.
async fn stop(mut run: Run) -> (String, String) {
    let pid = run.child.id().expect("pid") as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    run.child.wait().await.expect("wait");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = run.lines.lock().expect("lines");
    let last = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("sync: "))
        .cloned()
        .unwrap_or_default();
    let pick = |word: &str| {
        last.split(word)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("-")
            .to_string()
    };
    (pick(" p50 "), pick(" p99 "))
}

async fn put_range(etcd: &Etcd, from: u32, n: u32) {
    let mut c = etcd.client().await.expect("client");
    let mut ops = Vec::new();
    for i in from..from + n {
        ops.push(etcd_client::TxnOp::put(
            format!("{P}/id/{i}"),
            format!("k8s:app=load-{i};k8s:io.kubernetes.pod.namespace=bench;"),
            None,
        ));
        if ops.len() == 128 {
            c.txn(etcd_client::Txn::new().and_then(std::mem::take(&mut ops)))
                .await
                .expect("txn");
        }
    }
    if !ops.is_empty() {
        c.txn(etcd_client::Txn::new().and_then(ops))
            .await
            .expect("txn");
    }
}

async fn wait_count(sb: &Sandbox, n: usize, secs: u64) -> Duration {
    let start = Instant::now();
    while sb.objects().len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "only {} of {n}",
            sb.objects().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

/// Sync at the scale of a full cluster: 62,280 identities in etcd, all mirrored already,
/// one kvstore-mode node left. Start-up (until both watches follow), CPU while quiet for
/// 30 s, then 50 new identities a second for 60 s (to 65,280): lag and peak memory.
async fn at_scale(decided: u32) {
    const LIVE: u32 = 62_280;
    let World {
        etcd,
        sb,
        dir: _dir,
        kc,
        log,
    } = World::new().await;
    put_range(&etcd, 256, LIVE).await;
    for i in 256..256 + LIVE {
        let key = format!("k8s:app=load-{i};k8s:io.kubernetes.pod.namespace=bench;");
        let labels = cilium_idmig::core::labels::to_security_labels(
            &cilium_idmig::core::labels::parse_label_key(&key).expect("labels"),
        );
        sb.seed_identity(i, &labels);
    }
    let mut c = etcd.client().await.expect("client");
    c.put(format!("{P}/value/k8s:app=pinned;/10.0.0.1"), "256", None)
        .await
        .expect("put");
    if decided > 0 {
        // Decisions in the log, as a resumed review brings them: skips of identities that
        // are already migrated (what they decide changes nothing; sync must still plan with
        // them every tick).
        let dlog = cilium_idmig::io::decision_log::DecisionLog::open(std::path::Path::new(&log))
            .expect("log");
        for i in 256..256 + decided {
            let key = format!("k8s:app=load-{i};k8s:io.kubernetes.pod.namespace=bench;");
            dlog.append(cilium_idmig::io::decision_log::Record::decision(
                &i.to_string(),
                &key,
                cilium_idmig::core::planner::Kind::AlreadyMigrated,
                ("skip", "operator"),
                None,
            ))
            .expect("append");
        }
    }
    let t = Instant::now();
    let run = start(&etcd, &kc, &log);
    let pid = run.child.id().expect("pid");
    loop {
        let following = run
            .lines
            .lock()
            .expect("lines")
            .iter()
            .any(|l| l.contains("sync started: following both sides"));
        if following {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(300), "sync did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let startup = t.elapsed();
    // Settle, then quiet.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
    let rss_quiet = rss_mib(pid);
    // Steady arrivals.
    let (cpu1, t1) = (cpu_seconds(pid), Instant::now());
    let next = steady(&etcd, 256 + LIVE, 50, 60).await;
    wait_count(&sb, (next - 256) as usize, 120).await;
    let busy = (cpu_seconds(pid) - cpu1) / t1.elapsed().as_secs_f64() * 100.0;
    let peak = peak_mib(pid);
    let (p50, p99) = stop(run).await;
    println!();
    println!(
        "| at {} live identities, {decided} decisions in the log | figure |",
        next - 256
    );
    println!("|---|---|");
    println!(
        "| start-up (both sides read, both watches following) | {:.2} s |",
        startup.as_secs_f64()
    );
    println!("| CPU while quiet (30 s) | {idle:.2} % of a core |");
    println!("| RSS while quiet | {rss_quiet:.1} MiB |");
    println!("| 50 new identities/s for 60 s: lag p50 / p99 | {p50} / {p99} |");
    println!("| CPU under 50/s | {busy:.1} % of a core |");
    println!("| peak RSS (VmHWM) | {peak:.1} MiB |");
}

/// One dirty tick of sync's core at 65,280 live identities: a new kvstore identity folded
/// in, the plan brought up to date, the writes selected, the counts published (what the
/// settle tick does, without IO), 50 times after a first full plan; median and slowest.
fn dirty_tick() {
    dirty_tick_with(0);
    dirty_tick_with(1000);
}

/// The same, with `decisions` decisions present (skips of identities that are already
/// migrated, as a resumed log brings them). Driven through the machine, as the binary's
/// shell drives it: each change is a watch event, then the settle tick that plans and
/// writes, then the batch's outcome.
fn dirty_tick_with(decided: u32) {
    use cilium_idmig::core::outcome::Outcome;
    use cilium_idmig::core::planner::Action;
    use cilium_idmig::core::planner::resume::LoggedDecision;
    use cilium_idmig::core::sync::machine::{
        Input, K8sChange, KvWatchEvent, LeaseHolder, Machine, Output, Settings,
    };
    use cilium_idmig::core::sync::{BatchOutcome, KvChange, SyncState};
    let range = cilium_idmig::core::range::IdRange::for_cluster(0).expect("range");
    let labels = |i: u32| format!("k8s:app=load-{i};k8s:io.kubernetes.pod.namespace=bench;");
    // 65,230 mirrored, 50 arriving one per tick.
    let masters = (256..65_486u32)
        .map(|i| (i.to_string().into_bytes(), labels(i).into_bytes()))
        .collect();
    let k8s = (256..65_486u32).map(|i| (i, labels(i))).collect();
    let state =
        SyncState::from_kvstore(masters, Default::default(), 0).with_kubernetes(k8s, String::new());
    let decisions: std::collections::BTreeMap<String, LoggedDecision> = (256..256 + decided)
        .map(|i| {
            let d = LoggedDecision {
                id: i.to_string(),
                labels: labels(i),
                action: Action::Skip,
                target_id: None,
            };
            (d.id.clone(), d)
        })
        .collect();
    let settings = Settings {
        range,
        accept_proposals: false,
        until_cutover: false,
        reserve_in_kvstore: false,
        cutover_grace: Duration::from_secs(120),
        lease: "kube-system/bench".into(),
    };
    let mut m = Machine::new(settings, decisions);
    let now = Instant::now();
    m.start_round(state, true);
    m.step(Input::Lease(LeaseHolder::Us), now, true);
    m.step(Input::Kv(KvWatchEvent::Connected), now, true);
    m.step(Input::K8s(K8sChange::Connected), now, true);
    let writes = |out: Vec<Output>| -> Vec<_> {
        out.into_iter()
            .filter_map(|o| match o {
                Output::Write(ops) => Some(ops),
                _ => None,
            })
            .flatten()
            .collect()
    };
    let t = Instant::now();
    m.step(Input::Settle, now, true);
    let first = t.elapsed();
    let mut times = Vec::new();
    for (n, i) in (65_486..65_536u32).enumerate() {
        let t = Instant::now();
        let change = KvChange::Master {
            id: i.to_string().into_bytes(),
            value: Some(labels(i).into_bytes()),
            created: true,
        };
        let arrived = Input::Kv(KvWatchEvent::Changes {
            changes: vec![change],
            revision: 1 + n as i64,
        });
        m.step(arrived, now, true);
        let ops = writes(m.step(Input::Settle, now, true));
        times.push(t.elapsed());
        assert_eq!(ops.len(), 1, "the new identity is written at its settle");
        let results = ops
            .iter()
            .filter_map(|o| o.target_id)
            .map(|t| (t, Outcome::Created))
            .collect();
        let outcome = BatchOutcome::Done {
            results,
            halted: None,
            denied: Vec::new(),
        };
        m.step(Input::BatchDone { ops, outcome }, now, true);
    }
    times.sort();
    println!();
    println!(
        "| a dirty tick of sync's machine at 65,280 identities, {decided} decisions present (the change, then the settle: plan kept up to date, select, publish) | median {:.2} ms, slowest {:.2} ms (the first, a full plan: {:.1} ms) |",
        times[times.len() / 2].as_secs_f64() * 1000.0,
        times[times.len() - 1].as_secs_f64() * 1000.0,
        first.as_secs_f64() * 1000.0
    );
    if decided > 0 {
        decision_ticks(&mut m, decided, &labels);
    }
}

/// What a decision arriving costs a sync with `decided` decisions present: a skip of one
/// more identity, its settle, then its undo and that settle (the TUI's decide and `u`).
fn decision_ticks(
    m: &mut cilium_idmig::core::sync::machine::Machine,
    decided: u32,
    labels: &dyn Fn(u32) -> String,
) {
    use cilium_idmig::core::planner::Action;
    use cilium_idmig::core::planner::resume::LoggedDecision;
    use cilium_idmig::core::sync::machine::Input;
    let now = Instant::now();
    let mut times = Vec::new();
    for i in 256 + decided..256 + decided + 50 {
        let d = LoggedDecision {
            id: i.to_string(),
            labels: labels(i),
            action: Action::Skip,
            target_id: None,
        };
        let t = Instant::now();
        m.step(Input::Decided(d), now, true);
        m.step(Input::Settle, now, true);
        times.push(t.elapsed());
        let t = Instant::now();
        m.step(Input::Undone(i.to_string()), now, true);
        m.step(Input::Settle, now, true);
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "| a decision arriving at 65,280 identities, {decided} decisions present (a skip or its undo, then the settle: decisions resumed, their items looked at) | median {:.2} ms, slowest {:.2} ms |",
        times[times.len() / 2].as_secs_f64() * 1000.0,
        times[times.len() - 1].as_secs_f64() * 1000.0,
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("sync benchmark: run it with `cargo bench --bench sync`");
        return;
    }
    if std::env::var("IDMIG_SOAK_ONLY").is_err() {
        dirty_tick();
    }
    if std::env::var("IDMIG_TICK_ONLY").is_ok() {
        return;
    }
    let World {
        etcd,
        sb,
        dir: _dir,
        kc,
        log,
    } = World::new().await;
    // IDMIG_SCALE_ONLY: only the runs at the scale of a full cluster.
    let mut next: u32 = 8000;
    if std::env::var("IDMIG_SCALE_ONLY").is_err() {
        let mut rows = Vec::new();

        // A burst: 2,000 new identities at once.
        let run = start(&etcd, &kc, &log);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let t = Instant::now();
        put_range(&etcd, 1000, 2000).await;
        wait_count(&sb, 2000, 120).await;
        let took = t.elapsed();
        let (p50, p99) = stop(run).await;
        eprintln!(
            "burst: 2000 in {:.2} s, lag p50 {p50} p99 {p99}",
            took.as_secs_f64()
        );
        rows.push((
            "burst of 2,000",
            format!("{:.2} s", took.as_secs_f64()),
            p50,
            p99,
        ));

        // Steady: 50 a second for a minute.
        let run = start(&etcd, &kc, &log);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let t = Instant::now();
        next = steady(&etcd, 5000, 50, 60).await;
        wait_count(&sb, 5000, 60).await;
        let took = t.elapsed();
        let (p50, p99) = stop(run).await;
        eprintln!(
            "steady: 3000 in {:.2} s, lag p50 {p50} p99 {p99}",
            took.as_secs_f64()
        );
        rows.push((
            "50/s for 60 s",
            format!("{:.2} s", took.as_secs_f64()),
            p50,
            p99,
        ));

        println!("| load | all mirrored after | lag p50 | lag p99 |");
        println!("|---|---|---|---|");
        for (load, took, p50, p99) in &rows {
            println!("| {load} | {took} | {p50} | {p99} |");
        }
    }

    if std::env::var("IDMIG_SOAK_ONLY").is_err() {
        at_scale(0).await;
        at_scale(1000).await;
    }

    let soak: u64 = std::env::var("IDMIG_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if soak == 0 {
        return;
    }
    // One kvstore-mode node is left: the rollout is not over while the soak runs.
    {
        let mut c = etcd.client().await.expect("client");
        c.put(format!("{P}/value/k8s:app=pinned;/10.0.0.1"), "1", None)
            .await
            .expect("put");
        c.put(format!("{P}/id/1"), "reserved:host=;", None)
            .await
            .expect("put");
    }
    let run = start(&etcd, &kc, &log);
    let pid = run.child.id().expect("pid");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t = Instant::now();
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut last_sample = Instant::now() - Duration::from_secs(30);
    // Ids go round 1,000..61,000 (the allocation range ends at 65,535): at 20/s a soak
    // passes 72,000 identities an hour, and the oldest are gone long before an id comes back.
    let soak_id = |seq: u32| 1000 + seq % 60_000;
    let (mut newest, mut oldest) = (next - 1000, 0u32);
    let mut c = etcd.client().await.expect("client");
    while t.elapsed() < Duration::from_secs(soak) {
        let tick = Instant::now();
        put_range(&etcd, soak_id(newest), 20).await;
        newest += 20;
        next += 20;
        // The GCs: the kvstore's deletes the oldest master keys, the cluster's their objects.
        for seq in oldest..oldest + 20 {
            let id = soak_id(seq);
            c.delete(format!("{P}/id/{id}"), None)
                .await
                .expect("delete");
            sb.delete_object(&id.to_string());
        }
        oldest += 20;
        if last_sample.elapsed() >= Duration::from_secs(30) {
            last_sample = Instant::now();
            let s = (t.elapsed().as_secs_f64(), rss_mib(pid));
            eprintln!(
                "soak: {:.0} s, RSS {:.1} MiB, {} objects",
                s.0,
                s.1,
                sb.objects().len()
            );
            samples.push(s);
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    let (p50, p99) = stop(run).await;
    println!();
    println!(
        "soak: {} s at 20/s ({} identities), RSS {:.1} MiB at the first sample, {:.1} MiB at the last, slope {:.2} MiB/hour; lag p50 {p50} p99 {p99}",
        soak,
        next - 5000,
        samples.first().map_or(0.0, |s| s.1),
        samples.last().map_or(0.0, |s| s.1),
        slope_per_hour(&samples)
    );
}
