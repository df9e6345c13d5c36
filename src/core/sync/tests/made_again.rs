//! Objects sync made and someone deleted: made again once and only while used, after a wait while the kvstore holds the identity, refused once when decided; a halted batch's outcomes one by one.

use super::*;

/// A state following `ids`, each a plain identity with its own labels, used by one node.
/// node-1 stops using `k8s:app=a<id>;` (as `following` set it up), then its object goes.
fn unused_and_deleted(sync: &mut SyncState, id: u32, t0: Instant) {
    let slave = KvChange::Slave {
        label_key: format!("k8s:app=a{id};").into_bytes(),
        node: b"node-1".to_vec(),
        present: false,
        id: None,
    };
    sync.apply_kv_change(slave, t0);
    sync.k8s_delete(id, String::new(), t0);
}

#[test]
fn each_outcome_of_a_halted_batch_is_folded_in_on_its_own() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let mut sync = following(&[300, 301, 302, 303, 304], t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(ops.len(), 5);
    let results = vec![
        (300, Outcome::Created),
        (301, Outcome::AlreadyExisted),
        (302, Outcome::Failed),
        (303, Outcome::Conflict),
        (304, Outcome::NotAttempted),
    ];
    let halted = Some("stopped by the operator".to_string());
    let taken = sync.take_results(
        ops,
        BatchOutcome::Done {
            results,
            halted,
            denied: Vec::new(),
        },
        t0,
    );
    assert_eq!((taken.mirrored, taken.failures), (1, 2));
    assert_eq!((sync.status.mirrored, sync.status.failures), (1, 2));
    assert!(
        taken
            .trouble
            .unwrap()
            .starts_with("stopped by the operator")
    );
    // Made or found made: served, and never made again.
    assert_eq!(sync.k8s.keys().copied().collect::<Vec<_>>(), [300, 301]);
    assert_eq!(sync.created, HashSet::from_iter([300]));
    assert_eq!(sync.unwritten_now(), 3);
    // The others wait, then are tried again, all three.
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + Duration::from_secs(1),
    );
    assert!(ops.is_empty(), "{ops:?}");
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0 + RETRY_AFTER);
    let mut targets: Vec<u32> = ops.iter().filter_map(|o| o.target_id).collect();
    targets.sort();
    assert_eq!(targets, [302, 303, 304]);
}

#[test]
fn other_labels_at_an_id_whose_object_sync_made_and_someone_deleted_are_a_new_object() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    // The kvstore's 400 (a400) is held in Kubernetes by other labels: remapped, as
    // accepted, to 256, the lowest id free on both sides.
    let mut sync = following(&[400], t0);
    sync.k8s_upsert(400, "k8s:app=other;".into(), "1".into(), t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, true, t0);
    assert_eq!(
        ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
        [Some(256)]
    );
    let done = |ops: Vec<Op>| BatchOutcome::Done {
        results: ops
            .iter()
            .filter_map(|o| o.target_id.map(|t| (t, Outcome::Created)))
            .collect(),
        halted: None,
        denied: Vec::new(),
    };
    sync.take_results(ops.clone(), done(ops), t0);
    // The cluster's GC deletes 256; the kvstore's takes 400; 401 (b) comes, also held
    // by other labels in Kubernetes.
    sync.k8s_delete(256, "2".into(), t0);
    for change in [
        KvChange::Slave {
            label_key: b"k8s:app=a400;".to_vec(),
            node: b"node-1".to_vec(),
            present: false,
            id: None,
        },
        KvChange::Master {
            id: b"400".to_vec(),
            value: None,
            created: false,
        },
        KvChange::Master {
            id: b"401".to_vec(),
            value: Some(b"k8s:app=b;".to_vec()),
            created: true,
        },
    ] {
        sync.apply_kv_change(change, t0);
    }
    sync.k8s_upsert(401, "k8s:app=y;".into(), "3".into(), t0);
    // b's remap to the freed 256 is a new object: made, not held back as "made again".
    let t1 = t0 + RECREATE_SETTLE;
    let (ops, reports) = sync.round(&mut Decisions::default(), range, true, t1);
    assert_eq!(
        ops.iter()
            .map(|o| (o.id.as_str(), o.target_id))
            .collect::<Vec<_>>(),
        [("401", Some(256))],
        "{reports:?}"
    );
    assert_eq!(sync.status.deleted_not_recreated, 0);
}

#[test]
fn what_the_shell_and_the_simulation_read_is_the_state_itself() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let masters = BTreeMap::from([
        (b"300".to_vec(), b"k8s:app=a;".to_vec()),
        (b"301".to_vec(), b"k8s:app=b;".to_vec()),
    ]);
    // 5000 holds b's labels: its identity 301 is a duplicate, waiting for a decision.
    let k8s = BTreeMap::from([(5000, "k8s:app=b;".to_string())]);
    let mut sync = SyncState::from_kvstore(masters.clone(), NodeCounts::default(), 42)
        .with_kubernetes(k8s.clone(), "17".into());
    assert_eq!(sync.masters(), &masters);
    assert_eq!(sync.k8s(), &k8s);
    assert_eq!(sync.kv_revision(), 42);
    assert_eq!(sync.k8s_version(), "17");
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(sync.status(), &sync.status);
    assert_eq!(sync.status().identities, 2);
    assert_eq!(
        sync.waiting(),
        sync.waiting.values().cloned().collect::<Vec<_>>()
    );
    assert_eq!(
        sync.waiting()
            .iter()
            .map(|w| w.0.as_str())
            .collect::<Vec<_>>(),
        ["301"],
        "{ops:?}"
    );
    sync.reused.insert("302".into(), 5001);
    assert_eq!(sync.reused(), &BTreeMap::from([("302".to_string(), 5001)]));
    sync.moot.insert("301".into());
    assert!(sync.is_moot("301") && !sync.is_moot("300"));
}

#[test]
fn a_decided_create_of_an_object_sync_made_and_the_gc_deleted_is_refused_once() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let mut sync = following(&[300], t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    let results = vec![(300, Outcome::Created)];
    let outcome = BatchOutcome::Done {
        results,
        halted: None,
        denied: Vec::new(),
    };
    sync.take_results(ops, outcome, t0);
    // No node uses it any more, and the GC deletes it; the operator decides to create it.
    unused_and_deleted(&mut sync, 300, t0);
    let mut decided = Decisions::new(BTreeMap::from([(
        "300".to_string(),
        LoggedDecision {
            id: "300".into(),
            labels: "k8s:app=a300;".into(),
            action: Action::Create,
            target_id: Some(300),
        },
    )]));
    let t1 = t0 + RECREATE_SETTLE;
    let refused = |reports: &[SyncReport]| {
        reports
            .iter()
            .filter(|r| matches!(r, SyncReport::Refused { reason, .. } if reason.contains("deleted since")))
            .count()
    };
    let (ops, reports) = sync.round(&mut decided, range, false, t1);
    assert!(ops.is_empty(), "{ops:?}");
    assert_eq!(refused(&reports), 1, "{reports:?}");
    // Said once, however many rounds pass.
    sync.overlay = None;
    let (_, reports) = sync.round(&mut decided, range, false, t1);
    assert_eq!(refused(&reports), 0, "{reports:?}");
}

#[test]
fn an_object_sync_made_and_someone_deleted_is_made_again_once_and_only_while_used() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let mut sync = following(&[300], t0);
    let made = |sync: &mut SyncState, ops| {
        let results = vec![(300, Outcome::Created)];
        sync.take_results(
            ops,
            BatchOutcome::Done {
                results,
                halted: None,
                denied: Vec::new(),
            },
            t0,
        );
    };
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    made(&mut sync, ops);
    // Deleted while node-1 uses it: made again, once, after the wait.
    sync.k8s_delete(300, String::new(), t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert!(ops.is_empty(), "made again before the wait: {ops:?}");
    let t1 = t0 + RECREATE_SETTLE;
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t1);
    assert_eq!(ops.len(), 1);
    assert_eq!(sync.status.recreated, 1);
    made(&mut sync, ops);
    // Deleted again: not a third time, counted once however many rounds pass.
    sync.k8s_delete(300, String::new(), t1);
    for _ in 0..3 {
        let (ops, _) = sync.round(
            &mut Decisions::default(),
            range,
            false,
            t1 + RECREATE_SETTLE,
        );
        assert!(ops.is_empty());
    }
    assert_eq!(
        (sync.status.recreated, sync.status.deleted_not_recreated),
        (1, 1)
    );

    // One that no node uses any more is not made again at all.
    let mut sync = following(&[300], t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    made(&mut sync, ops);
    unused_and_deleted(&mut sync, 300, t0);
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + RECREATE_SETTLE,
    );
    assert!(ops.is_empty());
    assert_eq!(
        (sync.status.recreated, sync.status.deleted_not_recreated),
        (0, 1)
    );

    // Unused when its delete arrives, it still waits: a node's key that the trailing
    // view shows next (just before the kvstore's deletes) must not make it again.
    let mut sync = following(&[300], t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    made(&mut sync, ops);
    let node_key = |present| KvChange::Slave {
        label_key: b"k8s:app=a300;".to_vec(),
        node: b"node-1".to_vec(),
        present,
        id: None,
    };
    sync.apply_kv_change(node_key(false), t0);
    sync.k8s_delete(300, String::new(), t0);
    sync.apply_kv_change(node_key(true), t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert!(ops.is_empty(), "made again before the wait: {ops:?}");
    sync.apply_kv_change(node_key(false), t0 + Duration::from_millis(500));
    sync.apply_kv_change(
        KvChange::Master {
            id: b"300".to_vec(),
            value: None,
            created: false,
        },
        t0 + Duration::from_millis(500),
    );
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + RECREATE_SETTLE,
    );
    assert!(ops.is_empty(), "{ops:?}");
}

#[test]
fn an_object_deleted_while_the_kvstore_holds_its_identity_waits_before_it_is_made_again() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let gone = KvChange::Master {
        id: b"300".to_vec(),
        value: None,
        created: false,
    };
    // An identity migrated earlier (its object made by apply, not this sync).
    let mut sync = following(&[300, 301], t0);
    sync.k8s_upsert(300, "k8s:app=a300;".into(), "1".into(), t0);
    sync.k8s_upsert(301, "k8s:app=a301;".into(), "2".into(), t0);
    assert!(
        sync.round(&mut Decisions::default(), range, false, t0)
            .0
            .is_empty()
    );
    // The cluster's GC took both objects; sync saw that before the kvstore's GC took
    // 300's identity, a moment earlier.
    sync.k8s_delete(300, "3".into(), t0);
    sync.k8s_delete(301, "4".into(), t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert!(ops.is_empty(), "{ops:?}");
    sync.apply_kv_change(gone.clone(), t0 + Duration::from_millis(500));
    assert!(!sync.settling.contains_key(&300));
    // 301's identity stays in the kvstore: made again once the wait is over.
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + Duration::from_secs(1),
    );
    assert!(ops.is_empty(), "{ops:?}");
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + RECREATE_SETTLE,
    );
    assert_eq!(
        ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
        [Some(301)]
    );
    assert!(sync.settling.is_empty());
    // A relist that finds an object gone meanwhile waits the same.
    let mut sync = following(&[302], t0);
    sync.k8s_upsert(302, "k8s:app=a302;".into(), "1".into(), t0);
    sync.k8s_relisted(BTreeMap::new(), "9".into(), t0);
    assert!(
        sync.round(&mut Decisions::default(), range, false, t0)
            .0
            .is_empty()
    );
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + RECREATE_SETTLE,
    );
    assert_eq!(ops.len(), 1);
    // So does one whose object sync never saw (made and deleted while the watch was
    // gone): not made if the kvstore's delete arrives meanwhile, else made after the wait.
    let mut sync = following(&[300, 303], t0);
    sync.k8s_relisted(BTreeMap::new(), "9".into(), t0);
    assert_eq!(
        sync.settling.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([300, 303])
    );
    assert!(
        sync.round(&mut Decisions::default(), range, false, t0)
            .0
            .is_empty()
    );
    sync.apply_kv_change(gone, t0 + Duration::from_millis(500));
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + RECREATE_SETTLE,
    );
    assert_eq!(
        ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
        [Some(303)]
    );
}
