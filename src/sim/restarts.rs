//! How a simulated instance ends and starts again, as the binary's process does: ended on a
//! refusal (what was refused granted again), killed (mid-write, a torn last log line), or
//! stopped cleanly (with `--release-reservations`, a release that must happen), each time its
//! Lease given up as its keeper gives it up, then started afresh from its log and a read.

use super::Sim;
use super::instance::{Instance, SimLog};
use super::lease;
use super::report::Failure;
use crate::core::sync::machine::LeaseHolder;

impl Sim {
    /// Instance `i` ended on a refusal, and ends as the binary does on one: the reservation
    /// writer finishing what it was sent (nothing released), the Lease given up. The
    /// operator grants what was refused and starts it again.
    pub(super) fn refused_and_started_again(&mut self, i: usize, why: &str) -> Result<(), Failure> {
        self.refusal_ends += 1;
        self.owed[i].excused();
        let gave_up = self.give_lease_up(i)?;
        self.faults.creates_refused = false;
        self.faults.lease_refused = false;
        self.faults.lists_refused = false;
        self.faults.watches_refused = false;
        self.faults.kv_reads_refused = false;
        self.trace.line(
            self.world.now,
            format_args!(
                "i{i} ended on {why} (the Lease given up: {gave_up}); granted again, started again"
            ),
        );
        self.restart(i)
    }

    /// The operator changes the admission webhook's rule that denied creates, and starts
    /// every sync again, as the cutover's wait tells them to: a sync does not try a denied
    /// create again in a loop, so without the restart it would wait for ever.
    pub(super) fn lift_denials(&mut self) -> Result<(), Failure> {
        self.faults.webhook_denies = false;
        self.trace.line(
            self.world.now,
            "the webhook's rule changed; every sync started again",
        );
        for i in 0..self.instances.len() {
            self.stop_and_restart(i)?;
        }
        Ok(())
    }

    /// An instance dies (mid-write, perhaps with a torn last log line) and starts again from
    /// its log and a fresh read.
    pub(super) fn crash(&mut self, i: usize) -> Result<(), Failure> {
        self.owed[i].excused();
        let batch = self.instances[i].batch.take();
        let logged = self.instances[i].batch_logged();
        let mut note = String::new();
        if let Some(ops) = batch {
            // Killed while the batch ran: some creates were made, and never heard of (none
            // whose decision lines a full disk refused).
            let made = if logged {
                self.rng.below(ops.len() as u64 + 1) as usize
            } else {
                0
            };
            for op in ops.iter().take(made) {
                if let Some(t) = op.target_id
                    && self.world.create_object(t, op.label_key.clone())
                {
                    self.world.created_by_sync.insert(t);
                }
            }
            note = format!(" mid-write ({made} of {} made)", ops.len());
            // Only the line being written when it was killed can be torn: the batch's own,
            // never a decision logged since and handed to sync (a screen's, the file's).
            // The batch's lines are the executor's record of each op, decision and outcome
            // alike; a line of the same id written before (a start's carried decision or
            // reservation, a screen's) was whole before the batch began.
            let last_is_the_batchs = self.logs[i].records().last().is_some_and(|r| {
                ops.iter().any(|op| {
                    let line = crate::core::executor::record(op, None);
                    (&r.id, &r.decision, &r.action) == (&line.id, &line.decision, &line.action)
                })
            });
            if made == 0 && self.rng.chance(0.5) && last_is_the_batchs {
                // Killed while logging: the last line is torn (a few of its bytes and its
                // newline never written), and the next start's repair drops it.
                let cut = 1 + self.rng.below(40) as usize;
                self.logs[i].tear(cut);
                note.push_str(", last log line torn");
            }
        }
        self.trace.line(
            self.world.now,
            format_args!("i{i} crashes{note} and restarts"),
        );
        self.restart(i)
    }

    /// An instance stops cleanly (an upgrade, SIGTERM) and starts again: its sync ends as
    /// the binary's does (the batch out taken in, the reservation writer finishing what it
    /// was sent) and core's keeper gives the Lease up, so another takes over at once.
    pub(super) fn stop_and_restart(&mut self, i: usize) -> Result<(), Failure> {
        self.owed[i].excused();
        if !self.instances[i].alive {
            return Ok(());
        }
        let ctx = (&self.clock, &mut self.rng, self.faults, &mut self.trace);
        self.instances[i].stop(&mut self.world, &self.logs[i], ctx)?;
        // As the binary's end: with `--release-reservations`, a stop that ended cleanly
        // while holding the Lease releases, as cutover does (the shell says whether): the
        // writer finishes what it was sent, then releases, checked as cutover's release is.
        let inst = &mut self.instances[i];
        let holding = inst.told == LeaseHolder::Us && self.world.lease_valid(i);
        // Owed, by the simulation's own reading: asked for, holding the Lease, ended
        // cleanly, with a writer that has not released yet.
        let owed = self.release_on_stop
            && holding
            && inst.refused_end.is_none()
            && inst.reserver.as_ref().is_some_and(|r| !r.released);
        let release = match inst.refused_end {
            None => inst.shell.release_at_stop(holding),
            Some(_) => None,
        };
        if owed && release.is_none() {
            return Err(Failure::new(
                "a clean stop with --release-reservations releases",
                format!("i{i} stopped cleanly holding the Lease and released nothing"),
            ));
        }
        if let Some(requests) = release {
            self.releases_at_stop += 1;
            if let Some(res) = inst.reserver.as_mut() {
                res.send(requests);
            }
            self.reservations_done(i)?;
            let now = self.world.now;
            self.trace.line(
                now,
                format_args!("i{i} releases its reservations at its stop"),
            );
            self.with_writer(i, |res, w| res.release(i, w))
                .transpose()?;
        }
        let gave_up = self.give_lease_up(i)?;
        self.trace.line(
            self.world.now,
            format_args!("i{i} stops cleanly (the Lease given up: {gave_up}) and restarts"),
        );
        self.restart(i)
    }

    /// An ended instance's last steps: its reservations checked done, its Lease given up as
    /// its keeper gives it up; whether it was.
    fn give_lease_up(&mut self, i: usize) -> Result<bool, Failure> {
        self.reservations_done(i)?;
        let fails = self.renewals_fail[i];
        let refused = self.faults.lease_refused;
        let elector = &mut self.instances[i].elector;
        lease::give_up(&mut self.world, elector, fails, refused)
    }

    /// Instance `i` starts again from its log and a fresh read.
    pub(super) fn restart(&mut self, i: usize) -> Result<(), Failure> {
        // A process that ended writes nothing; the restarted one starts its keeper afresh.
        self.world.gates[i] = None;
        if self.rng.chance(0.15) {
            // The operator moves sync to a new log (a new disk, another host) and names the
            // old one with `--resume` at this start only, as the docs allow: the new log
            // alone carries what a later start needs.
            let old = std::mem::take(&mut self.logs[i]);
            self.logs[i] = SimLog::moved(old);
            self.trace.line(
                self.world.now,
                format_args!("i{i} starts on a new log, resuming the one it replaces"),
            );
        }
        let ctx = (&self.clock, &mut self.rng, &mut self.trace);
        let restarted = Instance::start(
            i,
            (self.settings.clone(), self.release_on_stop),
            (&self.logs[i], self.file.as_ref().map(|f| &f.log)),
            &mut self.world,
            ctx,
        )?;
        self.instances[i] = restarted;
        self.kept_across_restart(i)
    }
}
