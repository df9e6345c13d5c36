//! The Switch screen's state: the latest report of what the switch to operator-managed
//! identities would do, the one in flight, and which pod is selected.

use crate::core::switch::report::{PodOutcome, SwitchReport};

#[derive(Debug, Clone, Default)]
pub struct SwitchView {
    /// Generation of the latest request; older answers are dropped.
    pub generation: u64,
    pub running: bool,
    pub report: Option<Box<SwitchReport>>,
    /// The selected pod, an index into the report's pods.
    pub selected: usize,
}

impl SwitchView {
    /// Starts a read unless one is running; the generation to ask for.
    pub fn request(&mut self) -> Option<u64> {
        if self.running {
            return None;
        }
        self.running = true;
        self.generation += 1;
        Some(self.generation)
    }

    /// A report arrived: the first pod that needs something is selected.
    pub fn arrived(&mut self, report: Box<SwitchReport>) {
        self.running = false;
        self.selected = report.pods.iter().position(needs_something).unwrap_or(0);
        self.report = Some(report);
    }

    fn pods(&self) -> &[PodOutcome] {
        self.report.as_deref().map_or(&[], |r| r.pods.as_slice())
    }

    /// Moves the selection by `delta`, within the pods.
    pub fn move_by(&mut self, delta: isize) {
        let last = self.pods().len().saturating_sub(1);
        self.selected = (self.selected as isize + delta).clamp(0, last as isize) as usize;
    }

    /// Selects the first or the last pod.
    pub fn to_end(&mut self, last: bool) {
        self.selected = if last {
            self.pods().len().saturating_sub(1)
        } else {
            0
        };
    }

    /// Selects the next (or previous) pod that needs something, as `n`/`N` move between
    /// conflicts in the review; wraps around.
    pub fn next_needing(&mut self, forward: bool) {
        let pods = self.pods();
        let n = pods.len();
        if n == 0 {
            return;
        }
        let found = (1..=n)
            .map(|k| {
                if forward {
                    (self.selected + k) % n
                } else {
                    (self.selected + n - k % n) % n
                }
            })
            .find(|&i| needs_something(&pods[i]));
        if let Some(i) = found {
            self.selected = i;
        }
    }

    /// The selected pod.
    pub fn current(&self) -> Option<&PodOutcome> {
        self.pods().get(self.selected)
    }
}

/// A pod the switch does not simply adopt, or whose endpoint moves.
pub fn needs_something(p: &PodOutcome) -> bool {
    !matches!(p.outcome.name(), "adopted" | "host-network") || p.endpoint_moves()
}
