//! Sync's reservations in the kvstore (`--reserve-in-kvstore`, off by default): every
//! `CiliumIdentity` in range whose id the kvstore does not hold (objects CRD-mode agents
//! created, sync's own remap targets) is reserved there, so that a kvstore-mode agent's pool
//! drops the id and an agent allocating the same labels finds and reuses it: split
//! allocations are prevented instead of reported. Each write and delete is a decision-log
//! line and counted; the lease is kept alive, revoked at cutover (or on a clean stop with
//! `--release-reservations`), and then each master key written is deleted if it is unchanged
//! and no node uses it. A killed sync leaves its keys to lapse with the lease.
//!
//! The reservations live in a task of their own (`ReservationTask`): an etcd write can take
//! up to the client's timeout on a stalled server, and sync's loop must keep following both
//! watches meanwhile. The loop queues what to reserve; the task writes one batch at a time
//! and replies; what arrives meanwhile gathers for the next batch.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::config::ServiceConfig;
use super::metrics::Metrics;
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::planner::Kind;
use crate::core::range::IdRange;
use crate::core::sync::SyncState;
use crate::error::Result;
use crate::io::decision_log::{DecisionLog, Record};
use crate::io::kv_source::KvFollower;
use crate::io::reservation::{LEASE_TTL_SECS, Released, Reserved, Reserver};

/// What sync holds in the kvstore.
pub struct Reservations {
    reserver: Reserver,
    prefix: String,
    lease: i64,
    /// Reserved ids: the label key and the revision of the master key's write.
    held: BTreeMap<u32, (LabelKey, i64)>,
    /// Ids found held in the kvstore meanwhile (nothing written; a split is reported by the
    /// watch if the labels differ).
    tried: HashSet<u32>,
    keepalive: tokio::task::JoinHandle<()>,
}

impl Drop for Reservations {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// A line about a kvstore write: `action` is what sync did (a rule's, never a person's).
fn line(id: u32, labels: &str, action: &str, kvstore: String) -> Record {
    let mut r = Record::decision(
        &id.to_string(),
        labels,
        Kind::Create,
        (action, "rule"),
        Some(id),
    );
    r.kvstore = Some(kvstore);
    r
}

impl Reservations {
    /// Checks that these credentials may write under the prefix (a key of the tool's own,
    /// deleted at once), takes a lease and keeps it alive.
    /// A keep-alive that fails is said on `troubles` (and tried again at the next interval).
    pub async fn start(
        conn: &KvFollower,
        prefix: &str,
        troubles: mpsc::Sender<String>,
    ) -> Result<Self> {
        let reserver = conn.reserver();
        reserver.probe_write(prefix).await?;
        let lease = reserver.grant_lease().await?;
        let keepalive = {
            let reserver = reserver.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(LEASE_TTL_SECS as u64 / 3)).await;
                    if let Err(e) = reserver.keep_alive(lease).await {
                        let _ = troubles.send(format!("{e}; trying again")).await;
                    }
                }
            })
        };
        Ok(Reservations {
            reserver,
            prefix: prefix.to_string(),
            lease,
            held: BTreeMap::new(),
            tried: HashSet::new(),
            keepalive,
        })
    }

    pub fn count(&self) -> usize {
        self.held.len()
    }

    /// Reserves `id` for `labels` unless it was reserved or found held before. The caller
    /// has checked that the id is in range and that the kvstore did not hold it when last
    /// seen; the write itself succeeds only if the master key does not exist.
    async fn reserve_one(
        &mut self,
        id: u32,
        labels: &LabelKey,
        log: &DecisionLog,
        metrics: &Metrics,
    ) -> Result<()> {
        if self.held.contains_key(&id)
            || self.tried.contains(&id)
            // Labels that are no valid label key (an object no agent wrote) are never written.
            || valid_label_key(labels.as_bytes()).is_err()
        {
            return Ok(());
        }
        match self
            .reserver
            .reserve(&self.prefix, id, labels.as_bytes(), self.lease)
            .await?
        {
            Reserved::Written { revision } => {
                // No write without its log line: a log that cannot be written stops here.
                log.append(line(
                    id,
                    labels,
                    "reserve-in-kvstore",
                    format!(
                        "put id/{id} and value/{labels}/{RESERVATION_NODE} at revision {revision}: reserved"
                    ),
                ))?;
                metrics.kvstore_writes.inc_by(2);
                self.held.insert(id, (labels.clone(), revision));
            }
            Reserved::Held(other) => {
                log.append(line(
                    id,
                    labels,
                    "reserve-in-kvstore",
                    format!(
                        "id/{id} already held for {}: nothing written",
                        String::from_utf8_lossy(&other)
                    ),
                ))?;
                self.tried.insert(id);
            }
        }
        metrics.kvstore_reservations.set(self.held.len() as i64);
        Ok(())
    }

    /// The reserved object went from Kubernetes (GC, a person): its `value/` key goes too.
    async fn object_deleted(&mut self, id: u32, log: &DecisionLog, metrics: &Metrics) {
        let Some((labels, _)) = self.held.get(&id) else {
            return;
        };
        if let Ok(true) = self
            .reserver
            .unreserve(&self.prefix, labels.as_bytes())
            .await
        {
            metrics.kvstore_writes.inc();
            let _ = log.append(line(
                id,
                labels,
                "unreserve",
                format!(
                    "deleted value/{labels}/{RESERVATION_NODE}: its CiliumIdentity was deleted"
                ),
            ));
        }
    }

    /// The master key at `id` is gone: a reservation of it, or a finding that it was held,
    /// no longer holds, so the id is reserved again if Kubernetes still holds it.
    fn forget(&mut self, id: u32, metrics: &Metrics) {
        self.held.remove(&id);
        self.tried.remove(&id);
        metrics.kvstore_reservations.set(self.held.len() as i64);
    }

    /// Revokes the lease (every `value/` key of the tool's goes), then deletes each master
    /// key written that is unchanged and unused.
    pub async fn release(self, log: &DecisionLog, metrics: &Metrics) -> Result<usize> {
        self.reserver.revoke(self.lease).await?;
        let mut deleted = 0;
        for (id, (labels, revision)) in &self.held {
            let what = match self
                .reserver
                .release(&self.prefix, *id, labels.as_bytes(), *revision)
                .await?
            {
                Released::Deleted => {
                    metrics.kvstore_writes.inc();
                    deleted += 1;
                    format!("deleted id/{id} (written at revision {revision}): released")
                }
                Released::Kept(why) => format!("kept id/{id}: {why}"),
            };
            let _ = log.append(line(*id, labels, "release-reservation", what));
        }
        metrics.kvstore_reservations.set(0);
        Ok(deleted)
    }
}

/// What sync's loop asks of the task that owns the reservations.
enum Request {
    /// Reserve these, in order; a failed write ends the batch.
    Reserve(Vec<(u32, LabelKey)>),
    /// The object at this id went from Kubernetes.
    Unreserve(u32),
    /// The kvstore's master key at this id went (Cilium's GC): whatever was known of it
    /// (reserved by sync, or found held) no longer holds.
    Forget(u32),
}

/// What the task answers.
pub struct Reply {
    held: usize,
    /// The answer to a batch (not to an unreserve): the next batch may go.
    batch: bool,
    trouble: Option<String>,
}

/// After a failed write, how long before the whole view is tried again: a kvstore that is
/// down is not asked ten times a second.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// Sync's reservations, written by a task of their own (see the module's comment).
pub struct ReservationTask {
    requests: mpsc::UnboundedSender<Request>,
    replies: mpsc::UnboundedReceiver<Reply>,
    task: JoinHandle<Reservations>,
    /// Objects that arrived since the last batch went.
    queued: BTreeMap<u32, LabelKey>,
    /// Every object of the view is to be looked at (a fresh snapshot or list, the lease taken,
    /// a failure).
    whole_view_due: bool,
    /// No batch before this (after a failure).
    not_before: Option<Instant>,
    busy: bool,
    held: usize,
}

impl ReservationTask {
    /// Hands the reservations to a task of their own.
    pub fn spawn(mut r: Reservations, cfg: Arc<ServiceConfig>, metrics: Arc<Metrics>) -> Self {
        let (requests, mut rx) = mpsc::unbounded_channel::<Request>();
        let (reply_tx, replies) = mpsc::unbounded_channel::<Reply>();
        let task = tokio::spawn(async move {
            while let Some(req) = rx.recv().await {
                let (batch, mut trouble) = (matches!(req, Request::Reserve(_)), None);
                match req {
                    Request::Reserve(wanted) => {
                        for (id, labels) in wanted {
                            if let Err(e) = r.reserve_one(id, &labels, &cfg.log, &metrics).await {
                                trouble = Some(format!("reserving in the kvstore: {e}"));
                                break;
                            }
                        }
                    }
                    Request::Unreserve(id) => r.object_deleted(id, &cfg.log, &metrics).await,
                    Request::Forget(id) => r.forget(id, &metrics),
                }
                let held = r.count();
                // The loop is gone: the round or the sync ended; the reservations go back.
                let _ = reply_tx.send(Reply {
                    held,
                    batch,
                    trouble,
                });
            }
            r
        });
        ReservationTask {
            requests,
            replies,
            task,
            queued: BTreeMap::new(),
            whole_view_due: true,
            not_before: None,
            busy: false,
            held: 0,
        }
    }

    /// Ids reserved now (as of the last reply).
    pub fn held(&self) -> usize {
        self.held
    }

    /// An object arrived: reserve its id at the next batch if the kvstore does not hold it.
    pub fn want(&mut self, id: u32, labels: LabelKey) {
        self.queued.insert(id, labels);
    }

    /// The whole view is to be looked at again at the next batch.
    pub fn view_changed(&mut self) {
        self.whole_view_due = true;
    }

    /// An object went from Kubernetes: its `value/` key goes (after any batch already sent,
    /// so a reservation and its removal keep their order).
    pub fn deleted(&mut self, id: u32) {
        self.queued.remove(&id);
        let _ = self.requests.send(Request::Unreserve(id));
    }

    /// The kvstore's master key at `id` went (Cilium's GC, after the last node using it
    /// moved): if Kubernetes still holds the object (`labels`), its id is free again in
    /// kvstore-mode agents' pools, so it is reserved again.
    pub fn master_gone(&mut self, id: u32, labels: Option<LabelKey>) {
        let _ = self.requests.send(Request::Forget(id));
        if let Some(labels) = labels {
            self.want(id, labels);
        }
    }

    /// Sends the next batch unless one is being written or a failure's wait is not over:
    /// what was queued (and the whole view when due) whose id is in range and not held by
    /// the kvstore as last seen.
    pub fn pump(&mut self, state: &SyncState, range: IdRange, now: Instant) {
        if self.busy || self.not_before.is_some_and(|t| now < t) {
            return;
        }
        let whole_view = std::mem::take(&mut self.whole_view_due);
        // Only ids the kvstore does not hold are copied out of the view (at 65,280 objects
        // a copy of the whole view would be 18 MiB).
        let needs =
            |id: u32| range.contains(id) && !state.masters.contains_key(id.to_string().as_bytes());
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
        let wanted: Vec<(u32, LabelKey)> = wanted.into_iter().collect();
        if wanted.is_empty() {
            return;
        }
        self.busy = true;
        let _ = self.requests.send(Request::Reserve(wanted));
    }

    /// Folds in the task's answer; what to report when a write failed (the whole view is
    /// tried again after a wait).
    pub fn on_reply(&mut self, reply: Reply, now: Instant) -> Option<String> {
        self.held = reply.held;
        if reply.batch {
            self.busy = false;
        }
        let trouble = reply.trouble?;
        self.whole_view_due = true;
        self.not_before = Some(now + RETRY_AFTER_FAILURE);
        Some(trouble)
    }

    /// Stops taking requests and waits (up to `wait`) for the writes in flight; the
    /// reservations come back to be released, or `None` if the kvstore did not answer in time
    /// (they lapse with the lease).
    pub async fn finish(self, wait: Duration) -> Option<Reservations> {
        let ReservationTask { requests, task, .. } = self;
        drop(requests);
        let abort = task.abort_handle();
        match tokio::time::timeout(wait, task).await {
            Ok(Ok(r)) => Some(r),
            Ok(Err(_)) => None,
            Err(_) => {
                abort.abort();
                None
            }
        }
    }
}

/// The task's next answer; never, without reservations.
pub async fn next_reply(task: &mut Option<ReservationTask>) -> Option<Reply> {
    match task {
        Some(t) => t.replies.recv().await,
        None => std::future::pending().await,
    }
}
