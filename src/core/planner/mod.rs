//! The pure core: classifies every kvstore identity against the Kubernetes snapshot and
//! proposes a safe resolution. No IO; the same input always gives the same plan.

pub mod decision;
pub mod reconcile;
pub use decision::{DecidedBy, Decision, WriteSummary, describe};
pub use reconcile::{
    Op, OpKind, ReconcileError, Reconciled, check_create_target, reconcile, validate_new_target,
};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::core::kvstore::{MasterEntry, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::range::IdRange;

/// How a kvstore identity relates to what Kubernetes already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    AlreadyMigrated,
    Create,
    Remap,
    Reuse,
    Duplicate,
    Invalid,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::AlreadyMigrated,
        Kind::Create,
        Kind::Remap,
        Kind::Reuse,
        Kind::Duplicate,
        Kind::Invalid,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::AlreadyMigrated => "already-migrated",
            Kind::Create => "create",
            Kind::Remap => "remap",
            Kind::Reuse => "reuse",
            Kind::Duplicate => "duplicate",
            Kind::Invalid => "invalid",
        }
    }

    /// Kinds an operator must look at: the default action is not a plain copy.
    pub fn is_conflict(self) -> bool {
        matches!(self, Kind::Remap | Kind::Reuse | Kind::Duplicate)
    }

    /// Kinds whose proposed write needs the operator's explicit decision.
    pub fn needs_decision(self) -> bool {
        matches!(self, Kind::Remap | Kind::Duplicate)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What apply does with an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Create a `CiliumIdentity` at `target_id`.
    Create,
    /// Write nothing; the identity is (or will be) served by `target_id`.
    None,
    /// Write nothing and map nothing.
    Skip,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::None => "none",
            Action::Skip => "skip",
        }
    }
}

/// One kvstore identity and what the plan proposes for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanItem {
    /// The id as written in the kvstore key (text, since an invalid one may not be a number).
    pub id: String,
    /// The label key as stored (lossily decoded when it is not UTF-8).
    pub labels: String,
    pub kind: Kind,
    pub action: Action,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_id: Option<u32>,
    /// Labels Kubernetes holds at this id, when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_labels: Option<String>,
    /// The other id that already carries these labels (reuse, duplicate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels_present_at: Option<u32>,
    /// Number of nodes whose `value/` key references these labels.
    pub nodes: u32,
    pub reason: String,
    /// Set by the operator (or `--accept-proposals`) for remap and duplicate items.
    #[serde(default)]
    pub decided: bool,
}

impl PlanItem {
    /// The numeric id, when the kvstore id is a valid number.
    pub fn numeric_id(&self) -> Option<u32> {
        parse_id(self.id.as_bytes()).ok()
    }
}

/// Count of items per kind.
pub type Summary = BTreeMap<Kind, usize>;

pub fn summarize(items: &[PlanItem]) -> Summary {
    let mut s: Summary = Kind::ALL.iter().map(|k| (*k, 0)).collect();
    for item in items {
        *s.entry(item.kind).or_default() += 1;
    }
    s
}

/// A kvstore identity after parsing, before classification.
struct Parsed<'a> {
    raw_id: std::borrow::Cow<'a, str>,
    /// The label key as text; `labels` says whether it is a valid (hence canonical) one.
    raw_labels: std::borrow::Cow<'a, str>,
    entry: &'a MasterEntry,
    id: Result<u32, String>,
    labels: Result<(), String>,
}

const TRANSITION_RISK: &str = "Until every node runs in CRD mode, traffic that a kvstore-mode node tags with the old id is read by CRD-mode nodes as the other labels, so policy between old and new nodes can allow or drop the wrong traffic; finish the rollout quickly.";

/// Plans every kvstore identity against the Kubernetes identities (`id -> security-labels`).
pub fn plan(
    masters: &[MasterEntry],
    node_counts: &HashMap<Vec<u8>, u32>,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> Vec<PlanItem> {
    let mut parsed: Vec<Parsed<'_>> = masters
        .iter()
        .map(|entry| {
            let checked = valid_label_key(&entry.value);
            Parsed {
                raw_id: String::from_utf8_lossy(&entry.id),
                raw_labels: match checked {
                    Ok(text) => std::borrow::Cow::Borrowed(text),
                    Err(_) => String::from_utf8_lossy(&entry.value),
                },
                entry,
                id: parse_id(&entry.id),
                labels: checked.map(|_| ()).map_err(|e| e.to_string()),
            }
        })
        .collect();
    // Numeric order first, then the raw text, so invalid ids sort deterministically at the end.
    parsed.sort_by(|a, b| {
        let ka = a.id.as_ref().ok().copied().unwrap_or(u32::MAX);
        let kb = b.id.as_ref().ok().copied().unwrap_or(u32::MAX);
        (ka, a.id.is_err(), &a.raw_id).cmp(&(kb, b.id.is_err(), &b.raw_id))
    });

    // Every numeric id a kvstore-mode node could be using is off limits for a new id.
    let mut used: BTreeSet<u32> = k8s.keys().copied().collect();
    used.extend(parsed.iter().filter_map(|p| p.id.as_ref().ok().copied()));

    // The lowest Kubernetes id per label set: the one a CRD-mode agent would settle on.
    let mut k8s_by_labels: HashMap<&str, u32> = HashMap::with_capacity(k8s.len());
    for (id, labels) in k8s {
        k8s_by_labels.entry(labels.as_str()).or_insert(*id);
    }

    // Kvstore ids that will be created at their own (free) id, lowest first per label set.
    let mut kv_anchor: HashMap<&str, u32> = HashMap::new();
    let mut seen_ids: BTreeSet<u32> = BTreeSet::new();
    for p in &parsed {
        if let (Ok(id), Ok(())) = (&p.id, &p.labels)
            && range.contains(*id)
            && !k8s.contains_key(id)
            && seen_ids.insert(*id)
        {
            kv_anchor.entry(p.raw_labels.as_ref()).or_insert(*id);
        }
    }

    let mut next_free = range.min;
    let mut remapped: HashMap<&str, u32> = HashMap::new();
    let mut claimed: BTreeSet<u32> = BTreeSet::new();
    let mut items = Vec::with_capacity(parsed.len());
    for p in &parsed {
        let nodes = node_counts.get(&p.entry.value).copied().unwrap_or(0);
        let mut item = PlanItem {
            id: p.raw_id.to_string(),
            labels: p.raw_labels.to_string(),
            kind: Kind::Invalid,
            action: Action::Skip,
            target_id: None,
            existing_labels: None,
            labels_present_at: None,
            nodes,
            reason: String::new(),
            decided: false,
        };
        let (id, labels) = match (&p.id, &p.labels) {
            (Err(e), _) => {
                item.reason = format!("invalid id: {e}; never written");
                items.push(item);
                continue;
            }
            (_, Err(e)) => {
                item.reason = format!("invalid labels: {e}; never written");
                items.push(item);
                continue;
            }
            (Ok(id), Ok(())) => (*id, p.raw_labels.as_ref()),
        };
        if !range.contains(id) {
            item.reason = format!(
                "id {id} is outside the allocation range {range} (reserved or another cluster's); never written"
            );
            items.push(item);
            continue;
        }
        if !claimed.insert(id) {
            item.reason = format!("id {id} appears twice in the kvstore; the first entry is used");
            items.push(item);
            continue;
        }
        match k8s.get(&id) {
            Some(existing) if existing.as_str() == labels => {
                item.kind = Kind::AlreadyMigrated;
                item.action = Action::None;
                item.target_id = Some(id);
                item.reason = "a CiliumIdentity with these labels already exists at this id".into();
            }
            Some(existing) => {
                item.existing_labels = Some(existing.clone());
                let elsewhere = k8s_by_labels
                    .get(labels)
                    .copied()
                    .or_else(|| kv_anchor.get(labels).copied())
                    .or_else(|| remapped.get(labels).copied());
                if let Some(x) = elsewhere {
                    item.kind = Kind::Reuse;
                    item.action = Action::None;
                    item.target_id = Some(x);
                    item.labels_present_at = Some(x);
                    item.reason = format!(
                        "id {id} is taken in Kubernetes by other labels, and these labels are already at id {x}: map to {x}, create nothing. {TRANSITION_RISK}"
                    );
                } else {
                    while used.contains(&next_free) && next_free < range.max {
                        next_free += 1;
                    }
                    if used.contains(&next_free) {
                        item.reason = format!(
                            "id {id} is taken in Kubernetes by other labels and no id in {range} is free for a remap"
                        );
                        items.push(item);
                        continue;
                    }
                    let new_id = next_free;
                    used.insert(new_id);
                    remapped.insert(labels, new_id);
                    item.kind = Kind::Remap;
                    item.action = Action::Create;
                    item.target_id = Some(new_id);
                    item.reason = format!(
                        "id {id} is taken in Kubernetes by other labels: create these labels at {new_id}, the lowest id free on both sides. {TRANSITION_RISK}"
                    );
                }
            }
            None => {
                let other = k8s_by_labels
                    .get(labels)
                    .copied()
                    .map(|x| (x, "in Kubernetes"))
                    .or_else(|| {
                        kv_anchor
                            .get(labels)
                            .copied()
                            .filter(|x| *x != id)
                            .map(|x| (x, "under another kvstore id"))
                    });
                item.action = Action::Create;
                item.target_id = Some(id);
                if let Some((x, where_)) = other {
                    item.kind = Kind::Duplicate;
                    item.labels_present_at = Some(x);
                    item.reason = format!(
                        "these labels are already present at id {x} ({where_}); creating them at {id} too keeps kvstore-mode and CRD-mode nodes agreeing on {id}, and Cilium settles on the oldest object. Confirm to create anyway, or skip"
                    );
                } else {
                    item.kind = Kind::Create;
                    item.reason =
                        "id free and labels new to Kubernetes: create with the same id".into();
                }
            }
        }
        items.push(item);
    }
    items
}

#[cfg(test)]
mod tests;
