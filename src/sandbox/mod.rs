//! The sandbox Kubernetes API server: an in-process HTTP server that follows the API
//! conventions for CRDs and `ciliumidentities` (Status bodies, resourceVersion, uid,
//! creationTimestamp, managedFields, list limit/continue, label selectors, watch, dry runs,
//! discovery and server-side tables for kubectl) and can inject faults. Tests and
//! `cilium-idmig demo` run against it exactly as against a real cluster.

mod config_maps;
pub mod demo;
mod discovery;
pub mod endpoints;
mod faults;
pub mod generator;
mod http;
mod leases;
mod list_watch;
mod openapi;
pub mod pods;
pub mod rollout;
mod selector;
mod server;
mod state;
mod store;
mod writes;

pub use faults::{Fault, FaultConfig, Rng};
pub use selector::Selector;
use state::Shared;
pub use state::{ReadModel, Release, SandboxConfig};

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::core::identity::{CRD_YAML, identity_object};
use crate::core::labels::SecurityLabels;
use crate::error::{Error, Result};

/// A running sandbox. Dropping it stops the server and closes every connection.
pub struct Sandbox {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Sandbox {
    pub async fn start(config: SandboxConfig) -> Result<Self> {
        let mut store = store::Store::new(config.crd_establish_delay);
        if config.with_crd {
            let crd: Value =
                serde_yaml_ng::from_str(CRD_YAML).map_err(|e| Error::sandbox("", e))?;
            store.install_crd(crd);
            // Installed at start means established from the start.
            if let Some((_, at)) = store.crd.as_mut() {
                *at -= config.crd_establish_delay;
            }
        }
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            faults: Mutex::new((FaultConfig::default(), Rng::new(config.seed))),
            counts: Mutex::new(HashMap::new()),
            config: config.clone(),
            lease_delay: Mutex::new(Duration::ZERO),
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port))
            .await
            .map_err(|e| {
                Error::sandbox(&format!("cannot listen on 127.0.0.1:{}", config.port), e)
            })?;
        let addr = listener.local_addr().map_err(|e| Error::sandbox("", e))?;
        let task = tokio::spawn(server::serve(listener, shared.clone()));
        Ok(Sandbox { addr, shared, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig that points at this sandbox (context `sandbox`), mode 0600.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let user = match &self.shared.config.token {
            Some(t) => format!("  user:\n    token: {t}\n"),
            None => "  user: {}\n".to_string(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: {}\ncontexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: sandbox\ncurrent-context: sandbox\nusers:\n- name: sandbox\n{user}",
            self.url()
        );
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| Error::file_cause(path, e))
    }

    fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.shared.store()
    }

    /// Adds an identity directly, as if another writer had created it.
    pub fn seed_identity(&self, id: u32, labels: &SecurityLabels) {
        let obj = identity_object(id, labels);
        self.store().insert(id.to_string(), obj);
    }

    /// Adds a raw object (for objects no well-behaved writer makes, e.g. `null` label values).
    pub fn seed_raw(&self, name: &str, obj: Value) {
        self.store().insert(name.to_string(), obj);
    }

    /// Ends every watch and forgets the event history, as an API server restart or a watch
    /// cache that moved on does: a watch resumed from an older resourceVersion gets 410.
    pub fn expire_watches(&self) {
        self.store().expire_history();
    }

    /// Deletes an object directly, as the cluster's identity GC would (watchers see it).
    pub fn delete_object(&self, name: &str) -> bool {
        self.store().delete(name).is_some()
    }

    /// Every object, by name.
    pub fn objects(&self) -> BTreeMap<String, Value> {
        self.store().objects.clone()
    }

    /// A handle that writes and reads the store as a CRD-mode agent would (the demo's rollout).
    pub fn agent(&self) -> AgentHandle {
        AgentHandle(self.shared.clone())
    }

    pub fn crd_installed(&self) -> bool {
        self.store().crd.is_some()
    }

    /// Every Lease request waits `delay` before it is served (zero: none).
    pub fn set_lease_delay(&self, delay: Duration) {
        *self
            .shared
            .lease_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = delay;
    }

    pub fn set_faults(&self, faults: FaultConfig) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0 = faults;
    }

    /// Requests served so far, by `METHOD resource` (e.g. `POST ciliumidentities`).
    pub fn request_count(&self, key: &str) -> u64 {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    pub fn reset_counts(&self) {
        self.shared
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Publishes an endpoint in `namespace` that uses `identity`, as an agent does.
    pub fn add_endpoint(&self, namespace: &str, name: &str, identity: u32) {
        self.store().endpoints.insert(
            (namespace.to_string(), name.to_string()),
            endpoints::endpoint_object(namespace, name, identity),
        );
    }

    /// Adds a pod, as the API server stores one.
    pub fn add_pod(&self, pod: Value) {
        let meta = &pod["metadata"];
        let key = (
            meta["namespace"].as_str().unwrap_or_default().to_string(),
            meta["name"].as_str().unwrap_or_default().to_string(),
        );
        self.store().pods.insert(key, pod);
    }

    /// Adds a namespace.
    pub fn add_namespace(&self, name: &str, namespace: Value) {
        self.store().namespaces.insert(name.to_string(), namespace);
    }

    /// Adds a ConfigMap with `data` (Cilium's `cilium-config`, say).
    pub fn add_config_map(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        let cm = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        });
        self.store()
            .config_maps
            .insert((namespace.to_string(), name.to_string()), cm);
    }

    /// A ConfigMap's data, if it exists (sync's published standing, say).
    pub fn config_map_data(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        let store = self.store();
        let cm = store
            .config_maps
            .get(&(namespace.to_string(), name.to_string()))?;
        serde_json::from_value(cm["data"].clone()).ok()
    }

    /// Every Lease, by namespace and name.
    pub fn leases(&self) -> BTreeMap<(String, String), Value> {
        self.store().leases.clone()
    }

    /// Stops serving and drops every open connection: the API server is gone.
    pub fn shutdown(&self) {
        self.task.abort();
    }
}

/// What a simulated CRD-mode agent does to the API server: list the identities, create one
/// by name (refused when the name is taken, as the API server answers 409). Watchers see
/// its writes as they see any client's.
#[derive(Clone)]
pub struct AgentHandle(Arc<Shared>);

impl AgentHandle {
    /// Every identity with a numeric name, with its labels.
    pub fn identities(&self) -> BTreeMap<u32, SecurityLabels> {
        self.0
            .store()
            .objects
            .iter()
            .filter_map(|(name, o)| {
                let id = crate::core::kvstore::parse_id(name.as_bytes()).ok()?;
                let labels = crate::core::identity::parse_identity(o).ok()?.labels;
                Some((id, labels))
            })
            .collect()
    }

    /// Creates identity `id` unless an object of that name exists (false: a 409).
    pub fn create(&self, id: u32, labels: &SecurityLabels, agent: &str) -> bool {
        let mut store = self.0.store();
        let name = id.to_string();
        if store.objects.contains_key(&name) {
            return false;
        }
        store.insert_by(name, identity_object(id, labels), agent);
        true
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.task.abort();
    }
}
