//! What is moot, what cutover says it waits for, sync's own reservations, and a decision's wait apart from lag.

use super::*;

#[test]
fn a_mapping_to_a_proposal_never_written_is_moot_once_no_node_uses_it() {
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    let node = |present| KvChange::Slave {
        label_key: b"k8s:app=r;".to_vec(),
        node: b"node-1".to_vec(),
        present,
        id: None,
    };
    // Two kvstore agents allocated `r` at 300 and 301, and CRD-mode agents hold both ids
    // for other labels: 300 gets a remap proposal, 301 is mapped to where it would go.
    sync.apply_kv_change(put("300", "k8s:app=r;"), t0);
    sync.apply_kv_change(put("301", "k8s:app=r;"), t0);
    sync.apply_kv_change(node(true), t0);
    sync.k8s_upsert(300, "k8s:app=x;".into(), String::new(), t0);
    sync.k8s_upsert(301, "k8s:app=y;".into(), String::new(), t0);
    sync.round(&mut Decisions::default(), range, false, t0);
    let target = sync.reused.get("301").copied().expect("301 mapped");
    assert!(!sync.k8s.contains_key(&target));
    // While node-1 uses `r`, nothing is moot.
    assert!(sync.moot_now().is_empty());
    sync.round(&mut Decisions::default(), range, false, t0);
    // node-1 moves: the proposal and the mapping to it are both moot.
    sync.apply_kv_change(node(false), t0);
    let moot: Vec<(String, Kind)> = sync
        .moot_now()
        .into_iter()
        .map(|(id, _, kind)| (id, kind))
        .collect();
    assert_eq!(
        moot,
        [("300".into(), Kind::Remap), ("301".into(), Kind::Reuse)]
    );
    // Closed (as the machine closes them once logged), they stay out of what the cutover
    // check expects served, through later rounds and a plan made in full: a full plan once
    // put 301's mapping back, and the check then expected 301 both served and nowhere.
    for id in ["300", "301"] {
        sync.close_moot(id);
        sync.reused.remove(id);
    }
    sync.round(&mut Decisions::default(), range, false, t0);
    sync.k8s_relisted(sync.k8s.clone(), "2".into(), t0);
    sync.round(&mut Decisions::default(), range, false, t0);
    assert!(sync.reused.is_empty(), "{:?}", sync.reused);
}

#[test]
fn an_id_the_kvstore_frees_and_gives_to_other_labels_is_no_longer_moot() {
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    let gone = KvChange::Master {
        id: b"300".to_vec(),
        value: None,
        created: false,
    };
    let node = |labels: &str, present| KvChange::Slave {
        label_key: labels.as_bytes().to_vec(),
        node: b"node-1".to_vec(),
        present,
        id: None,
    };
    // 300 `r` is a remap no node uses any more: closed as moot.
    sync.k8s_upsert(300, "k8s:app=x;".into(), String::new(), t0);
    sync.apply_kv_change(put("300", "k8s:app=r;"), t0);
    sync.round(&mut Decisions::default(), range, false, t0);
    let moot: Vec<String> = sync.moot_now().into_iter().map(|(id, ..)| id).collect();
    assert_eq!(moot, ["300"]);
    sync.close_moot("300");
    sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(sync.status.pending, 0, "closed");
    // The kvstore's GC frees 300 and an agent takes it for `s`, which node-1 uses and
    // Kubernetes still holds for `x`: a new conflict, pending and reported.
    for change in [gone, put("300", "k8s:app=s;"), node("k8s:app=s;", true)] {
        sync.apply_kv_change(change, t0);
    }
    assert!(!sync.moot.contains("300"));
    let (_, reports) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(sync.status.pending, 1, "{reports:?}");
    // The same without the delete between (a compaction hid it): labels changed in place.
    sync.moot.insert("300".into());
    sync.apply_kv_change(put("300", "k8s:app=t;"), t0);
    assert!(!sync.moot.contains("300"));
    // Unchanged labels keep the closure.
    sync.moot.insert("300".into());
    sync.apply_kv_change(put("300", "k8s:app=t;"), t0);
    assert!(sync.moot.contains("300"));
}

#[test]
fn cutover_always_says_what_it_waits_for() {
    let grace = Duration::from_secs(120);
    let mut st = SyncStatus {
        kvstore_nodes: 2,
        ..Default::default()
    };
    let none = || (0, None, true, false);
    let wait = |st: &SyncStatus, since: Option<u64>, w, last| {
        cutover_wait(st, since.map(Duration::from_secs), grace, w, last)
    };
    assert_eq!(wait(&st, None, none(), None), Some(CutoverWait::Nodes(2)));
    st.kvstore_nodes = 0;
    assert_eq!(
        wait(&st, Some(20), none(), None),
        Some(CutoverWait::Grace {
            left: Duration::from_secs(100)
        })
    );
    assert!(
        wait(&st, Some(20), none(), None)
            .unwrap()
            .to_string()
            .contains("100s")
    );
    assert_eq!(
        wait(&st, Some(120), (0, None, false, false), None),
        Some(CutoverWait::Lease)
    );
    st.pending = 3;
    assert_eq!(
        wait(&st, Some(120), none(), None),
        Some(CutoverWait::Decisions(3))
    );
    st.pending = 0;
    assert_eq!(
        wait(&st, Some(120), (4, None, true, false), None),
        Some(CutoverWait::Writes(4))
    );
    // A denied create is named with the server's words, after the writes still going.
    let denied = Some((
        1,
        "300 at 300: admission webhook \"ids\" denied the request".into(),
    ));
    let said = wait(&st, Some(120), (0, denied, true, false), None).unwrap();
    assert_eq!(said.reason(), "denied");
    assert!(CutoverWait::REASONS.contains(&said.reason()));
    for words in ["1 create", "admission webhook \"ids\" denied", "300 at 300"] {
        assert!(said.to_string().contains(words), "{words}: {said}");
    }
    assert_eq!(
        wait(&st, Some(120), (0, None, true, true), None),
        Some(CutoverWait::Checking)
    );
    // Nothing left but a check: none yet, or the last one's problems.
    assert_eq!(wait(&st, Some(120), none(), None), None);
    let failed = CutoverWait::Verify {
        problems: 2,
        first: "2203 different".into(),
    };
    assert_eq!(
        wait(&st, Some(120), none(), Some(&failed)),
        Some(failed.clone())
    );
    assert_eq!(failed.reason(), "verify");
    assert!(CutoverWait::REASONS.contains(&failed.reason()));
}

#[test]
fn syncs_own_reservation_is_never_a_reason_to_create() {
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    // Sync reserved 4000 for an object a CRD-mode agent made; the operator's GC deleted
    // the object since, and with it the `value/` key: the master key is left.
    sync.apply_kv_change(
        KvChange::Master {
            id: b"4000".to_vec(),
            value: Some(b"k8s:app=b;".to_vec()),
            created: true,
        },
        t0,
    );
    sync.own_masters.insert(4000);
    let (ops, reports) = sync.round(&mut Decisions::default(), range, false, t0);
    assert!(ops.is_empty(), "{ops:?}");
    assert!(reports.is_empty());
    assert_eq!(sync.reservations_alone().collect::<Vec<_>>(), [4000]);
    // A kvstore-mode agent that uses the id makes it a kvstore identity like any other.
    sync.apply_kv_change(
        KvChange::Slave {
            label_key: b"k8s:app=b;".to_vec(),
            node: b"node-1".to_vec(),
            present: true,
            id: None,
        },
        t0,
    );
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(
        ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
        [Some(4000)]
    );
    assert_eq!(sync.reservations_alone().count(), 0);
}

#[test]
fn a_decision_wait_is_not_lag() {
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    // 300 needs a decision (Kubernetes holds its id for other labels); 301 does not.
    sync.k8s_upsert(300, "k8s:app=z;".into(), String::new(), t0);
    for (id, l) in [("300", "k8s:app=a;"), ("301", "k8s:app=b;")] {
        sync.apply_kv_change(
            KvChange::Master {
                id: id.as_bytes().to_vec(),
                value: Some(l.as_bytes().to_vec()),
                created: true,
            },
            t0,
        );
    }
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(ops.len(), 1);
    let t1 = t0 + Duration::from_millis(50);
    let done = |ops: &[Op]| BatchOutcome::Done {
        results: ops
            .iter()
            .map(|o| (o.target_id.unwrap(), Outcome::Created))
            .collect(),
        halted: None,
        denied: Vec::new(),
    };
    sync.take_results(ops.clone(), done(&ops), t1);
    // The operator decides 35 s later: as proposed.
    let t2 = t0 + Duration::from_secs(35);
    let proposal = sync.planned_items().into_iter().find(|i| i.id == "300");
    let mut decisions = Decisions::default();
    decisions.decide(LoggedDecision {
        id: "300".into(),
        labels: "k8s:app=a;".into(),
        action: Action::Create,
        target_id: proposal.and_then(|i| i.target_id),
    });
    let (ops, _) = sync.round(&mut decisions, range, false, t2);
    assert_eq!(ops.len(), 1, "{ops:?}");
    sync.take_results(ops.clone(), done(&ops), t2);
    sync.refresh_lag_percentiles();
    assert_eq!(sync.status.lag_p99, Some(Duration::from_millis(50)));
    assert_eq!(
        sync.status.decision_wait_last,
        Some(Duration::from_secs(35))
    );
}
