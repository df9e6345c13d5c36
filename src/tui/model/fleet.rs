//! The Fleet screen's state: every cluster's row as last read, the one selected, the filter,
//! and the cluster being opened. Plain data, changed only by `update::fleet`.

use std::time::{Duration, Instant};

use crate::core::fleet::row::ClusterRow;

use super::text_field::TextField;

/// How often the clusters are read again while the Fleet screen shows.
pub const READ_EVERY: Duration = Duration::from_secs(30);

/// One cluster of the fleet: its name, and its row once read.
#[derive(Debug, Clone)]
pub struct FleetEntry {
    pub name: String,
    /// `None` until its first read answers.
    pub row: Option<ClusterRow>,
}

impl FleetEntry {
    /// Whether it needs an operator: not read yet counts as not known, so not yet.
    pub fn needs_attention(&self) -> bool {
        self.row.as_ref().is_some_and(|r| r.attention.is_some())
    }

    /// Whether the filter (lower case) matches its name or what it needs.
    fn matches(&self, filter: &str) -> bool {
        filter.is_empty()
            || self.name.to_lowercase().contains(filter)
            || self
                .row
                .as_ref()
                .and_then(|r| r.attention.as_deref())
                .is_some_and(|a| a.to_lowercase().contains(filter))
    }
}

#[derive(Debug, Clone)]
pub struct FleetModel {
    /// Every cluster, in the order named.
    pub clusters: Vec<FleetEntry>,
    /// The selected row among those shown.
    pub selected: usize,
    /// The first row shown, and how many fit.
    pub offset: usize,
    pub page: usize,
    /// What the rows are filtered by (`/`).
    pub filter: String,
    /// The filter being typed: Enter keeps it, Esc clears it.
    pub typing: Option<TextField>,
    /// Clusters still to answer in the read under way.
    pub reading: usize,
    /// When the last read ended, for the next one `READ_EVERY` later.
    pub last_read: Option<Instant>,
    /// The cluster being opened (index into `clusters`).
    pub opening: Option<usize>,
    /// One line under the table: a cluster that could not be opened, or the last visit.
    pub note: Option<String>,
    pub help: bool,
    pub quit: bool,
    pub no_color: bool,
}

impl FleetModel {
    /// The fleet of `names`, each to be read (the reader starts at once).
    pub fn new(names: Vec<String>, no_color: bool) -> Self {
        FleetModel {
            reading: names.len(),
            clusters: names
                .into_iter()
                .map(|name| FleetEntry { name, row: None })
                .collect(),
            selected: 0,
            offset: 0,
            page: 20,
            filter: String::new(),
            typing: None,
            last_read: None,
            opening: None,
            note: None,
            help: false,
            quit: false,
            no_color,
        }
    }

    /// The filter in force: the one being typed, else the one kept.
    pub fn filter_now(&self) -> String {
        self.typing
            .as_ref()
            .map_or(self.filter.as_str(), TextField::text)
            .to_lowercase()
    }

    /// The clusters shown (indices into `clusters`), the filter applied.
    pub fn shown(&self) -> Vec<usize> {
        let filter = self.filter_now();
        (0..self.clusters.len())
            .filter(|&i| self.clusters[i].matches(&filter))
            .collect()
    }

    /// The cluster selected, if any is shown.
    pub fn selected_cluster(&self) -> Option<usize> {
        self.shown().get(self.selected).copied()
    }

    /// Keeps the selection on a shown row and in the page.
    pub fn clamp(&mut self) {
        let shown = self.shown().len();
        self.selected = self.selected.min(shown.saturating_sub(1));
        if self.selected < self.offset {
            self.offset = self.selected;
        }
        if self.selected >= self.offset + self.page {
            self.offset = self.selected + 1 - self.page;
        }
    }

    /// Clusters that reached cutover, and those that need attention.
    pub fn counts(&self) -> (usize, usize) {
        let rows = self.clusters.iter().filter_map(|c| c.row.as_ref());
        let reached = rows.clone().filter(|r| r.reached_cutover()).count();
        let attention = rows.filter(|r| r.attention.is_some()).count();
        (reached, attention)
    }
}
