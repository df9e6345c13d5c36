//! Sync's reservations in the kvstore (`--reserve-in-kvstore`, off by default): every
//! `CiliumIdentity` in range whose id the kvstore does not hold (objects CRD-mode agents
//! created, sync's own remap targets) is reserved there, so that a kvstore-mode agent's pool
//! drops the id and an agent allocating the same labels finds and reuses it: split
//! allocations are prevented instead of reported. Each write and delete is a decision-log
//! line and counted; the lease is kept alive, revoked at cutover (or on a clean stop with
//! `--release-reservations`), and then each master key written is deleted if it is unchanged
//! and no node uses it. A killed sync leaves its keys to lapse with the lease, unless it is
//! restarted: the decision log records each reservation's revision, and the restarted sync
//! takes over those still as written (`note_reservations`, `Reservations::adopt`).
//!
//! The reservations live in a task of their own (`ReservationTask`): an etcd write can take
//! up to the client's timeout on a stalled server, and sync's loop must keep following both
//! watches meanwhile. The loop queues what to reserve; the task writes one batch at a time
//! and replies; what arrives meanwhile gathers for the next batch. What to reserve, when,
//! and what each answer changes are `core::sync::reserve`'s rules (`Queue`, `Ledger`); this
//! module carries them out and logs each write before it is made.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::config::ServiceConfig;
use super::metrics::Metrics;
use crate::apply::executor::WriteGate;
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::labels::LabelKey;
use crate::core::planner::Kind;
pub use crate::core::sync::reserve::{Earlier, Reply, Said, Unreleased};
use crate::core::sync::reserve::{Ledger, Request, Unreserve};
use crate::error::{Error, Result};
use crate::io::decision_log::{DecisionLog, LogContents, Record};
use crate::io::kv_source::KvFollower;
use crate::io::reservation::{LEASE_TTL_SECS, Released, Reserved, Reserver};

/// What sync holds in the kvstore, and the connection that writes it.
pub struct Reservations {
    reserver: Reserver,
    prefix: String,
    lease: i64,
    ledger: Ledger,
    /// The lease was replaced (the old one lapsed) and not every key is back on it yet.
    lease_replaced: bool,
    /// Writes only while this is open (sync's lease, valid with margin): two syncs never
    /// both write, here as in Kubernetes.
    gate: Option<WriteGate>,
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
    /// deleted at once) and takes a lease; the task keeps it alive (`ReservationTask`).
    pub async fn start(conn: &KvFollower, prefix: &str) -> Result<Self> {
        let reserver = conn.reserver();
        reserver.probe_write(prefix).await?;
        let lease = reserver.grant_lease().await?;
        Ok(Reservations {
            reserver,
            prefix: prefix.to_string(),
            lease,
            ledger: Ledger::default(),
            lease_replaced: false,
            gate: None,
        })
    }

    /// Keeps the lease alive. If it is gone (etcd was out of reach longer than its TTL), a
    /// new one is taken and each `value/` key written goes back on it, for every master key
    /// still as written (what a failure leaves undone is done at the next call); what to
    /// tell the operator then.
    async fn keep_alive(&mut self, log: &DecisionLog, metrics: &Metrics) -> Result<Option<String>> {
        if !self.reserver.keep_alive(self.lease).await? {
            self.lease = self.reserver.grant_lease().await?;
            self.ledger.lease_lost();
            self.lease_replaced = true;
        }
        for id in self.ledger.take_to_unreserve() {
            self.object_deleted(id, log, metrics).await?;
        }
        if !self.ledger.restore_due() || !self.may_write() {
            return Ok(None);
        }
        let (mut restored, mut dropped) = (0, 0);
        // The gate is looked at before each write, not once for all of them: what is left
        // waits for the next keep-alive.
        while self.may_write()
            && let Some((id, labels, revision)) = self.ledger.next_to_restore()
        {
            let how = if self.lease_replaced {
                "again on a new lease (the old one expired): reserved"
            } else {
                "on this sync's lease (left by a write that failed): reserved"
            };
            let back = self
                .put_back(id, labels, revision, how, log, metrics)
                .await?;
            if back {
                restored += 1;
            } else {
                dropped += 1;
            }
        }
        metrics.kvstore_reservations.set(self.count() as i64);
        if !std::mem::take(&mut self.lease_replaced) {
            return Ok(Some(format!(
                "put {restored} reservations on this sync's lease that an earlier failure left undone ({dropped} changed since and left alone)"
            )));
        }
        Ok(Some(format!(
            "the kvstore reservation lease was gone (etcd out of reach longer than its {LEASE_TTL_SECS} s): a new lease holds {restored} reservations again ({dropped} changed since and left alone)"
        )))
    }

    /// Puts the `value/` key of `id`, reserved for `labels` with its master key written at
    /// `revision`, on this sync's lease if the master key is still as written: held then,
    /// else left alone and no longer held. Logged either way; `how` says how it went back.
    async fn put_back(
        &mut self,
        id: u32,
        labels: LabelKey,
        revision: i64,
        how: &str,
        log: &DecisionLog,
        metrics: &Metrics,
    ) -> Result<bool> {
        // The line first: a write is never made that the log does not announce.
        log.append(line(
            id,
            &labels,
            "reserving",
            format!("next: put value/{labels}/{RESERVATION_NODE} {how}, if id/{id} is still as written at revision {revision}"),
        ))?;
        let back = self
            .reserver
            .restore(&self.prefix, id, labels.as_bytes(), revision, self.lease)
            .await?;
        self.ledger.put_back(id, labels.clone(), revision, back);
        let what = if back {
            metrics.kvstore_writes.inc();
            format!("put value/{labels}/{RESERVATION_NODE} {how}")
        } else {
            format!(
                "id/{id} changed since it was written at revision {revision}: not held, nothing written"
            )
        };
        let mut l = line(id, &labels, "reserve-in-kvstore", what);
        l.kvstore_revision = back.then_some(revision);
        log.append(l)?;
        Ok(back)
    }

    /// Master keys written (their `value/` key may have gone with the object since).
    pub fn masters_written(&self) -> usize {
        self.ledger.masters_written()
    }

    /// Writes only while `gate` is open (sync's lease).
    pub fn gate_writes(&mut self, gate: WriteGate) {
        self.gate = Some(gate);
    }

    /// Whether a write may start now.
    fn may_write(&self) -> bool {
        self.gate.as_ref().is_none_or(|g| g.open())
    }

    /// Ids whose master key this sync wrote and still holds (with or without its `value/`
    /// key): its own, never a kvstore identity to create an object for.
    pub fn own_masters(&self) -> BTreeSet<u32> {
        self.ledger.own_masters()
    }

    /// Ids reserved now: master key and `value/` key.
    pub fn count(&self) -> usize {
        self.ledger.count()
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
        if !self.ledger.should_reserve(id, labels) {
            return Ok(());
        }
        // The line first: a write is never made that the log does not announce. Its outcome
        // (with the revision) follows; a crash between them leaves the intent, and the key
        // lapses with this sync's lease.
        log.append(line(
            id,
            labels,
            "reserving",
            format!("next: put id/{id} and value/{labels}/{RESERVATION_NODE}, only if id/{id} does not exist"),
        ))?;
        match self
            .reserver
            .reserve(&self.prefix, id, labels.as_bytes(), self.lease)
            .await?
        {
            Reserved::Written { revision } => {
                // Held before its outcome line: a log that fails now must not leave a
                // reservation this sync forgot (it is released at cutover like the rest, and
                // its intent line says it was about to be made).
                self.ledger.reserved(id, labels.clone(), revision);
                metrics.kvstore_writes.inc_by(2);
                let mut l = line(
                    id,
                    labels,
                    "reserve-in-kvstore",
                    format!(
                        "put id/{id} and value/{labels}/{RESERVATION_NODE} at revision {revision}: reserved"
                    ),
                );
                l.kvstore_revision = Some(revision);
                log.append(l)?;
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
                self.ledger.found_held(id);
            }
        }
        metrics.kvstore_reservations.set(self.count() as i64);
        Ok(())
    }

    /// The reserved object went from Kubernetes (GC, a person): its `value/` key goes too.
    /// While the lease is not valid, or when the delete fails, it is tried again at the next
    /// keep-alive.
    async fn object_deleted(
        &mut self,
        id: u32,
        log: &DecisionLog,
        metrics: &Metrics,
    ) -> Result<()> {
        let labels = match self.ledger.object_deleted(id, self.may_write()) {
            Unreserve::Nothing | Unreserve::Later => return Ok(()),
            Unreserve::Now(labels) => labels,
        };
        let announce = line(
            id,
            &labels,
            "unreserving",
            format!(
                "next: delete value/{labels}/{RESERVATION_NODE}: its CiliumIdentity was deleted"
            ),
        );
        if let Err(e) = log.append(announce) {
            self.ledger.unreserve_failed(id);
            return Err(e);
        }
        let deleted = match self
            .reserver
            .unreserve(&self.prefix, labels.as_bytes())
            .await
        {
            Ok(d) => d,
            Err(e) => {
                self.ledger.unreserve_failed(id);
                return Err(e);
            }
        };
        self.ledger.unreserved(id);
        metrics.kvstore_reservations.set(self.count() as i64);
        if deleted {
            metrics.kvstore_writes.inc();
            log.append(line(
                id,
                &labels,
                "unreserve",
                format!(
                    "deleted value/{labels}/{RESERVATION_NODE}: its CiliumIdentity was deleted"
                ),
            ))?;
        }
        Ok(())
    }

    /// Takes over what an earlier sync reserved (from its decision log) and did not release:
    /// each master key still as written (`revision`) is held again, and where Kubernetes
    /// still holds the object (`keep`) its `value/` key goes (back) on this sync's lease, so
    /// it outlives the earlier lease. What changed since is left alone.
    async fn adopt(
        &mut self,
        earlier: Vec<Earlier>,
        log: &DecisionLog,
        metrics: &Metrics,
    ) -> Result<Option<String>> {
        let (mut adopted, mut changed) = (0, 0);
        // Each is held at once; those whose object is gone wait for the release, the others
        // go back on this sync's lease here (what a failure leaves is put back at the next
        // keep-alive).
        self.ledger.adopt(earlier);
        // Only while the gate is open, looked at before each write (the rest goes back at a
        // keep-alive once it is).
        while self.may_write()
            && let Some((id, labels, revision)) = self.ledger.next_to_restore()
        {
            let how = format!(
                "on this sync's lease: adopted from an earlier sync (id/{id} as written at revision {revision})"
            );
            if self
                .put_back(id, labels, revision, &how, log, metrics)
                .await?
            {
                adopted += 1;
            } else {
                changed += 1;
            }
        }
        metrics.kvstore_reservations.set(self.count() as i64);
        if adopted + changed == 0 {
            return Ok(None);
        }
        Ok(Some(format!(
            "took over {adopted} reservations an earlier sync made and did not release ({changed} changed since and left alone)"
        )))
    }

    /// The master key at `id` is gone: a reservation of it, or a finding that it was held,
    /// no longer holds, so the id is reserved again if Kubernetes still holds it.
    async fn forget(&mut self, id: u32, metrics: &Metrics) {
        // What the key holds now decides (see `Ledger::forget`); unread, it is forgotten.
        let now_at = self
            .reserver
            .master_revision(&self.prefix, id)
            .await
            .ok()
            .flatten();
        self.ledger.forget(id, now_at);
        metrics.kvstore_reservations.set(self.count() as i64);
    }

    /// Revokes the lease (every `value/` key of the tool's goes), then deletes each master
    /// key written that is unchanged and unused.
    /// Only while the Lease's gate is open, looked at before each write: a release that
    /// starts seconds after the holding was checked (the writer finishing what it was sent)
    /// must not write for a sync that no longer holds it.
    pub async fn release(self, log: &DecisionLog, metrics: &Metrics) -> Result<usize> {
        let closed = || {
            Error::Config(
                "the one-writer lease is not held now, so this sync writes nothing more".into(),
            )
        };
        if !self.may_write() {
            return Err(closed());
        }
        self.reserver.revoke(self.lease).await?;
        let mut deleted = 0;
        for (id, labels, revision) in &self.ledger.to_release() {
            if !self.may_write() {
                return Err(closed());
            }
            // The line first; a log that cannot be written stops the release (what is left
            // stays, as a killed sync leaves it, and is released by the next cutover).
            log.append(line(
                *id,
                labels,
                "releasing",
                format!("next: delete id/{id} if still as written at revision {revision} and no node uses it"),
            ))?;
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
            log.append(line(*id, labels, "release-reservation", what))?;
        }
        metrics.kvstore_reservations.set(0);
        Ok(deleted)
    }
}

/// Folds one decision log (logs in order) into the reservations recorded as made and not
/// released: what a sync restarted (after a crash, an upgrade, or on another host) takes over.
pub fn note_reservations(made: &mut Unreleased, log: &LogContents) {
    for r in &log.records {
        let Ok(id) = r.id.parse::<u32>() else {
            continue;
        };
        match (r.action.as_deref(), r.kvstore_revision) {
            (Some("reserve-in-kvstore"), Some(revision)) => {
                made.insert(id, (r.labels.clone(), revision));
            }
            (Some("release-reservation"), _) => {
                made.remove(&id);
            }
            _ => {}
        }
    }
}

/// How often the reservations' lease is kept alive: well within its 15 minutes, and soon
/// enough after an outage to find a lease that expired meanwhile.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(60);

/// Sync's reservations, written by a task of their own (see the module's comment).
pub struct ReservationTask {
    requests: mpsc::UnboundedSender<Request>,
    replies: mpsc::UnboundedReceiver<Reply>,
    task: JoinHandle<Reservations>,
}

impl ReservationTask {
    /// Hands the reservations to a task of their own.
    pub fn spawn(mut r: Reservations, cfg: Arc<ServiceConfig>, metrics: Arc<Metrics>) -> Self {
        let (requests, mut rx) = mpsc::unbounded_channel::<Request>();
        let (reply_tx, replies) = mpsc::unbounded_channel::<Reply>();
        let task = tokio::spawn(async move {
            let mut keep_alive = tokio::time::interval(KEEP_ALIVE_EVERY);
            // A long batch delays the next keep-alive; missed ones are not made up in a burst.
            keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            keep_alive.tick().await;
            let mut masters_sent = BTreeSet::new();
            loop {
                let mut failed = false;
                let (batch, result) = tokio::select! {
                    req = rx.recv() => match req {
                        // The loop is gone (the sync ended): the reservations go back.
                        None => return r,
                        Some(Request::Reserve(wanted)) => {
                            let mut result = Ok(None);
                            for (id, labels) in wanted {
                                if !r.may_write() {
                                    // The lease is not valid now: the view is looked at
                                    // again once it is.
                                    failed = true;
                                    break;
                                }
                                if let Err(e) = r.reserve_one(id, &labels, &cfg.log, &metrics).await {
                                    // Perhaps the lease is gone (etcd was out of reach
                                    // longer than its TTL): found out now, not in a minute.
                                    result = match r.keep_alive(&cfg.log, &metrics).await {
                                        Ok(Some(renewed)) => Ok(Some(renewed)),
                                        _ => Err(e),
                                    };
                                    failed = true;
                                    break;
                                }
                            }
                            (true, result)
                        }
                        Some(Request::Unreserve(id)) => {
                            (false, r.object_deleted(id, &cfg.log, &metrics).await.map(|()| None))
                        }
                        Some(Request::Forget(id)) => {
                            r.forget(id, &metrics).await;
                            (false, Ok(None))
                        }
                        Some(Request::Adopt(earlier)) => {
                            (false, r.adopt(earlier, &cfg.log, &metrics).await)
                        }
                    },
                    _ = keep_alive.tick() => (false, r.keep_alive(&cfg.log, &metrics).await),
                };
                let said = match result {
                    Ok(None) => None,
                    Ok(Some(note)) => Some(Said::Note(note)),
                    Err(e) => Some(Said::Trouble(format!("reserving in the kvstore: {e}"))),
                };
                let masters = r.own_masters();
                let own_masters = (masters != masters_sent).then(|| masters.clone());
                masters_sent = masters;
                if !batch && said.is_none() && own_masters.is_none() {
                    continue;
                }
                let _ = reply_tx.send(Reply {
                    held: r.count(),
                    own_masters,
                    batch,
                    failed,
                    said,
                });
            }
        });
        ReservationTask {
            requests,
            replies,
            task,
        }
    }

    /// Sends what the shell's queue asks for, in order.
    pub fn send(&self, requests: Vec<Request>) {
        for request in requests {
            let _ = self.requests.send(request);
        }
    }

    /// The task's next answer.
    pub async fn next_reply(&mut self) -> Option<Reply> {
        self.replies.recv().await
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
        Some(t) => t.next_reply().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(id: u32, labels: &str, action: &str, revision: Option<i64>) -> Record {
        let mut r = line(id, labels, action, String::new());
        r.kvstore_revision = revision;
        r
    }

    #[test]
    fn a_restart_takes_over_what_was_reserved_and_not_released_at_the_revision_last_written() {
        let first = LogContents {
            records: vec![
                reservation(4000, "k8s:app=a;", "reserve-in-kvstore", Some(10)),
                reservation(4001, "k8s:app=b;", "reserve-in-kvstore", Some(11)),
                reservation(4002, "k8s:app=c;", "reserve-in-kvstore", Some(12)),
                // Found held by another: nothing written, no revision.
                reservation(4003, "k8s:app=d;", "reserve-in-kvstore", None),
                // Its object went: the master key is still the tool's.
                reservation(4001, "k8s:app=b;", "unreserve", None),
            ],
            ..Default::default()
        };
        let second = LogContents {
            records: vec![
                reservation(4000, "k8s:app=a;", "release-reservation", None),
                // Taken over by a restart: the same master key, the revision carried on.
                reservation(4002, "k8s:app=c;", "reserve-in-kvstore", Some(12)),
                // Written again after Cilium's GC removed it: the newer revision counts.
                reservation(4000, "k8s:app=a;", "reserve-in-kvstore", Some(20)),
            ],
            ..Default::default()
        };
        let mut made = Unreleased::new();
        note_reservations(&mut made, &first);
        note_reservations(&mut made, &second);
        let got: Vec<(u32, &str, i64)> = made
            .iter()
            .map(|(id, (l, rev))| (*id, l.as_str(), *rev))
            .collect();
        assert_eq!(
            got,
            [
                (4000, "k8s:app=a;", 20),
                (4001, "k8s:app=b;", 11),
                (4002, "k8s:app=c;", 12),
            ]
        );
    }
}
