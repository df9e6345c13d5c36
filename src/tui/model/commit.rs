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
    pub failures: Vec<(String, String)>,
    pub elapsed: Duration,
    pub crd_note: Option<String>,
    pub report: Option<ApplyReport>,
    pub verify: Option<VerifyReport>,
    pub stop_reason: Option<String>,
    /// When the running commit started (drives the elapsed time, rate and ETA).
    pub started: Option<Instant>,
}
