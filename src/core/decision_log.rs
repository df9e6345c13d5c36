//! The decision log's lines and their one reading, the same for every reader: the binary's
//! commands, which read a log from disk (`io::decision_log`), and the simulation, which
//! keeps its instances' logs in memory. JSON Lines: a record per decision and outcome, a
//! session line opening each run, what the server said; a last line without its newline is
//! torn (a write cut short), any other line that does not parse is damaged.

pub mod carry;
pub mod file;
pub mod line;
pub mod reservations;
pub mod undo;

pub use line::Record;

use std::collections::BTreeSet;
use std::io::BufRead;

use serde::{Deserialize, Serialize};

use crate::core::outcome::Outcome;
use crate::core::planner::Kind;
use crate::core::planner::decision::DecidedBy;
use crate::core::planner::resume::{LogStep, step_of, step_of_fields};
use crate::core::range::MaxConnectedClusters;
use crate::core::server_said::ServerSaid;
use crate::core::verify::Expectations;
use crate::core::verify::expect::Logged;

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
            // Logs written before the step had kinds of its own name it by who decided.
            by_switch_prepare: self.kind.is_switch_step()
                || self.decided_by.as_deref() == Some(DecidedBy::SwitchPrepare.as_str()),
        }
    }

    /// A line that says where identity `id` is served (`target`, outcome `mapped`) or that
    /// it is served nowhere (`None`, `skipped`), by neither a person nor a write: what verify
    /// reads, and never a decision to resume (`decided_by` is no person's).
    pub fn serving(
        id: &str,
        labels: &str,
        kind: Kind,
        target: Option<u32>,
        decision: String,
        (decided_by, action): (&str, &str),
    ) -> Self {
        let mut line =
            Record::new(id, labels, kind, decision, target).with_fields(decided_by, action);
        line.outcome = Some(match target {
            Some(_) => Outcome::Mapped,
            None => Outcome::Skipped,
        });
        line
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
        // `action (decided_by)`, spelled without the formatting machinery: every decision
        // line of a sync starts here.
        let mut text = String::with_capacity(action.len() + decided_by.len() + 3);
        text.push_str(action);
        text.push_str(" (");
        text.push_str(decided_by);
        text.push(')');
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
        // A write's outcome line restates the decision its decision line recorded before
        // the write began: not a decision of its own. Read as one, the outcome of a batch
        // still in flight when the operator took the decision back would bring it back at
        // the next resume (found by the simulation once it kept the binary's log).
        let writes = matches!(self.action.as_deref(), Some("create" | "delete"));
        if writes && self.outcome.is_some() {
            return None;
        }
        // switch-prepare's steps, and a rollback's restore of one, serve pods: never a
        // decision on a kvstore identity to resume.
        if self.kind.is_switch_step() {
            return None;
        }
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

/// What a read of a log found.
#[derive(Debug, Default, Clone)]
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
    // One log alone: each line's time is the latest so far, never less than the line
    // before's, so time order is line order and no time need be read (a restart reading
    // only its own log, tens of thousands of lines).
    if let [log] = logs {
        return log
            .records
            .iter()
            .filter_map(|r| Some((r.step()?, r)))
            .collect();
    }
    let mut all: Vec<(Option<jiff::Timestamp>, usize, usize, LogStep, &'a Record)> = Vec::new();
    for (n, log) in logs.iter().enumerate() {
        let mut at: Option<jiff::Timestamp> = None;
        // Lines come in bursts of one time: a time the line before had is not read again.
        let mut read: Option<(&str, Option<jiff::Timestamp>)> = None;
        for (k, r) in log.records.iter().enumerate() {
            let t = match read {
                Some((ts, t)) if ts == r.ts => t,
                _ => r.ts.parse::<jiff::Timestamp>().ok(),
            };
            read = Some((&r.ts, t));
            if let Some(t) = t {
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

/// Reads every line of a log (see the module).
pub fn read_from(r: impl BufRead) -> std::io::Result<LogContents> {
    read_lines(r, false)
}

/// Every line read, the records kept in order; `unterminated_counts` as `fold_lines` says.
fn read_lines(r: impl BufRead, unterminated_counts: bool) -> std::io::Result<LogContents> {
    let mut records = Vec::new();
    let mut out = fold_lines(r, unterminated_counts, |rec| records.push(rec))?;
    out.records = records;
    Ok(out)
}

/// Folds one record into what `verify` expects (core's one reading of a line).
pub fn expect(e: &mut Expectations, r: &Record) {
    e.fold(r.logged());
}

/// Reads every line, handing each record to `on_record`; the sessions, and what did not
/// parse, are returned (with no records). A last line without its newline is torn and left
/// out, even if it reads: the writer that was killed in it never finished it, and a start
/// that opens the log to write removes it (`torn_tail`), so every reader of the log reads
/// the same lines (found by the simulation: a `--resume` log read a line its own restart cut).
pub fn fold_from(r: impl BufRead, on_record: impl FnMut(Record)) -> std::io::Result<LogContents> {
    fold_lines(r, false, on_record)
}

/// `read_from` for a decisions file, which sync only reads and which is replaced whole, not
/// written a line at a time by a process that can be killed: a last line without its newline
/// (an editor's, a ConfigMap's `|-`) counts when it reads whole.
pub fn read_decisions_file_from(r: impl BufRead) -> std::io::Result<LogContents> {
    read_lines(r, true)
}

fn fold_lines(
    mut r: impl BufRead,
    unterminated_counts: bool,
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
        // Lossy only where it must be: checking a valid line is much cheaper than that.
        let text = match std::str::from_utf8(&buf) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(&buf),
        };
        let text = text.trim_end();
        if text.trim_start().is_empty() {
            continue;
        }
        if !complete && !unterminated_counts {
            out.torn_tail = true;
            continue;
        }
        let record = match line::read_record_line(text) {
            Some(record) => Ok(record),
            None => serde_json::from_str::<Record>(text),
        };
        match record {
            Ok(rec) => on_record(rec),
            Err(e) => match serde_json::from_str::<SessionLine>(text) {
                Ok(s) => out.sessions.push(s),
                Err(_) => match serde_json::from_str::<ServerLine>(text) {
                    Ok(s) => out.server_said.push(s),
                    Err(_) if !complete => out.torn_tail = true,
                    Err(_) => out.bad_lines.push((n, e.to_string())),
                },
            },
        }
    }
    Ok(out)
}

/// The decisions in force at the end of some logs, each with its line.
pub type InForce =
    std::collections::BTreeMap<String, (crate::core::planner::resume::LoggedDecision, Record)>;

/// The decisions in force at the end of `logs`, each with its line, replayed in the order
/// they were made (`steps_in_time`): how every restart reads its logs.
pub fn in_force(logs: &[&LogContents]) -> InForce {
    // Replayed over the lines borrowed; only those in force at the end are copied.
    crate::core::planner::resume::replay_with(steps_in_time(logs))
        .into_iter()
        .map(|(id, (d, r))| (id, (d, r.clone())))
        .collect()
}

/// The decisions in force at the end of `logs` and a decisions file read beside them (a
/// restart's `--decisions`), as the file's follower would have left them. Where the logs
/// carried a line of the file for an identity (`carried_from_file`), the file counts only
/// if it says otherwise now: it changed since, so it is the newer word; if it says what was
/// carried, the logs stand (a later decision made on this machine stays in force, whatever
/// the file's clock said). Where the logs never carried the file's word on an identity, the
/// two go by time, the file's lines at its own clock (a change made while sync was not
/// running), and of two lines of the same time the logs have the last word.
///
/// `logs_say` and `now` are what `logs` and the file each replay to alone: a start has
/// both at hand already, and a replay of its logs is its cost.
pub fn with_file(
    logs_say: InForce,
    logs: &[&LogContents],
    now: &InForce,
    file: &LogContents,
) -> InForce {
    let carried = carried_from_file(logs);
    let mut out = logs_say;
    for (id, last) in &carried {
        let said = now.get(id);
        if said.map(|(d, _)| d) == last.as_ref() {
            continue;
        }
        match said {
            Some(v) => out.insert(id.clone(), v.clone()),
            None => out.remove(id),
        };
    }
    let never_carried = LogContents {
        records: file
            .records
            .iter()
            .filter(|r| !carried.contains_key(&r.id))
            .cloned()
            .collect(),
        ..LogContents::default()
    };
    if never_carried.records.is_empty() {
        return out;
    }
    let mut all = vec![&never_carried];
    all.extend_from_slice(logs);
    let by_time = in_force(&all);
    let ids: std::collections::BTreeSet<&String> =
        never_carried.records.iter().map(|r| &r.id).collect();
    for id in ids {
        match by_time.get(id) {
            Some(v) => out.insert(id.clone(), v.clone()),
            None => out.remove(id),
        };
    }
    out
}

/// What marks a line sync wrote for a change of the decisions file (`line_of` in its `file` module), an
/// undo's too: how a restart tells what the file said when it was last read.
pub const CARRIED_FROM_FILE: &str = "(carried from the decisions file";

/// What the logs last carried from the decisions file, per identity: the decision, or
/// `None` for an undo (a line marked `CARRIED_FROM_FILE`).
pub fn carried_from_file(
    logs: &[&LogContents],
) -> std::collections::BTreeMap<String, Option<crate::core::planner::resume::LoggedDecision>> {
    last_carried_from_file(logs)
        .into_iter()
        .map(|(id, (said, _))| (id, said))
        .collect()
}

/// Per identity, what the logs last carried from the decisions file (`None`: an undo),
/// with the line that carried it.
pub fn last_carried_from_file<'a>(
    logs: &[&'a LogContents],
) -> std::collections::BTreeMap<
    String,
    (
        Option<crate::core::planner::resume::LoggedDecision>,
        &'a Record,
    ),
> {
    let mut last = std::collections::BTreeMap::new();
    for (step, r) in steps_in_time(logs) {
        if !r.decision.contains(CARRIED_FROM_FILE) {
            continue;
        }
        let said = match step {
            LogStep::Decide(d) => Some(d),
            LogStep::Undo { .. } | LogStep::Undecided { .. } => None,
        };
        last.insert(r.id.clone(), (said, r));
    }
    last
}

/// Where a log's lines go: the file on disk (`io::decision_log`) or the simulation's bytes
/// in memory. An append is one whole line, written at once.
pub trait LogFile {
    /// Why a line was not written, in the file's own terms.
    type Error: std::fmt::Display;
    /// Appends `line` (with its newline) in one write.
    fn append_line(&self, line: &[u8]) -> Result<(), Self::Error>;
    /// Appends `line`, the encoding of `record`, as `append_line` does. A file held in
    /// memory (the simulation's) keeps the record as well, rather than decoding each line
    /// again; it reads the whole file back once, to hold the two equal.
    fn append_record(&self, line: &[u8], record: Record) -> Result<(), Self::Error> {
        drop(record);
        self.append_line(line)
    }
    /// A line that cannot be encoded, in the file's terms.
    fn unencodable(&self, e: serde_json::Error) -> Self::Error;
    /// The time of a line written now (RFC 3339, UTC).
    fn now(&self) -> String;
}

/// The log's writer, the one every command and the simulation write through: each record
/// stamped with its time and operator and appended as one line, and whether this run has
/// recorded anything, or a decision, so far.
pub struct Writer<F> {
    file: F,
    operator: String,
    /// A decision or an outcome was recorded (session lines do not count).
    recorded: std::sync::atomic::AtomicBool,
    /// A decision was recorded (`Record::is_decision`): the log is the record of it.
    decided: std::sync::atomic::AtomicBool,
}

impl<F: LogFile> Writer<F> {
    pub fn new(file: F, operator: String) -> Self {
        Writer {
            file,
            operator,
            recorded: Default::default(),
            decided: Default::default(),
        }
    }

    pub fn file(&self) -> &F {
        &self.file
    }

    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// A decision or an outcome was recorded.
    pub fn recorded(&self) -> bool {
        self.recorded.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A decision was recorded.
    pub fn decided(&self) -> bool {
        self.decided.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Fills in `ts` and `operator` and appends the record as one line.
    pub fn append(&self, mut record: Record) -> Result<(), F::Error> {
        record.ts = self.file.now();
        record.operator = self.operator.clone();
        self.recorded
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let line = line::record_line(&record);
        let decision = record.is_decision();
        self.file.append_record(&line, record)?;
        // Only once the line is written: a decision whose line failed is no record.
        if decision {
            self.decided
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Records what the API server said over a span of run `run` (nothing when it said
    /// nothing: no 429, no warning).
    pub fn note_server(&self, said: &ServerSaid, run: &str) -> Result<(), F::Error> {
        if said.is_empty() {
            return Ok(());
        }
        self.append_line(&ServerLine {
            ts: self.file.now(),
            operator: self.operator.clone(),
            run: Some(run.to_string()),
            server_said: said.clone(),
        })
    }

    /// Appends the session line that opens a run.
    pub fn begin_session(&self, session: Session) -> Result<(), F::Error> {
        self.append_line(&SessionLine {
            ts: self.file.now(),
            operator: self.operator.clone(),
            session,
        })
    }

    fn append_line(&self, value: &impl Serialize) -> Result<(), F::Error> {
        let line = encoded(value).map_err(|e| self.file.unencodable(e))?;
        self.file.append_line(&line)
    }
}

/// A line of the log: `value` as JSON, then a newline. Room for a whole line of most is made
/// at once (grown step by step, the copies were a tenth of a line's cost).
fn encoded(value: &impl Serialize) -> serde_json::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(512);
    serde_json::to_writer(&mut line, value)?;
    line.push(b'\n');
    Ok(line)
}

/// How many bytes at the end of a log are a torn line (a write that never finished: no
/// newline after it), to remove before the next append; `tail` is the log's last bytes,
/// `whole` whether it is all of it (a tail with no newline in it at all cannot tell).
pub fn torn_tail(tail: &[u8], whole: bool) -> Option<usize> {
    match tail.iter().rposition(|b| *b == b'\n') {
        Some(last) if last + 1 == tail.len() => None,
        Some(last) => Some(tail.len() - last - 1),
        None if whole && !tail.is_empty() => Some(tail.len()),
        None => None,
    }
}

/// What a repair of a torn last line says, quoting the start of what it removed.
pub fn torn_note(log: &str, torn: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(torn).chars().take(60).collect();
    format!(
        "decision log {log}: its last line was cut short ({} bytes, a write that never finished: {shown:?}...); removed it, every whole line is kept",
        torn.len()
    )
}

/// What a command that only reads a log says of a torn last line it left out (it may be a
/// write still going on: reading never repairs).
pub fn torn_left_out(log: &str) -> String {
    format!(
        "note: {log} ends in a torn line (a write cut short, or one still being written); it was left out, every whole line was read"
    )
}

/// An operator's decision on a screen, or its undo (`name` "undo" on an item no longer
/// decided), as the log records it.
pub fn decision_record(name: &str, item: &crate::core::planner::PlanItem) -> Record {
    let action = if name == "undo" && !item.decided {
        "undecided"
    } else {
        item.action.as_str()
    };
    Record::new(
        &item.id,
        &item.labels,
        item.kind,
        crate::core::planner::describe(name, item),
        item.target_id,
    )
    .with_fields(DecidedBy::Operator.as_str(), action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_alone_keeps_who_made_it_and_when_and_drops_what_the_write_did() {
        // An export writes it as the decisions file's line: dated as it was decided.
        let decided = Record::decision("302", "k8s:b=c;", Kind::Create, ("create", "alice"), None);
        let mut r = decided.clone();
        r.ts = "2026-12-01T00:00:00Z".into();
        r.operator = "alice".into();
        r.outcome = Some(crate::core::outcome::Outcome::Created);
        r.uid = Some("u-1".into());
        let d = r.decision_only();
        let when_and_who = (d.ts.as_str(), d.operator.as_str());
        assert_eq!(when_and_who, ("2026-12-01T00:00:00Z", "alice"));
        assert_eq!((d.outcome, d.uid.as_deref()), (None, None));
        assert_eq!(
            d.step(),
            decided.step(),
            "the line a resume reads as the decision"
        );
    }

    #[test]
    fn a_torn_last_line_is_found_and_a_whole_one_is_not() {
        assert_eq!(torn_tail(b"{\"a\":1}\n{\"b\"", true), Some(4));
        assert_eq!(torn_tail(b"{\"a\":1}\n", true), None);
        assert_eq!(torn_tail(b"{\"b\"", true), Some(4));
        assert_eq!(
            torn_tail(b"{\"b\"", false),
            None,
            "a tail with no newline cannot tell"
        );
        assert_eq!(torn_tail(b"", true), None);
        let note = torn_note("log.jsonl", b"{\"b\"");
        assert!(
            note.contains("4 bytes") && note.contains("log.jsonl"),
            "{note}"
        );
    }

    #[test]
    fn a_whole_line_that_lost_only_its_newline_is_torn_in_a_log_and_whole_in_a_decisions_file() {
        let line = |id: &str| {
            let r = Record::decision(id, "k8s:a=1;", Kind::Duplicate, ("skip", "operator"), None);
            serde_json::to_string(&r).unwrap()
        };
        let bytes = format!("{}\n{}", line("256"), line("257"));
        // A log: what its own restart keeps once it cut the torn line (`torn_tail`), a
        // reader of it as a `--resume` log keeps too.
        let log = read_from(bytes.as_bytes()).unwrap();
        let ids: Vec<&str> = log.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!((ids, log.torn_tail), (vec!["256"], true));
        let cut = torn_tail(bytes.as_bytes(), true).unwrap();
        let kept = read_from(&bytes.as_bytes()[..bytes.len() - cut]).unwrap();
        assert_eq!(kept.records, log.records);
        // A decisions file: the last line counts when it reads whole, not when it is cut.
        let file = read_decisions_file_from(bytes.as_bytes()).unwrap();
        let ids: Vec<&str> = file.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!((ids, file.torn_tail), (vec!["256", "257"], false));
        let cut_short = read_decisions_file_from(&bytes.as_bytes()[..bytes.len() - 3]).unwrap();
        assert_eq!((cut_short.records.len(), cut_short.torn_tail), (1, true));
        // Blank tails are no line at all.
        assert!(
            !read_from(format!("{}\n  ", line("256")).as_bytes())
                .unwrap()
                .torn_tail
        );
    }
}

#[cfg(test)]
mod resume_tests {
    use super::*;
    use crate::core::outcome::Outcome;

    /// What a start makes of `logs` and a decisions file, both read whole.
    fn in_force_with_file(logs: &[&LogContents], file: &LogContents) -> InForce {
        with_file(in_force(logs), logs, &in_force(&[file]), file)
    }

    #[test]
    fn an_undo_while_the_create_is_in_flight_stays_undone_at_a_resume() {
        let decided = Record::decision(
            "300",
            "k8s:a=b;",
            Kind::Remap,
            ("create", "operator"),
            Some(4000),
        );
        let undone = Record::decision(
            "300",
            "k8s:a=b;",
            Kind::Remap,
            ("undecided", "operator"),
            Some(4000),
        );
        // The batch's outcome line lands after the undo: it restates the decision it
        // carried out, and is no decision of its own.
        let outcome = Record {
            outcome: Some(Outcome::Failed),
            ..decided.clone()
        };
        let log = LogContents {
            records: vec![decided.clone(), undone, outcome],
            ..LogContents::default()
        };
        assert!(in_force(&[&log]).is_empty(), "the undo stands");
        // A skip decided and recorded with its outcome on one line is still a decision.
        let mut skip = Record::decision("301", "k8s:c=d;", Kind::Remap, ("skip", "operator"), None);
        skip.outcome = Some(Outcome::Skipped);
        assert!(skip.step().is_some());
        assert!(decided.step().is_some());
    }

    #[test]
    fn a_log_that_resumed_another_restarts_alone_as_the_two_did() {
        use super::file::resume;
        use super::reservations::{RELEASE_RESERVATION, RESERVE_IN_KVSTORE, unreleased_in};
        let at = |ts: &str, id: &str, action: &str, target: Option<u32>| Record {
            ts: ts.into(),
            ..Record::decision(id, "k8s:a=b;", Kind::Remap, (action, "operator"), target)
        };
        let reservation = |id: u32, action: &str, revision: i64| {
            let mut r = at("2026-12-01T00:01:00Z", &id.to_string(), action, Some(id));
            r.decided_by = Some("rule".into());
            r.kvstore_revision = Some(revision);
            r
        };
        // A decisions file whose clock runs ahead, its skip of 300 carried by the old log,
        // then 300 decided here later; reservations made, one released.
        let file = LogContents {
            records: vec![at("2026-12-01T00:10:00Z", "300", "skip", None)],
            ..LogContents::default()
        };
        let mut carried = file.records[0].decision_only();
        carried.ts = "2026-12-01T00:00:01Z".into();
        carried.decision = format!("skip {CARRIED_FROM_FILE}: decided by x at y)");
        let old = LogContents {
            records: vec![
                carried,
                reservation(4000, RESERVE_IN_KVSTORE, 12),
                reservation(4001, RESERVE_IN_KVSTORE, 13),
                reservation(4001, RELEASE_RESERVATION, 13),
                at("2026-12-01T00:05:00Z", "300", "create", Some(4000)),
            ],
            ..LogContents::default()
        };
        // Started on a new log with --resume naming the old one: what it writes.
        let start = |resumed: &[&LogContents], own: &LogContents| {
            let mut lines = Vec::new();
            let mut append = |mut r: Record| {
                r.ts = "2026-12-01T00:06:00Z".into();
                lines.push(r);
                Ok(())
            };
            let merged = resume(resumed, own, Some(&file), &mut append).unwrap();
            (merged.decisions, lines)
        };
        let (first, lines) = start(&[&old], &LogContents::default());
        assert_eq!(first["300"].target_id, Some(4000));
        let new = LogContents {
            records: lines,
            ..LogContents::default()
        };
        // A later start given the new log alone: the same decision, the same reservation.
        let (later, again) = start(&[], &new);
        assert_eq!(later, first, "the decision made here stays in force");
        assert!(again.is_empty(), "nothing to carry: {again:?}");
        let held = unreleased_in(&[&new]);
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            [(4000, ("k8s:a=b;".to_string(), 12))],
            "the reservation not released is the new log's to take over"
        );
        // Resumed once more, nothing is carried twice.
        let (_, twice) = start(&[&old], &new);
        assert!(twice.is_empty(), "{twice:?}");
    }

    #[test]
    fn a_decisions_file_dated_ahead_does_not_undo_a_later_decision_made_here() {
        let at = |ts: &str, id: &str, action: &str, target: Option<u32>| Record {
            ts: ts.into(),
            ..Record::decision(id, "k8s:a=b;", Kind::Remap, (action, "operator"), target)
        };
        // The file's clock runs ten minutes ahead of this machine's.
        let file = LogContents {
            records: vec![
                at("2026-12-01T00:10:00Z", "300", "skip", None),
                at("2026-12-01T00:10:00Z", "301", "skip", None),
            ],
            ..LogContents::default()
        };
        // Sync carried the file's skip of 300 at 00:00:01 (the line it writes for it), then
        // a person decided 300 on a screen here at 00:05:00; 301's skip was never carried
        // (sync was down).
        // (As the file module's `line_of` words it: the decision, who made it there, the mark.)
        let carried = |ts: &str, r: &Record| {
            let mut line = r.decision_only();
            line.ts = ts.into();
            line.decision = format!(
                "{} {CARRIED_FROM_FILE}: decided by {} at {})",
                r.decision, r.operator, r.ts
            );
            line
        };
        let mut log = LogContents {
            records: vec![
                carried("2026-12-01T00:00:01Z", &file.records[0]),
                at("2026-12-01T00:05:00Z", "300", "create", Some(4000)),
            ],
            ..LogContents::default()
        };
        let now = in_force_with_file(&[&log], &file);
        assert_eq!(
            now["300"].0.target_id,
            Some(4000),
            "the later decision here stands"
        );
        assert_eq!(now["301"].0.action, crate::core::planner::Action::Skip);
        // So it does when the screen decided in the very second the line was carried.
        log.records[1].ts = "2026-12-01T00:00:01Z".into();
        let now = in_force_with_file(&[&log], &file);
        assert_eq!(
            now["300"].0.target_id,
            Some(4000),
            "a tie goes to this machine"
        );
        // The file changed since it was carried: its new word is the newer one, whatever
        // its clock says.
        let mut changed = LogContents {
            records: file.records.clone(),
            ..LogContents::default()
        };
        changed
            .records
            .push(at("2026-12-01T00:00:30Z", "300", "create", Some(5000)));
        let now = in_force_with_file(&[&log], &changed);
        assert_eq!(now["300"].0.target_id, Some(5000));
        // Merged by the file's own time, the file would have won: the defect this mends.
        let naive = in_force(&[&log, &file]);
        assert_eq!(naive["300"].0.action, crate::core::planner::Action::Skip);
    }

    #[test]
    fn one_log_alone_is_replayed_in_the_order_the_merge_of_several_gives_it() {
        let at = |ts: &str, id: &str, action: &str| Record {
            ts: ts.into(),
            ..Record::decision(
                id,
                "k8s:a=b;",
                Kind::Remap,
                (action, "operator"),
                Some(4000),
            )
        };
        // Times out of order, one that does not read, lines with no decision.
        let log = LogContents {
            records: vec![
                at("garbled", "300", "create"),
                at("2026-12-01T00:00:05Z", "301", "skip"),
                at("2026-12-01T00:00:01Z", "300", "undecided"),
                at("2026-12-01T00:00:03Z", "302", "moot"),
                at("2026-12-01T00:00:09Z", "302", "create"),
            ],
            ..LogContents::default()
        };
        let empty = LogContents::default();
        let alone: Vec<_> = steps_in_time(&[&log]).into_iter().map(|(s, _)| s).collect();
        let merged: Vec<_> = steps_in_time(&[&log, &empty])
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(alone, merged);
        assert_eq!(alone.len(), 4);
    }
}
