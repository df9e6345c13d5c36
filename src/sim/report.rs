//! What a simulated run says: its trace (the last lines kept for a report, every line in
//! the digest) and the invariant a failure broke.

use std::collections::VecDeque;
use std::time::Duration;

/// What happened, shortened to the last lines for a report, and digested whole.
#[derive(Debug, Default)]
pub struct Trace {
    /// The last lines, each with its time: a line is written out in full only for a
    /// report (or `--trace`), not as it is traced, which is most of a seed's lines.
    last: VecDeque<(Duration, String)>,
    digest: Fnv,
    pub lines: u64,
    /// The last time spelled as a line starts (`time_prefix`): most lines come at a time
    /// the line before came at.
    spelled: (Duration, String),
}

/// FNV-1a over a line's text as it is written out: the same digest in every process and
/// on every platform.
#[derive(Debug)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for b in s.bytes() {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x100_0000_01b3);
        }
        Ok(())
    }
}

/// Every line also printed to stderr as it happens (`simulate --trace`, for one seed).
pub static ECHO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Lines kept for a failure's report.
const TRACE_KEPT: usize = 60;

/// A line as a report shows it: its time, then what happened.
fn written(t: Duration, s: &str) -> String {
    time_prefix(t) + s
}

/// How a line starts: its time in seconds to a tenth, `{:>9.1}s `. A time in whole
/// milliseconds (all of the simulation's) is spelled from its digits, rounded to the
/// nearest tenth as float formatting rounds; float formatting was a hundredth of a seed.
/// Only a time halfway between two tenths is left to it (which way the float's binary
/// value rounds is its to say).
fn time_prefix(t: Duration) -> String {
    let ms = t.as_millis();
    if !t.subsec_nanos().is_multiple_of(1_000_000) || ms % 100 == 50 {
        return format!("{:>9.1}s ", t.as_secs_f64());
    }
    let tenths = (ms + 50) / 100;
    let number = (tenths / 10).to_string();
    let mut out = String::with_capacity(16);
    for _ in (number.len() + 2)..9 {
        out.push(' ');
    }
    out.push_str(&number);
    out.push('.');
    out.push(char::from(b'0' + (tenths % 10) as u8));
    out.push_str("s ");
    out
}

impl Trace {
    /// Traces what happened at `t`. Given as `format_args!`, the line is spelled straight
    /// into the buffer of the line it pushes out of the kept ones: most lines cost no
    /// allocation.
    pub fn line(&mut self, t: Duration, what: impl std::fmt::Display) {
        use std::fmt::Write;
        let mut s = match self.last.len() == TRACE_KEPT {
            true => self.last.pop_front().map(|(_, s)| s).unwrap_or_default(),
            false => String::new(),
        };
        s.clear();
        let _ = write!(s, "{what}");
        if ECHO.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("{}", written(t, &s));
        }
        // The digest reads the line as `written` spells it, without building it.
        if self.spelled.0 != t || self.spelled.1.is_empty() {
            self.spelled = (t, time_prefix(t));
        }
        let _ = self.digest.write_str(&self.spelled.1);
        let _ = self.digest.write_str(&s);
        let _ = self.digest.write_str("\n");
        self.lines += 1;
        self.last.push_back((t, s));
    }

    pub fn digest(&self) -> u64 {
        self.digest.0
    }

    /// The last lines, oldest first.
    pub fn last_lines(&self) -> Vec<String> {
        self.last.iter().map(|(t, s)| written(*t, s)).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_spelled_as_float_formatting_spells_it() {
        let ms = (0..300_000)
            .step_by(7)
            .chain([1, 49, 50, 51, 150, 250, 949, 950, 951, 1_250, 1_350, 99_999])
            .chain([123_456_700, 9_999_999_900, 9_999_999_950, 9_999_999_999]);
        for ms in ms {
            let t = Duration::from_millis(ms);
            assert_eq!(
                time_prefix(t),
                format!("{:>9.1}s ", t.as_secs_f64()),
                "{ms} ms"
            );
        }
        let t = Duration::new(3, 123_456);
        assert_eq!(time_prefix(t), format!("{:>9.1}s ", t.as_secs_f64()));
    }
}
