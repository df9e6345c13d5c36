//! Sync's published standing: one ConfigMap beside its Lease, created the first time and
//! replaced at the version read after, never anything else of the namespace. A Lease's
//! annotations would do, but the Lease is renewed every few seconds at the version read:
//! writes of the standing there would race the renewals and could cost the Lease.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use super::errors::{RequestError, kube_call};
use super::target::K8sTarget;

/// How long one write may take: a standing that cannot be written is said and tried again,
/// it never holds sync up.
const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Marks the ConfigMap as this tool's, for `kubectl get cm -l`.
pub const STATUS_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "cilium-idmig");

impl K8sTarget {
    /// Writes `data` to ConfigMap `namespace/name`: created if missing, else replaced at the
    /// version read (a 409 from a write between is tried again at the next turn).
    pub async fn put_status_map(
        &self,
        namespace: &str,
        name: &str,
        data: BTreeMap<String, String>,
    ) -> Result<(), RequestError> {
        let api: Api<ConfigMap> = Api::namespaced(self.kube_client(), namespace);
        let existing = kube_call(WRITE_TIMEOUT, api.get_opt(name)).await?;
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some([(STATUS_LABEL.0.into(), STATUS_LABEL.1.into())].into()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        let pp = PostParams::default();
        match existing {
            None => kube_call(WRITE_TIMEOUT, api.create(&pp, &cm))
                .await
                .map(drop),
            Some(found) => {
                cm.metadata.resource_version = found.metadata.resource_version;
                kube_call(WRITE_TIMEOUT, api.replace(name, &pp, &cm))
                    .await
                    .map(drop)
            }
        }
    }
}
