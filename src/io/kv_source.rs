//! Where the kvstore identities come from: a real etcd (read only), or an in-memory snapshot
//! (the demo's, or a test's). Both answer the same two reads.

use crate::core::kvstore::{KvSnapshot, NodeCounts};
use crate::error::Result;
use crate::io::etcd::{self, EtcdOptions};

/// Where the kvstore identities come from.
#[derive(Debug, Clone)]
pub enum KvSource {
    Etcd(EtcdOptions),
    /// An in-memory kvstore (the demo's, or a test's).
    Memory(KvSnapshot),
}

impl KvSource {
    /// The endpoints this source reads, as a plan and a decision log record them.
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            KvSource::Etcd(o) => o.endpoints.clone(),
            KvSource::Memory(s) => s.source.endpoints.clone(),
        }
    }

    /// The kvstore prefix this source reads, as a plan records it.
    pub fn prefix(&self) -> String {
        match self {
            KvSource::Etcd(o) => o.prefix.trim_end_matches('/').to_string(),
            KvSource::Memory(s) => s.source.prefix.clone(),
        }
    }

    pub async fn read(&self) -> Result<KvSnapshot> {
        match self {
            KvSource::Etcd(opts) => etcd::read_snapshot(opts).await,
            KvSource::Memory(s) => Ok(s.clone()),
        }
    }

    /// The identities alone, without node counts (the quick half of a read).
    pub async fn read_masters(&self) -> Result<KvSnapshot> {
        match self {
            KvSource::Etcd(opts) => {
                etcd::EtcdConnection::connect(opts)
                    .await?
                    .read_masters(&opts.prefix, opts.page_size)
                    .await
            }
            KvSource::Memory(s) => Ok(KvSnapshot {
                node_counts: Default::default(),
                ..s.clone()
            }),
        }
    }

    /// Nodes using each label key, at the snapshot's revision (the slow half of a read).
    pub async fn count_nodes(&self, snap: &KvSnapshot) -> Result<NodeCounts> {
        match self {
            KvSource::Etcd(opts) => {
                etcd::EtcdConnection::connect(opts)
                    .await?
                    .count_nodes(snap, opts.page_size)
                    .await
            }
            KvSource::Memory(s) => Ok(s.node_counts.clone()),
        }
    }
}
