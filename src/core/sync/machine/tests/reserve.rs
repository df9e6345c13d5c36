//! The machine's reservation commands: what is asked of the writer, when, and by whom.

use super::*;

/// A machine that reserves in the kvstore, holding the Lease, following both sides.
fn reserving(t0: Instant) -> Machine {
    let mut s = settings(false);
    s.reserve_in_kvstore = true;
    let mut m = Machine::new(s, BTreeMap::new());
    m.start_round(with_300(t0), true);
    m.step(Input::Lease(LeaseHolder::Us), t0, true);
    m
}

/// The kvstore's GC deletes the master key at 300.
fn master_300_gone() -> Input {
    Input::Kv(KvWatchEvent::Changes {
        changes: vec![KvChange::Master {
            id: b"300".to_vec(),
            value: None,
            created: false,
        }],
        revision: 5,
    })
}

fn reserve_asks(out: &[Output]) -> Vec<Reserve> {
    out.iter()
        .filter_map(|o| match o {
            Output::Reserve(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_master_key_gone_is_reserved_again_only_when_one_went() {
    let t0 = Instant::now();
    let mut m = reserving(t0);
    m.step(taken_by_b(), t0, true);
    let slave_only = node(true);
    assert!(reserve_asks(&m.step(slave_only, t0, true)).is_empty());
    let gone = master_300_gone();
    assert_eq!(
        reserve_asks(&m.step(gone, t0, true)),
        [
            Reserve::MasterGone {
                id: 300,
                k8s: Some("k8s:app=b;".into())
            },
            Reserve::Pump
        ]
    );
}

#[test]
fn a_master_key_of_syncs_own_gone_is_forgotten_even_by_a_standby_and_after_a_fresh_view() {
    let t0 = Instant::now();
    let mut m = reserving(t0);
    let own = Input::Reservations {
        held: 1,
        own_masters: [300].into(),
    };
    m.step(own, t0, true);
    // The Lease is another's: nothing is written, but the writer still forgets what the
    // kvstore's GC took, or it would never reserve the id again once the Lease is back.
    m.step(Input::Lease(LeaseHolder::Other("i1".into())), t0, false);
    let gone = master_300_gone();
    assert_eq!(
        reserve_asks(&m.step(gone, t0, false)),
        [Reserve::MasterGone { id: 300, k8s: None }],
        "forgotten, and no pump while another writes"
    );
    // A fresh view (after a compaction) that lacks the key: no watch said it went.
    let mut carried = m.take_state();
    carried.own_masters = [300, 301].into();
    let mut fresh = with_300(t0);
    fresh.own_masters = carried.own_masters.clone();
    let out = m.start_round(fresh, true);
    assert_eq!(
        reserve_asks(&out),
        [
            Reserve::MasterGone { id: 301, k8s: None },
            Reserve::FreshKvstore
        ],
        "only the one the fresh view lacks (300 is there); what was found held looked at again"
    );
}

#[test]
fn what_sync_made_is_reserved_at_once_and_an_arrival_with_the_gate_shut_is_queued() {
    let t0 = Instant::now();
    let mut m = reserving(t0);
    // Sync's own create: asked for as soon as its outcome is in, not when the watch shows
    // it (the queue leaves out an id the kvstore holds, as 300 is here).
    let ops = writes(&m.step(Input::Settle, t0, true));
    assert_eq!(ops.len(), 1);
    assert_eq!(
        reserve_asks(&m.step(done(ops), t0, true)),
        [
            Reserve::Want {
                id: 300,
                labels: A.into()
            },
            Reserve::Pump
        ]
    );
    // An object arriving while the gate is shut a moment: queued, pumped once it opens.
    let c = Input::K8s(K8sChange::Upsert {
        id: 4000,
        labels: "k8s:app=c;".into(),
        resource_version: "3".into(),
    });
    assert_eq!(
        reserve_asks(&m.step(c, t0, false)),
        [Reserve::Want {
            id: 4000,
            labels: "k8s:app=c;".into()
        }]
    );
}

#[test]
fn the_reservations_own_master_keys_change_the_plan_only_when_they_change() {
    let t0 = Instant::now();
    let mut m = following(false, true, t0);
    let ops = writes(&m.step(Input::Settle, t0, true));
    m.step(done(ops), t0, true);
    m.step(Input::Settle, t0, true);
    let waits_for_writes = |m: &mut Machine, t: Instant| {
        let out = m.step(Input::Status { watching: true }, t, true);
        out.iter().any(|o| {
            matches!(o, Output::Status(s) if matches!(s.cutover_wait, Some(CutoverWait::Writes(_))))
        })
    };
    // Nodes are there: cutover waits for them; what matters is whether a plan is due.
    m.step(
        Input::Reservations {
            held: 0,
            own_masters: Default::default(),
        },
        t0,
        true,
    );
    assert_eq!(m.state.status.reservations, 0);
    m.step(node(false), t0, true);
    m.step(Input::Settle, t0, true);
    m.step(Input::Status { watching: true }, t0, true);
    let later = t0 + Duration::from_secs(10);
    m.step(
        Input::Reservations {
            held: 3,
            own_masters: Default::default(),
        },
        later,
        true,
    );
    assert_eq!(m.state.status.reservations, 3);
    assert!(
        !waits_for_writes(&mut m, later),
        "the same masters: nothing to plan"
    );
    m.step(
        Input::Reservations {
            held: 3,
            own_masters: [300].into(),
        },
        later,
        true,
    );
    assert!(
        waits_for_writes(&mut m, later),
        "new masters of its own: a plan is due"
    );
}

#[test]
fn after_cutover_a_fresh_snapshot_neither_reserves_again_nor_announces_it_again() {
    let t0 = Instant::now();
    let mut m = reserving(t0);
    m.step(Input::Kv(KvWatchEvent::Connected), t0, true);
    m.step(Input::K8s(K8sChange::Connected), t0, true);
    let t1 = check_running(&mut m, t0);
    let out = m.step(Input::Verdict(Ok(())), t1, true);
    assert!(
        out.iter().any(|o| matches!(o, Output::Cutover(_))),
        "{out:?}"
    );
    assert!(out.contains(&Output::Reserve(Reserve::Release)), "{out:?}");
    // An etcd compaction after cutover: a fresh snapshot.
    let again = m.start_round(with_300(t1), true);
    assert!(
        !again.iter().any(|o| matches!(o, Output::Reserve(_))),
        "released at cutover, nothing is reserved again: {again:?}"
    );
    m.step(Input::Kv(KvWatchEvent::Connected), t1, true);
    m.step(Input::K8s(K8sChange::Connected), t1, true);
    let mut out = m.step(Input::Settle, t1, true);
    let t2 = t1 + Duration::from_secs(30);
    out.extend(m.step(Input::Status { watching: true }, t2, true));
    assert!(
        !out.iter().any(|o| matches!(
            o,
            Output::Cutover(_) | Output::Verify { .. } | Output::Reserve(_)
        )),
        "cutover stands, said once: {out:?}"
    );
}
