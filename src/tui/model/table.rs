//! The identities table's state: filter, search, sort, selection and scrolling, and the rows
//! they leave visible (indices into the items).

use crate::core::planner::Kind;

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

/// The table's state; `view` is derived from the items by `Model::rebuild_view`.
#[derive(Debug, Clone)]
pub struct TableState {
    /// Lower-cased `id labels` per item, for `/` search without allocating per keystroke.
    pub haystack: Vec<String>,
    /// Indices into the items, filtered and sorted: the table's rows.
    pub view: Vec<usize>,
    pub filter: KindFilter,
    pub search: String,
    pub sort: SortColumn,
    pub descending: bool,
    pub selected: usize,
    pub offset: usize,
    /// Rows that fit on screen.
    pub page: usize,
}

impl Default for TableState {
    fn default() -> Self {
        TableState {
            haystack: Vec::new(),
            view: Vec::new(),
            filter: KindFilter::All,
            search: String::new(),
            sort: SortColumn::Id,
            descending: false,
            selected: 0,
            offset: 0,
            page: 20,
        }
    }
}
