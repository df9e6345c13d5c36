//! The reservations sync made in the kvstore (`--reserve-in-kvstore`) as its decision logs
//! record them: which are made and not released (what a start takes over), and the lines a
//! start that resumed other logs carries into its own, so its log alone records them.

use std::collections::BTreeMap;

use super::{LogContents, Record};
use crate::core::labels::LabelKey;
use crate::core::planner::Kind;

/// The action of a reservation's line: the master key and a `value/` key written.
pub const RESERVE_IN_KVSTORE: &str = "reserve-in-kvstore";
/// The action of a release's line (at cutover, or a clean stop): no longer sync's.
pub const RELEASE_RESERVATION: &str = "release-reservation";

/// Reservations the decision logs record as made and not released: id, label key, and the
/// revision its master key was written at.
pub type Unreleased = BTreeMap<u32, (LabelKey, i64)>;

/// A decision log's line about a reservation, as far as what is left unreleased goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// Made (`reserve-in-kvstore`), its master key written at `revision`.
    Reserved {
        id: u32,
        labels: LabelKey,
        revision: i64,
    },
    /// Released at cutover (`release-reservation`): no longer sync's, deleted or kept.
    Released { id: u32 },
}

/// Folds one decision log (logs in order) into the reservations recorded as made and not
/// released (`note_unreleased`): what a sync restarted takes over.
pub fn note_reservations(made: &mut Unreleased, log: &LogContents) {
    let lines = log.records.iter().filter_map(|r| {
        let id = r.id.parse::<u32>().ok()?;
        match (r.action.as_deref(), r.kvstore_revision) {
            (Some(RESERVE_IN_KVSTORE), Some(revision)) => Some(Recorded::Reserved {
                id,
                labels: r.labels.clone(),
                revision,
            }),
            (Some(RELEASE_RESERVATION), _) => Some(Recorded::Released { id }),
            _ => None,
        }
    });
    note_unreleased(made, lines);
}

/// The reservations `logs` (in order: the `--resume` logs, then sync's own) record as made
/// and not released: what a sync that starts takes over.
pub fn unreleased_in(logs: &[&LogContents]) -> Unreleased {
    let mut made = Unreleased::new();
    for log in logs {
        note_reservations(&mut made, log);
    }
    made
}

/// Folds a decision log's reservation lines (logs in order) into `made`: what is recorded
/// as reserved and not released, which a sync restarted (after a crash, an upgrade, or on
/// another host) takes over. The binary reads its logs, the simulation its own, through it.
pub fn note_unreleased(made: &mut Unreleased, lines: impl IntoIterator<Item = Recorded>) {
    for line in lines {
        match line {
            Recorded::Reserved {
                id,
                labels,
                revision,
            } => {
                made.insert(id, (labels, revision));
            }
            Recorded::Released { id } => {
                made.remove(&id);
            }
        }
    }
}

/// One line per reservation that `resumed` (the `--resume` logs, in order, then `own`)
/// records as made and not released and `own` (this run's log) does not record so: a
/// reservation line of its own, at the revision its master key was written at, so that a
/// later start given this log alone still takes it over (and cutover releases it).
pub fn carried_lines(resumed: &[&LogContents], own: &LogContents) -> Vec<Record> {
    let mut logs = resumed.to_vec();
    logs.push(own);
    let own_held = unreleased_in(&[own]);
    unreleased_in(&logs)
        .into_iter()
        .filter(|(id, held)| own_held.get(id) != Some(held))
        .map(|(id, (labels, revision))| {
            let mut r = Record::decision(
                &id.to_string(),
                &labels,
                Kind::Create,
                (RESERVE_IN_KVSTORE, "rule"),
                Some(id),
            );
            r.kvstore = Some(format!(
                "id/{id} written at revision {revision}, carried from a log it resumed: still this sync's to keep or release"
            ));
            r.kvstore_revision = Some(revision);
            r
        })
        .collect()
}
