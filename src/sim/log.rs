//! An instance's decision log as the simulation keeps it: bytes in memory behind core's
//! `LogFile`, written through core's `Writer`, the very code the binary runs on its file,
//! and read back whole through core's reader at the end of each seed. It outlives a crash
//! (a torn last line, which the next start repairs as the binary's open does), and fills up
//! with the disk (a full disk refuses each line).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::core::decision_log::{
    LogContents, LogFile, Record, Writer, in_force, read_from, torn_note, torn_tail,
};
use crate::core::planner::resume::LoggedDecision;

/// The bytes of one log, the simulated clock its lines are stamped with, and the disk.
#[derive(Default)]
pub struct MemFile {
    bytes: RefCell<Vec<u8>>,
    now: Cell<Duration>,
    full: Cell<bool>,
    /// Each whole line appended: the record the writer encoded, or a line read back by the
    /// binary's reader (a session's, the server's). What a start and the checks read,
    /// without decoding a line at every append; `SimLog::reads_back` holds it equal to the
    /// binary's reading of the bytes.
    read: RefCell<LogContents>,
    /// The clock's time as a line's `ts` spells it, for the time it was spelled at: many
    /// lines are stamped at one simulated time, and spelling it is a seed's hot path.
    spelled: RefCell<(Duration, String)>,
}

/// When the simulated rollout starts, on the log's clock.
const EPOCH_SECS: i64 = 1_796_083_200; // 2026-12-01T00:00:00Z

impl LogFile for MemFile {
    type Error = String;

    fn append_line(&self, line: &[u8]) -> Result<(), String> {
        if self.full.get() {
            return Err("No space left on device (os error 28)".into());
        }
        self.bytes.borrow_mut().extend_from_slice(line);
        let line = read_from(line).map_err(|e| e.to_string())?;
        let mut read = self.read.borrow_mut();
        read.records.extend(line.records);
        read.sessions.extend(line.sessions);
        read.server_said.extend(line.server_said);
        read.bad_lines.extend(line.bad_lines);
        Ok(())
    }

    fn append_record(&self, line: &[u8], record: Record) -> Result<(), String> {
        if self.full.get() {
            return Err("No space left on device (os error 28)".into());
        }
        self.bytes.borrow_mut().extend_from_slice(line);
        self.read.borrow_mut().records.push(record);
        Ok(())
    }

    fn unencodable(&self, e: serde_json::Error) -> String {
        e.to_string()
    }

    fn now(&self) -> String {
        let at = self.now.get();
        let mut spelled = self.spelled.borrow_mut();
        if spelled.0 != at || spelled.1.is_empty() {
            let ts =
                jiff::Timestamp::new(EPOCH_SECS + at.as_secs() as i64, at.subsec_nanos() as i32)
                    .map(|t| t.to_string())
                    .unwrap_or_default();
            *spelled = (at, ts);
        }
        spelled.1.clone()
    }
}

/// An instance's decision log, and the logs it replaced.
pub struct SimLog(Writer<MemFile>, Vec<SimLog>);

impl Default for SimLog {
    fn default() -> Self {
        SimLog(
            Writer::new(MemFile::default(), "sim-operator".into()),
            Vec::new(),
        )
    }
}

impl SimLog {
    /// The writer, its clock set to `now` and its disk full or not.
    pub fn at(&self, now: Duration, disk_full: bool) -> &Writer<MemFile> {
        let f = self.0.file();
        f.now.set(now);
        f.full.set(disk_full);
        &self.0
    }

    /// A new, empty log in place of this one, as an operator moves sync to a new log file
    /// (a new disk, a new host): the next start is given the old one as its `--resume`
    /// log, and only that start; later starts are given the new log alone.
    pub fn moved(old: SimLog) -> SimLog {
        let mut new = SimLog::default();
        let SimLog(writer, mut earlier) = old;
        earlier.push(SimLog(writer, Vec::new()));
        new.1 = earlier;
        new
    }

    /// The log this one replaced, if it did.
    pub fn replaced(&self) -> Option<&SimLog> {
        self.1.last()
    }

    /// Whether a start now is given the log this one replaced as `--resume`: a start on
    /// the new log before anything is written in it. The process keeps that answer (once
    /// it writes, the log is no longer empty) and reads the log through `resumed`.
    pub fn to_resume(&self) -> bool {
        self.replaced().is_some() && self.written() == 0
    }

    /// The `--resume` log of a process that `resumes`, as the binary's reader reads it.
    pub fn resumed(
        &self,
        resumes: bool,
    ) -> Result<Option<std::cell::Ref<'_, LogContents>>, String> {
        match self.replaced().filter(|_| resumes) {
            Some(old) => old.contents().map(Some),
            None => Ok(None),
        }
    }

    /// The logs this one replaced, oldest first, then this one: the whole record of the
    /// instance, which the simulation's checks read (the binary never reads them all).
    pub fn chain(&self) -> impl Iterator<Item = &SimLog> {
        self.1.iter().chain([self])
    }

    /// How many bytes were written (the file only grows: a new length is a new version).
    pub fn written(&self) -> usize {
        self.0.file().bytes.borrow().len()
    }

    /// The bytes written, as a reader of the file finds them.
    pub fn bytes(&self) -> Vec<u8> {
        self.0.file().bytes.borrow().clone()
    }

    /// The records appended so far, as the binary's reader read each.
    pub fn records(&self) -> std::cell::Ref<'_, Vec<Record>> {
        std::cell::Ref::map(self.0.file().read.borrow(), |c| &c.records)
    }

    /// The log as the binary's reader reads it, line by line as it was written; a damaged
    /// line (never written by the writer) is the simulation's failure.
    pub fn contents(&self) -> Result<std::cell::Ref<'_, LogContents>, String> {
        let read = self.0.file().read.borrow();
        match read.bad_lines.first() {
            Some((n, why)) => Err(format!("line {n} of the log is damaged: {why}")),
            None => Ok(read),
        }
    }

    /// The whole log read again from its bytes, as the binary reads a file, is what was kept
    /// line by line: the same records, no damaged line, and no torn one unless `torn_ok`
    /// (a log moved away from keeps a line torn when its writer was killed; a reader of a
    /// `--resume` log ignores it).
    pub fn reads_back(&self, torn_ok: bool) -> Result<(), String> {
        let f = self.0.file();
        let bytes = f.bytes.borrow();
        let whole = read_from(&bytes[..]).map_err(|e| e.to_string())?;
        let lines = f.read.borrow();
        let torn = whole.torn_tail && !torn_ok;
        if whole.records != lines.records || torn || !whole.bad_lines.is_empty() {
            return Err(format!(
                "{} records read whole, {} kept line by line (torn {}, damaged {})",
                whole.records.len(),
                lines.records.len(),
                whole.torn_tail,
                whole.bad_lines.len()
            ));
        }
        Ok(())
    }

    /// Killed while a line was being written: the last line cut short, `cut` bytes of it
    /// lost (its newline at least).
    pub fn tear(&self, cut: usize) {
        let f = self.0.file();
        let mut bytes = f.bytes.borrow_mut();
        let Some(last_start) = bytes[..bytes.len().saturating_sub(1)]
            .iter()
            .rposition(|b| *b == b'\n')
            .map(|p| p + 1)
            .or((!bytes.is_empty()).then_some(0))
        else {
            return;
        };
        let keep = bytes.len().saturating_sub(cut.max(1)).max(last_start + 1);
        bytes.truncate(keep);
        f.read.borrow_mut().records.pop();
    }

    /// Opened again at a start, as the binary opens its file: a torn last line removed
    /// first; what the repair says.
    pub fn repair(&self) -> Option<String> {
        let mut bytes = self.0.file().bytes.borrow_mut();
        let cut = torn_tail(&bytes, true)?;
        let at = bytes.len() - cut;
        let note = torn_note("of the instance", &bytes[at..]);
        bytes.truncate(at);
        Some(note)
    }
}

/// Whether `r` is a person's decision made on a screen (`decision_record`'s line), not the
/// line sync writes before a write it carries out for a decision (`executor::record`'s,
/// whose text is its action and who decided).
pub fn from_a_screen(r: &Record) -> bool {
    match (r.decided_by.as_deref(), r.action.as_deref()) {
        (Some(by @ "operator"), Some(action)) => r.decision != format!("{action} ({by})"),
        _ => false,
    }
}

/// The decisions in force at the end of `logs`, replayed in the order they were made, as a
/// restart of the binary's reads them (its `--resume` logs and its own).
pub fn decisions_in_force(logs: &[&LogContents]) -> BTreeMap<String, LoggedDecision> {
    in_force(logs)
        .into_iter()
        .map(|(id, (d, _))| (id, d))
        .collect()
}
