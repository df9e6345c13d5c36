//! What a decision log leads verify to expect, folded line by line: the one reading of a
//! log's lines, run by every command that reads a log from disk (`io::decision_log`) and by
//! the simulation on the log it keeps, so a cutover check expects the same in both.

use super::Expectations;
use crate::core::outcome::Outcome;
use crate::core::planner::resume::LogStep;
use crate::core::planner::{Action, Kind};

/// What one decision-log line says of an identity, as verify reads it.
#[derive(Debug, Clone)]
pub struct Logged<'a> {
    /// The kvstore id, as text.
    pub id: &'a str,
    pub labels: &'a str,
    pub kind: Kind,
    /// What became of the identity (absent on a pure decision line).
    pub outcome: Option<Outcome>,
    /// Where it is served, or where a rollback deleted it from.
    pub target: Option<u32>,
    /// The decision or undo the line records, if it records one.
    pub step: Option<LogStep>,
    /// Written by `switch-prepare`: it serves pods, not a kvstore identity.
    pub by_switch_prepare: bool,
}

impl Expectations {
    /// What `verify` alone needs: a mapping to the identity's own id expects it where it
    /// would be expected anyway (whether or not its recorded labels still hold), so those
    /// mappings and their labels go. At 65,280 identities they are a second copy of every
    /// label key (17 MB) held while both stores are read. Not for sync, the audit or a
    /// carry: they read the mappings as what was logged.
    pub fn for_verify_only(mut self) -> Self {
        let own: Vec<String> = self
            .mappings
            .iter()
            .filter(|(id, to)| to.is_some_and(|t| t.to_string() == **id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in own {
            self.mappings.remove(&id);
            self.mapped_labels.remove(&id);
        }
        self
    }

    /// Folds one line in, in the log's order.
    pub fn fold(&mut self, l: Logged<'_>) {
        // What switch-prepare made serves pods, not a kvstore identity: nothing to expect.
        // What it removed (this tool's identity, used by no endpoint) is no longer expected
        // at that id, and is said as removed rather than missing.
        if l.by_switch_prepare {
            if let Some(t) = l.target {
                match l.outcome {
                    // A rollback's delete of what the step created: that served pods only.
                    Some(Outcome::Deleted | Outcome::AlreadyGone)
                        if l.kind == Kind::SwitchCreate => {}
                    Some(Outcome::Deleted | Outcome::AlreadyGone) => {
                        self.removed_before_switch.insert(t);
                    }
                    Some(o) if o.is_serving() => {
                        self.removed_before_switch.remove(&t);
                    }
                    _ => {}
                }
            }
            return;
        }
        let id = l.id.to_string();
        match l.outcome {
            None => self.decided(id, l.labels, l.step),
            Some(o) if o.is_serving() => {
                if let Some(t) = l.target {
                    self.removed_before_switch.remove(&t);
                }
                self.mappings.insert(id.clone(), l.target);
                self.mapped_labels.insert(id.clone(), l.labels.to_string());
                self.rolled_back.remove(&id);
                let own = l.target.is_some_and(|t| t.to_string() == id);
                if l.kind == Kind::Duplicate && own && l.step.is_some() {
                    self.duplicates_decided.insert(id, l.labels.to_string());
                }
            }
            Some(Outcome::Skipped) => {
                self.mappings.insert(id.clone(), None);
                self.mapped_labels.insert(id, l.labels.to_string());
            }
            Some(Outcome::Deleted | Outcome::AlreadyGone) => {
                self.rolled_back.insert(id);
            }
            Some(_) => {}
        }
    }

    /// A person's decision with no outcome (sync's decisions file, the TUI, a plan's skip
    /// before its outcome): a skip is expected nowhere, whether or not a write ever follows,
    /// and an undo or a later decision takes back a skip. Any other decision waits for its
    /// outcome line: until something is written, the identity is expected where it was.
    fn decided(&mut self, id: String, labels: &str, step: Option<LogStep>) {
        let skipped = self.mappings.get(&id) == Some(&None);
        match step {
            Some(LogStep::Decide(d)) if d.action == Action::Skip => {
                self.mappings.insert(id.clone(), None);
                self.mapped_labels.insert(id, labels.to_string());
            }
            Some(LogStep::Decide(_) | LogStep::Undo { .. } | LogStep::Undecided { .. })
                if skipped =>
            {
                self.mappings.remove(&id);
                self.mapped_labels.remove(&id);
            }
            _ => {}
        }
    }

    /// The expectations of a log read after this one (logs given in order: `--resume` logs,
    /// then the run's own): its word on an identity wins, and serving an id again takes back
    /// an earlier rollback.
    pub fn then(&mut self, later: Expectations) {
        for t in later.mappings.values().flatten() {
            self.removed_before_switch.remove(t);
        }
        for id in later.mappings.keys() {
            if !later.rolled_back.contains(id) {
                self.rolled_back.remove(id);
            }
        }
        self.mappings.extend(later.mappings);
        self.mapped_labels.extend(later.mapped_labels);
        self.rolled_back.extend(later.rolled_back);
        self.duplicates_decided.extend(later.duplicates_decided);
        self.removed_before_switch
            .extend(later.removed_before_switch);
    }
}
