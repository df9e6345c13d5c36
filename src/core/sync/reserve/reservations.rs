//! The loop's reservations across rounds, decided here and carried out by the shell: the
//! queue's life (made when a writer starts, gone at the release), when what an earlier sync
//! left is taken over (once, by the Lease's holder, before anything else is asked), what
//! each machine command asks of the writer, what each answer tells the machine, and whether
//! a clean stop releases. The shell keeps one and only hands its requests on.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Queue, Reply, Request, Said, Unreleased, earlier_to_adopt};
use crate::core::range::IdRange;
use crate::core::sync::SyncState;
use crate::core::sync::machine::Reserve;

/// See the module.
#[derive(Debug, Default)]
pub struct Reservations {
    /// The queue, while a writer runs.
    queue: Option<Queue>,
    /// What the logs record as reserved and not released, taken over once by the holder.
    earlier: Unreleased,
    /// `--release-reservations`: a clean stop releases, as cutover does.
    release_on_stop: bool,
}

/// What a machine command asks of the writer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Asked {
    /// To hand to the writer, in order (empty: nothing).
    pub requests: Vec<Request>,
    /// Cutover: the writer finishes what it was sent, then releases (the queue is gone).
    pub release: bool,
}

/// A writer's answer, as the machine takes it in.
#[derive(Debug, PartialEq, Eq)]
pub struct Answered {
    pub said: Option<Said>,
    pub held: usize,
    pub own_masters: BTreeSet<u32>,
}

impl Reservations {
    pub fn new(release_on_stop: bool) -> Self {
        Reservations {
            release_on_stop,
            ..Reservations::default()
        }
    }

    /// Whether a writer runs (to be finished when sync ends).
    pub fn has_writer(&self) -> bool {
        self.queue.is_some()
    }

    /// The writer started: a queue of its own; `unreleased` is what the decision logs record
    /// as reserved and not released now, read as the writer starts (at a start, what an
    /// earlier sync left; after a release at cutover that did not finish, what that release
    /// left), taken over once by the Lease's holder, so a writer that starts again never
    /// forgets master keys written.
    pub fn writer_started(&mut self, unreleased: Unreleased) {
        self.queue = Some(Queue::started_with(unreleased.keys().copied().collect()));
        self.earlier = unreleased;
    }

    /// The master keys counted as this sync's own while a writer runs (`Queue::own_masters`),
    /// for a round to start with.
    pub fn own_masters(&self) -> Option<&BTreeSet<u32>> {
        self.queue.as_ref().map(Queue::own_masters)
    }

    /// A command of the machine's (`holding`: the Lease is this sync's and its gate open).
    /// What the logs left is taken over first, at the first command that finds this sync
    /// holding: the Lease taken while its gate is shut a moment (a renewal late) must not
    /// leave it behind, and a release takes it along. Nothing without a writer.
    pub fn command(
        &mut self,
        cmd: Reserve,
        state: &SyncState,
        (holding, range): (bool, IdRange),
        now: Instant,
    ) -> Asked {
        let Some(q) = self.queue.as_mut() else {
            return Asked::default();
        };
        q.adopt(earlier_to_adopt(&mut self.earlier, state, holding));
        let release = cmd == Reserve::Release;
        match cmd {
            Reserve::MasterGone { id, k8s } => q.master_gone(id, k8s),
            Reserve::Want { id, labels } => q.want(id, labels),
            Reserve::Deleted { id } => q.deleted(id),
            Reserve::ViewChanged => q.view_changed(),
            Reserve::FreshKvstore => q.fresh_kvstore(),
            Reserve::Pump => q.pump(state, range, now),
            Reserve::Release => q.flush(),
        }
        let requests = q.take_requests();
        if release {
            // No kvstore-mode node is left to need them.
            self.queue = None;
        }
        Asked { requests, release }
    }

    /// The writer answered: folded into the queue; what the machine is told. `None`: no
    /// writer runs (released since), nothing to tell.
    pub fn answered(&mut self, reply: Reply, now: Instant) -> Option<Answered> {
        let q = self.queue.as_mut()?;
        let said = q.on_reply(reply, now);
        Some(Answered {
            said,
            held: q.held(),
            own_masters: q.own_masters().clone(),
        })
    }

    /// A clean stop: released only with `--release-reservations`, while this sync holds the
    /// Lease and a writer runs. What the logs left and was not taken over yet is taken over
    /// now, so it is released too, and what waits in the queue goes with it: the requests
    /// returned go to the writer, which then finishes and releases. `None`: nothing is
    /// released.
    pub fn release_at_stop(&mut self, state: &SyncState, holding: bool) -> Option<Vec<Request>> {
        if !(self.release_on_stop && holding) {
            return None;
        }
        // No writer, no queue: nothing to release.
        let mut q = self.queue.take()?;
        let earlier = earlier_to_adopt(&mut self.earlier, state, holding);
        q.adopt(earlier);
        q.flush();
        Some(q.take_requests())
    }
}

#[cfg(test)]
mod tests;
