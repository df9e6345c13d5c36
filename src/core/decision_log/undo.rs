//! What a rollback can undo, read from decision logs in order: each object a run created
//! and no later line deleted (deleted again, exactly that object), and each identity
//! `switch-prepare` removed that nothing made again since (restored at its id, with its
//! labels, where the id is still free).

use std::collections::BTreeMap;

use super::Record;
use crate::core::outcome::Outcome;
use crate::core::planner::decision::DecidedBy;

/// What the logs leave to undo, by the object's name (its id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Undoable {
    /// The `created` line of each object still this tool's.
    pub created: BTreeMap<u32, Record>,
    /// The `deleted` line of each identity `switch-prepare` removed.
    pub removed: BTreeMap<u32, Record>,
}

impl Undoable {
    /// Folds one line in, in the logs' order.
    pub fn fold(&mut self, r: Record) {
        let Some(target) = r.target_id else { return };
        match r.outcome {
            Some(Outcome::Created) => {
                self.removed.remove(&target);
                self.created.insert(target, r);
            }
            Some(Outcome::Deleted | Outcome::AlreadyGone) => {
                self.created.remove(&target);
                // Only the step's own removal is undone; a rollback's delete of what it
                // restored is itself the undo of that restore.
                let by_step = r.kind.is_switch_step()
                    && r.decided_by.as_deref() == Some(DecidedBy::SwitchPrepare.as_str());
                if by_step && r.outcome == Some(Outcome::Deleted) {
                    self.removed.insert(target, r);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::planner::Kind;

    fn line(kind: Kind, by: &str, action: &str, outcome: Outcome) -> Record {
        let mut r = Record::decision("2000", "k8s:app=a;", kind, (action, by), Some(2000));
        r.outcome = Some(outcome);
        r
    }

    #[test]
    fn a_removal_by_switch_prepare_is_undone_once_and_a_restore_is_undone_in_turn() {
        let mut u = Undoable::default();
        u.fold(line(Kind::Create, "proposal", "create", Outcome::Created));
        assert!(u.created.contains_key(&2000));
        let removal = line(
            Kind::SwitchRemoveUnused,
            "switch-prepare",
            "delete",
            Outcome::Deleted,
        );
        u.fold(removal.clone());
        assert!(u.created.is_empty());
        assert_eq!(u.removed.get(&2000), Some(&removal));
        // A rollback restored it: now an object to delete, nothing to restore.
        let restored = line(
            Kind::SwitchRemoveUnused,
            "operator",
            "create",
            Outcome::Created,
        );
        u.fold(restored);
        assert!(u.removed.is_empty());
        assert!(u.created.contains_key(&2000));
        // A rollback of that deleted it again: nothing left either way.
        u.fold(line(
            Kind::SwitchRemoveUnused,
            "operator",
            "delete",
            Outcome::Deleted,
        ));
        assert_eq!(u, Undoable::default());
        // A rollback's delete of a plain create is not a removal to restore.
        u.fold(line(Kind::Create, "operator", "delete", Outcome::Deleted));
        assert!(u.removed.is_empty());
    }
}
