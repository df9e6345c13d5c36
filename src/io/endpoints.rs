//! Which identities live endpoints use: every `CiliumEndpoint` (all namespaces) read through
//! kube's `Api<DynamicObject>` in pages, by `status.identity.id`. Rollback asks before it
//! deletes, since deleting an identity a CRD-mode agent uses makes the agent create it again
//! and leaves its endpoints without an identity meanwhile.

use std::collections::BTreeMap;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

use super::k8s::{K8sTarget, RequestError, for_each_listed};

/// The endpoints (`namespace/name`) of every `CiliumEndpointSlice` (`cilium.io/v2alpha1`,
/// cluster-scoped: with `enable-cilium-endpoint-slice` Cilium keeps its endpoints there
/// instead of in CiliumEndpoints), each with the identity it uses (`endpoints[].id`).
pub async fn endpoints_in_slices(target: &K8sTarget) -> Result<Vec<(String, u32)>, RequestError> {
    let gvk = GroupVersionKind::gvk("cilium.io", "v2alpha1", "CiliumEndpointSlice");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumendpointslices");
    let api: Api<DynamicObject> = Api::all_with(target.kube_client(), &resource);
    let mut out = Vec::new();
    for_each_listed(
        &api,
        || {},
        |slice| {
            let ns = slice
                .data
                .get("namespace")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string();
            let endpoints = slice.data.get("endpoints").and_then(|e| e.as_array());
            for ep in endpoints.into_iter().flatten() {
                let name = ep.get("name").and_then(|n| n.as_str()).unwrap_or_default();
                let id = ep
                    .get("id")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|id| u32::try_from(id).ok());
                if let Some(id) = id {
                    out.push((format!("{ns}/{name}"), id));
                }
            }
        },
    )
    .await?;
    Ok(out)
}

/// The endpoints (`namespace/name`) that use each identity, now.
pub async fn identities_in_use(
    target: &K8sTarget,
) -> Result<BTreeMap<u32, Vec<String>>, RequestError> {
    let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumEndpoint");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumendpoints");
    let api: Api<DynamicObject> = Api::all_with(target.kube_client(), &resource);
    let mut in_use: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut restarted = false;
    for_each_listed(
        &api,
        || restarted = true,
        |ep| {
            let Some(id) = ep
                .data
                .pointer("/status/identity/id")
                .and_then(serde_json::Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())
            else {
                return;
            };
            let ns = ep.metadata.namespace.unwrap_or_default();
            let name = ep.metadata.name.unwrap_or_default();
            in_use.entry(id).or_default().push(format!("{ns}/{name}"));
        },
    )
    .await?;
    if restarted {
        // A list started over repeats what the first attempt saw.
        for users in in_use.values_mut() {
            users.sort();
            users.dedup();
        }
    }
    Ok(in_use)
}
