//! Sync's reservations in the simulated etcd (`--reserve-in-kvstore`): core's `Queue` and
//! `Ledger` carried out as `app::reserve` carries them out. The loop's requests wait in an
//! inbox until the writer's turn (a step of its own, as the writer is a task of its own);
//! each write is logged first, and only while the Lease's gate is open; the etcd lease
//! holding the `value/` keys is kept alive at each status tick and may lapse (a crash, a
//! long outage), after which the keys go back on a new one; at cutover the lease is
//! revoked and each master key written is deleted if unchanged and unused. Checked: the
//! only master keys deleted are sync's own as written, and everything this instance held is
//! released at cutover.

use std::collections::{BTreeSet, VecDeque};

use super::log::{LogLine, unreleased};
use super::report::Failure;
use super::world::{ResWrite, World};
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::labels::LabelKey;
use crate::core::rng::Rng;
use crate::core::sync::reserve::{Earlier, Ledger, Reply, Request, Said, Unreserve};

/// One instance's reservations: the loop's queue, the writer's ledger, and the requests in
/// between.
#[derive(Debug)]
pub struct SimReserver {
    ledger: Ledger,
    inbox: VecDeque<Request>,
    lease: u64,
    /// The master keys last reported to the loop.
    masters_sent: BTreeSet<u32>,
    /// Released at cutover: nothing more is written.
    pub released: bool,
    /// What it did in etcd since the trace last took it.
    pub done: Vec<String>,
}

/// What the writer meets: the world, the instance's log and gate, and the faults.
pub struct Writer<'a> {
    pub world: &'a mut World,
    pub log: &'a mut Vec<LogLine>,
    pub may_write: bool,
    /// The log cannot be written.
    pub disk_full: bool,
    /// etcd times out now and then.
    pub flaky: bool,
    pub rng: &'a mut Rng,
    /// The instance it writes for, and the first write it made that it may not have made.
    pub idx: usize,
    pub violation: Option<Failure>,
}

impl Writer<'_> {
    /// A decision-log line, or the failure of writing it (disk full).
    fn append(&mut self, line: LogLine) -> Result<(), String> {
        if self.disk_full {
            return Err("the decision log: disk full".into());
        }
        self.log.push(line);
        Ok(())
    }

    /// A write to etcd about to be made: checked on every one, the gate closed or not, to be
    /// this instance's alone (the Lease held and valid, no other gate open).
    fn writing(&mut self, what: &str) {
        let i = self.idx;
        if let Err(f) = self.world.check_sole_writer(i, &format!("i{i} {what}")) {
            self.violation.get_or_insert(f);
        }
    }

    /// etcd answers, or times out now and then (a rollout is no quiet time).
    fn etcd_up(&mut self) -> Result<(), String> {
        if self.flaky && self.rng.chance(0.03) {
            return Err("etcd: context deadline exceeded".into());
        }
        Ok(())
    }
}

impl SimReserver {
    /// Starts with a lease of its own (`Reservations::start`).
    pub fn start(world: &mut World) -> Self {
        SimReserver {
            ledger: Ledger::default(),
            inbox: VecDeque::new(),
            lease: world.res_grant(),
            masters_sent: BTreeSet::new(),
            released: false,
            done: Vec::new(),
        }
    }

    /// What the shell's queue asks for, into the writer's inbox.
    pub fn send(&mut self, requests: Vec<Request>) {
        self.inbox.extend(requests);
    }

    pub fn lease(&self) -> u64 {
        self.lease
    }

    /// The writer's turn: every request in the inbox, as `ReservationTask`'s loop takes
    /// them; the replies, in order.
    pub fn work(&mut self, w: &mut Writer<'_>) -> Result<Vec<Reply>, Failure> {
        let mut replies = Vec::new();
        while let Some(request) = self.inbox.pop_front() {
            let mut failed = false;
            let (batch, result) = match request {
                Request::Reserve(wanted) => {
                    let mut result = Ok(None);
                    for (id, labels) in wanted {
                        if !w.may_write {
                            failed = true;
                            break;
                        }
                        if let Err(e) = self.reserve_one(id, &labels, w) {
                            result = match self.keep_alive(w) {
                                Ok(Some(renewed)) => Ok(Some(renewed)),
                                _ => Err(e),
                            };
                            failed = true;
                            break;
                        }
                    }
                    (true, result)
                }
                Request::Unreserve(id) => (false, self.object_deleted(id, w).map(|()| None)),
                Request::Forget(id) => {
                    let now_at = w.world.master_revs.get(&id.to_string()).copied();
                    self.ledger.forget(id, now_at);
                    (false, Ok(None))
                }
                Request::Adopt(earlier) => (false, self.adopt(earlier, w)),
            };
            if let Some(reply) = self.reply(batch, failed, result) {
                replies.push(reply);
            }
        }
        w.violation.take().map_or(Ok(replies), Err)
    }

    /// The keep-alive's turn (`KEEP_ALIVE_EVERY`), a reply if it has something to say.
    pub fn tick(&mut self, w: &mut Writer<'_>) -> Result<Option<Reply>, Failure> {
        if self.released {
            return Ok(None);
        }
        let result = self.keep_alive(w);
        let reply = self.reply(false, false, result);
        w.violation.take().map_or(Ok(reply), Err)
    }

    fn reply(
        &mut self,
        batch: bool,
        failed: bool,
        result: Result<Option<String>, String>,
    ) -> Option<Reply> {
        let said = match result {
            Ok(None) => None,
            Ok(Some(note)) => Some(Said::Note(note)),
            Err(e) => Some(Said::Trouble(format!("reserving in the kvstore: {e}"))),
        };
        let masters = self.ledger.own_masters();
        let own_masters = (masters != self.masters_sent).then(|| masters.clone());
        self.masters_sent = masters;
        if !batch && said.is_none() && own_masters.is_none() {
            return None;
        }
        Some(Reply {
            held: self.ledger.count(),
            own_masters,
            batch,
            failed,
            said,
        })
    }

    fn reserve_one(
        &mut self,
        id: u32,
        labels: &LabelKey,
        w: &mut Writer<'_>,
    ) -> Result<(), String> {
        if !self.ledger.should_reserve(id, labels) {
            return Ok(());
        }
        w.append(LogLine::Reserving { id })?;
        w.etcd_up()?;
        w.writing(&format!("reserved {id}"));
        match w.world.res_reserve(id, labels, self.lease) {
            ResWrite::Written(revision) => {
                self.done
                    .push(format!("reserved {id} at revision {revision}"));
                self.ledger.reserved(id, labels.clone(), revision);
                w.append(LogLine::Reserved {
                    id,
                    labels: labels.clone(),
                    revision,
                })?;
            }
            ResWrite::Held(_) => {
                w.append(LogLine::Reserving { id })?;
                self.ledger.found_held(id);
            }
            ResWrite::LeaseGone => return Err("etcd: requested lease not found".into()),
        }
        Ok(())
    }

    fn object_deleted(&mut self, id: u32, w: &mut Writer<'_>) -> Result<(), String> {
        let labels = match self.ledger.object_deleted(id, w.may_write) {
            Unreserve::Nothing | Unreserve::Later => return Ok(()),
            Unreserve::Now(labels) => labels,
        };
        if let Err(e) = w
            .append(LogLine::Reserving { id })
            .and_then(|()| w.etcd_up())
        {
            self.ledger.unreserve_failed(id);
            return Err(e);
        }
        w.writing(&format!("unreserved {id}"));
        w.world.res_unreserve(&labels);
        self.done.push(format!("unreserved {id}"));
        self.ledger.unreserved(id);
        Ok(())
    }

    fn keep_alive(&mut self, w: &mut Writer<'_>) -> Result<Option<String>, String> {
        w.etcd_up()?;
        if !w.world.res_keep_alive(self.lease) {
            self.lease = w.world.res_grant();
            self.ledger.lease_lost();
        }
        for id in self.ledger.take_to_unreserve() {
            self.object_deleted(id, w)?;
        }
        if !self.ledger.restore_due() || !w.may_write {
            return Ok(None);
        }
        let mut restored = 0;
        // The gate is looked at before each write, not once for all of them.
        while w.may_write
            && let Some((id, labels, revision)) = self.ledger.next_to_restore()
        {
            restored += usize::from(self.put_back(id, labels, revision, w)?);
        }
        Ok(Some(format!(
            "a new lease holds {restored} reservations again"
        )))
    }

    fn put_back(
        &mut self,
        id: u32,
        labels: LabelKey,
        revision: i64,
        w: &mut Writer<'_>,
    ) -> Result<bool, String> {
        w.append(LogLine::Reserving { id })?;
        w.etcd_up()?;
        w.writing(&format!("put back {id}"));
        let back = w.world.res_restore(id, &labels, revision, self.lease);
        self.done
            .push(format!("put back {id} (as written at {revision}): {back}"));
        self.ledger.put_back(id, labels.clone(), revision, back);
        if back {
            w.append(LogLine::Reserved {
                id,
                labels,
                revision,
            })?;
        }
        Ok(back)
    }

    fn adopt(
        &mut self,
        earlier: Vec<Earlier>,
        w: &mut Writer<'_>,
    ) -> Result<Option<String>, String> {
        let mut adopted = 0;
        self.ledger.adopt(earlier);
        // Held at once; put back only while the gate is open (the rest at a keep-alive).
        while w.may_write
            && let Some((id, labels, revision)) = self.ledger.next_to_restore()
        {
            adopted += usize::from(self.put_back(id, labels, revision, w)?);
        }
        Ok((adopted > 0).then(|| format!("took over {adopted} reservations")))
    }

    /// Cutover: the lease revoked (every `value/` key of this sync's goes), then each master
    /// key written deleted if unchanged and unused, each with its log line first. Checks
    /// that only sync's own master keys go, and that nothing this instance held is left.
    pub fn release(&mut self, i: usize, w: &mut Writer<'_>) -> Result<(), Failure> {
        self.released = true;
        self.inbox.clear();
        if !w.may_write {
            // Not this sync's to write now: they lapse with the lease.
            self.done.push("not released: the gate is closed".into());
            return w.violation.take().map_or(Ok(()), Err);
        }
        w.writing("revoked its reservation lease");
        w.world.res_revoke(self.lease);
        for (id, labels, revision) in self.ledger.to_release() {
            let key = id.to_string();
            let was = (
                w.world.master_revs.get(&key).copied(),
                w.world.masters.get(&key).cloned(),
            );
            w.writing(&format!("released {id}"));
            if !w.world.res_release(id, &labels, revision) {
                // In use (or changed): a node's now, no longer sync's; logged as released
                // with why, as `app::reserve` logs it (`release-reservation`, kept).
                self.done.push(format!("kept {id}"));
                w.log.push(LogLine::Released { id });
                continue;
            }
            self.done.push(format!("released {id}"));
            if w.world.sync_masters.get(&key) != was.0.as_ref()
                || was.1.as_deref() != Some(labels.as_str())
            {
                return Err(Failure::new(
                    "etcd writes only to sync's own keys",
                    format!(
                        "i{i} released id/{id} at {:?} holding {:?}, not a key it wrote ({revision})",
                        was.0, was.1
                    ),
                ));
            }
            w.log.push(LogLine::Released { id });
        }
        // Held against the log, not the ledger: what it records as reserved and not
        // released, still as written and used by no node, is left behind.
        let left: Vec<String> = unreleased(w.log)
            .into_iter()
            .filter(|(id, (labels, revision))| {
                let key = id.to_string();
                let unused = !w.world.values.keys().any(|(l, _)| l == labels.as_str());
                w.world.master_revs.get(&key) == Some(revision) && unused
            })
            .map(|(id, (labels, _))| format!("{id} ({labels})"))
            .collect();
        let values_left = w
            .world
            .res_value_lease
            .values()
            .filter(|l| **l == self.lease)
            .count();
        if let Some(f) = w.violation.take() {
            return Err(f);
        }
        if !left.is_empty() || values_left > 0 {
            return Err(Failure::new(
                "reservations all released at cutover",
                format!(
                    "i{i} left master keys {left:?} and {values_left} `value/{{labels}}/{RESERVATION_NODE}` keys"
                ),
            ));
        }
        Ok(())
    }
}
