//! The kept plan is the full plan, item for item, after any run of changes (checked against
//! the planner over random worlds); and the common changes move their own item alone.

use proptest::prelude::*;

use super::*;

const A: &str = "k8s:app=a;";
const B: &str = "k8s:app=b;";
const C: &str = "k8s:app=c;";

type Masters = BTreeMap<Vec<u8>, Vec<u8>>;
type Objects = BTreeMap<u32, LabelKey>;

/// Both sides, and the cache kept up to date with them.
struct Both {
    masters: Masters,
    k8s: Objects,
    counts: NodeCounts,
    cache: PlanCache,
}

impl Both {
    fn new(range: IdRange, masters: &[(&str, &str)], k8s: &[(u32, &str)]) -> Self {
        let masters: Masters = masters
            .iter()
            .map(|(id, l)| (id.as_bytes().to_vec(), l.as_bytes().to_vec()))
            .collect();
        let k8s: Objects = k8s.iter().map(|(id, l)| (*id, (*l).into())).collect();
        let counts = NodeCounts::default();
        let cache = PlanCache::build(full(&masters, &k8s, range), &masters, &k8s, range);
        Both {
            masters,
            k8s,
            counts,
            cache,
        }
    }

    fn put(&mut self, id: &str, labels: &str) -> Changed {
        let old = self
            .masters
            .insert(id.as_bytes().to_vec(), labels.as_bytes().to_vec());
        let world = (&self.masters, &self.k8s, &self.counts);
        self.cache
            .master_changed(id.as_bytes(), old.as_deref(), world);
        self.cache.take_changed()
    }

    fn delete(&mut self, id: &str) -> Changed {
        let old = self.masters.remove(id.as_bytes());
        let world = (&self.masters, &self.k8s, &self.counts);
        self.cache
            .master_changed(id.as_bytes(), old.as_deref(), world);
        self.cache.take_changed()
    }

    fn object(&mut self, n: u32, labels: Option<&str>) -> Changed {
        let old = match labels {
            Some(l) => self.k8s.insert(n, l.into()),
            None => self.k8s.remove(&n),
        };
        let world = (&self.masters, &self.k8s, &self.counts);
        self.cache.object_changed(n, old.as_ref(), world);
        self.cache.take_changed()
    }

    /// The cache agrees with a full plan of both sides as they are now.
    fn check(&self) {
        let kept: Vec<PlanItem> = self.cache.items().cloned().collect();
        assert_eq!(kept, full(&self.masters, &self.k8s, self.cache.range()));
    }

    fn target_of(&self, id: &str) -> Option<u32> {
        self.cache
            .items()
            .find(|i| i.id == id)
            .and_then(|i| i.target_id)
    }
}

fn full(masters: &Masters, k8s: &Objects, range: IdRange) -> Vec<PlanItem> {
    let entries: Vec<MasterEntry> = masters
        .iter()
        .map(|(id, v)| MasterEntry::new(id.clone(), v.clone()))
        .collect();
    planner::plan(&entries, &NodeCounts::default(), k8s, range)
}

fn cluster0() -> IdRange {
    IdRange::for_cluster(0).unwrap()
}

fn keys(ids: &[&str]) -> BTreeSet<ItemKey> {
    ids.iter().map(|id| key_of(id.as_bytes())).collect()
}

#[test]
fn a_new_identity_and_its_removal_move_their_own_item_alone() {
    let mut w = Both::new(cluster0(), &[("300", A)], &[]);
    assert_eq!(
        w.put("301", B),
        Changed {
            items: keys(&["301"]),
            beyond_local: false
        }
    );
    assert_eq!(w.cache.len(), 2);
    assert_eq!(w.delete("301").items, keys(&["301"]));
    // Its object made: already migrated, still local.
    let c = w.object(300, Some(A));
    assert_eq!((c.items, c.beyond_local), (keys(&["300"]), false));
    w.check();
    // An object at an id the kvstore does not hold, for labels it does not hold: nothing.
    assert_eq!(w.object(400, Some(C)), Changed::default());
    w.check();
}

#[test]
fn labels_held_elsewhere_move_every_identity_of_them() {
    let mut w = Both::new(cluster0(), &[("300", A)], &[]);
    // A second kvstore identity with A: both are duplicates of each other's label set.
    let c = w.put("301", A);
    assert_eq!(c.items, keys(&["301"]));
    assert!(c.beyond_local);
    w.check();
    // An object with A at 500: both become duplicates of it.
    let c = w.object(500, Some(A));
    assert_eq!(c.items, keys(&["300", "301"]));
    w.check();
}

#[test]
fn a_freed_id_below_a_remap_target_moves_the_target() {
    // 300 is taken in Kubernetes by other labels: a remap to the lowest id free on both
    // sides, 257 (the kvstore holds 256).
    let x = "k8s:app=x;";
    let mut w = Both::new(
        cluster0(),
        &[("256", B), ("300", A), ("305", C)],
        &[(300, x)],
    );
    assert_eq!(w.target_of("300"), Some(257));
    // Freeing 305 (above the target) moves nothing else; freeing 256 (below) moves it.
    assert_eq!(w.delete("305").items, keys(&["305"]));
    let c = w.delete("256");
    assert_eq!(c.items, keys(&["256", "300"]));
    assert_eq!(w.target_of("300"), Some(256));
    w.check();
}

#[test]
fn a_remap_with_no_free_id_gets_one_when_an_id_is_freed() {
    // A range of two ids, both held by the kvstore; Kubernetes holds 300 for other labels:
    // the remap of 300 finds no free id, until 301 goes.
    let tiny = IdRange { min: 300, max: 301 };
    let mut w = Both::new(tiny, &[("300", A), ("301", B)], &[(300, C)]);
    assert!(
        w.cache
            .items()
            .any(|i| i.kind == Kind::Invalid && i.reason.contains("no id in"))
    );
    w.delete("301");
    assert_eq!(w.target_of("300"), Some(301));
    w.check();
}

#[test]
fn a_full_range_costs_a_new_conflict_its_own_item() {
    // Every id of a small range held in Kubernetes; the kvstore's new identities each find
    // their id taken by other labels and no id free: each is its own change.
    let range = IdRange { min: 300, max: 399 };
    let objects: Vec<(u32, String)> = (300..400).map(|n| (n, format!("k8s:o={n};"))).collect();
    let objects: Vec<(u32, &str)> = objects.iter().map(|(n, l)| (*n, l.as_str())).collect();
    let mut w = Both::new(range, &[], &objects);
    for n in 300..320 {
        let c = w.put(&n.to_string(), &format!("k8s:new={n};"));
        assert_eq!(c.items, keys(&[&n.to_string()]));
    }
    w.check();
}

#[test]
fn malformed_entries_are_their_own_items() {
    let mut w = Both::new(cluster0(), &[("300", A)], &[]);
    assert_eq!(w.put("301", "no labels here").items, keys(&["301"]));
    assert_eq!(w.put("x1", A).items, keys(&["x1"]));
    assert_eq!(w.put("70000", A).items, keys(&["70000"]));
    w.check();
    assert_eq!(w.delete("301").items, keys(&["301"]));
    w.check();
}

/// One change to either side, over a small world where everything collides.
#[derive(Debug, Clone)]
enum Step {
    Put(u32, u8),
    Delete(u32),
    Object(u32, Option<u8>),
}

fn step() -> impl Strategy<Value = Step> {
    // Ids 298..=306 in a range of 300..=305: out of range at both ends; five label sets.
    prop_oneof![
        (298u32..307, 0u8..5).prop_map(|(n, l)| Step::Put(n, l)),
        (298u32..307).prop_map(Step::Delete),
        (298u32..307, proptest::option::of(0u8..5)).prop_map(|(n, l)| Step::Object(n, l)),
    ]
}

fn labels(l: u8) -> String {
    if l == 4 {
        "not a label key".to_string()
    } else {
        format!("k8s:app={l};")
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_kept_plan_is_the_full_plan_after_any_changes(
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let mut w = Both::new(IdRange { min: 300, max: 305 }, &[], &[]);
        for s in steps {
            match s {
                Step::Put(n, l) => { w.put(&n.to_string(), &labels(l)); }
                Step::Delete(n) => { w.delete(&n.to_string()); }
                Step::Object(n, l) => { w.object(n, l.map(labels).as_deref()); }
            }
            let kept: Vec<PlanItem> = w.cache.items().cloned().collect();
            prop_assert_eq!(kept, full(&w.masters, &w.k8s, w.cache.range()));
        }
    }
}

proptest! {
    #[test]
    fn free_ids_are_the_range_without_the_used_ones(
        used in proptest::collection::btree_set(295u32..312, 0..12),
        steps in proptest::collection::vec((any::<bool>(), 295u32..312), 0..30),
    ) {
        let range = IdRange { min: 300, max: 310 };
        let mut free = FreeIds::of(range, used.iter().copied());
        let mut model: BTreeSet<u32> = (300..=310).filter(|n| !used.contains(n)).collect();
        for (give, n) in steps {
            if !range.contains(n) {
                continue;
            }
            if give {
                free.give(n);
                model.insert(n);
            } else {
                free.take(n);
                model.remove(&n);
            }
            prop_assert_eq!(free.iter().collect::<BTreeSet<u32>>(), model.clone());
        }
    }
}
