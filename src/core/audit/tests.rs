//! The audit's rules on hand-made stores (the rollout of reference section F in small), and
//! its invariants over random stores.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn range() -> IdRange {
    IdRange::for_cluster(0).unwrap()
}

fn obj(id: u32, labels: &str) -> AuditObject {
    AuditObject {
        id,
        labels: labels.into(),
        gc_marked: false,
    }
}

fn value(labels: &str, node: &str, id: u32) -> ValueKey {
    ValueKey {
        label_key: labels.into(),
        node: node.into(),
        id: id.to_string(),
    }
}

fn run(
    masters: &[(&str, &str)],
    values: &[ValueKey],
    objects: &[AuditObject],
    endpoints: Option<&BTreeMap<u32, Vec<String>>>,
) -> AuditReport {
    let masters: Vec<MasterEntry> = masters
        .iter()
        .map(|(id, l)| MasterEntry::new(id.as_bytes().to_vec(), l.as_bytes().to_vec()))
        .collect();
    audit(&AuditInput {
        masters: &masters,
        values,
        objects,
        endpoints,
        range: range(),
    })
}

fn kinds(r: &AuditReport) -> Vec<(FindingKind, u32)> {
    r.findings.iter().map(|f| (f.kind, f.id)).collect()
}

#[test]
fn stores_that_agree_are_clean() {
    let r = run(
        &[("300", "k8s:app=a;"), ("301", "k8s:app=b;")],
        &[value("k8s:app=a;", "node-1", 300)],
        &[obj(300, "k8s:app=a;"), obj(301, "k8s:app=b;")],
        None,
    );
    assert!(r.clean(), "{:?}", r.findings);
    assert_eq!((r.kvstore_identities, r.objects), (2, 2));
    assert_eq!(r.counts.values().sum::<usize>(), 0);
    assert_eq!(r.counts.len(), 6, "every kind is counted, zeros too");
}

#[test]
fn each_kind_is_found_with_its_nodes_endpoints_and_action() {
    let mut eps = BTreeMap::new();
    eps.insert(300, vec!["shop/split-1".to_string()]);
    eps.insert(302, vec!["shop/web-1".to_string()]);
    eps.insert(310, vec!["shop/gc-1".to_string()]);
    eps.insert(401, vec!["shop/cart-1".to_string()]);
    let mut marked = obj(310, "k8s:app=g;");
    marked.gc_marked = true;
    let r = run(
        &[
            ("300", "k8s:app=a;"), // split: Kubernetes holds 300 for x
            ("301", "k8s:app=b;"), // double: Kubernetes holds b at 401
            ("302", "k8s:app=c;"), // kvstore duplicate of c (with 303)
            ("303", "k8s:app=c;"),
            ("304", "k8s:app=d;"), // one side: the kvstore's only
            ("305", "k8s:app=e;"),
            ("310", "k8s:app=g;"),
            ("x", "k8s:app=bad;"), // not an identity
        ],
        &[
            value("k8s:app=a;", "node-1", 300),
            value("k8s:app=b;", "node-2", 301),
            value("k8s:app=f;", "node-3", 305), // stale: 305 holds e
            value("k8s:app=g;", "node-4", 310),
            value("k8s:app=c;", "node-5", 302),
        ],
        &[
            obj(300, "k8s:app=x;"),
            obj(401, "k8s:app=b;"),
            obj(302, "k8s:app=c;"),
            obj(303, "k8s:app=c;"),
            obj(305, "k8s:app=e;"),
            obj(500, "k8s:app=y;"), // one side: Kubernetes' only
            obj(501, "k8s:app=y;"), // Kubernetes duplicate of y
            marked,
        ],
        Some(&eps),
    );
    assert_eq!(r.invalid_ignored, 1);
    assert_eq!(
        kinds(&r),
        [
            (FindingKind::Split, 300),
            (FindingKind::Double, 301),
            // c twice in both stores: a duplicate in each.
            (FindingKind::Duplicate, 302),
            (FindingKind::Duplicate, 302),
            (FindingKind::Duplicate, 500),
            (FindingKind::OneSide, 301),
            (FindingKind::OneSide, 304),
            (FindingKind::OneSide, 401),
            (FindingKind::OneSide, 500),
            (FindingKind::OneSide, 501),
            (FindingKind::StaleValue, 305),
            (FindingKind::GcMarked, 310),
        ]
    );
    let split = &r.findings[0];
    assert_eq!(split.other_labels.as_deref(), Some("k8s:app=x;"));
    assert_eq!(split.nodes, ["node-1"]);
    assert!(split.action.contains("roll node-1"), "{}", split.action);
    let double = &r.findings[1];
    assert_eq!(double.other_id, Some(401));
    assert_eq!(double.endpoints, ["shop/cart-1"]);
    assert!(double.action.contains("take 401"), "{}", double.action);
    assert_eq!(r.findings[2].side, Some(Side::Kvstore));
    assert_eq!(r.findings[3].side, Some(Side::Kubernetes));
    let k8s_dup = &r.findings[4];
    assert_eq!(k8s_dup.side, Some(Side::Kubernetes));
    assert!(
        k8s_dup.action.contains("oldest object"),
        "{}",
        k8s_dup.action
    );
    let stale = &r.findings[10];
    assert_eq!(stale.other_labels.as_deref(), Some("k8s:app=e;"));
    assert_eq!(stale.nodes, ["node-3"]);
    let gc = &r.findings[11];
    assert_eq!(gc.nodes, ["node-4"]);
    assert_eq!(r.counts["one-side"], 5);
    assert_eq!(r.counts.values().sum::<usize>(), r.findings.len());
    // Every field of every finding, as the text and JSON print them.
    let k = Some(Side::Kvstore);
    let c = Some(Side::Kubernetes);
    let none: [&str; 0] = [];
    let expected: [Expected; 12] = [
        (None, None, &["node-1"], &["shop/split-1"]),
        (None, Some(401), &["node-2"], &["shop/cart-1"]),
        (k, Some(303), &["node-5"], &none),
        (c, Some(303), &none, &["shop/web-1"]),
        (c, Some(501), &none, &none),
        (k, None, &["node-2"], &none),
        (k, None, &none, &none),
        (c, None, &none, &["shop/cart-1"]),
        (c, None, &none, &none),
        (c, None, &none, &none),
        (k, None, &["node-3"], &none),
        (c, None, &["node-4"], &["shop/gc-1"]),
    ];
    for (f, (side, other_id, nodes, endpoints)) in r.findings.iter().zip(expected) {
        let what = format!("{:?} {}", f.kind, f.id);
        assert_eq!(f.side, side, "{what}");
        assert_eq!(f.other_id, other_id, "{what}");
        assert_eq!(f.nodes, nodes, "{what}");
        assert_eq!(f.endpoints, endpoints, "{what}");
        assert!(
            !f.action.is_empty(),
            "{what}: every finding says what to do"
        );
    }
}

/// A finding's side, other id, nodes and endpoints.
type Expected<'a> = (Option<Side>, Option<u32>, &'a [&'a str], &'a [&'a str]);

#[test]
fn an_id_outside_the_range_is_no_identity_of_this_cluster() {
    let r = run(
        &[("300", "k8s:app=a;"), ("70000", "k8s:app=b;")],
        &[],
        &[obj(300, "k8s:app=a;")],
        None,
    );
    assert_eq!((r.kvstore_identities, r.invalid_ignored), (1, 1));
    assert!(r.clean(), "{:?}", r.findings);
}

#[test]
fn a_gc_mark_is_a_finding_for_any_one_kind_of_use() {
    let mark = |id, labels| {
        let mut o = obj(id, labels);
        o.gc_marked = true;
        o
    };
    let mut eps = BTreeMap::new();
    eps.insert(320, vec!["shop/web-1".to_string()]);
    let r = run(
        &[],
        // 321 is tagged by a node for other labels: still in use.
        &[value("k8s:app=j;", "node-1", 321)],
        &[
            mark(320, "k8s:app=h;"),
            mark(321, "k8s:app=i;"),
            mark(322, "k8s:app=z;"),
        ],
        Some(&eps),
    );
    let marked: Vec<u32> = r
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::GcMarked)
        .map(|f| f.id)
        .collect();
    assert_eq!(
        marked,
        [320, 321],
        "used by endpoints only, or by a node's key only"
    );
}

#[test]
fn a_list_of_names_shows_the_first_and_counts_the_rest() {
    let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    assert_eq!(names_list(&names, 2), "a, b and 1 more");
    assert_eq!(names_list(&names, 3), "a, b, c");
    assert_eq!(names_list(&[], 3), "none");
}

#[test]
fn a_gc_mark_on_an_object_nothing_uses_is_no_finding() {
    let mut marked = obj(310, "k8s:app=g;");
    marked.gc_marked = true;
    let r = run(
        &[("310", "k8s:app=g;")],
        &[],
        &[marked],
        Some(&BTreeMap::new()),
    );
    assert!(r.clean(), "{:?}", r.findings);
}

/// Kvstore ids and Kubernetes ids with a label index each, and value keys (labels, node, id).
type Stores = (
    Vec<(u32, usize)>,
    Vec<(u32, usize)>,
    Vec<(usize, usize, u32)>,
);

/// Random stores over a few ids and label sets.
fn stores() -> impl Strategy<Value = Stores> {
    const IDS: std::ops::Range<u32> = 300..310;
    (
        proptest::collection::vec((IDS, 0..5usize), 0..10),
        proptest::collection::vec((IDS, 0..5usize), 0..10),
        proptest::collection::vec((0..5usize, 0..3usize, IDS), 0..8),
    )
}

const LABELS: [&str; 5] = [
    "k8s:app=a;",
    "k8s:app=b;",
    "k8s:app=c;",
    "k8s:app=d;",
    "k8s:app=e;",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the stores hold: every split is an id both hold for different labels, every
    /// double a label set at disjoint ids on the two sides, every stale value a key whose id
    /// the kvstore holds for other labels; the counts add up; and stores made to agree (the
    /// kvstore copied to Kubernetes, value keys pointing at their ids) are clean.
    #[test]
    fn findings_are_what_they_say((kv, k8s, vals) in stores()) {
        let kv: BTreeMap<u32, &str> = kv.into_iter().map(|(i, l)| (i, LABELS[l])).collect();
        let k8s: BTreeMap<u32, &str> = k8s.into_iter().map(|(i, l)| (i, LABELS[l])).collect();
        let masters: Vec<(String, &str)> = kv.iter().map(|(i, l)| (i.to_string(), *l)).collect();
        let masters: Vec<(&str, &str)> = masters.iter().map(|(i, l)| (i.as_str(), *l)).collect();
        let objects: Vec<AuditObject> = k8s.iter().map(|(i, l)| obj(*i, l)).collect();
        let values: Vec<ValueKey> = vals
            .iter()
            .map(|(l, n, id)| value(LABELS[*l], &format!("node-{n}"), *id))
            .collect();
        let r = run(&masters, &values, &objects, None);
        prop_assert_eq!(r.counts.values().sum::<usize>(), r.findings.len());
        for f in &r.findings {
            match f.kind {
                FindingKind::Split => {
                    prop_assert_eq!(kv.get(&f.id).copied(), Some(f.labels.as_str()));
                    prop_assert!(k8s.get(&f.id).is_some_and(|l| *l != f.labels));
                }
                FindingKind::Double => {
                    let on = |m: &BTreeMap<u32, &str>| -> BTreeSet<u32> {
                        m.iter().filter(|(_, l)| **l == f.labels).map(|(i, _)| *i).collect()
                    };
                    let (a, b) = (on(&kv), on(&k8s));
                    prop_assert!(!a.is_empty() && !b.is_empty() && a.is_disjoint(&b));
                }
                FindingKind::StaleValue => {
                    prop_assert!(kv.get(&f.id) != Some(&f.labels.as_str()));
                }
                FindingKind::OneSide => {
                    prop_assert!(kv.contains_key(&f.id) != k8s.contains_key(&f.id));
                }
                FindingKind::Duplicate | FindingKind::GcMarked => {}
            }
        }
        // Every split there is, is found.
        for (id, l) in &kv {
            if k8s.get(id).is_some_and(|k| k != l) {
                prop_assert!(r.findings.iter().any(|f| f.kind == FindingKind::Split && f.id == *id));
            }
        }
        // Made to agree: the kvstore's identities in Kubernetes as they are, every value key
        // pointing at the id that holds its labels, and each label set at one id only.
        let mut once: BTreeMap<&str, u32> = BTreeMap::new();
        for (id, l) in &kv {
            once.entry(*l).or_insert(*id);
        }
        let agreed: Vec<(String, &str)> = once.iter().map(|(l, id)| (id.to_string(), *l)).collect();
        let agreed: Vec<(&str, &str)> = agreed.iter().map(|(i, l)| (i.as_str(), *l)).collect();
        let objects: Vec<AuditObject> = once.iter().map(|(l, id)| obj(*id, l)).collect();
        let values: Vec<ValueKey> = values
            .iter()
            .filter_map(|v| once.get(v.label_key.as_str()).map(|id| value(&v.label_key, &v.node, *id)))
            .collect();
        let r = run(&agreed, &values, &objects, None);
        prop_assert!(r.clean(), "{:?}", r.findings);
    }
}

/// The action of the one duplicate finding of `r`.
fn duplicate_action(r: &AuditReport) -> String {
    r.findings
        .iter()
        .find(|f| f.kind == FindingKind::Duplicate)
        .map(|f| f.action.clone())
        .unwrap_or_default()
}

#[test]
fn a_kvstore_duplicate_that_is_syncs_reservation_says_so() {
    let a = "k8s:app=a;";
    // 300 is the agents' id for A; 400 is sync's reservation of the id Kubernetes holds.
    let masters = [("300", a), ("400", a)];
    let agent = value(a, "10.0.0.1", 300);
    let reservation = value(a, crate::core::kvstore::RESERVATION_NODE, 400);
    let r = run(
        &masters,
        &[agent.clone(), reservation],
        &[obj(400, a)],
        None,
    );
    let action = duplicate_action(&r);
    assert!(
        action.contains("400 of them `sync --reserve-in-kvstore`'s reservation"),
        "{action}"
    );
    // Without the reservation's value/ key, the plain text.
    let r = run(&masters, &[agent], &[obj(400, a)], None);
    let action = duplicate_action(&r);
    assert!(action.contains("Cilium's kvstore GC"), "{action}");
}

#[test]
fn findings_a_recorded_decision_explains_are_shown_apart_and_not_counted() {
    // kvstore 1005 (web) remapped to 5000: Kubernetes keeps its own labels at 1005; 1006 is
    // skipped, and 1007 is a split nobody decided.
    let (web, db, squatter) = ("k8s:app=web;", "k8s:app=db;", "k8s:app=squatter;");
    let masters = [("1005", web), ("1006", db), ("1007", "k8s:app=q;")];
    let objects = [
        obj(1005, squatter),
        obj(5000, web),
        obj(1007, "k8s:app=other;"),
    ];
    let mut r = run(&masters, &[], &objects, None);
    assert_eq!(
        kinds(&r),
        vec![
            (FindingKind::Split, 1005),
            (FindingKind::Split, 1007),
            (FindingKind::Double, 1005),
            (FindingKind::OneSide, 1006),
            (FindingKind::OneSide, 5000),
        ]
    );
    let decisions = BTreeMap::from([
        (1005, (Some(5000), web.to_string())),
        (1006, (None, db.to_string())),
        // A decision for labels the kvstore no longer holds there explains nothing.
        (1007, (Some(6000), "k8s:app=gone;".to_string())),
    ]);
    r.explain_by_decisions(&decisions);
    assert_eq!(kinds(&r), vec![(FindingKind::Split, 1007)]);
    assert_eq!(
        (r.counts["split"], r.counts["double"], r.counts["one-side"]),
        (1, 0, 0)
    );
    let why: Vec<(u32, &str)> = r
        .decided
        .iter()
        .map(|d| (d.finding.id, d.decision.as_str()))
        .collect();
    assert_eq!(
        why,
        vec![
            (1005, "remapped by decision: kvstore 1005 is served at 5000"),
            (1005, "remapped by decision: kvstore 1005 is served at 5000"),
            (1006, "skipped by decision: kvstore 1006 is not migrated"),
            (5000, "remapped by decision: serves kvstore 1005"),
        ]
    );
    assert!(!r.clean());
}

#[test]
fn a_duplicate_created_at_its_own_id_by_decision_is_shown_as_decided() {
    // kvstore 1010 holds A; Kubernetes held A at 900 and the operator chose to create A at
    // 1010 too (create anyway): two objects for A in Kubernetes, on purpose.
    let a = "k8s:app=a;";
    let masters = [("1010", a)];
    let objects = [obj(900, a), obj(1010, a)];
    let mut r = run(&masters, &[], &objects, None);
    assert!(
        r.findings.iter().any(|f| f.kind == FindingKind::Duplicate),
        "{:?}",
        r.findings
    );
    // A decision for other labels, or mapped elsewhere, explains nothing.
    let mut other = r.clone();
    other.explain_by_decisions(&BTreeMap::from([(
        1010,
        (Some(1010), "k8s:app=b;".to_string()),
    )]));
    assert!(other.decided.is_empty());
    r.explain_by_decisions(&BTreeMap::from([(1010, (Some(1010), a.to_string()))]));
    assert!(
        r.findings.iter().all(|f| f.kind != FindingKind::Duplicate),
        "{:?}",
        r.findings
    );
    assert!(
        r.decided.iter().any(|d| d
            .decision
            .contains("created by decision: the duplicate at its own id 1010")),
        "{:?}",
        r.decided
    );
}

#[test]
fn nodes_are_those_whose_value_key_names_the_id_not_every_id_of_the_labels() {
    // The kvstore holds k8s:app=a; at 1100 and 1101; Kubernetes holds 1101 for other labels
    // (a split). Only 10.0.0.2's key names 1101: it is the node to roll.
    let r = run(
        &[("1100", "k8s:app=a;"), ("1101", "k8s:app=a;")],
        &[
            value("k8s:app=a;", "10.0.0.1", 1100),
            value("k8s:app=a;", "10.0.0.2", 1101),
        ],
        &[obj(1100, "k8s:app=a;"), obj(1101, "k8s:app=other;")],
        None,
    );
    let split = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Split)
        .expect("a split");
    assert_eq!(split.id, 1101);
    assert_eq!(split.nodes, ["10.0.0.2"]);
    // The kvstore's duplicate is used by both, each at its own id.
    let dup = r
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Duplicate && f.side == Some(Side::Kvstore))
        .expect("the kvstore's duplicate");
    assert_eq!(dup.nodes, ["10.0.0.1", "10.0.0.2"]);
}
