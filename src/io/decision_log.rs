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
use crate::core::planner::resume::{LogStep, step_of, step_of_fields};
use crate::core::range::MaxConnectedClusters;
use crate::core::server_said::ServerSaid;
use crate::core::verify::Expectations;
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

/// Folds one record into what `verify` expects: the latest serving or skip per id (its
/// target and labels), and the ids a rollback deleted and nothing served again since.
fn expect(e: &mut Expectations, r: &Record) {
    if r.outcome.is_none() {
        expect_decided(e, r);
        return;
    }
    match r.outcome {
        Some(o) if o.is_serving() => {
            e.mappings.insert(r.id.clone(), r.target_id);
            e.mapped_labels.insert(r.id.clone(), r.labels.clone());
            e.rolled_back.remove(&r.id);
            let own = r.target_id.is_some_and(|t| t.to_string() == r.id);
            if r.kind == Kind::Duplicate && own && r.step().is_some() {
                e.duplicates_decided.insert(r.id.clone(), r.labels.clone());
            }
        }
        Some(Outcome::Skipped) => {
            e.mappings.insert(r.id.clone(), None);
            e.mapped_labels.insert(r.id.clone(), r.labels.clone());
        }
        Some(Outcome::Deleted | Outcome::AlreadyGone) => {
            e.rolled_back.insert(r.id.clone());
        }
        _ => {}
    }
}

/// A person's decision with no outcome (sync's decisions file, the TUI, a plan's skip before
/// its outcome): a skip is expected nowhere, whether or not a write ever follows, and an undo
/// or a later decision takes back a skip. Any other decision waits for its outcome line:
/// until something is written, the identity is expected where it was.
fn expect_decided(e: &mut Expectations, r: &Record) {
    let skipped = |e: &Expectations| e.mappings.get(&r.id) == Some(&None);
    match r.step() {
        Some(LogStep::Decide(d)) if d.action == crate::core::planner::Action::Skip => {
            e.mappings.insert(r.id.clone(), None);
            e.mapped_labels.insert(r.id.clone(), r.labels.clone());
        }
        Some(LogStep::Decide(_) | LogStep::Undo { .. } | LogStep::Undecided { .. })
            if skipped(e) =>
        {
            e.mappings.remove(&r.id);
            e.mapped_labels.remove(&r.id);
        }
        _ => {}
    }
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
mod tests {
    use super::*;
    use crate::core::planner::Action;
    use std::os::unix::fs::PermissionsExt;

    fn rec(id: &str, outcome: Option<Outcome>, target: Option<u32>) -> Record {
        Record {
            outcome,
            ..Record::new(id, "k8s:a=b;", Kind::Create, "create".into(), target)
        }
    }

    #[test]
    fn what_the_server_said_is_a_line_of_its_own_and_nothing_is_written_for_silence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        log.note_server(&ServerSaid::default()).unwrap();
        log.append(rec("300", Some(Outcome::Created), Some(300)))
            .unwrap();
        let said = ServerSaid {
            throttled: 7,
            warnings: vec!["v2 is deprecated".into()],
        };
        log.note_server(&said).unwrap();
        drop(log);
        let c = read(&path).unwrap();
        assert!(c.bad_lines.is_empty(), "{:?}", c.bad_lines);
        assert_eq!(c.records.len(), 1);
        assert_eq!(c.server_said.len(), 1);
        assert_eq!(c.server_said[0].server_said, said);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
    }

    #[test]
    fn appends_with_mode_0600_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        log.append(rec("300", None, Some(300))).unwrap();
        log.append(rec("300", Some(Outcome::Created), Some(300)))
            .unwrap();
        drop(log);
        // A rerun appends rather than truncating.
        let log = DecisionLog::open(&path).unwrap();
        log.append(rec("301", Some(Outcome::Mapped), Some(500)))
            .unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let c = read(&path).unwrap();
        assert_eq!(c.records.len(), 3);
        assert!(c.records[0].ts.contains('T'));
        assert!(c.records[0].operator.contains('@'));
        let m = c.expectations().mappings;
        assert_eq!(m["300"], Some(300));
        assert_eq!(m["301"], Some(500));
    }

    #[test]
    fn a_torn_last_line_is_removed_on_open_and_the_next_line_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        assert!(log.repaired().is_none(), "a new log needs no repair");
        log.append(Record::decision(
            "300",
            "k8s:app=a;",
            Kind::Create,
            ("create", "rule"),
            Some(300),
        ))
        .unwrap();
        drop(log);
        let whole = std::fs::read(&path).unwrap();
        // A process killed mid-write: half a line, no newline.
        let mut torn = whole.clone();
        torn.extend_from_slice(br#"{"ts":"2026-12-01T00:00:00Z","id":"301","lab"#);
        std::fs::write(&path, &torn).unwrap();
        let log = DecisionLog::open(&path).unwrap();
        let note = log.repaired().expect("the repair is said");
        assert!(note.contains("cut short") && note.contains("301"), "{note}");
        assert_eq!(std::fs::read(&path).unwrap(), whole);
        log.append(Record::decision(
            "302",
            "k8s:app=b;",
            Kind::Create,
            ("create", "rule"),
            Some(302),
        ))
        .unwrap();
        let c = read(&path).unwrap();
        assert_eq!(
            c.records.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["300", "302"]
        );
        // A log another process holds is left alone (its writer may be mid-line).
        drop(log);
        std::fs::write(&path, &torn).unwrap();
        let holder = DecisionLog::open(&path).unwrap();
        holder.lock_for_one_writer().unwrap();
        std::fs::write(&path, &torn).unwrap();
        let other = DecisionLog::open(&path).unwrap();
        assert!(other.repaired().is_none());
        assert_eq!(std::fs::read(&path).unwrap(), torn);
    }

    #[test]
    fn a_log_this_run_made_and_recorded_nothing_in_is_removed_and_no_other() {
        let session = || Session {
            command: "tui".into(),
            server: "https://k8s:6443".into(),
            context: None,
            kvstore_endpoints: vec![],
            kvstore_prefix: "cilium/state/identities/v1".into(),
            cluster_id: 0,
            max_connected_clusters: MaxConnectedClusters::C255,
            run: None,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        log.begin_session(session()).unwrap();
        assert!(log.discard_if_unused());
        assert!(!path.exists());
        // One with a record is kept; so is one that was there before this run.
        let log = DecisionLog::open(&path).unwrap();
        log.append(Record::new(
            "300",
            "k8s:a=1;",
            Kind::Create,
            "create (proposal)".into(),
            Some(300),
        ))
        .unwrap();
        assert!(!log.discard_if_unused());
        drop(log);
        let again = DecisionLog::open(&path).unwrap();
        again.begin_session(session()).unwrap();
        assert!(!again.discard_if_unused());
        assert!(path.exists());
    }

    #[test]
    fn sessions_rollbacks_and_uncommitted_decisions_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        let session = Session {
            command: "tui".into(),
            server: "https://k8s:6443".into(),
            context: Some("prod".into()),
            kvstore_endpoints: vec!["https://etcd:2379".into()],
            kvstore_prefix: "cilium/state/identities/v1".into(),
            cluster_id: 0,
            max_connected_clusters: MaxConnectedClusters::C255,
            run: None,
        };
        log.begin_session(session.clone()).unwrap();
        let decided =
            |id: &str, text: &str| Record::new(id, "k8s:a=b;", Kind::Remap, text.into(), Some(400));
        log.append(decided("300", "accept (create 400)")).unwrap();
        log.append(decided("301", "edit (create 401)")).unwrap();
        log.append(rec("301", Some(Outcome::Created), Some(401)))
            .unwrap();
        log.append(rec("302", Some(Outcome::Created), Some(302)))
            .unwrap();
        log.append(rec("302", Some(Outcome::Deleted), Some(302)))
            .unwrap();
        drop(log);
        let c = read(&path).unwrap();
        assert_eq!(c.sessions.len(), 1);
        assert_eq!(c.sessions[0].session, session);
        assert!(c.bad_lines.is_empty());
        assert_eq!(
            c.uncommitted_decisions(),
            1,
            "300 was decided, never committed"
        );
        assert_eq!(c.steps().count(), 2);
        let e = c.expectations();
        assert_eq!(e.rolled_back.into_iter().collect::<Vec<_>>(), ["302"]);
        let m = e.mappings;
        assert_eq!(m.get("301"), Some(&Some(401)));
        assert_eq!(
            m.get("302"),
            Some(&Some(302)),
            "where it was, for verify to report"
        );
        // Old lines without uid/resourceVersion still read; new ones carry them.
        let mut created = rec("303", Some(Outcome::Created), Some(303));
        created.uid = Some("u-1".into());
        created.resource_version = Some("7".into());
        let text = serde_json::to_string(&created).unwrap();
        assert!(text.contains("\"uid\":\"u-1\""), "{text}");
        let back = read_from(format!("{text}\n").as_bytes()).unwrap();
        assert_eq!(back.records[0], created);
    }

    #[test]
    fn a_damaged_line_other_than_the_last_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let good = serde_json::to_string(&rec("1", Some(Outcome::Created), Some(1))).unwrap();
        std::fs::write(&path, format!("{good}\n{good}\n{{\"ts\":\"20")).unwrap();
        assert_eq!(
            read(&path).unwrap().records.len(),
            2,
            "a torn tail is tolerated"
        );
        std::fs::write(&path, format!("{good}\nnot json\n{good}\n")).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.is_usage(), "exit 2: {err}");
        let e = err.to_string();
        assert!(e.contains("d.jsonl") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn steps_replay_in_the_order_they_were_made_whichever_log_is_named_first() {
        let at = |id: &str, ts: &str, action: &str, t: Option<u32>| {
            let mut r = Record::decision(id, "k8s:a=b;", Kind::Remap, (action, "operator"), t);
            r.ts = ts.into();
            r
        };
        let log = |records: Vec<Record>| LogContents {
            records,
            ..Default::default()
        };
        // This run's log decided 300 at 10:00; the decisions file, edited at 10:05, skips
        // it and undoes 301 (decided in the run's log at 10:01).
        let run = log(vec![
            at("300", "2026-12-04T10:00:00Z", "create", Some(5000)),
            at("301", "2026-12-04T10:01:00Z", "create", Some(5001)),
        ]);
        let file = log(vec![
            at("300", "2026-12-04T10:05:00.5Z", "skip", None),
            at("301", "2026-12-04T10:05:01Z", "undecided", None),
        ]);
        for order in [[&run, &file], [&file, &run]] {
            let steps = steps_in_time(&order);
            let r = crate::core::planner::resume::replay(steps.into_iter().map(|(s, _)| s));
            assert_eq!(r.len(), 1, "{r:?}");
            assert_eq!(r["300"].action, Action::Skip);
        }
        // A line whose time does not read keeps its place after the one before it.
        let odd = log(vec![
            at("302", "2026-12-04T10:00:00Z", "create", Some(6000)),
            at("302", "not a time", "skip", None),
        ]);
        let later = log(vec![at(
            "302",
            "2026-12-04T09:00:00Z",
            "create",
            Some(6001),
        )]);
        let steps = steps_in_time(&[&later, &odd]);
        let r = crate::core::planner::resume::replay(steps.into_iter().map(|(s, _)| s));
        assert_eq!(r["302"].action, Action::Skip);
    }

    #[test]
    fn a_skip_decided_without_an_outcome_is_expected_nowhere_until_undone() {
        let line = |id: &str, action: &str, by: &str| {
            Record::decision(id, "k8s:a=b;", Kind::Remap, (action, by), None)
        };
        let of = |records: Vec<Record>| {
            LogContents {
                records,
                ..Default::default()
            }
            .expectations()
            .mappings
        };
        // Sync's decisions file skips 302: no outcome line ever follows.
        let m = of(vec![line("302", "skip", "operator")]);
        assert_eq!(m.get("302"), Some(&None));
        // Undone, or decided otherwise: expected where it was again.
        for after in ["undecided", "create"] {
            let m = of(vec![
                line("302", "skip", "operator"),
                line("302", after, "operator"),
            ]);
            assert_eq!(m.get("302"), None, "{after}");
        }
        // A rule's skip without an outcome, or a create decided and not written, changes
        // nothing: what was written says where it is.
        assert!(of(vec![line("303", "skip", "rule")]).is_empty());
        let mut created = line("304", "create", "operator");
        created.target_id = Some(5000);
        assert!(of(vec![created]).is_empty());
    }

    #[test]
    fn a_log_is_discarded_only_when_it_records_no_decision() {
        let dir = tempfile::tempdir().unwrap();
        let in_place = |id: &str| Record {
            outcome: Some(Outcome::AlreadyMigrated),
            ..Record::decision(
                id,
                "k8s:a=b;",
                Kind::AlreadyMigrated,
                ("none", "proposal"),
                Some(300),
            )
        };
        let path = dir.path().join("rerun.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        log.append(in_place("300")).unwrap();
        assert!(!log.holds_decisions());
        assert!(log.discard_if_nothing_decided());
        assert!(!path.exists());
        // A skip, a mapping, an operator's or --accept-proposals' decision: each keeps it.
        let skip = Record {
            outcome: Some(Outcome::Skipped),
            ..Record::decision("301", "k8s:a=c;", Kind::Remap, ("skip", "operator"), None)
        };
        let map = Record {
            outcome: Some(Outcome::Mapped),
            ..Record::decision(
                "302",
                "k8s:a=d;",
                Kind::Reuse,
                ("map", "proposal"),
                Some(900),
            )
        };
        let accepted = Record::decision(
            "303",
            "k8s:a=e;",
            Kind::Remap,
            ("create", "accept-proposals"),
            Some(256),
        );
        for (n, r) in [skip, map, accepted].into_iter().enumerate() {
            let path = dir.path().join(format!("{n}.jsonl"));
            let log = DecisionLog::open(&path).unwrap();
            log.append(in_place("300")).unwrap();
            log.append(r).unwrap();
            assert!(log.holds_decisions());
            assert!(!log.discard_if_nothing_decided());
            assert!(path.exists());
        }
        // A decision whose line could not be written is no record of it.
        let full = DecisionLog::open(Path::new("/dev/full")).unwrap();
        assert!(
            full.append(Record::decision(
                "304",
                "k8s:a=f;",
                Kind::Remap,
                ("skip", "operator"),
                None
            ))
            .is_err()
        );
        assert!(!full.holds_decisions());
    }

    #[test]
    fn torn_last_line_is_tolerated_and_reported() {
        let good = serde_json::to_string(&rec("1", Some(Outcome::Created), Some(1))).unwrap();
        let text = format!("{good}\nnot json\n{good}\n{{\"ts\":\"20");
        let c = read_from(text.as_bytes()).unwrap();
        assert_eq!(c.records.len(), 2);
        assert!(c.torn_tail);
        assert_eq!(c.bad_lines.len(), 1);
        assert_eq!(c.bad_lines[0].0, 2);
    }

    /// A log written before decisions had fields (checked in as it was written) reads back
    /// the same decisions as one written now with them.
    #[test]
    fn logs_written_before_the_fields_resume_as_logs_written_with_them() {
        let old = include_str!("../../tests/data/decision-log-before-fields.jsonl");
        let c = read_from(std::io::Cursor::new(old)).unwrap();
        assert!(c.bad_lines.is_empty());
        let before = crate::core::planner::resume::replay(c.steps());
        let got: Vec<(&str, Action, Option<u32>)> = before
            .values()
            .map(|d| (d.id.as_str(), d.action, d.target_id))
            .collect();
        assert_eq!(
            got,
            [
                ("302", Action::Create, Some(4000)),
                ("304", Action::Skip, None),
                ("305", Action::None, Some(910)),
                ("306", Action::Create, Some(5000)),
                ("307", Action::None, Some(911)),
            ]
        );
        // The same decisions written as today's code writes them.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.jsonl");
        let log = DecisionLog::open(&path).unwrap();
        let c = "k8s:app=c;k8s:io.kubernetes.pod.namespace=shop;";
        let tui = |id: &str, labels: &str, kind, text: &str, action: &str, t| {
            Record::new(id, labels, kind, text.into(), t).with_fields("operator", action)
        };
        for r in [
            tui(
                "302",
                c,
                Kind::Remap,
                "edit (create 4000)",
                "create",
                Some(4000),
            ),
            tui(
                "302",
                c,
                Kind::Remap,
                "edit (create 4001)",
                "create",
                Some(4001),
            ),
            tui(
                "302",
                c,
                Kind::Remap,
                "undo (create 4000)",
                "undo",
                Some(4000),
            ),
            tui(
                "304",
                "k8s:app=e;k8s:io.kubernetes.pod.namespace=shop;",
                Kind::Duplicate,
                "bulk-skip (skip -)",
                "skip",
                None,
            ),
            tui(
                "305",
                "k8s:app=f;k8s:io.kubernetes.pod.namespace=shop;",
                Kind::Duplicate,
                "accept (none 910)",
                "none",
                Some(910),
            ),
            Record::decision(
                "300",
                "k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;",
                Kind::Create,
                ("create", "proposal"),
                Some(300),
            ),
            Record::decision(
                "306",
                "k8s:app=g;k8s:io.kubernetes.pod.namespace=shop;",
                Kind::Remap,
                ("create", "accept-proposals"),
                Some(5000),
            ),
            Record::decision(
                "307",
                "k8s:app=h;k8s:io.kubernetes.pod.namespace=shop;",
                Kind::Duplicate,
                ("map", "operator"),
                Some(911),
            ),
        ] {
            log.append(r).unwrap();
        }
        let now = read(&path).unwrap();
        assert!(now.records.iter().all(|r| r.action.is_some()));
        assert_eq!(crate::core::planner::resume::replay(now.steps()), before);
        // The fields win over the text: a line whose text says skip but whose fields say
        // create is a create (the fields are what the writer knew).
        let mut r = Record::new(
            "309",
            "k8s:a=b;",
            Kind::Duplicate,
            "skip (operator)".into(),
            Some(9),
        );
        r = r.with_fields("operator", "create");
        assert!(matches!(r.step(), Some(LogStep::Decide(d)) if d.action == Action::Create));
    }
}
