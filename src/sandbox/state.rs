//! The sandbox's state shared by its routes: how it was started, the object store, the
//! injected faults and the request counters.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::faults::{FaultConfig, Rng};
use super::store::Store;

/// How the sandbox starts.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// How long a new CRD stays un-Established (its resource answers a plain 404 meanwhile).
    pub crd_establish_delay: Duration,
    /// Install the CiliumIdentity CRD at start.
    pub with_crd: bool,
    /// Require this bearer token on every request (401 otherwise).
    pub token: Option<String>,
    /// `(verb, resource)` pairs that SelfSubjectAccessReview denies.
    pub denied: Vec<(String, String)>,
    pub seed: u64,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            crd_establish_delay: Duration::from_millis(300),
            with_crd: true,
            token: None,
            denied: Vec::new(),
            seed: 1,
            port: 0,
        }
    }
}

pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub faults: Mutex<(FaultConfig, Rng)>,
    pub counts: Mutex<HashMap<String, u64>>,
    pub config: SandboxConfig,
}

impl Shared {
    /// The store, even after a panic elsewhere poisoned its lock (the data stays consistent:
    /// every change is made under the lock in one step).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}
