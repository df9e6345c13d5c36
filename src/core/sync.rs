//! What sync decides, without IO: a state machine that takes both sides' changes in (kvstore
//! keys, Kubernetes objects, write outcomes) and gives writes and reports out: which
//! creates a round makes, which conflicts and malformed entries it reports (once each),
//! which ids are split allocations (found once each), what a batch's outcomes change. The
//! clock comes in as `now`; the watches, the writes, the log and the metrics stay in
//! `app::sync`.

use crate::core::words::count;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::core::kvstore::{KeyKind, KvSnapshot, MasterEntry, NodeCounts, classify_key, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::outcome::Outcome;
use crate::core::plan_cache::PlanCache;
use crate::core::planner::resume::{self, LoggedDecision};
use crate::core::planner::{self, Action, DecidedBy, Kind, Op, OpKind, PlanItem};
use decided::Decisions;

pub mod decided;
pub mod failure;
pub mod machine;
pub mod reserve;
pub mod shell;

/// One change under the identities prefix, as `sync` follows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvChange {
    /// `id/<id>` written (`value`) or deleted (`None`); `created` when the write made the key.
    Master {
        id: Vec<u8>,
        value: Option<Vec<u8>>,
        created: bool,
    },
    /// `value/<label key>/<node>` created or deleted (a rewrite of an existing key is not a
    /// change of who uses what).
    Slave {
        label_key: Vec<u8>,
        node: Vec<u8>,
        present: bool,
    },
}

/// What one key's event means for sync: `value` is `None` for a delete; `created` when the
/// write made the key (a rewrite of a `value/` key is not a change of who uses what).
/// Shared by the etcd watch and the in-memory kvstore's.
pub fn kv_change(
    prefix: &str,
    key: &[u8],
    value: Option<&[u8]>,
    created: bool,
) -> Option<KvChange> {
    let delete = value.is_none();
    match classify_key(prefix, key) {
        KeyKind::Master { id } => Some(KvChange::Master {
            id: id.to_vec(),
            value: value.map(<[u8]>::to_vec),
            created: !delete && created,
        }),
        KeyKind::Slave { label_key, node } if delete || created => Some(KvChange::Slave {
            label_key: label_key.to_vec(),
            node: node.to_vec(),
            present: !delete,
        }),
        _ => None,
    }
}

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
            CutoverWait::Lease => "lease",
            CutoverWait::Verify { .. } => "verify",
            CutoverWait::Checking => "checking",
        }
    }

    pub const REASONS: [&'static str; 7] = [
        "nodes",
        "grace",
        "decisions",
        "writes",
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
    (unsettled_writes, holding, verifying): (usize, bool, bool),
    last_verify: Option<&CutoverWait>,
) -> Option<CutoverWait> {
    let wait = match no_nodes_for {
        _ if status.kvstore_nodes > 0 => CutoverWait::Nodes(status.kvstore_nodes),
        None => CutoverWait::Nodes(0),
        Some(d) if d < grace => CutoverWait::Grace { left: grace - d },
        Some(_) if !holding => CutoverWait::Lease,
        Some(_) if status.pending > 0 => CutoverWait::Decisions(status.pending),
        Some(_) if unsettled_writes > 0 => CutoverWait::Writes(unsettled_writes),
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

/// What sync knows of both sides, and what it has done.
#[derive(Default)]
pub struct SyncState {
    masters: BTreeMap<Vec<u8>, Vec<u8>>,
    counts: NodeCounts,
    /// The counts moved since they were last published to the screens that show them.
    counts_changed: bool,
    k8s: BTreeMap<u32, LabelKey>,
    kv_revision: i64,
    k8s_version: String,
    /// When each kvstore identity that appeared after the snapshot was first seen.
    first_seen: HashMap<Vec<u8>, Instant>,
    /// Objects this sync created; one deleted later is created again at most once.
    created: HashSet<u32>,
    /// Objects this sync made and something deleted since, with the labels they held: only
    /// those labels at that id fall under "made again once, only while used"; other labels
    /// mapped to the freed id are a new object.
    deleted_after_create: HashMap<u32, LabelKey>,
    recreated: HashSet<u32>,
    /// Targets with a create in flight.
    in_flight: HashMap<u32, LabelKey>,
    /// Targets whose create failed, and when to try again.
    failed: HashMap<u32, Instant>,
    /// Objects deleted in Kubernetes while the kvstore still held their identity, and until
    /// when they are not made again. The two GCs often remove one identity moments apart,
    /// and sync's view of the kvstore can lag its view of Kubernetes: made again at once,
    /// the object would outlive its identity and split the id when an agent takes it next.
    /// The kvstore's delete arriving meanwhile ends the wait with nothing to make.
    settling: HashMap<u32, Instant>,
    /// Targets whose create failed and has not been made since (with the kvstore id it
    /// mirrors): what a stop leaves undone. Unlike `failed`, not emptied by a retry.
    unwritten: HashMap<u32, String>,
    reported: HashSet<String>,
    /// Kvstore ids that waited for a decision before their write: their time to write is a
    /// decision wait, not lag.
    waited_for_decision: HashSet<String>,
    /// Ids split now; one whose split ends leaves it, so a later split there is new.
    splits: HashSet<u32>,
    /// From the latest plan: kvstore ids served at another id that holds their labels.
    reused: BTreeMap<String, u32>,
    /// Splits found and not yet reported (waiting to name their nodes), with when found.
    splits_to_report: Vec<(u32, Instant)>,
    /// Conflicts closed as moot (no node uses their labels any more).
    moot: BTreeSet<String>,
    /// From the latest round: the conflicts waiting for a decision (id, labels, kind), and
    /// how many identities the operator skipped. Kept instead of the whole plan, which at
    /// 65,280 identities is tens of MiB.
    waiting: Vec<(String, LabelKey, Kind)>,
    skipped: usize,
    /// Since when no kvstore-mode node has been seen.
    no_nodes_since: Option<Instant>,
    lags: VecDeque<Duration>,
    status: SyncStatus,
    /// Ids whose master key this sync wrote itself (`--reserve-in-kvstore`): while no
    /// kvstore-mode node uses one, it is sync's own, never a reason to create anything.
    own_masters: BTreeSet<u32>,
    /// The decisions as last resumed onto the plan (`Overlay`): kept while no change touches
    /// what they name, so a tick with decisions present stays incremental.
    overlay: Option<Overlay>,
    /// The plan, kept up to date change by change where a change stays local
    /// (`PlanCache`); `None`: the next round plans in full.
    cache: Option<PlanCache>,
}

/// The items the decisions change, as resumed onto the whole plan (`resume::resume`, which
/// re-validates them against each other and against Kubernetes), and what they name: the
/// kvstore ids, target ids and label sets. A change that names none of these leaves every
/// resumed item as it was (a local change moves no other item of the plan), so the overlay
/// stands until one does, or the decisions change, or the plan is made in full.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    items: HashMap<String, PlanItem>,
    ids: HashSet<u32>,
    labels: HashSet<String>,
}

impl Overlay {
    fn of(
        live: &[PlanItem],
        resumed: Vec<PlanItem>,
        decisions: &BTreeMap<String, LoggedDecision>,
    ) -> Self {
        let mut o = Overlay::default();
        // What every decision names, applied or not: a decision dropped now (its entry not
        // there yet, its target taken) may apply after a change to one of these.
        for d in decisions.values() {
            o.ids.extend(parse_id(d.id.as_bytes()).ok());
            o.ids.extend(d.target_id);
            o.labels.insert(d.labels.clone());
        }
        for (live, item) in live.iter().zip(resumed) {
            if *live == item {
                continue;
            }
            o.ids.extend(item.numeric_id());
            o.ids.extend(item.target_id);
            o.ids.extend(live.target_id);
            o.labels.insert(item.labels.clone());
            o.items.insert(item.id.clone(), item);
        }
        o
    }

    fn touched(&self, id: Option<u32>, labels: Option<&[u8]>) -> bool {
        id.is_some_and(|id| self.ids.contains(&id))
            || labels.is_some_and(|l| std::str::from_utf8(l).is_ok_and(|l| self.labels.contains(l)))
    }
}

impl SyncState {
    /// A change to id `id` (holding `labels`) makes the overlay stale if it names it.
    fn overlay_sees(&mut self, id: Option<u32>, labels: Option<&[u8]>) {
        if self.overlay.as_ref().is_some_and(|o| o.touched(id, labels)) {
            self.overlay = None;
        }
    }

    /// Master keys this sync wrote that no kvstore-mode node uses: reservations alone.
    pub fn reservations_alone(&self) -> impl Iterator<Item = u32> + '_ {
        self.own_masters.iter().copied().filter(|id| {
            self.masters
                .get(id.to_string().as_bytes())
                .is_none_or(|labels| self.counts.get(labels) == 0)
        })
    }

    /// What no kvstore-mode node uses any more and would otherwise wait for ever, to close
    /// without a write: conflicts waiting for a decision, and identities mapped to an id
    /// that does not hold their labels (a remap proposal for the same labels under another
    /// kvstore id, itself never written). Taken from `waiting`.
    pub fn moot_now(&mut self) -> Vec<(String, LabelKey, Kind)> {
        let unused = |labels: &str| self.counts.get(labels.as_bytes()) == 0;
        let mut out: Vec<(String, LabelKey, Kind)> = std::mem::take(&mut self.waiting)
            .into_iter()
            .filter(|(id, labels, _)| !self.moot.contains(id) && unused(labels))
            .collect();
        for (id, target) in &self.reused {
            let Some(labels) = self.masters.get(id.as_bytes()) else {
                continue;
            };
            let Ok(labels) = valid_label_key(labels) else {
                continue;
            };
            let held = self.k8s.get(target).is_some_and(|l| l.as_str() == labels);
            if !held && !self.moot.contains(id) && unused(labels) {
                out.push((id.clone(), labels.to_string(), Kind::Reuse));
            }
        }
        out
    }

    /// Whether the kvstore identity at `id` is only sync's own reservation.
    fn reservation_alone(&self, item: &PlanItem) -> bool {
        // Most syncs reserve nothing: no id parsed per item per tick then.
        !self.own_masters.is_empty()
            && item
                .numeric_id()
                .is_some_and(|id| self.own_masters.contains(&id))
            && self.counts.get(item.labels.as_bytes()) == 0
    }

    /// Failed creates still not made whose kvstore identity still exists.
    pub fn unwritten_now(&self) -> usize {
        self.unwritten
            .iter()
            .filter(|(t, id)| !self.k8s.contains_key(t) && self.masters.contains_key(id.as_bytes()))
            .count()
    }

    pub fn from_snapshot(snap: KvSnapshot) -> Self {
        let masters = snap.masters.into_iter().map(|m| (m.id, m.value)).collect();
        SyncState::from_kvstore(masters, snap.node_counts, snap.source.revision)
    }

    /// The kvstore as read at one revision: master keys and the nodes using each label set.
    pub fn from_kvstore(
        masters: BTreeMap<Vec<u8>, Vec<u8>>,
        counts: NodeCounts,
        kv_revision: i64,
    ) -> Self {
        SyncState {
            masters,
            counts,
            counts_changed: true,
            kv_revision,
            ..Default::default()
        }
    }

    /// With Kubernetes as listed at `version`.
    pub fn with_kubernetes(mut self, k8s: BTreeMap<u32, LabelKey>, version: String) -> Self {
        self.k8s = k8s;
        self.k8s_version = version;
        self
    }

    /// The CiliumIdentities in range as sync sees them: id and label key.
    pub fn k8s(&self) -> &BTreeMap<u32, LabelKey> {
        &self.k8s
    }

    /// The master keys as sync sees them: id and value.
    pub fn masters(&self) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        &self.masters
    }

    /// The kvstore's revision as last seen.
    pub fn kv_revision(&self) -> i64 {
        self.kv_revision
    }

    /// Kubernetes' resource version as last seen.
    pub fn k8s_version(&self) -> &str {
        &self.k8s_version
    }

    /// What waits for a decision now (id, labels, kind).
    pub fn waiting(&self) -> &[(String, LabelKey, Kind)] {
        &self.waiting
    }

    /// What sync tells about itself (the status line, the metrics).
    pub fn status(&self) -> &SyncStatus {
        &self.status
    }

    /// Closed as moot: `id` needs nothing more.
    pub fn is_moot(&self, id: &str) -> bool {
        self.moot.contains(id)
    }

    /// Where the plan reuses an object a CRD-mode agent made for these labels, by item id.
    pub fn reused(&self) -> &BTreeMap<String, u32> {
        &self.reused
    }

    pub fn plan(
        &self,
        decisions: &BTreeMap<String, LoggedDecision>,
        scope_range: crate::core::range::IdRange,
    ) -> Vec<PlanItem> {
        let masters: Vec<MasterEntry> = self
            .masters
            .iter()
            .map(|(id, v)| MasterEntry::new(id.clone(), v.clone()))
            .collect();
        let items = planner::plan_taking(masters, &self.counts, &self.k8s, scope_range);
        if decisions.is_empty() {
            items
        } else {
            resume::resume(&items, decisions, &self.k8s, scope_range).items
        }
    }

    /// Records one create's lag (from the identity appearing to its object created).
    pub fn record_lag(&mut self, lag: Duration) {
        self.status.lag_last = Some(lag);
        self.lags.push_back(lag);
        // The percentiles cover the last 10,000 creates: bounded memory over days.
        if self.lags.len() > 10_000 {
            self.lags.pop_front();
        }
    }

    /// p50 and p99 of the recent lags, for a status: computed per status, not per create,
    /// so a steady load does not sort 10,000 durations twenty times a second.
    pub fn refresh_lag_percentiles(&mut self) {
        if self.lags.is_empty() {
            return;
        }
        let mut sorted: Vec<Duration> = self.lags.iter().copied().collect();
        sorted.sort_unstable();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        self.status.lag_p50 = Some(at(0.5));
        self.status.lag_p99 = Some(at(0.99));
    }

    /// One kvstore change (`now`: when sync saw it, for the lag).
    pub fn apply_kv_change(&mut self, change: KvChange, now: Instant) {
        match change {
            KvChange::Master {
                id, value: Some(v), ..
            } => {
                self.overlay_sees(parse_id(&id).ok(), Some(&v));
                if let Some(c) = &mut self.cache
                    && !c.kv_put(&id, &v, (&self.masters, &self.k8s, &self.counts))
                {
                    self.cache = None;
                }
                let before = self.masters.insert(id.clone(), v);
                if before.is_none() {
                    self.first_seen.insert(id.clone(), now);
                }
                // A conflict closed as moot was about these labels at this id: an id the
                // kvstore now holds for others (its GC freed it, an agent took it again) is
                // a new identity, reported and decided like any other.
                if before.as_ref() != self.masters.get(&id) {
                    self.moot.remove(String::from_utf8_lossy(&id).as_ref());
                }
                if let Ok(n) = parse_id(&id) {
                    self.check_split(n, now);
                }
            }
            KvChange::Master {
                id, value: None, ..
            } => {
                let old = self.masters.get(&id).cloned();
                self.overlay_sees(parse_id(&id).ok(), old.as_deref());
                // The kvstore's GC: counted, never deleted from Kubernetes. What sync
                // remembers about the identity goes with it, so memory follows the live
                // identities over days, not every identity ever seen.
                if let Some(c) = &mut self.cache
                    && let Some(old) = self.masters.get(&id)
                    && !c.kv_delete(&id, old, &self.k8s)
                {
                    self.cache = None;
                }
                if self.masters.remove(&id).is_some() {
                    self.status.removed_from_kvstore += 1;
                }
                self.first_seen.remove(&id);
                let text = String::from_utf8_lossy(&id).into_owned();
                if let Ok(n) = parse_id(&id) {
                    self.settling.remove(&n);
                }
                self.reported.remove(&text);
                self.waited_for_decision.remove(&text);
                self.moot.remove(&text);
                if let Ok(n) = parse_id(&id) {
                    self.created.remove(&n);
                    self.deleted_after_create.remove(&n);
                    self.recreated.remove(&n);
                    self.reported.remove(&format!("deleted:{n}"));
                    self.check_split(n, now);
                }
            }
            KvChange::Slave {
                label_key,
                node,
                present: true,
            } => {
                self.counts.add_key(&label_key, &node);
                self.counts_changed = true;
            }
            KvChange::Slave {
                label_key,
                node,
                present: false,
            } => {
                self.counts.remove_key(&label_key, &node);
                self.counts_changed = true;
            }
        }
    }

    /// An object created or changed in Kubernetes.
    pub fn k8s_upsert(
        &mut self,
        id: u32,
        labels: LabelKey,
        resource_version: String,
        now: Instant,
    ) {
        self.k8s_version = resource_version;
        self.set_object(id, labels);
        self.check_split(id, now);
    }

    /// Kubernetes holds `labels` at `id` now (seen by the watch, or created by sync).
    fn set_object(&mut self, id: u32, labels: LabelKey) {
        self.overlay_sees(Some(id), Some(labels.as_bytes()));
        if let Some(l) = self.k8s.get(&id).cloned() {
            self.overlay_sees(None, Some(l.as_bytes()));
        }
        if let Some(c) = &mut self.cache
            && !c.k8s_set(
                id,
                &labels,
                self.k8s.get(&id),
                (&self.masters, &self.counts),
            )
        {
            self.cache = None;
        }
        self.k8s.insert(id, labels);
    }

    /// An object deleted in Kubernetes.
    pub fn k8s_delete(&mut self, id: u32, resource_version: String, now: Instant) {
        self.k8s_version = resource_version;
        let old = self.k8s.get(&id).cloned();
        self.overlay_sees(Some(id), old.as_deref().map(str::as_bytes));
        if let Some(c) = &mut self.cache
            && let Some(old) = self.k8s.get(&id)
            && !c.k8s_remove(id, old, (&self.masters, &self.counts))
        {
            self.cache = None;
        }
        self.k8s.remove(&id);
        if self.created.contains(&id)
            && let Some(old) = old
        {
            self.deleted_after_create.insert(id, old);
        }
        self.settle_if_held(id, now);
        self.end_split_if_over(id);
    }

    /// An object at `id` went while the kvstore (as sync last saw it) holds the identity:
    /// not made again before `RECREATE_SETTLE` has passed (`settling`).
    fn settle_if_held(&mut self, id: u32, now: Instant) {
        // Even one this sync made and would not make again now waits: whether nodes use its
        // labels is read from the same trailing view (a node's `value/` key may arrive just
        // before the kvstore's deletes).
        if self.masters.contains_key(id.to_string().as_bytes()) {
            self.settling.insert(id, now + RECREATE_SETTLE);
        }
    }

    /// Whether the object at `t`, which this sync made and something deleted since (the
    /// cluster's GC, a person), may be made again: only while kvstore-mode nodes use its
    /// labels, and only once.
    fn may_make_again(&self, t: u32, labels: &[u8]) -> bool {
        self.counts.get(labels) > 0 && !self.recreated.contains(&t)
    }

    /// A fresh list after a 410: it replaces what sync holds, and what arrived while the
    /// watch was gone is checked for splits as if watched.
    pub fn k8s_relisted(
        &mut self,
        identities: BTreeMap<u32, LabelKey>,
        resource_version: String,
        now: Instant,
    ) {
        let mut changed: Vec<u32> = identities
            .iter()
            .filter(|(id, labels)| self.k8s.get(id) != Some(labels))
            .map(|(id, _)| *id)
            .collect();
        // Objects gone meanwhile may have ended a split.
        let gone: Vec<u32> = self
            .k8s
            .keys()
            .filter(|id| !identities.contains_key(id))
            .copied()
            .collect();
        changed.extend(gone);
        // Every identity without an object in the list waits like a deleted object, seen
        // before or not: one made and deleted while the watch was gone was never seen, and
        // the view of the kvstore may still hold an identity both GCs took in that gap.
        // (Read straight off the master keys, which hold each: no lookup per identity.)
        let until = now + RECREATE_SETTLE;
        let missing = self
            .masters
            .keys()
            .filter_map(|id| parse_id(id).ok())
            .filter(|id| !identities.contains_key(id));
        self.settling.extend(missing.map(|id| (id, until)));
        self.k8s = identities;
        self.k8s_version = resource_version;
        self.cache = None;
        self.overlay = None;
        for id in changed {
            self.check_split(id, now);
        }
    }

    /// A fresh snapshot (after a compaction) keeps what sync knew and did: what was
    /// reported (conflicts, invalid entries, splits, moot closures), made (objects created,
    /// deleted since, created again), failing, counted and measured. Splits that still hold
    /// are not found again; one that began in the gap is found now; a fresh plan follows.
    pub fn carry_over(&mut self, old: SyncState, now: Instant) {
        let fresh = std::mem::take(&mut self.status);
        // The world's sizes are the fresh read's; the counters go on. (The count of splits
        // now is set below, from the splits that still hold.)
        self.status = SyncStatus {
            identities: fresh.identities,
            kvstore_nodes: fresh.kvstore_nodes,
            ..old.status
        };
        self.created = old.created;
        self.deleted_after_create = old.deleted_after_create;
        self.recreated = old.recreated;
        self.in_flight = old.in_flight;
        self.failed = old.failed;
        self.settling = old.settling;
        self.unwritten = old.unwritten;
        self.reported = old.reported;
        self.waited_for_decision = old.waited_for_decision;
        self.moot = old.moot;
        self.lags = old.lags;
        self.own_masters = old.own_masters;
        self.reused = old.reused;
        self.skipped = old.skipped;
        self.first_seen = old
            .first_seen
            .into_iter()
            .filter(|(id, _)| self.masters.contains_key(id))
            .collect();
        self.splits = old
            .splits
            .into_iter()
            .filter(|id| self.is_split(*id))
            .collect();
        self.status.splits = self.splits.len();
        self.splits_to_report = old.splits_to_report;
        let both: Vec<u32> = self.k8s.keys().copied().collect();
        for id in both {
            self.check_split(id, now);
        }
        self.cache = None;
    }

    /// Whether `id` is split now: Kubernetes holds it for other labels than the kvstore.
    pub fn is_split(&self, id: u32) -> bool {
        let Some(k8s_labels) = self.k8s.get(&id) else {
            return false;
        };
        let Some(kv_value) = self.masters.get(id.to_string().as_bytes()) else {
            return false;
        };
        // Sync's own objects are no exception: a kvstore-mode agent can hand out an id that
        // sync used as a remap target (the kvstore did not hold it), and that is a split too.
        valid_label_key(kv_value).is_ok_and(|kv| kv != k8s_labels.as_str())
    }

    /// A split allocation: Kubernetes holds `id` for other labels than the kvstore. Found
    /// once per occurrence (a split that ends, by the kvstore's GC or the object's deletion,
    /// and comes back is found again); reported once the nodes that use the kvstore's
    /// labels can be named (an agent writes its `value/` key just after the master key).
    pub fn check_split(&mut self, id: u32, now: Instant) {
        if !self.is_split(id) {
            self.end_split_if_over(id);
            return;
        }
        if !self.splits.insert(id) {
            return;
        }
        self.status.splits = self.splits.len();
        self.status.splits_found += 1;
        self.splits_to_report.push((id, now));
    }

    /// A split that no longer holds leaves the count of splits now.
    fn end_split_if_over(&mut self, id: u32) {
        if !self.is_split(id) && self.splits.remove(&id) {
            self.status.splits = self.splits.len();
        }
    }

    /// One round: the plan (kept up to date, or made in full when a change was not local,
    /// and always with decisions to replay), the creates it makes and what it reports; the
    /// counts published.
    pub fn round(
        &mut self,
        decisions: &mut Decisions,
        range: crate::core::range::IdRange,
        accept_proposals: bool,
        now: Instant,
    ) -> (Vec<Op>, Vec<SyncReport>) {
        let (cache, rebuilt) = match self.cache.take() {
            Some(c) if c.range() == range => (c, false),
            _ => {
                let items = self.plan(&BTreeMap::new(), range);
                (
                    PlanCache::build(items, &self.masters, &self.k8s, range),
                    true,
                )
            }
        };
        let mut resumed_now = false;
        let mut refusals = Vec::new();
        if decisions.is_empty() {
            self.overlay = None;
        } else if rebuilt || self.overlay.is_none() {
            resumed_now = true;
            // The decisions resumed onto the whole plan: in full now, kept until a change
            // names what they touch.
            let live: Vec<PlanItem> = cache.items().cloned().collect();
            let resumed = resume::resume(&live, decisions.in_force(), &self.k8s, range);
            refusals = self.refusals(&live, resumed.dropped, decisions);
            self.overlay = Some(Overlay::of(&live, resumed.items, decisions.in_force()));
        }
        let overlay = self.overlay.take();
        let items = || {
            cache.items().map(|i| {
                overlay
                    .as_ref()
                    .and_then(|o| o.items.get(&i.id))
                    .unwrap_or(i)
            })
        };
        let mut out = self.select_writes(items(), accept_proposals, now, decisions);
        // The refusals before the conflicts they send back to waiting.
        refusals.append(&mut out.1);
        out.1 = refusals;
        if rebuilt || resumed_now {
            self.publish(items());
        } else {
            // A local change makes no skip and no reuse: only the counts move.
            self.status.identities = cache.len();
            self.status.kvstore_nodes = self.counts.nodes().count();
        }
        self.overlay = overlay;
        self.cache = Some(cache);
        out
    }

    /// The decisions resume dropped, as reports: each once (until decided again), and only
    /// for an identity the plan still holds (a decision on one the kvstore no longer holds,
    /// from an older log, has nothing left to carry out).
    fn refusals(
        &mut self,
        live: &[PlanItem],
        dropped: Vec<resume::Dropped>,
        decisions: &mut Decisions,
    ) -> Vec<SyncReport> {
        let mut out = Vec::new();
        if dropped.is_empty() {
            return out;
        }
        let kinds: HashMap<&str, Kind> = live.iter().map(|i| (i.id.as_str(), i.kind)).collect();
        for d in dropped {
            let (Some(decision), Some(&kind)) = (decisions.get(&d.id), kinds.get(d.id.as_str()))
            else {
                continue;
            };
            let reason = format!("{}; it waits for a decision again", d.reason);
            if let Some(r) = refuse(decisions, decision.clone(), kind, reason) {
                // Waiting again: its conflict is said again, with the fresh proposal.
                self.reported.remove(&d.id);
                out.push(r);
            }
        }
        out
    }

    /// The plan as the last round saw it: kept up to date, with the decisions resumed onto it.
    pub fn planned_items(&self) -> Vec<PlanItem> {
        let Some(cache) = &self.cache else {
            return Vec::new();
        };
        cache
            .items()
            .map(|i| {
                self.overlay
                    .as_ref()
                    .and_then(|o| o.items.get(&i.id))
                    .unwrap_or(i)
                    .clone()
            })
            .collect()
    }

    /// The creates this round makes: plain creates and decided (or accepted) remaps and
    /// duplicates whose target is free, not in flight and not failing; conflicts and invalid
    /// entries are reported once each.
    pub fn select_writes<'a>(
        &mut self,
        items: impl Iterator<Item = &'a PlanItem>,
        accept_proposals: bool,
        now: Instant,
        decisions: &mut Decisions,
    ) -> (Vec<Op>, Vec<SyncReport>) {
        expire(&mut self.failed, now);
        expire(&mut self.settling, now);
        self.waiting.clear();
        let mut claimed_labels: HashSet<String> = self.in_flight.values().cloned().collect();
        let mut ops = Vec::new();
        let mut reports = Vec::new();
        let mut pending = 0;
        for item in items {
            if item.kind == Kind::Invalid {
                if self.reported.insert(item.id.clone()) {
                    reports.push(SyncReport::Invalid {
                        id: item.id.clone(),
                        labels: item.labels.clone(),
                        reason: item.reason.to_string(),
                    });
                }
                continue;
            }
            if self.reservation_alone(item) {
                // Sync's own master key (the object it reserved went, by the operator's GC):
                // nothing to create, nothing to decide; a decision on it is refused, once.
                if item.decided && item.action == Action::Create {
                    let why = "the kvstore holds this id only as this sync's own reservation (the object it reserved was deleted since): nothing to create";
                    reports.extend(refuse_once(
                        decisions,
                        item,
                        item.target_id,
                        why.to_string(),
                    ));
                }
                continue;
            }
            let waiting = item.kind.needs_decision() && !item.decided && !accept_proposals;
            if waiting && self.moot.contains(&item.id) {
                continue;
            }
            if waiting && item.action == Action::Create {
                pending += 1;
                // Its lag would count the operator's time: measured apart.
                self.waited_for_decision.insert(item.id.clone());
                self.waiting
                    .push((item.id.clone(), item.labels.clone(), item.kind));
                if self.reported.insert(item.id.clone()) {
                    reports.push(SyncReport::Conflict {
                        id: item.id.clone(),
                        kind: item.kind,
                        reason: item.reason.to_string(),
                    });
                }
                continue;
            }
            let (Action::Create, Some(t)) = (item.action, item.target_id) else {
                continue;
            };
            // One object per label set: not while a create of the same labels (for another
            // kvstore id that the kvstore's GC removed since) is still in flight, nor twice
            // in one round.
            if self.k8s.contains_key(&t)
                || self.in_flight.contains_key(&t)
                || self.failed.contains_key(&t)
                || self.settling.contains_key(&t)
                || claimed_labels.contains(item.labels.as_str())
            {
                continue;
            }
            if self.deleted_after_create.get(&t) == Some(&item.labels)
                && !self.make_again(item, t, decisions, &mut reports)
            {
                continue;
            }
            ops.push(create_op(item, t));
            claimed_labels.insert(item.labels.clone());
        }
        self.status.pending = pending;
        for op in &ops {
            if let Some(t) = op.target_id {
                self.in_flight.insert(t, op.label_key.clone());
            }
        }
        (ops, reports)
    }

    /// An object this sync made at `t` for `item`'s labels, deleted since: whether it is made
    /// again now (counted), or held back by the make-again-once rule (counted once, and a
    /// decision on it refused once).
    fn make_again(
        &mut self,
        item: &PlanItem,
        t: u32,
        decisions: &mut Decisions,
        reports: &mut Vec<SyncReport>,
    ) -> bool {
        if !self.may_make_again(t, item.labels.as_bytes()) {
            if self.reported.insert(format!("deleted:{t}")) {
                self.status.deleted_not_recreated += 1;
            }
            if item.decided {
                let why = format!(
                    "its object at {t}, made by this sync, was deleted since and no kvstore-mode node uses these labels; made again if one does"
                );
                reports.extend(refuse_once(decisions, item, Some(t), why));
            }
            return false;
        }
        self.recreated.insert(t);
        self.status.recreated += 1;
        true
    }

    /// What the latest plan says beyond the writes: skips, reuses, counts.
    pub fn publish<'a>(&mut self, items: impl Iterator<Item = &'a PlanItem> + Clone) {
        self.skipped = items
            .clone()
            .filter(|i| i.decided && i.action == Action::Skip)
            .count();
        // Kvstore ids the plan serves at another id that already holds their labels: mapped
        // there, or a create there made already (by a CRD-mode agent, another sync, or this
        // one before a crash cut its outcome line off).
        let k8s = &self.k8s;
        self.reused = items
            .clone()
            .filter_map(|i| i.target_id.map(|t| (i, t)))
            .filter(|(i, t)| {
                i.action == Action::None
                    || (i.action == Action::Create
                        && k8s.get(t).is_some_and(|l| l.as_str() == i.labels))
            })
            .filter(|(i, t)| !same_id(&i.id, *t))
            .map(|(i, t)| (i.id.clone(), t))
            .collect();
        self.status.identities = items.count();
        self.status.kvstore_nodes = self.counts.nodes().count();
    }

    /// Folds a batch's outcomes in. `batch_failed`: the batch as a whole failed (e.g. its
    /// log lines could not be written), so nothing of it was written; `halted`: why the
    /// executor stopped it. Everything not written is tried again after `RETRY_AFTER`.
    pub fn take_results(&mut self, ops: Vec<Op>, outcome: BatchOutcome, now: Instant) -> Taken {
        let labels: HashMap<u32, (String, String)> = ops
            .into_iter()
            .filter_map(|o| o.target_id.map(|t| (t, (o.id, o.label_key))))
            .collect();
        for t in labels.keys() {
            self.in_flight.remove(t);
        }
        let mut taken = Taken::default();
        let results = match outcome {
            BatchOutcome::Failed(why) => {
                // No write without its log line: nothing of this batch was written.
                for (t, (id, _)) in &labels {
                    self.failed.insert(*t, now + RETRY_AFTER);
                    self.unwritten.insert(*t, id.clone());
                }
                self.status.failures += labels.len() as u64;
                taken.failures = labels.len() as u64;
                taken.trouble = Some(format!(
                    "{} writes not made: {why}; trying again in {} s",
                    labels.len(),
                    RETRY_AFTER.as_secs()
                ));
                return taken;
            }
            BatchOutcome::Done { results, halted } => {
                taken.trouble =
                    halted.map(|why| format!("{why}; trying again in {} s", RETRY_AFTER.as_secs()));
                results
            }
        };
        for (t, outcome) in results {
            let Some((id, label_key)) = labels.get(&t) else {
                continue;
            };
            match outcome {
                Outcome::Created | Outcome::AlreadyExisted => {
                    self.unwritten.remove(&t);
                    self.set_object(t, label_key.clone());
                    // A remap target a kvstore-mode agent took meanwhile is split now: found
                    // at once, not when the watch shows sync its own object.
                    self.check_split(t, now);
                    if outcome == Outcome::Created {
                        self.created.insert(t);
                        self.status.mirrored += 1;
                        taken.mirrored += 1;
                    }
                    let waited = self.waited_for_decision.remove(id.as_str());
                    if let Some(seen) = self.first_seen.remove(id.as_bytes()) {
                        let lag = now.duration_since(seen);
                        if waited {
                            // From arrival to write, most of it a person deciding: not lag.
                            self.status.decision_wait_last = Some(lag);
                        } else {
                            self.record_lag(lag);
                            taken.lags.push(lag);
                        }
                    }
                }
                Outcome::Failed | Outcome::Conflict => {
                    self.status.failures += 1;
                    taken.failures += 1;
                    // Try again later; a conflict resolves itself once the watch shows the
                    // object.
                    self.failed.insert(t, now + RETRY_AFTER);
                    self.unwritten.insert(t, id.clone());
                }
                // Not attempted (the batch was halted): tried again with the failed ones.
                Outcome::NotAttempted => {
                    self.failed.insert(t, now + RETRY_AFTER);
                    self.unwritten.insert(t, id.clone());
                }
                _ => {}
            }
        }
        taken
    }
}

/// Drops the waits over by `now` (a failed write's, a deleted object's); whether any was.
fn expire(waits: &mut HashMap<u32, Instant>, now: Instant) -> bool {
    let before = waits.len();
    waits.retain(|_, until| *until > now);
    waits.len() < before
}

/// Whether the kvstore id text is exactly `t` in decimal (without allocating: this runs for
/// every identity at every round).
fn same_id(id: &str, t: u32) -> bool {
    let digits = t.checked_ilog10().unwrap_or(0) as usize + 1;
    id.len() == digits && id.parse::<u32>() == Ok(t)
}

/// How long a failed write waits before it is tried again (on sync's timer).
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// How long an object deleted in Kubernetes while the kvstore held its identity waits
/// before sync makes it again: well above how far sync's view of the kvstore lags behind
/// (p99 under a second at 65,280 identities on the real server), and short beside the
/// seconds a CRD-mode agent needs to hand the freed id out again.
pub const RECREATE_SETTLE: Duration = Duration::from_secs(2);

/// What a round reports besides its writes (once per identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncReport {
    /// A malformed kvstore entry, never written.
    Invalid {
        id: String,
        labels: String,
        reason: String,
    },
    /// A conflict that waits for a decision.
    Conflict {
        id: String,
        kind: Kind,
        reason: String,
    },
    /// A decision that cannot be carried out as decided (its target taken since, its
    /// labels changed, its labels reached Kubernetes elsewhere): logged as refused with the
    /// reason, once per decision; the identity waits for a decision again.
    Refused {
        decision: LoggedDecision,
        kind: Kind,
        reason: String,
    },
}

impl SyncReport {
    /// How a refused decision reads, in the log and to the operator.
    pub fn refused_text(decision: &LoggedDecision, reason: &str) -> String {
        let what = match (decision.action, decision.target_id) {
            (Action::Create, Some(t)) => format!("create at {t}"),
            (Action::None, Some(t)) => format!("map to {t}"),
            (Action::Skip, _) => "skip".to_string(),
            (a, t) => format!("{a:?} {t:?}").to_lowercase(),
        };
        format!(
            "the decision on {} ({what}) cannot be carried out: {reason}",
            decision.id
        )
    }
}

/// How a batch of writes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Nothing was written (the reason).
    Failed(String),
    /// Each target's outcome, and why the batch was halted early, if it was.
    Done {
        results: Vec<(u32, Outcome)>,
        halted: Option<String>,
    },
}

/// What folding a batch in changed, for the metrics and the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    pub trouble: Option<String>,
    pub mirrored: u64,
    pub failures: u64,
    pub lags: Vec<Duration>,
}

/// The create of `item` at `t`, and who decided it.
fn create_op(item: &PlanItem, t: u32) -> Op {
    Op {
        id: item.id.clone(),
        label_key: item.labels.clone(),
        kind: item.kind,
        op: OpKind::Create,
        target_id: Some(t),
        decided_by: if item.decided {
            DecidedBy::Operator
        } else if item.kind.needs_decision() {
            DecidedBy::AcceptProposals
        } else {
            DecidedBy::Proposal
        },
        expect: None,
        reason: None,
    }
}

/// A decided item that the rules hold back (`why`): said once per decision, as a refusal,
/// so the decision does not end in silence. It stays in force (carried out if what holds it
/// back goes).
fn refuse_once(
    decisions: &mut Decisions,
    item: &PlanItem,
    target_id: Option<u32>,
    why: String,
) -> Option<SyncReport> {
    let decision = LoggedDecision {
        id: item.id.clone(),
        labels: item.labels.clone(),
        action: item.action,
        target_id,
    };
    refuse(decisions, decision, item.kind, why)
}

/// A refusal of `decision`, once: `None` when this very decision was refused already.
fn refuse(
    decisions: &mut Decisions,
    decision: LoggedDecision,
    kind: Kind,
    reason: String,
) -> Option<SyncReport> {
    decisions.refuse(&decision).then_some(SyncReport::Refused {
        decision,
        kind,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    use super::*;
    use crate::core::range::IdRange;

    /// Label sets the simulated agents allocate; the last is malformed (never written).
    const LABELS: [&str; 6] = [
        "k8s:app=a;",
        "k8s:app=b;",
        "k8s:app=c;",
        "k8s:app=d;",
        "k8s:app=e;",
        "not a label key",
    ];

    #[derive(Debug, Clone)]
    enum Event {
        /// A kvstore-mode agent writes `id/<n>`.
        KvPut(u32, usize),
        /// The kvstore's GC removes `id/<n>`.
        KvDelete(u32),
        /// A CRD-mode agent creates an object (if the name is free).
        AgentCreate(u32, usize),
        /// The cluster's GC deletes an object.
        ObjectDelete(u32),
        /// Sync's settle tick: plan and select the writes.
        Round,
        /// The writes in flight complete (or fail).
        Complete { fail: bool },
    }

    fn event() -> impl Strategy<Value = Event> {
        // 250..262 straddles the range's start (256): some ids are out of range.
        let id = 250u32..262;
        prop_oneof![
            3 => (id.clone(), 0..LABELS.len()).prop_map(|(i, l)| Event::KvPut(i, l)),
            1 => id.clone().prop_map(Event::KvDelete),
            2 => (id.clone(), 0..LABELS.len() - 1).prop_map(|(i, l)| Event::AgentCreate(i, l)),
            1 => id.prop_map(Event::ObjectDelete),
            3 => Just(Event::Round),
            2 => any::<bool>().prop_map(|fail| Event::Complete { fail }),
        ]
    }

    /// The world around sync, and what sync did in it.
    #[derive(Default)]
    struct World {
        k8s: BTreeMap<u32, LabelKey>,
        in_flight: Vec<Op>,
        /// The objects sync created that still exist.
        created: BTreeMap<u32, LabelKey>,
        /// What the kvstore holds at each id.
        kv: BTreeMap<u32, String>,
        /// Ids split after the last event, and how many times each became split.
        split_now: BTreeSet<u32>,
        occurrences: BTreeMap<u32, usize>,
        splits_found: Vec<u32>,
    }

    impl World {
        /// Counts the splits that began with the last event: an id both sides hold, the
        /// kvstore's labels well-formed and other than Kubernetes'.
        fn count_splits(&mut self) {
            let now: BTreeSet<u32> = self
                .k8s
                .iter()
                .filter(|(id, l)| {
                    self.kv.get(id).is_some_and(|kv| {
                        valid_label_key(kv.as_bytes()).is_ok_and(|kv| kv != l.as_str())
                    })
                })
                .map(|(id, _)| *id)
                .collect();
            for id in now.difference(&self.split_now) {
                *self.occurrences.entry(*id).or_default() += 1;
            }
            self.split_now = now;
        }
    }

    /// `id/<id>` written with `labels`, as the kvstore's watch tells it.
    fn put(id: &str, labels: &str) -> KvChange {
        KvChange::Master {
            id: id.as_bytes().to_vec(),
            value: Some(labels.as_bytes().to_vec()),
            created: true,
        }
    }

    fn run(events: Vec<Event>, accept_proposals: bool) -> Result<(), TestCaseError> {
        run_with(events, accept_proposals, &BTreeMap::new())
    }

    fn run_with(
        events: Vec<Event>,
        accept_proposals: bool,
        in_force: &BTreeMap<String, LoggedDecision>,
    ) -> Result<(), TestCaseError> {
        let mut decisions = Decisions::new(in_force.clone());
        let mut sync = SyncState::default();
        let mut w = World::default();
        let mut now = Instant::now();
        for ev in events {
            now += Duration::from_millis(100);
            match ev {
                Event::KvPut(id, l) => {
                    w.kv.insert(id, LABELS[l].to_string());
                    let change = KvChange::Master {
                        id: id.to_string().into_bytes(),
                        value: Some(LABELS[l].as_bytes().to_vec()),
                        created: true,
                    };
                    sync.apply_kv_change(change, now);
                }
                Event::KvDelete(id) => {
                    w.kv.remove(&id);
                    let change = KvChange::Master {
                        id: id.to_string().into_bytes(),
                        value: None,
                        created: false,
                    };
                    sync.apply_kv_change(change, now);
                }
                Event::AgentCreate(id, l) => {
                    if let std::collections::btree_map::Entry::Vacant(free) = w.k8s.entry(id) {
                        free.insert(LABELS[l].to_string());
                        sync.k8s_upsert(id, LABELS[l].to_string(), String::new(), now);
                    }
                }
                Event::ObjectDelete(id) => {
                    w.created.remove(&id);
                    if w.k8s.remove(&id).is_some() {
                        sync.k8s_delete(id, String::new(), now);
                    }
                }
                Event::Round => round(
                    &mut sync,
                    &mut w,
                    &mut decisions,
                    in_force,
                    accept_proposals,
                    now,
                )?,
                Event::Complete { fail } => complete(&mut sync, &mut w, fail, now),
            }
            w.splits_found
                .extend(sync.splits_to_report.drain(..).map(|(id, _)| id));
            w.count_splits();
            prop_assert_eq!(
                sync.status.splits,
                w.split_now.len(),
                "the count of splits now is not the splits there are"
            );
        }
        check_end(&w, &sync, accept_proposals || !decisions.is_empty())
    }

    /// A round: its writes are checked against the world, then go in flight. The plan kept
    /// up to date change by change, with the decisions kept resumed onto it, is the plan
    /// made in full with them resumed (node counts aside: the cache does not keep them).
    fn round(
        sync: &mut SyncState,
        w: &mut World,
        decisions: &mut Decisions,
        in_force: &BTreeMap<String, LoggedDecision>,
        accept_proposals: bool,
        now: Instant,
    ) -> Result<(), TestCaseError> {
        let range = IdRange::for_cluster(0).unwrap();
        let (ops, _) = sync.round(decisions, range, accept_proposals, now);
        let full = sync.plan(in_force, range);
        let cached: Vec<PlanItem> = sync.planned_items();
        let strip = |items: &[PlanItem]| -> Vec<PlanItem> {
            items
                .iter()
                .cloned()
                .map(|mut i| {
                    i.nodes = 0;
                    i
                })
                .collect()
        };
        prop_assert_eq!(strip(&cached), strip(&full));
        for op in &ops {
            let t = op.target_id.unwrap();
            prop_assert!(range.contains(t), "a write outside the range: {op:?}");
            prop_assert!(
                valid_label_key(op.label_key.as_bytes()).is_ok(),
                "a malformed write: {op:?}"
            );
            prop_assert!(parse_id(op.id.as_bytes()).is_ok(), "a malformed id: {op:?}");
            let elsewhere = w.k8s.iter().any(|(id, l)| *l == op.label_key && *id != t)
                || w.in_flight.iter().any(|o| o.label_key == op.label_key);
            // A duplicate the operator decided to create is the one allowed.
            let decided = op.decided_by == DecidedBy::Operator;
            prop_assert!(
                accept_proposals || decided || !elsewhere,
                "a second object for {}: {op:?}, world {:?}",
                op.label_key,
                w.k8s
            );
        }
        w.in_flight.extend(ops);
        Ok(())
    }

    /// The batch in flight completes (or fails as a whole), as the API server answers it.
    fn complete(sync: &mut SyncState, w: &mut World, fail: bool, now: Instant) {
        let ops = std::mem::take(&mut w.in_flight);
        let mut results = Vec::new();
        for op in &ops {
            let t = op.target_id.unwrap();
            let outcome = match w.k8s.get(&t) {
                _ if fail => Outcome::Failed,
                Some(l) if *l == op.label_key => Outcome::AlreadyExisted,
                Some(_) => Outcome::Conflict,
                None => {
                    w.k8s.insert(t, op.label_key.clone());
                    w.created.insert(t, op.label_key.clone());
                    Outcome::Created
                }
            };
            results.push((t, outcome));
        }
        let outcome = BatchOutcome::Done {
            results,
            halted: None,
        };
        sync.take_results(ops, outcome, now);
        // Sync's own creates reach it again through its watch.
        for (id, l) in &w.k8s {
            sync.k8s_upsert(*id, l.clone(), String::new(), now);
        }
    }

    /// At the end: every split found once, and at most one object per label set created
    /// unless proposals were accepted or decisions taken (`decided`).
    fn check_end(w: &World, sync: &SyncState, decided: bool) -> Result<(), TestCaseError> {
        // Every occurrence of a split found exactly once: none missed, none twice.
        let mut found: BTreeMap<u32, usize> = BTreeMap::new();
        for id in &w.splits_found {
            *found.entry(*id).or_default() += 1;
        }
        prop_assert_eq!(
            &found,
            &w.occurrences,
            "splits found vs splits that occurred"
        );
        prop_assert_eq!(sync.status.splits_found as usize, w.splits_found.len());
        // Of the objects sync created, at most one per label set exists (one deleted since
        // may have been followed by another, for a kvstore id still in use); an operator's
        // decision to create may make a second on purpose.
        if !decided {
            let mut per_labels: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
            for (id, labels) in &w.created {
                per_labels.entry(labels.as_str()).or_default().push(*id);
            }
            for (labels, ids) in per_labels {
                prop_assert!(ids.len() <= 1, "{labels} exists at {ids:?}");
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// For any interleaving of kvstore and Kubernetes changes and write outcomes, sync
        /// never creates two objects for one label set, never writes a malformed entry or
        /// an id outside the range, and reports every split exactly once.
        #[test]
        fn any_interleaving_keeps_the_invariants(events in proptest::collection::vec(event(), 1..80)) {
            run(events, false)?;
        }

        /// With decisions present (skips, a create at a chosen id), the plan stays incremental
        /// and equal to the plan made in full with the decisions resumed, after any change.
        #[test]
        fn decisions_keep_the_plan_incremental_and_exact(events in proptest::collection::vec(event(), 1..80)) {
            let mut decisions = BTreeMap::new();
            let decide = |id: u32, l: usize, action, target| LoggedDecision {
                id: id.to_string(),
                labels: LABELS[l].to_string(),
                action,
                target_id: target,
            };
            decisions.insert("256".into(), decide(256, 0, Action::Skip, None));
            decisions.insert("257".into(), decide(257, 1, Action::Create, Some(261)));
            decisions.insert("258".into(), decide(258, 2, Action::Create, Some(258)));
            run_with(events, false, &decisions)?;
        }

        /// With every proposal accepted (duplicates are then created on purpose), writes stay
        /// well-formed and in range, and splits are still reported exactly once.
        #[test]
        fn accepting_proposals_keeps_writes_well_formed(events in proptest::collection::vec(event(), 1..80)) {
            run(events, true)?;
        }
    }

    #[test]
    fn a_mapping_to_a_proposal_never_written_is_moot_once_no_node_uses_it() {
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        let node = |present| KvChange::Slave {
            label_key: b"k8s:app=r;".to_vec(),
            node: b"node-1".to_vec(),
            present,
        };
        // Two kvstore agents allocated `r` at 300 and 301, and CRD-mode agents hold both ids
        // for other labels: 300 gets a remap proposal, 301 is mapped to where it would go.
        sync.apply_kv_change(put("300", "k8s:app=r;"), t0);
        sync.apply_kv_change(put("301", "k8s:app=r;"), t0);
        sync.apply_kv_change(node(true), t0);
        sync.k8s_upsert(300, "k8s:app=x;".into(), String::new(), t0);
        sync.k8s_upsert(301, "k8s:app=y;".into(), String::new(), t0);
        sync.round(&mut Decisions::default(), range, false, t0);
        let target = sync.reused.get("301").copied().expect("301 mapped");
        assert!(!sync.k8s.contains_key(&target));
        // While node-1 uses `r`, nothing is moot.
        assert!(sync.moot_now().is_empty());
        sync.round(&mut Decisions::default(), range, false, t0);
        // node-1 moves: the proposal and the mapping to it are both moot.
        sync.apply_kv_change(node(false), t0);
        let moot: Vec<(String, Kind)> = sync
            .moot_now()
            .into_iter()
            .map(|(id, _, kind)| (id, kind))
            .collect();
        assert_eq!(
            moot,
            [("300".into(), Kind::Remap), ("301".into(), Kind::Reuse)]
        );
    }

    #[test]
    fn an_id_the_kvstore_frees_and_gives_to_other_labels_is_no_longer_moot() {
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        let gone = KvChange::Master {
            id: b"300".to_vec(),
            value: None,
            created: false,
        };
        let node = |labels: &str, present| KvChange::Slave {
            label_key: labels.as_bytes().to_vec(),
            node: b"node-1".to_vec(),
            present,
        };
        // 300 `r` is a remap no node uses any more: closed as moot.
        sync.k8s_upsert(300, "k8s:app=x;".into(), String::new(), t0);
        sync.apply_kv_change(put("300", "k8s:app=r;"), t0);
        sync.round(&mut Decisions::default(), range, false, t0);
        let moot: Vec<String> = sync.moot_now().into_iter().map(|(id, ..)| id).collect();
        assert_eq!(moot, ["300"]);
        sync.moot.insert("300".into());
        sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(sync.status.pending, 0, "closed");
        // The kvstore's GC frees 300 and an agent takes it for `s`, which node-1 uses and
        // Kubernetes still holds for `x`: a new conflict, pending and reported.
        for change in [gone, put("300", "k8s:app=s;"), node("k8s:app=s;", true)] {
            sync.apply_kv_change(change, t0);
        }
        assert!(!sync.moot.contains("300"));
        let (_, reports) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(sync.status.pending, 1, "{reports:?}");
        // The same without the delete between (a compaction hid it): labels changed in place.
        sync.moot.insert("300".into());
        sync.apply_kv_change(put("300", "k8s:app=t;"), t0);
        assert!(!sync.moot.contains("300"));
        // Unchanged labels keep the closure.
        sync.moot.insert("300".into());
        sync.apply_kv_change(put("300", "k8s:app=t;"), t0);
        assert!(sync.moot.contains("300"));
    }

    #[test]
    fn cutover_always_says_what_it_waits_for() {
        let grace = Duration::from_secs(120);
        let mut st = SyncStatus {
            kvstore_nodes: 2,
            ..Default::default()
        };
        let none = (0, true, false);
        let wait = |st: &SyncStatus, since: Option<u64>, w, last| {
            cutover_wait(st, since.map(Duration::from_secs), grace, w, last)
        };
        assert_eq!(wait(&st, None, none, None), Some(CutoverWait::Nodes(2)));
        st.kvstore_nodes = 0;
        assert_eq!(
            wait(&st, Some(20), none, None),
            Some(CutoverWait::Grace {
                left: Duration::from_secs(100)
            })
        );
        assert!(
            wait(&st, Some(20), none, None)
                .unwrap()
                .to_string()
                .contains("100s")
        );
        assert_eq!(
            wait(&st, Some(120), (0, false, false), None),
            Some(CutoverWait::Lease)
        );
        st.pending = 3;
        assert_eq!(
            wait(&st, Some(120), none, None),
            Some(CutoverWait::Decisions(3))
        );
        st.pending = 0;
        assert_eq!(
            wait(&st, Some(120), (4, true, false), None),
            Some(CutoverWait::Writes(4))
        );
        assert_eq!(
            wait(&st, Some(120), (0, true, true), None),
            Some(CutoverWait::Checking)
        );
        // Nothing left but a check: none yet, or the last one's problems.
        assert_eq!(wait(&st, Some(120), none, None), None);
        let failed = CutoverWait::Verify {
            problems: 2,
            first: "2203 different".into(),
        };
        assert_eq!(
            wait(&st, Some(120), none, Some(&failed)),
            Some(failed.clone())
        );
        assert_eq!(failed.reason(), "verify");
        assert!(CutoverWait::REASONS.contains(&failed.reason()));
    }

    #[test]
    fn syncs_own_reservation_is_never_a_reason_to_create() {
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        // Sync reserved 4000 for an object a CRD-mode agent made; the operator's GC deleted
        // the object since, and with it the `value/` key: the master key is left.
        sync.apply_kv_change(
            KvChange::Master {
                id: b"4000".to_vec(),
                value: Some(b"k8s:app=b;".to_vec()),
                created: true,
            },
            t0,
        );
        sync.own_masters.insert(4000);
        let (ops, reports) = sync.round(&mut Decisions::default(), range, false, t0);
        assert!(ops.is_empty(), "{ops:?}");
        assert!(reports.is_empty());
        assert_eq!(sync.reservations_alone().collect::<Vec<_>>(), [4000]);
        // A kvstore-mode agent that uses the id makes it a kvstore identity like any other.
        sync.apply_kv_change(
            KvChange::Slave {
                label_key: b"k8s:app=b;".to_vec(),
                node: b"node-1".to_vec(),
                present: true,
            },
            t0,
        );
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(
            ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
            [Some(4000)]
        );
        assert_eq!(sync.reservations_alone().count(), 0);
    }

    #[test]
    fn a_decision_wait_is_not_lag() {
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        // 300 needs a decision (Kubernetes holds its id for other labels); 301 does not.
        sync.k8s_upsert(300, "k8s:app=z;".into(), String::new(), t0);
        for (id, l) in [("300", "k8s:app=a;"), ("301", "k8s:app=b;")] {
            sync.apply_kv_change(
                KvChange::Master {
                    id: id.as_bytes().to_vec(),
                    value: Some(l.as_bytes().to_vec()),
                    created: true,
                },
                t0,
            );
        }
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(ops.len(), 1);
        let t1 = t0 + Duration::from_millis(50);
        let done = |ops: &[Op]| BatchOutcome::Done {
            results: ops
                .iter()
                .map(|o| (o.target_id.unwrap(), Outcome::Created))
                .collect(),
            halted: None,
        };
        sync.take_results(ops.clone(), done(&ops), t1);
        // The operator decides 35 s later: accepted as proposed.
        let t2 = t0 + Duration::from_secs(35);
        let (ops, _) = sync.round(&mut Decisions::default(), range, true, t2);
        assert_eq!(ops.len(), 1, "{ops:?}");
        sync.take_results(ops.clone(), done(&ops), t2);
        sync.refresh_lag_percentiles();
        assert_eq!(sync.status.lag_p99, Some(Duration::from_millis(50)));
        assert_eq!(
            sync.status.decision_wait_last,
            Some(Duration::from_secs(35))
        );
    }

    #[test]
    fn a_fresh_snapshot_keeps_what_was_reported_made_and_counted() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let mut old = SyncState::default();
        old.apply_kv_change(put("300", "k8s:app=a;"), t0);
        old.apply_kv_change(put("301", "k8s:app=b;"), t0);
        old.k8s_upsert(301, "k8s:app=z;".into(), String::new(), t0);
        let (ops, reports) = old.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(ops.len(), 1);
        assert_eq!(reports.len(), 1, "301's remap waits: {reports:?}");
        let done = BatchOutcome::Done {
            results: vec![(300, Outcome::Created)],
            halted: None,
        };
        old.take_results(ops, done, t0);
        old.k8s_upsert(300, "k8s:app=a;".into(), String::new(), t0);
        old.splits_to_report.clear();
        assert_eq!((old.status.mirrored, old.status.splits_found), (1, 1));

        // The same world read again, plus a split that began in the gap (302).
        let mut fresh = SyncState::default();
        for (id, l) in [
            ("300", "k8s:app=a;"),
            ("301", "k8s:app=b;"),
            ("302", "k8s:app=c;"),
        ] {
            fresh
                .masters
                .insert(id.as_bytes().to_vec(), l.as_bytes().to_vec());
        }
        fresh.k8s = old.k8s.clone();
        fresh.k8s.insert(302, "k8s:app=y;".into());
        (fresh.status.identities, fresh.status.kvstore_nodes) = (3, 4);
        old.status.identities = 2;
        fresh.carry_over(old, t0);
        assert_eq!(fresh.status.mirrored, 1, "the count goes on");
        assert_eq!(
            (fresh.status.identities, fresh.status.kvstore_nodes),
            (3, 4),
            "the world's sizes are the fresh read's"
        );
        assert!(fresh.created.contains(&300), "what sync made is remembered");
        assert_eq!(
            fresh
                .splits_to_report
                .iter()
                .map(|(id, _)| *id)
                .collect::<Vec<_>>(),
            [302],
            "only the new split is found"
        );
        assert_eq!((fresh.status.splits, fresh.status.splits_found), (2, 2));
        let (ops, reports) = fresh.round(&mut Decisions::default(), range, false, t0);
        assert!(ops.is_empty(), "{ops:?}");
        // 301 was reported before; 302's remap is new.
        let ids: Vec<String> = reports
            .iter()
            .map(|r| match r {
                SyncReport::Conflict { id, .. } | SyncReport::Invalid { id, .. } => id.clone(),
                SyncReport::Refused { decision, .. } => decision.id.clone(),
            })
            .collect();
        assert_eq!(ids, ["302"]);
    }

    #[test]
    fn a_split_that_ends_and_comes_back_is_found_again() {
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        let put = |labels: &str| KvChange::Master {
            id: b"300".to_vec(),
            value: Some(labels.as_bytes().to_vec()),
            created: true,
        };
        let gone = KvChange::Master {
            id: b"300".to_vec(),
            value: None,
            created: false,
        };
        sync.apply_kv_change(put("k8s:app=a;"), t0);
        sync.k8s_upsert(300, "k8s:app=b;".into(), String::new(), t0);
        assert_eq!((sync.status.splits, sync.status.splits_found), (1, 1));
        // The kvstore's GC ends it; an agent allocating the id again starts a new one.
        sync.apply_kv_change(gone.clone(), t0);
        assert_eq!((sync.status.splits, sync.status.splits_found), (0, 1));
        assert_eq!(sync.status.removed_from_kvstore, 1);
        // A delete of what is gone already counts nothing.
        sync.apply_kv_change(gone.clone(), t0);
        assert_eq!(sync.status.removed_from_kvstore, 1);
        sync.apply_kv_change(put("k8s:app=c;"), t0);
        assert_eq!((sync.status.splits, sync.status.splits_found), (1, 2));
        // The object deleted ends it too; a new one with other labels is a third.
        sync.k8s_delete(300, String::new(), t0);
        assert_eq!(sync.status.splits, 0);
        sync.k8s_upsert(300, "k8s:app=d;".into(), String::new(), t0);
        assert_eq!((sync.status.splits, sync.status.splits_found), (1, 3));
        let found: Vec<u32> = sync.splits_to_report.iter().map(|(id, _)| *id).collect();
        assert_eq!(found, [300, 300, 300]);
    }

    #[test]
    fn a_decided_create_already_made_by_someone_else_counts_as_served_there() {
        // 300 = A is a remap (Kubernetes holds 300 for B), decided to 5000; A is at 5000 now,
        // created by no outcome this sync logged (another sync, or one cut off by a crash).
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        sync.apply_kv_change(
            KvChange::Master {
                id: b"300".to_vec(),
                value: Some(b"k8s:app=a;".to_vec()),
                created: true,
            },
            t0,
        );
        sync.k8s.insert(300, "k8s:app=b;".into());
        sync.k8s.insert(5000, "k8s:app=a;".into());
        let decisions: BTreeMap<String, LoggedDecision> = [(
            "300".to_string(),
            LoggedDecision {
                id: "300".into(),
                labels: "k8s:app=a;".into(),
                action: Action::Create,
                target_id: Some(5000),
            },
        )]
        .into();
        let (ops, _) = sync.round(&mut Decisions::new(decisions), range, false, t0);
        assert!(ops.is_empty(), "nothing to write: {ops:?}");
        assert_eq!(sync.reused.get("300"), Some(&5000));
    }

    #[test]
    fn a_failed_batch_is_retried_after_its_wait_and_counted() {
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        let put = KvChange::Master {
            id: b"300".to_vec(),
            value: Some(b"k8s:app=a;".to_vec()),
            created: true,
        };
        sync.apply_kv_change(put, t0);
        let items = sync.plan(&BTreeMap::new(), range);
        let (ops, _) = sync.select_writes(items.iter(), false, t0, &mut Decisions::default());
        assert_eq!(ops.len(), 1);
        let taken = sync.take_results(ops, BatchOutcome::Failed("log full".into()), t0);
        assert_eq!((taken.failures, sync.status.failures), (1, 1));
        assert!(taken.trouble.unwrap().contains("log full"));
        assert_eq!(sync.unwritten_now(), 1);
        // Not before its wait is over; then again.
        let (ops, _) = sync.select_writes(
            items.iter(),
            false,
            t0 + Duration::from_secs(1),
            &mut Decisions::default(),
        );
        assert!(ops.is_empty());
        let (ops, _) = sync.select_writes(
            items.iter(),
            false,
            t0 + RETRY_AFTER,
            &mut Decisions::default(),
        );
        assert_eq!(ops.len(), 1);
        let done = BatchOutcome::Done {
            results: vec![(300, Outcome::Created)],
            halted: None,
        };
        let taken = sync.take_results(ops, done, t0 + RETRY_AFTER);
        assert_eq!(taken.mirrored, 1);
        assert_eq!(taken.lags, vec![RETRY_AFTER]);
        assert_eq!(sync.unwritten_now(), 0);
    }

    #[test]
    fn local_changes_keep_the_plan_and_others_drop_it() {
        let range = IdRange::for_cluster(0).unwrap();
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        let put = |id: u32, labels: &str| KvChange::Master {
            id: id.to_string().into_bytes(),
            value: Some(labels.as_bytes().to_vec()),
            created: true,
        };
        sync.apply_kv_change(put(300, "k8s:app=a;"), t0);
        sync.round(&mut Decisions::default(), range, false, t0);
        // New labels at a new id, and the object sync creates for them: kept up to date.
        sync.apply_kv_change(put(301, "k8s:app=b;"), t0);
        sync.k8s_upsert(300, "k8s:app=a;".into(), String::new(), t0);
        assert!(sync.cache.is_some(), "local changes keep the plan");
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(
            ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
            [Some(301)]
        );
        // Labels another identity holds: the next round plans in full.
        sync.apply_kv_change(put(302, "k8s:app=b;"), t0);
        assert!(sync.cache.is_none(), "a duplicate is not local");
        sync.round(&mut Decisions::default(), range, false, t0);
        // An agent's object at a kvstore id with other labels: a split, not local either.
        sync.k8s_upsert(301, "k8s:app=z;".into(), String::new(), t0);
        assert!(sync.cache.is_none());
    }

    #[test]
    fn a_key_event_is_a_change_only_where_it_changes_what_sync_follows() {
        let p = "cilium/state/identities/v1/";
        let master = |value: Option<&[u8]>, created| {
            kv_change(p, b"cilium/state/identities/v1/id/300", value, created)
        };
        let at_300 = |value: Option<&[u8]>, created| {
            Some(KvChange::Master {
                id: b"300".to_vec(),
                value: value.map(<[u8]>::to_vec),
                created,
            })
        };
        assert_eq!(
            master(Some(b"k8s:app=a;"), true),
            at_300(Some(b"k8s:app=a;"), true)
        );
        // A rewrite of a master key is a change (its labels may differ), not a creation.
        assert_eq!(
            master(Some(b"k8s:app=b;"), false),
            at_300(Some(b"k8s:app=b;"), false)
        );
        // A delete never counts as a creation, whatever the event's flag says.
        assert_eq!(master(None, true), at_300(None, false));
        let slave = |value: Option<&[u8]>, created| {
            kv_change(
                p,
                b"cilium/state/identities/v1/value/k8s:app=a;/10.0.0.1",
                value,
                created,
            )
        };
        let used = |present| {
            Some(KvChange::Slave {
                label_key: b"k8s:app=a;".to_vec(),
                node: b"10.0.0.1".to_vec(),
                present,
            })
        };
        assert_eq!(slave(Some(b"300"), true), used(true));
        assert_eq!(slave(None, false), used(false));
        assert_eq!(slave(None, true), used(false));
        // A node rewriting its own `value/` key (a lease renewal, a periodic sync) changes
        // nobody's use.
        assert_eq!(slave(Some(b"300"), false), None);
        assert_eq!(
            kv_change(p, b"cilium/state/identities/v1/locks/x", None, false),
            None
        );
        assert_eq!(kv_change(p, b"elsewhere/id/300", Some(b"x"), true), None);
    }

    #[test]
    fn the_status_line_says_each_part_only_when_it_holds() {
        let mut st = SyncStatus {
            kvstore_nodes: 2,
            identities: 10,
            mirrored: 7,
            pending: 1,
            splits: 3,
            failures: 4,
            lag_last: Some(Duration::from_millis(12)),
            lag_p50: Some(Duration::from_millis(10)),
            lag_p99: None,
            watching: true,
            ..Default::default()
        };
        assert_eq!(
            st.to_string(),
            "sync: 2 kvstore-mode nodes · 10 identities · 7 mirrored · 1 pending · 3 split · 4 failed · lag last 12ms p50 10ms p99 -"
        );
        st.watching = false;
        st.decision_wait_last = Some(Duration::from_millis(1500));
        st.cutover_wait = Some(CutoverWait::Nodes(2));
        st.reservations = 1;
        st.standby = Some("sync-b".into());
        assert_eq!(
            st.to_string(),
            "sync: 2 kvstore-mode nodes · 10 identities · 7 mirrored · 1 pending · 3 split · 4 failed · lag last 12ms p50 10ms p99 - · catching up · decision wait last 1500ms (not lag) · cutover waits for 2 kvstore-mode nodes to move · 1 reserved in the kvstore · standby: sync-b holds the lease"
        );
    }

    #[test]
    fn the_overlay_is_touched_by_what_its_decisions_name_and_nothing_else() {
        let item = |id: &str, labels: &str, target| PlanItem {
            id: id.into(),
            labels: labels.into(),
            kind: Kind::Remap,
            action: Action::Create,
            target_id: target,
            existing_labels: None,
            labels_present_at: None,
            nodes: 1,
            reason: "".into(),
            decided: false,
        };
        let live = [item("300", "k8s:app=a;", Some(300))];
        let mut resumed = live.to_vec();
        resumed[0].target_id = Some(700);
        resumed[0].decided = true;
        let decisions = BTreeMap::from([(
            "300".to_string(),
            LoggedDecision {
                id: "300".into(),
                labels: "k8s:app=a;".into(),
                action: Action::Create,
                target_id: Some(700),
            },
        )]);
        let o = Overlay::of(&live, resumed, &decisions);
        assert!(o.touched(Some(300), None), "the kvstore id");
        assert!(o.touched(Some(700), None), "the decided target");
        assert!(o.touched(None, Some(b"k8s:app=a;")), "the labels");
        assert!(
            o.touched(Some(301), Some(b"k8s:app=a;")),
            "the labels, any id"
        );
        assert!(!o.touched(Some(301), Some(b"k8s:app=b;")));
        assert!(!o.touched(Some(301), None));
        assert!(!o.touched(None, Some(b"k8s:app=b;")));
        assert!(!o.touched(None, None));
        assert!(!o.touched(None, Some(b"\xff")));
    }

    #[test]
    fn a_state_from_a_snapshot_holds_its_identities_uses_and_revision() {
        let mut counts = NodeCounts::default();
        counts.add_key(b"k8s:app=a;", b"node-1");
        let snap = KvSnapshot {
            source: crate::core::kvstore::SourceInfo {
                revision: 42,
                ..Default::default()
            },
            masters: vec![MasterEntry::new("300", "k8s:app=a;")],
            node_counts: counts.clone(),
        };
        let sync = SyncState::from_snapshot(snap);
        assert_eq!(
            sync.masters,
            BTreeMap::from([(b"300".to_vec(), b"k8s:app=a;".to_vec())])
        );
        assert_eq!(sync.counts, counts);
        assert_eq!(sync.kv_revision, 42);
        // The screens have not seen these counts yet.
        assert!(sync.counts_changed);
    }

    #[test]
    fn unwritten_counts_a_failed_create_only_while_it_is_missing_and_wanted() {
        let mut sync = SyncState::default();
        for id in ["300", "301", "302"] {
            sync.unwritten.insert(id.parse().unwrap(), id.into());
        }
        sync.masters.insert(b"300".to_vec(), b"k8s:app=a;".to_vec());
        sync.masters.insert(b"301".to_vec(), b"k8s:app=b;".to_vec());
        // 301's object was made since; 302's identity left the kvstore.
        sync.k8s.insert(301, "k8s:app=b;".into());
        assert_eq!(sync.unwritten_now(), 1);
    }

    #[test]
    fn a_mapping_whose_target_holds_its_labels_is_never_moot() {
        let mut sync = SyncState::default();
        sync.masters.insert(b"301".to_vec(), b"k8s:app=r;".to_vec());
        sync.reused.insert("301".into(), 300);
        // No node uses `r`, but the object at 300 serves it: nothing left to close.
        sync.k8s.insert(300, "k8s:app=r;".into());
        assert!(sync.moot_now().is_empty());
        // Held for other labels, the mapping is moot.
        sync.k8s.insert(300, "k8s:app=x;".into());
        let moot: Vec<(String, Kind)> = sync
            .moot_now()
            .into_iter()
            .map(|(id, _, kind)| (id, kind))
            .collect();
        assert_eq!(moot, [("301".into(), Kind::Reuse)]);
    }

    #[test]
    fn each_conflict_waiting_for_a_decision_counts_as_pending() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let mut sync = following(&[300, 301, 302], t0);
        // Kubernetes holds 300 and 301 for other labels: two remaps wait.
        sync.k8s_upsert(300, "k8s:app=x;".into(), "1".into(), t0);
        sync.k8s_upsert(301, "k8s:app=y;".into(), "2".into(), t0);
        let (ops, reports) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(ops.len(), 1, "302 is a plain create");
        assert_eq!(reports.len(), 2);
        assert_eq!(sync.status.pending, 2);
    }

    #[test]
    fn lag_percentiles_cover_the_last_ten_thousand_creates() {
        let mut sync = SyncState::default();
        for ms in 0..10_001 {
            sync.record_lag(Duration::from_millis(ms));
        }
        assert_eq!(sync.lags.len(), 10_000);
        assert_eq!(sync.lags.front(), Some(&Duration::from_millis(1)));
        assert_eq!(sync.status.lag_last, Some(Duration::from_millis(10_000)));
    }

    #[test]
    fn a_relist_ends_the_splits_of_objects_gone_meanwhile_and_finds_new_ones() {
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        for (id, labels) in [("300", "k8s:app=a;"), ("301", "k8s:app=b;")] {
            sync.apply_kv_change(
                KvChange::Master {
                    id: id.as_bytes().to_vec(),
                    value: Some(labels.as_bytes().to_vec()),
                    created: true,
                },
                t0,
            );
        }
        sync.k8s_upsert(300, "k8s:app=x;".into(), "1".into(), t0);
        assert_eq!(sync.status.splits, 1);
        // While the watch was gone, 300's object was deleted and an agent took 301.
        sync.k8s_relisted(
            BTreeMap::from([(301, "k8s:app=y;".to_string())]),
            "9".into(),
            t0,
        );
        assert_eq!(sync.splits, HashSet::from([301]));
        assert_eq!((sync.status.splits, sync.status.splits_found), (1, 2));
        assert_eq!(sync.k8s_version, "9");
    }

    #[test]
    fn a_kept_plan_is_kept_only_for_the_range_it_was_made_for() {
        let mut sync = SyncState::default();
        let t0 = Instant::now();
        sync.apply_kv_change(
            KvChange::Master {
                id: b"300".to_vec(),
                value: Some(b"k8s:app=a;".to_vec()),
                created: true,
            },
            t0,
        );
        let narrow = IdRange { min: 256, max: 299 };
        let (ops, reports) = sync.round(&mut Decisions::default(), narrow, false, t0);
        assert!(ops.is_empty());
        assert!(matches!(&reports[..], [SyncReport::Invalid { id, .. }] if id == "300"));
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            IdRange::for_cluster(0).unwrap(),
            false,
            t0,
        );
        assert_eq!(
            ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
            [Some(300)]
        );
    }

    /// A state following `ids`, each a plain identity with its own labels, used by one node.
    /// node-1 stops using `k8s:app=a<id>;` (as `following` set it up), then its object goes.
    fn unused_and_deleted(sync: &mut SyncState, id: u32, t0: Instant) {
        let slave = KvChange::Slave {
            label_key: format!("k8s:app=a{id};").into_bytes(),
            node: b"node-1".to_vec(),
            present: false,
        };
        sync.apply_kv_change(slave, t0);
        sync.k8s_delete(id, String::new(), t0);
    }

    fn following(ids: &[u32], t0: Instant) -> SyncState {
        let mut sync = SyncState::default();
        for id in ids {
            let labels = format!("k8s:app=a{id};");
            sync.apply_kv_change(
                KvChange::Master {
                    id: id.to_string().into_bytes(),
                    value: Some(labels.clone().into_bytes()),
                    created: true,
                },
                t0,
            );
            sync.apply_kv_change(
                KvChange::Slave {
                    label_key: labels.into_bytes(),
                    node: b"node-1".to_vec(),
                    present: true,
                },
                t0,
            );
        }
        sync
    }

    #[test]
    fn each_outcome_of_a_halted_batch_is_folded_in_on_its_own() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let mut sync = following(&[300, 301, 302, 303, 304], t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(ops.len(), 5);
        let results = vec![
            (300, Outcome::Created),
            (301, Outcome::AlreadyExisted),
            (302, Outcome::Failed),
            (303, Outcome::Conflict),
            (304, Outcome::NotAttempted),
        ];
        let halted = Some("stopped by the operator".to_string());
        let taken = sync.take_results(ops, BatchOutcome::Done { results, halted }, t0);
        assert_eq!((taken.mirrored, taken.failures), (1, 2));
        assert_eq!((sync.status.mirrored, sync.status.failures), (1, 2));
        assert!(
            taken
                .trouble
                .unwrap()
                .starts_with("stopped by the operator")
        );
        // Made or found made: served, and never made again.
        assert_eq!(sync.k8s.keys().copied().collect::<Vec<_>>(), [300, 301]);
        assert_eq!(sync.created, HashSet::from([300]));
        assert_eq!(sync.unwritten_now(), 3);
        // The others wait, then are tried again, all three.
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + Duration::from_secs(1),
        );
        assert!(ops.is_empty(), "{ops:?}");
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0 + RETRY_AFTER);
        let mut targets: Vec<u32> = ops.iter().filter_map(|o| o.target_id).collect();
        targets.sort();
        assert_eq!(targets, [302, 303, 304]);
    }

    #[test]
    fn other_labels_at_an_id_whose_object_sync_made_and_someone_deleted_are_a_new_object() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        // The kvstore's 400 (a400) is held in Kubernetes by other labels: remapped, as
        // accepted, to 256, the lowest id free on both sides.
        let mut sync = following(&[400], t0);
        sync.k8s_upsert(400, "k8s:app=other;".into(), "1".into(), t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, true, t0);
        assert_eq!(
            ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
            [Some(256)]
        );
        let done = |ops: Vec<Op>| BatchOutcome::Done {
            results: ops
                .iter()
                .filter_map(|o| o.target_id.map(|t| (t, Outcome::Created)))
                .collect(),
            halted: None,
        };
        sync.take_results(ops.clone(), done(ops), t0);
        // The cluster's GC deletes 256; the kvstore's takes 400; 401 (b) comes, also held
        // by other labels in Kubernetes.
        sync.k8s_delete(256, "2".into(), t0);
        for change in [
            KvChange::Slave {
                label_key: b"k8s:app=a400;".to_vec(),
                node: b"node-1".to_vec(),
                present: false,
            },
            KvChange::Master {
                id: b"400".to_vec(),
                value: None,
                created: false,
            },
            KvChange::Master {
                id: b"401".to_vec(),
                value: Some(b"k8s:app=b;".to_vec()),
                created: true,
            },
        ] {
            sync.apply_kv_change(change, t0);
        }
        sync.k8s_upsert(401, "k8s:app=y;".into(), "3".into(), t0);
        // b's remap to the freed 256 is a new object: made, not held back as "made again".
        let t1 = t0 + RECREATE_SETTLE;
        let (ops, reports) = sync.round(&mut Decisions::default(), range, true, t1);
        assert_eq!(
            ops.iter()
                .map(|o| (o.id.as_str(), o.target_id))
                .collect::<Vec<_>>(),
            [("401", Some(256))],
            "{reports:?}"
        );
        assert_eq!(sync.status.deleted_not_recreated, 0);
    }

    #[test]
    fn what_the_shell_and_the_simulation_read_is_the_state_itself() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let masters = BTreeMap::from([
            (b"300".to_vec(), b"k8s:app=a;".to_vec()),
            (b"301".to_vec(), b"k8s:app=b;".to_vec()),
        ]);
        // 5000 holds b's labels: its identity 301 is a duplicate, waiting for a decision.
        let k8s = BTreeMap::from([(5000, "k8s:app=b;".to_string())]);
        let mut sync = SyncState::from_kvstore(masters.clone(), NodeCounts::default(), 42)
            .with_kubernetes(k8s.clone(), "17".into());
        assert_eq!(sync.masters(), &masters);
        assert_eq!(sync.k8s(), &k8s);
        assert_eq!(sync.kv_revision(), 42);
        assert_eq!(sync.k8s_version(), "17");
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert_eq!(sync.status(), &sync.status);
        assert_eq!(sync.status().identities, 2);
        assert_eq!(sync.waiting(), sync.waiting.as_slice());
        assert_eq!(
            sync.waiting()
                .iter()
                .map(|w| w.0.as_str())
                .collect::<Vec<_>>(),
            ["301"],
            "{ops:?}"
        );
        sync.reused.insert("302".into(), 5001);
        assert_eq!(sync.reused(), &BTreeMap::from([("302".to_string(), 5001)]));
        sync.moot.insert("301".into());
        assert!(sync.is_moot("301") && !sync.is_moot("300"));
    }

    #[test]
    fn a_decided_create_of_an_object_sync_made_and_the_gc_deleted_is_refused_once() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let mut sync = following(&[300], t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        let results = vec![(300, Outcome::Created)];
        let outcome = BatchOutcome::Done {
            results,
            halted: None,
        };
        sync.take_results(ops, outcome, t0);
        // No node uses it any more, and the GC deletes it; the operator decides to create it.
        unused_and_deleted(&mut sync, 300, t0);
        let mut decided = Decisions::new(BTreeMap::from([(
            "300".to_string(),
            LoggedDecision {
                id: "300".into(),
                labels: "k8s:app=a300;".into(),
                action: Action::Create,
                target_id: Some(300),
            },
        )]));
        let t1 = t0 + RECREATE_SETTLE;
        let refused = |reports: &[SyncReport]| {
            reports
                .iter()
                .filter(|r| matches!(r, SyncReport::Refused { reason, .. } if reason.contains("deleted since")))
                .count()
        };
        let (ops, reports) = sync.round(&mut decided, range, false, t1);
        assert!(ops.is_empty(), "{ops:?}");
        assert_eq!(refused(&reports), 1, "{reports:?}");
        // Said once, however many rounds pass.
        sync.overlay = None;
        let (_, reports) = sync.round(&mut decided, range, false, t1);
        assert_eq!(refused(&reports), 0, "{reports:?}");
    }

    #[test]
    fn an_object_sync_made_and_someone_deleted_is_made_again_once_and_only_while_used() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let mut sync = following(&[300], t0);
        let made = |sync: &mut SyncState, ops| {
            let results = vec![(300, Outcome::Created)];
            sync.take_results(
                ops,
                BatchOutcome::Done {
                    results,
                    halted: None,
                },
                t0,
            );
        };
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        made(&mut sync, ops);
        // Deleted while node-1 uses it: made again, once, after the wait.
        sync.k8s_delete(300, String::new(), t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert!(ops.is_empty(), "made again before the wait: {ops:?}");
        let t1 = t0 + RECREATE_SETTLE;
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t1);
        assert_eq!(ops.len(), 1);
        assert_eq!(sync.status.recreated, 1);
        made(&mut sync, ops);
        // Deleted again: not a third time, counted once however many rounds pass.
        sync.k8s_delete(300, String::new(), t1);
        for _ in 0..3 {
            let (ops, _) = sync.round(
                &mut Decisions::default(),
                range,
                false,
                t1 + RECREATE_SETTLE,
            );
            assert!(ops.is_empty());
        }
        assert_eq!(
            (sync.status.recreated, sync.status.deleted_not_recreated),
            (1, 1)
        );

        // One that no node uses any more is not made again at all.
        let mut sync = following(&[300], t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        made(&mut sync, ops);
        unused_and_deleted(&mut sync, 300, t0);
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + RECREATE_SETTLE,
        );
        assert!(ops.is_empty());
        assert_eq!(
            (sync.status.recreated, sync.status.deleted_not_recreated),
            (0, 1)
        );

        // Unused when its delete arrives, it still waits: a node's key that the trailing
        // view shows next (just before the kvstore's deletes) must not make it again.
        let mut sync = following(&[300], t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        made(&mut sync, ops);
        let node_key = |present| KvChange::Slave {
            label_key: b"k8s:app=a300;".to_vec(),
            node: b"node-1".to_vec(),
            present,
        };
        sync.apply_kv_change(node_key(false), t0);
        sync.k8s_delete(300, String::new(), t0);
        sync.apply_kv_change(node_key(true), t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert!(ops.is_empty(), "made again before the wait: {ops:?}");
        sync.apply_kv_change(node_key(false), t0 + Duration::from_millis(500));
        sync.apply_kv_change(
            KvChange::Master {
                id: b"300".to_vec(),
                value: None,
                created: false,
            },
            t0 + Duration::from_millis(500),
        );
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + RECREATE_SETTLE,
        );
        assert!(ops.is_empty(), "{ops:?}");
    }

    #[test]
    fn an_object_deleted_while_the_kvstore_holds_its_identity_waits_before_it_is_made_again() {
        let range = IdRange::for_cluster(0).unwrap();
        let t0 = Instant::now();
        let gone = KvChange::Master {
            id: b"300".to_vec(),
            value: None,
            created: false,
        };
        // An identity migrated earlier (its object made by apply, not this sync).
        let mut sync = following(&[300, 301], t0);
        sync.k8s_upsert(300, "k8s:app=a300;".into(), "1".into(), t0);
        sync.k8s_upsert(301, "k8s:app=a301;".into(), "2".into(), t0);
        assert!(
            sync.round(&mut Decisions::default(), range, false, t0)
                .0
                .is_empty()
        );
        // The cluster's GC took both objects; sync saw that before the kvstore's GC took
        // 300's identity, a moment earlier.
        sync.k8s_delete(300, "3".into(), t0);
        sync.k8s_delete(301, "4".into(), t0);
        let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
        assert!(ops.is_empty(), "{ops:?}");
        sync.apply_kv_change(gone.clone(), t0 + Duration::from_millis(500));
        assert!(!sync.settling.contains_key(&300));
        // 301's identity stays in the kvstore: made again once the wait is over.
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + Duration::from_secs(1),
        );
        assert!(ops.is_empty(), "{ops:?}");
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + RECREATE_SETTLE,
        );
        assert_eq!(
            ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
            [Some(301)]
        );
        assert!(sync.settling.is_empty());
        // A relist that finds an object gone meanwhile waits the same.
        let mut sync = following(&[302], t0);
        sync.k8s_upsert(302, "k8s:app=a302;".into(), "1".into(), t0);
        sync.k8s_relisted(BTreeMap::new(), "9".into(), t0);
        assert!(
            sync.round(&mut Decisions::default(), range, false, t0)
                .0
                .is_empty()
        );
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + RECREATE_SETTLE,
        );
        assert_eq!(ops.len(), 1);
        // So does one whose object sync never saw (made and deleted while the watch was
        // gone): not made if the kvstore's delete arrives meanwhile, else made after the wait.
        let mut sync = following(&[300, 303], t0);
        sync.k8s_relisted(BTreeMap::new(), "9".into(), t0);
        assert_eq!(
            sync.settling.keys().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([300, 303])
        );
        assert!(
            sync.round(&mut Decisions::default(), range, false, t0)
                .0
                .is_empty()
        );
        sync.apply_kv_change(gone, t0 + Duration::from_millis(500));
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t0 + RECREATE_SETTLE,
        );
        assert_eq!(
            ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
            [Some(303)]
        );
    }

    #[test]
    fn reused_names_the_ids_served_at_another_id_that_holds_their_labels() {
        let item = |id: &str, labels: &str, action, target| PlanItem {
            id: id.into(),
            labels: labels.into(),
            kind: Kind::Remap,
            action,
            target_id: Some(target),
            existing_labels: None,
            labels_present_at: None,
            nodes: 1,
            reason: "".into(),
            decided: true,
        };
        let mut sync = SyncState::default();
        sync.k8s.insert(5000, "k8s:app=a;".into());
        sync.k8s.insert(5001, "k8s:app=other;".into());
        let items = [
            // Mapped to where its labels are.
            item("300", "k8s:app=m;", Action::None, 6000),
            // A create made already, by someone: served there.
            item("301", "k8s:app=a;", Action::Create, 5000),
            // A create whose target holds other labels, or nothing yet: not served.
            item("302", "k8s:app=b;", Action::Create, 5001),
            item("303", "k8s:app=c;", Action::Create, 6001),
            // Served at its own id: not "another" id.
            item("5000", "k8s:app=a;", Action::None, 5000),
            // Skipped by the operator; a skip proposed and not decided is not counted.
            item("304", "k8s:app=d;", Action::Skip, 6002),
            PlanItem {
                decided: false,
                ..item("305", "k8s:app=e;", Action::Skip, 6003)
            },
        ];
        sync.publish(items.iter());
        assert_eq!(sync.skipped, 1);
        assert_eq!(
            sync.reused,
            BTreeMap::from([("300".to_string(), 6000), ("301".to_string(), 5000)])
        );
        assert_eq!(sync.status.identities, 7);
    }
}
