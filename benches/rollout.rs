//! The rollout simulation as a benchmark: the demo's cluster (generated identities, kvstore-
//! mode nodes that allocate as Cilium's agents do and move to CRD mode one by one, a narrow
//! id pool) played with sync following it, once with sync alone and once with
//! `--reserve-in-kvstore`, for several seeds in one run. Counts split allocations (one id, two
//! label sets across the backends) and double allocations (one label set at two ids).
//! `cargo bench --bench rollout`; `IDMIG_ROLLOUT_SPEED=2` plays slower (default 4),
//! `IDMIG_ROLLOUT_SEEDS=1,2,3` picks the seeds. Prints a Markdown table.

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("rollout benchmark: run it with `cargo bench --bench rollout`");
        return;
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
