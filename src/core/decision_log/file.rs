//! The decisions file (`sync --decisions`) and a restart's merge, written once for the
//! binary and the simulation: what a start resumes from the `--resume` logs, its own log and
//! the file, each change logged first; and what a new version of the file changes, logged,
//! then carried to the machine. The bytes come from the caller (a file on disk, or the
//! simulation's memory), and each line goes through the caller's `append`: sync never acts on
//! a decision its log does not hold.

use std::collections::BTreeMap;

use super::{
    InForce, LogContents, Record, carried_from_file, carry, in_force, last_carried_from_file,
    reservations, with_file,
};
use crate::core::planner::resume::{self, LoggedDecision};

/// A decision made (or undone) while sync runs: from a screen, or read from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionChange {
    Decided(LoggedDecision),
    /// The decision on this kvstore id was undone: it waits for a decision again.
    Undone(String),
}

/// The decisions file, as a carried line names where its decision came from.
pub const FROM_FILE: &str = "the decisions file";

pub use super::CARRIED_FROM_FILE;

/// A log given with `--resume`, as a carried line names where its decision came from.
pub const RESUMED: &str = "a log it resumed";

/// Appends one record to the log sync writes; why not, in the file's words.
pub type Append<'a> = dyn FnMut(Record) -> Result<(), String> + 'a;

/// The line sync's log records for a change: the decision as `from` (the decisions file, a
/// log it resumed) words it, saying who decided it there and when (the line itself takes
/// this run's time and operator), or an undo back to undecided.
pub fn line_of(
    change: &DecisionChange,
    before: Option<&Record>,
    now: Option<&Record>,
    from: &str,
) -> Record {
    match (change, now, before) {
        (DecisionChange::Decided(_), Some(r), _) => {
            let mut line = r.decision_only();
            line.decision = format!(
                "{} (carried from {from}: decided by {} at {})",
                r.decision, r.operator, r.ts
            );
            line
        }
        (DecisionChange::Decided(d), None, _) => Record::decision(
            &d.id,
            &d.labels,
            crate::core::planner::Kind::Create,
            (d.action.as_str(), "operator"),
            d.target_id,
        ),
        (DecisionChange::Undone(id), _, prev) => {
            let (labels, kind) = prev
                .map_or((String::new(), crate::core::planner::Kind::Create), |r| {
                    (r.labels.clone(), r.kind)
                });
            let mut line = Record::decision(id, &labels, kind, ("undecided", "operator"), None);
            line.decision = format!("undecided (carried from {from})");
            line
        }
    }
}

/// The decisions alone, without the lines they came from.
pub fn plain(in_force: &InForce) -> BTreeMap<String, LoggedDecision> {
    in_force
        .iter()
        .map(|(id, (d, _))| (id.clone(), d.clone()))
        .collect()
}

/// Logs each change from `before` to `after` (what `from` holds), in id order: the changes
/// logged, in order, and a trouble line naming those that could not be (carried nowhere,
/// left in `before`'s state so the file's next change offers them again).
pub fn log_changes(
    append: &mut Append<'_>,
    before: &mut InForce,
    after: &InForce,
    from: &str,
) -> (Vec<DecisionChange>, Option<String>) {
    let (new, gone) = resume::changes(&plain(before), &plain(after));
    let mut logged = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut error = None;
    let changes = new
        .into_iter()
        .map(DecisionChange::Decided)
        .chain(gone.into_iter().map(DecisionChange::Undone));
    for change in changes {
        let id = match &change {
            DecisionChange::Decided(d) => d.id.clone(),
            DecisionChange::Undone(id) => id.clone(),
        };
        let line = line_of(
            &change,
            before.get(&id).map(|(_, r)| r),
            after.get(&id).map(|(_, r)| r),
            from,
        );
        match append(line) {
            Ok(()) => {
                match after.get(&id) {
                    Some(v) => before.insert(id, v.clone()),
                    None => before.remove(&id),
                };
                logged.push(change);
            }
            Err(e) => {
                error.get_or_insert(e);
                failed.push(id);
            }
        }
    }
    let trouble = error.map(|e| {
        format!(
            "{} from {from} could not be logged ({e}): not carried to sync; make {} again once the log can be written",
            crate::core::words::count(failed.len(), "decision"),
            if failed.len() == 1 { "it" } else { "them" },
        ) + &format!(" ({})", failed.join(", "))
    });
    (logged, trouble)
}

/// What a start resumes: the decisions sync acts on, and the file's own decisions in force,
/// from which following it starts.
#[derive(Debug, Default)]
pub struct Resumed {
    pub decisions: BTreeMap<String, LoggedDecision>,
    pub file: InForce,
}

/// A start's merge, by time (each log's lines in the order they were made, so the newest
/// word on an identity wins wherever it is written): the `--resume` logs, this run's log
/// (`own`) and the decisions file. What this run's log does not hold yet is logged in it
/// first: what the resumed logs decided (with the lines verify needs of what they served
/// or skipped), then what the file decides. The file's lines count from when a log first
/// carried them, not from the file's clock, which may run ahead: a later decision made on
/// this machine stays in force. A line that cannot be logged is an error: going on without
/// it could create what the operator skipped.
pub fn resume(
    resumed: &[&LogContents],
    own: &LogContents,
    file: Option<&LogContents>,
    append: &mut Append<'_>,
) -> Result<Resumed, String> {
    let mut logs: Vec<&LogContents> = resumed.to_vec();
    logs.push(own);
    let mut recorded = in_force(&logs);
    // This run's log carries what the logs it resumed decided, so that it alone replays to
    // the decisions sync acts on: `verify --decision-log` with it passes after cutover, and
    // a later restart need not be given the other logs again.
    if !resumed.is_empty() {
        let mut own_in_force = in_force(&[own]);
        // What they last carried from the decisions file, first, as its line said it: a
        // later start given this log alone still tells the file's word it already acted on
        // from a change made since (a decision made here after a line dated ahead stays in
        // force). Each such line is a decision or an undo, so the decision in force follows.
        let mine = carried_from_file(&[own]);
        for (id, (said, line)) in last_carried_from_file(&logs) {
            if mine.get(&id) == Some(&said) {
                continue;
            }
            append(line.clone())?;
            match said {
                Some(d) => own_in_force.insert(id, (d, line.clone())),
                None => own_in_force.remove(&id),
            };
        }
        let (_, not_logged) = log_changes(append, &mut own_in_force, &recorded, RESUMED);
        if let Some(why) = not_logged {
            return Err(why);
        }
        // And where they record identities served, or skipped: what verify expects.
        for line in carry::served_lines(resumed, own) {
            append(line)?;
        }
        // And the reservations they made and did not release: still the tool's keys in
        // etcd, which a later start given this log alone must take over (found by the
        // simulation once its restarts moved to a new log).
        for line in reservations::carried_lines(resumed, own) {
            append(line)?;
        }
    }
    let Some(file) = file else {
        return Ok(Resumed {
            decisions: plain(&recorded),
            file: InForce::default(),
        });
    };
    let file_says = in_force(&[file]);
    let with_file = with_file(recorded.clone(), &logs, &file_says, file);
    let (_, not_logged) = log_changes(append, &mut recorded, &with_file, FROM_FILE);
    if let Some(why) = not_logged {
        return Err(why);
    }
    Ok(Resumed {
        decisions: plain(&recorded),
        file: file_says,
    })
}

/// Following the file while sync runs: the bytes last read, and the decisions in force they
/// replay to.
#[derive(Debug, Default)]
pub struct Follower {
    bytes: Vec<u8>,
    decisions: InForce,
}

/// What a new version of the file came to.
#[derive(Debug, PartialEq, Eq)]
pub enum FileRead {
    /// It does not read as a log: nothing changes until it is fixed.
    Unreadable(String),
    /// Each change logged, in order, to be carried to the machine; those that could not
    /// be logged, said.
    Changed {
        logged: Vec<DecisionChange>,
        not_logged: Option<String>,
    },
}

impl FileRead {
    /// The decisions and the undos logged.
    pub fn counts(&self) -> (usize, usize) {
        match self {
            FileRead::Unreadable(_) => (0, 0),
            FileRead::Changed { logged, .. } => {
                let decided = logged
                    .iter()
                    .filter(|c| matches!(c, DecisionChange::Decided(_)))
                    .count();
                (decided, logged.len() - decided)
            }
        }
    }
}

impl Follower {
    /// Following from what a start read: the file's bytes and its decisions in force.
    pub fn new(bytes: Vec<u8>, decisions: InForce) -> Self {
        Follower { bytes, decisions }
    }

    /// The file read again (`None`: there is none; a file deleted after it was there keeps
    /// what was decided: a deleted ConfigMap is not an undo of everything in it). `None`
    /// back when nothing changed. A version of the file is read once, however it reads.
    pub fn read_again(
        &mut self,
        now: Option<Vec<u8>>,
        parse: impl FnOnce(&[u8]) -> Result<LogContents, String>,
        append: &mut Append<'_>,
    ) -> Option<FileRead> {
        let now = now.filter(|now| *now != self.bytes)?;
        let read = parse(&now);
        self.bytes = now;
        let contents = match read {
            Ok(c) => c,
            Err(why) => return Some(FileRead::Unreadable(why)),
        };
        let after = in_force(&[&contents]);
        let (logged, not_logged) = log_changes(append, &mut self.decisions, &after, FROM_FILE);
        Some(FileRead::Changed { logged, not_logged })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::decision_log::read_from;
    use crate::core::planner::Kind;

    fn line(id: &str, action: &str) -> Vec<u8> {
        let mut r = Record::decision(id, "k8s:a=b;", Kind::Remap, (action, "operator"), None);
        r.ts = "2026-12-01T00:00:00Z".into();
        let mut text = serde_json::to_vec(&r).unwrap();
        text.push(b'\n');
        text
    }

    #[test]
    fn a_new_version_of_the_file_is_logged_then_carried_once_and_an_undo_is_marked() {
        // As the binary's reader: a damaged line refuses the whole version.
        let parse = |b: &[u8]| match read_from(b) {
            Ok(c) if c.bad_lines.is_empty() => Ok(c),
            Ok(_) => Err("a damaged line".to_string()),
            Err(e) => Err(e.to_string()),
        };
        let mut lines: Vec<Record> = Vec::new();
        let mut follower = Follower::default();
        let v1 = line("300", "skip");
        let mut append = |r: Record| {
            lines.push(r);
            Ok(())
        };
        let read = follower.read_again(Some(v1.clone()), parse, &mut append);
        assert_eq!(read.as_ref().map(FileRead::counts), Some((1, 0)));
        assert_eq!(
            follower.read_again(Some(v1.clone()), parse, &mut append),
            None
        );
        assert_eq!(
            follower.read_again(None, parse, &mut append),
            None,
            "gone keeps all"
        );
        let v2 = [v1.clone(), line("300", "undecided")].concat();
        let read = follower.read_again(Some(v2.clone()), parse, &mut append);
        assert_eq!(read.as_ref().map(FileRead::counts), Some((0, 1)));
        let v3 = [v2, b"{not a line}\n".to_vec()].concat();
        let read = follower.read_again(Some(v3.clone()), parse, &mut append);
        assert!(matches!(read, Some(FileRead::Unreadable(_))), "{read:?}");
        assert_eq!(
            follower.read_again(Some(v3), parse, &mut append),
            None,
            "said once"
        );
        assert!(
            lines[0].decision.contains(CARRIED_FROM_FILE),
            "{}",
            lines[0].decision
        );
        assert!(
            lines[1].decision.contains(CARRIED_FROM_FILE),
            "{}",
            lines[1].decision
        );
        assert_eq!(lines[1].action.as_deref(), Some("undecided"));

        // A line that cannot be logged is not carried, and is offered again next time.
        let mut follower = Follower::default();
        let mut full = |_: Record| Err("No space left on device".to_string());
        let read = follower.read_again(Some(v1.clone()), parse, &mut full);
        match read {
            Some(FileRead::Changed { logged, not_logged }) => {
                assert!(logged.is_empty());
                assert!(not_logged.unwrap().contains("could not be logged"));
            }
            other => panic!("{other:?}"),
        }
        let mut lines = 0;
        let mut room = |_: Record| {
            lines += 1;
            Ok(())
        };
        let v1_again = [v1, b"\n".to_vec()].concat();
        let read = follower.read_again(Some(v1_again), parse, &mut room);
        assert_eq!(read.as_ref().map(FileRead::counts), Some((1, 0)));
    }
}
