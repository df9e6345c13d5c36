//! The Audit screen's state: the latest audit of both identity stores, the one in flight, and
//! where the findings list is scrolled.

use crate::app::audit::AuditRun;

#[derive(Debug, Clone, Default)]
pub struct AuditView {
    /// Generation of the latest request; older answers are dropped.
    pub generation: u64,
    pub running: bool,
    pub run: Option<Box<AuditRun>>,
    /// First finding shown.
    pub offset: usize,
}

impl AuditView {
    /// Starts an audit unless one is running; the generation to ask for.
    pub fn request(&mut self) -> Option<u64> {
        if self.running {
            return None;
        }
        self.running = true;
        self.generation += 1;
        Some(self.generation)
    }

    /// Moves the first finding shown by `delta`, within the findings.
    pub fn scroll(&mut self, delta: isize) {
        let last = self
            .run
            .as_ref()
            .map_or(0, |r| r.report.findings.len().saturating_sub(1));
        self.offset = (self.offset as isize + delta).clamp(0, last as isize) as usize;
    }
}
