//! Sync's reservations in the simulated etcd (`--reserve-in-kvstore`): core's reservation
//! writer (`core::sync::reserve::writer::Writer`), the very code the binary runs, over
//! `SimKv`, the simulated etcd and decision log beneath it. The loop's requests wait in an
//! inbox until the writer's turn (a step of its own, as the writer is a task of its own);
//! the etcd lease holding the `value/` keys is kept alive at each status tick and may lapse
//! (a crash, a long outage). Checked here, beneath the writer: every etcd write is this
//! instance's alone (the Lease held and valid), the only master keys deleted are sync's own
//! as written, and everything this instance held is released at cutover.

use std::collections::VecDeque;
use std::time::Instant;

use super::log::SimLog;
use super::report::Failure;
use super::world::{ResWrite, World};
use crate::core::at_once::at_once;
use crate::core::decision_log::LogContents;
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::labels::LabelKey;
use crate::core::rng::Rng;
use crate::core::sync::reserve::unreleased_in;
use crate::core::sync::reserve::writer::{KvWrites, Released, Reserved, WriteLine, Writer};
use crate::core::sync::reserve::{KeepAlive, Reply, Request};

/// One instance's reservations: the writer (core's) and the requests the loop sent it.
#[derive(Debug)]
pub struct SimReservations {
    writer: Writer,
    /// The batches sent, each answered in turn.
    inbox: VecDeque<Vec<Request>>,
    /// Released at cutover: nothing more is written.
    pub released: bool,
    /// When its lease is kept alive: core's schedule, as the binary's writer keeps it.
    keep_alive: KeepAlive,
    /// What it did in etcd since the trace last took it.
    pub done: Vec<String>,
}

/// What the writer meets beneath it: the world, the instance's log and gate, and the faults.
pub struct SimKv<'a> {
    pub world: &'a mut World,
    pub log: &'a SimLog,
    pub may_write: bool,
    /// The log cannot be written.
    pub disk_full: bool,
    /// etcd times out now and then.
    pub flaky: bool,
    pub rng: &'a mut Rng,
    /// The instance it writes for, and the first write it made that it may not have made.
    pub idx: usize,
    pub violation: Option<Failure>,
    /// What it did in etcd, for the trace.
    pub done: Vec<String>,
}

impl SimKv<'_> {
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

impl KvWrites for SimKv<'_> {
    fn may_write(&self) -> bool {
        self.may_write
    }

    /// Each line as the binary's log records it, through its writer.
    fn log(&mut self, line: WriteLine) -> Result<(), String> {
        let writer = self.log.at(self.world.now, self.disk_full);
        writer.append(line.record())
    }

    async fn grant(&mut self) -> Result<i64, String> {
        self.etcd_up()?;
        Ok(self.world.res_grant())
    }

    async fn keep_alive(&mut self, lease: i64) -> Result<bool, String> {
        self.etcd_up()?;
        Ok(self.world.res_keep_alive(lease))
    }

    async fn reserve(
        &mut self,
        id: u32,
        labels: &LabelKey,
        lease: i64,
    ) -> Result<Reserved, String> {
        self.etcd_up()?;
        self.writing(&format!("reserved {id}"));
        match self.world.res_reserve(id, labels, lease) {
            ResWrite::Written(revision) => {
                self.done
                    .push(format!("reserved {id} at revision {revision}"));
                Ok(Reserved::Written { revision })
            }
            ResWrite::Held(other) => Ok(Reserved::Held(other.into_bytes())),
            ResWrite::LeaseGone => Err("etcd: requested lease not found".into()),
        }
    }

    async fn restore(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
        lease: i64,
    ) -> Result<bool, String> {
        self.etcd_up()?;
        self.writing(&format!("put back {id}"));
        let back = self.world.res_restore(id, labels, revision, lease);
        self.done
            .push(format!("put back {id} (as written at {revision}): {back}"));
        Ok(back)
    }

    async fn unreserve(&mut self, labels: &LabelKey) -> Result<bool, String> {
        self.etcd_up()?;
        self.writing(&format!("unreserved {labels}"));
        self.done.push(format!("unreserved {labels}"));
        Ok(self.world.res_unreserve(labels))
    }

    async fn master_revision(&mut self, id: u32) -> Option<i64> {
        self.world.master_revs.get(&id.to_string()).copied()
    }

    async fn revoke(&mut self, lease: i64) -> Result<(), String> {
        self.writing("revoked its reservation lease");
        self.world.res_revoke(lease);
        Ok(())
    }

    /// Checks that only sync's own master keys go: the key deleted must be one it wrote, as
    /// it wrote it.
    async fn release(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
    ) -> Result<Released, String> {
        let key = id.to_string();
        let was = (
            self.world.master_revs.get(&key).copied(),
            self.world.masters.get(&key).cloned(),
        );
        self.writing(&format!("released {id}"));
        if !self.world.res_release(id, labels, revision) {
            // In use (or changed): a node's now, no longer sync's.
            self.done.push(format!("kept {id}"));
            return Ok(Released::Kept("in use or changed"));
        }
        self.done.push(format!("released {id}"));
        if self.world.sync_masters.get(&key) != was.0.as_ref()
            || was.1.as_deref() != Some(labels.as_str())
        {
            self.violation.get_or_insert(Failure::new(
                "etcd writes only to sync's own keys",
                format!(
                    "i{} released id/{id} at {:?} holding {:?}, not a key it wrote ({revision})",
                    self.idx, was.0, was.1
                ),
            ));
        }
        Ok(Released::Deleted)
    }
}

impl SimReservations {
    /// Starts with a lease of its own (`Reservations::start`).
    /// A writer started at `now` on a lease of its own.
    pub fn start(world: &mut World, now: Instant) -> Self {
        let lease = world.res_grant();
        SimReservations {
            writer: Writer::new(lease),
            inbox: VecDeque::new(),
            released: false,
            keep_alive: KeepAlive::from(now),
            done: Vec::new(),
        }
    }

    /// Whether its keep-alive is due at `now` (`KeepAlive::due`).
    pub fn keep_alive_due(&mut self, now: Instant) -> bool {
        !self.released && self.keep_alive.due(now)
    }

    /// A batch the shell's queue asks for, into the writer's inbox.
    pub fn send(&mut self, requests: Vec<Request>) {
        if !requests.is_empty() {
            self.inbox.push_back(requests);
        }
    }

    /// What the loop asked is lost (`Mutant::NeverReserves`).
    pub fn lose_requests(&mut self) {
        self.inbox.clear();
    }

    pub fn lease(&self) -> i64 {
        self.writer.lease()
    }

    /// The writer's turn: every batch in the inbox, as the binary's task takes them; the
    /// replies, in order.
    pub fn work(&mut self, kv: &mut SimKv<'_>) -> Result<Vec<Reply>, Failure> {
        let mut replies = Vec::new();
        while let Some(batch) = self.inbox.pop_front() {
            replies.push(at_once(self.writer.handle(batch, kv)).ok_or_else(waited)?);
        }
        self.done.append(&mut kv.done);
        kv.violation.take().map_or(Ok(replies), Err)
    }

    /// The keep-alive's turn (`KEEP_ALIVE_EVERY`), a reply if it has something to say.
    pub fn tick(&mut self, kv: &mut SimKv<'_>) -> Result<Option<Reply>, Failure> {
        if self.released {
            return Ok(None);
        }
        let reply = at_once(self.writer.tick(kv)).ok_or_else(waited)?;
        self.done.append(&mut kv.done);
        kv.violation.take().map_or(Ok(reply), Err)
    }

    /// Cutover: the writer's release (the lease revoked, then each master key written
    /// deleted if unchanged and unused, each with its log line first). Checks that nothing
    /// this instance held is left when the release could run.
    pub fn release(&mut self, i: usize, kv: &mut SimKv<'_>) -> Result<(), Failure> {
        self.released = true;
        self.inbox.clear();
        let released = at_once(self.writer.release(kv)).ok_or_else(waited)?;
        self.done.append(&mut kv.done);
        if let Some(f) = kv.violation.take() {
            return Err(f);
        }
        if let Err(why) = released {
            // Not this sync's to write now (or the log failed): they lapse with the lease.
            self.done.push(format!("not released: {why}"));
            return Ok(());
        }
        // Held against the log, not the writer: what it records as reserved and not
        // released, still as written and used by no node, is left behind. Every log the
        // instance wrote counts, those it moved away from too: a reservation a log it no
        // longer names recorded is still the tool's key in etcd.
        let read: Result<Vec<_>, String> = kv.log.chain().map(|l| l.contents()).collect();
        let read = read.map_err(|why| Failure::new("the decision log reads back", why))?;
        let logs: Vec<&LogContents> = read.iter().map(|c| &**c).collect();
        let left: Vec<String> = unreleased_in(&logs)
            .into_iter()
            .filter(|(id, (labels, revision))| {
                let key = id.to_string();
                let unused = !kv.world.values.keys().any(|(l, _)| l == labels.as_str());
                kv.world.master_revs.get(&key) == Some(revision) && unused
            })
            .map(|(id, (labels, _))| format!("{id} ({labels})"))
            .collect();
        let lease = self.lease();
        let values_left = kv
            .world
            .res_value_lease
            .values()
            .filter(|l| **l == lease)
            .count();
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

/// The writer's IO never waits in the simulation; a call that does is the world's bug.
fn waited() -> Failure {
    Failure::new(
        "the simulation's IO answers at once",
        "a call of the reservation writer waited".to_string(),
    )
}
