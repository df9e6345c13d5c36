//! The one-writer Lease (`coordination.k8s.io/v1`) through kube's typed `Api<Lease>`: read
//! it, create it, and replace it only at the resourceVersion it was read at, so two writers
//! can never both believe they took it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};

use super::k8s::{K8sTarget, RequestError, kube_call};

/// Longest wait for one lease request: well within the 5 s between renewals, so a renewal
/// on a dead connection fails (and the pooled connections go) in time for the next try.
const LEASE_TIMEOUT: Duration = Duration::from_secs(4);

/// One lease, by namespace and name.
#[derive(Clone)]
pub struct LeaseApi {
    target: K8sTarget,
    pub namespace: String,
    pub name: String,
}

impl LeaseApi {
    pub fn new(target: &K8sTarget, namespace: &str, name: &str) -> Self {
        LeaseApi {
            target: target.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The API, on the target's current connections (new ones after a stall).
    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.target.kube_client(), &self.namespace)
    }

    /// A stalled or failed request drops the pooled connections: a renewal must not wait
    /// on a dead one while the lease runs out.
    fn seen<T>(&self, r: Result<T, RequestError>) -> Result<T, RequestError> {
        if let Err(e) = &r {
            self.target.after_error(e);
        }
        r
    }

    /// The lease, `None` when it does not exist.
    pub async fn get(&self) -> Result<Option<Lease>, RequestError> {
        self.seen(kube_call(LEASE_TIMEOUT, self.api().get_opt(&self.name)).await)
    }

    /// Creates the lease; a 409 (`is_already_exists`) when another writer created it first.
    pub async fn create(&self, lease: &Lease) -> Result<Lease, RequestError> {
        let r = kube_call(
            LEASE_TIMEOUT,
            self.api().create(&PostParams::default(), lease),
        )
        .await;
        self.seen(r)
    }

    /// Replaces the lease at the resourceVersion in `lease.metadata`; a 409 (`is_conflict`)
    /// when it changed since.
    pub async fn replace(&self, lease: &Lease) -> Result<Lease, RequestError> {
        let r = kube_call(
            LEASE_TIMEOUT,
            self.api()
                .replace(&self.name, &PostParams::default(), lease),
        )
        .await;
        self.seen(r)
    }
}
