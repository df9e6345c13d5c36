//! The commit's state: its phase, running totals, failures as they happen, and the report
//! and verification once it is done.

use std::time::{Duration, Instant};

use crate::apply::outcome::ApplyReport;
use crate::core::verify::VerifyReport;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitPhase {
    #[default]
    Idle,
    Running,
    Stopping,
    Done,
}

#[derive(Debug, Clone, Default)]
pub struct CommitState {
    pub phase: CommitPhase,
    pub generation: u64,
    pub total: usize,
    pub writes: usize,
    pub done: usize,
    pub created: usize,
    pub retries: u64,
    /// Times the API server pushed back (429), each waited out.
    pub throttled: u64,
    pub failures: Vec<(String, String)>,
    pub elapsed: Duration,
    pub crd_note: Option<String>,
    pub report: Option<ApplyReport>,
    pub verify: Option<VerifyReport>,
    pub stop_reason: Option<String>,
    /// When the running commit started (drives the elapsed time, rate and ETA).
    pub started: Option<Instant>,
    /// `r` was pressed while the rescan after a commit ran: resume once it is in.
    pub resume_after_scan: bool,
    /// Deletes of a rollback (rather than creates of a commit).
    pub rollback: bool,
    /// Rollback: objects deleted or found gone so far.
    pub deleted: usize,
}

/// What every commit of this session wrote (a paused commit resumed is two commits of one
/// session): the totals a quit summary and the progress panel give.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionTotals {
    pub commits: usize,
    pub created: usize,
    pub already_there: usize,
}

impl CommitState {
    /// How the panel names where the commit is: paused (stopped with `p`, `r` resumes)
    /// rather than done when it was stopped.
    pub fn phase_title(&self) -> &'static str {
        match self.phase {
            CommitPhase::Idle => "Idle",
            CommitPhase::Running => "Running",
            CommitPhase::Stopping => "Stopping",
            CommitPhase::Done if self.stop_reason.is_some() => "Paused",
            CommitPhase::Done => "Done",
        }
    }

    /// Whether a finished commit left anything to write: failures, or items not attempted
    /// because it was stopped.
    pub fn has_work_left(&self) -> bool {
        !self.failures.is_empty()
            || self
                .report
                .as_ref()
                .is_some_and(|r| r.results.iter().any(|x| x.outcome.is_unfinished()))
    }
}
