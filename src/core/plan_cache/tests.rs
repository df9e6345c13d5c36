//! When a change stays local (the cache answers) and when it does not (a full plan): the
//! cache must say local for the common changes, or sync replans 65,280 identities for each.

use super::*;

const A: &str = "k8s:app=a;";
const B: &str = "k8s:app=b;";
const C: &str = "k8s:app=c;";

fn range() -> IdRange {
    IdRange::for_cluster(0).unwrap()
}

type Masters = BTreeMap<Vec<u8>, Vec<u8>>;

/// The kvstore holds `masters`, Kubernetes `k8s`; the cache of their full plan.
fn world(
    masters: &[(&str, &str)],
    k8s: &[(u32, &str)],
) -> (Masters, BTreeMap<u32, LabelKey>, PlanCache) {
    world_in(range(), masters, k8s)
}

/// `world`, planned in `range`.
fn world_in(
    range: IdRange,
    masters: &[(&str, &str)],
    k8s: &[(u32, &str)],
) -> (Masters, BTreeMap<u32, LabelKey>, PlanCache) {
    let m: Masters = masters
        .iter()
        .map(|(id, l)| (id.as_bytes().to_vec(), l.as_bytes().to_vec()))
        .collect();
    let k: BTreeMap<u32, LabelKey> = k8s.iter().map(|(id, l)| (*id, (*l).into())).collect();
    let entries: Vec<MasterEntry> = m
        .iter()
        .map(|(id, v)| MasterEntry::new(id.clone(), v.clone()))
        .collect();
    let items = planner::plan(&entries, &NodeCounts::default(), &k, range);
    let cache = PlanCache::build(items, &m, &k, range);
    (m, k, cache)
}

#[test]
fn a_new_identity_and_its_removal_stay_local() {
    let (m, k, mut c) = world(&[("300", A)], &[]);
    assert_eq!((c.len(), c.is_empty()), (1, false));
    let counts = NodeCounts::default();
    assert!(c.kv_put(b"301", B.as_bytes(), (&m, &k, &counts)));
    assert_eq!(c.len(), 2);
    let mut m2 = m.clone();
    m2.insert(b"301".to_vec(), B.as_bytes().to_vec());
    assert!(c.kv_delete(b"301", B.as_bytes(), &k));
    assert!(c.kv_delete(b"300", A.as_bytes(), &k));
    assert!(c.is_empty());
}

#[test]
fn a_put_that_touches_other_items_is_planned_in_full() {
    let (m, k, mut c) = world(&[("300", A)], &[(302, C)]);
    let counts = NodeCounts::default();
    // An existing key changed, labels another key holds, labels an object holds, an id an
    // object holds.
    assert!(!c.kv_put(b"300", B.as_bytes(), (&m, &k, &counts)));
    assert!(!c.kv_put(b"301", A.as_bytes(), (&m, &k, &counts)));
    assert!(!c.kv_put(b"301", C.as_bytes(), (&m, &k, &counts)));
    assert!(!c.kv_put(b"302", B.as_bytes(), (&m, &k, &counts)));
}

#[test]
fn a_delete_is_local_only_when_its_labels_and_id_are_its_alone() {
    // Already migrated at its own id: local.
    let (_, k, mut c) = world(&[("300", A)], &[(300, A)]);
    assert!(c.kv_delete(b"300", A.as_bytes(), &k));
    // Its labels also in Kubernetes elsewhere: the other id's item may change.
    let (_, k, mut c) = world(&[("300", A)], &[(301, A)]);
    assert!(!c.kv_delete(b"300", A.as_bytes(), &k));
    // A remap (its id taken in Kubernetes by other labels) is no local item.
    let (_, k, mut c) = world(&[("300", A)], &[(300, "k8s:app=x;")]);
    assert!(!c.kv_delete(b"300", A.as_bytes(), &k));
    // Its labels under another key too: a duplicate that changes.
    let (_, k, mut c) = world(&[("300", A), ("301", A)], &[]);
    assert!(!c.kv_delete(b"301", A.as_bytes(), &k));
}

#[test]
fn a_freed_id_below_a_remap_target_or_with_remaps_waiting_is_planned_in_full() {
    // 300 is taken in Kubernetes by other labels: a remap to the lowest id free on both
    // sides, 257 (the kvstore holds 256).
    let x = "k8s:app=x;";
    let (_, k, mut c) = world(&[("256", B), ("300", A), ("305", C)], &[(300, x)]);
    let remap = |c: &PlanCache| {
        c.items()
            .find(|i| i.kind == Kind::Remap)
            .and_then(|i| i.target_id)
    };
    assert_eq!(remap(&c), Some(257));
    // Freeing 305 (above the target) changes no target; freeing 256 (below) would.
    assert!(c.kv_delete(b"305", C.as_bytes(), &k));
    assert!(!c.kv_delete(b"256", B.as_bytes(), &k));
}

fn k8s_none() -> BTreeMap<u32, LabelKey> {
    BTreeMap::new()
}

#[test]
fn a_remap_waiting_for_a_free_id_makes_every_freed_id_a_full_plan() {
    // A range of two ids, both held by the kvstore; Kubernetes holds 300 for other labels:
    // the remap of 300 finds no free id.
    let tiny = IdRange { min: 300, max: 301 };
    let (_, k, mut c) = world_in(tiny, &[("300", A), ("301", B)], &[(300, C)]);
    assert!(
        c.items()
            .any(|i| i.kind == Kind::Invalid && i.reason.contains("no id in")),
        "{:?}",
        c.items().collect::<Vec<_>>()
    );
    // Freeing 301 would give it one.
    assert!(!c.kv_delete(b"301", B.as_bytes(), &k));
}

#[test]
fn a_malformed_entry_is_no_remap_waiting_for_an_id() {
    // Only a remap that found no free id makes freed ids a full plan; a malformed entry
    // beside a local item does not.
    let (_, k, mut c) = world(&[("300", A), ("301", "no labels here")], &[]);
    assert!(c.items().any(|i| i.kind == Kind::Invalid));
    assert!(c.kv_delete(b"300", A.as_bytes(), &k));
    // The malformed entry itself is its own item: its removal is local too.
    assert!(c.kv_delete(b"301", b"no labels here", &k));
    assert!(c.is_empty());
}

#[test]
fn an_identity_whose_labels_kubernetes_holds_twice_is_planned_in_full_when_it_goes() {
    // Already migrated at its own id, and Kubernetes holds the labels at 302 too.
    let (_, k, mut c) = world(&[("300", A)], &[(300, A), (302, A)]);
    assert!(c.items().all(|i| i.kind == Kind::AlreadyMigrated));
    assert!(!c.kv_delete(b"300", A.as_bytes(), &k));
}

#[test]
fn objects_created_and_deleted_stay_local_where_nothing_else_changes() {
    let (m, _, mut c) = world(&[("300", A)], &[]);
    let counts = NodeCounts::default();
    // The object for the kvstore identity at its own id: it becomes already migrated.
    assert!(c.k8s_set(300, &A.into(), None, (&m, &counts)));
    assert!(c.items().all(|i| i.kind == Kind::AlreadyMigrated));
    // Seen again unchanged: nothing to do.
    assert!(c.k8s_set(300, &A.into(), Some(&A.into()), (&m, &counts)));
    // Changed labels: planned in full.
    assert!(!c.k8s_set(300, &B.into(), Some(&A.into()), (&m, &counts)));
    // An object at an id the kvstore does not hold, for labels it does not hold: local.
    assert!(c.k8s_set(400, &C.into(), None, (&m, &counts)));
    assert!(!c.kv_put(b"402", C.as_bytes(), (&m, &k8s_none(), &counts)));
    assert!(c.k8s_remove(400, &C.into(), (&m, &counts)));
    // Gone again: its labels are free for a new kvstore identity, a local change.
    assert!(c.kv_put(b"402", C.as_bytes(), (&m, &k8s_none(), &counts)));
    // An object with labels a kvstore identity elsewhere holds: that identity's item changes.
    assert!(!c.k8s_set(401, &A.into(), None, (&m, &counts)));
}
