//! The operator's decisions as sync holds them, in one place: those in force (read from the
//! logs at the start, then each decided or undone on screen 3 while sync runs) and those
//! refused (each said once, until decided again). They outlive a round: a fresh read keeps
//! them as they are.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt};

use crate::core::planner::resume::LoggedDecision;

/// The decisions in force and those refused.
#[derive(Debug, Clone, Default)]
pub struct Decisions {
    in_force: BTreeMap<String, LoggedDecision>,
    /// Decisions refused (dropped when resumed onto the plan, or held back by a rule), each
    /// reported once: a refusal is said again only for a new decision on the item.
    refused: HashMap<String, LoggedDecision>,
}

impl Decisions {
    /// The decisions in force at the start (the logs replayed).
    pub fn new(in_force: BTreeMap<String, LoggedDecision>) -> Self {
        Decisions {
            in_force,
            refused: HashMap::new(),
        }
    }

    /// The decisions in force, by item id.
    pub fn in_force(&self) -> &BTreeMap<String, LoggedDecision> {
        &self.in_force
    }

    pub fn get(&self, id: &str) -> Option<&LoggedDecision> {
        self.in_force.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.in_force.is_empty()
    }

    /// A decision made: in force, and any refusal of the item forgotten (a new decision is
    /// refused again if it cannot be carried out either).
    pub fn decide(&mut self, d: LoggedDecision) {
        self.refused.remove(&d.id);
        self.in_force.insert(d.id.clone(), d);
    }

    /// The last decision on `id` taken back: none in force, none refused.
    pub fn undo(&mut self, id: &str) {
        self.refused.remove(id);
        self.in_force.remove(id);
    }

    /// The decision on `id` was refused (and not decided again since).
    pub fn is_refused(&self, id: &str) -> bool {
        self.refused.contains_key(id)
    }

    /// A refusal of `decision`: `false` when this very decision was refused already (said
    /// once).
    pub fn refuse(&mut self, decision: &LoggedDecision) -> bool {
        if self.refused.get(&decision.id) == Some(decision) {
            return false;
        }
        self.refused.insert(decision.id.clone(), decision.clone());
        true
    }

    /// A refusal that could not be logged: made again at the next plan.
    pub fn unrefuse(&mut self, id: &str) {
        self.refused.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::planner::Action;

    fn d(id: &str, target: u32) -> LoggedDecision {
        LoggedDecision {
            id: id.into(),
            labels: "k8s:app=a;".into(),
            action: Action::Create,
            target_id: Some(target),
        }
    }

    #[test]
    fn a_refusal_is_said_once_per_decision_and_again_after_a_new_decision_or_an_undo() {
        let mut ds = Decisions::new(BTreeMap::from([("300".into(), d("300", 400))]));
        assert!(!ds.is_empty());
        assert_eq!(ds.get("300"), Some(&d("300", 400)));
        assert!(!ds.is_refused("300"));
        assert!(ds.refuse(&d("300", 400)));
        assert!(!ds.refuse(&d("300", 400)));
        assert!(ds.is_refused("300"));
        // Another decision on the same item is another refusal.
        assert!(ds.refuse(&d("300", 401)));
        ds.decide(d("300", 402));
        assert!(!ds.is_refused("300"));
        assert_eq!(ds.get("300"), Some(&d("300", 402)));
        assert!(ds.refuse(&d("300", 402)));
        ds.undo("300");
        assert!(ds.is_empty() && !ds.is_refused("300"));
        ds.decide(d("301", 403));
        assert!(ds.refuse(&d("301", 403)));
        assert_eq!(
            ds.in_force().iter().collect::<Vec<_>>(),
            vec![(&"301".to_string(), &d("301", 403))]
        );
        ds.unrefuse("301");
        assert!(!ds.is_refused("301"));
        assert!(ds.refuse(&d("301", 403)));
    }
}
