//! Tests of the decision log: appends and reads, torn and damaged lines, the one-writer
//! lock, expectations, and the merge of several logs in time.

use super::*;
use crate::core::outcome::Outcome;
use crate::core::planner::resume::LogStep;
use crate::core::planner::{Action, Kind};
use crate::core::range::MaxConnectedClusters;
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
    let old = include_str!("../../../tests/data/decision-log-before-fields.jsonl");
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
