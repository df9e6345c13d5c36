//! What a run works on: both ends, the cluster scope, the decision log, how writes are
//! tuned. Shared by the engine service and `sync` (a leaf, so neither imports the other).

use std::path::PathBuf;
use std::sync::Arc;

use crate::apply::executor::ApplyOptions;
use crate::core::range::ClusterScope;
use crate::io::decision_log::{DecisionLog, Session};
use crate::io::k8s::K8sTarget;
use crate::io::kv_source::KvSource;

/// What the service needs to run.
pub struct ServiceConfig {
    pub kv: KvSource,
    pub target: K8sTarget,
    pub scope: ClusterScope,
    pub log: Arc<DecisionLog>,
    pub apply: ApplyOptions,
    /// Which command runs it (`tui`, `apply`, `rollback`), for the log's session line.
    pub command: &'static str,
    /// Decision logs to resume on the first scan (`--resume`).
    pub resume: Vec<PathBuf>,
    /// A sync started from the TUI reserves in the kvstore (`--reserve-in-kvstore`).
    pub sync_reserve_in_kvstore: bool,
    /// The namespace Cilium runs in, whose `cilium-config` the Switch screen reads.
    pub cilium_namespace: String,
}

impl ServiceConfig {
    /// The session line that opens this run's part of the decision log.
    pub fn session(&self) -> Session {
        Session {
            command: self.command.to_string(),
            server: self.target.server.clone(),
            context: self.target.context.clone(),
            kvstore_endpoints: self.kv.endpoints(),
            kvstore_prefix: self.kv.prefix(),
            cluster_id: self.scope.cluster_id,
            max_connected_clusters: self.scope.max_connected_clusters,
            run: Some(crate::io::decision_log::run_id().to_string()),
        }
    }
}
