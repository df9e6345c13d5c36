//! The plan's vocabulary: an item per kvstore identity, its kind (how it relates to what
//! Kubernetes holds) and its action (what apply does with it). Plain data.

use std::collections::BTreeMap;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::core::kvstore::parse_id;

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
    /// `switch-prepare`'s own steps, never a plan's (not in `ALL`): they serve pods before
    /// the switch to operator-managed identities, not a kvstore identity. An identity made
    /// for a label set the operator would otherwise draw an id for.
    SwitchCreate,
    /// One of this tool's identities removed: another holds its labels and is kept.
    SwitchRemoveDuplicate,
    /// One of this tool's identities removed: no pod and no endpoint uses it.
    SwitchRemoveUnused,
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

    /// Every kind, a plan's (`ALL`) then `switch-prepare`'s, in the order they are declared.
    pub const EVERY: [Kind; 9] = {
        let mut every = [Kind::SwitchCreate; 9];
        let mut i = 0;
        while i < Kind::ALL.len() {
            every[i] = Kind::ALL[i];
            i += 1;
        }
        every[6] = Kind::SwitchCreate;
        every[7] = Kind::SwitchRemoveDuplicate;
        every[8] = Kind::SwitchRemoveUnused;
        every
    };

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::AlreadyMigrated => "already-migrated",
            Kind::Create => "create",
            Kind::Remap => "remap",
            Kind::Reuse => "reuse",
            Kind::Duplicate => "duplicate",
            Kind::Invalid => "invalid",
            Kind::SwitchCreate => "switch-create",
            Kind::SwitchRemoveDuplicate => "switch-remove-duplicate",
            Kind::SwitchRemoveUnused => "switch-remove-unused",
        }
    }

    /// A step of `switch-prepare`: it serves pods, not a kvstore identity.
    pub fn is_switch_step(self) -> bool {
        matches!(
            self,
            Kind::SwitchCreate | Kind::SwitchRemoveDuplicate | Kind::SwitchRemoveUnused
        )
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

/// One kvstore identity and what the plan proposes for it. Unknown fields are refused: a
/// plan is edited by hand, and a misspelt field read as absent would write what the
/// operator meant to change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Why the item is what it is. The common reasons are fixed text, shared rather than
    /// copied into each of tens of thousands of items.
    pub reason: Cow<'static, str>,
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
