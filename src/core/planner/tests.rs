//! Unit and property tests of the planner and of decision reconciliation.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use super::*;
use crate::core::kvstore::MasterEntry;
use crate::core::labels::parse_label_key;
use crate::core::range::IdRange;

/// A Kubernetes-side label set, as the planner sees it: a canonical label key.
fn sl(key: &str) -> String {
    assert!(parse_label_key(key).is_ok(), "{key}");
    key.to_string()
}

fn range0() -> IdRange {
    IdRange::for_cluster(0).unwrap()
}

fn by_id<'a>(items: &'a [PlanItem], id: &str) -> &'a PlanItem {
    items.iter().find(|i| i.id == id).unwrap()
}

const A: &str = "k8s:app=a;k8s:io.kubernetes.pod.namespace=ns;";
const B: &str = "k8s:app=b;k8s:io.kubernetes.pod.namespace=ns;";
const C: &str = "k8s:app=c;k8s:io.kubernetes.pod.namespace=ns;";

#[test]
fn every_kind_is_classified() {
    let masters = vec![
        MasterEntry::new("300", A),            // already migrated
        MasterEntry::new("301", B),            // create
        MasterEntry::new("302", C),            // remap: 302 taken by other labels
        MasterEntry::new("303", A),            // reuse: 303 taken, A present at 300
        MasterEntry::new("304", "k8s:app=d;"), // duplicate: d present at 500 in k8s
        MasterEntry::new("abc", A),            // invalid id
        MasterEntry::new("5", A),              // reserved id
        MasterEntry::new("305", "garbage"),    // invalid labels
        MasterEntry::new("306", ""),           // empty labels
    ];
    let mut k8s = BTreeMap::new();
    k8s.insert(300, sl(A));
    k8s.insert(302, sl("k8s:app=other;"));
    k8s.insert(303, sl("k8s:app=other2;"));
    k8s.insert(500, sl("k8s:app=d;"));
    let mut nodes = HashMap::new();
    nodes.insert(B.as_bytes().to_vec(), 7);
    let items = plan(&masters, &nodes, &k8s, range0());
    assert_eq!(items.len(), masters.len());
    assert_eq!(by_id(&items, "300").kind, Kind::AlreadyMigrated);
    assert_eq!(by_id(&items, "300").action, Action::None);
    let b = by_id(&items, "301");
    assert_eq!(
        (b.kind, b.action, b.target_id, b.nodes),
        (Kind::Create, Action::Create, Some(301), 7)
    );
    let c = by_id(&items, "302");
    assert_eq!((c.kind, c.action), (Kind::Remap, Action::Create));
    assert_eq!(c.target_id, Some(256), "lowest id free on both sides");
    assert_eq!(c.existing_labels.as_deref(), Some("k8s:app=other;"));
    assert!(
        c.reason.contains("CRD mode"),
        "remap explains the transition risk"
    );
    let r = by_id(&items, "303");
    assert_eq!(
        (r.kind, r.action, r.target_id),
        (Kind::Reuse, Action::None, Some(300))
    );
    assert!(r.reason.contains("CRD mode"));
    let d = by_id(&items, "304");
    assert_eq!(
        (d.kind, d.action, d.target_id, d.labels_present_at),
        (Kind::Duplicate, Action::Create, Some(304), Some(500))
    );
    for bad in ["abc", "5", "305", "306"] {
        let i = by_id(&items, bad);
        assert_eq!(
            (i.kind, i.action, i.target_id),
            (Kind::Invalid, Action::Skip, None),
            "{bad}"
        );
        assert!(!i.reason.is_empty());
    }
    // Why each is invalid, worked out from the entry when its item is made.
    let why = |id: &str| by_id(&items, id).reason.to_string();
    assert!(why("abc").starts_with("invalid id: "), "{}", why("abc"));
    assert!(why("abc").len() > "invalid id: ; never written".len());
    assert!(why("305").starts_with("invalid labels: "), "{}", why("305"));
    assert!(why("306").starts_with("invalid labels: "), "{}", why("306"));
    assert!(
        why("5").contains("outside the allocation range"),
        "{}",
        why("5")
    );
    let s = summarize(&items);
    assert_eq!(s[&Kind::Invalid], 4);
    assert_eq!(s[&Kind::Create], 1);
}

#[test]
fn same_labels_under_two_kvstore_ids_is_a_duplicate_of_the_lowest() {
    let masters = vec![MasterEntry::new("400", A), MasterEntry::new("401", A)];
    let items = plan(&masters, &HashMap::new(), &BTreeMap::new(), range0());
    assert_eq!(by_id(&items, "400").kind, Kind::Create);
    let d = by_id(&items, "401");
    assert_eq!((d.kind, d.labels_present_at), (Kind::Duplicate, Some(400)));
    // The operator reading the conflict learns what Cilium does with the two objects.
    for said in ["oldest object", "io.cilium.heartbeat", "GC"] {
        assert!(d.reason.contains(said), "{said}: {}", d.reason);
    }
}

#[test]
fn remap_avoids_kvstore_ids_and_earlier_proposals() {
    // 256 is a kvstore id, 257 is used in Kubernetes: two remaps get 258 and 259.
    let masters = vec![
        MasterEntry::new("256", "k8s:app=x;"),
        MasterEntry::new("600", A),
        MasterEntry::new("601", B),
    ];
    let mut k8s = BTreeMap::new();
    k8s.insert(257, sl("k8s:app=y;"));
    k8s.insert(600, sl("k8s:app=o1;"));
    k8s.insert(601, sl("k8s:app=o2;"));
    let items = plan(&masters, &HashMap::new(), &k8s, range0());
    assert_eq!(by_id(&items, "600").target_id, Some(258));
    assert_eq!(by_id(&items, "601").target_id, Some(259));
}

#[test]
fn a_proposal_on_a_target_a_kept_decision_holds_moves_to_the_next_free_id() {
    // The fresh plan proposes 258, 259, 260 for 600, 601, 602; but 600 was decided to 259
    // before the rescan, which the plan did not know. 601 moves off 259 to the lowest id
    // nothing takes (258, which 600 no longer uses); 602 keeps 260.
    let masters = vec![
        MasterEntry::new("600", A),
        MasterEntry::new("601", B),
        MasterEntry::new("602", C),
    ];
    let mut k8s = BTreeMap::new();
    k8s.insert(256, sl("k8s:app=y;"));
    k8s.insert(257, sl("k8s:app=z;"));
    for (id, l) in [
        (600, "k8s:app=o1;"),
        (601, "k8s:app=o2;"),
        (602, "k8s:app=o3;"),
    ] {
        k8s.insert(id, sl(l));
    }
    let mut items = plan(&masters, &HashMap::new(), &k8s, range0());
    let decided = items.iter_mut().find(|i| i.id == "600").unwrap();
    decided.target_id = Some(259);
    decided.decided = true;
    assert_eq!(
        by_id(&items, "601").target_id,
        Some(259),
        "as the rescan proposes it"
    );
    repropose_taken_targets(&mut items, &k8s, range0());
    assert_eq!(
        by_id(&items, "600").target_id,
        Some(259),
        "a decision stays"
    );
    assert_eq!(by_id(&items, "601").target_id, Some(258));
    assert!(by_id(&items, "601").reason.contains("at 258"));
    assert_eq!(by_id(&items, "602").target_id, Some(260));
    let targets: BTreeSet<u32> = items.iter().filter_map(|i| i.target_id).collect();
    assert_eq!(targets.len(), 3, "one target per remap");
}

#[test]
fn second_remap_of_same_labels_reuses_the_first() {
    let masters = vec![MasterEntry::new("600", A), MasterEntry::new("601", A)];
    let mut k8s = BTreeMap::new();
    k8s.insert(600, sl("k8s:app=o1;"));
    k8s.insert(601, sl("k8s:app=o2;"));
    let items = plan(&masters, &HashMap::new(), &k8s, range0());
    assert_eq!(by_id(&items, "600").kind, Kind::Remap);
    let r = by_id(&items, "601");
    assert_eq!((r.kind, r.target_id), (Kind::Reuse, Some(256)));
    // And that mapping is accepted by reconcile because the plan creates it.
    let ok = reconcile(&items, &items, &k8s, range0(), true).unwrap();
    assert_eq!(ok.ops.iter().filter(|o| o.op == OpKind::Create).count(), 1);
    assert_eq!(ok.ops.iter().filter(|o| o.op == OpKind::Map).count(), 1);
}

#[test]
fn full_range_leaves_remap_invalid() {
    let range = IdRange { min: 256, max: 257 };
    let masters = vec![MasterEntry::new("256", A)];
    let mut k8s = BTreeMap::new();
    k8s.insert(256, sl(B));
    k8s.insert(257, sl(C));
    let items = plan(&masters, &HashMap::new(), &k8s, range);
    assert_eq!(items[0].kind, Kind::Invalid);
    assert!(items[0].reason.contains("no id"));
}

#[test]
fn cluster_range_applies() {
    let range = IdRange::for_cluster(1).unwrap();
    let masters = vec![MasterEntry::new("300", A), MasterEntry::new("65536", B)];
    let items = plan(&masters, &HashMap::new(), &BTreeMap::new(), range);
    assert_eq!(by_id(&items, "300").kind, Kind::Invalid);
    assert_eq!(by_id(&items, "65536").kind, Kind::Create);
}

fn sample() -> (Vec<MasterEntry>, BTreeMap<u32, String>) {
    let masters = vec![
        MasterEntry::new("300", A),
        MasterEntry::new("301", B),
        MasterEntry::new("302", C),
        MasterEntry::new("303", "k8s:app=d;"),
        MasterEntry::new("x", A),
    ];
    let mut k8s = BTreeMap::new();
    k8s.insert(300, sl(A));
    k8s.insert(302, sl("k8s:app=other;"));
    k8s.insert(900, sl("k8s:app=d;"));
    (masters, k8s)
}

#[test]
fn reconcile_requires_decisions_for_remap_and_duplicate() {
    let (m, k8s) = sample();
    let items = plan(&m, &HashMap::new(), &k8s, range0());
    let errs = reconcile(&items, &items, &k8s, range0(), false).unwrap_err();
    let ids: BTreeSet<&str> = errs.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, BTreeSet::from(["302", "303"]));
    assert!(errs[0].reason.contains("--accept-proposals"));
    let ok = reconcile(&items, &items, &k8s, range0(), true).unwrap();
    let kinds: Vec<OpKind> = ok.ops.iter().map(|o| o.op).collect();
    assert_eq!(
        kinds,
        vec![
            OpKind::AlreadyDone,
            OpKind::Create,
            OpKind::Create,
            OpKind::Create,
            OpKind::Skip
        ]
    );
    assert_eq!(ok.ops[2].decided_by, super::DecidedBy::AcceptProposals);
    // Marking them decided in the plan file works too.
    let mut decided = items.clone();
    for d in &mut decided {
        d.decided = true;
    }
    assert!(reconcile(&decided, &items, &k8s, range0(), false).is_ok());
}

#[test]
fn reconcile_refuses_bad_edits_naming_the_item() {
    let (m, k8s) = sample();
    let live = plan(&m, &HashMap::new(), &k8s, range0());
    type Edit = Box<dyn Fn(&mut PlanItem)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("302", Box::new(|i| i.target_id = Some(70000)), "outside"),
        (
            "302",
            Box::new(|i| i.target_id = Some(301)),
            "another kvstore identity",
        ),
        (
            "302",
            Box::new(|i| i.target_id = Some(900)),
            "taken in Kubernetes",
        ),
        // A plain create moved off its own free id, a duplicate moved, an identity
        // Kubernetes already holds at its own id created a second time elsewhere.
        (
            "301",
            Box::new(|i| i.target_id = Some(6000)),
            "only a remap",
        ),
        (
            "303",
            Box::new(|i| i.target_id = Some(6000)),
            "only a remap",
        ),
        (
            "300",
            Box::new(|i| {
                i.action = Action::Create;
                i.target_id = Some(6000)
            }),
            "Kubernetes already holds these labels there",
        ),
        // A kind is found, not chosen.
        (
            "301",
            Box::new(|i| i.kind = Kind::Remap),
            "put the kind back",
        ),
        (
            "303",
            Box::new(|i| i.kind = Kind::Create),
            "put the kind back",
        ),
        (
            "301",
            Box::new(|i| i.labels = "k8s:app=zz;".into()),
            "differ",
        ),
        (
            "x",
            Box::new(|i| i.action = Action::Create),
            "never written",
        ),
        (
            "301",
            Box::new(|i| i.action = Action::None),
            "does not hold",
        ),
        (
            "301",
            Box::new(|i| {
                i.action = Action::None;
                i.target_id = Some(900)
            }),
            "does not hold these labels",
        ),
    ];
    for (id, edit, expect) in cases {
        let mut saved = live.clone();
        for s in &mut saved {
            s.decided = true;
        }
        edit(saved.iter_mut().find(|i| i.id == id).unwrap());
        let errs = reconcile(&saved, &live, &k8s, range0(), false).unwrap_err();
        assert!(
            errs.iter().any(|e| e.id == id && e.reason.contains(expect)),
            "{id}: expected {expect:?} in {errs:?}"
        );
    }
    // Two creates on one id (two remaps: 301's id taken too).
    let mut k8s = k8s;
    k8s.insert(301, sl("k8s:app=another;"));
    let live = plan(&m, &HashMap::new(), &k8s, range0());
    let mut saved = live.clone();
    for s in &mut saved {
        s.decided = true;
    }
    saved.iter_mut().find(|i| i.id == "301").unwrap().target_id = Some(5000);
    saved.iter_mut().find(|i| i.id == "302").unwrap().target_id = Some(5000);
    let errs = reconcile(&saved, &live, &k8s, range0(), false).unwrap_err();
    assert!(
        errs.iter()
            .filter(|e| e.reason.contains("more than one create"))
            .count()
            == 2
    );
}

#[test]
fn reconcile_treats_already_written_creates_as_done_and_tracks_drift() {
    let (m, mut k8s) = sample();
    let saved = plan(&m, &HashMap::new(), &k8s, range0());
    k8s.insert(301, sl(B)); // written by an earlier, interrupted apply
    let mut live_masters = m.clone();
    live_masters.push(MasterEntry::new("777", "k8s:app=new;"));
    live_masters.retain(|e| e.id != b"x");
    let live = plan(&live_masters, &HashMap::new(), &k8s, range0());
    let ok = reconcile(&saved, &live, &k8s, range0(), true).unwrap();
    let op = ok.ops.iter().find(|o| o.id == "301").unwrap();
    assert_eq!(op.op, OpKind::AlreadyDone);
    assert_eq!(ok.not_in_plan, vec!["777".to_string()]);
    assert_eq!(ok.gone_from_kvstore, vec!["x".to_string()]);
}

// ---- property tests -------------------------------------------------------------------

fn label_strategy() -> impl Strategy<Value = String> {
    (0u8..6).prop_map(|n| format!("k8s:app=l{n};k8s:io.kubernetes.pod.namespace=ns;"))
}

prop_compose! {
    fn world()(
        kv in proptest::collection::btree_map(250u32..330, label_strategy(), 0..40),
        bad in proptest::collection::vec(("[a-z0-9+-]{0,4}", "[a-z:=;]{0,6}"), 0..4),
        k8s in proptest::collection::btree_map(250u32..330, label_strategy(), 0..40),
    ) -> (Vec<MasterEntry>, BTreeMap<u32, String>) {
        let mut masters: Vec<MasterEntry> = kv.iter().map(|(id, l)| MasterEntry::new(id.to_string(), l.as_str())).collect();
        for (id, l) in bad {
            if !masters.iter().any(|m| m.id == id.as_bytes()) {
                masters.push(MasterEntry::new(id, l));
            }
        }
        let k8s = k8s.into_iter().map(|(id, l)| (id, sl(&l))).collect();
        (masters, k8s)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn plan_invariants((masters, k8s) in world()) {
        let range = IdRange { min: 256, max: 400 };
        let items = plan(&masters, &HashMap::new(), &k8s, range);
        // Moving the label keys instead of copying them plans and reconciles exactly the same.
        prop_assert_eq!(&plan_taking(masters.clone(), &HashMap::new(), &k8s, range), &items);
        // And the live plan deciding for itself (no index by id) as the same plan given.
        let whole = |r: Reconciled| (r.ops, r.not_in_plan, r.gone_from_kvstore);
        let copied = reconcile(&items, &items, &k8s, range, true).map(whole);
        let moved = reconcile_taking(None, items.clone(), &k8s, range, true).map(whole);
        prop_assert_eq!(copied, moved);
        // Every kvstore identity appears exactly once.
        prop_assert_eq!(items.len(), masters.len());
        let ids: BTreeSet<&str> = items.iter().map(|i| i.id.as_str()).collect();
        prop_assert_eq!(ids.len(), masters.len());
        let kv_ids: BTreeSet<u32> = items.iter().filter_map(|i| i.numeric_id()).collect();
        let mut create_targets = BTreeSet::new();
        for i in &items {
            if i.action == Action::Create {
                let t = i.target_id.unwrap();
                // No two creates share an id.
                prop_assert!(create_targets.insert(t), "two creates at {}", t);
                // No create targets an id Kubernetes already uses.
                prop_assert!(!k8s.contains_key(&t));
                // Every target is in range.
                prop_assert!(range.contains(t));
                if i.kind == Kind::Remap {
                    // A new id is free on both sides.
                    prop_assert!(!kv_ids.contains(&t));
                }
            }
            if i.kind == Kind::Invalid {
                prop_assert_eq!(i.action, Action::Skip);
            }
            if i.kind == Kind::AlreadyMigrated {
                let id = i.numeric_id().unwrap();
                prop_assert_eq!(k8s.get(&id), Some(&sl(&i.labels)));
            }
        }
        // Remaps take the lowest free ids, in order.
        let remaps: Vec<u32> = items.iter().filter(|i| i.kind == Kind::Remap).map(|i| i.target_id.unwrap()).collect();
        let mut expected = Vec::new();
        let mut n = range.min;
        while expected.len() < remaps.len() {
            if !k8s.contains_key(&n) && !kv_ids.contains(&n) {
                expected.push(n);
            }
            n += 1;
        }
        prop_assert_eq!(remaps, expected);
        // Deterministic, whatever the input order.
        let mut rev = masters.clone();
        rev.reverse();
        prop_assert_eq!(plan(&rev, &HashMap::new(), &k8s, range), items.clone());
        // Accepting every proposal always reconciles.
        prop_assert!(reconcile(&items, &items, &k8s, range, true).is_ok());
    }
}

#[test]
fn only_creates_and_deletes_send_a_write() {
    let writes: Vec<OpKind> = [
        OpKind::Create,
        OpKind::AlreadyDone,
        OpKind::Map,
        OpKind::Skip,
        OpKind::Delete,
        OpKind::Keep,
    ]
    .into_iter()
    .filter(|k| k.writes())
    .collect();
    assert_eq!(writes, [OpKind::Create, OpKind::Delete]);
}

#[test]
fn a_refused_item_names_itself_and_why() {
    let e = reconcile::ReconcileError {
        id: "300".into(),
        reason: "target 400 is taken".into(),
    };
    assert_eq!(e.to_string(), "item 300: target 400 is taken");
}

#[test]
fn a_new_target_another_create_claims_is_refused_and_ones_own_is_not() {
    let (m, mut k8s) = sample();
    k8s.insert(301, sl("k8s:app=another;")); // 301 a remap too
    let mut items = plan(&m, &HashMap::new(), &k8s, range0());
    let at = |items: &[PlanItem], id: &str| items.iter().position(|i| i.id == id).unwrap();
    let (i301, i302) = (at(&items, "301"), at(&items, "302"));
    assert!(validate_new_target(&items, i301, 5000, &k8s, range0()).is_ok());
    items[i302].target_id = Some(5000);
    let err = validate_new_target(&items, i301, 5000, &k8s, range0()).unwrap_err();
    assert!(err.contains("already the target of identity 302"), "{err}");
    // Its own target is not another's.
    assert!(validate_new_target(&items, i302, 5000, &k8s, range0()).is_ok());
    // No id but a remap's moves: 303 (a duplicate, its own id free) stays at 303.
    let i303 = at(&items, "303");
    let err = validate_new_target(&items, i303, 6000, &k8s, range0()).unwrap_err();
    assert!(err.contains("only a remap"), "{err}");
    assert!(validate_new_target(&items, i303, 303, &k8s, range0()).is_ok());
}

#[test]
fn a_proposal_moved_off_a_taken_target_with_no_free_id_left_is_no_remap() {
    // Range 256..=258: Kubernetes holds 256 and 257 for other labels; 256's remap is
    // proposed at 258, which 257 was decided to before the rescan.
    let range = IdRange { min: 256, max: 258 };
    let masters = vec![MasterEntry::new("256", A), MasterEntry::new("257", B)];
    let mut k8s = BTreeMap::new();
    k8s.insert(256, sl("k8s:app=x;"));
    k8s.insert(257, sl("k8s:app=y;"));
    let mut items = plan(&masters, &HashMap::new(), &k8s, range);
    assert_eq!(by_id(&items, "256").target_id, Some(258));
    let decided = items.iter_mut().find(|i| i.id == "257").unwrap();
    (decided.action, decided.target_id, decided.decided) = (Action::Create, Some(258), true);
    repropose_taken_targets(&mut items, &k8s, range);
    let moved = by_id(&items, "256");
    assert_eq!((moved.action, moved.target_id), (Action::None, None));
    assert!(moved.reason.contains("no id in"), "{}", moved.reason);
}

#[test]
fn an_items_nodes_are_those_whose_value_key_names_its_id() {
    let masters = vec![MasterEntry::new("1100", A), MasterEntry::new("1101", A)];
    let mut counts = crate::core::kvstore::NodeCounts::default();
    counts.add_key(A.as_bytes(), b"10.0.0.1", b"1100");
    counts.add_key(A.as_bytes(), b"10.0.0.2", b"1100");
    counts.add_key(A.as_bytes(), b"10.0.0.3", b"1101");
    let items = plan(&masters, &counts, &BTreeMap::new(), range0());
    assert_eq!(by_id(&items, "1100").nodes, 2);
    assert_eq!(by_id(&items, "1101").nodes, 1);
}
