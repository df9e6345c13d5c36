//! Every `CiliumIdentity` with what the audit needs beyond its labels: whether the
//! operator's GC marked it for deletion (`io.cilium.heartbeat`). Read through kube's
//! `Api<DynamicObject>` in pages; a name that is not an id is no identity and is left out.

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

use super::errors::RequestError;
use super::lists::for_each_listed;
use super::target::K8sTarget;
use crate::core::audit::AuditObject;
use crate::core::identity::parse_identity;
use crate::core::labels::canonical_key;

/// The annotation Cilium's operator puts on an identity it will delete (its GC's mark).
pub const HEARTBEAT_ANNOTATION: &str = "io.cilium.heartbeat";

impl K8sTarget {
    /// Every identity object, with its labels and the GC's mark.
    pub async fn identities_with_marks(&self) -> Result<Vec<AuditObject>, RequestError> {
        let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumIdentity");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumidentities");
        let api: Api<DynamicObject> = Api::all_with(self.kube_client(), &resource);
        // By id: a list started over repeats what the first attempt saw.
        let mut out = std::collections::BTreeMap::new();
        for_each_listed(
            &api,
            || {},
            |obj| {
                let gc_marked = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(HEARTBEAT_ANNOTATION));
                let name = obj.metadata.name.clone().unwrap_or_default();
                let Ok(id) = crate::core::kvstore::parse_id(name.as_bytes()) else {
                    return;
                };
                let mut value = obj.data.clone();
                value["metadata"] = serde_json::json!({ "name": name });
                if let Ok(parsed) = parse_identity(&value) {
                    let labels = canonical_key(&parsed.labels);
                    out.insert(
                        id,
                        AuditObject {
                            id,
                            labels,
                            gc_marked,
                        },
                    );
                }
            },
        )
        .await?;
        Ok(out.into_values().collect())
    }
}
