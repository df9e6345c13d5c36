//! The decision log: JSON Lines, append-only, one flushed line per decision and per outcome,
//! mode 0600, each run opened by a session line naming the cluster and kvstore. An auditor
//! replays it; `verify` reads the id mappings back from it, `--resume` the decisions,
//! `rollback` the objects a run created.

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use crate::core::decision_log::{
    LogContents, Record, ServerLine, Session, SessionLine, read_from, steps_in_time,
};
use crate::core::decision_log::{LogFile, Writer, expect, fold_from, torn_note, torn_tail};
use crate::core::server_said::ServerSaid;
use crate::core::verify::Expectations;
use crate::error::{Error, Result};

/// The log on disk: one `write` per line on an `O_APPEND` file, so concurrent writers never
/// interleave inside a line, and a killed process loses nothing it logged.
pub struct DiskFile {
    path: PathBuf,
    file: Mutex<File>,
}

impl LogFile for DiskFile {
    type Error = Error;

    fn append_line(&self, line: &[u8]) -> Result<()> {
        let mut f = self
            .file
            .lock()
            .map_err(|_| Error::file(&self.path, "decision log lock poisoned"))?;
        // One write per line reaches the kernel at once; fsync per line would cost more
        // than the API calls themselves.
        f.write_all(line)
            .and_then(|_| f.flush())
            .map_err(|e| Error::file_io(&self.path, "cannot append to decision log", e))
    }

    fn unencodable(&self, e: serde_json::Error) -> Error {
        Error::file_cause(&self.path, e)
    }

    fn now(&self) -> String {
        now()
    }
}

/// An open, append-only decision log on disk, written through core's one writer.
pub struct DecisionLog {
    writer: Writer<DiskFile>,
    /// What opening it repaired (a torn last line removed), to tell the operator.
    repaired: Option<String>,
    /// This run made the file (it was empty or absent when opened).
    fresh: bool,
}

impl DecisionLog {
    /// Opens (creating with mode 0600, or appending to) the log at `path`.
    /// A last line cut short (a process killed mid-write, a full disk) is removed first, so
    /// the next line does not land after it and damage the log for every later command.
    pub fn open(path: &Path) -> Result<Self> {
        let file = super::private_file::open_append(path)
            .map_err(|e| Error::file_io(path, "cannot open decision log", e))?;
        let repaired = repair_torn_tail(&file, path)
            .map_err(|e| Error::file_io(path, "cannot repair the decision log's last line", e))?;
        if let Some(note) = &repaired {
            tracing::warn!("{note}");
        }
        let fresh = file
            .metadata()
            .map_err(|e| Error::file_io(path, "cannot read the decision log's size", e))?
            .len()
            == 0;
        let disk = DiskFile {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        };
        Ok(DecisionLog {
            writer: Writer::new(disk, super::operator::current()),
            repaired,
            fresh,
        })
    }

    /// Removes the log when this run made it and recorded nothing in it (only its session
    /// line): a run that decided and wrote nothing leaves no file behind. True if removed.
    pub fn discard_if_unused(&self) -> bool {
        if !self.fresh || self.writer.recorded() {
            return false;
        }
        std::fs::remove_file(self.path()).is_ok()
    }

    /// Removes the log when this run made it and it records no decision, only identities
    /// found where they belong (an apply rerun that found every identity in place): its lines
    /// would only repeat the run that wrote them. A log with any decision in it (a skip, a
    /// mapping, an operator's or `--accept-proposals`' choice) is kept, written or not: the
    /// decision is the record. True if removed.
    pub fn discard_if_nothing_decided(&self) -> bool {
        self.fresh && !self.writer.decided() && std::fs::remove_file(self.path()).is_ok()
    }

    /// Whether this run recorded a decision (`Record::is_decision`) in the log.
    pub fn holds_decisions(&self) -> bool {
        self.writer.decided()
    }

    /// What opening the log repaired, if anything: one line for the operator.
    pub fn repaired(&self) -> Option<&str> {
        self.repaired.as_deref()
    }

    pub fn path(&self) -> &Path {
        &self.writer.file().path
    }

    /// Takes an exclusive lock on the log for as long as this process runs (released by
    /// the kernel when it exits, SIGKILL included): a second process that would write the
    /// same log (a second `sync`) is refused instead of interleaving its lines.
    pub fn lock_for_one_writer(&self) -> Result<()> {
        let disk = self.writer.file();
        let file = disk.file.lock().unwrap_or_else(|p| p.into_inner());
        match file.try_lock() {
            Ok(()) => Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Config(format!(
                "decision log {} is in use by another process (another sync?): one sync per decision log; stop that one or pass another --decision-log",
                disk.path.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(Error::file_io(&disk.path, "cannot lock decision log", e))
            }
        }
    }

    pub fn operator(&self) -> &str {
        self.writer.operator()
    }

    /// Fills in `ts` and `operator` and appends the record as one flushed line.
    pub fn append(&self, record: Record) -> Result<()> {
        self.writer.append(record)
    }

    /// Records what the API server said over a span of this run (nothing when it said
    /// nothing: no 429, no warning).
    pub fn note_server(&self, said: &ServerSaid) -> Result<()> {
        self.writer.note_server(said, run_id())
    }

    /// Appends the session line that opens a run.
    pub fn begin_session(&self, session: Session) -> Result<()> {
        self.writer.begin_session(session)
    }
}

/// Removes a last line that has no newline: a write the process never finished. Only while
/// no other process holds the log (a live sync's line may be on its way); what is removed
/// was never a whole line, so no decision or outcome is lost, and the note quotes it.
fn repair_torn_tail(file: &File, path: &Path) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 || file.try_lock().is_err() {
        return Ok(None);
    }
    let reader = File::open(path)?;
    let tail_len = len.min(1 << 20);
    let mut tail = vec![0; tail_len as usize];
    reader.read_exact_at(&mut tail, len - tail_len)?;
    let whole = tail_len == len;
    let result = torn_tail(&tail, whole).map(|cut| -> std::io::Result<String> {
        let torn = &tail[tail.len() - cut..];
        file.set_len(len - cut as u64)?;
        Ok(torn_note(&path.display().to_string(), torn))
    });
    let result = result.transpose()?;
    file.unlock()?;
    Ok(result)
}

/// Reads a decision log, the one way every command does (apply, sync, verify, rollback).
/// A torn last line (a write cut short by a crash) is tolerated; any other line that does
/// not parse is an error naming it: a log is the record of what was done and decided, and
/// reading around a damaged line would silently drop a decision (a skip turned into a create
/// under `--accept-proposals`) or an object rollback must delete.
pub fn read(path: &Path) -> Result<LogContents> {
    let f = open_to_read(path)?;
    let c = read_from(BufReader::new(f)).map_err(|e| Error::file_cause(path, e))?;
    refuse_damaged(path, &c)?;
    Ok(c)
}

/// Opens a log to read. One that does not exist is named as such: a mistyped path, or a
/// run that kept no log (it decided and wrote nothing), never read as an empty one.
fn open_to_read(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::file(
            path,
            "no such decision log; check the path (a run keeps its log only when it decided or wrote something, and says so when it keeps none)",
        ),
        _ => Error::file_io(path, "cannot read decision log", e),
    })
}

/// Checks that a log given to read can be opened, before a run starts on it (the TUI, whose
/// screen would otherwise be the first to hear of a mistyped path).
pub fn check_readable(path: &Path) -> Result<()> {
    open_to_read(path).map(drop)
}

/// A log's bytes, as `read` opens it (a log that does not exist named as such).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut open_to_read(path)?, &mut bytes)
        .map_err(|e| Error::file_io(path, "cannot read decision log", e))?;
    Ok(bytes)
}

/// `read` of a log already in memory (`bytes`, read from `path`): refused alike.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<LogContents> {
    let c = read_from(bytes).map_err(|e| Error::file_cause(path, e))?;
    refuse_damaged(path, &c)?;
    Ok(c)
}

/// A decisions file already in memory (`bytes`, read from `path`), read as core's
/// `read_decisions_file_from` reads one (a last line without its newline counts when whole),
/// and refused as a log is when a line is damaged.
pub fn parse_decisions_file(path: &Path, bytes: &[u8]) -> Result<LogContents> {
    let c = crate::core::decision_log::read_decisions_file_from(bytes)
        .map_err(|e| Error::file_cause(path, e))?;
    refuse_damaged(path, &c)?;
    Ok(c)
}

/// A log with a damaged line (not the torn last one) is refused, naming the line.
fn refuse_damaged(path: &Path, c: &LogContents) -> Result<()> {
    let Some((line, why)) = c.bad_lines.first() else {
        return Ok(());
    };
    if *line == 1 && is_a_plan(path) {
        return Err(Error::file(
            path,
            "this is a plan file, not a decision log: give it to --plan (apply --plan PLAN --yes)",
        ));
    }
    let more = match c.bad_lines.len() {
        1 => String::new(),
        n => format!(" (and {} more lines)", n - 1),
    };
    Err(Error::file(
        path,
        format!(
            "line {line} of the decision log is damaged{more}: {why}; repair or remove it and run again (nothing was done)"
        ),
    ))
}

/// Whether the file at `path` reads as a plan (`plan`'s JSON document): said when one is
/// given where a log belongs, the one mix-up its first line cannot tell apart.
fn is_a_plan(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| {
        serde_json::from_slice::<serde_json::Value>(&b)
            .is_ok_and(|v| v.get("version").is_some() && v.get("items").is_some())
    })
}

/// What `verify` expects from the log at `path`, folded line by line as `read` reads it
/// (damaged lines refused alike) without keeping its records: a log of a 65,280-identity
/// migration holds 130,000 of them, and verify needs only these maps.
pub fn read_expectations(path: &Path) -> Result<(Expectations, Option<String>)> {
    let f = open_to_read(path)?;
    let mut e = Expectations::default();
    let c = fold_from(BufReader::new(f), |rec| expect(&mut e, &rec))
        .map_err(|err| Error::file_cause(path, err))?;
    refuse_damaged(path, &c)?;
    let torn = c
        .torn_tail
        .then(|| crate::core::decision_log::torn_left_out(&path.display().to_string()));
    Ok((e, torn))
}

/// The current time, RFC 3339 in UTC.
pub fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Millisecond)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// This process's run id: when it started (UTC, to the second) and its pid, e.g.
/// `20261201T010203Z-4f2a`. One process is one run, however many commits it makes.
pub fn run_id() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let ts = jiff::Timestamp::now()
            .strftime("%Y%m%dT%H%M%SZ")
            .to_string();
        format!("{ts}-{:x}", std::process::id())
    })
}

/// `cilium-idmig-decisions-<timestamp>.jsonl` in the working directory.
pub fn default_path() -> PathBuf {
    let ts = jiff::Timestamp::now()
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string();
    // The pid too: runs started in the same second (three headless rehearsals) each get a
    // log of their own.
    PathBuf::from(format!(
        "cilium-idmig-decisions-{ts}-{}.jsonl",
        std::process::id()
    ))
}

#[cfg(test)]
mod tests;
