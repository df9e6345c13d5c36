//! The rules of sync's reservations in the kvstore (`--reserve-in-kvstore`), with no IO:
//! what to reserve and when (`Queue`, the loop's side: batches, the whole view looked at
//! again after a fresh view or a failure, a wait after a failed write), and what is held
//! and what each answer from etcd changes (`Ledger`, the writer's side: reserve once, never
//! an invalid label key, unreserve when the object goes, put `value/` keys back on a new
//! lease, take over what an earlier sync left, release at cutover). `app::reserve` carries
//! the writes out (each announced in the decision log first); the simulation drives the
//! same rules against its own etcd.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use foldhash::HashSet;

use super::SyncState;
use crate::core::kvstore::IdDigits;
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::range::IdRange;

pub use crate::core::decision_log::reservations::{
    RELEASE_RESERVATION, RESERVE_IN_KVSTORE, Recorded, Unreleased, note_reservations,
    note_unreleased, unreleased_in,
};

/// A reservation an earlier sync recorded in its decision log and did not release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Earlier {
    pub id: u32,
    pub labels: LabelKey,
    /// The revision its master key was written at.
    pub revision: i64,
    /// Kubernetes still holds the object with these labels: its `value/` key is kept.
    pub keep: bool,
}

/// What an earlier sync left, to take over now: only by the Lease's holder (only it
/// writes), once (`earlier` is emptied), each marked whether Kubernetes still holds its
/// object with its labels.
pub fn earlier_to_adopt(
    earlier: &mut Unreleased,
    state: &SyncState,
    holding: bool,
) -> Vec<Earlier> {
    if !holding {
        return Vec::new();
    }
    std::mem::take(earlier)
        .into_iter()
        .map(|(id, (labels, revision))| Earlier {
            keep: state.k8s.get(&id) == Some(&labels),
            id,
            labels,
            revision,
        })
        .collect()
}

/// What the loop asks of the writer that owns the reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Reserve these, in order; a failed write ends them (the rest of a batch goes on).
    Reserve(Vec<(u32, LabelKey)>),
    /// The object at this id went from Kubernetes.
    Unreserve(u32),
    /// What an earlier sync reserved and did not release.
    Adopt(Vec<Earlier>),
    /// The kvstore's master key at this id went (Cilium's GC): whatever was known of it
    /// (reserved by sync, or found held) no longer holds.
    Forget(u32),
    /// A fresh read of the kvstore: ids found held before are tried again when asked (one
    /// that went before a compaction was never seen go).
    LookAgain,
    /// What the writer left for the Lease's gate to open (`Reply::deferred`): `value/` keys
    /// to put back on its lease, deletes of `value/` keys. Sent by the loop once it holds
    /// the Lease with the gate open, so that work waits for the gate, not for the next
    /// keep-alive.
    Deferred,
}

/// What the writer answers: after each batch, and whenever it has something to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub held: usize,
    /// The master keys this sync wrote, when they changed since the last reply.
    pub own_masters: Option<BTreeSet<u32>>,
    /// The answer to a batch: the next batch may go.
    pub batch: bool,
    /// The batch stopped at a failed write (or a closed write gate): the whole view is to
    /// be looked at again.
    pub failed: bool,
    /// The writer has work left that waits for the gate or a retry (`Request::Deferred`).
    pub deferred: bool,
    pub said: Option<Said>,
}

/// What the writer has to tell the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    /// A write failed: the whole view is tried again after a wait.
    Trouble(String),
    /// Something worth knowing (a lease taken again).
    Note(String),
}

/// After a failed write, how long before the whole view is tried again: a kvstore that is
/// down is not asked ten times a second.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// How often the reservations' lease is kept alive (what the writer left undone is tried
/// again then too, besides at the loop's next batch, `Request::Deferred`): every 60 s, well
/// within the lease's 15 minutes (`writer::LEASE_TTL_SECS`). What the gate held back used
/// to wait for this turn alone: the simulation found reservations left a whole period
/// waiting (114 of 20,000 seeds at 60 s); it now goes with the loop's next batch, and the
/// cadence bounds nothing sync promises.
pub const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(60);

/// When the reservations' lease is kept alive, in the binary's writer task and in the
/// simulation alike: every `KEEP_ALIVE_EVERY` from the writer's start; one made late (after
/// a long batch) sets the next a whole period after it, so missed ones are never made up in
/// a burst.
#[derive(Debug, Clone, Copy)]
pub struct KeepAlive {
    next: Instant,
}

impl KeepAlive {
    /// The schedule of a writer started at `now`: its first keep-alive a period later.
    pub fn from(now: Instant) -> Self {
        KeepAlive {
            next: now + KEEP_ALIVE_EVERY,
        }
    }

    /// When the next keep-alive is due.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// Whether one is due at `now`; if it is, the next is a period from now.
    pub fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + KEEP_ALIVE_EVERY;
        true
    }
}

/// The loop's side: what to ask for next. It never waits on etcd; its requests go out
/// through `take_requests`, one batch at a time: a batch goes only once the last one is
/// answered, so at most one is ever in flight (what arrives meanwhile, deletes and forgets
/// too, waits here for the next), and the channel to the writer stays small and bounded.
#[derive(Debug)]
pub struct Queue {
    /// Objects that arrived since the last batch went.
    queued: BTreeMap<u32, LabelKey>,
    /// Every object of the view is to be looked at (a fresh snapshot or list, the lease
    /// taken, a failure).
    whole_view_due: bool,
    /// No batch before this (after a failure).
    not_before: Option<Instant>,
    busy: bool,
    /// The writer left work for the gate (its last reply said so): asked for at the next
    /// batch.
    writer_deferred: bool,
    held: usize,
    /// The master keys this sync wrote (as of the last reply that changed them).
    own_masters: BTreeSet<u32>,
    /// Deletes, forgets and adoptions, in the order they came, for the next batch.
    pending: Vec<Request>,
    /// The batch to send, taken by `take_requests`.
    ready: Vec<Request>,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            queued: BTreeMap::new(),
            whole_view_due: true,
            not_before: None,
            busy: false,
            writer_deferred: false,
            held: 0,
            own_masters: BTreeSet::new(),
            pending: Vec::new(),
            ready: Vec::new(),
        }
    }
}

impl Queue {
    /// The queue of a writer that starts with `recorded`: the ids the decision logs record
    /// as reserved and not released, counted as this sync's own master keys until the
    /// writer's answer to their adoption says which are (none is made in Kubernetes
    /// meanwhile: a restarted sync never makes again an object the GC deleted while it was
    /// down).
    pub fn started_with(recorded: BTreeSet<u32>) -> Self {
        Queue {
            own_masters: recorded,
            ..Queue::default()
        }
    }

    /// Ids reserved now (as of the last reply).
    pub fn held(&self) -> usize {
        self.held
    }

    /// The master keys this sync wrote (as of the last reply; before the writer has
    /// answered an adoption, the ids the logs record).
    pub fn own_masters(&self) -> &BTreeSet<u32> {
        &self.own_masters
    }

    /// The batch to send to the writer, its requests in order (empty: nothing to send).
    pub fn take_requests(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.ready)
    }

    /// At the release: what is still pending goes now, answered or not (the writer takes it
    /// before its release; its answer no longer matters).
    pub fn flush(&mut self) {
        self.ready.append(&mut self.pending);
    }

    /// An object arrived: reserve its id at the next batch if the kvstore does not hold it.
    pub fn want(&mut self, id: u32, labels: LabelKey) {
        self.queued.insert(id, labels);
    }

    /// Takes over what an earlier sync reserved, before anything else is reserved.
    pub fn adopt(&mut self, earlier: Vec<Earlier>) {
        if !earlier.is_empty() {
            self.pending.push(Request::Adopt(earlier));
        }
    }

    /// A fresh read of the kvstore: what the writer found held is looked at again, with
    /// the whole view, at the next batch.
    pub fn fresh_kvstore(&mut self) {
        self.pending.push(Request::LookAgain);
        self.whole_view_due = true;
    }

    /// The whole view is to be looked at again at the next batch.
    pub fn view_changed(&mut self) {
        self.whole_view_due = true;
    }

    /// An object went from Kubernetes: its `value/` key goes at the next batch (after any
    /// batch already sent, so a reservation and its removal keep their order).
    pub fn deleted(&mut self, id: u32) {
        self.queued.remove(&id);
        self.pending.push(Request::Unreserve(id));
    }

    /// The kvstore's master key at `id` went (Cilium's GC, after the last node using it
    /// moved): if Kubernetes still holds the object (`labels`), its id is free again in
    /// kvstore-mode agents' pools, so it is reserved again.
    pub fn master_gone(&mut self, id: u32, labels: Option<LabelKey>) {
        self.pending.push(Request::Forget(id));
        if let Some(labels) = labels {
            self.want(id, labels);
        }
    }

    /// Asks for the next batch unless one is being written or a failure's wait is not
    /// over: the deletes, forgets and adoptions pending, then what the writer left for the
    /// gate (the loop pumps only while it holds the Lease), then a reservation of what was
    /// queued (and the whole view when due) whose id is in range and not held by the
    /// kvstore as last seen.
    pub fn pump(&mut self, state: &SyncState, range: IdRange, now: Instant) {
        if self.busy || self.not_before.is_some_and(|t| now < t) {
            return;
        }
        let whole_view = std::mem::take(&mut self.whole_view_due);
        // Only ids the kvstore does not hold are copied out of the view (at 65,280 objects
        // a copy of the whole view would be 18 MiB).
        let needs = |id: u32| {
            range.contains(id) && !state.masters.contains_key(IdDigits::of(id).as_bytes())
        };
        let mut wanted: BTreeMap<u32, LabelKey> = std::mem::take(&mut self.queued)
            .into_iter()
            .filter(|(id, _)| needs(*id))
            .collect();
        if whole_view {
            wanted.extend(
                state
                    .k8s
                    .iter()
                    .filter(|(id, _)| needs(**id))
                    .map(|(id, l)| (*id, l.clone())),
            );
        }
        let mut batch = std::mem::take(&mut self.pending);
        // Before the reservations: a `value/` key that cannot go back (its master key
        // changed) frees its id to be reserved again in the same batch.
        if self.writer_deferred {
            batch.push(Request::Deferred);
        }
        if !wanted.is_empty() {
            batch.push(Request::Reserve(wanted.into_iter().collect()));
        }
        if batch.is_empty() {
            return;
        }
        self.busy = true;
        self.ready = batch;
    }

    /// Folds in the writer's answer; what to tell the operator. After a failed write the
    /// whole view is tried again: at once when the failure was a closed gate or a lease
    /// taken again, else after a wait.
    pub fn on_reply(&mut self, reply: Reply, now: Instant) -> Option<Said> {
        self.held = reply.held;
        self.writer_deferred = reply.deferred;
        if let Some(masters) = reply.own_masters {
            self.own_masters = masters;
        }
        if reply.batch {
            self.busy = false;
        }
        if reply.failed {
            self.whole_view_due = true;
        }
        if matches!(reply.said, Some(Said::Trouble(_))) {
            self.whole_view_due = true;
            self.not_before = Some(now + RETRY_AFTER_FAILURE);
        }
        reply.said
    }
}

/// What to do about an object that went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreserve {
    /// Not reserved: nothing.
    Nothing,
    /// The write gate is closed: later (`Request::Deferred`, or the next keep-alive).
    Later,
    /// Delete its `value/` key now (announced first).
    Now(LabelKey),
}

/// The writer's side: what sync holds in the kvstore, and what each answer changes.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Reserved ids: the label key and the revision of the master key's write.
    held: BTreeMap<u32, (LabelKey, i64)>,
    /// Ids found held in the kvstore meanwhile (nothing written; a split is reported by the
    /// watch if the labels differ).
    tried: HashSet<u32>,
    /// Held ids whose object went from Kubernetes: their `value/` key was deleted, the
    /// master key waits for the release.
    unreserved: HashSet<u32>,
    /// Held ids whose `value/` key is to be written again on a new lease (the old one
    /// expired).
    to_restore: BTreeSet<u32>,
    /// Ids whose object went and whose `value/` key could not be deleted yet (a failed
    /// delete, or the gate closed then): tried again later (`deferred`).
    to_unreserve: BTreeSet<u32>,
}

impl Ledger {
    /// Whether `id` is to be reserved for `labels`: not reserved or found held before, and
    /// labels that are a valid label key (an object no agent wrote is never copied).
    pub fn should_reserve(&self, id: u32, labels: &LabelKey) -> bool {
        !self.held.contains_key(&id)
            && !self.tried.contains(&id)
            && valid_label_key(labels.as_bytes()).is_ok()
    }

    /// The master key and `value/` key were written, the master key at `revision`.
    pub fn reserved(&mut self, id: u32, labels: LabelKey, revision: i64) {
        self.held.insert(id, (labels, revision));
    }

    /// The master key existed already: nothing written, not tried again until it goes.
    pub fn found_held(&mut self, id: u32) {
        self.tried.insert(id);
    }

    /// The object at `id` went from Kubernetes.
    pub fn object_deleted(&mut self, id: u32, may_write: bool) -> Unreserve {
        let Some((labels, _)) = self.held.get(&id) else {
            return Unreserve::Nothing;
        };
        let labels = labels.clone();
        self.to_restore.remove(&id);
        if !may_write {
            self.to_unreserve.insert(id);
            return Unreserve::Later;
        }
        Unreserve::Now(labels)
    }

    /// A fresh read of the kvstore: the ids found held are tried again when next asked.
    pub fn look_again(&mut self) {
        self.tried.clear();
    }

    /// The `value/` key of `id` could not be deleted (or the log line not written): later
    /// (`deferred`).
    pub fn unreserve_failed(&mut self, id: u32) {
        self.to_unreserve.insert(id);
    }

    /// The `value/` key of `id` is gone; its master key waits for the release.
    pub fn unreserved(&mut self, id: u32) {
        self.unreserved.insert(id);
    }

    /// The deletes left for later, taken.
    pub fn take_to_unreserve(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.to_unreserve).into_iter().collect()
    }

    /// The lease holding the `value/` keys expired: each held one still reserved is to go
    /// back on the new lease.
    pub fn lease_lost(&mut self) {
        self.to_restore = self
            .held
            .keys()
            .filter(|id| !self.unreserved.contains(id))
            .copied()
            .collect();
    }

    /// Work left for the gate or a retry: deletes of `value/` keys, `value/` keys to put
    /// back.
    pub fn deferred(&self) -> bool {
        !self.to_unreserve.is_empty() || !self.to_restore.is_empty()
    }

    pub fn restore_due(&self) -> bool {
        !self.to_restore.is_empty()
    }

    /// The next `value/` key to put back on the new lease: id, labels, master revision. It
    /// stays due until `put_back` says how it went (a failed write leaves it for later,
    /// `deferred`).
    pub fn next_to_restore(&mut self) -> Option<(u32, LabelKey, i64)> {
        while let Some(id) = self.to_restore.first().copied() {
            if let Some((labels, revision)) = self.held.get(&id) {
                return Some((id, labels.clone(), *revision));
            }
            self.to_restore.remove(&id);
        }
        None
    }

    /// What an earlier sync left, as this one takes it over: each is held at once (its
    /// master key is this sync's own from now on); those whose object is gone wait for the
    /// release, the others are due to go back on this sync's lease (`next_to_restore`), so
    /// a write that fails midway leaves the rest due, not forgotten.
    pub fn adopt(&mut self, earlier: Vec<Earlier>) {
        for e in earlier {
            if self.held.contains_key(&e.id) {
                continue;
            }
            self.held.insert(e.id, (e.labels, e.revision));
            if e.keep {
                self.to_restore.insert(e.id);
            } else {
                self.unreserved.insert(e.id);
            }
        }
    }

    /// A `value/` key put back (`back`), or not because the master key changed since it was
    /// written (no longer held).
    pub fn put_back(&mut self, id: u32, labels: LabelKey, revision: i64, back: bool) {
        self.to_restore.remove(&id);
        if back {
            self.held.insert(id, (labels, revision));
        } else {
            self.held.remove(&id);
        }
    }

    /// The loop saw the master key at `id` deleted; `now_at` is the revision the key holds
    /// as read since (`None`: absent, or not known). A reservation written after that
    /// deletion (a request queued before the loop saw it, carried out after) is still the
    /// key it wrote, and stays; otherwise whatever was known of the id goes (a reservation,
    /// or a finding that it was held), so it is reserved again if Kubernetes holds it.
    pub fn forget(&mut self, id: u32, now_at: Option<i64>) {
        if let (Some((_, written)), Some(now_at)) = (self.held.get(&id), now_at)
            && *written == now_at
        {
            return;
        }
        self.to_unreserve.remove(&id);
        self.held.remove(&id);
        self.tried.remove(&id);
        self.unreserved.remove(&id);
        self.to_restore.remove(&id);
    }

    /// Ids reserved now: master key and `value/` key.
    pub fn count(&self) -> usize {
        self.held.len() - self.unreserved.len()
    }

    /// Master keys written (their `value/` key may have gone with the object since).
    pub fn masters_written(&self) -> usize {
        self.held.len()
    }

    /// Ids whose master key this sync wrote and still holds (with or without its `value/`
    /// key): its own, never a kvstore identity to create an object for.
    pub fn own_masters(&self) -> BTreeSet<u32> {
        self.held.keys().copied().collect()
    }

    /// What the release deletes, each only if still as written and unused: id, labels,
    /// master revision.
    pub fn to_release(&self) -> Vec<(u32, LabelKey, i64)> {
        self.held
            .iter()
            .map(|(id, (labels, revision))| (*id, labels.clone(), *revision))
            .collect()
    }
}

pub mod reservations;
pub mod writer;

#[cfg(test)]
mod tests;
