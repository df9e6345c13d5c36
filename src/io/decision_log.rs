//! The decision log: JSON Lines, append-only, one flushed line per decision and per outcome,
//! mode 0600, each run opened by a session line naming the cluster and kvstore. An auditor
//! replays it; `verify` reads the id mappings back from it, `--resume` the decisions,
//! `rollback` the objects a run created.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::core::outcome::Outcome;
use crate::core::planner::Kind;
use crate::core::planner::decision::DecidedBy;
use crate::core::planner::resume::{LogStep, step_of, step_of_fields};
use crate::core::range::MaxConnectedClusters;
use crate::core::server_said::ServerSaid;
use crate::core::verify::Expectations;
use crate::core::verify::expect::Logged;
use crate::error::{Error, Result};

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub ts: String,
    pub operator: String,
    pub id: String,
    pub labels: String,
    pub kind: Kind,
    /// The decision as text, for a person: `create (operator)`, or an operator's action in
    /// the TUI, `edit (create 4000)`.
    pub decision: String,
    /// The same decision as fields, which a resume reads: who decided (`operator`,
    /// `accept-proposals`, `proposal`, `rule`) and the action (`create`, `none`, `map`,
    /// `skip`, `undo`, or what a rollback, a moot closing or a reservation did), the target
    /// being `target_id`. Absent in logs written before; those are read from the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    pub target_id: Option<u32>,
    /// Absent on a pure decision record.
    pub outcome: Option<Outcome>,
    pub error: Option<String>,
    /// On `created`: the object's uid and resourceVersion as the API server returned them,
    /// so `rollback` deletes exactly that object (absent in logs written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// A write or delete in the kvstore (`sync --reserve-in-kvstore` only): the keys, the
    /// revision and what happened. Such a line carries no outcome: it serves no identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvstore: Option<String>,
    /// For a reservation: the revision its master key was written at, so that a later sync
    /// can tell the key is still the one written (and its own to keep or release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kvstore_revision: Option<i64>,
}

impl Record {
    /// What this line says of its identity, as verify reads it.
    pub fn logged(&self) -> Logged<'_> {
        Logged {
            id: &self.id,
            labels: &self.labels,
            kind: self.kind,
            outcome: self.outcome,
            target: self.target_id,
            step: self.step(),
            by_switch_prepare: self.decided_by.as_deref()
                == Some(DecidedBy::SwitchPrepare.as_str()),
        }
    }

    /// A line about identity `id` (the time and operator are filled in on append).
    pub fn new(
        id: &str,
        labels: &str,
        kind: Kind,
        decision: String,
        target_id: Option<u32>,
    ) -> Self {
        Record {
            ts: String::new(),
            operator: String::new(),
            id: id.to_string(),
            labels: labels.to_string(),
            kind,
            decision,
            target_id,
            outcome: None,
            error: None,
            uid: None,
            resource_version: None,
            kvstore: None,
            kvstore_revision: None,
            decided_by: None,
            action: None,
        }
    }

    /// A decision line: the text `"<action> (<decided_by>)"` and the same as fields.
    pub fn decision(
        id: &str,
        labels: &str,
        kind: Kind,
        (action, decided_by): (&str, &str),
        target_id: Option<u32>,
    ) -> Self {
        let text = format!("{action} ({decided_by})");
        Record::new(id, labels, kind, text, target_id).with_fields(decided_by, action)
    }

    /// This line's decision alone (who, when, what, on which identity), without an outcome
    /// or what a write or the kvstore returned.
    pub fn decision_only(&self) -> Self {
        Record {
            ts: self.ts.clone(),
            operator: self.operator.clone(),
            decided_by: self.decided_by.clone(),
            action: self.action.clone(),
            ..Record::new(
                &self.id,
                &self.labels,
                self.kind,
                self.decision.clone(),
                self.target_id,
            )
        }
    }

    /// Sets the structured fields of the decision.
    pub fn with_fields(mut self, decided_by: &str, action: &str) -> Self {
        self.decided_by = Some(decided_by.to_string());
        self.action = Some(action.to_string());
        self
    }

    /// Whether this line records a decision worth keeping the log for although nothing was
    /// written: a person's decision (or `--accept-proposals`), an undo, a skip or a mapping
    /// (which `verify` reads back). An identity found where it belongs is not one.
    pub fn is_decision(&self) -> bool {
        self.step().is_some()
            || matches!(self.outcome, Some(Outcome::Skipped | Outcome::Mapped))
            || matches!(self.action.as_deref(), Some("skip" | "map"))
    }

    /// What this line means for a resume: from the fields, or from the text in logs
    /// written before the fields.
    pub fn step(&self) -> Option<LogStep> {
        match (&self.decided_by, &self.action) {
            (Some(by), Some(action)) => {
                step_of_fields(&self.id, &self.labels, by, action, self.target_id)
            }
            _ => step_of(&self.id, &self.labels, &self.decision, self.target_id),
        }
    }
}

/// What a run worked on: written as the first line of each run, so a later run (a resume,
/// a rollback, an auditor) knows which cluster and kvstore the lines after it are about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// `tui`, `apply`, `rollback`, ...
    pub command: String,
    pub server: String,
    #[serde(default)]
    pub context: Option<String>,
    pub kvstore_endpoints: Vec<String>,
    pub kvstore_prefix: String,
    pub cluster_id: u32,
    pub max_connected_clusters: MaxConnectedClusters,
    /// This run's id, also on every object it creates (`RUN_ANNOTATION`); absent in logs
    /// written before runs had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// A session line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLine {
    pub ts: String,
    pub operator: String,
    pub session: Session,
}

/// What the API server said over part of a run (how often it pushed back, its warnings):
/// the run's record of how the server met it, for an auditor reading why a run was slow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerLine {
    pub ts: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    pub server_said: ServerSaid,
}

/// An open, append-only decision log. Appends are whole lines written with one `write` on
/// an `O_APPEND` file, so concurrent writers never interleave inside a line.
pub struct DecisionLog {
    path: PathBuf,
    file: Mutex<File>,
    operator: String,
    /// What opening it repaired (a torn last line removed), to tell the operator.
    repaired: Option<String>,
    /// This run made the file (it was empty or absent when opened).
    fresh: bool,
    /// A decision or an outcome was recorded (session lines do not count).
    recorded: std::sync::atomic::AtomicBool,
    /// A decision was recorded (`Record::is_decision`): the log is the record of it.
    decided: std::sync::atomic::AtomicBool,
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
        Ok(DecisionLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            operator: super::operator::current(),
            repaired,
            fresh,
            recorded: std::sync::atomic::AtomicBool::new(false),
            decided: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Removes the log when this run made it and recorded nothing in it (only its session
    /// line): a run that decided and wrote nothing leaves no file behind. True if removed.
    pub fn discard_if_unused(&self) -> bool {
        if !self.fresh || self.recorded.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        std::fs::remove_file(&self.path).is_ok()
    }

    /// Removes the log when this run made it and it records no decision, only identities
    /// found where they belong (an apply rerun that found every identity in place): its lines
    /// would only repeat the run that wrote them. A log with any decision in it (a skip, a
    /// mapping, an operator's or `--accept-proposals`' choice) is kept, written or not: the
    /// decision is the record. True if removed.
    pub fn discard_if_nothing_decided(&self) -> bool {
        self.fresh
            && !self.decided.load(std::sync::atomic::Ordering::SeqCst)
            && std::fs::remove_file(&self.path).is_ok()
    }

    /// Whether this run recorded a decision (`Record::is_decision`) in the log.
    pub fn holds_decisions(&self) -> bool {
        self.decided.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// What opening the log repaired, if anything: one line for the operator.
    pub fn repaired(&self) -> Option<&str> {
        self.repaired.as_deref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes an exclusive lock on the log for as long as this process runs (released by
    /// the kernel when it exits, SIGKILL included): a second process that would write the
    /// same log (a second `sync`) is refused instead of interleaving its lines.
    pub fn lock_for_one_writer(&self) -> Result<()> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        match file.try_lock() {
            Ok(()) => Ok(()),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Config(format!(
                "decision log {} is in use by another process (another sync?): one sync per decision log; stop that one or pass another --decision-log",
                self.path.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(Error::file_io(&self.path, "cannot lock decision log", e))
            }
        }
    }

    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// Fills in `ts` and `operator` and appends the record as one flushed line.
    pub fn append(&self, mut record: Record) -> Result<()> {
        record.ts = now();
        record.operator = self.operator.clone();
        self.recorded
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.append_line(&record)?;
        // Only once the line is written: a decision whose line failed is no record.
        if record.is_decision() {
            self.decided
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Records what the API server said over a span of this run (nothing when it said
    /// nothing: no 429, no warning).
    pub fn note_server(&self, said: &ServerSaid) -> Result<()> {
        if said.is_empty() {
            return Ok(());
        }
        self.append_line(&ServerLine {
            ts: now(),
            operator: self.operator.clone(),
            run: Some(run_id().to_string()),
            server_said: said.clone(),
        })
    }

    /// Appends the session line that opens a run.
    pub fn begin_session(&self, session: Session) -> Result<()> {
        self.append_line(&SessionLine {
            ts: now(),
            operator: self.operator.clone(),
            session,
        })
    }

    fn append_line(&self, value: &impl Serialize) -> Result<()> {
        let mut line = serde_json::to_vec(value).map_err(|e| Error::file_cause(&self.path, e))?;
        line.push(b'\n');
        let mut f = self
            .file
            .lock()
            .map_err(|_| Error::file(&self.path, "decision log lock poisoned"))?;
        // One write per line reaches the kernel at once, so a killed process loses nothing
        // it logged; fsync per line would cost more than the API calls themselves.
        f.write_all(&line)
            .and_then(|_| f.flush())
            .map_err(|e| Error::file_io(&self.path, "cannot append to decision log", e))
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
    let result = match tail.iter().rposition(|b| *b == b'\n') {
        Some(last) if last + 1 == tail.len() => None,
        found => {
            let keep = match found {
                Some(last) => len - tail_len + last as u64 + 1,
                // No newline in the last MiB: a whole line is longer than any record.
                None if tail_len < len => return Ok(None),
                None => 0,
            };
            let torn = &tail[(keep - (len - tail_len)) as usize..];
            file.set_len(keep)?;
            let shown: String = String::from_utf8_lossy(torn).chars().take(60).collect();
            Some(format!(
                "decision log {}: its last line was cut short ({} bytes, a write that never finished: {shown:?}...); removed it, every whole line is kept",
                path.display(),
                torn.len()
            ))
        }
    };
    file.unlock()?;
    Ok(result)
}

/// What a read of a log found.
#[derive(Debug, Default)]
pub struct LogContents {
    pub records: Vec<Record>,
    /// The session lines, in order.
    pub sessions: Vec<SessionLine>,
    /// What the API server said over the runs (429s, warnings), in order.
    pub server_said: Vec<ServerLine>,
    /// A last line without its newline that does not parse: a write cut short by a crash.
    pub torn_tail: bool,
    /// Complete lines that do not parse, with their line numbers.
    pub bad_lines: Vec<(usize, String)>,
}

impl LogContents {
    /// What `verify` expects, from this log: the latest serving or skip per id (its target
    /// and labels), and the ids a rollback deleted and nothing served again since.
    pub fn expectations(&self) -> Expectations {
        let mut e = Expectations::default();
        for r in &self.records {
            expect(&mut e, r);
        }
        e
    }

    /// Every decision and undo, in order, as a resume replays them.
    pub fn steps(&self) -> impl Iterator<Item = LogStep> + '_ {
        self.records.iter().filter_map(Record::step)
    }

    /// Decisions made and never followed by an outcome for their identity: a review that
    /// ended before its commit.
    pub fn uncommitted_decisions(&self) -> usize {
        let mut pending: BTreeSet<&str> = BTreeSet::new();
        for r in &self.records {
            if r.outcome.is_some() {
                pending.remove(r.id.as_str());
            } else if r.step().is_some() {
                pending.insert(r.id.as_str());
            }
        }
        pending.len()
    }
}

/// Every decision and undo of `logs`, each with its line, in the order they were made: by
/// each line's time, so that of two logs (a `--resume` log, a decisions file, this run's
/// own) the newer decision on an identity wins whichever file is named first. A line whose
/// time does not read keeps its place after the line before it in its own log; lines of
/// the same time keep the order of `logs` and of their lines.
pub fn steps_in_time<'a>(logs: &[&'a LogContents]) -> Vec<(LogStep, &'a Record)> {
    let mut all: Vec<(Option<jiff::Timestamp>, usize, usize, LogStep, &'a Record)> = Vec::new();
    for (n, log) in logs.iter().enumerate() {
        let mut at: Option<jiff::Timestamp> = None;
        for (k, r) in log.records.iter().enumerate() {
            if let Ok(t) = r.ts.parse::<jiff::Timestamp>() {
                at = Some(at.map_or(t, |a| a.max(t)));
            }
            if let Some(step) = r.step() {
                all.push((at, n, k, step, r));
            }
        }
    }
    all.sort_by_key(|a| (a.0, a.1, a.2));
    all.into_iter().map(|(_, _, _, s, r)| (s, r)).collect()
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

/// A log with a damaged line (not the torn last one) is refused, naming the line.
fn refuse_damaged(path: &Path, c: &LogContents) -> Result<()> {
    let Some((line, why)) = c.bad_lines.first() else {
        return Ok(());
    };
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

pub fn read_from(r: impl BufRead) -> std::io::Result<LogContents> {
    let mut records = Vec::new();
    let mut out = fold_from(r, |rec| records.push(rec))?;
    out.records = records;
    Ok(out)
}

/// Folds one record into what `verify` expects (core's one reading of a line).
fn expect(e: &mut Expectations, r: &Record) {
    e.fold(r.logged());
}

/// What `verify` expects from the log at `path`, folded line by line as `read` reads it
/// (damaged lines refused alike) without keeping its records: a log of a 65,280-identity
/// migration holds 130,000 of them, and verify needs only these maps.
pub fn read_expectations(path: &Path) -> Result<Expectations> {
    let f = open_to_read(path)?;
    let mut e = Expectations::default();
    let c = fold_from(BufReader::new(f), |rec| expect(&mut e, &rec))
        .map_err(|err| Error::file_cause(path, err))?;
    refuse_damaged(path, &c)?;
    if c.torn_tail {
        tracing::warn!(path = %path.display(), "decision log ends in a torn line (a write cut short); it was ignored");
    }
    Ok(e)
}

/// Reads every line, handing each record to `on_record`; the sessions, and what did not
/// parse, are returned (with no records).
fn fold_from(
    mut r: impl BufRead,
    mut on_record: impl FnMut(Record),
) -> std::io::Result<LogContents> {
    let mut out = LogContents::default();
    let mut buf = Vec::new();
    let mut n = 0;
    loop {
        buf.clear();
        if r.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        n += 1;
        let complete = buf.last() == Some(&b'\n');
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(text.trim_end()) {
            Ok(rec) => on_record(rec),
            Err(e) => match serde_json::from_str::<SessionLine>(text.trim_end()) {
                Ok(s) => out.sessions.push(s),
                Err(_) => match serde_json::from_str::<ServerLine>(text.trim_end()) {
                    Ok(s) => out.server_said.push(s),
                    Err(_) if !complete => out.torn_tail = true,
                    Err(_) => out.bad_lines.push((n, e.to_string())),
                },
            },
        }
    }
    Ok(out)
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
