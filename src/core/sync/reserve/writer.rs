//! The reservation writer, written once: what it does with each request from the loop and
//! at each keep-alive (what the gate held back goes at the loop's next batch, once the gate
//! is open, or at a keep-alive), carried out over `KvWrites` (etcd and the decision log beneath it).
//! The binary runs it in a task of its own against etcd (`app::reserve`); the simulation
//! runs the very same code against its simulated etcd, polling each call to its end at once.
//! Each write is announced in the decision log before it is made, and made only while the
//! Lease's gate is open, looked at before each write.

use std::collections::BTreeSet;

use super::{
    Earlier, Ledger, RELEASE_RESERVATION, RESERVE_IN_KVSTORE, Reply, Request, Said, Unreserve,
};
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::labels::LabelKey;

/// Cilium's lease TTL for its `value/` keys: a reservation left behind by a killed sync
/// lapses as an agent's would.
pub const LEASE_TTL_SECS: i64 = 900;

/// What a reservation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Both keys written at this revision (the master key's `mod_revision`).
    Written { revision: i64 },
    /// The master key exists, holding this label key: nothing written.
    Held(Vec<u8>),
}

/// What releasing a master key did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    Deleted,
    /// Left in place, with why (changed since, or another node's `value/` key uses it).
    Kept(&'static str),
}

/// A decision-log line about a kvstore write: `action` is what sync did (a rule's, never a
/// person's), `kvstore` what it did or is about to do, `revision` the master key's when a
/// reservation was made (a restart takes over those not released).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteLine {
    pub id: u32,
    pub labels: LabelKey,
    pub action: &'static str,
    pub kvstore: String,
    pub revision: Option<i64>,
}

impl WriteLine {
    /// The line as the decision log records it: a rule's decision on the id, with the
    /// kvstore's keys and revision.
    pub fn record(self) -> crate::core::decision_log::Record {
        let mut r = crate::core::decision_log::Record::decision(
            &self.id.to_string(),
            &self.labels,
            crate::core::planner::Kind::Create,
            (self.action, "rule"),
            Some(self.id),
        );
        r.kvstore = Some(self.kvstore);
        r.kvstore_revision = self.revision;
        r
    }
}

/// What the writer needs beneath it: the decision log, the write gate, etcd's operations on
/// the tool's own keys (each failure as the text to tell the operator), and the counters.
///
/// Its futures are not required to be `Send`: the binary's one implementation is, at its
/// concrete type, and the simulation's never leaves the thread.
#[allow(async_fn_in_trait)]
pub trait KvWrites {
    /// A write may start now (the Lease held, valid with margin).
    fn may_write(&self) -> bool;
    /// Appends a line to the decision log.
    fn log(&mut self, line: WriteLine) -> Result<(), String>;
    /// `n` etcd writes made, and `held` reservations held now (for the metrics).
    fn counted(&mut self, _n: u64, _held: usize) {}
    /// A lease of the tool's own (`LEASE_TTL_SECS`), for its `value/` keys.
    async fn grant(&mut self) -> Result<i64, String>;
    /// Keeps `lease` alive; `false` when it is gone (expired).
    async fn keep_alive(&mut self, lease: i64) -> Result<bool, String>;
    /// Writes `id/<id>` and its `value/` key on `lease`, only if the master key does not exist.
    async fn reserve(&mut self, id: u32, labels: &LabelKey, lease: i64)
    -> Result<Reserved, String>;
    /// Puts the `value/` key on `lease`, only if `id/<id>` is still as written at `revision`.
    async fn restore(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
        lease: i64,
    ) -> Result<bool, String>;
    /// Deletes the `value/` key of `labels`; whether there was one.
    async fn unreserve(&mut self, labels: &LabelKey) -> Result<bool, String>;
    /// The master key's `mod_revision` now (`None`: gone, or not read).
    async fn master_revision(&mut self, id: u32) -> Option<i64>;
    /// Revokes `lease`: every `value/` key on it goes.
    async fn revoke(&mut self, lease: i64) -> Result<(), String>;
    /// Deletes `id/<id>` if still as written at `revision` and no node's `value/` key uses it.
    async fn release(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
    ) -> Result<Released, String>;
}

/// What sync holds in the kvstore and the lease it holds it on.
#[derive(Debug)]
pub struct Writer {
    lease: i64,
    ledger: Ledger,
    /// The lease was replaced (the old one lapsed) and not every key is back on it yet.
    lease_replaced: bool,
    /// The master keys last reported to the loop; `None` once an adoption is to be
    /// answered: the loop counts what the logs record as its own until then, and is told
    /// what the writer holds even if it is what it held before.
    masters_sent: Option<BTreeSet<u32>>,
}

fn line(id: u32, labels: &LabelKey, action: &'static str, kvstore: String) -> WriteLine {
    WriteLine {
        id,
        labels: labels.clone(),
        action,
        kvstore,
        revision: None,
    }
}

/// The release could not start or go on: the Lease is not this sync's now.
pub const NOT_HOLDING: &str =
    "the one-writer lease is not held now, so this sync writes nothing more";

impl Writer {
    /// A writer holding nothing yet, on `lease`.
    pub fn new(lease: i64) -> Self {
        Writer {
            lease,
            ledger: Ledger::default(),
            lease_replaced: false,
            masters_sent: Some(BTreeSet::new()),
        }
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Master keys written (their `value/` key may have gone with the object since).
    pub fn masters_written(&self) -> usize {
        self.ledger.masters_written()
    }

    /// One batch from the loop, each request carried out in order; the answer to send back
    /// (always: it lets the next batch go). The first trouble met is what is said.
    pub async fn handle(&mut self, batch: Vec<Request>, io: &mut impl KvWrites) -> Reply {
        let (mut failed, mut result) = (false, Ok(None));
        for request in batch {
            let (stopped, r) = self.one(request, io).await;
            failed |= stopped;
            result = match (result, r) {
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                (Ok(note), Ok(later)) => Ok(note.or(later)),
            };
        }
        self.reply(true, failed, result)
    }

    /// One request: whether it stopped at a failed write or a closed gate, and what to say.
    async fn one(
        &mut self,
        request: Request,
        io: &mut impl KvWrites,
    ) -> (bool, Result<Option<String>, String>) {
        match request {
            Request::Reserve(wanted) => {
                for (id, labels) in wanted {
                    if !io.may_write() {
                        // The lease is not valid now: the view is looked at again once it is.
                        return (true, Ok(None));
                    }
                    if let Err(e) = self.reserve_one(id, &labels, io).await {
                        // Perhaps the lease is gone (etcd was out of reach longer than its
                        // TTL): found out now, not at the next keep-alive.
                        let result = match self.keep_alive(io).await {
                            Ok(Some(renewed)) => Ok(Some(renewed)),
                            _ => Err(e),
                        };
                        return (true, result);
                    }
                }
                (false, Ok(None))
            }
            Request::Unreserve(id) => (false, self.object_deleted(id, io).await.map(|()| None)),
            Request::Forget(id) => {
                // What the key holds now decides (see `Ledger::forget`); unread, forgotten.
                let now_at = io.master_revision(id).await;
                self.ledger.forget(id, now_at);
                io.counted(0, self.ledger.count());
                (false, Ok(None))
            }
            Request::Adopt(earlier) => {
                self.masters_sent = None;
                (false, self.adopt(earlier, io).await)
            }
            Request::LookAgain => {
                self.ledger.look_again();
                (false, Ok(None))
            }
            Request::Deferred => (false, self.deferred(io).await),
        }
    }

    /// The keep-alive's turn; the answer to send back, if there is something to say.
    pub async fn tick(&mut self, io: &mut impl KvWrites) -> Option<Reply> {
        let result = self.keep_alive(io).await;
        let reply = self.reply(false, false, result);
        (reply.said.is_some() || reply.own_masters.is_some()).then_some(reply)
    }

    fn reply(
        &mut self,
        batch: bool,
        failed: bool,
        result: Result<Option<String>, String>,
    ) -> Reply {
        let said = match result {
            Ok(None) => None,
            Ok(Some(note)) => Some(Said::Note(note)),
            Err(e) => Some(Said::Trouble(format!("reserving in the kvstore: {e}"))),
        };
        let masters = self.ledger.own_masters();
        let own_masters = (self.masters_sent.as_ref() != Some(&masters)).then(|| masters.clone());
        self.masters_sent = Some(masters);
        Reply {
            held: self.ledger.count(),
            own_masters,
            batch,
            failed,
            deferred: self.ledger.deferred(),
            said,
        }
    }

    /// Keeps the lease alive. If it is gone (etcd was out of reach longer than its TTL), a
    /// new one is taken and each `value/` key written goes back on it, for every master key
    /// still as written (what a failure leaves undone is done at the next call); what to
    /// tell the operator then.
    async fn keep_alive(&mut self, io: &mut impl KvWrites) -> Result<Option<String>, String> {
        if !io.keep_alive(self.lease).await? {
            self.lease = io.grant().await?;
            self.ledger.lease_lost();
            self.lease_replaced = true;
        }
        self.deferred(io).await
    }

    /// What was left for the gate or a retry (`Ledger::deferred`): the deletes of `value/`
    /// keys whose object went, then the `value/` keys to put back on this sync's lease,
    /// each only while the gate is open; what to tell the operator then.
    async fn deferred(&mut self, io: &mut impl KvWrites) -> Result<Option<String>, String> {
        for id in self.ledger.take_to_unreserve() {
            self.object_deleted(id, io).await?;
        }
        if !self.ledger.restore_due() || !io.may_write() {
            return Ok(None);
        }
        let (mut restored, mut dropped) = (0, 0);
        // The gate is looked at before each write, not once for all of them: what is left
        // waits for the loop's next batch with the gate open (`Request::Deferred`).
        while io.may_write()
            && let Some((id, labels, revision)) = self.ledger.next_to_restore()
        {
            let how = if self.lease_replaced {
                "again on a new lease (the old one expired): reserved"
            } else {
                "on this sync's lease (left by a write that failed): reserved"
            };
            if self.put_back(id, labels, revision, how, io).await? {
                restored += 1;
            } else {
                dropped += 1;
            }
        }
        io.counted(0, self.ledger.count());
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
        io: &mut impl KvWrites,
    ) -> Result<bool, String> {
        // The line first: a write is never made that the log does not announce.
        io.log(line(
            id,
            &labels,
            "reserving",
            format!("next: put value/{labels}/{RESERVATION_NODE} {how}, if id/{id} is still as written at revision {revision}"),
        ))?;
        let back = io.restore(id, &labels, revision, self.lease).await?;
        self.ledger.put_back(id, labels.clone(), revision, back);
        let what = if back {
            io.counted(1, self.ledger.count());
            format!("put value/{labels}/{RESERVATION_NODE} {how}")
        } else {
            format!(
                "id/{id} changed since it was written at revision {revision}: not held, nothing written"
            )
        };
        let mut l = line(id, &labels, RESERVE_IN_KVSTORE, what);
        l.revision = back.then_some(revision);
        io.log(l)?;
        Ok(back)
    }

    /// Reserves `id` for `labels` unless it was reserved or found held before. The loop has
    /// checked that the id is in range and that the kvstore did not hold it when last seen;
    /// the write itself succeeds only if the master key does not exist.
    async fn reserve_one(
        &mut self,
        id: u32,
        labels: &LabelKey,
        io: &mut impl KvWrites,
    ) -> Result<(), String> {
        if !self.ledger.should_reserve(id, labels) {
            return Ok(());
        }
        // The line first: a write is never made that the log does not announce. Its outcome
        // (with the revision) follows; a crash between them leaves the intent, and the key
        // lapses with this sync's lease.
        io.log(line(
            id,
            labels,
            "reserving",
            format!("next: put id/{id} and value/{labels}/{RESERVATION_NODE}, only if id/{id} does not exist"),
        ))?;
        match io.reserve(id, labels, self.lease).await? {
            Reserved::Written { revision } => {
                // Held before its outcome line: a log that fails now must not leave a
                // reservation this sync forgot (it is released at cutover like the rest, and
                // its intent line says it was about to be made).
                self.ledger.reserved(id, labels.clone(), revision);
                io.counted(2, self.ledger.count());
                let mut l = line(
                    id,
                    labels,
                    RESERVE_IN_KVSTORE,
                    format!(
                        "put id/{id} and value/{labels}/{RESERVATION_NODE} at revision {revision}: reserved"
                    ),
                );
                l.revision = Some(revision);
                io.log(l)?;
            }
            Reserved::Held(other) => {
                io.log(line(
                    id,
                    labels,
                    RESERVE_IN_KVSTORE,
                    format!(
                        "id/{id} already held for {}: nothing written",
                        String::from_utf8_lossy(&other)
                    ),
                ))?;
                self.ledger.found_held(id);
            }
        }
        io.counted(0, self.ledger.count());
        Ok(())
    }

    /// The reserved object went from Kubernetes (GC, a person): its `value/` key goes too.
    /// While the lease is not valid, or when the delete fails, it is tried again later
    /// (`Request::Deferred`, or a keep-alive).
    async fn object_deleted(&mut self, id: u32, io: &mut impl KvWrites) -> Result<(), String> {
        let labels = match self.ledger.object_deleted(id, io.may_write()) {
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
        if let Err(e) = io.log(announce) {
            self.ledger.unreserve_failed(id);
            return Err(e);
        }
        let deleted = match io.unreserve(&labels).await {
            Ok(d) => d,
            Err(e) => {
                self.ledger.unreserve_failed(id);
                return Err(e);
            }
        };
        self.ledger.unreserved(id);
        io.counted(u64::from(deleted), self.ledger.count());
        if deleted {
            io.log(line(
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
    /// each master key still as written is held again, and where Kubernetes still holds the
    /// object its `value/` key goes (back) on this sync's lease, so it outlives the earlier
    /// lease. What changed since is left alone.
    async fn adopt(
        &mut self,
        earlier: Vec<Earlier>,
        io: &mut impl KvWrites,
    ) -> Result<Option<String>, String> {
        let (mut adopted, mut changed) = (0, 0);
        // One whose object is gone is held only while its master key is still as written:
        // one Cilium's GC took (or an agent wrote again) is not this sync's to release, and
        // held, it would keep its id from being reserved again.
        let mut still = Vec::with_capacity(earlier.len());
        for e in earlier {
            if !e.keep && io.master_revision(e.id).await != Some(e.revision) {
                changed += 1;
                continue;
            }
            still.push(e);
        }
        // Each is held at once; those whose object is gone wait for the release, the others
        // go back on this sync's lease here (what a failure leaves is put back later).
        self.ledger.adopt(still);
        // Only while the gate is open, looked at before each write (the rest goes back with
        // the loop's next batch once it is, `Request::Deferred`).
        while io.may_write()
            && let Some((id, labels, revision)) = self.ledger.next_to_restore()
        {
            let how = format!(
                "on this sync's lease: adopted from an earlier sync (id/{id} as written at revision {revision})"
            );
            if self.put_back(id, labels, revision, &how, io).await? {
                adopted += 1;
            } else {
                changed += 1;
            }
        }
        io.counted(0, self.ledger.count());
        if adopted + changed == 0 {
            return Ok(None);
        }
        Ok(Some(format!(
            "took over {adopted} reservations an earlier sync made and did not release ({changed} changed since and left alone)"
        )))
    }

    /// Revokes the lease (every `value/` key of the tool's goes), then deletes each master
    /// key written that is unchanged and unused; how many were deleted. Only while the
    /// Lease's gate is open, looked at before each write: a release that starts seconds
    /// after the holding was checked (the writer finishing what it was sent) must not write
    /// for a sync that no longer holds it.
    pub async fn release(&mut self, io: &mut impl KvWrites) -> Result<usize, String> {
        if !io.may_write() {
            return Err(NOT_HOLDING.into());
        }
        io.revoke(self.lease).await?;
        let mut deleted = 0;
        for (id, labels, revision) in self.ledger.to_release() {
            if !io.may_write() {
                return Err(NOT_HOLDING.into());
            }
            // The line first; a log that cannot be written stops the release (what is left
            // stays, as a killed sync leaves it, and is released by the next cutover).
            io.log(line(
                id,
                &labels,
                "releasing",
                format!("next: delete id/{id} if still as written at revision {revision} and no node uses it"),
            ))?;
            let what = match io.release(id, &labels, revision).await? {
                Released::Deleted => {
                    io.counted(1, 0);
                    deleted += 1;
                    format!("deleted id/{id} (written at revision {revision}): released")
                }
                Released::Kept(why) => format!("kept id/{id}: {why}"),
            };
            io.log(line(id, &labels, RELEASE_RESERVATION, what))?;
        }
        io.counted(0, 0);
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests;
