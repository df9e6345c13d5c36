//! A split allocation as sync reports it, and when it is reported: once the kvstore-mode
//! nodes that use the kvstore's labels can be named, or once `SPLIT_NODES_WAIT` has passed
//! without any (a node's `value/` key may trail its master key). The binary asks etcd for the
//! nodes and the simulation its world, both through `named`.

use std::time::Instant;

use super::machine::SplitFound;
use super::shell::SPLIT_NODES_WAIT;
use crate::core::labels::valid_label_key;

/// An id the kvstore and Kubernetes hold for different labels, found during sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitAllocation {
    pub id: u32,
    pub kvstore_labels: String,
    pub k8s_labels: String,
    /// Kvstore-mode nodes that use the kvstore's labels (their `value/` keys).
    pub nodes: Vec<String>,
}

impl std::fmt::Display for SplitAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (id, kv, k8s) = (self.id, &self.kvstore_labels, &self.k8s_labels);
        if self.nodes.is_empty() {
            return write!(
                f,
                "split allocation at id {id}: the kvstore holds {kv}, Kubernetes holds {k8s}; no kvstore-mode node uses the kvstore's labels now, so there is nothing to roll (they get a remap proposal)"
            );
        }
        write!(
            f,
            "split allocation at id {id}: the kvstore holds {kv} (used by kvstore-mode nodes {}), Kubernetes holds {k8s}: roll those nodes to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels); the kvstore's labels get a remap proposal",
            self.nodes.join(", ")
        )
    }
}

impl SplitAllocation {
    /// The same report for a terminal line by line: what to do first, then each label set
    /// on a line of its own, so no line carries both label keys.
    pub fn lines(&self) -> Vec<String> {
        let id = self.id;
        let first = if self.nodes.is_empty() {
            format!(
                "split allocation at id {id}: no kvstore-mode node uses the kvstore's labels now, so there is nothing to roll (they get a remap proposal)"
            )
        } else {
            format!(
                "split allocation at id {id}: roll {} to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels; the kvstore's labels get a remap proposal)",
                crate::core::audit::names_list(&self.nodes, 8)
            )
        };
        vec![
            first,
            format!("  the kvstore holds  {}", self.kvstore_labels),
            format!("  Kubernetes holds   {}", self.k8s_labels),
        ]
    }
}

/// What becomes of a split found, asked at `now` with the `nodes` whose `value/` keys use
/// the kvstore's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// Reported now, with the nodes (none, once the wait is over).
    Report(SplitAllocation),
    /// No node named yet and the wait not over: asked again later.
    Wait,
    /// The kvstore's value is no label key (reported as invalid elsewhere): not a split to
    /// report.
    NotLabels,
}

/// See `Named`.
pub fn named(found: &SplitFound, nodes: Vec<String>, now: Instant) -> Named {
    // The wait first: a split waits at every look while no node is named, and the machine
    // hands over only splits whose kvstore value was a label key when found (`is_split`),
    // so the check of the labels is made once, when the split is reported.
    if nodes.is_empty() && now.saturating_duration_since(found.found) < SPLIT_NODES_WAIT {
        return Named::Wait;
    }
    let Ok(kv_labels) = valid_label_key(&found.kv_value) else {
        return Named::NotLabels;
    };
    Named::Report(SplitAllocation {
        id: found.id,
        kvstore_labels: kv_labels.to_string(),
        k8s_labels: found.k8s_labels.clone(),
        nodes,
    })
}

#[cfg(test)]
mod tests;
