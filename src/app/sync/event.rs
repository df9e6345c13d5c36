//! What sync reports as it goes (`SyncEvent`), and how its reports read on a terminal.

use crate::core::kvstore::NodeCounts;
use crate::core::planner::Kind;

pub use crate::core::sync::SyncStatus;
pub use crate::core::sync::machine::CutoverReport;
pub use crate::core::sync::machine::catch_up_text;
pub use crate::core::sync::split::SplitAllocation;

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
    /// A malformed kvstore entry, never written (once per identity); `at_read`: found in
    /// a read of the whole kvstore, not arriving while sync follows it.
    Invalid {
        id: String,
        reason: String,
        at_read: bool,
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
