//! The process a benchmark times: which binary (`bench_bin`), what it reads of it from
//! `/proc` (CPU seconds, memory), and the slope of memory samples over a soak. Linux only,
//! like the benchmarks.

/// The binary under test: `IDMIG_BIN` (e.g. a copy, so a long soak survives a rebuild), or
/// the one cargo built.
pub fn bench_bin() -> String {
    std::env::var("IDMIG_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cilium-idmig").to_string())
}

/// CPU seconds (user and system) the process has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / ticks
}

/// Resident memory now (VmRSS), in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// Peak resident memory (VmHWM), in MiB.
pub fn peak_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// A memory field of `/proc/PID/status`, in MiB; -1 when the process is gone.
fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(field)).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map_or(-1.0, |kib| kib / 1024.0)
}

/// Least-squares slope of (seconds, MiB) samples, in MiB per hour (0 with fewer than two).
pub fn slope_per_hour(samples: &[(f64, f64)]) -> f64 {
    let n = samples.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = samples.iter().map(|s| s.0).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1).sum::<f64>() / n;
    let num: f64 = samples.iter().map(|s| (s.0 - mx) * (s.1 - my)).sum();
    let den: f64 = samples.iter().map(|s| (s.0 - mx).powi(2)).sum();
    3600.0 * num / den
}

/// The peak RSS in MiB that `/usr/bin/time -f IDMIG_MAXRSS=%M` wrote into `stderr`; `None`
/// when it is not there.
pub fn max_rss_mib(stderr: &str) -> Option<f64> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("IDMIG_MAXRSS="))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
}
