//! Sync's plan, kept up to date change by change instead of re-planned whole at every
//! settle tick (65 ms at 65,280 identities). The planner's rules tie an identity to few
//! others: those with the same labels (on either side) and the one object at its id; only
//! remaps reach further, each taking the next id free on both sides in the order of the
//! identities that need one. So the cache keeps those ties as indexes (the identities and
//! objects of each label set, the free ids, the identities that need a remap and the id
//! each got) and, for a change, classifies again only what it ties in: the label sets it
//! touches, and the remaps whose id moved. Each item is made by the planner's own rules
//! (`planner::item_of`), so the rules stay in one place and the result is the full plan's,
//! item for item. Node counts of cached items are not kept current (sync reads them from
//! the counts, never from the plan). Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;

use crate::core::kvstore::{IdDigits, MasterEntry, NodeCounts, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::planner::resume::LoggedDecision;
use crate::core::planner::{self, Around, Kind, PlanItem};
use crate::core::range::IdRange;

/// What the planner reads besides the change: the kvstore's master keys, the objects, the
/// node counts, as they are after the change.
pub type World<'a> = (
    &'a BTreeMap<Vec<u8>, Vec<u8>>,
    &'a BTreeMap<u32, LabelKey>,
    &'a NodeCounts,
);

/// Where an item sits in the planner's order: numeric id, then invalid ids by their text.
pub type ItemKey = (u32, bool, String);

pub fn key_of(raw_id: &[u8]) -> ItemKey {
    // Checked as text first: an id is plain ASCII, and a lossy reading walks it by chunks.
    let text = match std::str::from_utf8(raw_id) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(raw_id).into_owned(),
    };
    match parse_id(raw_id) {
        Ok(n) => (n, false, text),
        Err(_) => (u32::MAX, true, text),
    }
}

/// A label key's hash: the indexes hold hashes, not 18 MiB of label keys again; every
/// lookup compares the labels themselves, so two keys sharing a hash only cost a look more.
/// foldhash with a fixed seed: the same in every process, several times faster than SipHash.
fn h(labels: &[u8]) -> u64 {
    foldhash::fast::FixedState::with_seed(0x1d_5eed).hash_one(labels)
}

/// Whether kvstore id `n` holds exactly `labels`.
fn holds(masters: &BTreeMap<Vec<u8>, Vec<u8>>, n: u32, labels: &[u8]) -> bool {
    masters.get(IdDigits::of(n).as_bytes()).map(Vec::as_slice) == Some(labels)
}

/// Every `(hash, id)` of one hash, lowest id first.
fn of_hash(set: &BTreeSet<(u64, u32)>, hash: u64) -> impl Iterator<Item = u32> + '_ {
    set.range((hash, 0)..=(hash, u32::MAX)).map(|(_, id)| *id)
}

/// The plan, and the ties that say what a change moves.
#[derive(Debug)]
pub struct PlanCache {
    range: IdRange,
    items: BTreeMap<ItemKey, PlanItem>,
    /// Kvstore identities that may be written (valid id in range, valid labels), by the
    /// hash of their labels. (A valid id has one spelling, so a map of keys holds it once.)
    kv_labels: BTreeSet<(u64, u32)>,
    /// Objects by the hash of their labels.
    k8s_labels: BTreeSet<(u64, u32)>,
    /// The ids in range neither side holds: the n-th remap takes the n-th.
    free: FreeIds,
    /// The first identity of each label set that needs a remap (its labels nowhere else to
    /// go), in the planner's order, and the id it got (`None`: none was free).
    remaps: BTreeMap<u32, Option<u32>>,
    /// Items added, changed or removed since last taken.
    changed: BTreeSet<ItemKey>,
    /// Whether one change moved more than its own item, or an item that is no plain create
    /// or copy: what the plan says beyond its writes (reuses, skips) may have moved.
    beyond_local: bool,
}

/// What changed in the plan since last asked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub items: BTreeSet<ItemKey>,
    pub beyond_local: bool,
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
            items: items
                .into_iter()
                .map(|i| (key_of(i.id.as_bytes()), i))
                .collect(),
            kv_labels: BTreeSet::new(),
            k8s_labels: k8s.iter().map(|(id, l)| (h(l.as_bytes()), *id)).collect(),
            free: FreeIds::of(
                range,
                k8s.keys()
                    .copied()
                    .chain(masters.keys().filter_map(|id| parse_id(id).ok())),
            ),
            remaps: BTreeMap::new(),
            changed: BTreeSet::new(),
            beyond_local: false,
        };
        let mut hashes = BTreeSet::new();
        for (id, value) in masters {
            if let Ok(n) = parse_id(id)
                && range.contains(n)
                && valid_label_key(value).is_ok()
            {
                c.kv_labels.insert((h(value), n));
                hashes.insert(h(value));
            }
        }
        for hash in hashes {
            c.find_remaps(hash, masters, k8s);
        }
        c.assign();
        c
    }

    /// The items, in the planner's order.
    pub fn items(&self) -> impl Iterator<Item = &PlanItem> + Clone {
        self.items.values()
    }

    /// The item of one kvstore id, as the plan holds it.
    pub fn item(&self, key: &ItemKey) -> Option<&PlanItem> {
        self.items.get(key)
    }

    /// The kvstore identities that may be written with labels of `labels`' hash (a few more
    /// only if two label keys share a hash).
    pub fn with_labels(&self, labels: &[u8]) -> impl Iterator<Item = ItemKey> + '_ {
        of_hash(&self.kv_labels, h(labels)).map(|n| (n, false, n.to_string()))
    }

    /// The identity whose remap got id `t`, if one did.
    pub fn remap_to(&self, t: u32) -> Option<ItemKey> {
        self.remaps
            .iter()
            .find(|(_, target)| **target == Some(t))
            .map(|(n, _)| (*n, false, n.to_string()))
    }

    /// Whether the kvstore holds id `n` (a valid id: an item's key names it).
    pub fn holds_kv_id(&self, n: u32) -> bool {
        self.items.contains_key(&(n, false, n.to_string()))
    }

    /// The part of the plan `decisions` touch, in the planner's order: the items they
    /// decide, and every item that creates at an id one of them names (a decision's target,
    /// or the proposal of the item it decides). No other item can refuse a decision or be
    /// changed by one (`resume::resume_among`). The plan creates at an identity's own id or
    /// at its remap's: two lookups an id.
    pub fn touched_by(&self, decisions: &BTreeMap<String, LoggedDecision>) -> Vec<PlanItem> {
        let mut keys = BTreeSet::new();
        let mut named = BTreeSet::new();
        for d in decisions.values() {
            let key = key_of(d.id.as_bytes());
            if let Some(item) = self.items.get(&key) {
                named.extend(item.target_id);
                keys.insert(key);
            }
            named.extend(d.target_id);
        }
        let remapped: BTreeMap<u32, u32> = self
            .remaps
            .iter()
            .filter_map(|(n, t)| Some(((*t)?, *n)))
            .filter(|(t, _)| named.contains(t))
            .collect();
        for t in named {
            for n in [Some(t), remapped.get(&t).copied()].into_iter().flatten() {
                let key = (n, false, n.to_string());
                let creates = self
                    .items
                    .get(&key)
                    .is_some_and(|i| i.action == planner::Action::Create && i.target_id == Some(t));
                if creates {
                    keys.insert(key);
                }
            }
        }
        keys.iter()
            .filter_map(|k| self.items.get(k).cloned())
            .collect()
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

    /// What changed since last asked, and forgets it.
    pub fn take_changed(&mut self) -> Changed {
        Changed {
            items: std::mem::take(&mut self.changed),
            beyond_local: std::mem::take(&mut self.beyond_local),
        }
    }

    /// `id/<key>` written or deleted (`old`: what it held before), the world being as after.
    pub fn master_changed(&mut self, key: &[u8], old: Option<&[u8]>, world: World<'_>) {
        let (masters, k8s, _) = world;
        let new = masters.get(key).map(Vec::as_slice);
        if old == new {
            return;
        }
        let mut hashes = BTreeSet::new();
        if let Ok(n) = parse_id(key) {
            self.remaps.remove(&n);
            for value in [old, new].into_iter().flatten() {
                hashes.insert(h(value));
                self.kv_labels.remove(&(h(value), n));
            }
            if let Some(value) = new
                && self.range.contains(n)
                && valid_label_key(value).is_ok()
            {
                self.kv_labels.insert((h(value), n));
            }
            self.refresh_free(n, masters, k8s);
        }
        self.settle(hashes, Some(key_of(key)), world);
    }

    /// Object `n` created, changed or deleted (`old`: what it held before), the world being
    /// as after.
    pub fn object_changed(&mut self, n: u32, old: Option<&LabelKey>, world: World<'_>) {
        let (masters, k8s, _) = world;
        let new = k8s.get(&n);
        if old == new {
            return; // sync's own create, seen again by its watch
        }
        let mut hashes = BTreeSet::new();
        if let Some(old) = old {
            self.k8s_labels.remove(&(h(old.as_bytes()), n));
            hashes.insert(h(old.as_bytes()));
        }
        if let Some(new) = new {
            self.k8s_labels.insert((h(new.as_bytes()), n));
            hashes.insert(h(new.as_bytes()));
        }
        // The kvstore identity at `n` meets another object.
        if let Some(value) = masters.get(IdDigits::of(n).as_bytes()) {
            hashes.insert(h(value));
        }
        self.refresh_free(n, masters, k8s);
        self.settle(hashes, None, world);
    }

    /// Whether `n` is free on both sides now, kept in `free`.
    fn refresh_free(
        &mut self,
        n: u32,
        masters: &BTreeMap<Vec<u8>, Vec<u8>>,
        k8s: &BTreeMap<u32, LabelKey>,
    ) {
        if !self.range.contains(n) {
            return;
        }
        if k8s.contains_key(&n) || masters.contains_key(IdDigits::of(n).as_bytes()) {
            self.free.take(n);
        } else {
            self.free.give(n);
        }
    }

    /// After a change: the remaps of the label sets it touched found again, the free ids
    /// handed out again, and the items of every label set touched or whose remap moved made
    /// again, with `key`'s own (a malformed entry belongs to no label set).
    fn settle(&mut self, mut hashes: BTreeSet<u64>, key: Option<ItemKey>, world: World<'_>) {
        let (masters, k8s, _) = world;
        for &hash in &hashes {
            self.find_remaps(hash, masters, k8s);
        }
        for moved in self.assign() {
            if let Some(value) = masters.get(IdDigits::of(moved).as_bytes()) {
                hashes.insert(h(value));
            }
        }
        let before = self.changed.len();
        let mut local = true;
        for hash in hashes {
            let ids: Vec<u32> = of_hash(&self.kv_labels, hash).collect();
            for labels in label_sets(&ids, masters) {
                let mut around = self.around(hash, labels, &ids, world);
                for &n in &ids {
                    let text = n.to_string();
                    let Some(value) = masters.get(text.as_bytes()) else {
                        continue;
                    };
                    if value.as_slice() == labels {
                        let item = made(text.as_bytes(), value, world, self.range, &mut around);
                        local &= self.put((n, false, text), Some(item));
                    }
                }
            }
        }
        // The changed key itself, when no label set holds it: deleted, or never writable
        // (a malformed entry, an id out of range), so classified alone.
        if let Some(key) = key
            && !self.in_a_label_set(&key, masters)
        {
            let item = masters
                .get(key.2.as_bytes())
                .map(|value| made(key.2.as_bytes(), value, world, self.range, &mut Alone(k8s)));
            local &= self.put(key, item);
        }
        if !local || self.changed.len() > before + 1 {
            self.beyond_local = true;
        }
    }

    /// Whether `key` is a kvstore identity that may be written: its item is made with its
    /// label set's.
    fn in_a_label_set(&self, key: &ItemKey, masters: &BTreeMap<Vec<u8>, Vec<u8>>) -> bool {
        !key.1
            && masters
                .get(key.2.as_bytes())
                .is_some_and(|v| self.kv_labels.contains(&(h(v), key.0)))
    }

    /// What the planner's rules ask of the world for one label set.
    fn around<'w>(&self, hash: u64, labels: &[u8], ids: &[u32], world: World<'w>) -> LabelSet<'w> {
        let (masters, k8s, _) = world;
        let (lowest, anchor) = self.ties(hash, labels, ids, masters, k8s);
        let rep = ids.iter().find(|n| holds(masters, **n, labels));
        LabelSet {
            k8s,
            lowest,
            anchor,
            remapped: None,
            target: rep.and_then(|n| self.remaps.get(n).copied().flatten()),
        }
    }

    /// For the label set `labels` (hash `hash`, its kvstore identities among `ids`): the
    /// lowest id Kubernetes holds it at, and the lowest kvstore id of it free in Kubernetes.
    fn ties(
        &self,
        hash: u64,
        labels: &[u8],
        ids: &[u32],
        masters: &BTreeMap<Vec<u8>, Vec<u8>>,
        k8s: &BTreeMap<u32, LabelKey>,
    ) -> (Option<u32>, Option<u32>) {
        let lowest = of_hash(&self.k8s_labels, hash)
            .find(|n| k8s.get(n).is_some_and(|l| l.as_bytes() == labels));
        let anchor = ids
            .iter()
            .copied()
            .find(|n| !k8s.contains_key(n) && holds(masters, *n, labels));
        (lowest, anchor)
    }

    /// The label sets of one hash that need a remap: their first identity, when Kubernetes
    /// holds none of them and every one's id is taken there by other labels.
    fn find_remaps(
        &mut self,
        hash: u64,
        masters: &BTreeMap<Vec<u8>, Vec<u8>>,
        k8s: &BTreeMap<u32, LabelKey>,
    ) {
        let ids: Vec<u32> = of_hash(&self.kv_labels, hash).collect();
        for &n in &ids {
            self.remaps.remove(&n);
        }
        for labels in label_sets(&ids, masters) {
            if let (None, None) = self.ties(hash, labels, &ids, masters, k8s)
                && let Some(first) = ids.iter().copied().find(|n| holds(masters, *n, labels))
            {
                self.remaps.insert(first, None);
            }
        }
    }

    /// The free ids handed to the remaps in order, as the planner does; the remaps whose id
    /// moved.
    fn assign(&mut self) -> Vec<u32> {
        let mut free = self.free.iter();
        let mut moved = Vec::new();
        for (n, target) in self.remaps.iter_mut() {
            let next = free.next();
            if *target != next {
                *target = next;
                moved.push(*n);
            }
        }
        moved
    }

    /// Puts `key`'s item in place (`None`: removed), noting it if it changed; whether it is
    /// local (a plain create or copy, before and after).
    fn put(&mut self, key: ItemKey, item: Option<PlanItem>) -> bool {
        let old = self.items.get(&key);
        let same = match (old, &item) {
            (Some(old), Some(new)) => {
                PlanItem {
                    nodes: old.nodes,
                    ..new.clone()
                } == *old
            }
            (None, None) => true,
            _ => false,
        };
        if same {
            return true;
        }
        let local = old.is_none_or(is_local) && item.as_ref().is_none_or(is_local);
        match item {
            Some(item) => self.items.insert(key.clone(), item),
            None => self.items.remove(&key),
        };
        self.changed.insert(key);
        local
    }
}

/// The distinct label keys among `ids`' master keys (two share a hash only by chance).
fn label_sets<'m>(ids: &[u32], masters: &'m BTreeMap<Vec<u8>, Vec<u8>>) -> Vec<&'m [u8]> {
    let mut sets: Vec<&[u8]> = Vec::new();
    for n in ids {
        if let Some(v) = masters.get(IdDigits::of(*n).as_bytes())
            && !sets.contains(&v.as_slice())
        {
            sets.push(v);
        }
    }
    sets
}

/// One identity's item, by the planner's rules.
fn made(
    id: &[u8],
    value: &[u8],
    world: World<'_>,
    range: IdRange,
    around: &mut impl for<'a> Around<'a>,
) -> PlanItem {
    let entry = MasterEntry::new(id.to_vec(), value.to_vec());
    let (_, _, counts) = world;
    planner::item_of(&entry, counts, range, true, around)
}

/// What one label set's identities see of the world: the object at each id, where the
/// labels are already, and the id their remap got.
struct LabelSet<'w> {
    k8s: &'w BTreeMap<u32, LabelKey>,
    lowest: Option<u32>,
    anchor: Option<u32>,
    remapped: Option<u32>,
    /// The id the label set's remap got; handed out once, as the planner takes one.
    target: Option<u32>,
}

impl<'a> Around<'a> for LabelSet<'_> {
    fn object_at(&self, id: u32) -> Option<&LabelKey> {
        self.k8s.get(&id)
    }

    fn lowest_object(&mut self, _: &str) -> Option<u32> {
        self.lowest
    }

    fn anchor(&self, _: &str) -> Option<u32> {
        self.anchor
    }

    fn remapped(&self, _: &str) -> Option<u32> {
        self.remapped
    }

    fn remap(&mut self, _: &'a str) -> Option<u32> {
        self.remapped = self.target.take();
        self.remapped
    }
}

/// A malformed entry's world: it is never classified against anything.
struct Alone<'w>(&'w BTreeMap<u32, LabelKey>);

impl<'a> Around<'a> for Alone<'_> {
    fn object_at(&self, id: u32) -> Option<&LabelKey> {
        self.0.get(&id)
    }

    fn lowest_object(&mut self, _: &str) -> Option<u32> {
        None
    }

    fn anchor(&self, _: &str) -> Option<u32> {
        None
    }

    fn remapped(&self, _: &str) -> Option<u32> {
        None
    }

    fn remap(&mut self, _: &'a str) -> Option<u32> {
        None
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

/// The ids in range neither side holds, as runs of consecutive ids (start to end, both in):
/// a cluster holds tens of thousands of ids in few runs, and a small world few in one.
#[derive(Debug, Default)]
struct FreeIds(BTreeMap<u32, u32>);

impl FreeIds {
    /// `range` without the ids of `used` (in any order).
    fn of(range: IdRange, used: impl Iterator<Item = u32>) -> Self {
        let used: BTreeSet<u32> = used.filter(|n| range.contains(*n)).collect();
        let mut runs = BTreeMap::new();
        // In u64: a used id at the end of u32 would leave nothing after it.
        let mut start = u64::from(range.min);
        for n in used {
            if u64::from(n) > start {
                runs.insert(start as u32, n - 1);
            }
            start = u64::from(n) + 1;
        }
        if start <= u64::from(range.max) {
            runs.insert(start as u32, range.max);
        }
        FreeIds(runs)
    }

    fn contains(&self, n: u32) -> bool {
        self.0
            .range(..=n)
            .next_back()
            .is_some_and(|(_, end)| n <= *end)
    }

    /// `n` is held now.
    fn take(&mut self, n: u32) {
        let Some((&start, &end)) = self.0.range(..=n).next_back() else {
            return;
        };
        if n > end {
            return;
        }
        self.0.remove(&start);
        if start < n {
            self.0.insert(start, n - 1);
        }
        if n < end {
            self.0.insert(n + 1, end);
        }
    }

    /// `n` is free now.
    fn give(&mut self, n: u32) {
        if self.contains(n) {
            return;
        }
        let mut start = n;
        let mut end = n;
        if let Some((&s, &e)) = self.0.range(..n).next_back()
            && e.checked_add(1) == Some(n)
        {
            start = s;
        }
        if let Some(next) = n.checked_add(1)
            && let Some(e) = self.0.remove(&next)
        {
            end = e;
        }
        self.0.insert(start, end);
    }

    /// Every free id, lowest first.
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().flat_map(|(&s, &e)| s..=e)
    }
}
