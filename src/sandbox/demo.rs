//! The demo's world: a sandbox API server and a live in-memory kvstore, seeded from the
//! generator with identities of every kind, or, for a rehearsal, from dumps of the
//! operator's own cluster; `rollout` plays the rollout on it. Needs no etcd, no
//! Kubernetes, no network.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::generator::{self, GenConfig};
use super::{FaultConfig, Sandbox, SandboxConfig};
use crate::core::kvstore::DEFAULT_PREFIX;
use crate::error::Result;
use crate::io::kv_source::KvSource;
use crate::io::mem_kv::{self, MemKv};
use crate::io::snapshot_file;

/// How the demo world is made.
#[derive(Debug, Clone, Default)]
pub struct DemoConfig {
    pub identities: usize,
    pub seed: u64,
    /// Port of the sandbox API server on 127.0.0.1 (0 picks one).
    pub port: u16,
    /// Latency the sandbox adds to every identity request.
    pub latency: Option<Duration>,
    /// Kvstore-mode nodes of the generated cluster (each uses some of its identities).
    pub nodes: u32,
    /// A rehearsal: the kvstore from this `etcdctl get -w json` dump instead of generated data.
    pub kvstore_dump: Option<PathBuf>,
    /// With `kvstore_dump`: the Kubernetes side from this `kubectl get -o json` dump (else
    /// the sandbox starts with no identity, as a cluster that never ran CRD mode).
    pub k8s_dump: Option<PathBuf>,
    /// With `kvstore_dump`: the prefix its keys live under, when Cilium was set up with
    /// another than the default (`None`: the default). The rehearsal keeps them under the
    /// default.
    pub dump_prefix: Option<String>,
}

/// The keys under `from`, moved under `to` (the dump checked each is under `from`).
fn rebase(keys: snapshot_file::DumpedKeys, from: &str, to: &str) -> snapshot_file::DumpedKeys {
    let (from, to) = (
        crate::core::kvstore::normalize_prefix(from),
        crate::core::kvstore::normalize_prefix(to),
    );
    if from == to {
        return keys;
    }
    keys.into_iter()
        .map(|(k, v)| match k.strip_prefix(from.as_bytes()) {
            Some(rest) => ([to.as_bytes(), rest].concat(), v),
            None => (k, v),
        })
        .collect()
}

/// Starts the sandbox seeded with the Kubernetes side of a generated dataset, and returns
/// it with the kvstore side as an in-memory source.
/// How many of the demo's identities get a pod.
const DEMO_PODS: usize = 400;

pub async fn world(cfg: DemoConfig) -> Result<DemoWorld> {
    // Read (and refuse) the dumps before anything starts.
    let (keys, k8s) = match &cfg.kvstore_dump {
        Some(path) => {
            let prefix = cfg.dump_prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
            let keys = snapshot_file::read_etcd_dump(path, prefix)?;
            let keys = rebase(keys, prefix, DEFAULT_PREFIX);
            let k8s = match &cfg.k8s_dump {
                Some(p) => snapshot_file::read_k8s_dump(p)?,
                None => Vec::new(),
            };
            (keys, k8s)
        }
        None => {
            let data = generator::generate(&GenConfig {
                identities: cfg.identities,
                seed: cfg.seed,
                nodes: cfg.nodes.max(1),
                ..Default::default()
            })?;
            (
                data.kvstore_keys(DEFAULT_PREFIX, |n| format!("node-{}", n + 1)),
                data.k8s,
            )
        }
    };
    // The decision log names the world, so a later demo of it finds this one's decisions.
    let name = match &cfg.kvstore_dump {
        Some(path) => format!("{} ({})", mem_kv::ENDPOINT, path.display()),
        None => format!(
            "{} (seed {}, {} identities)",
            mem_kv::ENDPOINT,
            cfg.seed,
            cfg.identities
        ),
    };
    // Pods for the Switch screen, made from the identities before the kvstore takes them.
    let (pods, namespaces) = super::pods::demo_pods(&keys, DEFAULT_PREFIX, DEMO_PODS);
    let (kv, leases) = mem_kv::seeded(keys);
    let kv = kv.named(name);
    let sandbox = Sandbox::start(SandboxConfig {
        port: cfg.port,
        ..Default::default()
    })
    .await?;
    for (id, labels) in &k8s {
        sandbox.seed_identity(*id, labels);
    }
    for (name, ns) in namespaces {
        sandbox.add_namespace(&name, ns);
    }
    for pod in pods {
        sandbox.add_pod(pod);
    }
    if let Some(latency) = cfg.latency {
        sandbox.set_faults(FaultConfig {
            latency,
            ..Default::default()
        });
    }
    Ok(DemoWorld {
        sandbox,
        kv: Arc::new(kv),
        leases,
    })
}

/// The demo's world: the sandbox API server, the live in-memory kvstore, and the leases of
/// its kvstore-mode nodes (which the rollout revokes as each node moves to CRD mode).
pub struct DemoWorld {
    pub sandbox: Sandbox,
    pub kv: Arc<MemKv>,
    pub leases: BTreeMap<String, i64>,
}

impl DemoWorld {
    pub fn kv_source(&self) -> KvSource {
        KvSource::Live(self.kv.clone())
    }
}
