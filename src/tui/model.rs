//! The TUI's state: plain data, owned by the terminal task, changed only by `update`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::engine::ApplyReport;
use crate::kvstore::SourceInfo;
use crate::labels::LabelKey;
use crate::planner::{Action as PlanAction, Kind, PlanItem};
use crate::range::IdRange;
use crate::service::PreflightReport;
use crate::verify::VerifyReport;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Preflight,
    Identities,
    Conflicts,
    Commit,
}

impl Screen {
    pub const ALL: [Screen; 4] = [
        Screen::Preflight,
        Screen::Identities,
        Screen::Conflicts,
        Screen::Commit,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Screen::Preflight => "Preflight",
            Screen::Identities => "Identities",
            Screen::Conflicts => "Conflicts",
            Screen::Commit => "Commit",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindFilter {
    All,
    Conflicts,
    Create,
    AlreadyMigrated,
    Invalid,
}

impl KindFilter {
    pub fn next(self) -> Self {
        match self {
            KindFilter::All => KindFilter::Conflicts,
            KindFilter::Conflicts => KindFilter::Create,
            KindFilter::Create => KindFilter::AlreadyMigrated,
            KindFilter::AlreadyMigrated => KindFilter::Invalid,
            KindFilter::Invalid => KindFilter::All,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            KindFilter::All => "all",
            KindFilter::Conflicts => "conflicts",
            KindFilter::Create => "create",
            KindFilter::AlreadyMigrated => "already migrated",
            KindFilter::Invalid => "invalid",
        }
    }

    pub fn admits(self, kind: Kind) -> bool {
        match self {
            KindFilter::All => true,
            KindFilter::Conflicts => kind.is_conflict(),
            KindFilter::Create => kind == Kind::Create,
            KindFilter::AlreadyMigrated => kind == Kind::AlreadyMigrated,
            KindFilter::Invalid => kind == Kind::Invalid,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortColumn {
    Id,
    Kind,
    Target,
    Nodes,
    Labels,
}

impl SortColumn {
    pub fn next(self) -> Self {
        match self {
            SortColumn::Id => SortColumn::Kind,
            SortColumn::Kind => SortColumn::Target,
            SortColumn::Target => SortColumn::Nodes,
            SortColumn::Nodes => SortColumn::Labels,
            SortColumn::Labels => SortColumn::Id,
        }
    }
}

/// A popup that owns the keyboard while open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modal {
    Help,
    Search {
        input: String,
    },
    EditTarget {
        input: String,
        error: Option<String>,
    },
    ConfirmAcceptAll {
        count: usize,
    },
    /// The commit only starts when the operator has typed `yes`.
    ConfirmCommit {
        typed: String,
    },
    Export {
        input: String,
    },
    Message(String),
}

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
}

/// Everything the screens show.
#[derive(Debug, Clone)]
pub struct Model {
    pub screen: Screen,
    pub modal: Option<Modal>,
    /// Generation of the latest scan request; results of older ones are dropped.
    pub generation: u64,
    pub scanning: bool,
    /// Node counts are still being read (the table shows `…` meanwhile).
    pub counting: bool,
    pub preflight: Option<PreflightReport>,
    pub items: Vec<PlanItem>,
    /// Lower-cased `id labels` per item, for `/` search without allocating per keystroke.
    pub haystack: Vec<String>,
    pub k8s: BTreeMap<u32, LabelKey>,
    pub source: Option<SourceInfo>,
    pub crd_present: bool,
    pub range: IdRange,
    /// Indices into `items`, filtered and sorted: the table's rows.
    pub view: Vec<usize>,
    pub filter: KindFilter,
    pub search: String,
    pub sort: SortColumn,
    pub descending: bool,
    pub selected: usize,
    pub offset: usize,
    pub page: usize,
    /// The item under review on the conflicts screen.
    pub conflict: Option<usize>,
    pub undo: Vec<(usize, PlanItem)>,
    pub commit: CommitState,
    pub drift: (u64, u64),
    pub status: String,
    pub no_color: bool,
    pub quit: bool,
    pub quit_after_commit: bool,
    /// When the running commit started (drives the elapsed time, rate and ETA).
    pub commit_started: Option<std::time::Instant>,
}

impl Model {
    pub fn new(range: IdRange, no_color: bool) -> Self {
        Model {
            screen: Screen::Preflight,
            modal: None,
            generation: 0,
            scanning: false,
            counting: false,
            preflight: None,
            items: Vec::new(),
            haystack: Vec::new(),
            k8s: BTreeMap::new(),
            source: None,
            crd_present: true,
            range,
            view: Vec::new(),
            filter: KindFilter::All,
            search: String::new(),
            sort: SortColumn::Id,
            descending: false,
            selected: 0,
            offset: 0,
            page: 20,
            conflict: None,
            undo: Vec::new(),
            commit: CommitState::default(),
            drift: (0, 0),
            status: String::new(),
            no_color,
            quit: false,
            quit_after_commit: false,
            commit_started: None,
        }
    }

    /// Replaces the items (after a scan) and rebuilds the search index and the view.
    pub fn set_items(&mut self, items: Vec<PlanItem>) {
        self.haystack = items
            .iter()
            .map(|i| format!("{} {}", i.id, i.labels).to_lowercase())
            .collect();
        self.items = items;
        self.rebuild_view();
    }

    /// Recomputes the visible rows from filter, search and sort.
    pub fn rebuild_view(&mut self) {
        let needle = self.search.to_lowercase();
        let mut view: Vec<usize> = (0..self.items.len())
            .filter(|&i| self.filter.admits(self.items[i].kind))
            .filter(|&i| needle.is_empty() || self.haystack[i].contains(&needle))
            .collect();
        let items = &self.items;
        let numeric = |i: usize| items[i].numeric_id().unwrap_or(u32::MAX);
        match self.sort {
            // Items arrive in id order already.
            SortColumn::Id => {}
            SortColumn::Kind => view.sort_by_key(|&i| (items[i].kind, numeric(i))),
            SortColumn::Target => {
                view.sort_by_key(|&i| (items[i].target_id.unwrap_or(u32::MAX), numeric(i)))
            }
            SortColumn::Nodes => view.sort_by_key(|&i| (items[i].nodes, numeric(i))),
            SortColumn::Labels => view.sort_by(|&a, &b| items[a].labels.cmp(&items[b].labels)),
        }
        if self.descending {
            view.reverse();
        }
        self.view = view;
        self.selected = self.selected.min(self.view.len().saturating_sub(1));
        self.clamp_offset();
    }

    /// Keeps the selected row on screen.
    pub fn clamp_offset(&mut self) {
        let page = self.page.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + page {
            self.offset = self.selected + 1 - page;
        }
        self.offset = self.offset.min(self.view.len().saturating_sub(page));
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.items.iter().filter(|i| i.kind == kind).count()
    }

    /// Indices of conflicts, in id order.
    pub fn conflicts(&self) -> impl Iterator<Item = usize> + '_ {
        self.items
            .iter()
            .enumerate()
            .filter(|(_, i)| i.kind.is_conflict())
            .map(|(n, _)| n)
    }

    /// Remap and duplicate items still waiting for the operator.
    pub fn undecided(&self) -> usize {
        self.items
            .iter()
            .filter(|i| i.kind.needs_decision() && i.action == PlanAction::Create && !i.decided)
            .count()
    }
}
