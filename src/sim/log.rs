//! An instance's decision log as the simulation keeps it: it outlives a crash, and a
//! restart reads its decisions and its reservations back from it.

use crate::core::labels::LabelKey;
use std::collections::BTreeMap;

use crate::core::outcome::Outcome;
use crate::core::planner::Kind;
use crate::core::planner::resume::{self, LogStep, LoggedDecision};
use crate::core::sync::reserve::{Recorded, Unreleased, note_unreleased};
use crate::core::verify::expect::Logged;

/// A line of an instance's decision log (it outlives a crash).
#[derive(Debug, Clone)]
pub enum LogLine {
    Decision(LoggedDecision),
    /// The operator took back the last decision on this id.
    Undo {
        id: String,
    },
    /// A decision sync could not carry out (logged with the reason).
    Refused {
        id: String,
    },
    /// A create's decision, written before the create.
    Write {
        id: String,
        target: u32,
    },
    /// What became of an identity: serving at `target`, or skipped (`None`; malformed
    /// entries).
    Outcome {
        id: String,
        labels: String,
        kind: Kind,
        target: Option<u32>,
    },
    /// A conflict closed as moot (skipped, as the binary records it).
    Moot {
        id: String,
        labels: String,
        kind: Kind,
    },
    /// A reservation's write announced (`reserving`), before it is made.
    Reserving {
        id: u32,
    },
    /// A reservation made (`reserve-in-kvstore` with the master key's revision).
    Reserved {
        id: u32,
        labels: LabelKey,
        revision: i64,
    },
    /// A reservation released at cutover (`release-reservation`): its master key deleted, or
    /// kept because a node uses it (or it changed), and no longer sync's either way.
    Released {
        id: u32,
    },
}

impl LogLine {
    /// What the line says of its identity, as verify reads a decision log's line (core's
    /// one reading, `Expectations::fold`): the cutover check expects what the binary's does.
    pub fn logged(&self) -> Option<Logged<'_>> {
        let line = |id, labels, kind, outcome, target, step| Logged {
            id,
            labels,
            kind,
            outcome,
            target,
            step,
            by_switch_prepare: false,
        };
        Some(match self {
            // A person's decision, written before anything is done about it.
            LogLine::Decision(d) => line(
                &d.id,
                &d.labels,
                Kind::Remap,
                None,
                d.target_id,
                Some(LogStep::Decide(d.clone())),
            ),
            LogLine::Undo { id } => line(
                id,
                "",
                Kind::Remap,
                None,
                None,
                Some(LogStep::Undecided { id: id.clone() }),
            ),
            LogLine::Outcome {
                id,
                labels,
                kind,
                target,
            } => {
                let outcome = match target {
                    Some(_) => Outcome::Created,
                    None => Outcome::Skipped,
                };
                line(id, labels, *kind, Some(outcome), *target, None)
            }
            LogLine::Moot { id, labels, kind } => {
                line(id, labels, *kind, Some(Outcome::Skipped), None, None)
            }
            // A rule's lines and the kvstore's: no decision, no outcome.
            LogLine::Refused { .. }
            | LogLine::Write { .. }
            | LogLine::Reserving { .. }
            | LogLine::Reserved { .. }
            | LogLine::Released { .. } => return None,
        })
    }
}

/// The decisions in force after replaying `log`'s decisions and undos, as a restart (and
/// the binary's resume) reads them.
pub fn decisions_in_force(log: &[LogLine]) -> BTreeMap<String, LoggedDecision> {
    let steps = log.iter().filter_map(|l| match l {
        LogLine::Decision(d) => Some(LogStep::Decide(d.clone())),
        // The simulation's undo is the binary's: back to undecided, nothing in force.
        LogLine::Undo { id } => Some(LogStep::Undecided { id: id.clone() }),
        _ => None,
    });
    resume::replay(steps)
}

/// What `log` records as reserved and not released, read by core's `note_unreleased` as
/// the binary reads a decision log.
pub fn unreleased(log: &[LogLine]) -> Unreleased {
    let mut made = Unreleased::new();
    let lines = log.iter().filter_map(|line| match line {
        LogLine::Reserved {
            id,
            labels,
            revision,
        } => Some(Recorded::Reserved {
            id: *id,
            labels: labels.clone(),
            revision: *revision,
        }),
        LogLine::Released { id } => Some(Recorded::Released { id: *id }),
        _ => None,
    });
    note_unreleased(&mut made, lines);
    made
}
