//! What one change costs a running `sync`: CPU-seconds of the process over a run of
//! isolated changes (one every 0.25 s, each with its node's `value/` key, so each is a
//! settle of its own), divided by their number. Idle CPU over the same time is included,
//! as an operator's `top` would show it.

use std::path::Path;
use std::time::{Duration, Instant};

use super::support::proc_stats::cpu_seconds;
use super::{PREFIX, wait_for};

/// How many changes each run makes, and how far apart.
pub const CHANGES: u32 = 200;
const EVERY: Duration = Duration::from_millis(250);

/// Puts a new kvstore identity at each id of `ids` (labels from `labels`), one every 0.25 s
/// (`what` names the run);
/// waits until `out` says `done`; the CPU-seconds the process at `pid` used per change, in
/// milliseconds.
pub async fn run(
    etcd: &mut etcd_client::Client,
    pid: u32,
    out: &Path,
    what: &str,
    ids: impl Iterator<Item = u32>,
    labels: impl Fn(u32) -> String,
    done: &str,
) -> f64 {
    // `IDMIG_REAL_PERF=DIR` records where the CPU goes meanwhile, in `DIR/<what>.perf`
    // (`perf report -i` it).
    let perf = std::env::var("IDMIG_REAL_PERF").ok().and_then(|dir| {
        let file = format!("{dir}/{what}.perf");
        std::process::Command::new("perf")
            .args([
                "record",
                "-F",
                "999",
                "-g",
                "-o",
                &file,
                "-p",
                &pid.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()
    });
    let cpu_at_start = cpu_seconds(pid);
    let started = Instant::now();
    let mut n = 0u32;
    for id in ids {
        let l = labels(id);
        etcd.put(format!("{PREFIX}/id/{id}"), l.clone(), None)
            .await
            .expect("put");
        etcd.put(format!("{PREFIX}/value/{l}/10.0.0.9"), id.to_string(), None)
            .await
            .expect("put");
        n += 1;
        if let Some(wait) = (EVERY * n).checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    wait_for(out, done, 120);
    let ms = 1000.0 * (cpu_seconds(pid) - cpu_at_start) / f64::from(n.max(1));
    if let Some(mut perf) = perf {
        // SIGINT: perf writes its file and ends.
        if let Ok(pid) = i32::try_from(perf.id()) {
            // SAFETY: a plain signal to a child this process started and has not reaped.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let _ = perf.wait();
    }
    ms
}

/// The kvstore's GC taking the master keys of `ids` (their objects stay): the ids become
/// free in the kvstore and stay held in Kubernetes.
pub async fn collect(etcd: &mut etcd_client::Client, ids: impl Iterator<Item = u32>) {
    for id in ids {
        etcd.delete(format!("{PREFIX}/id/{id}"), None)
            .await
            .expect("delete");
    }
}

/// The share of one core the process at `pid` uses while nothing changes, over `secs`.
pub async fn idle(pid: u32, secs: u64) -> f64 {
    let at_start = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    (cpu_seconds(pid) - at_start) / secs as f64
}
