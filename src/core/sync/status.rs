//! Where sync stands, as the status line, the TUI and the metrics say it: its counts, lag
//! and what cutover waits for (one reason at a time, the first that holds).

use std::time::Duration;

use crate::core::words::count;

/// Where sync stands.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncStatus {
    pub kvstore_nodes: usize,
    pub identities: usize,
    pub mirrored: u64,
    pub pending: usize,
    /// Ids split now (one id, two label sets); a split that ends leaves this count.
    pub splits: usize,
    /// Split allocations found since sync started, each occurrence once.
    pub splits_found: u64,
    /// Label sets held under two ids at the last status tick (the plan's reuses and
    /// duplicates: the kvstore's id and Kubernetes' differ, or two kvstore ids).
    pub doubles: usize,
    pub failures: u64,
    pub removed_from_kvstore: u64,
    pub recreated: u64,
    pub deleted_not_recreated: u64,
    pub lag_last: Option<Duration>,
    pub lag_p50: Option<Duration>,
    pub lag_p99: Option<Duration>,
    /// From arrival to write of the last identity that waited for a decision (not lag).
    pub decision_wait_last: Option<Duration>,
    pub watching: bool,
    /// Ids reserved in the kvstore now (`--reserve-in-kvstore`).
    pub reservations: usize,
    /// Another sync holds the one-writer lease: this one follows and does not write.
    pub standby: Option<String>,
    /// What cutover waits for now (`None`: reached, or sync not yet following).
    pub cutover_wait: Option<CutoverWait>,
    /// Answers of the API server that were 429, since sync started (the binary's IO fills
    /// it in: the machine never sees a request).
    pub throttled: u64,
}

/// What cutover waits for: one reason at a time, the first that holds, so an operator
/// always knows whether sync is stuck or counting down.
#[derive(Debug, Clone, PartialEq)]
pub enum CutoverWait {
    /// Kvstore-mode nodes (`value/` keys) are still there.
    Nodes(usize),
    /// No kvstore-mode node is left; the grace runs (`left` of it).
    Grace { left: Duration },
    /// Conflicts wait for a decision.
    Decisions(usize),
    /// Writes are failing, in flight or waiting to be planned.
    Writes(usize),
    /// Creates an admission webhook or policy denied: how many, and the first in the
    /// server's words. Waiting will not make them; the rule or the decision must change.
    Denied { writes: usize, first: String },
    /// Another sync holds the lease.
    Lease,
    /// The last check (a full verify) found problems: the first few, and how many.
    Verify { problems: usize, first: String },
    /// A check runs now.
    Checking,
}

impl CutoverWait {
    /// Its name in `cilium_idmig_cutover_waiting{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            CutoverWait::Nodes(_) => "nodes",
            CutoverWait::Grace { .. } => "grace",
            CutoverWait::Decisions(_) => "decisions",
            CutoverWait::Writes(_) => "writes",
            CutoverWait::Denied { .. } => "denied",
            CutoverWait::Lease => "lease",
            CutoverWait::Verify { .. } => "verify",
            CutoverWait::Checking => "checking",
        }
    }

    pub const REASONS: [&'static str; 8] = [
        "nodes",
        "grace",
        "decisions",
        "writes",
        "denied",
        "lease",
        "verify",
        "checking",
    ];
}

impl std::fmt::Display for CutoverWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutoverWait::Nodes(n) => {
                write!(f, "waits for {} to move", count(*n, "kvstore-mode node"))
            }
            CutoverWait::Grace { left } => write!(
                f,
                "no kvstore-mode node left: grace ends in {}s",
                left.as_secs()
            ),
            CutoverWait::Decisions(n) => write!(f, "waits for {}", count(*n, "pending decision")),
            CutoverWait::Writes(n) => {
                write!(f, "waits for {} (failing or in flight)", count(*n, "write"))
            }
            CutoverWait::Denied { writes, first } => write!(
                f,
                "waits for {} an admission check denied ({first}): change the rule or decide the identity, then start sync again",
                count(*writes, "create")
            ),
            CutoverWait::Lease => write!(f, "waits for the lease (another sync writes)"),
            CutoverWait::Verify { problems, first } => {
                write!(f, "verify found {}: {first}", count(*problems, "problem"))
            }
            CutoverWait::Checking => write!(f, "checking (a full verify)"),
        }
    }
}

/// Where cutover stands, from what sync knows now: the first reason that holds, or `None`
/// when a check may run. `last_verify` is the last check's problems, if it failed.
pub fn cutover_wait(
    status: &SyncStatus,
    no_nodes_for: Option<Duration>,
    grace: Duration,
    (unsettled_writes, denied, holding, verifying): (usize, Option<(usize, String)>, bool, bool),
    last_verify: Option<&CutoverWait>,
) -> Option<CutoverWait> {
    let wait = match no_nodes_for {
        _ if status.kvstore_nodes > 0 => CutoverWait::Nodes(status.kvstore_nodes),
        None => CutoverWait::Nodes(0),
        Some(d) if d < grace => CutoverWait::Grace { left: grace - d },
        Some(_) if !holding => CutoverWait::Lease,
        Some(_) if status.pending > 0 => CutoverWait::Decisions(status.pending),
        Some(_) if unsettled_writes > 0 => CutoverWait::Writes(unsettled_writes),
        Some(_) if denied.is_some() => {
            let (writes, first) = denied.unwrap_or_default();
            CutoverWait::Denied { writes, first }
        }
        Some(_) if verifying => CutoverWait::Checking,
        Some(_) => return last_verify.cloned(),
    };
    Some(wait)
}

impl std::fmt::Display for SyncStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{}ms", d.as_millis()));
        write!(
            f,
            "sync: {} · {} identities · {} mirrored · {} pending · {} split · {} failed · lag last {} p50 {} p99 {}{}",
            count(self.kvstore_nodes, "kvstore-mode node"),
            self.identities,
            self.mirrored,
            self.pending,
            self.splits,
            self.failures,
            ms(self.lag_last),
            ms(self.lag_p50),
            ms(self.lag_p99),
            if self.watching { "" } else { " · catching up" }
        )?;
        if let Some(d) = self.decision_wait_last {
            write!(f, " · decision wait last {}ms (not lag)", d.as_millis())?;
        }
        if let Some(wait) = &self.cutover_wait {
            write!(f, " · cutover {wait}")?;
        }
        if self.reservations > 0 {
            write!(f, " · {} reserved in the kvstore", self.reservations)?;
        }
        if self.throttled > 0 {
            write!(f, " · {} throttled (429, waited out)", self.throttled)?;
        }
        if let Some(holder) = &self.standby {
            write!(f, " · standby: {holder} holds the lease")?;
        }
        Ok(())
    }
}
