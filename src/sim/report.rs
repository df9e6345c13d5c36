//! What a simulated run says: its trace (the last lines kept for a report, every line in
//! the digest) and the invariant a failure broke.

use std::collections::VecDeque;
use std::time::Duration;

/// What happened, shortened to the last lines for a report, and digested whole.
#[derive(Debug, Default)]
pub struct Trace {
    last: VecDeque<String>,
    digest: u64,
    pub lines: u64,
}

/// Every line also printed to stderr as it happens (`simulate --trace`, for one seed).
pub static ECHO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lines kept for a failure's report.
const TRACE_KEPT: usize = 60;

impl Trace {
    pub fn line(&mut self, t: Duration, s: String) {
        let line = format!("{:>9.1}s {s}", t.as_secs_f64());
        if ECHO.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{line}");
        }
        // FNV-1a: the same digest in every process and on every platform.
        if self.lines == 0 {
            self.digest = 0xcbf2_9ce4_8422_2325;
        }
        for b in line.bytes().chain([b'\n']) {
            self.digest ^= u64::from(b);
            self.digest = self.digest.wrapping_mul(0x100_0000_01b3);
        }
        self.lines += 1;
        self.last.push_back(line);
        if self.last.len() > TRACE_KEPT {
            self.last.pop_front();
        }
    }

    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The last lines, oldest first.
    pub fn last_lines(&self) -> Vec<String> {
        self.last.iter().cloned().collect()
    }
}

/// An invariant broken: which, how, at which step, and the trace that led there.
#[derive(Debug, Clone)]
pub struct Failure {
    pub invariant: &'static str,
    pub detail: String,
    pub step: usize,
    pub trace: Vec<String>,
}

impl Failure {
    pub fn new(invariant: &'static str, detail: String) -> Self {
        Failure {
            invariant,
            detail,
            step: 0,
            trace: Vec::new(),
        }
    }
}
