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
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::file_io(path, "cannot read the decisions file", e)),
    };
    // Read the one way every log is read: a damaged line is refused, never read around.
    let contents = crate::io::decision_log::read(path)?;
    Ok(Some((bytes, contents.steps().collect())))
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
            let said = match read(&path) {
                // Gone after it was there: keep what was decided (a deleted ConfigMap is not
                // an undo of everything in it).
                Ok(None) => continue,
                Ok(Some((now, _))) if now == bytes => continue,
                Ok(Some((now, steps))) => {
                    bytes = now;
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
                Err(e) => {
                    // Said once per version of the file, and read again when it changes.
                    bytes = std::fs::read(&path).unwrap_or_default();
                    Said::Trouble(format!(
                        "{e}; the decisions read before stay in force until the file is fixed"
                    ))
                }
            };
            let _ = events.send(E::from(said)).await;
        }
    })
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
