//! The rollout simulation as a benchmark: the demo's cluster (generated identities, kvstore-
//! mode nodes that allocate as Cilium's agents do and move to CRD mode one by one, a narrow
//! id pool) played with sync following it, once with sync alone and once with
//! `--reserve-in-kvstore`, for several seeds in one run. Counts split allocations (one id, two
//! label sets across the backends) and double allocations (one label set at two ids).
//! `cargo bench --bench rollout`; `IDMIG_ROLLOUT_SPEED=2` plays slower (default 4),
//! `IDMIG_ROLLOUT_SEEDS=1,2,3` picks the seeds. Prints a Markdown table.
//! `IDMIG_ROLLOUT_CILIUM=N` plays N rounds on Cilium's own allocators instead, on the real
//! control plane: 1.18's (double-write beside sync with reservations) and 1.9's (Cilium's
//! one-shot copy, sync alone, sync with reservations), one process per node, at each pace of
//! `IDMIG_ROLLOUT_PACES` (default `0,1,2`: 0 back to back, as fast as Cilium's allocator
//! answers; 1 the demo's pace, a node rolling every phase of the demo's rollout; 2 twice it).

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("rollout benchmark: run it with `cargo bench --bench rollout`");
        return;
    }
    if let Some(rounds) = std::env::var("IDMIG_ROLLOUT_CILIUM")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
    {
        return on_cilium_allocators(rounds).await;
    }
    let speed: f64 = std::env::var("IDMIG_ROLLOUT_SPEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4.0);
    let seeds: Vec<u64> = std::env::var("IDMIG_ROLLOUT_SEEDS")
        .unwrap_or_else(|_| "1,2,3".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!(
        "| seed | sync | kvstore allocations | CRD allocations | reused | split allocations | of which at ids Kubernetes held at start | double allocations | splits sync reported | cutover after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for seed in seeds {
        for reserve in [false, true] {
            let p = support::play_rollout(1000, 6, speed, seed, reserve).await;
            println!(
                "| {seed} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s |",
                if reserve {
                    "--reserve-in-kvstore"
                } else {
                    "alone"
                },
                p.counts.kvstore_allocations,
                p.counts.crd_allocations,
                p.counts.reused,
                p.divergence.splits.len(),
                p.splits_at_held_ids,
                p.divergence.doubles.len(),
                p.reported_splits,
                p.took.as_secs_f64()
            );
        }
    }
}

/// The rollout on Cilium's own allocators, every way side by side: 1.18's double-write
/// beside sync with reservations, and on 1.9's the one-shot copy, sync alone and sync with
/// reservations.
async fn on_cilium_allocators(rounds: usize) {
    use support::cilium_rollout::{Pace, Way, play};
    let paces: Vec<Pace> = std::env::var("IDMIG_ROLLOUT_PACES")
        .unwrap_or_else(|_| "0,1,2".into())
        .split(',')
        .filter_map(|s| s.trim().parse::<f64>().ok())
        .map(|speed| {
            if speed > 0.0 {
                Pace::Demo(speed)
            } else {
                Pace::BackToBack
            }
        })
        .collect();
    let allocator = |v: &str| {
        support::control_plane::cilium_bin(&format!("allocsim-{v}"))
            .unwrap_or_else(|why| panic!("{why}: set KUBEBUILDER_ASSETS (see the README)"))
    };
    let bin = support::proc_stats::bench_bin();
    let plays = [
        ("1.18", Way::DoubleWrite),
        ("1.18", Way::Sync),
        ("1.9", Way::OneShot),
        ("1.9", Way::SyncAlone),
        ("1.9", Way::Sync),
    ];
    println!(
        "| round | pace | allocator | way | ids agents held for two label sets, summed over 6 rolls (new since the start) | label sets agents held at two ids, summed (new) | ids held for two label sets at the end | allocations that failed | audit at the end: split / double / duplicate / one-side / stale-value | audit equals the stores | took |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for round in 1..=rounds {
        for (pace, (version, way)) in paces
            .iter()
            .flat_map(|&pace| plays.iter().map(move |&play| (pace, play)))
        {
            let allocsim = allocator(version);
            let cp = support::control_plane::ControlPlane::start("rollout")
                .expect("a real control plane (CONTROL_PLANE)");
            let etcd = support::Etcd::start().await;
            let p = play(way, pace, &allocsim, &bin, &cp, &etcd).await;
            let c = |k: &str| p.audit.get(k).copied().unwrap_or_default();
            println!(
                "| {round} | {} | {version} | {}{} | {} ({}) | {} ({}) | {} | {} | {} / {} / {} / {} / {} | {} | {:.0} s |",
                pace.name(),
                way.name(),
                match p.sync_exit {
                    Some(0) => ", cutover reached",
                    Some(_) => ", no cutover",
                    None => "",
                },
                p.agent_splits,
                p.new_splits,
                p.agent_doubles,
                p.new_doubles,
                p.end_splits,
                p.allocation_errors.len(),
                c("split"),
                c("double"),
                c("duplicate"),
                c("one-side"),
                c("stale-value"),
                if p.audit == p.truth { "yes" } else { "NO" },
                p.took.as_secs_f64()
            );
        }
    }
}
