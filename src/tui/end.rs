//! What the terminal keeps when the TUI ends: the last commit's totals, where the rollout
//! stands, and whether a cluster's screens were left for the Fleet screen.

use super::model::{self, Model};

/// What a commit did, for the lines the terminal keeps after the TUI exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitSummary {
    /// Commits this session made (a paused one resumed counts twice).
    pub commits: usize,
    pub created: usize,
    pub already_there: usize,
    pub not_attempted: usize,
    pub failed: usize,
    pub stopped: bool,
    /// A rollback's totals instead of a commit's.
    pub rollback: Option<(usize, usize, usize)>,
}

impl CommitSummary {
    /// The last commit's totals, if one finished.
    pub fn of(model: &Model) -> Option<Self> {
        use crate::apply::outcome::Outcome;
        let r = model.commit.report.as_ref()?;
        // What the session wrote, over every commit; what is left, from the last.
        let (created, already_there) = if model.commit.rollback {
            (r.count(Outcome::Created), r.count(Outcome::AlreadyExisted))
        } else {
            (model.session.created, model.session.already_there)
        };
        Some(CommitSummary {
            commits: model.session.commits,
            created,
            already_there,
            not_attempted: r.count(Outcome::NotAttempted),
            failed: r.count(Outcome::Failed) + r.count(Outcome::Conflict),
            stopped: r.stopped.is_some(),
            rollback: model.commit.rollback.then(|| {
                (
                    r.count(Outcome::Deleted),
                    r.count(Outcome::AlreadyGone),
                    r.count(Outcome::Kept),
                )
            }),
        })
    }

    /// Whether a rerun has anything left to write.
    pub fn unfinished(&self) -> bool {
        self.not_attempted > 0 || self.failed > 0
    }
}

impl std::fmt::Display for CommitSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some((deleted, gone, kept)) = self.rollback {
            return write!(
                f,
                "rollback: {deleted} deleted, {gone} already gone, {kept} kept, {} not attempted, {} failed{}",
                self.not_attempted,
                self.failed,
                if self.stopped { " (stopped)" } else { "" }
            );
        }
        write!(
            f,
            "commit: {} created, {} already there, {} not attempted, {} failed{}{}",
            self.created,
            self.already_there,
            self.not_attempted,
            self.failed,
            if self.stopped { " (stopped)" } else { "" },
            if self.commits > 1 {
                format!(" (this session, {} commits)", self.commits)
            } else {
                String::new()
            }
        )
    }
}

/// What the terminal keeps when the TUI ends: the last commit's totals and where the
/// rollout stands, each if there is one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TuiEnd {
    pub commit: Option<CommitSummary>,
    pub rollout: Option<model::RolloutSummary>,
    /// Left with Esc for the Fleet screen it was opened from, not quit.
    pub back: bool,
}

impl TuiEnd {
    pub(super) fn of(model: &Model) -> Self {
        TuiEnd {
            commit: CommitSummary::of(model),
            rollout: model::RolloutSummary::of(model),
            back: model.back,
        }
    }

    /// What it says, a line each: the commit's totals, where the rollout stands.
    pub fn said(&self) -> Vec<String> {
        let commit = self.commit.map(|c| c.to_string());
        let rollout = self.rollout.as_ref().map(|r| r.to_string());
        commit.into_iter().chain(rollout).collect()
    }
}
