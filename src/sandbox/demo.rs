//! The demo's world: a sandbox API server and an in-memory kvstore, seeded from the
//! generator with identities of every kind. Needs no etcd, no Kubernetes, no network.

use std::time::Duration;

use super::generator::{self, GenConfig};
use super::{FaultConfig, Sandbox, SandboxConfig};
use crate::core::kvstore::{DEFAULT_PREFIX, KvSnapshot, SourceInfo};
use crate::error::Result;
use crate::io::kv_source::KvSource;

/// How the demo world is made.
#[derive(Debug, Clone, Copy)]
pub struct DemoConfig {
    pub identities: usize,
    pub seed: u64,
    /// Port of the sandbox API server on 127.0.0.1 (0 picks one).
    pub port: u16,
    /// Latency the sandbox adds to every identity request.
    pub latency: Option<Duration>,
}

/// Starts the sandbox seeded with the Kubernetes side of a generated dataset, and returns
/// it with the kvstore side as an in-memory source.
pub async fn world(cfg: DemoConfig) -> Result<(Sandbox, KvSource)> {
    let data = generator::generate(&GenConfig {
        identities: cfg.identities,
        seed: cfg.seed,
        ..Default::default()
    })?;
    let sandbox = Sandbox::start(SandboxConfig {
        port: cfg.port,
        ..Default::default()
    })
    .await?;
    for (id, labels) in &data.k8s {
        sandbox.seed_identity(*id, labels);
    }
    if let Some(latency) = cfg.latency {
        sandbox.set_faults(FaultConfig {
            latency,
            ..Default::default()
        });
    }
    let kv = KvSource::Memory(KvSnapshot {
        source: SourceInfo {
            endpoints: vec!["in-memory demo kvstore".into()],
            revision: 1,
            prefix: DEFAULT_PREFIX.into(),
        },
        masters: data.masters,
        node_counts: (&data.node_counts).into(),
    });
    Ok((sandbox, kv))
}
