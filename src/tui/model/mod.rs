//! The TUI's state: plain data, owned by the terminal task, changed only by `update`. Split
//! by concern: what the scan found, the table, the conflict review, the commit.

mod audit;
mod commit;
mod fleet;
mod switch;
mod table;
mod text_field;

pub use audit::AuditView;
pub use commit::{CommitPhase, CommitState, SessionTotals};
pub use fleet::{FleetEntry, FleetModel, READ_EVERY};
pub use switch::{SwitchView, needs_something};
pub use table::{KindFilter, SortColumn, TableState};
pub use text_field::TextField;

use std::collections::BTreeMap;

use crate::app::service::PreflightReport;
use crate::core::kvstore::SourceInfo;
use crate::core::labels::LabelKey;
use crate::core::planner::{Action as PlanAction, Kind, PlanItem};
use crate::core::range::IdRange;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Preflight,
    Identities,
    Conflicts,
    Commit,
    /// `sync` running in place after a commit.
    Sync,
    /// Opened with `--rollback`: the deletion of what earlier runs created.
    Rollback,
    /// Both identity stores audited by labels; reads only.
    Audit,
    /// What the switch to operator-managed identities would do to every pod; reads only.
    Switch,
    /// Several clusters opened at once: where each one's migration stands, above their
    /// own screens (not a tab of one cluster's).
    Fleet,
}

impl Screen {
    /// The screens of a migration, in tab order.
    pub const ALL: [Screen; 7] = [
        Screen::Preflight,
        Screen::Identities,
        Screen::Conflicts,
        Screen::Commit,
        Screen::Sync,
        Screen::Audit,
        Screen::Switch,
    ];
    /// The screens of a rollback.
    pub const ROLLBACK: [Screen; 1] = [Screen::Rollback];

    pub fn title(self) -> &'static str {
        match self {
            Screen::Preflight => "Preflight",
            Screen::Identities => "Identities",
            Screen::Conflicts => "Conflicts",
            Screen::Commit => "Commit",
            Screen::Sync => "Sync",
            Screen::Rollback => "Rollback",
            Screen::Audit => "Audit",
            Screen::Switch => "Switch",
            Screen::Fleet => "Fleet",
        }
    }
}

/// A rollback under review: the logs it undoes and the plan read for them.
#[derive(Debug, Clone, Default)]
pub struct RollbackState {
    pub logs: Vec<std::path::PathBuf>,
    /// Generation of the latest plan request; older plans are dropped.
    pub generation: u64,
    /// One operation per object the logs say was created, once read.
    pub ops: Option<Vec<crate::core::planner::Op>>,
    /// First row shown.
    pub offset: usize,
    /// Identities live endpoints use are deleted too (after their own typed confirmation).
    pub include_in_use: bool,
}

impl RollbackState {
    /// What the service is asked to roll back.
    pub fn spec(&self) -> crate::app::rollback::RollbackSpec {
        crate::app::rollback::RollbackSpec {
            logs: self.logs.clone(),
            runs: Vec::new(),
            include_in_use: self.include_in_use,
        }
    }
}

/// A popup that owns the keyboard while open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modal {
    Help,
    Search {
        input: TextField,
    },
    EditTarget {
        input: TextField,
        error: Option<String>,
    },
    ConfirmAcceptAll {
        count: usize,
    },
    /// One decision for every conflict the table shows (filter and search applied).
    ConfirmBulk {
        /// Indices of the conflicts it would apply to.
        targets: Vec<usize>,
    },
    /// The commit only starts when the operator has typed `yes`.
    ConfirmCommit {
        typed: TextField,
    },
    /// Starting sync writes too: the same typed `yes`, after saying what it will write.
    ConfirmSync {
        typed: TextField,
    },
    /// Quitting with decisions logged but not committed: `y` first.
    ConfirmQuit {
        uncommitted: usize,
    },
    /// Leaving while sync runs stops it before cutover: the typed word `leave` first.
    ConfirmLeave {
        typed: TextField,
    },
    /// So does a rollback.
    ConfirmRollback {
        typed: TextField,
    },
    /// Deleting identities live endpoints use needs its own typed `in use`.
    ConfirmIncludeInUse {
        typed: TextField,
    },
    /// The export's path being typed; `error`: why the last export of it failed (the
    /// prompt comes back with the path kept, so what is typed next goes into it).
    Export {
        input: TextField,
        error: Option<String>,
    },
    /// Everything about one identity (an index into the items), with the nodes that use it
    /// once read (`None`: being read; `Some(None)`: the source keeps no names).
    Detail {
        index: usize,
        nodes: Option<Option<Vec<String>>>,
    },
    /// An earlier session left decisions never committed: resume them? (never silently)
    ResumeOffer {
        path: std::path::PathBuf,
        decisions: usize,
        operator: String,
        when: String,
    },
    Message(String),
}

/// Where the scans stand.
#[derive(Debug, Clone, Default)]
pub struct ScanState {
    /// Generation of the latest scan request; results of older ones are dropped.
    pub generation: u64,
    pub scanning: bool,
    /// Node counts are still being read (the table shows `…` meanwhile).
    pub counting: bool,
    /// Identities added and removed in the kvstore since the scan.
    pub drift: (u64, u64),
    /// The table holds the kvstore side only: Kubernetes is still being listed.
    pub k8s_pending: bool,
    /// Kubernetes objects listed so far by the running scan, and for how long it has run.
    pub listing: Option<(usize, std::time::Duration)>,
}

/// What the preflight and the latest scan found, with the operator's decisions in the items.
#[derive(Debug, Clone)]
pub struct ClusterState {
    pub preflight: Option<PreflightReport>,
    pub items: Vec<PlanItem>,
    pub k8s: BTreeMap<u32, LabelKey>,
    pub source: Option<SourceInfo>,
    pub crd_present: bool,
    pub range: IdRange,
}

/// The conflict under review and the decisions that can be undone.
#[derive(Debug, Clone, Default)]
pub struct ReviewState {
    /// The item under review on the conflicts screen.
    pub conflict: Option<usize>,
    /// Each step restores the items one key changed (one item, or a whole bulk decision).
    pub undo: Vec<Vec<(usize, PlanItem)>>,
    /// Conflicts that sync found after the snapshot, by kvstore id.
    pub new_since_snapshot: std::collections::BTreeSet<String>,
    /// The planner's proposal for each conflict of the last scan (action and target), by
    /// kvstore id: what `a` takes, whatever was decided on the item before.
    pub proposals: std::collections::HashMap<String, (PlanAction, Option<u32>)>,
    /// The label panes' first row shown (PgUp/PgDn): a label set can outgrow them.
    pub label_scroll: u16,
    /// The identities decided (or undone) since the last commit started: in the log, not
    /// written yet. `q` asks before it leaves them (the next start offers to resume them);
    /// an identity decided twice is one decision in force, as a resume replays it.
    pub uncommitted: std::collections::BTreeSet<String>,
}

/// `sync` in the TUI: whether it runs, its latest status, and what it reported.
#[derive(Debug, Clone, Default)]
pub struct SyncView {
    pub running: bool,
    /// `y` came while a scan ran: sync's confirmation opens once the scan is in.
    pub start_after_scan: bool,
    /// Both watches are established (running alone means sync is still reading both sides).
    pub following: bool,
    pub stopping: bool,
    pub status: Option<crate::app::sync::SyncStatus>,
    /// The latest reports, newest last (at most 200: bounded over days).
    pub lines: std::collections::VecDeque<String>,
    pub cutover: bool,
    /// How many reports back from the newest the pane's bottom line is (0: the newest).
    pub scroll: usize,
    /// The node counts sync last published from its kvstore watch: while sync runs, the
    /// one source of every screen's node counts (a scan's older ones give way to them).
    pub node_counts: Option<crate::core::kvstore::NodeCounts>,
}

impl SyncView {
    pub fn push(&mut self, line: String) {
        self.lines.push_back(line);
        if self.lines.len() > 200 {
            self.lines.pop_front();
        }
        // Scrolled back, the pane stays on what it shows.
        if self.scroll > 0 {
            self.scroll = (self.scroll + 1).min(self.lines.len().saturating_sub(1));
        }
    }

    /// Scrolls by `delta` reports (positive: older), within the reports.
    pub fn scroll_by(&mut self, delta: isize) {
        let last = self.lines.len().saturating_sub(1) as isize;
        self.scroll = (self.scroll as isize + delta).clamp(0, last) as usize;
    }

    /// The report at the bottom of the pane.
    pub fn current(&self) -> Option<&String> {
        self.lines
            .len()
            .checked_sub(1 + self.scroll)
            .and_then(|i| self.lines.get(i))
    }
}

/// Everything the screens show.
#[derive(Debug, Clone)]
pub struct Model {
    pub screen: Screen,
    /// The screens this session has (a migration's, or a rollback's).
    pub tabs: &'static [Screen],
    /// Set when the session is a rollback.
    pub rollback: Option<RollbackState>,
    pub modal: Option<Modal>,
    pub scan: ScanState,
    pub cluster: ClusterState,
    pub table: TableState,
    pub review: ReviewState,
    pub commit: CommitState,
    /// Every commit of this session, summed.
    pub session: SessionTotals,
    pub sync: SyncView,
    pub audit: AuditView,
    pub switch: SwitchView,
    pub status: String,
    pub no_color: bool,
    pub quit: bool,
    pub quit_after_commit: bool,
    /// The Preflight screen's first row shown: its checks can outgrow a small terminal.
    pub preflight_scroll: u16,
    /// The help's first key shown: a screen's keys can outgrow a small terminal.
    pub help_scroll: u16,
    /// The path of the export under way, for its prompt again if it fails.
    pub exporting: Option<String>,
    /// The cluster's name when it was opened from the Fleet screen: the header names it,
    /// and Esc goes back there rather than quitting.
    pub fleet_cluster: Option<String>,
    /// Leaving goes back to the Fleet screen (Esc) rather than ending the session (`q`).
    pub back: bool,
}

impl Model {
    pub fn new(range: IdRange, no_color: bool) -> Self {
        Model {
            screen: Screen::Preflight,
            tabs: &Screen::ALL,
            rollback: None,
            modal: None,
            scan: ScanState::default(),
            cluster: ClusterState {
                preflight: None,
                items: Vec::new(),
                k8s: BTreeMap::new(),
                source: None,
                crd_present: true,
                range,
            },
            table: TableState::default(),
            review: ReviewState::default(),
            commit: CommitState::default(),
            session: SessionTotals::default(),
            sync: SyncView::default(),
            audit: AuditView::default(),
            switch: SwitchView::default(),
            status: String::new(),
            no_color,
            quit: false,
            quit_after_commit: false,
            preflight_scroll: 0,
            help_scroll: 0,
            exporting: None,
            fleet_cluster: None,
            back: false,
        }
    }

    /// A session that reviews and carries out the rollback of the runs in `logs`.
    pub fn for_rollback(range: IdRange, no_color: bool, logs: Vec<std::path::PathBuf>) -> Self {
        Model {
            screen: Screen::Rollback,
            tabs: &Screen::ROLLBACK,
            rollback: Some(RollbackState {
                logs,
                ..Default::default()
            }),
            ..Model::new(range, no_color)
        }
    }

    /// Replaces the items (after a scan) and rebuilds the search index and the view.
    pub fn set_items(&mut self, items: Vec<PlanItem>) {
        self.table.haystack = items
            .iter()
            .map(|i| format!("{} {}", i.id, i.labels).to_lowercase())
            .collect();
        self.cluster.items = items;
        self.rebuild_view();
    }

    /// Recomputes the visible rows from filter, search and sort.
    pub fn rebuild_view(&mut self) {
        let needle = self.table.search.to_lowercase();
        let mut view: Vec<usize> = (0..self.cluster.items.len())
            .filter(|&i| self.table.filter.admits(self.cluster.items[i].kind))
            .filter(|&i| needle.is_empty() || self.table.haystack[i].contains(&needle))
            .collect();
        let items = &self.cluster.items;
        let numeric = |i: usize| items[i].numeric_id().unwrap_or(u32::MAX);
        match self.table.sort {
            // Items arrive in id order already.
            SortColumn::Id => {}
            SortColumn::Kind => view.sort_by_key(|&i| (items[i].kind, numeric(i))),
            SortColumn::Target => {
                view.sort_by_key(|&i| (items[i].target_id.unwrap_or(u32::MAX), numeric(i)))
            }
            SortColumn::Nodes => view.sort_by_key(|&i| (items[i].nodes, numeric(i))),
            SortColumn::Labels => view.sort_by(|&a, &b| items[a].labels.cmp(&items[b].labels)),
        }
        if self.table.descending {
            view.reverse();
        }
        self.table.view = view;
        self.table.selected = self
            .table
            .selected
            .min(self.table.view.len().saturating_sub(1));
        self.clamp_offset();
    }

    /// Keeps the selected row on screen.
    pub fn clamp_offset(&mut self) {
        let page = self.table.page.max(1);
        if self.table.selected < self.table.offset {
            self.table.offset = self.table.selected;
        } else if self.table.selected >= self.table.offset + page {
            self.table.offset = self.table.selected + 1 - page;
        }
        self.table.offset = self
            .table
            .offset
            .min(self.table.view.len().saturating_sub(page));
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.cluster.items.iter().filter(|i| i.kind == kind).count()
    }

    /// Indices of conflicts, in id order.
    pub fn conflicts(&self) -> impl Iterator<Item = usize> + '_ {
        self.cluster
            .items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.kind.is_conflict())
            .map(|(n, _)| n)
    }

    /// Remap and duplicate items still waiting for the operator.
    pub fn undecided(&self) -> usize {
        self.cluster
            .items
            .iter()
            .filter(|i| i.kind.needs_decision() && i.action == PlanAction::Create && !i.decided)
            .count()
    }
}

/// Where the rollout stood when the TUI ended, if sync ran in it: the line the terminal
/// keeps, as headless sync says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutSummary {
    pub cutover: bool,
    pub kvstore_nodes: usize,
    pub pending: usize,
    pub splits: usize,
    pub mirrored: u64,
}

impl RolloutSummary {
    pub fn of(model: &Model) -> Option<Self> {
        if !model.sync.running && model.sync.status.is_none() && !model.sync.cutover {
            return None;
        }
        let s = model.sync.status.clone().unwrap_or_default();
        Some(RolloutSummary {
            cutover: model.sync.cutover,
            kvstore_nodes: s.kvstore_nodes,
            pending: s.pending,
            splits: s.splits,
            mirrored: s.mirrored,
        })
    }
}

impl std::fmt::Display for RolloutSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.cutover {
            return write!(
                f,
                "sync: cutover reached ({} mirrored by sync)",
                self.mirrored
            );
        }
        write!(
            f,
            "sync: stopped before cutover: {} left, {}, {} now ({} mirrored by sync)",
            crate::core::words::count(self.kvstore_nodes, "kvstore-mode node"),
            crate::core::words::count(self.pending, "pending decision"),
            crate::core::words::count(self.splits, "split allocation"),
            self.mirrored
        )
    }
}
