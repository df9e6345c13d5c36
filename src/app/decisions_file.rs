//! `sync --decisions FILE`: decisions made elsewhere (on a bastion, in the TUI, exported with
//! `cilium-idmig log --decisions-only`) handed to a running sync through a file, such as a
//! mounted ConfigMap the kubelet replaces: read at the start, then again whenever its bytes
//! change, and each change carried to the machine as a decision or an undo.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::core::planner::resume::{self, LogStep, LoggedDecision};
use crate::error::{Error, Result};

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

/// The decisions file as it is now: its bytes and the steps they record; `None` while there
/// is no file (a ConfigMap not created yet: nothing decided there so far).
pub fn read(path: &Path) -> Result<Option<(Vec<u8>, Vec<LogStep>)>> {
    let Some(bytes) = bytes_of(path)? else {
        return Ok(None);
    };
    let steps = steps_in(path, &bytes)?;
    Ok(Some((bytes, steps)))
}

/// The file's bytes; `None` while there is no file.
fn bytes_of(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::file_io(path, "cannot read the decisions file", e)),
    }
}

/// The decisions and undos in the file's `bytes`, read the one way every log is read: a
/// damaged line is refused, never read around.
fn steps_in(path: &Path, bytes: &[u8]) -> Result<Vec<LogStep>> {
    Ok(crate::io::decision_log::parse(path, bytes)?
        .steps()
        .collect())
}

/// Follows the file from `seen` (the bytes read at the start, and the decisions they
/// replay to): each change goes to `decided`, and is said on `events`. Ends when sync does
/// (either channel closed).
pub fn follow<E: From<Said> + Send + 'static>(
    path: PathBuf,
    seen: (Vec<u8>, BTreeMap<String, LoggedDecision>),
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
            let now = match bytes_of(&path) {
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
            let steps = steps_in(&path, &now);
            bytes = now;
            let said = match steps {
                Ok(steps) => {
                    let replayed = resume::replay(steps);
                    let (new, gone) = resume::changes(&decisions, &replayed);
                    decisions = replayed;
                    let said = changed_text(&path, new.len(), gone.len());
                    for d in new {
                        let _ = decided.send(DecisionChange::Decided(d)).await;
                    }
                    for id in gone {
                        let _ = decided.send(DecisionChange::Undone(id)).await;
                    }
                    Said::Note(said)
                }
                Err(e) => trouble(&e),
            };
            let _ = events.send(E::from(said)).await;
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
        "decisions file {} changed: {} and {} carried to sync",
        path.display(),
        crate::core::words::count(decided, "decision"),
        crate::core::words::count(undone, "undo"),
    )
}
