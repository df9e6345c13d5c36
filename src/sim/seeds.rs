//! Many seeds on every core: each seed runs alone on a thread of its own, and the runs come
//! back in seed order, so a run's output and digest do not depend on how many threads ran it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use super::{SeedRun, run_seed};

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
