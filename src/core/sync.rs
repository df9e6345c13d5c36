//! What sync decides, without IO: a state machine that takes both sides' changes in (kvstore
//! keys, Kubernetes objects, write outcomes) and gives writes and reports out: which
//! creates a round makes, which conflicts and malformed entries it reports (once each),
//! which ids are split allocations (found once each), what a batch's outcomes change. The
//! clock comes in as `now`; the watches, the writes, the log and the metrics stay in
//! `app::sync`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet};

use crate::core::kvstore::{
    IdDigits, KeyKind, KvSnapshot, MasterEntry, NodeCounts, classify_key, parse_id,
};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::outcome::Outcome;
use crate::core::plan_cache::{ItemKey, PlanCache, key_of};
use crate::core::planner::resume::{self, LoggedDecision};
use crate::core::planner::{self, Action, DecidedBy, Kind, Op, OpKind, PlanItem};
use decided::Decisions;

pub mod batch;
mod changes;
pub mod decided;
pub mod failure;
pub mod machine;
pub mod reserve;
pub(crate) mod round;
pub mod shell;
pub mod split;
mod status;

pub use status::{CutoverWait, SyncStatus, cutover_wait};

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
        /// The id the key holds (or held, for a delete, where the watch says: etcd's
        /// previous value): what the node counts of that id follow.
        id: Option<Vec<u8>>,
    },
}

impl KvChange {
    /// A `value/` key of sync's own reservations (`--reserve-in-kvstore`): no node's use,
    /// nothing for a plan to look at.
    pub fn is_own_reservation(&self) -> bool {
        matches!(self, KvChange::Slave { node, .. } if node == crate::core::kvstore::RESERVATION_NODE.as_bytes())
    }
}

/// What one key's event means for sync: `value` is `None` for a delete; `created` when the
/// write made the key (a rewrite of a `value/` key is not a change of who uses what).
/// Shared by the etcd watch and the in-memory kvstore's.
pub fn kv_change(
    prefix: &str,
    key: &[u8],
    (value, prev): (Option<&[u8]>, Option<&[u8]>),
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
            id: value.or(prev).map(<[u8]>::to_vec),
        }),
        _ => None,
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
    /// Targets whose create an admission webhook or policy denied, with the labels it was
    /// for and the server's words: not tried again while those labels are planned there (a
    /// loop would only repeat the denial); what cutover names until the object exists.
    denied: HashMap<u32, Denial>,
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
    /// The conflicts waiting for a decision (id, labels, kind), in the plan's order, kept up
    /// to date round by round; and how many identities the operator skipped. Kept instead
    /// of the whole plan, which at 65,280 identities is tens of MiB.
    waiting: BTreeMap<ItemKey, (String, LabelKey, Kind)>,
    /// `waiting` was handed to the moot check since the last round: not again until a
    /// round has looked.
    waiting_taken: bool,
    skipped: usize,
    /// The items the next round looks at besides those its plan changed: what changed
    /// around them (their node counts, a wait over, a write's outcome, a moot closure).
    look_at: BTreeSet<ItemKey>,
    /// The next round looks at every item (something changed that many items read).
    look_at_all: bool,
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
            self.drop_overlay();
        }
    }

    /// The decisions resumed again at the next round; the items they changed are looked at
    /// then (one may go back to its proposal).
    fn drop_overlay(&mut self) {
        if let Some(o) = self.overlay.take() {
            self.look_at
                .extend(o.items.keys().map(|id| key_of(id.as_bytes())));
        }
    }

    /// The decision on kvstore id `id` made, undone or not recorded: the decisions are
    /// resumed again at the next round, and its item looked at (said again if it waits for a
    /// decision again).
    fn decision_changed(&mut self, id: &str) {
        self.reported.remove(id);
        self.look_at(id.as_bytes());
        self.drop_overlay();
    }

    /// Master keys this sync wrote that no kvstore-mode node uses: reservations alone.
    fn reservations_alone(&self) -> impl Iterator<Item = u32> + '_ {
        self.own_masters.iter().copied().filter(|id| {
            self.masters
                .get(IdDigits::of(*id).as_bytes())
                .is_none_or(|labels| self.counts.get(labels) == 0)
        })
    }

    /// What no kvstore-mode node uses any more and would otherwise wait for ever, to close
    /// without a write: conflicts waiting for a decision, and identities mapped to an id
    /// that does not hold their labels (a remap proposal for the same labels under another
    /// kvstore id, itself never written). Taken from `waiting`.
    fn moot_now(&mut self) -> Vec<(String, LabelKey, Kind)> {
        let unused = |labels: &str| self.counts.get(labels.as_bytes()) == 0;
        let taken = std::mem::replace(&mut self.waiting_taken, true);
        let mut out: Vec<(String, LabelKey, Kind)> = self
            .waiting
            .values()
            .filter(|_| !taken)
            .filter(|(id, labels, _)| !self.moot.contains(id) && unused(labels))
            .cloned()
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

    /// Denied creates still not made whose kvstore identity still exists: how many, and
    /// the first by id, in the server's words.
    pub(super) fn denied_now(&self) -> Option<(usize, String)> {
        let mut now: Vec<(&u32, &Denial)> = self
            .denied
            .iter()
            .filter(|(t, d)| {
                !self.k8s.contains_key(t) && self.masters.contains_key(d.id.as_bytes())
            })
            .collect();
        now.sort_by_key(|(t, _)| **t);
        let (t, first) = now.first()?;
        Some((now.len(), format!("{} at {t}: {}", first.id, first.words)))
    }

    /// Failed creates still not made whose kvstore identity still exists.
    fn unwritten_now(&self) -> usize {
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

    /// What waits for a decision now (id, labels, kind), as the last round saw it (nothing
    /// once the moot check took it, until the next round).
    pub fn waiting(&self) -> Vec<(String, LabelKey, Kind)> {
        if self.waiting_taken {
            return Vec::new();
        }
        self.waiting.values().cloned().collect()
    }

    /// `id` closed as moot (logged so): the next round no longer waits for its decision.
    fn close_moot(&mut self, id: &str) {
        self.look_at(id.as_bytes());
        self.moot.insert(id.to_string());
    }

    /// Counts the label sets the plan finds under two ids (its reuses and duplicates), for
    /// the status; kept as it was while no plan is made (a fresh read's first round).
    pub(in crate::core::sync) fn count_doubles(&mut self) {
        if let Some(c) = &self.cache {
            self.status.doubles = c
                .items()
                .filter(|i| matches!(i.kind, Kind::Reuse | Kind::Duplicate))
                .count();
        }
    }

    /// The next round looks at the item of kvstore id `id` again.
    fn look_at(&mut self, id: &[u8]) {
        self.look_at.insert(key_of(id));
    }

    /// The next round looks at the items with `labels` again (their counts moved, a create
    /// of them ended).
    fn look_at_labels(&mut self, labels: &[u8]) {
        if let Some(c) = &self.cache {
            self.look_at.extend(c.with_labels(labels));
        }
    }

    /// The next round looks at every item that would create at `t` (a wait on `t` ended, a
    /// create there did): the identity at `t`, the remap that got `t` (which may have moved
    /// since the wait began), a decision for `t`.
    fn look_at_target(&mut self, t: u32) {
        self.look_at.insert(key_of(IdDigits::of(t).as_bytes()));
        if let Some(c) = &self.cache {
            self.look_at.extend(c.remap_to(t));
        }
        if let Some(o) = &self.overlay {
            let decided = o.items.values().filter(|i| i.target_id == Some(t));
            self.look_at
                .extend(decided.map(|i| key_of(i.id.as_bytes())));
        }
    }

    /// The waits over by `now` (a failed write's, a deleted object's) dropped, their items
    /// looked at again; whether any was.
    fn expire_waits(&mut self, now: Instant) -> bool {
        let mut over = expire(&mut self.failed, now);
        over.extend(expire(&mut self.settling, now));
        for &t in &over {
            self.look_at_target(t);
        }
        !over.is_empty()
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

    fn plan(
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
    fn record_lag(&mut self, lag: Duration) {
        self.status.lag_last = Some(lag);
        self.lags.push_back(lag);
        // The percentiles cover the last 10,000 creates: bounded memory over days.
        if self.lags.len() > 10_000 {
            self.lags.pop_front();
        }
    }

    /// p50 and p99 of the recent lags, for a status: computed per status, not per create,
    /// so a steady load does not sort 10,000 durations twenty times a second.
    fn refresh_lag_percentiles(&mut self) {
        if self.lags.is_empty() {
            return;
        }
        let mut sorted: Vec<Duration> = self.lags.iter().copied().collect();
        sorted.sort_unstable();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        self.status.lag_p50 = Some(at(0.5));
        self.status.lag_p99 = Some(at(0.99));
    }
}

/// Drops the waits over by `now` (a failed write's, a deleted object's); the ids whose was.
fn expire(waits: &mut HashMap<u32, Instant>, now: Instant) -> Vec<u32> {
    let mut over = Vec::new();
    waits.retain(|t, until| {
        let keep = *until > now;
        if !keep {
            over.push(*t);
        }
        keep
    });
    over
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
    /// A malformed kvstore entry, never written. `at_read`: found reading the whole
    /// kvstore (a start, a fresh read), not arriving while sync follows it.
    Invalid {
        id: String,
        labels: String,
        reason: String,
        at_read: bool,
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

/// A create an admission check denied: for which kvstore id and labels, in whose words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub id: String,
    pub labels: LabelKey,
    pub words: String,
}

/// How a batch of writes ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Nothing was written (the reason).
    Failed(String),
    /// The server answered with a fault that may end sync (a refusal such as a 403, or
    /// configuration), as the dispatcher read it off the error, with the error's text: the
    /// shell asks `failure`'s rules, which end sync or take it as a failed batch.
    Faulted { fault: failure::Fault, why: String },
    /// Each target's outcome, why the batch was halted early, if it was, and the server's
    /// words for each create an admission check denied.
    Done {
        results: Vec<(u32, Outcome)>,
        halted: Option<String>,
        denied: Vec<(u32, String)>,
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

#[cfg(test)]
mod tests;
