//! Where the kvstore identities come from: a real etcd (read only), an in-memory snapshot
//! (a test's, a rehearsal's), or the demo's live in-memory kvstore. All answer the same two
//! reads; etcd and the live kvstore can also be followed (`KvFollower`), as sync does.

use std::sync::Arc;

use crate::core::kvstore::{DEFAULT_PREFIX, KvSnapshot, NodeCounts};
use crate::error::{Error, Result};
use crate::io::etcd::{self, EtcdConnection, EtcdOptions, KvWatchEvent};
use crate::io::mem_kv::MemKv;

/// Where the kvstore identities come from.
#[derive(Debug, Clone)]
pub enum KvSource {
    Etcd(EtcdOptions),
    /// An in-memory snapshot (a test's, or a rehearsal's dump): read, never followed.
    Memory(KvSnapshot),
    /// The demo's live in-memory kvstore, which its simulated agents write to.
    Live(Arc<MemKv>),
}

impl KvSource {
    /// The endpoints this source reads, as a plan and a decision log record them.
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            KvSource::Etcd(o) => o.endpoints_used(),
            KvSource::Memory(s) => s.source.endpoints.clone(),
            KvSource::Live(kv) => vec![kv.name().into()],
        }
    }

    /// The kvstore prefix this source reads, as a plan records it.
    pub fn prefix(&self) -> String {
        match self {
            KvSource::Etcd(o) => o.prefix.trim_end_matches('/').to_string(),
            KvSource::Memory(s) => s.source.prefix.clone(),
            KvSource::Live(_) => DEFAULT_PREFIX.into(),
        }
    }

    pub async fn read(&self) -> Result<KvSnapshot> {
        match self {
            KvSource::Etcd(opts) => etcd::read_snapshot(opts).await,
            KvSource::Memory(s) => Ok(s.clone()),
            KvSource::Live(kv) => Ok(kv.snapshot(DEFAULT_PREFIX)),
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
            KvSource::Live(kv) => Ok(KvSnapshot {
                node_counts: Default::default(),
                ..kv.snapshot(DEFAULT_PREFIX)
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
            KvSource::Live(kv) => Ok(kv.snapshot(DEFAULT_PREFIX).node_counts),
        }
    }

    /// The nodes whose `value/` keys use `label_key` now; `None` where the source keeps no
    /// names (a rehearsal's snapshot keeps node counts only).
    pub async fn nodes_using(&self, label_key: &[u8], id: &[u8]) -> Result<Option<Vec<String>>> {
        match self {
            KvSource::Memory(_) => Ok(None),
            _ => {
                let prefix = self.prefix();
                Ok(Some(
                    self.follower()
                        .await?
                        .nodes_using(&prefix, label_key, id)
                        .await?,
                ))
            }
        }
    }

    /// Every `value/` key with the id it holds, at the snapshot's revision; `None` where the
    /// source does not keep them (a rehearsal's snapshot keeps node counts only).
    pub async fn read_value_keys(
        &self,
        snap: &KvSnapshot,
    ) -> Result<Option<Vec<crate::core::audit::ValueKey>>> {
        match self {
            KvSource::Etcd(opts) => Ok(Some(
                etcd::EtcdConnection::connect(opts)
                    .await?
                    .read_value_keys(snap, opts.page_size)
                    .await?,
            )),
            KvSource::Memory(_) => Ok(None),
            KvSource::Live(kv) => {
                let prefix = crate::core::kvstore::normalize_prefix(DEFAULT_PREFIX);
                let (pairs, _) = kv.range(format!("{prefix}value/").as_bytes());
                Ok(Some(
                    pairs
                        .iter()
                        .filter_map(
                            |(k, v)| match crate::core::kvstore::classify_key(&prefix, k) {
                                crate::core::kvstore::KeyKind::Slave { label_key, node } => {
                                    Some(crate::core::audit::ValueKey {
                                        label_key: String::from_utf8_lossy(label_key).into_owned(),
                                        node: String::from_utf8_lossy(node).into_owned(),
                                        id: String::from_utf8_lossy(v).into_owned(),
                                    })
                                }
                                _ => None,
                            },
                        )
                        .collect(),
                ))
            }
        }
    }

    /// A connection that follows this kvstore as it changes (sync's).
    pub async fn follower(&self) -> Result<KvFollower> {
        match self {
            KvSource::Etcd(opts) => Ok(KvFollower::Etcd {
                conn: Box::new(EtcdConnection::connect(opts).await?),
                page_size: opts.page_size,
            }),
            KvSource::Live(kv) => Ok(KvFollower::Live(kv.clone())),
            KvSource::Memory(_) => Err(Error::Config(
                "sync follows a live kvstore, and this snapshot does not change: pass --etcd-endpoints or --etcd-config".into(),
            )),
        }
    }
}

/// A kvstore that can be followed: etcd, or the demo's live in-memory kvstore.
#[derive(Clone)]
pub enum KvFollower {
    Etcd {
        conn: Box<EtcdConnection>,
        page_size: i64,
    },
    Live(Arc<MemKv>),
}

impl KvFollower {
    /// Where `--reserve-in-kvstore` writes: the same kvstore.
    pub fn reserver(&self) -> crate::io::reservation::Reserver {
        match self {
            KvFollower::Etcd { conn, .. } => crate::io::reservation::Reserver::Etcd(conn.clone()),
            KvFollower::Live(kv) => crate::io::reservation::Reserver::Memory(kv.clone()),
        }
    }

    /// Identities and node counts at one revision.
    pub async fn read_snapshot(&self, prefix: &str) -> Result<KvSnapshot> {
        match self {
            KvFollower::Etcd { conn, page_size } => conn.read_snapshot(prefix, *page_size).await,
            KvFollower::Live(kv) => Ok(kv.snapshot(prefix)),
        }
    }

    /// Every change under `prefix` after `revision`, until the receiver goes or it fails.
    pub async fn watch_identities(
        &self,
        prefix: &str,
        revision: i64,
        tx: tokio::sync::mpsc::Sender<KvWatchEvent>,
    ) -> Result<()> {
        match self {
            KvFollower::Etcd { conn, .. } => conn.watch_identities(prefix, revision, tx).await,
            KvFollower::Live(kv) => {
                kv.watch_identities(prefix, revision, tx).await;
                Ok(())
            }
        }
    }

    /// The nodes whose `value/` keys for `label_key` name `id`, now.
    pub async fn nodes_using(
        &self,
        prefix: &str,
        label_key: &[u8],
        id: &[u8],
    ) -> Result<Vec<String>> {
        match self {
            KvFollower::Etcd { conn, .. } => conn.nodes_using(prefix, label_key, id).await,
            KvFollower::Live(kv) => Ok(kv.nodes_using(prefix, label_key, id)),
        }
    }
}
