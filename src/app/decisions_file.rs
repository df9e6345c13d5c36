//! `sync --decisions FILE`: decisions made elsewhere (on a bastion, in the TUI, exported with
//! `cilium-idmig log --decisions-only`) handed to a running sync through a file, such as a
//! mounted ConfigMap the kubelet replaces: read at the start, then again whenever its bytes
//! change, and each change logged in sync's decision log, then carried to the machine as a
//! decision or an undo. A change whose line cannot be logged is not carried: sync never acts
//! on a decision its log does not hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::core::planner::resume::{self, LoggedDecision};
use crate::error::{Error, Result};
use crate::io::decision_log::{DecisionLog, LogContents, Record};

/// How often the file is read again. A mounted ConfigMap changes a minute or so after the
/// object does (the kubelet's sync period), so a few seconds more add little.
pub const EVERY: Duration = Duration::from_secs(5);

/// A decision made (or undone) while sync runs: from the TUI, or read from this file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionChange {
    Decided(LoggedDecision),
    /// The decision on this kvstore id was undone: it waits for a decision again.
    Undone(String),
}

/// What following the file says: a change carried over, or a file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Note(String),
    Trouble(String),
}

pub use crate::core::decision_log::{InForce, in_force};

/// The decisions file as it is now: its bytes and what they read as; `None` while there is
/// no file (a ConfigMap not created yet: nothing decided there so far).
pub fn read(path: &Path) -> Result<Option<(Vec<u8>, LogContents)>> {
    let Some(bytes) = bytes_of(path)? else {
        return Ok(None);
    };
    let contents = crate::io::decision_log::parse(path, &bytes)?;
    Ok(Some((bytes, contents)))
}

/// The file's bytes; `None` while there is no file.
fn bytes_of(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::file_io(path, "cannot read the decisions file", e)),
    }
}

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
            Record::decision(id, &labels, kind, ("undecided", "operator"), None)
        }
    }
}

/// The decisions file, as a carried line names where its decision came from.
pub const FROM_FILE: &str = "the decisions file";

/// Logs each change from `before` to `after` (what `from` holds) in `log`, in id order: the
/// changes logged, in order, and a trouble line naming those that could not be (carried
/// nowhere, left in `before`'s state so the file's next change offers them again).
pub fn log_changes(
    log: &DecisionLog,
    before: &mut InForce,
    after: &InForce,
    from: &str,
) -> (Vec<DecisionChange>, Option<String>) {
    let plain = |m: &InForce| -> BTreeMap<String, LoggedDecision> {
        m.iter()
            .map(|(id, (d, _))| (id.clone(), d.clone()))
            .collect()
    };
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
        match log.append(line) {
            Ok(()) => {
                match after.get(&id) {
                    Some(v) => before.insert(id, v.clone()),
                    None => before.remove(&id),
                };
                logged.push(change);
            }
            Err(e) => {
                error.get_or_insert(e.to_string());
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

/// Follows the file from `seen` (the bytes read at the start, and the decisions in force
/// they replay to): each change is logged in `log`, then goes to `decided`, and is said on
/// `events`. Ends when sync does (either channel closed).
pub fn follow<E: From<Said> + Send + 'static>(
    path: PathBuf,
    seen: (Vec<u8>, InForce),
    log: Arc<DecisionLog>,
    decided: mpsc::Sender<DecisionChange>,
    events: mpsc::Sender<E>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (mut bytes, mut decisions) = seen;
        loop {
            tokio::time::sleep(EVERY).await;
            if decided.is_closed() || events.is_closed() {
                return;
            }
            // Read on a thread for blocking work: a mounted volume may be slow to answer.
            let reading = path.clone();
            let read_now = tokio::task::spawn_blocking(move || bytes_of(&reading))
                .await
                .unwrap_or_else(|e| Err(Error::file(&path, format!("reading it stopped: {e}"))));
            let now = match read_now {
                Ok(Some(now)) if now != bytes => now,
                // Unchanged; or gone after it was there: keep what was decided (a deleted
                // ConfigMap is not an undo of everything in it).
                Ok(_) => continue,
                Err(e) => {
                    let _ = events.send(E::from(trouble(&e))).await;
                    continue;
                }
            };
            // A version of the file is said once, however it reads; a new one is read again.
            let read = crate::io::decision_log::parse(&path, &now);
            bytes = now;
            let contents = match read {
                Ok(c) => c,
                Err(e) => {
                    let _ = events.send(E::from(trouble(&e))).await;
                    continue;
                }
            };
            let after = in_force(&[&contents]);
            let (logged, not_logged) = log_changes(&log, &mut decisions, &after, FROM_FILE);
            let decided_n = logged
                .iter()
                .filter(|c| matches!(c, DecisionChange::Decided(_)))
                .count();
            let said = changed_text(&path, decided_n, logged.len() - decided_n);
            for change in logged {
                let _ = decided.send(change).await;
            }
            let _ = events.send(E::from(Said::Note(said))).await;
            if let Some(t) = not_logged {
                let _ = events.send(E::from(Said::Trouble(t))).await;
            }
        }
    })
}

/// A file that cannot be read or does not read as a log changes nothing.
fn trouble(e: &Error) -> Said {
    Said::Trouble(format!(
        "{e}; the decisions read before stay in force until the file is fixed"
    ))
}

/// What a change of the file is said as (`kubectl logs` shows it).
pub fn changed_text(path: &Path, decided: usize, undone: usize) -> String {
    format!(
        "decisions file {} changed: {} and {} logged and carried to sync",
        path.display(),
        crate::core::words::count(decided, "decision"),
        crate::core::words::count(undone, "undo"),
    )
}
