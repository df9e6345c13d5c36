//! `sync --decisions FILE`: decisions made elsewhere (on a bastion, in the TUI, exported with
//! `cilium-idmig log --decisions-only`) handed to a running sync through a file, such as a
//! mounted ConfigMap the kubelet replaces: read at the start, then again whenever its bytes
//! change, and each change logged in sync's decision log, then carried to the machine as a
//! decision or an undo. A change whose line cannot be logged is not carried: sync never acts
//! on a decision its log does not hold.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::core::decision_log::file::FileRead;
use crate::error::{Error, Result};
use crate::io::decision_log::{DecisionLog, LogContents};

/// How often the file is read again. A mounted ConfigMap changes a minute or so after the
/// object does (the kubelet's sync period), so a few seconds more add little.
pub const EVERY: Duration = Duration::from_secs(5);

pub use crate::core::decision_log::file::DecisionChange;
use crate::core::decision_log::file::Follower;

/// What following the file says: a change carried over, or a file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Said {
    Note(String),
    Trouble(String),
}

pub use crate::core::decision_log::InForce;

/// The decisions file as it is now: its bytes and what they read as; `None` while there is
/// no file (a ConfigMap not created yet: nothing decided there so far).
pub fn read(path: &Path) -> Result<Option<(Vec<u8>, LogContents)>> {
    let Some(bytes) = bytes_of(path)? else {
        return Ok(None);
    };
    let contents = crate::io::decision_log::parse_decisions_file(path, &bytes)?;
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
        let mut follower = Follower::new(seen.0, seen.1);
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
                Ok(now) => now,
                Err(e) => {
                    let _ = events.send(E::from(trouble(&e.to_string()))).await;
                    continue;
                }
            };
            let parse = |bytes: &[u8]| {
                crate::io::decision_log::parse_decisions_file(&path, bytes)
                    .map_err(|e| e.to_string())
            };
            let mut append = |r| log.append(r).map_err(|e| e.to_string());
            let read = match follower.read_again(now, parse, &mut append) {
                None => continue,
                Some(FileRead::Unreadable(why)) => {
                    let _ = events.send(E::from(trouble(&why))).await;
                    continue;
                }
                Some(read) => read,
            };
            let (decided_n, undone_n) = read.counts();
            let FileRead::Changed { logged, not_logged } = read else {
                continue;
            };
            for change in logged {
                let _ = decided.send(change).await;
            }
            let said = changed_text(&path, decided_n, undone_n);
            let _ = events.send(E::from(Said::Note(said))).await;
            if let Some(t) = not_logged {
                let _ = events.send(E::from(Said::Trouble(t))).await;
            }
        }
    })
}

/// A file that cannot be read or does not read as a log changes nothing.
fn trouble(why: &str) -> Said {
    Said::Trouble(format!(
        "{why}; the decisions read before stay in force until the file is fixed"
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
