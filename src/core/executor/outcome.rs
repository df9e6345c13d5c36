//! What an apply tells its watchers: the result of each operation, the final report, running
//! totals, and the discrete events worth a line of their own. Plain owned data.

use std::time::Duration;

use serde::Serialize;

pub use crate::core::outcome::Outcome;

/// The result of one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpResult {
    pub id: String,
    pub target_id: Option<u32>,
    pub outcome: Outcome,
    /// For a `conflict`: the labels the id already holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub existing: Option<String>,
    /// For a `failed` (or a rollback's `kept`): why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub attempts: u32,
    /// For a `created`: the object's uid and resourceVersion (what a rollback deletes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// For a `failed`: the server refused these credentials or this verb (401, 403 from
    /// RBAC): configuration to fix, not an outage to wait out.
    #[serde(skip)]
    pub refused: bool,
}

impl OpResult {
    pub fn new(id: &str, target_id: Option<u32>, outcome: Outcome) -> Self {
        OpResult {
            id: id.to_string(),
            target_id,
            outcome,
            existing: None,
            error: None,
            attempts: 0,
            uid: None,
            resource_version: None,
            refused: false,
        }
    }

    /// What went wrong, worded for the operator and the decision log's `error` field.
    pub fn problem(&self) -> Option<String> {
        match self.outcome {
            Outcome::Conflict => Some(format!(
                "id already holds other labels: {}",
                self.existing.as_deref().unwrap_or("")
            )),
            Outcome::Failed | Outcome::Kept | Outcome::Denied => self.error.clone(),
            _ => None,
        }
    }
}

/// Running totals of an apply, published on a `watch` channel: a watcher sees the latest
/// figures without a message per identity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub total: usize,
    pub writes: usize,
    pub done: usize,
    pub created: usize,
    /// Rollback: objects deleted or found gone.
    pub deleted: usize,
    pub failed: usize,
    pub retries: u64,
    /// Times the API server pushed back (429): waited out, never a failure.
    pub throttled: u64,
}

/// Owned events for whoever watches an apply (the headless printer or the TUI).
#[derive(Debug, Clone)]
pub enum ApplyEvent {
    CrdCreating,
    CrdEstablished,
    Started {
        writes: usize,
        /// Of the writes, deletes (a rollback's); the rest are creates.
        deletes: usize,
        /// Of the deletes, objects already gone when the plan was read: no request is
        /// sent for them (a rollback's plan counts them apart).
        already_gone: usize,
        total: usize,
    },
    Retrying {
        id: String,
        attempt: u32,
        error: String,
        wait: Duration,
    },
    /// An item that failed or met a conflict, as it happens (progress goes to the watch).
    Problem(OpResult),
    Stopping {
        reason: String,
    },
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ApplyReport {
    pub results: Vec<OpResult>,
    pub retries: u64,
    /// Times the API server pushed back (429, API Priority and Fairness): each waited out
    /// as the server asked, never counted as an attempt or a failure.
    pub throttled: u64,
    /// The API server's `Warning` headers first heard in this run, each text once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub server_warnings: Vec<String>,
    pub stopped: Option<String>,
    pub crd_created: bool,
    pub elapsed_ms: u128,
}

impl ApplyReport {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.results.iter().filter(|r| r.outcome == outcome).count()
    }

    /// True when no item failed, conflicted or was left unattempted.
    pub fn succeeded(&self) -> bool {
        self.results
            .iter()
            .all(|r| !r.outcome.is_unfinished() && r.outcome != Outcome::Conflict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_serializes_as_the_report_always_did() {
        let mut r = OpResult::new("300", Some(300), Outcome::Conflict);
        r.existing = Some("k8s:a=b;".into());
        r.attempts = 2;
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"id":"300","target_id":300,"outcome":"conflict","existing":"k8s:a=b;","attempts":2}"#
        );
        assert_eq!(
            r.problem().as_deref(),
            Some("id already holds other labels: k8s:a=b;")
        );
    }
}
