//! The machine's decisions, one at a time: writes only under a valid Lease, cutover only
//! after the grace and a passing check (never twice), a stop that waits for the batch in
//! flight, a compaction that asks for a fresh snapshot, moot closures only once logged.
//! Whole rollouts are `crate::sim`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::*;
use crate::core::outcome::Outcome;

const A: &str = "k8s:app=a;";

fn settings(until_cutover: bool) -> Settings {
    Settings {
        range: IdRange::for_cluster(0).unwrap(),
        accept_proposals: false,
        until_cutover,
        reserve_in_kvstore: false,
        cutover_grace: Duration::from_secs(10),
        lease: "kube-system/sync".into(),
    }
}

/// A machine following both sides, holding the Lease, with `300 = A` in the kvstore used by
/// one node (`nodes`: whether the node's `value/` key is there).
fn following(until_cutover: bool, nodes: bool, t0: Instant) -> Machine {
    let mut m = Machine::new(settings(until_cutover), BTreeMap::new());
    let mut state = with_300(t0);
    if nodes {
        state.apply_kv_change(slave(true), t0);
    }
    m.start_round(state, true);
    m.step(Input::Lease(LeaseHolder::Us), t0, true);
    m.step(Input::Kv(KvWatchEvent::Connected), t0, true);
    let out = m.step(Input::K8s(K8sChange::Connected), t0, true);
    assert!(out.contains(&Output::Following), "{out:?}");
    m
}

/// `id/<id>` written with `labels`.
fn master(id: &str, labels: &str) -> KvChange {
    KvChange::Master {
        id: id.as_bytes().to_vec(),
        value: Some(labels.as_bytes().to_vec()),
        created: true,
    }
}

/// A new kvstore identity, as the watch tells it.
fn arrives(id: &str, labels: &str) -> Input {
    Input::Kv(KvWatchEvent::Changes {
        changes: vec![master(id, labels)],
        revision: 8,
    })
}

/// A batch the API server failed whole.
fn failed(ops: Vec<Op>) -> Input {
    Input::BatchDone {
        ops,
        outcome: BatchOutcome::Failed("500".into()),
    }
}

/// What sync knows with `300 = A` in the kvstore.
fn with_300(t0: Instant) -> SyncState {
    let mut state = SyncState::default();
    state.apply_kv_change(master("300", A), t0);
    state
}

/// Kubernetes holds 300 for other labels: 300 becomes a conflict.
fn taken_by_b() -> Input {
    Input::K8s(K8sChange::Upsert {
        id: 300,
        labels: "k8s:app=b;".into(),
        resource_version: "2".into(),
    })
}

/// The node's `value/` key comes (or goes), as the kvstore's watch tells it.
fn node(present: bool) -> Input {
    Input::Kv(KvWatchEvent::Changes {
        changes: vec![slave(present)],
        revision: 6,
    })
}

fn slave(present: bool) -> KvChange {
    KvChange::Slave {
        label_key: A.as_bytes().to_vec(),
        node: b"10.0.0.1".to_vec(),
        present,
        id: None,
    }
}

fn writes(out: &[Output]) -> Vec<Op> {
    out.iter()
        .filter_map(|o| match o {
            Output::Write(ops) => Some(ops.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn done(ops: Vec<Op>) -> Input {
    let results = ops
        .iter()
        .filter_map(|o| o.target_id.map(|t| (t, Outcome::Created)))
        .collect();
    Input::BatchDone {
        ops,
        outcome: BatchOutcome::Done {
            results,
            halted: None,
            denied: Vec::new(),
        },
    }
}

#[test]
fn writes_only_while_it_holds_a_valid_lease() {
    let t0 = Instant::now();
    let mut m = Machine::new(settings(false), BTreeMap::new());
    m.start_round(with_300(t0), true);
    assert!(
        writes(&m.step(Input::Settle, t0, true)).is_empty(),
        "no holder known"
    );
    m.step(Input::Lease(LeaseHolder::Other("b".into())), t0, true);
    assert!(
        writes(&m.step(Input::Settle, t0, true)).is_empty(),
        "another holds it"
    );
    m.step(Input::Lease(LeaseHolder::Us), t0, true);
    assert!(
        writes(&m.step(Input::Settle, t0, false)).is_empty(),
        "held, but the gate is shut (renewal overdue)"
    );
    let ops = writes(&m.step(Input::Settle, t0, true));
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].target_id, Some(300));
    // One batch at a time: nothing more until it is in.
    m.step(Input::Kv(KvWatchEvent::Progress { revision: 9 }), t0, true);
    assert!(writes(&m.step(Input::Settle, t0, true)).is_empty());
}

#[test]
fn cutover_comes_after_the_grace_and_a_passing_check_and_only_once() {
    let t0 = Instant::now();
    let mut m = following(true, true, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    let verify = |out: &[Output]| out.iter().any(|o| matches!(o, Output::Verify { .. }));
    // The node is still there: no check however long.
    let out = m.step(
        Input::Status { watching: true },
        t0 + Duration::from_secs(60),
        true,
    );
    assert!(!verify(&out));
    // It goes; the grace counts from the next status.
    let t1 = t0 + Duration::from_secs(61);
    m.step(node(false), t1, true);
    m.step(Input::Settle, t1, true);
    for s in [0, 5, 9] {
        let out = m.step(
            Input::Status { watching: true },
            t1 + Duration::from_secs(s),
            true,
        );
        assert!(!verify(&out), "a check {s} s into a 10 s grace");
    }
    let out = m.step(
        Input::Status { watching: true },
        t1 + Duration::from_secs(10),
        true,
    );
    assert!(verify(&out), "{out:?}");
    // One check at a time, and none again before VERIFY_EVERY.
    let out = m.step(
        Input::Status { watching: true },
        t1 + Duration::from_secs(11),
        true,
    );
    assert!(!verify(&out));
    let out = m.step(
        Input::Verdict(Err(CutoverWait::Verify {
            problems: 1,
            first: "300 missing".into(),
        })),
        t1 + Duration::from_secs(12),
        true,
    );
    assert!(!out.iter().any(|o| matches!(o, Output::Cutover(_))));
    assert!(!m.cutover_announced());
    let out = m.step(
        Input::Status { watching: true },
        t1 + Duration::from_secs(20),
        true,
    );
    assert!(!verify(&out), "again before 30 s");
    let t2 = t1 + Duration::from_secs(41);
    let out = m.step(Input::Status { watching: true }, t2, true);
    assert!(verify(&out));
    let out = m.step(Input::Verdict(Ok(())), t2, true);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Cutover(r) if r.mirrored == 1)),
        "{out:?}"
    );
    assert!(out.iter().any(|o| matches!(o, Output::End(e) if e.cutover)));
    assert!(m.ended() && m.cutover_announced());
    assert!(
        m.step(Input::Status { watching: true }, t2, true)
            .is_empty()
    );
}

/// 300 written and the rollout over: a settle, the first status, and 10 s later the
/// status that starts a cutover check; its time.
fn check_running(m: &mut Machine, t0: Instant) -> Instant {
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    let t1 = t0 + Duration::from_secs(10);
    let out = m.step(Input::Status { watching: true }, t1, true);
    assert!(
        out.iter().any(|o| matches!(o, Output::Verify { .. })),
        "{out:?}"
    );
    t1
}

#[test]
fn a_verdict_after_a_node_came_back_is_not_cutover() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let t1 = check_running(&mut m, t0);
    // While the check runs a node comes back.
    m.step(node(true), t1, true);
    m.step(Input::Settle, t1, true);
    m.step(Input::Status { watching: true }, t1, true);
    let out = m.step(Input::Verdict(Ok(())), t1, true);
    assert!(
        !out.iter().any(|o| matches!(o, Output::Cutover(_))),
        "{out:?}"
    );
}

#[test]
fn a_verdict_right_after_a_node_came_back_is_not_cutover_before_any_status_tick() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let t1 = check_running(&mut m, t0);
    // While the check runs a node comes back; a settle, then the verdict, and no tick.
    m.step(node(true), t1, true);
    m.step(Input::Settle, t1, true);
    let out = m.step(Input::Verdict(Ok(())), t1, true);
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::Cutover(_) | Output::End(_))),
        "{out:?}"
    );
}

#[test]
fn a_stop_ends_once_the_batch_in_flight_is_in() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    assert_eq!(ops.len(), 1);
    m.step(Input::Stop, t0, true);
    let out = m.step(Input::Settle, t0, true);
    assert!(
        !out.iter().any(|o| matches!(o, Output::End(_))),
        "the batch is out"
    );
    m.step(done(ops), t0, true);
    let out = m.step(Input::Settle, t0, true);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::End(e) if !e.cutover && e.status.mirrored == 1)),
        "{out:?}"
    );
}

#[test]
fn a_compaction_asks_for_a_fresh_snapshot() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let out = m.step(
        Input::Kv(KvWatchEvent::Compacted {
            compact_revision: 7,
        }),
        t0,
        true,
    );
    assert_eq!(out.last(), Some(&Output::Resnapshot));
}

#[test]
fn moot_conflicts_close_only_once_logged() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    // Kubernetes holds 300 for other labels: 300 is a conflict that waits for a decision.
    m.step(taken_by_b(), t0, true);
    let out = m.step(Input::Settle, t0, true);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Report(SyncReport::Conflict { .. })))
    );
    m.step(Input::Status { watching: true }, t0, true);
    let out = m.step(
        Input::Status { watching: true },
        t0 + Duration::from_secs(10),
        true,
    );
    let asked: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            Output::CloseMoot(m) => Some(m.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(asked.len(), 1, "{out:?}");
    assert!(
        !out.iter().any(|o| matches!(o, Output::Verify { .. })),
        "not quiet yet"
    );
    assert!(
        m.state.moot.is_empty(),
        "not closed before its line is written"
    );
    let out = m.step(Input::MootLogged(vec![("300".into(), A.into())]), t0, true);
    assert!(
        out.iter()
            .any(|o| matches!(o, Output::Moot { id, .. } if id == "300"))
    );
    assert!(m.state.moot.contains("300"));
}

#[test]
fn reservations_are_asked_for_only_with_reserve_in_kvstore() {
    let t0 = Instant::now();
    for reserve in [false, true] {
        let mut s = settings(false);
        s.reserve_in_kvstore = reserve;
        let mut m = Machine::new(s, BTreeMap::new());
        m.know_holder(LeaseHolder::Us);
        let mut out = m.start_round(SyncState::default(), true);
        out.extend(m.step(
            Input::K8s(K8sChange::Upsert {
                id: 400,
                labels: A.into(),
                resource_version: "3".into(),
            }),
            t0,
            true,
        ));
        out.extend(m.step(Input::Settle, t0, true));
        let asked = out
            .iter()
            .filter(|o| matches!(o, Output::Reserve(_)))
            .count();
        assert_eq!(asked > 0, reserve, "{out:?}");
        if reserve {
            assert!(out.contains(&Output::Reserve(Reserve::Want {
                id: 400,
                labels: A.into()
            })));
        }
    }
}

/// 300 taken in Kubernetes by other labels, and the operator's skip of it settled.
fn skipped_300(t0: Instant) -> Machine {
    let mut m = following(false, false, t0);
    m.step(taken_by_b(), t0, true);
    m.step(
        Input::Decided(LoggedDecision {
            id: "300".into(),
            labels: A.into(),
            action: crate::core::planner::Action::Skip,
            target_id: None,
        }),
        t0,
        true,
    );
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    m
}

#[test]
fn a_conflict_skipped_by_a_decision_is_expected_nowhere_at_cutover() {
    let t0 = Instant::now();
    let mut m = skipped_300(t0);
    let out = m.step(
        Input::Status { watching: true },
        t0 + Duration::from_secs(10),
        true,
    );
    let nowhere = out.iter().find_map(|o| match o {
        Output::Verify { nowhere, .. } => Some(nowhere.clone()),
        _ => None,
    });
    assert_eq!(nowhere, Some(["300".to_string()].into()), "{out:?}");
    // A decision to create is no reason to expect nothing.
    assert!(
        m.decisions()
            .in_force()
            .values()
            .filter(|d| d.id != "300")
            .count()
            == 0
    );
}

#[test]
fn a_skip_the_operator_undoes_waits_for_a_decision_again() {
    let t0 = Instant::now();
    let mut m = skipped_300(t0);
    assert_eq!(m.state.status.pending, 0, "skipped");
    let skip = m.decisions().get("300").map(|d| d.action);
    assert_eq!(skip, Some(crate::core::planner::Action::Skip));
    // Undone on screen 3: pending again, reported again, and no longer expected nowhere.
    m.step(Input::Undone("300".into()), t0, true);
    assert!(m.decisions().get("300").is_none());
    let out = m.step(Input::Settle, t0, true);
    assert!(
        out.iter().any(|o| matches!(
            o,
            Output::Report(crate::core::sync::SyncReport::Conflict { id, .. }) if id == "300"
        )),
        "{out:?}"
    );
    m.step(Input::Status { watching: true }, t0, true);
    assert_eq!(m.state.status.pending, 1);
    assert!(m.decisions().get("300").is_none());
}

#[test]
fn the_plan_s_reuses_win_over_what_the_log_recorded_and_nowhere_over_both() {
    let mut logged = Expectations::default();
    // Recorded for 300 when it held other labels (the kvstore's GC freed it since).
    logged.mappings.insert("300".into(), Some(300));
    logged
        .mapped_labels
        .insert("300".into(), "k8s:app=old;".into());
    logged.mappings.insert("301".into(), Some(900));
    let reused = [("300".to_string(), 400)].into();
    let nowhere = ["301".to_string()].into();
    let e = cutover_expectations(logged, &reused, &nowhere);
    assert_eq!(e.mappings["300"], Some(400));
    assert!(!e.mapped_labels.contains_key("300"));
    assert_eq!(e.mappings["301"], None);
}

#[test]
fn a_failed_write_is_tried_again_once_its_wait_is_over_or_the_server_is_back() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(failed(ops), t0, true);
    assert!(
        writes(&m.step(Input::Settle, t0, true)).is_empty(),
        "not before its wait"
    );
    // Nothing else happens; the status tick at the end of the wait makes it due.
    let due = t0 + crate::core::sync::RETRY_AFTER;
    m.step(
        Input::Status { watching: true },
        due - Duration::from_secs(1),
        true,
    );
    assert!(writes(&m.step(Input::Settle, due - Duration::from_secs(1), true)).is_empty());
    m.step(Input::Status { watching: true }, due, true);
    let again = writes(&m.step(Input::Settle, due, true));
    assert_eq!(again.len(), 1, "tried again at the end of its wait");
    // Failed again; the API server's watch connects again: tried at once.
    m.step(failed(again), due, true);
    m.step(Input::Settle, due, true);
    m.step(Input::K8s(K8sChange::Connected), due, true);
    assert_eq!(writes(&m.step(Input::Settle, due, true)).len(), 1);
}

#[test]
fn a_settle_with_no_split_reports_none_and_one_with_a_split_reports_it() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let out = m.step(Input::Settle, t0, true);
    assert!(
        !out.iter().any(|o| matches!(o, Output::ReportSplits(_))),
        "{out:?}"
    );
    m.step(taken_by_b(), t0, true);
    let out = m.step(Input::Settle, t0, true);
    let found: Vec<u32> = out
        .iter()
        .filter_map(|o| match o {
            Output::ReportSplits(f) => Some(f.iter().map(|f| f.id).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(found, [300]);
}

#[test]
fn a_check_is_due_only_strictly_after_verify_every() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    let verify = |out: &[Output]| out.iter().any(|o| matches!(o, Output::Verify { .. }));
    let t1 = t0 + GRACE_OF_TESTS;
    assert!(verify(&m.step(Input::Status { watching: true }, t1, true)));
    m.step(
        Input::Verdict(Err(CutoverWait::Verify {
            problems: 1,
            first: "x".into(),
        })),
        t1,
        true,
    );
    assert!(!verify(&m.step(
        Input::Status { watching: true },
        t1 + VERIFY_EVERY,
        true
    )));
    let just_after = t1 + VERIFY_EVERY + Duration::from_millis(1);
    assert!(verify(&m.step(
        Input::Status { watching: true },
        just_after,
        true
    )));
}

const GRACE_OF_TESTS: Duration = Duration::from_secs(10);

#[test]
fn the_status_says_what_cutover_waits_for() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let wait = |m: &mut Machine, t: Instant| {
        m.step(Input::Status { watching: true }, t, true)
            .into_iter()
            .find_map(|o| match o {
                Output::Status(s) => Some(s.cutover_wait),
                _ => None,
            })
            .flatten()
    };
    let ops = writes(&m.step(Input::Settle, t0, true));
    assert_eq!(wait(&mut m, t0), Some(CutoverWait::Nodes(1)));
    m.step(done(ops), t0, true);
    let node_gone = node(false);
    m.step(node_gone, t0, true);
    m.step(Input::Settle, t0, true);
    assert_eq!(
        wait(&mut m, t0),
        Some(CutoverWait::Grace {
            left: GRACE_OF_TESTS
        })
    );
    // The grace over, a new identity arrives: its write is what cutover waits for.
    let t1 = t0 + GRACE_OF_TESTS;
    let arrives = arrives("301", "k8s:app=c;");
    m.step(arrives, t1, true);
    assert_eq!(wait(&mut m, t1), Some(CutoverWait::Writes(1)));
    let ops = writes(&m.step(Input::Settle, t1, true));
    assert_eq!(
        wait(&mut m, t1),
        Some(CutoverWait::Writes(2)),
        "in flight, and the batch"
    );
    m.step(done(ops), t1, true);
    m.step(Input::Settle, t1, true);
    let out = m.step(Input::Status { watching: true }, t1, true);
    assert!(out.iter().any(|o| matches!(o, Output::Verify { .. })));
    assert_eq!(wait(&mut m, t1), Some(CutoverWait::Checking));
}

#[test]
fn a_cutover_report_reads_as_one_line_with_each_count() {
    let r = CutoverReport {
        mirrored: 5,
        mapped: 2,
        skipped: 1,
        moot: 3,
    };
    assert_eq!(
        r.to_string(),
        "cutover reached: no kvstore-mode node is left, nothing is pending, and verify passes (5 mirrored by sync, 2 mapped to an id holding their labels, 1 skipped by decision, 3 closed as moot)"
    );
}

/// The `nowhere` of the first cutover check, once the rollout is over and all is quiet.
fn first_check_nowhere(m: &mut Machine, t0: Instant) -> BTreeSet<String> {
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    let out = m.step(Input::Status { watching: true }, t0 + GRACE_OF_TESTS, true);
    out.into_iter()
        .find_map(|o| match o {
            Output::Verify { nowhere, .. } => Some(nowhere),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no check: {:?}", m.state.status.cutover_wait))
}

#[test]
fn only_skips_and_objects_the_gc_took_back_are_expected_nowhere() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let decide = |id: &str, labels: &str, action, target_id| {
        Input::Decided(LoggedDecision {
            id: id.into(),
            labels: labels.into(),
            action,
            target_id,
        })
    };
    // 301 = C is decided to be created (as proposed); 302 = D skipped.
    for (id, l) in [("301", "k8s:app=c;"), ("302", "k8s:app=d;")] {
        m.step(arrives(id, l), t0, true);
    }
    m.step(
        decide(
            "301",
            "k8s:app=c;",
            crate::core::planner::Action::Create,
            Some(301),
        ),
        t0,
        true,
    );
    m.step(
        decide(
            "302",
            "k8s:app=d;",
            crate::core::planner::Action::Skip,
            None,
        ),
        t0,
        true,
    );
    let ops = writes(&m.step(Input::Settle, t0, true));
    assert_eq!(ops.len(), 2, "300 and 301: {ops:?}");
    m.step(done(ops), t0, true);
    // The cluster's GC deletes 300, which sync made; no node uses it, so it is not made again
    // (checked once the wait every deleted object has is over).
    m.step(
        Input::K8s(K8sChange::Deleted {
            id: 300,
            resource_version: "9".into(),
        }),
        t0,
        true,
    );
    let nowhere = first_check_nowhere(&mut m, t0 + crate::core::sync::RECREATE_SETTLE);
    assert_eq!(nowhere, ["300".to_string(), "302".to_string()].into());
}

#[test]
fn a_failed_write_not_yet_due_waits_while_another_is_tried() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(failed(ops), t0, true);
    // A second identity fails 5 s later: due 5 s after the first.
    let t1 = t0 + Duration::from_secs(5);
    m.step(arrives("301", "k8s:app=c;"), t1, true);
    let ops = writes(&m.step(Input::Settle, t1, true));
    assert_eq!(ops.len(), 1);
    m.step(failed(ops), t1, true);
    let due = t0 + crate::core::sync::RETRY_AFTER;
    m.step(Input::Status { watching: true }, due, true);
    let again = writes(&m.step(Input::Settle, due, true));
    let targets: Vec<Option<u32>> = again.iter().map(|o| o.target_id).collect();
    assert_eq!(targets, [Some(300)], "only the one whose wait is over");
}

#[test]
fn a_verdict_when_something_arrived_meanwhile_is_not_cutover() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    let t1 = t0 + GRACE_OF_TESTS;
    let out = m.step(Input::Status { watching: true }, t1, true);
    assert!(out.iter().any(|o| matches!(o, Output::Verify { .. })));
    // While the check runs a new identity arrives: nothing is quiet until it is written.
    m.step(arrives("301", "k8s:app=c;"), t1, true);
    let out = m.step(Input::Verdict(Ok(())), t1, true);
    assert!(
        !out.iter().any(|o| matches!(o, Output::Cutover(_))),
        "{out:?}"
    );
}

#[test]
fn sync_s_own_reservation_keys_coming_and_going_never_keep_cutover_waiting() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let t1 = check_running(&mut m, t0);
    // While the check runs, `value/` keys of sync's own come and go (a lapsed lease of a
    // crashed sync's, a release): no node's use, nothing to plan.
    let own = |present| KvChange::Slave {
        label_key: A.as_bytes().to_vec(),
        node: crate::core::kvstore::RESERVATION_NODE.as_bytes().to_vec(),
        present,
        id: None,
    };
    assert!(own(true).is_own_reservation() && !slave(true).is_own_reservation());
    for present in [true, false] {
        m.step(
            Input::Kv(KvWatchEvent::Changes {
                changes: vec![own(present)],
                revision: 9,
            }),
            t1,
            true,
        );
    }
    let out = m.step(Input::Verdict(Ok(())), t1, true);
    assert!(
        out.iter().any(|o| matches!(o, Output::Cutover(_))),
        "{out:?}"
    );
}

/// The counts a status publishes, if it publishes any.
fn published(out: &[Output]) -> Option<u32> {
    out.iter().find_map(|o| match o {
        Output::NodeCounts(c) => Some(c.get(A.as_bytes())),
        _ => None,
    })
}

#[test]
fn node_counts_are_published_when_they_moved_at_most_every_counts_every() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let status = Input::Status { watching: true };
    // The snapshot's counts go out with the first status, then not again while unchanged.
    assert_eq!(published(&m.step(status.clone(), t0, true)), Some(1));
    assert_eq!(
        published(&m.step(status.clone(), t0 + COUNTS_EVERY, true)),
        None
    );
    // The node leaves: said, but not sooner than COUNTS_EVERY after the last time.
    let second = Duration::from_secs(1);
    m.step(node(false), t0 + second, true);
    assert_eq!(
        published(&m.step(status.clone(), t0 + 2 * second, true)),
        None
    );
    assert_eq!(
        published(&m.step(status.clone(), t0 + COUNTS_EVERY, true)),
        Some(0)
    );
    assert_eq!(
        published(&m.step(status, t0 + 2 * COUNTS_EVERY, true)),
        None
    );
}

#[test]
fn a_deleted_object_waiting_to_be_made_again_is_a_write_cutover_waits_for() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    // Just before the grace is over, a person deletes the object while the kvstore holds
    // the identity: it waits before it is made again, and nothing else is unsettled.
    let t1 = t0 + Duration::from_secs(10);
    let deleted = Input::K8s(K8sChange::Deleted {
        id: 300,
        resource_version: "9".into(),
    });
    m.step(deleted, t1 - Duration::from_millis(500), true);
    m.step(Input::Settle, t1 - Duration::from_millis(500), true);
    m.step(Input::Status { watching: true }, t1, true);
    assert_eq!(m.state.in_flight.len() + m.state.failed.len(), 0);
    assert_eq!(m.state.settling.len(), 1);
    assert_eq!(m.state.status.cutover_wait, Some(CutoverWait::Writes(1)));
}

mod reserve;

#[test]
fn a_passing_cutover_check_brings_the_mappings_no_log_holds_and_a_refused_line_is_a_wait() {
    use crate::core::sync::machine::cutover::{cutover_verdict, logged_verdict};
    let masters = vec![
        MasterEntry::new("300", "k8s:app=a;"),
        MasterEntry::new("301", "k8s:app=b;"),
    ];
    let k8s: BTreeMap<u32, LabelKey> = [
        (300, "k8s:app=a;".to_string()),
        (301, "k8s:app=squatter;".to_string()),
        (256, "k8s:app=b;".to_string()),
    ]
    .into();
    let reused: BTreeMap<String, u32> = [("301".to_string(), 256)].into();
    let range = IdRange::for_cluster(0).unwrap();
    let sides = (masters.as_slice(), &k8s);
    let lines = cutover_verdict(
        Expectations::default(),
        (&reused, &BTreeSet::new()),
        sides,
        range,
    )
    .expect("passes");
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!((line.id.as_str(), line.target_id), ("301", Some(256)));
    assert!(line.step().is_none(), "never read as a decision");
    // What verify then reads from the line alone passes.
    let mut logged = Expectations::default();
    for l in &lines {
        logged.fold(l.logged());
    }
    let alone = crate::core::verify::verify(&masters, &k8s, &logged, range);
    assert!(alone.passed(), "{:?}", alone.problems);
    // Logged already: nothing more.
    let again = cutover_verdict(logged, (&reused, &BTreeSet::new()), sides, range).unwrap();
    assert!(again.is_empty());
    // A log that refuses the line makes the pass a wait.
    let verdict = cutover_verdict(
        Expectations::default(),
        (&reused, &BTreeSet::new()),
        sides,
        range,
    );
    let taken = logged_verdict(verdict, |_| Err("disk full"));
    assert!(
        matches!(taken, Err(CutoverWait::Verify { .. })),
        "{taken:?}"
    );
}
