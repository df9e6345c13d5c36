//! The one-writer Lease (`coordination.k8s.io/v1`) through kube's typed `Api<Lease>`: read
//! it, create it, and replace it only at the resourceVersion it was read at, so two writers
//! can never both believe they took it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

use super::k8s::{K8sTarget, RequestError, kube_call};

/// Longest wait for one lease request.
const LEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// One lease, by namespace and name.
#[derive(Clone)]
pub struct LeaseApi {
    api: Api<Lease>,
    pub namespace: String,
    pub name: String,
}

impl LeaseApi {
    pub fn new(target: &K8sTarget, namespace: &str, name: &str) -> Self {
        LeaseApi {
            api: Api::namespaced(target.kube_client(), namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The lease, `None` when it does not exist.
    pub async fn get(&self) -> Result<Option<Lease>, RequestError> {
        kube_call(LEASE_TIMEOUT, self.api.get_opt(&self.name)).await
    }

    /// Creates the lease; a 409 (`is_already_exists`) when another writer created it first.
    pub async fn create(&self, lease: &Lease) -> Result<Lease, RequestError> {
        kube_call(
            LEASE_TIMEOUT,
            self.api.create(&PostParams::default(), lease),
        )
        .await
    }

    /// Replaces the lease at the resourceVersion in `lease.metadata`; a 409 (`is_conflict`)
    /// when it changed since.
    pub async fn replace(&self, lease: &Lease) -> Result<Lease, RequestError> {
        kube_call(
            LEASE_TIMEOUT,
            self.api.replace(&self.name, &PostParams::default(), lease),
        )
        .await
    }
}
