//! What the operator's identity controller reads, read the same way for the switch report:
//! every pod (labels, service account), every namespace's labels, Cilium's `cilium-config`,
//! every `CiliumIdentity` with its creation time and this tool's run annotation, and the id
//! each `CiliumEndpoint` uses. Lists in pages through kube's typed `Api`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

use super::errors::{RequestError, kube_call};
use super::lists::for_each_listed;
use super::target::K8sTarget;
use crate::core::identity::{RUN_ANNOTATION, parse_identity};
use crate::core::switch::computed::PodFacts;
use crate::core::switch::report::ExistingIdentity;

/// How long a single get may take.
const GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl K8sTarget {
    /// Every pod, as the operator reads it.
    pub async fn pod_facts(&self) -> Result<Vec<PodFacts>, RequestError> {
        let api: Api<Pod> = Api::all(self.kube_client());
        // By namespace/name: a list started over repeats what the first attempt saw.
        let mut out = BTreeMap::new();
        for_each_listed(
            &api,
            || {},
            |pod| {
                let namespace = pod.metadata.namespace.unwrap_or_default();
                let name = pod.metadata.name.unwrap_or_default();
                let spec = pod.spec.unwrap_or_default();
                let facts = PodFacts {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    labels: pod.metadata.labels.unwrap_or_default(),
                    service_account: spec.service_account_name.unwrap_or_default(),
                    host_network: spec.host_network.unwrap_or(false),
                };
                out.insert((namespace, name), facts);
            },
        )
        .await?;
        Ok(out.into_values().collect())
    }

    /// Every namespace's labels, by name.
    pub async fn namespace_labels(
        &self,
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, RequestError> {
        let api: Api<Namespace> = Api::all(self.kube_client());
        let mut out = BTreeMap::new();
        for_each_listed(
            &api,
            || {},
            |ns| {
                out.insert(
                    ns.metadata.name.unwrap_or_default(),
                    ns.metadata.labels.unwrap_or_default(),
                );
            },
        )
        .await?;
        Ok(out)
    }

    /// A ConfigMap's data; `None` when it does not exist.
    pub async fn config_map_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, RequestError> {
        let api: Api<ConfigMap> = Api::namespaced(self.kube_client(), namespace);
        match kube_call(GET_TIMEOUT, api.get_opt(name)).await? {
            Some(cm) => Ok(Some(cm.data.unwrap_or_default())),
            None => Ok(None),
        }
    }

    /// Every identity object with its creation time and this tool's run, if one made it.
    pub async fn identities_for_switch(&self) -> Result<Vec<ExistingIdentity>, RequestError> {
        let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumIdentity");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumidentities");
        let api: Api<DynamicObject> = Api::all_with(self.kube_client(), &resource);
        let mut out = BTreeMap::new();
        for_each_listed(
            &api,
            || {},
            |obj| {
                let name = obj.metadata.name.clone().unwrap_or_default();
                let Ok(id) = crate::core::kvstore::parse_id(name.as_bytes()) else {
                    return;
                };
                let run = obj
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(RUN_ANNOTATION))
                    .cloned();
                let created = obj
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second())
                    .unwrap_or_default();
                let uid = obj.metadata.uid.clone().unwrap_or_default();
                let resource_version = obj.metadata.resource_version.clone().unwrap_or_default();
                let mut value = obj.data;
                value["metadata"] = serde_json::json!({ "name": name });
                if let Ok(parsed) = parse_identity(&value) {
                    out.insert(
                        id,
                        ExistingIdentity {
                            id,
                            labels: parsed.labels,
                            created,
                            run,
                            uid,
                            resource_version,
                        },
                    );
                }
            },
        )
        .await?;
        Ok(out.into_values().collect())
    }
}
