//! Sync's plan, kept up to date change by change instead of re-planned whole at every
//! settle tick (65 ms at 65,280 identities). A change is applied in place only when it
//! cannot alter any other item: its labels are used by no other kvstore identity and no
//! other Kubernetes object, its id by no other kvstore key, and it moves no remap target
//! (a remap takes the lowest free id, so a new used id matters only if it is a current
//! target, a freed one only if it lies below one). The changed item is then classified by
//! the planner itself, on a world of one, so the rules stay in one place. Anything else
//! drops the cache and the next tick plans in full. Node counts of cached items are not
//! kept current (sync reads them from the counts, never from the plan). Pure.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use crate::core::kvstore::{MasterEntry, NodeCounts, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::planner::{self, Kind, PlanItem};
use crate::core::range::IdRange;

/// What the planner reads besides the change: the kvstore's master keys, the objects, the
/// node counts, as they are before the change.
pub type World<'a> = (
    &'a BTreeMap<Vec<u8>, Vec<u8>>,
    &'a BTreeMap<u32, LabelKey>,
    &'a NodeCounts,
);

/// Where an item sits in the planner's order: numeric id, then invalid ids by their text.
type ItemKey = (u32, bool, String);

fn key_of(raw_id: &[u8]) -> ItemKey {
    let text = String::from_utf8_lossy(raw_id).into_owned();
    match parse_id(raw_id) {
        Ok(n) => (n, false, text),
        Err(_) => (u32::MAX, true, text),
    }
}

/// A label key's hash. Counts by hash can only be too high (two keys sharing a hash), which
/// sends a change to the full plan: never a wrong plan.
fn h(labels: &[u8]) -> u64 {
    let mut s = DefaultHasher::new();
    labels.hash(&mut s);
    s.finish()
}

fn inc(m: &mut HashMap<u64, u32>, k: u64) {
    *m.entry(k).or_default() += 1;
}

fn dec(m: &mut HashMap<u64, u32>, k: u64) {
    if let Some(c) = m.get_mut(&k) {
        *c = c.saturating_sub(1);
        if *c == 0 {
            m.remove(&k);
        }
    }
}

/// The plan, and what it takes to tell whether a change stays local.
#[derive(Debug)]
pub struct PlanCache {
    range: IdRange,
    items: BTreeMap<ItemKey, PlanItem>,
    /// Ids proposed as remap targets, and remaps that found no free id.
    remap_targets: BTreeSet<u32>,
    no_free: usize,
    /// How many kvstore keys hold each label key (valid ones), and how many objects.
    kv_labels: HashMap<u64, u32>,
    k8s_labels: HashMap<u64, u32>,
    /// How many kvstore keys parse to each numeric id.
    kv_ids: HashMap<u32, u32>,
}

impl PlanCache {
    /// The cache of a full plan of this world.
    pub fn build(
        items: Vec<PlanItem>,
        masters: &BTreeMap<Vec<u8>, Vec<u8>>,
        k8s: &BTreeMap<u32, LabelKey>,
        range: IdRange,
    ) -> Self {
        let mut c = PlanCache {
            range,
            items: BTreeMap::new(),
            remap_targets: BTreeSet::new(),
            no_free: 0,
            kv_labels: HashMap::new(),
            k8s_labels: HashMap::new(),
            kv_ids: HashMap::new(),
        };
        for (id, value) in masters {
            if valid_label_key(value).is_ok() {
                inc(&mut c.kv_labels, h(value));
            }
            if let Ok(n) = parse_id(id) {
                *c.kv_ids.entry(n).or_default() += 1;
            }
        }
        for labels in k8s.values() {
            inc(&mut c.k8s_labels, h(labels.as_bytes()));
        }
        for item in items {
            if item.kind == Kind::Remap
                && let Some(t) = item.target_id
            {
                c.remap_targets.insert(t);
            }
            if item.kind == Kind::Invalid && item.reason.contains("no id in") {
                c.no_free += 1;
            }
            c.items.insert(key_of(item.id.as_bytes()), item);
        }
        c
    }

    /// The items, in the planner's order.
    pub fn items(&self) -> impl Iterator<Item = &PlanItem> + Clone {
        self.items.values()
    }

    /// The range the plan was made for.
    pub fn range(&self) -> IdRange {
        self.range
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// `id/<key>` written with `value`, the world being as before the write; false: the
    /// cache no longer holds (plan in full).
    pub fn kv_put(&mut self, key: &[u8], value: &[u8], ctx: World<'_>) -> bool {
        let (masters, k8s, counts) = ctx;
        let range = self.range;
        if masters.contains_key(key) {
            return false; // a value changed under an existing key
        }
        let n = parse_id(key).ok();
        if let Some(n) = n {
            if self.kv_ids.get(&n).copied().unwrap_or(0) > 0 || self.remap_targets.contains(&n) {
                return false;
            }
            if k8s.contains_key(&n) {
                return false;
            }
        }
        let valid = valid_label_key(value).is_ok();
        if valid {
            let hv = h(value);
            if self.kv_labels.contains_key(&hv) || self.k8s_labels.contains_key(&hv) {
                return false;
            }
            inc(&mut self.kv_labels, hv);
        }
        if let Some(n) = n {
            *self.kv_ids.entry(n).or_default() += 1;
        }
        let entry = [MasterEntry::new(key.to_vec(), value.to_vec())];
        let item = planner::plan(&entry, counts, &BTreeMap::new(), range);
        self.insert_local(item)
    }

    /// `id/<key>` (holding `value`) deleted, the world being as before the delete.
    pub fn kv_delete(&mut self, key: &[u8], value: &[u8], k8s: &BTreeMap<u32, LabelKey>) -> bool {
        let k = key_of(key);
        if !self.items.get(&k).is_some_and(is_local) {
            return false;
        }
        let n = parse_id(key).ok();
        if let Some(n) = n
            && (self.kv_ids.get(&n).copied().unwrap_or(0) != 1 || self.frees_below_a_target(n))
        {
            return false;
        }
        let valid = valid_label_key(value).is_ok();
        if valid {
            let hv = h(value);
            let in_k8s = self.k8s_labels.get(&hv).copied().unwrap_or(0);
            let own = n.is_some_and(|n| k8s.get(&n).is_some_and(|l| l.as_bytes() == value));
            // Only this key holds the labels; an object with them only at its own id.
            if self.kv_labels.get(&hv).copied().unwrap_or(0) != 1 || in_k8s > u32::from(own) {
                return false;
            }
            dec(&mut self.kv_labels, hv);
        }
        if let Some(n) = n {
            self.kv_ids.remove(&n);
        }
        self.items.remove(&k);
        true
    }

    /// Object `n` created or changed to `labels` (`old`: what it held), the world being as
    /// before the change.
    pub fn k8s_set(
        &mut self,
        n: u32,
        labels: &LabelKey,
        old: Option<&LabelKey>,
        ctx: (&BTreeMap<Vec<u8>, Vec<u8>>, &NodeCounts),
    ) -> bool {
        let (masters, counts) = ctx;
        if old == Some(labels) {
            return true; // nothing changed (sync's own create, seen again by its watch)
        }
        if old.is_some() || self.remap_targets.contains(&n) {
            return false;
        }
        let hl = h(labels.as_bytes());
        let own = masters.get(n.to_string().as_bytes());
        let own_holds = own.is_some_and(|v| v == labels.as_bytes());
        // No other kvstore identity with these labels may change (a create becoming a
        // duplicate): only the one at this id, if any.
        if self.kv_labels.get(&hl).copied().unwrap_or(0) > u32::from(own_holds) {
            return false;
        }
        inc(&mut self.k8s_labels, hl);
        if own.is_some()
            && !self
                .items
                .get(&key_of(n.to_string().as_bytes()))
                .is_some_and(is_local)
        {
            return false;
        }
        // The kvstore identity at this id, when it holds these labels, becomes already
        // migrated; other labels make a remap or a reuse.
        self.reclassify_own(n, own, own_holds, Some(labels), counts)
    }

    /// Object `n` (holding `old`) deleted, the world being as before the delete.
    pub fn k8s_remove(
        &mut self,
        n: u32,
        old: &LabelKey,
        ctx: (&BTreeMap<Vec<u8>, Vec<u8>>, &NodeCounts),
    ) -> bool {
        let (masters, counts) = ctx;
        if self.frees_below_a_target(n) {
            return false;
        }
        let ho = h(old.as_bytes());
        let own = masters.get(n.to_string().as_bytes());
        let own_holds = own.is_some_and(|v| v == old.as_bytes());
        if self.kv_labels.get(&ho).copied().unwrap_or(0) > u32::from(own_holds)
            || self.k8s_labels.get(&ho).copied().unwrap_or(0) != 1
        {
            return false;
        }
        dec(&mut self.k8s_labels, ho);
        self.reclassify_own(n, own, own_holds, None, counts)
    }

    /// After a change of the object at `n` (now `object`): the kvstore identity at `n`,
    /// if there is one, classified again. Local only when that identity is the one key
    /// with id `n` and held the object's labels; with no kvstore identity at `n` (under any
    /// spelling of the id), nothing in the plan changes.
    fn reclassify_own(
        &mut self,
        n: u32,
        own: Option<&Vec<u8>>,
        own_holds: bool,
        object: Option<&LabelKey>,
        counts: &NodeCounts,
    ) -> bool {
        let keys_at_n = self.kv_ids.get(&n).copied().unwrap_or(0);
        let Some(value) = own else {
            return keys_at_n == 0;
        };
        if !own_holds || keys_at_n != 1 {
            return false;
        }
        let entry = [MasterEntry::new(n.to_string().into_bytes(), value.clone())];
        let world: BTreeMap<u32, LabelKey> = object.map(|l| (n, l.clone())).into_iter().collect();
        let item = planner::plan(&entry, counts, &world, self.range);
        self.insert_local(item)
    }

    /// A freed id below a remap target (or with remaps waiting for a free id) would change
    /// which ids the remaps get.
    fn frees_below_a_target(&self, n: u32) -> bool {
        self.no_free > 0 || self.remap_targets.range(n..).next().is_some()
    }

    /// Puts the one item a local change produced in place; false if it is not local after
    /// all (the planner found a conflict).
    fn insert_local(&mut self, item: Vec<PlanItem>) -> bool {
        let Some(item) = item.into_iter().next() else {
            return false;
        };
        if !is_local(&item) {
            return false;
        }
        self.items.insert(key_of(item.id.as_bytes()), item);
        true
    }
}

/// An item whose kind depends on nothing but itself and the object at its own id.
fn is_local(item: &PlanItem) -> bool {
    match item.kind {
        Kind::Create | Kind::AlreadyMigrated => true,
        Kind::Invalid => {
            !item.reason.contains("appears twice") && !item.reason.contains("no id in")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
