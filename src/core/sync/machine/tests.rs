//! The machine's decisions, one at a time: writes only under a valid Lease, cutover only
//! after the grace and a passing check (never twice), a stop that waits for the batch in
//! flight, a compaction that asks for a fresh snapshot, moot closures only once logged.
//! Whole rollouts are `crate::sim`'s.

use std::collections::BTreeMap;
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

/// What sync knows with `300 = A` in the kvstore.
fn with_300(t0: Instant) -> SyncState {
    let mut state = SyncState::default();
    state.apply_kv_change(
        KvChange::Master {
            id: b"300".to_vec(),
            value: Some(A.as_bytes().to_vec()),
            created: true,
        },
        t0,
    );
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

fn slave(present: bool) -> KvChange {
    KvChange::Slave {
        label_key: A.as_bytes().to_vec(),
        node: b"10.0.0.1".to_vec(),
        present,
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
    m.step(
        Input::Kv(KvWatchEvent::Changes {
            changes: vec![slave(false)],
            revision: 5,
        }),
        t1,
        true,
    );
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
    assert!(m.ended());
    assert!(
        m.step(Input::Status { watching: true }, t2, true)
            .is_empty()
    );
}

#[test]
fn a_verdict_after_a_node_came_back_is_not_cutover() {
    let t0 = Instant::now();
    let mut m = following(false, false, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    let t1 = t0 + Duration::from_secs(10);
    let out = m.step(Input::Status { watching: true }, t1, true);
    assert!(out.iter().any(|o| matches!(o, Output::Verify { .. })));
    // While the check runs a node comes back.
    m.step(
        Input::Kv(KvWatchEvent::Changes {
            changes: vec![slave(true)],
            revision: 6,
        }),
        t1,
        true,
    );
    m.step(Input::Settle, t1, true);
    m.step(Input::Status { watching: true }, t1, true);
    let out = m.step(Input::Verdict(Ok(())), t1, true);
    assert!(
        !out.iter().any(|o| matches!(o, Output::Cutover(_))),
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

#[test]
fn a_conflict_skipped_by_a_decision_is_expected_nowhere_at_cutover() {
    let t0 = Instant::now();
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
