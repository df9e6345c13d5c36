//! Which identities endpoints use, from both places Cilium keeps them: `CiliumEndpoint`s
//! (one per pod, written by its agent) and `CiliumEndpointSlice` entries (batched by the
//! operator, so they may lag). Every id either names counts as in use: a stale slice entry
//! must not hide the id the endpoint itself names, nor the other way round. A kind that is
//! served but empty while pods run says nothing about them: it is not known, and nothing is
//! removed on it.

use std::collections::{BTreeMap, BTreeSet};

/// One endpoint as listed: `namespace/name` (named as its pod) and the id it names.
pub type Listed = (String, u32);

/// What endpoints use, as far as it is known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointUse {
    /// Each pod's endpoint id: its `CiliumEndpoint`'s, else a slice entry's.
    pub by_pod: BTreeMap<String, u32>,
    /// Every id an endpoint or a slice entry names.
    pub ids: BTreeSet<u32>,
    /// Why which ids endpoints use is not known (nothing is removed then), if it is not.
    pub unknown: Option<String>,
}

impl EndpointUse {
    pub fn known(&self) -> bool {
        self.unknown.is_none()
    }
}

/// Said when neither kind of endpoint object is served.
pub const NEITHER_SERVED: &str = "which identities endpoints use: neither ciliumendpoints.cilium.io nor ciliumendpointslices.cilium.io is served, so no endpoint is known; switch-prepare removes nothing while that is so";

/// What endpoints use, from the `CiliumEndpoint`s and the slices' entries as listed (`None`:
/// the kind is not served), with `pods` pods that should have an endpoint (not in the host's
/// network).
pub fn endpoint_use(
    endpoints: Option<Vec<Listed>>,
    slices: Option<Vec<Listed>>,
    pods: usize,
) -> EndpointUse {
    let mut out = EndpointUse::default();
    let mut empty = Vec::new();
    let mut any_served = false;
    let mut any_entries = false;
    for (kind, listed) in [
        ("ciliumendpoints.cilium.io", &endpoints),
        ("ciliumendpointslices.cilium.io", &slices),
    ] {
        let Some(listed) = listed else { continue };
        any_served = true;
        any_entries |= !listed.is_empty();
        if listed.is_empty() {
            empty.push(kind);
        }
        for (pod, id) in listed {
            out.ids.insert(*id);
            // The endpoint's own object first: a slice entry only where the pod has none.
            out.by_pod.entry(pod.clone()).or_insert(*id);
        }
    }
    out.unknown = if !any_served {
        Some(NEITHER_SERVED.to_string())
    } else if !any_entries && pods > 0 {
        Some(format!(
            "which identities endpoints use: {} served but empty while {pods} pods run (their agents have not written endpoints yet, or cannot): no endpoint is known; switch-prepare removes nothing while that is so",
            empty.join(" and ")
        ))
    } else {
        None
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(pairs: &[(&str, u32)]) -> Option<Vec<Listed>> {
        Some(pairs.iter().map(|(p, id)| (p.to_string(), *id)).collect())
    }

    #[test]
    fn an_endpoint_and_a_stale_slice_entry_both_keep_their_ids_in_use() {
        let u = endpoint_use(
            listed(&[("shop/web-1", 1000)]),
            listed(&[("shop/web-1", 2000), ("shop/web-2", 1000)]),
            2,
        );
        assert_eq!(u.ids, BTreeSet::from([1000, 2000]));
        assert_eq!(
            u.by_pod["shop/web-1"], 1000,
            "the endpoint's own object first"
        );
        assert_eq!(u.by_pod["shop/web-2"], 1000);
        assert!(u.known());
    }

    #[test]
    fn a_served_kind_with_no_entries_while_pods_run_is_not_known() {
        let u = endpoint_use(listed(&[]), None, 3);
        let why = u.unknown.expect("not known");
        assert!(why.contains("ciliumendpoints.cilium.io served but empty while 3 pods run"));
        // Where one kind has entries, the other's emptiness is that kind not in use.
        assert!(endpoint_use(listed(&[]), listed(&[("a/b", 7)]), 3).known());
        // No pod runs: empty is the truth.
        assert!(endpoint_use(listed(&[]), None, 0).known());
        assert_eq!(
            endpoint_use(None, None, 0).unknown.as_deref(),
            Some(NEITHER_SERVED)
        );
    }
}
