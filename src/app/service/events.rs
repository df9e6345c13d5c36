//! What a front end and the service say to each other: requests in, events out, each owned,
//! and the service's jobs named in failures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::app::flows::{ApplyRun, ApplySpec};
use crate::app::preflight::PreflightReport;
use crate::apply::outcome::ApplyEvent;
use crate::core::kvstore::{NodeCounts, SourceInfo};
use crate::core::labels::LabelKey;
use crate::core::planner::resume::Dropped;
use crate::core::planner::{Op, PlanItem};
use crate::core::verify::VerifyReport;
use crate::error::Error;

use crate::app::rollback::RollbackSpec;

/// The service's jobs, named in failures so a front end can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Scan,
    NodeCount,
    Apply,
    DecisionLog,
    DriftWatch,
    Export,
    Resume,
    Rollback,
    Sync,
    Audit,
    Switch,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Scan => "scan",
            Task::NodeCount => "node count",
            Task::Apply => "commit",
            Task::DecisionLog => "decision log",
            Task::DriftWatch => "drift watch",
            Task::Export => "export",
            Task::Resume => "resume",
            Task::Rollback => "rollback",
            Task::Sync => "sync",
            Task::Audit => "audit",
            Task::Switch => "switch report",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Requests from a front end.
#[derive(Debug, Clone)]
pub enum ServiceRequest {
    Preflight,
    Scan {
        generation: u64,
    },
    /// The operator decided on `item` (already changed by the decision): log it now.
    /// `name` is the decision's word (`accept`, `edit`, `undo`, ...).
    Decided {
        name: &'static str,
        item: Box<PlanItem>,
    },
    /// Write what the operator confirmed in the TUI. `items` carry their decisions.
    Commit {
        generation: u64,
        items: Vec<PlanItem>,
    },
    /// A headless apply: a saved plan, or plan and apply in one go.
    Apply {
        generation: u64,
        spec: Box<ApplySpec>,
    },
    /// Scan again and replay the decisions recorded in these logs onto the fresh plan.
    Resume {
        generation: u64,
        paths: Vec<PathBuf>,
    },
    /// Read what these logs' runs created and plan its deletion; changes nothing.
    PlanRollback {
        generation: u64,
        spec: RollbackSpec,
    },
    /// Delete exactly what these runs created (re-planned on a fresh read).
    Rollback {
        generation: u64,
        spec: RollbackSpec,
    },
    /// Stop starting new writes.
    Stop,
    /// Start `sync` in place (after a commit): follow both sides, mirror, report.
    StartSync {
        accept_proposals: bool,
    },
    /// Stop sync: no new writes; it ends after those in flight.
    StopSync,
    /// Audit both identity stores by labels (`core::audit`); reads only.
    Audit {
        generation: u64,
    },
    /// What the switch to operator-managed identities would do (`core::switch`); reads only.
    Switch {
        generation: u64,
    },
    /// The nodes that use one identity's labels now (for its details).
    NodesUsing {
        id: String,
        labels: String,
    },
    /// Write the decision log and a Markdown summary next to `path`.
    Export {
        path: PathBuf,
        items: Vec<PlanItem>,
    },
}

/// A finished scan: everything the front end shows, as plain data.
#[derive(Debug, Clone)]
pub struct ScanResult {
    pub items: Vec<PlanItem>,
    pub k8s: BTreeMap<u32, LabelKey>,
    pub source: SourceInfo,
    pub crd_present: bool,
    pub other_names: usize,
}

/// Events to a front end.
#[derive(Debug, Clone)]
pub enum ServiceEvent {
    Preflight(PreflightReport),
    /// The table's data; node counts follow in `NodeCounts`.
    Scanned {
        generation: u64,
        scan: Box<ScanResult>,
    },
    /// Nodes using each label key.
    NodeCounts {
        generation: u64,
        counts: NodeCounts,
    },
    Apply(ApplyEvent),
    /// An apply finished; `verify` is there when the commit asked for it and was not stopped.
    Committed {
        generation: u64,
        run: Box<ApplyRun>,
        verify: Option<VerifyReport>,
    },
    /// The kvstore side of a scan, planned before Kubernetes is read: the table can show
    /// ids and labels while the list runs (kinds are not known yet).
    KvRead {
        generation: u64,
        items: Vec<PlanItem>,
    },
    /// Kubernetes objects listed so far in a running scan.
    Listing {
        generation: u64,
        listed: usize,
        elapsed: std::time::Duration,
    },
    Drift {
        added: u64,
        removed: u64,
    },
    /// The kvstore was compacted past the watched revision; a rescan is due.
    DriftCompacted,
    Exported {
        paths: Vec<PathBuf>,
    },
    /// Decisions replayed from decision logs onto the scan just sent (same generation).
    Resumed {
        generation: u64,
        from: Vec<PathBuf>,
        resumed: usize,
        dropped: Vec<Dropped>,
    },
    /// An earlier session's log in the working directory, for this cluster and kvstore,
    /// holds decisions never committed: the front end may offer to resume it.
    ResumeOffer {
        path: PathBuf,
        decisions: usize,
        operator: String,
        when: String,
    },
    /// A rollback's plan: one operation per object the logs say was created.
    RollbackPlanned {
        generation: u64,
        ops: Vec<Op>,
    },
    /// The nodes that use `id`'s labels (`None`: the source keeps no names).
    NodesUsing {
        id: String,
        nodes: Option<Vec<String>>,
    },
    /// An audit of both stores finished.
    Audited {
        generation: u64,
        run: Box<crate::app::audit::AuditRun>,
    },
    /// The switch report was read.
    SwitchRead {
        generation: u64,
        report: Box<crate::core::switch::report::SwitchReport>,
    },
    /// What a running sync reports.
    Sync(crate::app::sync::SyncEvent),
    /// Sync ended (stopped, or at cutover).
    SyncEnded {
        end: crate::app::sync::SyncEnd,
    },
    /// The API server sent a `Warning` header with a text not heard before in this process
    /// (headless, it is on stderr already; the TUI shows it on its status line).
    ServerWarning {
        text: String,
    },
    /// A task failed; the error is shared so events stay cheap to clone.
    Failed {
        generation: u64,
        task: Task,
        error: Arc<Error>,
    },
}

impl ServiceEvent {
    pub(super) fn failed(generation: u64, task: Task, error: Error) -> Self {
        ServiceEvent::Failed {
            generation,
            task,
            error: Arc::new(error),
        }
    }
}
