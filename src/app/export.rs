//! Export: a copy of the decision log and a Markdown summary of the session's decisions,
//! written as new private files next to a path the operator chose; and the decisions alone,
//! as a compact log for `sync --decisions` (`cilium-idmig log --decisions-only`).

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::core::planner::{Kind, PlanItem, WriteSummary};
use crate::core::range::IdRange;
use crate::error::{Error, Result};
use crate::io::decision_log::DecisionLog;
use crate::io::private_file::write_new;

/// Writes `<path>.jsonl` (the decision log so far) and `<path>.md` (the summary).
pub fn export(
    log: &DecisionLog,
    server: &str,
    range: IdRange,
    path: &Path,
    items: &[PlanItem],
) -> Result<Vec<PathBuf>> {
    let log_out = path.with_extension("jsonl");
    let md_out = path.with_extension("md");
    let log_text =
        std::fs::read(log.path()).map_err(|e| Error::file_io(log.path(), "cannot read", e))?;
    write_new(&log_out, &log_text)?;
    let done = crate::io::decision_log::read_from(log_text.as_slice())
        .map(|c| Done::of(&c.records))
        .unwrap_or_default();
    let md = summary_markdown(log.operator(), server, range, log.path(), items, &done);
    write_new(&md_out, md.as_bytes())?;
    Ok(vec![log_out, md_out])
}

/// The decisions in force at the end of `logs` (in the order they were made, undos applied), as a compact
/// decision log: the last session line, then one decision line per identity in id order,
/// stripped of outcomes. `--resume` and `sync --decisions` read it to the same decisions;
/// at a few hundred bytes a decision it fits a ConfigMap (1 MiB) up to thousands.
pub fn decisions_only(logs: &[crate::io::decision_log::LogContents]) -> Result<Vec<u8>> {
    let steps = crate::io::decision_log::steps_in_time(&logs.iter().collect::<Vec<_>>());
    let in_force = crate::core::planner::resume::replay_with(steps);
    let mut lasts: Vec<_> = in_force.into_values().map(|(_, r)| r).collect();
    lasts.sort_by_key(|r| (r.id.parse::<u64>().unwrap_or(u64::MAX), r.id.clone()));
    let json = |e: serde_json::Error| Error::Config(format!("decisions: {e}"));
    let mut out = Vec::new();
    if let Some(session) = logs.iter().flat_map(|l| &l.sessions).next_back() {
        out.extend(serde_json::to_vec(session).map_err(json)?);
        out.push(b'\n');
    }
    for r in lasts {
        out.extend(serde_json::to_vec(&r.decision_only()).map_err(json)?);
        out.push(b'\n');
    }
    Ok(out)
}

/// What the decision log records as done: each identity's last outcome, and the conflicts
/// sync closed as moot. The plan shows what is still to do; this, what was done.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Done {
    pub created: usize,
    pub already_there: usize,
    pub mapped: usize,
    /// Skipped by a person's decision (or `--accept-proposals`).
    pub skipped: usize,
    /// Skipped by the rules: invalid kvstore entries, never written.
    pub invalid: usize,
    pub moot: usize,
    pub failed: usize,
    /// The decisions in force at the end of the log, by kvstore id: what the conflicts
    /// table says was decided, whatever a rescan after the commit shows.
    pub decisions: std::collections::BTreeMap<String, crate::core::planner::resume::LoggedDecision>,
}

impl Done {
    pub fn of(records: &[crate::io::decision_log::Record]) -> Self {
        use crate::core::outcome::Outcome;
        use std::collections::BTreeMap;
        // The last word on each identity: a rerun's `already-existed` does not undo a create.
        let mut last: BTreeMap<&str, Outcome> = BTreeMap::new();
        let mut moot = std::collections::BTreeSet::new();
        let mut by_rule = std::collections::BTreeSet::new();
        for r in records.iter().filter(|r| r.kvstore.is_none()) {
            if r.action.as_deref() == Some("moot") {
                moot.insert(r.id.as_str());
            }
            if r.kind == Kind::Invalid {
                by_rule.insert(r.id.as_str());
            }
            match (r.outcome, last.get(r.id.as_str())) {
                (Some(Outcome::AlreadyExisted), Some(Outcome::Created)) => {}
                (Some(o), _) => {
                    last.insert(&r.id, o);
                }
                (None, _) => {}
            }
        }
        let mut d = Done {
            moot: moot.len(),
            decisions: crate::core::planner::resume::replay(
                records.iter().filter_map(|r| r.step()),
            ),
            ..Done::default()
        };
        for (id, o) in last {
            match o {
                Outcome::Created => d.created += 1,
                Outcome::AlreadyExisted | Outcome::AlreadyMigrated => d.already_there += 1,
                Outcome::Mapped => d.mapped += 1,
                Outcome::Skipped if by_rule.contains(id) => d.invalid += 1,
                Outcome::Skipped if !moot.contains(id) => d.skipped += 1,
                Outcome::Failed | Outcome::Conflict | Outcome::NotAttempted => d.failed += 1,
                _ => {}
            }
        }
        d
    }
}

/// A human-readable summary of the session's decisions: what the decision log records as
/// done, then the plan as it stands now (after a commit, mostly already migrated).
pub fn summary_markdown(
    operator: &str,
    server: &str,
    range: IdRange,
    log_path: &Path,
    items: &[PlanItem],
    done: &Done,
) -> String {
    let mut out = String::new();
    out.push_str("# cilium-idmig migration summary\n\n");
    let _ = write!(
        out,
        "- operator: {operator}\n- API server: {server}\n- range: {range}\n- decision log: {}\n\n",
        log_path.display()
    );
    out.push_str("## Done (from the decision log)\n\n| | count |\n|---|---|\n");
    for (what, n) in [
        ("CiliumIdentity objects created", done.created),
        ("already there with the same labels", done.already_there),
        ("mapped to an id that holds the labels", done.mapped),
        ("skipped by decision", done.skipped),
        (
            "invalid kvstore entries skipped by rule (never written)",
            done.invalid,
        ),
        ("closed as moot by sync (no node used them)", done.moot),
        ("failed or not attempted (last outcome)", done.failed),
    ] {
        let _ = writeln!(out, "| {what} | {n} |");
    }
    out.push_str("\n## The plan as it stands\n\n| kind | count |\n|---|---|\n");
    for kind in Kind::ALL {
        let _ = writeln!(
            out,
            "| {kind} | {} |",
            items.iter().filter(|i| i.kind == kind).count()
        );
    }
    let w = WriteSummary::of(items);
    out.push_str("\n## Still to write\n\n| | count |\n|---|---|\n");
    for (what, n) in [
        ("create at the same id", w.same_id),
        ("create at a new id (remap)", w.remaps),
        ("create a duplicate at its own id", w.duplicates),
        ("CiliumIdentity objects still to create", w.creates()),
        ("already migrated", w.already_migrated),
        ("mapped to an id that holds the labels", w.mapped),
        ("skipped (by decision, or closed as moot)", w.skipped),
        ("invalid kvstore entries", w.invalid),
    ] {
        let _ = writeln!(out, "| {what} | {n} |");
    }
    out.push_str("\n## Conflicts and their decisions\n\n| id | kind | action | target | decided | labels |\n|---|---|---|---|---|---|\n");
    for i in items.iter().filter(|i| i.kind.is_conflict()) {
        let t = i.target_id.map_or("-".to_string(), |t| t.to_string());
        // What the log records decided counts, though a rescan after the commit shows the
        // item as it is now (a remap created at 5000 is a reuse of 5000 then).
        let decided = match done.decisions.get(&i.id) {
            Some(d) if !i.decided || d.action != i.action || d.target_id != i.target_id => {
                let at = d.target_id.map_or(String::new(), |t| format!(" {t}"));
                format!("yes ({}{at}, in the log)", d.action.as_str())
            }
            _ if i.decided => "yes".to_string(),
            _ => "no".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {t} | {decided} | `{}` |",
            i.id,
            i.kind,
            i.action.as_str(),
            i.labels
        );
    }
    let invalid: Vec<&PlanItem> = items.iter().filter(|i| i.kind == Kind::Invalid).collect();
    if !invalid.is_empty() {
        out.push_str("\n## Invalid kvstore entries (never written)\n\n");
        for i in invalid {
            let _ = writeln!(out, "- `{}`: {}", i.id, i.reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::outcome::Outcome;
    use crate::io::decision_log::Record;

    fn line(id: &str, action: (&str, &str), outcome: Option<Outcome>) -> Record {
        let mut r = Record::decision(id, "k8s:app=a;", Kind::Create, action, None);
        r.outcome = outcome;
        r
    }

    #[test]
    fn the_decisions_alone_resume_to_the_decisions_of_the_whole_logs() {
        use crate::core::planner::resume::replay;
        use crate::io::decision_log::{LogContents, read_from};
        let mut undo = Record::new("302", "k8s:app=a;", Kind::Create, "undo".into(), None);
        undo = undo.with_fields("operator", "undo");
        let review = LogContents {
            records: vec![
                line("1000", ("skip", "operator"), None),
                line("302", ("map", "operator"), None),
                undo,
                line("303", ("create", "proposal"), Some(Outcome::Created)),
            ],
            ..Default::default()
        };
        let later = LogContents {
            records: vec![
                line("1000", ("create", "operator"), Some(Outcome::Created)),
                line("301", ("skip", "operator"), Some(Outcome::Skipped)),
            ],
            ..Default::default()
        };
        let logs = [review, later];
        let whole = replay(logs.iter().flat_map(|l| l.steps()));
        let compact = decisions_only(&logs).unwrap();
        let read = read_from(compact.as_slice()).unwrap();
        assert!(read.bad_lines.is_empty() && !read.torn_tail);
        assert_eq!(replay(read.steps()), whole);
        // One line per identity with a decision in force, in id order, no outcome on any.
        let ids: Vec<&str> = read.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["301", "1000"]);
        assert!(read.records.iter().all(|r| r.outcome.is_none()));
        assert!(whole.contains_key("1000") && !whole.contains_key("302"));
    }

    #[test]
    fn the_summary_counts_what_the_log_records_as_done_not_what_is_left_to_write() {
        let records = vec![
            line("300", ("create", "proposal"), None),
            line("300", ("create", "proposal"), Some(Outcome::Created)),
            // A rerun meets its own object: still created by this migration.
            line("300", ("create", "proposal"), Some(Outcome::AlreadyExisted)),
            line("301", ("skip", "operator"), Some(Outcome::Skipped)),
            line("302", ("moot", "rule"), Some(Outcome::Skipped)),
            line("303", ("create", "proposal"), Some(Outcome::Failed)),
            line("303", ("create", "proposal"), Some(Outcome::Created)),
            line("304", ("map", "operator"), Some(Outcome::Mapped)),
            {
                // An invalid entry, skipped by the rules: not the operator's skip.
                let mut r = line("0305", ("skip", "rule"), Some(Outcome::Skipped));
                r.kind = Kind::Invalid;
                r
            },
        ];
        let done = Done::of(&records);
        let decisions =
            crate::core::planner::resume::replay(records.iter().filter_map(|r| r.step()));
        assert_eq!(decisions.keys().collect::<Vec<_>>(), ["301", "304"]);
        assert_eq!(
            done,
            Done {
                created: 2,
                already_there: 0,
                mapped: 1,
                skipped: 1,
                invalid: 1,
                moot: 1,
                failed: 0,
                decisions,
            }
        );
        // After the commit, a rescan finds them all migrated: nothing still to create, and
        // the summary still says what was created.
        let md = summary_markdown(
            "alice@bastion",
            "https://10.0.0.1:6443",
            IdRange::for_cluster(0).unwrap(),
            Path::new("d.jsonl"),
            &[],
            &done,
        );
        assert!(
            md.contains("| CiliumIdentity objects created | 2 |"),
            "{md}"
        );
        assert!(
            md.contains("| closed as moot by sync (no node used them) | 1 |"),
            "{md}"
        );
        assert!(md.contains("| skipped by decision | 1 |"), "{md}");
        assert!(
            md.contains("| invalid kvstore entries skipped by rule (never written) | 1 |"),
            "{md}"
        );
        // A remap decided to 5000 and created: after the rescan it is a reuse of 5000, not
        // decided on screen; the log says it was.
        // Its decision line, written before the create, then the create's outcome.
        let mut decided = line("271", ("create", "operator"), None);
        decided.target_id = Some(5000);
        let edited = Record {
            outcome: Some(Outcome::Created),
            ..decided.clone()
        };
        let done = Done::of(&[decided, edited]);
        let item = PlanItem {
            id: "271".into(),
            labels: "k8s:app=a;".into(),
            kind: Kind::Reuse,
            action: crate::core::planner::Action::None,
            target_id: Some(5000),
            existing_labels: None,
            labels_present_at: Some(5000),
            nodes: 0,
            reason: "".into(),
            decided: false,
        };
        let md = summary_markdown(
            "a",
            "s",
            IdRange::for_cluster(0).unwrap(),
            Path::new("d"),
            &[item],
            &done,
        );
        assert!(
            md.contains("| 271 | reuse | none | 5000 | yes (create 5000, in the log) |"),
            "{md}"
        );
        assert!(
            md.contains("| CiliumIdentity objects still to create | 0 |"),
            "{md}"
        );
    }
}
