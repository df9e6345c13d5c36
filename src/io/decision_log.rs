//! The decision log: JSON Lines, append-only, one flushed line per decision and per outcome,
//! mode 0600. An auditor replays it; `verify` reads the id mappings back from it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::core::outcome::Outcome;
use crate::core::planner::Kind;
use crate::error::{Error, Result};

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub ts: String,
    pub operator: String,
    pub id: String,
    pub labels: String,
    pub kind: Kind,
    /// `create`, `map`, `none`, `skip`, or an operator's action in the TUI.
    pub decision: String,
    pub target_id: Option<u32>,
    /// Absent on a pure decision record.
    pub outcome: Option<Outcome>,
    pub error: Option<String>,
}

/// An open, append-only decision log. Appends are whole lines written with one `write` on
/// an `O_APPEND` file, so concurrent writers never interleave inside a line.
pub struct DecisionLog {
    path: PathBuf,
    file: Mutex<File>,
    operator: String,
}

impl DecisionLog {
    /// Opens (creating with mode 0600, or appending to) the log at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = super::private_file::open_append(path)
            .map_err(|e| Error::file_io(path, "cannot open decision log", e))?;
        Ok(DecisionLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            operator: super::operator::current(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// Fills in `ts` and `operator` and appends the record as one flushed line.
    pub fn append(&self, mut record: Record) -> Result<()> {
        record.ts = now();
        record.operator = self.operator.clone();
        let mut line = serde_json::to_vec(&record).map_err(|e| Error::file_cause(&self.path, e))?;
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

/// What a read of a log found.
#[derive(Debug, Default)]
pub struct LogContents {
    pub records: Vec<Record>,
    /// A last line without its newline that does not parse: a write cut short by a crash.
    pub torn_tail: bool,
    /// Complete lines that do not parse, with their line numbers.
    pub bad_lines: Vec<(usize, String)>,
}

impl LogContents {
    /// The id each identity is served at, from the latest serving or skip record per id.
    pub fn mappings(&self) -> BTreeMap<String, Option<u32>> {
        let mut m = BTreeMap::new();
        for r in &self.records {
            match r.outcome {
                Some(o) if o.is_serving() => {
                    m.insert(r.id.clone(), r.target_id);
                }
                Some(Outcome::Skipped) => {
                    m.insert(r.id.clone(), None);
                }
                _ => {}
            }
        }
        m
    }
}

/// Reads a log, tolerating (and reporting) a torn last line.
pub fn read(path: &Path) -> Result<LogContents> {
    let f = File::open(path).map_err(|e| Error::file_io(path, "cannot read decision log", e))?;
    read_from(BufReader::new(f)).map_err(|e| Error::file_cause(path, e))
}

pub fn read_from(mut r: impl BufRead) -> std::io::Result<LogContents> {
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
            Ok(rec) => out.records.push(rec),
            Err(_) if !complete => out.torn_tail = true,
            Err(e) => out.bad_lines.push((n, e.to_string())),
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

/// `cilium-idmig-decisions-<timestamp>.jsonl` in the working directory.
pub fn default_path() -> PathBuf {
    let ts = jiff::Timestamp::now()
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string();
    PathBuf::from(format!("cilium-idmig-decisions-{ts}.jsonl"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn rec(id: &str, outcome: Option<Outcome>, target: Option<u32>) -> Record {
        Record {
            ts: String::new(),
            operator: String::new(),
            id: id.into(),
            labels: "k8s:a=b;".into(),
            kind: Kind::Create,
            decision: "create".into(),
            target_id: target,
            outcome,
            error: None,
        }
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
        let m = c.mappings();
        assert_eq!(m["300"], Some(300));
        assert_eq!(m["301"], Some(500));
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
}
