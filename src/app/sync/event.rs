//! What sync reports as it goes (`SyncEvent`), and how its reports read on a terminal.

use crate::core::kvstore::NodeCounts;
use crate::core::planner::Kind;

pub use crate::core::sync::SyncStatus;
pub use crate::core::sync::machine::CutoverReport;
pub use crate::core::sync::machine::catch_up_text;

/// An id the kvstore and Kubernetes hold for different labels, found during sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitAllocation {
    pub id: u32,
    pub kvstore_labels: String,
    pub k8s_labels: String,
    /// Kvstore-mode nodes that use the kvstore's labels (their `value/` keys).
    pub nodes: Vec<String>,
}

impl std::fmt::Display for SplitAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (id, kv, k8s) = (self.id, &self.kvstore_labels, &self.k8s_labels);
        if self.nodes.is_empty() {
            return write!(
                f,
                "split allocation at id {id}: the kvstore holds {kv}, Kubernetes holds {k8s}; no kvstore-mode node uses the kvstore's labels now, so there is nothing to roll (they get a remap proposal)"
            );
        }
        write!(
            f,
            "split allocation at id {id}: the kvstore holds {kv} (used by kvstore-mode nodes {}), Kubernetes holds {k8s}: roll those nodes to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels); the kvstore's labels get a remap proposal",
            self.nodes.join(", ")
        )
    }
}

impl SplitAllocation {
    /// The same report for a terminal line by line: what to do first, then each label set
    /// on a line of its own, so no line carries both label keys.
    pub fn lines(&self) -> Vec<String> {
        let id = self.id;
        let first = if self.nodes.is_empty() {
            format!(
                "split allocation at id {id}: no kvstore-mode node uses the kvstore's labels now, so there is nothing to roll (they get a remap proposal)"
            )
        } else {
            format!(
                "split allocation at id {id}: roll {} to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels; the kvstore's labels get a remap proposal)",
                crate::core::audit::names_list(&self.nodes, 8)
            )
        };
        vec![
            first,
            format!("  the kvstore holds  {}", self.kvstore_labels),
            format!("  Kubernetes holds   {}", self.k8s_labels),
        ]
    }
}

/// What sync reports as it goes.
#[derive(Debug, Clone)]
pub enum SyncEvent {
    Status(SyncStatus),
    /// Which nodes use each label set now (from the kvstore watch), when they moved.
    NodeCounts(NodeCounts),
    /// A conflict that waits for a decision (once per identity).
    Conflict {
        id: String,
        kind: Kind,
        reason: String,
    },
    Split(SplitAllocation),
    /// A malformed kvstore entry, never written (once per identity).
    Invalid {
        id: String,
        reason: String,
    },
    /// Both watches are established: sync follows both sides from here (once per snapshot).
    Following,
    /// A watch or a read failed; sync retries.
    Trouble(String),
    /// Something done that is worth a line (the reservations released).
    Note(String),
    /// A conflict that waited for a decision is closed without a write: no kvstore-mode
    /// node uses its labels any more, so no agent can use the id it held (once per identity).
    Moot {
        id: String,
        labels: String,
    },
    /// Cutover reached: no kvstore-mode node for the grace period, nothing pending, verify
    /// passed.
    Cutover(CutoverReport),
}

/// How a conflict closed as moot reads, on the terminal and in the TUI.
pub fn moot_text(id: &str, labels: &str) -> String {
    format!(
        "moot: {id} ({labels}) waited for a decision, but no kvstore-mode node uses it any more: closed without a write"
    )
}

impl From<crate::app::decisions_file::Said> for SyncEvent {
    fn from(said: crate::app::decisions_file::Said) -> Self {
        match said {
            crate::app::decisions_file::Said::Note(n) => SyncEvent::Note(n),
            crate::app::decisions_file::Said::Trouble(t) => SyncEvent::Trouble(t),
        }
    }
}
