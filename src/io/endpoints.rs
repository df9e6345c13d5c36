//! Which identities live endpoints use: every `CiliumEndpoint` (all namespaces) read through
//! kube's `Api<DynamicObject>` in pages, by `status.identity.id`. Rollback asks before it
//! deletes, since deleting an identity a CRD-mode agent uses makes the agent create it again
//! and leaves its endpoints without an identity meanwhile.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;

use super::k8s::{K8sTarget, RequestError, kube_call};

/// Endpoints per page, and the longest wait for one page.
const PAGE: u32 = 500;
const PAGE_TIMEOUT: Duration = Duration::from_secs(60);
/// A list whose continue token expired (410) is started over this many times.
const LIST_ATTEMPTS: u32 = 3;

/// The endpoints (`namespace/name`) that use each identity, now.
pub async fn identities_in_use(
    target: &K8sTarget,
) -> Result<BTreeMap<u32, Vec<String>>, RequestError> {
    let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumEndpoint");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumendpoints");
    let api: Api<DynamicObject> = Api::all_with(target.kube_client(), &resource);
    let mut attempt = 0;
    'list: loop {
        attempt += 1;
        let mut params = ListParams::default().limit(PAGE);
        let mut in_use: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        loop {
            let page = match kube_call(PAGE_TIMEOUT, api.list(&params)).await {
                Ok(p) => p,
                // The continue token expired between pages: start over, as kubectl does.
                Err(e) if e.code() == Some(410) && attempt < LIST_ATTEMPTS => continue 'list,
                Err(e) => return Err(e),
            };
            for ep in page.items {
                let Some(id) = ep
                    .data
                    .pointer("/status/identity/id")
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|id| u32::try_from(id).ok())
                else {
                    continue;
                };
                let ns = ep.metadata.namespace.unwrap_or_default();
                let name = ep.metadata.name.unwrap_or_default();
                in_use.entry(id).or_default().push(format!("{ns}/{name}"));
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(in_use),
            }
        }
    }
}
