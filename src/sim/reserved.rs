//! The check that sync reserves, not only that nothing splits (`--reserve-in-kvstore`):
//! every object the instance holding the Lease was told of, in range with a valid label key,
//! whose id the kvstore holds neither as the instance was told nor in the world's truth (nor
//! in a change not told yet), is reserved by the writer's second turn after a settle,
//! unless something excuses it that sync says: the Lease not held or its gate shut, the
//! writer's trouble and the wait after it, the API server or the disk down, a read still
//! to succeed, the writer released or not started, or no kvstore-mode node left.

use std::collections::BTreeMap;

use super::instance::{Faults, Instance};
use super::report::Failure;
use super::world::World;
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::sync::machine::LeaseHolder;
use crate::core::sync::reserve::RETRY_AFTER_FAILURE;

/// The writer's turns (each after a settle, as the binary settles every 100 ms) by which
/// an object owed is reserved: the batch in flight when it arrived, then its own.
pub const WITHIN_TURNS: u32 = 2;

/// What one instance owes, turn by turn.
#[derive(Debug, Default)]
pub struct Owed {
    /// Per id: the writer's turns it has been owed through.
    turns: BTreeMap<u32, u32>,
    /// A settle came since the writer's last turn (the queue pumps at a settle).
    settled: bool,
}

impl Owed {
    /// Something excuses the instance now: nothing is owed until it is over and a settle
    /// has come since (a settle while excused pumps nothing that counts: a sync that took
    /// the Lease, or started again, has not asked for anything before its next settle).
    pub fn excused(&mut self) {
        self.turns.clear();
        self.settled = false;
    }

    /// A settle came while nothing excused the instance: its queue could ask for what it
    /// was told.
    pub fn settled(&mut self) {
        self.settled = true;
    }

    /// The writer's turn is over: each id still unreserved with nothing to excuse it is
    /// owed one turn more, and none may be owed `WITHIN_TURNS`. What is unreserved is
    /// asked for only when it counts (it walks every object).
    pub fn turn(
        &mut self,
        i: usize,
        excuse: Option<&'static str>,
        unreserved: impl FnOnce() -> Vec<u32>,
    ) -> Result<(), Failure> {
        if excuse.is_some() {
            self.excused();
            return Ok(());
        }
        if !std::mem::take(&mut self.settled) {
            // No pump since the last turn: nothing new was asked for.
            return Ok(());
        }
        let before = std::mem::take(&mut self.turns);
        for id in unreserved() {
            let n = before.get(&id).copied().unwrap_or(0) + 1;
            if n >= WITHIN_TURNS {
                return Err(Failure::new(
                    "every object is reserved in the kvstore within two of the writer's turns, unless sync says why not",
                    format!(
                        "i{i}: object {id} is still not reserved after {n} of the writer's turns, with the Lease held, its gate open and nothing said"
                    ),
                ));
            }
            self.turns.insert(id, n);
        }
        Ok(())
    }
}

/// What excuses instance `inst` from reserving now, if anything.
pub fn excuse(inst: &Instance, world: &World, faults: Faults) -> Option<&'static str> {
    if !inst.alive || inst.ended || inst.unread() {
        return Some("not running, or a read still to succeed");
    }
    if inst.reserver.as_ref().is_none_or(|r| r.released) {
        return Some("no writer, or released");
    }
    if inst.told != LeaseHolder::Us || !world.lease_valid(inst.idx) {
        return Some("the Lease not held, or its gate shut");
    }
    if inst
        .reserve_trouble
        .is_some_and(|t| world.now < t + RETRY_AFTER_FAILURE)
    {
        return Some("the writer's trouble said, and the wait after it");
    }
    if faults.server_down || faults.disk_full {
        return Some("the API server or the disk down");
    }
    if !kvstore_in_use(world) {
        return Some("no kvstore-mode node left");
    }
    None
}

/// A node uses the kvstore: one of its `value/` keys is there (what sync sees of it; a node
/// in kvstore mode that has allocated nothing yet is not known to it).
pub fn kvstore_in_use(world: &World) -> bool {
    world
        .values
        .keys()
        .any(|(_, node)| node != RESERVATION_NODE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_counts_only_after_a_settle_that_nothing_excused() {
        let mut owed = Owed::default();
        // A settle, then an excuse (a restart, the Lease not yet taken): the next turn
        // finds an object unreserved, but the instance has not pumped since the excuse.
        owed.settled();
        owed.excused();
        assert!(owed.turn(0, None, || vec![256]).is_ok());
        assert!(owed.turn(0, None, || vec![256]).is_ok(), "still no settle");
        // Two turns, each after a settle, and it is still not reserved: that fails.
        owed.settled();
        assert!(owed.turn(0, None, || vec![256]).is_ok());
        owed.settled();
        let failed = owed.turn(0, None, || vec![256]).unwrap_err();
        assert!(failed.detail.contains("object 256"), "{}", failed.detail);
    }
}
