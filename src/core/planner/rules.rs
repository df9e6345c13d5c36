//! The rules: classifies every kvstore identity against the Kubernetes snapshot and proposes
//! a safe resolution, with the lowest free id for a remap. Pure and deterministic.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};

use super::item::{Action, Kind, PlanItem};
use crate::core::kvstore::{MasterEntry, NodesOf, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::range::IdRange;

/// A kvstore identity after parsing, before classification. Kept small (40 bytes): at
/// 65,280 identities each byte here is 64 KiB of the plan's peak memory, so the text of
/// the id and the reasons an entry is invalid are worked out again when its item is made.
struct Parsed<'a> {
    entry: &'a MasterEntry,
    /// Where the entry is in the planner's input.
    index: u32,
    /// The numeric id; `None` when the key is no valid id.
    id: Option<u32>,
    /// The label key when it is a valid (hence canonical) one.
    labels: Option<&'a str>,
}

impl Parsed<'_> {
    /// The id as written in the kvstore key.
    fn raw_id(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.entry.id)
    }
}

const TRANSITION_RISK: &str = "Until every node runs in CRD mode, traffic that a kvstore-mode node tags with the old id is read by CRD-mode nodes as the other labels, so policy between old and new nodes can allow or drop the wrong traffic; finish the rollout quickly.";

/// Why a remap goes where it goes.
fn remap_reason(id: u32, new_id: u32) -> Cow<'static, str> {
    Cow::Owned(format!(
        "id {id} is taken in Kubernetes by other labels: create these labels at {new_id}, the lowest id free on both sides. {TRANSITION_RISK}"
    ))
}

/// Moves proposals off targets another item already takes. A decision kept across a rescan
/// holds its target, which the fresh plan did not know of (sync had not written it yet): each
/// undecided remap whose target a decided create, or an earlier proposal, takes gets the
/// lowest id free in Kubernetes, among the kvstore ids and among every item's targets.
pub fn repropose_taken_targets(
    items: &mut [PlanItem],
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) {
    let creates = |i: &PlanItem| i.action == Action::Create;
    let mut taken: BTreeSet<u32> = items
        .iter()
        .filter(|i| i.decided && creates(i))
        .filter_map(|i| i.target_id)
        .collect();
    let mut used: BTreeSet<u32> = k8s
        .keys()
        .copied()
        .chain(items.iter().filter_map(PlanItem::numeric_id))
        .chain(items.iter().filter_map(|i| i.target_id))
        .collect();
    let mut next = range.min;
    for item in items
        .iter_mut()
        .filter(|i| !i.decided && i.kind == Kind::Remap && creates(i))
    {
        let (Some(t), Some(own)) = (item.target_id, item.numeric_id()) else {
            continue;
        };
        if taken.insert(t) {
            continue;
        }
        while used.contains(&next) && next < range.max {
            next += 1;
        }
        if used.contains(&next) {
            item.action = Action::None;
            item.target_id = None;
            item.reason = Cow::Owned(format!(
                "id {own} is taken in Kubernetes by other labels and no id in {range} is free for a remap"
            ));
            continue;
        }
        used.insert(next);
        taken.insert(next);
        item.target_id = Some(next);
        item.reason = remap_reason(own, next);
    }
}

/// What Cilium does with one label set under two objects, said wherever a duplicate is proposed.
const DUPLICATE_FATE: &str = "Cilium 1.18's agents allocating these labels afresh take the oldest object (by creationTimestamp; 1.9's took any), pods keep the id they hold, and the operator's GC marks an object no CiliumEndpoint uses (annotation io.cilium.heartbeat) and deletes it after its heartbeat timeout; an agent that uses it removes the mark.";

/// Plans every kvstore identity against the Kubernetes identities (`id -> security-labels`).
pub fn plan(
    masters: &[MasterEntry],
    node_counts: &impl NodesOf,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> Vec<PlanItem> {
    let (mut items, from) = classify(masters, node_counts, k8s, range);
    for (item, &i) in items.iter_mut().zip(&from) {
        item.labels = String::from_utf8_lossy(&masters[i].value).into_owned();
    }
    items
}

/// `plan`, moving each label key out of `masters` into its item instead of copying it: at
/// 65,280 identities the copy is 18 MiB of a read's peak memory.
pub fn plan_taking(
    masters: Vec<MasterEntry>,
    node_counts: &impl NodesOf,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> Vec<PlanItem> {
    let (mut items, from) = classify(&masters, node_counts, k8s, range);
    let mut values: Vec<Option<Vec<u8>>> = masters.into_iter().map(|m| Some(m.value)).collect();
    for (item, &i) in items.iter_mut().zip(&from) {
        let value = values[i].take().unwrap_or_default();
        item.labels = String::from_utf8(value)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    }
    items
}

/// The plan's items with their labels left empty, and for each the index of its entry in
/// `masters` (the callers fill the labels in, by copy or by move).
fn classify(
    masters: &[MasterEntry],
    node_counts: &impl NodesOf,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> (Vec<PlanItem>, Vec<usize>) {
    let parsed = parse_sorted(masters);
    let mut rules = Rules::new(&parsed, k8s, range);
    let mut claimed: BTreeSet<u32> = BTreeSet::new();
    let mut items = Vec::with_capacity(parsed.len());
    let from: Vec<usize> = parsed.iter().map(|p| p.index as usize).collect();
    for p in &parsed {
        let mut item = blank_item(p, node_counts);
        match writable(p, range, &mut |id| claimed.insert(id)) {
            Ok((id, labels)) => classify_one(id, labels, &mut item, range, &mut rules),
            Err(reason) => item.reason = reason,
        }
        items.push(item);
    }
    (items, from)
}

/// An item for `p` before its classification: invalid, with its node count.
fn blank_item(p: &Parsed<'_>, node_counts: &impl NodesOf) -> PlanItem {
    PlanItem {
        id: p.raw_id().into_owned(),
        labels: String::new(),
        kind: Kind::Invalid,
        action: Action::Skip,
        target_id: None,
        existing_labels: None,
        labels_present_at: None,
        nodes: node_counts.nodes_of(&p.entry.value, &p.entry.id),
        reason: Cow::Borrowed(""),
        decided: false,
    }
}

/// The item of one kvstore identity, classified against what is `around` it: the plan kept
/// up to date (`core::plan_cache`) makes each item it changes with this, so the rules stay
/// in one place. `first_at_id`: no entry before it in the planner's order claims its id.
pub fn item_of<'a>(
    entry: &'a MasterEntry,
    node_counts: &impl NodesOf,
    range: IdRange,
    first_at_id: bool,
    around: &mut impl Around<'a>,
) -> PlanItem {
    let p = Parsed {
        entry,
        index: 0,
        id: parse_id(&entry.id).ok(),
        labels: valid_label_key(&entry.value).ok(),
    };
    let mut item = blank_item(&p, node_counts);
    match writable(&p, range, &mut |_| first_at_id) {
        Ok((id, labels)) => classify_one(id, labels, &mut item, range, around),
        Err(reason) => item.reason = reason,
    }
    item.labels = String::from_utf8_lossy(&entry.value).into_owned();
    item
}

/// Every entry parsed, in numeric order of id, then by the id's text, so invalid ids sort
/// deterministically at the end.
fn parse_sorted(masters: &[MasterEntry]) -> Vec<Parsed<'_>> {
    let mut parsed: Vec<Parsed<'_>> = masters
        .iter()
        .enumerate()
        .map(|(index, entry)| Parsed {
            entry,
            index: index as u32,
            id: parse_id(&entry.id).ok(),
            labels: valid_label_key(&entry.value).ok(),
        })
        .collect();
    parsed.sort_by(|a, b| {
        let ka = a.id.unwrap_or(u32::MAX);
        let kb = b.id.unwrap_or(u32::MAX);
        (ka, a.id.is_none(), a.raw_id()).cmp(&(kb, b.id.is_none(), b.raw_id()))
    });
    parsed
}

/// The id and label key of an entry that may be written, or why it never is: an invalid
/// id or label key, an id outside the range, or an id seen before (the first entry is used).
fn writable<'a>(
    p: &Parsed<'a>,
    range: IdRange,
    claim: &mut dyn FnMut(u32) -> bool,
) -> Result<(u32, &'a str), Cow<'static, str>> {
    let (id, labels) = match (p.id, p.labels) {
        (Some(id), Some(labels)) => (id, labels),
        (None, _) => {
            let e = parse_id(&p.entry.id).err().unwrap_or_default();
            return Err(Cow::Owned(format!("invalid id: {e}; never written")));
        }
        (Some(_), None) => {
            let e = valid_label_key(&p.entry.value)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(Cow::Owned(format!("invalid labels: {e}; never written")));
        }
    };
    if !range.contains(id) {
        return Err(Cow::Owned(format!(
            "id {id} is outside the allocation range {range} (reserved or another cluster's); never written"
        )));
    }
    if !claim(id) {
        return Err(Cow::Owned(format!(
            "id {id} appears twice in the kvstore; the first entry is used"
        )));
    }
    Ok((id, labels))
}

/// What classifying one valid identity needs to know of all the others: the ids in use on
/// either side, where each label set already is, and the remaps proposed so far.
struct Rules<'a> {
    k8s: &'a BTreeMap<u32, LabelKey>,
    range: IdRange,
    /// Every numeric id a kvstore-mode node could be using, and every remap target: off
    /// limits for a new id.
    used: BTreeSet<u32>,
    /// The lowest Kubernetes id per label set: the one a CRD-mode agent would settle on.
    k8s_by_labels: LabelIndex<'a>,
    /// Kvstore ids that will be created at their own (free) id, lowest first per label set.
    kv_anchor: HashMap<&'a str, u32>,
    /// Label sets remapped so far, and where to.
    remapped: HashMap<&'a str, u32>,
    /// No id below this is free for a remap.
    next_free: u32,
}

impl<'a> Rules<'a> {
    fn new(parsed: &[Parsed<'a>], k8s: &'a BTreeMap<u32, LabelKey>, range: IdRange) -> Self {
        let mut used: BTreeSet<u32> = k8s.keys().copied().collect();
        used.extend(parsed.iter().filter_map(|p| p.id));
        let mut kv_anchor: HashMap<&str, u32> = HashMap::new();
        let mut seen_ids: BTreeSet<u32> = BTreeSet::new();
        for p in parsed {
            if let (Some(id), Some(labels)) = (p.id, p.labels)
                && range.contains(id)
                && !k8s.contains_key(&id)
                && seen_ids.insert(id)
            {
                kv_anchor.entry(labels).or_insert(id);
            }
        }
        Rules {
            k8s,
            range,
            used,
            // Made when an item first needs it: in a migrated cluster none does, and it
            // would be 3 MiB of the peak at 65,280.
            k8s_by_labels: LabelIndex::new(k8s),
            kv_anchor,
            remapped: HashMap::new(),
            next_free: range.min,
        }
    }

    /// The lowest id free on both sides, taken; `None` when the range is full.
    fn take_free_id(&mut self) -> Option<u32> {
        while self.used.contains(&self.next_free) && self.next_free < self.range.max {
            self.next_free += 1;
        }
        if self.used.contains(&self.next_free) {
            return None;
        }
        self.used.insert(self.next_free);
        Some(self.next_free)
    }
}

/// What classifying one identity asks of every other: the object at an id, where a label
/// set already is (in Kubernetes, at a kvstore id of its own, remapped), and a free id.
pub trait Around<'a> {
    /// The labels Kubernetes holds at `id`.
    fn object_at(&self, id: u32) -> Option<&LabelKey>;
    /// The lowest id Kubernetes holds `labels` at.
    fn lowest_object(&mut self, labels: &str) -> Option<u32>;
    /// The lowest kvstore id created at its own id (writable, free in Kubernetes) with `labels`.
    fn anchor(&self, labels: &str) -> Option<u32>;
    /// Where an earlier identity with `labels` was remapped to.
    fn remapped(&self, labels: &str) -> Option<u32>;
    /// The lowest id free on both sides, taken for `labels`; `None` when the range is full.
    fn remap(&mut self, labels: &'a str) -> Option<u32>;
}

impl<'a> Around<'a> for Rules<'a> {
    fn object_at(&self, id: u32) -> Option<&LabelKey> {
        self.k8s.get(&id)
    }

    fn lowest_object(&mut self, labels: &str) -> Option<u32> {
        self.k8s_by_labels.lowest(labels)
    }

    fn anchor(&self, labels: &str) -> Option<u32> {
        self.kv_anchor.get(labels).copied()
    }

    fn remapped(&self, labels: &str) -> Option<u32> {
        self.remapped.get(labels).copied()
    }

    fn remap(&mut self, labels: &'a str) -> Option<u32> {
        let new_id = self.take_free_id()?;
        self.remapped.insert(labels, new_id);
        Some(new_id)
    }
}

/// Classifies a valid identity in range against what Kubernetes holds at its id.
fn classify_one<'a>(
    id: u32,
    labels: &'a str,
    item: &mut PlanItem,
    range: IdRange,
    around: &mut impl Around<'a>,
) {
    match around.object_at(id) {
        Some(existing) if existing.as_str() == labels => {
            item.kind = Kind::AlreadyMigrated;
            item.action = Action::None;
            item.target_id = Some(id);
            item.reason =
                Cow::Borrowed("a CiliumIdentity with these labels already exists at this id");
        }
        Some(existing) => {
            item.existing_labels = Some(existing.clone());
            taken_by_other_labels(id, labels, item, range, around);
        }
        None => free_in_kubernetes(id, labels, item, around),
    }
}

/// Kubernetes holds `id` for other labels: map to where these labels already are, or
/// remap them to the lowest id free on both sides.
fn taken_by_other_labels<'a>(
    id: u32,
    labels: &'a str,
    item: &mut PlanItem,
    range: IdRange,
    around: &mut impl Around<'a>,
) {
    let elsewhere = around
        .lowest_object(labels)
        .or_else(|| around.anchor(labels))
        .or_else(|| around.remapped(labels));
    if let Some(x) = elsewhere {
        item.kind = Kind::Reuse;
        item.action = Action::None;
        item.target_id = Some(x);
        item.labels_present_at = Some(x);
        item.reason = Cow::Owned(format!(
            "id {id} is taken in Kubernetes by other labels, and these labels are already at id {x}: map to {x}, create nothing. {TRANSITION_RISK}"
        ));
        return;
    }
    let Some(new_id) = around.remap(labels) else {
        item.reason = Cow::Owned(format!(
            "id {id} is taken in Kubernetes by other labels and no id in {range} is free for a remap"
        ));
        return;
    };
    item.kind = Kind::Remap;
    item.action = Action::Create;
    item.target_id = Some(new_id);
    item.reason = remap_reason(id, new_id);
}

/// Kubernetes does not hold `id`: create it there, a duplicate if these labels are already
/// at another id (in Kubernetes, or under another kvstore id).
fn free_in_kubernetes<'a>(
    id: u32,
    labels: &str,
    item: &mut PlanItem,
    around: &mut impl Around<'a>,
) {
    let other = around
        .lowest_object(labels)
        .map(|x| (x, "in Kubernetes"))
        .or_else(|| {
            around
                .anchor(labels)
                .filter(|x| *x != id)
                .map(|x| (x, "under another kvstore id"))
        });
    item.action = Action::Create;
    item.target_id = Some(id);
    if let Some((x, where_)) = other {
        item.kind = Kind::Duplicate;
        item.labels_present_at = Some(x);
        item.reason = Cow::Owned(format!(
            "these labels are already present at id {x} ({where_}); creating them at {id} too keeps kvstore-mode and CRD-mode nodes agreeing on {id}. {DUPLICATE_FATE} Confirm to create anyway, or skip"
        ));
    } else {
        item.kind = Kind::Create;
        item.reason =
            Cow::Borrowed("id free and labels new to Kubernetes: create with the same id");
    }
}

/// The lowest Kubernetes id per label key, indexed on first use.
struct LabelIndex<'a> {
    k8s: &'a BTreeMap<u32, LabelKey>,
    index: Option<HashMap<&'a str, u32>>,
}

impl<'a> LabelIndex<'a> {
    fn new(k8s: &'a BTreeMap<u32, LabelKey>) -> Self {
        LabelIndex { k8s, index: None }
    }

    /// The lowest id Kubernetes holds these labels at.
    fn lowest(&mut self, labels: &str) -> Option<u32> {
        let k8s = self.k8s;
        let index = self.index.get_or_insert_with(|| {
            let mut by_labels = HashMap::with_capacity(k8s.len());
            // Ascending ids: the first seen per label key is the lowest.
            for (id, l) in k8s {
                by_labels.entry(l.as_str()).or_insert(*id);
            }
            by_labels
        });
        index.get(labels).copied()
    }
}
