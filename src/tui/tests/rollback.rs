//! The TUI's rollback: reviewed, then confirmed by typing yes; identities in use only after typing in use.

use super::*;

#[test]
fn identities_in_use_are_deleted_only_after_typing_in_use() {
    let logs = vec![std::path::PathBuf::from("run.jsonl")];
    let mut m = Model::for_rollback(IdRange::for_cluster(0).unwrap(), true, logs);
    update(&mut m, Msg::Resize { rows: 30 });
    init(&mut m);
    update(&mut m, key('I'));
    assert!(matches!(m.modal, Some(Modal::ConfirmIncludeInUse { .. })));
    check_screen("rollback-in-use", &mut m);
    // `yes` is not the word here: the field clears and nothing is asked for.
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    assert!(update(&mut m, code(KeyCode::Enter)).is_empty());
    assert!(!m.rollback.as_ref().unwrap().include_in_use);
    for c in "in use".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::PlanRollback { generation: 2, spec })] if spec.include_in_use
        ),
        "{cmds:?}"
    );
    // Asked once: the key does nothing more.
    update(&mut m, key('I'));
    assert!(m.modal.is_none());
}

#[test]
fn a_rollback_is_reviewed_then_confirmed_by_typing_yes() {
    use crate::core::planner::{DecidedBy, Op, OpKind};
    let logs = vec![std::path::PathBuf::from("run.jsonl")];
    let mut m = Model::for_rollback(IdRange::for_cluster(0).unwrap(), true, logs.clone());
    update(&mut m, Msg::Resize { rows: 30 });
    let cmds = init(&mut m);
    assert!(
        matches!(&cmds[..], [Command::Send(Request::PlanRollback { generation: 1, spec })] if spec.logs == logs && !spec.include_in_use),
        "{cmds:?}"
    );
    let op = |id: &str, op: OpKind, expect: Option<(&str, &str)>, reason: Option<&str>| Op {
        id: id.into(),
        label_key: format!("k8s:app=a{id};"),
        kind: Kind::Create,
        op,
        target_id: Some(id.parse().unwrap()),
        decided_by: DecidedBy::Operator,
        expect: expect.map(|(u, r)| (u.to_string(), r.to_string())),
        reason: reason.map(str::to_string),
    };
    let ops = vec![
        op("300", OpKind::Delete, Some(("u1", "7")), None),
        op(
            "301",
            OpKind::Keep,
            None,
            Some("deleted and created again since"),
        ),
        op("302", OpKind::Delete, Some(("u3", "")), None),
    ];
    // A plan for an older request is dropped.
    update(
        &mut m,
        Msg::Engine(Event::RollbackPlanned {
            generation: 0,
            ops: ops.clone(),
        }),
    );
    assert!(m.rollback.as_ref().unwrap().ops.is_none());
    update(
        &mut m,
        Msg::Engine(Event::RollbackPlanned { generation: 1, ops }),
    );
    check_screen("rollback", &mut m);
    let screen = render(&m);
    for expected in [
        "1 to delete",
        "1 already gone",
        "1 kept",
        "keep    301",
        "deleted and created again",
        "delete  300",
    ] {
        assert!(screen.contains(expected), "{expected:?} not on\n{screen}");
    }
    // Only the rollback's screen exists in this session.
    update(&mut m, key('2'));
    assert_eq!(m.screen, Screen::Rollback);
    update(&mut m, code(KeyCode::Enter));
    assert!(matches!(m.modal, Some(Modal::ConfirmRollback { .. })));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::Rollback { generation: 1, .. })]
        ),
        "{cmds:?}"
    );
    assert_eq!(m.commit.phase, CommitPhase::Running);
    let mut report = ApplyReport::default();
    report
        .results
        .push(OpResult::new("300", Some(300), Outcome::Deleted));
    report
        .results
        .push(OpResult::new("302", Some(302), Outcome::AlreadyGone));
    let mut kept = OpResult::new("301", Some(301), Outcome::Kept);
    kept.error = Some("deleted and created again since".into());
    report.results.push(kept);
    let cmds = update(&mut m, committed(1, report));
    assert_eq!(m.commit.phase, CommitPhase::Done);
    // What is left is read again.
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::PlanRollback { generation: 2, .. })]
        ),
        "{cmds:?}"
    );
    assert!(render(&m).contains("deleted 1 · already gone 1 · kept 1"));
    assert_eq!(
        crate::tui::CommitSummary::of(&m).unwrap().to_string(),
        "rollback: 1 deleted, 1 already gone, 1 kept, 0 not attempted, 0 failed"
    );
}
