//! Runs the deterministic simulation of sync over many seeds:
//! `cargo run --profile sim --example simulate -- --seeds N [--first S] [--steps K] [--jobs J]`
//! (`--profile sim` builds it whole, link-time optimised; `--release` works too, a tenth slower).
//! Seeds run on every core (`--jobs`), each alone on a thread of its own (the simulation
//! itself knows no threads), and come back in seed order: the output is the same.
//! Prints each failing seed (the invariant broken, where, and the end of its trace), then one
//! line: `seeds: N, steps: T, failures: F, trace digest: H`. The same arguments give the same
//! digest: a run replays exactly.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use cilium_idmig::sim::{SeedRun, run_seed};

// A seed allocates and frees for every line it logs and reads back; glibc's allocator was
// a quarter of a run's time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} needs a number, e.g. {name} {default}")),
    }
}

/// The threads to run seeds on when `--jobs` is not given: one per core.
fn cores() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("usage: simulate --seeds N [--first S] [--steps K] [--jobs J] [--each] [--trace]");
        println!(
            "  --jobs  threads that run seeds (default: one per core); the output is the same"
        );
        println!("  --each  print each seed's trace digest (to compare two builds seed by seed)");
        println!("  --trace print every line of every trace to stderr (with --seeds 1)");
        return ExitCode::SUCCESS;
    }
    let parsed = (|| {
        Ok::<_, String>((
            arg(&args, "--seeds", 100)?,
            arg(&args, "--first", 0)?,
            arg(&args, "--steps", 5000)?,
            arg(&args, "--jobs", cores())?,
        ))
    })();
    let (seeds, first, steps, jobs) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("simulate: {e}");
            return ExitCode::from(2);
        }
    };
    // A trace read line by line is one seed's: one thread.
    let tracing = args.iter().any(|a| a == "--trace");
    let jobs = if tracing { 1 } else { (jobs as usize).max(1) };
    let started = std::time::Instant::now();
    let (mut total_steps, mut failures, mut digest) = (0u64, 0u64, 0xcbf2_9ce4_8422_2325u64);
    let (mut reserved, mut released, mut stops) = (0usize, 0usize, 0usize);
    let each = args.iter().any(|a| a == "--each");
    if tracing {
        cilium_idmig::sim::report::ECHO.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    for run in run_seeds_on(first, seeds, steps as usize, jobs) {
        total_steps += run.steps as u64;
        reserved += run.reserved;
        released += run.released;
        stops += run.releases_at_stop;
        // The seeds' digests folded in order: one number for the whole run.
        for b in run.digest.to_le_bytes() {
            digest ^= u64::from(b);
            digest = digest.wrapping_mul(0x100_0000_01b3);
        }
        if each {
            println!("seed {}: {:016x}", run.seed, run.digest);
        }
        if let Some(f) = run.failure {
            failures += 1;
            println!(
                "seed {}: {} (step {}): {}",
                run.seed, f.invariant, f.step, f.detail
            );
            for line in f.trace {
                println!("    {line}");
            }
        }
    }
    println!(
        "seeds: {seeds}, steps: {total_steps}, failures: {failures}, trace digest: {digest:016x}"
    );
    eprintln!(
        "({:.1} s on {jobs} thread(s), {:.0} seeds/s; reservations: {reserved} master keys written, {released} released at cutover or at one of {stops} clean stops with --release-reservations, the rest kept because a node used them or left to a crashed instance's lapsed lease)",
        started.elapsed().as_secs_f64(),
        seeds as f64 / started.elapsed().as_secs_f64().max(1e-9)
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

// Many seeds on every core: each seed runs alone on a thread of its own, and the runs come
// back in seed order, so a run's output and digest do not depend on how many threads ran it.

/// Seeds `first..first + seeds`, run on `jobs` threads (at least one), each seed's run
/// yielded in seed order as soon as it and every seed before it are done.
pub fn run_seeds_on(first: u64, seeds: u64, steps: usize, jobs: usize) -> SeedsInOrder {
    let next = Arc::new(AtomicU64::new(first));
    let end = first + seeds;
    // Bounded, so a fast thread cannot run far ahead of one slow seed and pile up runs.
    let (tx, rx) = mpsc::sync_channel(jobs.max(1) * 64);
    for _ in 0..jobs.max(1) {
        let (next, tx) = (next.clone(), tx.clone());
        std::thread::spawn(move || {
            loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end || tx.send(run_seed(seed, steps)).is_err() {
                    return;
                }
            }
        });
    }
    SeedsInOrder {
        rx,
        waiting: BTreeMap::new(),
        next: first,
        end,
    }
}

/// The runs of `run_seeds_on`, in seed order.
pub struct SeedsInOrder {
    rx: mpsc::Receiver<SeedRun>,
    /// Runs done before an earlier seed's: held until it comes.
    waiting: BTreeMap<u64, SeedRun>,
    next: u64,
    end: u64,
}

impl Iterator for SeedsInOrder {
    type Item = SeedRun;

    fn next(&mut self) -> Option<SeedRun> {
        if self.next >= self.end {
            return None;
        }
        while !self.waiting.contains_key(&self.next) {
            // A thread that panicked drops its sender: the seeds it held never come.
            let run = self.rx.recv().ok()?;
            self.waiting.insert(run.seed, run);
        }
        self.next += 1;
        self.waiting.remove(&(self.next - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cilium_idmig::sim::run_seed;

    #[test]
    fn runs_on_many_threads_come_back_as_one_thread_runs_them() {
        let one: Vec<(u64, u64)> = run_seeds_on(40, 12, 300, 1)
            .map(|r| (r.seed, r.digest))
            .collect();
        let three: Vec<(u64, u64)> = run_seeds_on(40, 12, 300, 3)
            .map(|r| (r.seed, r.digest))
            .collect();
        assert_eq!(one.len(), 12);
        assert_eq!(one.first().map(|r| r.0), Some(40));
        assert_eq!(one, three);
        let alone: Vec<(u64, u64)> = (40..52)
            .map(|s| {
                let r = run_seed(s, 300);
                (r.seed, r.digest)
            })
            .collect();
        assert_eq!(one, alone);
    }
}
