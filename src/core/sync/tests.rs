//! Tests of `core::sync`: what a round writes and reports, split allocations, decisions,
//! outcomes and the carry-over, unit by unit and as property tests over random interleavings.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use crate::core::range::IdRange;

/// Label sets the simulated agents allocate; the last is malformed (never written).
const LABELS: [&str; 6] = [
    "k8s:app=a;",
    "k8s:app=b;",
    "k8s:app=c;",
    "k8s:app=d;",
    "k8s:app=e;",
    "not a label key",
];

#[derive(Debug, Clone)]
enum Event {
    /// A kvstore-mode agent writes `id/<n>`.
    KvPut(u32, usize),
    /// The kvstore's GC removes `id/<n>`.
    KvDelete(u32),
    /// A CRD-mode agent creates an object (if the name is free).
    AgentCreate(u32, usize),
    /// The cluster's GC deletes an object.
    ObjectDelete(u32),
    /// Sync's settle tick: plan and select the writes.
    Round,
    /// The writes in flight complete (or fail).
    Complete { fail: bool },
}

fn event() -> impl Strategy<Value = Event> {
    // 250..262 straddles the range's start (256): some ids are out of range.
    let id = 250u32..262;
    prop_oneof![
        3 => (id.clone(), 0..LABELS.len()).prop_map(|(i, l)| Event::KvPut(i, l)),
        1 => id.clone().prop_map(Event::KvDelete),
        2 => (id.clone(), 0..LABELS.len() - 1).prop_map(|(i, l)| Event::AgentCreate(i, l)),
        1 => id.prop_map(Event::ObjectDelete),
        3 => Just(Event::Round),
        2 => any::<bool>().prop_map(|fail| Event::Complete { fail }),
    ]
}

/// The world around sync, and what sync did in it.
#[derive(Default)]
struct World {
    k8s: BTreeMap<u32, LabelKey>,
    in_flight: Vec<Op>,
    /// The objects sync created that still exist.
    created: BTreeMap<u32, LabelKey>,
    /// What the kvstore holds at each id.
    kv: BTreeMap<u32, String>,
    /// Ids split after the last event, and how many times each became split.
    split_now: BTreeSet<u32>,
    occurrences: BTreeMap<u32, usize>,
    splits_found: Vec<u32>,
}

impl World {
    /// Counts the splits that began with the last event: an id both sides hold, the
    /// kvstore's labels well-formed and other than Kubernetes'.
    fn count_splits(&mut self) {
        let now: BTreeSet<u32> = self
            .k8s
            .iter()
            .filter(|(id, l)| {
                self.kv.get(id).is_some_and(|kv| {
                    valid_label_key(kv.as_bytes()).is_ok_and(|kv| kv != l.as_str())
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in now.difference(&self.split_now) {
            *self.occurrences.entry(*id).or_default() += 1;
        }
        self.split_now = now;
    }
}

/// `id/<id>` written with `labels`, as the kvstore's watch tells it.
fn put(id: &str, labels: &str) -> KvChange {
    KvChange::Master {
        id: id.as_bytes().to_vec(),
        value: Some(labels.as_bytes().to_vec()),
        created: true,
    }
}

fn run(events: Vec<Event>, accept_proposals: bool) -> Result<(), TestCaseError> {
    run_with(events, accept_proposals, &BTreeMap::new())
}

fn run_with(
    events: Vec<Event>,
    accept_proposals: bool,
    in_force: &BTreeMap<String, LoggedDecision>,
) -> Result<(), TestCaseError> {
    let mut decisions = Decisions::new(in_force.clone());
    let mut sync = SyncState::default();
    let mut w = World::default();
    let mut now = Instant::now();
    for ev in events {
        now += Duration::from_millis(100);
        match ev {
            Event::KvPut(id, l) => {
                w.kv.insert(id, LABELS[l].to_string());
                let change = KvChange::Master {
                    id: id.to_string().into_bytes(),
                    value: Some(LABELS[l].as_bytes().to_vec()),
                    created: true,
                };
                sync.apply_kv_change(change, now);
            }
            Event::KvDelete(id) => {
                w.kv.remove(&id);
                let change = KvChange::Master {
                    id: id.to_string().into_bytes(),
                    value: None,
                    created: false,
                };
                sync.apply_kv_change(change, now);
            }
            Event::AgentCreate(id, l) => {
                if let std::collections::btree_map::Entry::Vacant(free) = w.k8s.entry(id) {
                    free.insert(LABELS[l].to_string());
                    sync.k8s_upsert(id, LABELS[l].to_string(), String::new(), now);
                }
            }
            Event::ObjectDelete(id) => {
                w.created.remove(&id);
                if w.k8s.remove(&id).is_some() {
                    sync.k8s_delete(id, String::new(), now);
                }
            }
            Event::Round => round(
                &mut sync,
                &mut w,
                &mut decisions,
                in_force,
                accept_proposals,
                now,
            )?,
            Event::Complete { fail } => complete(&mut sync, &mut w, fail, now),
        }
        w.splits_found
            .extend(sync.splits_to_report.drain(..).map(|(id, _)| id));
        w.count_splits();
        prop_assert_eq!(
            sync.status.splits,
            w.split_now.len(),
            "the count of splits now is not the splits there are"
        );
    }
    check_end(&w, &sync, accept_proposals || !decisions.is_empty())
}

/// A round: its writes are checked against the world, then go in flight. The plan kept
/// up to date change by change, with the decisions kept resumed onto it, is the plan
/// made in full with them resumed (node counts aside: the cache does not keep them).
fn round(
    sync: &mut SyncState,
    w: &mut World,
    decisions: &mut Decisions,
    in_force: &BTreeMap<String, LoggedDecision>,
    accept_proposals: bool,
    now: Instant,
) -> Result<(), TestCaseError> {
    let range = IdRange::for_cluster(0).unwrap();
    let (ops, _) = sync.round(decisions, range, accept_proposals, now);
    let full = sync.plan(in_force, range);
    let cached: Vec<PlanItem> = sync.planned_items();
    let strip = |items: &[PlanItem]| -> Vec<PlanItem> {
        items
            .iter()
            .cloned()
            .map(|mut i| {
                i.nodes = 0;
                i
            })
            .collect()
    };
    prop_assert_eq!(strip(&cached), strip(&full));
    for op in &ops {
        let t = op.target_id.unwrap();
        prop_assert!(range.contains(t), "a write outside the range: {op:?}");
        prop_assert!(
            valid_label_key(op.label_key.as_bytes()).is_ok(),
            "a malformed write: {op:?}"
        );
        prop_assert!(parse_id(op.id.as_bytes()).is_ok(), "a malformed id: {op:?}");
        let elsewhere = w.k8s.iter().any(|(id, l)| *l == op.label_key && *id != t)
            || w.in_flight.iter().any(|o| o.label_key == op.label_key);
        // A duplicate the operator decided to create is the one allowed.
        let decided = op.decided_by == DecidedBy::Operator;
        prop_assert!(
            accept_proposals || decided || !elsewhere,
            "a second object for {}: {op:?}, world {:?}",
            op.label_key,
            w.k8s
        );
    }
    w.in_flight.extend(ops);
    Ok(())
}

/// The batch in flight completes (or fails as a whole), as the API server answers it.
fn complete(sync: &mut SyncState, w: &mut World, fail: bool, now: Instant) {
    let ops = std::mem::take(&mut w.in_flight);
    let mut results = Vec::new();
    for op in &ops {
        let t = op.target_id.unwrap();
        let outcome = match w.k8s.get(&t) {
            _ if fail => Outcome::Failed,
            Some(l) if *l == op.label_key => Outcome::AlreadyExisted,
            Some(_) => Outcome::Conflict,
            None => {
                w.k8s.insert(t, op.label_key.clone());
                w.created.insert(t, op.label_key.clone());
                Outcome::Created
            }
        };
        results.push((t, outcome));
    }
    let outcome = BatchOutcome::Done {
        results,
        halted: None,
        denied: Vec::new(),
    };
    sync.take_results(ops, outcome, now);
    // Sync's own creates reach it again through its watch.
    for (id, l) in &w.k8s {
        sync.k8s_upsert(*id, l.clone(), String::new(), now);
    }
}

/// At the end: every split found once, and at most one object per label set created
/// unless proposals were accepted or decisions taken (`decided`).
fn check_end(w: &World, sync: &SyncState, decided: bool) -> Result<(), TestCaseError> {
    // Every occurrence of a split found exactly once: none missed, none twice.
    let mut found: BTreeMap<u32, usize> = BTreeMap::new();
    for id in &w.splits_found {
        *found.entry(*id).or_default() += 1;
    }
    prop_assert_eq!(
        &found,
        &w.occurrences,
        "splits found vs splits that occurred"
    );
    prop_assert_eq!(sync.status.splits_found as usize, w.splits_found.len());
    // Of the objects sync created, at most one per label set exists (one deleted since
    // may have been followed by another, for a kvstore id still in use); an operator's
    // decision to create may make a second on purpose.
    if !decided {
        let mut per_labels: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (id, labels) in &w.created {
            per_labels.entry(labels.as_str()).or_default().push(*id);
        }
        for (labels, ids) in per_labels {
            prop_assert!(ids.len() <= 1, "{labels} exists at {ids:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// For any interleaving of kvstore and Kubernetes changes and write outcomes, sync
    /// never creates two objects for one label set, never writes a malformed entry or
    /// an id outside the range, and reports every split exactly once.
    #[test]
    fn any_interleaving_keeps_the_invariants(events in proptest::collection::vec(event(), 1..80)) {
        run(events, false)?;
    }

    /// With decisions present (skips, a create at a chosen id), the plan stays incremental
    /// and equal to the plan made in full with the decisions resumed, after any change.
    #[test]
    fn decisions_keep_the_plan_incremental_and_exact(events in proptest::collection::vec(event(), 1..80)) {
        let mut decisions = BTreeMap::new();
        let decide = |id: u32, l: usize, action, target| LoggedDecision {
            id: id.to_string(),
            labels: LABELS[l].to_string(),
            action,
            target_id: target,
        };
        decisions.insert("256".into(), decide(256, 0, Action::Skip, None));
        decisions.insert("257".into(), decide(257, 1, Action::Create, Some(261)));
        decisions.insert("258".into(), decide(258, 2, Action::Create, Some(258)));
        run_with(events, false, &decisions)?;
    }

    /// With every proposal accepted (duplicates are then created on purpose), writes stay
    /// well-formed and in range, and splits are still reported exactly once.
    #[test]
    fn accepting_proposals_keeps_writes_well_formed(events in proptest::collection::vec(event(), 1..80)) {
        run(events, true)?;
    }
}

#[test]
fn a_fresh_snapshot_keeps_what_was_reported_made_and_counted() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let mut old = SyncState::default();
    old.apply_kv_change(put("300", "k8s:app=a;"), t0);
    old.apply_kv_change(put("301", "k8s:app=b;"), t0);
    old.k8s_upsert(301, "k8s:app=z;".into(), String::new(), t0);
    let (ops, reports) = old.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(ops.len(), 1);
    assert_eq!(reports.len(), 1, "301's remap waits: {reports:?}");
    let done = BatchOutcome::Done {
        results: vec![(300, Outcome::Created)],
        halted: None,
        denied: Vec::new(),
    };
    old.take_results(ops, done, t0);
    old.k8s_upsert(300, "k8s:app=a;".into(), String::new(), t0);
    old.splits_to_report.clear();
    assert_eq!((old.status.mirrored, old.status.splits_found), (1, 1));

    // The same world read again, plus a split that began in the gap (302).
    let mut fresh = SyncState::default();
    for (id, l) in [
        ("300", "k8s:app=a;"),
        ("301", "k8s:app=b;"),
        ("302", "k8s:app=c;"),
    ] {
        fresh
            .masters
            .insert(id.as_bytes().to_vec(), l.as_bytes().to_vec());
    }
    fresh.k8s = old.k8s.clone();
    fresh.k8s.insert(302, "k8s:app=y;".into());
    (fresh.status.identities, fresh.status.kvstore_nodes) = (3, 4);
    old.status.identities = 2;
    fresh.carry_over(old, t0);
    assert_eq!(fresh.status.mirrored, 1, "the count goes on");
    assert_eq!(
        (fresh.status.identities, fresh.status.kvstore_nodes),
        (3, 4),
        "the world's sizes are the fresh read's"
    );
    assert!(fresh.created.contains(&300), "what sync made is remembered");
    assert_eq!(
        fresh
            .splits_to_report
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>(),
        [302],
        "only the new split is found"
    );
    assert_eq!((fresh.status.splits, fresh.status.splits_found), (2, 2));
    let (ops, reports) = fresh.round(&mut Decisions::default(), range, false, t0);
    assert!(ops.is_empty(), "{ops:?}");
    // 301 was reported before; 302's remap is new.
    let ids: Vec<String> = reports
        .iter()
        .map(|r| match r {
            SyncReport::Conflict { id, .. } | SyncReport::Invalid { id, .. } => id.clone(),
            SyncReport::Refused { decision, .. } => decision.id.clone(),
        })
        .collect();
    assert_eq!(ids, ["302"]);
}

#[test]
fn a_split_that_ends_and_comes_back_is_found_again() {
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    let put = |labels: &str| KvChange::Master {
        id: b"300".to_vec(),
        value: Some(labels.as_bytes().to_vec()),
        created: true,
    };
    let gone = KvChange::Master {
        id: b"300".to_vec(),
        value: None,
        created: false,
    };
    sync.apply_kv_change(put("k8s:app=a;"), t0);
    sync.k8s_upsert(300, "k8s:app=b;".into(), String::new(), t0);
    assert_eq!((sync.status.splits, sync.status.splits_found), (1, 1));
    // The kvstore's GC ends it; an agent allocating the id again starts a new one.
    sync.apply_kv_change(gone.clone(), t0);
    assert_eq!((sync.status.splits, sync.status.splits_found), (0, 1));
    assert_eq!(sync.status.removed_from_kvstore, 1);
    // A delete of what is gone already counts nothing.
    sync.apply_kv_change(gone.clone(), t0);
    assert_eq!(sync.status.removed_from_kvstore, 1);
    sync.apply_kv_change(put("k8s:app=c;"), t0);
    assert_eq!((sync.status.splits, sync.status.splits_found), (1, 2));
    // The object deleted ends it too; a new one with other labels is a third.
    sync.k8s_delete(300, String::new(), t0);
    assert_eq!(sync.status.splits, 0);
    sync.k8s_upsert(300, "k8s:app=d;".into(), String::new(), t0);
    assert_eq!((sync.status.splits, sync.status.splits_found), (1, 3));
    let found: Vec<u32> = sync.splits_to_report.iter().map(|(id, _)| *id).collect();
    assert_eq!(found, [300, 300, 300]);
}

#[test]
fn a_decided_create_already_made_by_someone_else_counts_as_served_there() {
    // 300 = A is a remap (Kubernetes holds 300 for B), decided to 5000; A is at 5000 now,
    // created by no outcome this sync logged (another sync, or one cut off by a crash).
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    sync.apply_kv_change(
        KvChange::Master {
            id: b"300".to_vec(),
            value: Some(b"k8s:app=a;".to_vec()),
            created: true,
        },
        t0,
    );
    sync.k8s.insert(300, "k8s:app=b;".into());
    sync.k8s.insert(5000, "k8s:app=a;".into());
    let decisions: BTreeMap<String, LoggedDecision> = [(
        "300".to_string(),
        LoggedDecision {
            id: "300".into(),
            labels: "k8s:app=a;".into(),
            action: Action::Create,
            target_id: Some(5000),
        },
    )]
    .into();
    let (ops, _) = sync.round(&mut Decisions::new(decisions), range, false, t0);
    assert!(ops.is_empty(), "nothing to write: {ops:?}");
    assert_eq!(sync.reused.get("300"), Some(&5000));
}

#[test]
fn a_failed_batch_is_retried_after_its_wait_and_counted() {
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    let put = KvChange::Master {
        id: b"300".to_vec(),
        value: Some(b"k8s:app=a;".to_vec()),
        created: true,
    };
    sync.apply_kv_change(put, t0);
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(ops.len(), 1);
    let taken = sync.take_results(ops, BatchOutcome::Failed("log full".into()), t0);
    assert_eq!((taken.failures, sync.status.failures), (1, 1));
    assert!(taken.trouble.unwrap().contains("log full"));
    assert_eq!(sync.unwritten_now(), 1);
    // Not before its wait is over; then again.
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        range,
        false,
        t0 + Duration::from_secs(1),
    );
    assert!(ops.is_empty());
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0 + RETRY_AFTER);
    assert_eq!(ops.len(), 1);
    let done = BatchOutcome::Done {
        results: vec![(300, Outcome::Created)],
        halted: None,
        denied: Vec::new(),
    };
    let taken = sync.take_results(ops, done, t0 + RETRY_AFTER);
    assert_eq!(taken.mirrored, 1);
    assert_eq!(taken.lags, vec![RETRY_AFTER]);
    assert_eq!(sync.unwritten_now(), 0);
}

#[test]
fn every_change_keeps_the_plan_up_to_date() {
    let range = IdRange::for_cluster(0).unwrap();
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    let put = |id: u32, labels: &str| KvChange::Master {
        id: id.to_string().into_bytes(),
        value: Some(labels.as_bytes().to_vec()),
        created: true,
    };
    let kind_of = |sync: &SyncState, id: &str| {
        sync.planned_items()
            .into_iter()
            .find(|i| i.id == id)
            .map(|i| (i.kind, i.target_id))
    };
    sync.apply_kv_change(put(300, "k8s:app=a;"), t0);
    sync.round(&mut Decisions::default(), range, false, t0);
    // New labels at a new id, and the object sync creates for them.
    sync.apply_kv_change(put(301, "k8s:app=b;"), t0);
    sync.k8s_upsert(300, "k8s:app=a;".into(), String::new(), t0);
    assert!(sync.cache.is_some(), "changes keep the plan");
    let (ops, _) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(
        ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
        [Some(301)]
    );
    // Labels another identity holds: a duplicate, and the plan still kept.
    sync.apply_kv_change(put(302, "k8s:app=b;"), t0);
    assert!(sync.cache.is_some(), "a duplicate keeps the plan");
    // The plan holds the change at once, before the next round: what waits for a decision
    // is found in it (the plan was empty here while a change that moved other items waited
    // for a round to plan in full).
    assert_eq!(sync.planned_items().len(), 3);
    assert_eq!(kind_of(&sync, "302"), Some((Kind::Duplicate, Some(302))));
    sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(kind_of(&sync, "302"), Some((Kind::Duplicate, Some(302))));
    // An agent's object at a kvstore id with other labels: a split, its identity mapped to
    // the other kvstore id that holds its labels.
    sync.k8s_upsert(301, "k8s:app=z;".into(), String::new(), t0);
    assert!(sync.cache.is_some());
    sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(kind_of(&sync, "301"), Some((Kind::Reuse, Some(302))));
}

#[test]
fn a_key_event_is_a_change_only_where_it_changes_what_sync_follows() {
    let p = "cilium/state/identities/v1/";
    let master = |value: Option<&[u8]>, created| {
        kv_change(
            p,
            b"cilium/state/identities/v1/id/300",
            (value, None),
            created,
        )
    };
    let at_300 = |value: Option<&[u8]>, created| {
        Some(KvChange::Master {
            id: b"300".to_vec(),
            value: value.map(<[u8]>::to_vec),
            created,
        })
    };
    assert_eq!(
        master(Some(b"k8s:app=a;"), true),
        at_300(Some(b"k8s:app=a;"), true)
    );
    // A rewrite of a master key is a change (its labels may differ), not a creation.
    assert_eq!(
        master(Some(b"k8s:app=b;"), false),
        at_300(Some(b"k8s:app=b;"), false)
    );
    // A delete never counts as a creation, whatever the event's flag says.
    assert_eq!(master(None, true), at_300(None, false));
    let slave = |value: Option<&[u8]>, created| {
        kv_change(
            p,
            b"cilium/state/identities/v1/value/k8s:app=a;/10.0.0.1",
            (value, None),
            created,
        )
    };
    let used = |present, id: Option<&[u8]>| {
        Some(KvChange::Slave {
            label_key: b"k8s:app=a;".to_vec(),
            node: b"10.0.0.1".to_vec(),
            present,
            id: id.map(<[u8]>::to_vec),
        })
    };
    assert_eq!(slave(Some(b"300"), true), used(true, Some(b"300")));
    assert_eq!(slave(None, false), used(false, None));
    assert_eq!(slave(None, true), used(false, None));
    // A delete names the id the key held where the watch says (etcd's previous value).
    let deleted = kv_change(
        p,
        b"cilium/state/identities/v1/value/k8s:app=a;/10.0.0.1",
        (None, Some(b"300")),
        false,
    );
    assert_eq!(deleted, used(false, Some(b"300")));
    // A node rewriting its own `value/` key (a lease renewal, a periodic sync) changes
    // nobody's use.
    assert_eq!(slave(Some(b"300"), false), None);
    assert_eq!(
        kv_change(
            p,
            b"cilium/state/identities/v1/locks/x",
            (None, None),
            false
        ),
        None
    );
    assert_eq!(
        kv_change(p, b"elsewhere/id/300", (Some(b"x"), None), true),
        None
    );
}

#[test]
fn the_status_line_says_each_part_only_when_it_holds() {
    let mut st = SyncStatus {
        kvstore_nodes: 2,
        identities: 10,
        mirrored: 7,
        pending: 1,
        splits: 3,
        failures: 4,
        lag_last: Some(Duration::from_millis(12)),
        lag_p50: Some(Duration::from_millis(10)),
        lag_p99: None,
        watching: true,
        ..Default::default()
    };
    assert_eq!(
        st.to_string(),
        "sync: 2 kvstore-mode nodes · 10 identities · 7 mirrored · 1 pending · 3 split · 4 failed · lag last 12ms p50 10ms p99 -"
    );
    st.watching = false;
    st.decision_wait_last = Some(Duration::from_millis(1500));
    st.cutover_wait = Some(CutoverWait::Nodes(2));
    st.reservations = 1;
    st.standby = Some("sync-b".into());
    assert_eq!(
        st.to_string(),
        "sync: 2 kvstore-mode nodes · 10 identities · 7 mirrored · 1 pending · 3 split · 4 failed · lag last 12ms p50 10ms p99 - · catching up · decision wait last 1500ms (not lag) · cutover waits for 2 kvstore-mode nodes to move · 1 reserved in the kvstore · standby: sync-b holds the lease"
    );
}

#[test]
fn the_overlay_is_touched_by_what_its_decisions_name_and_nothing_else() {
    let item = |id: &str, labels: &str, target| PlanItem {
        id: id.into(),
        labels: labels.into(),
        kind: Kind::Remap,
        action: Action::Create,
        target_id: target,
        existing_labels: None,
        labels_present_at: None,
        nodes: 1,
        reason: "".into(),
        decided: false,
    };
    let live = [item("300", "k8s:app=a;", Some(300))];
    let mut resumed = live.to_vec();
    resumed[0].target_id = Some(700);
    resumed[0].decided = true;
    let decisions = BTreeMap::from([(
        "300".to_string(),
        LoggedDecision {
            id: "300".into(),
            labels: "k8s:app=a;".into(),
            action: Action::Create,
            target_id: Some(700),
        },
    )]);
    let o = Overlay::of(&live, resumed, &decisions);
    assert!(o.touched(Some(300), None), "the kvstore id");
    assert!(o.touched(Some(700), None), "the decided target");
    assert!(o.touched(None, Some(b"k8s:app=a;")), "the labels");
    assert!(
        o.touched(Some(301), Some(b"k8s:app=a;")),
        "the labels, any id"
    );
    assert!(!o.touched(Some(301), Some(b"k8s:app=b;")));
    assert!(!o.touched(Some(301), None));
    assert!(!o.touched(None, Some(b"k8s:app=b;")));
    assert!(!o.touched(None, None));
    assert!(!o.touched(None, Some(b"\xff")));
}

#[test]
fn a_state_from_a_snapshot_holds_its_identities_uses_and_revision() {
    let mut counts = NodeCounts::default();
    counts.add_key(b"k8s:app=a;", b"node-1", b"300");
    let snap = KvSnapshot {
        source: crate::core::kvstore::SourceInfo {
            revision: 42,
            ..Default::default()
        },
        masters: vec![MasterEntry::new("300", "k8s:app=a;")],
        node_counts: counts.clone(),
    };
    let sync = SyncState::from_snapshot(snap);
    assert_eq!(
        sync.masters,
        BTreeMap::from([(b"300".to_vec(), b"k8s:app=a;".to_vec())])
    );
    assert_eq!(sync.counts, counts);
    assert_eq!(sync.kv_revision, 42);
    // The screens have not seen these counts yet.
    assert!(sync.counts_changed);
}

#[test]
fn unwritten_counts_a_failed_create_only_while_it_is_missing_and_wanted() {
    let mut sync = SyncState::default();
    for id in ["300", "301", "302"] {
        sync.unwritten.insert(id.parse().unwrap(), id.into());
    }
    sync.masters.insert(b"300".to_vec(), b"k8s:app=a;".to_vec());
    sync.masters.insert(b"301".to_vec(), b"k8s:app=b;".to_vec());
    // 301's object was made since; 302's identity left the kvstore.
    sync.k8s.insert(301, "k8s:app=b;".into());
    assert_eq!(sync.unwritten_now(), 1);
}

#[test]
fn a_mapping_whose_target_holds_its_labels_is_never_moot() {
    let mut sync = SyncState::default();
    sync.masters.insert(b"301".to_vec(), b"k8s:app=r;".to_vec());
    sync.reused.insert("301".into(), 300);
    // No node uses `r`, but the object at 300 serves it: nothing left to close.
    sync.k8s.insert(300, "k8s:app=r;".into());
    assert!(sync.moot_now().is_empty());
    // Held for other labels, the mapping is moot.
    sync.k8s.insert(300, "k8s:app=x;".into());
    let moot: Vec<(String, Kind)> = sync
        .moot_now()
        .into_iter()
        .map(|(id, _, kind)| (id, kind))
        .collect();
    assert_eq!(moot, [("301".into(), Kind::Reuse)]);
}

#[test]
fn each_conflict_waiting_for_a_decision_counts_as_pending() {
    let range = IdRange::for_cluster(0).unwrap();
    let t0 = Instant::now();
    let mut sync = following(&[300, 301, 302], t0);
    // Kubernetes holds 300 and 301 for other labels: two remaps wait.
    sync.k8s_upsert(300, "k8s:app=x;".into(), "1".into(), t0);
    sync.k8s_upsert(301, "k8s:app=y;".into(), "2".into(), t0);
    let (ops, reports) = sync.round(&mut Decisions::default(), range, false, t0);
    assert_eq!(ops.len(), 1, "302 is a plain create");
    assert_eq!(reports.len(), 2);
    assert_eq!(sync.status.pending, 2);
}

#[test]
fn lag_percentiles_cover_the_last_ten_thousand_creates() {
    let mut sync = SyncState::default();
    for ms in 0..10_001 {
        sync.record_lag(Duration::from_millis(ms));
    }
    assert_eq!(sync.lags.len(), 10_000);
    assert_eq!(sync.lags.front(), Some(&Duration::from_millis(1)));
    assert_eq!(sync.status.lag_last, Some(Duration::from_millis(10_000)));
}

#[test]
fn a_relist_ends_the_splits_of_objects_gone_meanwhile_and_finds_new_ones() {
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    for (id, labels) in [("300", "k8s:app=a;"), ("301", "k8s:app=b;")] {
        sync.apply_kv_change(
            KvChange::Master {
                id: id.as_bytes().to_vec(),
                value: Some(labels.as_bytes().to_vec()),
                created: true,
            },
            t0,
        );
    }
    sync.k8s_upsert(300, "k8s:app=x;".into(), "1".into(), t0);
    assert_eq!(sync.status.splits, 1);
    // While the watch was gone, 300's object was deleted and an agent took 301.
    sync.k8s_relisted(
        BTreeMap::from([(301, "k8s:app=y;".to_string())]),
        "9".into(),
        t0,
    );
    assert_eq!(sync.splits, HashSet::from_iter([301]));
    assert_eq!((sync.status.splits, sync.status.splits_found), (1, 2));
    assert_eq!(sync.k8s_version, "9");
}

#[test]
fn a_kept_plan_is_kept_only_for_the_range_it_was_made_for() {
    let mut sync = SyncState::default();
    let t0 = Instant::now();
    sync.apply_kv_change(
        KvChange::Master {
            id: b"300".to_vec(),
            value: Some(b"k8s:app=a;".to_vec()),
            created: true,
        },
        t0,
    );
    let narrow = IdRange { min: 256, max: 299 };
    let (ops, reports) = sync.round(&mut Decisions::default(), narrow, false, t0);
    assert!(ops.is_empty());
    assert!(matches!(&reports[..], [SyncReport::Invalid { id, .. }] if id == "300"));
    let (ops, _) = sync.round(
        &mut Decisions::default(),
        IdRange::for_cluster(0).unwrap(),
        false,
        t0,
    );
    assert_eq!(
        ops.iter().map(|o| o.target_id).collect::<Vec<_>>(),
        [Some(300)]
    );
}

#[test]
fn reused_names_the_ids_served_at_another_id_that_holds_their_labels() {
    let item = |id: &str, labels: &str, action, target| PlanItem {
        id: id.into(),
        labels: labels.into(),
        kind: Kind::Remap,
        action,
        target_id: Some(target),
        existing_labels: None,
        labels_present_at: None,
        nodes: 1,
        reason: "".into(),
        decided: true,
    };
    let mut sync = SyncState::default();
    sync.k8s.insert(5000, "k8s:app=a;".into());
    sync.k8s.insert(5001, "k8s:app=other;".into());
    let items = [
        // Mapped to where its labels are.
        item("300", "k8s:app=m;", Action::None, 6000),
        // A create made already, by someone: served there.
        item("301", "k8s:app=a;", Action::Create, 5000),
        // A create whose target holds other labels, or nothing yet: not served.
        item("302", "k8s:app=b;", Action::Create, 5001),
        item("303", "k8s:app=c;", Action::Create, 6001),
        // Served at its own id: not "another" id.
        item("5000", "k8s:app=a;", Action::None, 5000),
        // Skipped by the operator; a skip proposed and not decided is not counted.
        item("304", "k8s:app=d;", Action::Skip, 6002),
        PlanItem {
            decided: false,
            ..item("305", "k8s:app=e;", Action::Skip, 6003)
        },
    ];
    sync.publish(items.iter());
    assert_eq!(sync.skipped, 1);
    assert_eq!(
        sync.reused,
        BTreeMap::from([("300".to_string(), 6000), ("301".to_string(), 5000)])
    );
    assert_eq!(sync.status.identities, 7);
}

fn following(ids: &[u32], t0: Instant) -> SyncState {
    let mut sync = SyncState::default();
    for id in ids {
        let labels = format!("k8s:app=a{id};");
        sync.apply_kv_change(
            KvChange::Master {
                id: id.to_string().into_bytes(),
                value: Some(labels.clone().into_bytes()),
                created: true,
            },
            t0,
        );
        sync.apply_kv_change(
            KvChange::Slave {
                label_key: labels.into_bytes(),
                node: b"node-1".to_vec(),
                present: true,
                id: None,
            },
            t0,
        );
    }
    sync
}

mod made_again;
mod moot_and_waits;
