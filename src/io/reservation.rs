//! `sync --reserve-in-kvstore`: the only writes this tool ever makes to etcd, and only to keys
//! of its own. For an identity that exists in Kubernetes but not in the kvstore, one
//! transaction writes, only if the master key does not exist (`create_revision == 0`), the
//! master key `id/<n>` with the label key and a `value/<label key>/cilium-idmig-sync` key on
//! the tool's lease. A kvstore-mode agent then sees the id as taken and, for those labels,
//! finds the id under `value/` and reuses it. Releasing deletes a master key only if it is
//! still the one written (`mod_revision`) and no other `value/` key refers to it.
//! The same operations run on etcd and on the demo's in-memory kvstore.

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::core::kvstore::{RESERVATION_NODE, normalize_prefix};
use crate::error::{Error, Result};
use crate::io::etcd::EtcdConnection;
use crate::io::mem_kv::MemKv;

pub use crate::core::sync::reserve::writer::{LEASE_TTL_SECS, Released, Reserved};

/// Where reservations are written: etcd, or the demo's in-memory kvstore.
#[derive(Clone)]
pub enum Reserver {
    Etcd(Box<EtcdConnection>),
    Memory(Arc<MemKv>),
}

fn master_key(prefix: &str, id: u32) -> Vec<u8> {
    format!("{}id/{id}", normalize_prefix(prefix)).into_bytes()
}

fn slave_key(prefix: &str, label_key: &[u8]) -> Vec<u8> {
    let mut key = format!("{}value/", normalize_prefix(prefix)).into_bytes();
    key.extend_from_slice(label_key);
    key.push(b'/');
    key.extend_from_slice(RESERVATION_NODE.as_bytes());
    key
}

/// `value/<label key>/`: every node's key for these labels.
fn users_prefix(prefix: &str, label_key: &[u8]) -> Vec<u8> {
    let mut key = format!("{}value/", normalize_prefix(prefix)).into_bytes();
    key.extend_from_slice(label_key);
    key.push(b'/');
    key
}

impl Reserver {
    fn err(&self, what: &str, e: impl Into<crate::error::BoxError>) -> Error {
        match self {
            Reserver::Etcd(c) => Error::etcd(c.endpoints().join(","), what, e),
            Reserver::Memory(_) => Error::Config(format!("{what}: {}", e.into())),
        }
    }

    /// A lease of the tool's own (Cilium's TTL), for its `value/` keys.
    pub async fn grant_lease(&self) -> Result<i64> {
        match self {
            Reserver::Etcd(c) => Ok(c
                .client()
                .lease_grant(LEASE_TTL_SECS, None)
                .await
                .map_err(|e| self.err("granting the reservation lease", e))?
                .id()),
            Reserver::Memory(kv) => Ok(kv.grant_lease()),
        }
    }

    /// One keep-alive of the lease; call it well within the TTL. `false` when the lease is
    /// gone (it expired while etcd was out of reach, or was revoked): its keys went with it.
    pub async fn keep_alive(&self, lease: i64) -> Result<bool> {
        match self {
            Reserver::Etcd(c) => {
                let (mut keeper, mut stream) = match c.client().lease_keep_alive(lease).await {
                    Ok(k) => k,
                    // The client's word for a TTL of 0 in the first answer.
                    Err(etcd_client::Error::LeaseKeepAliveError(e)) if e == "lease not found" => {
                        return Ok(false);
                    }
                    Err(e) => return Err(self.err("keeping the reservation lease", e)),
                };
                keeper
                    .keep_alive()
                    .await
                    .map_err(|e| self.err("keeping the reservation lease", e))?;
                match stream.message().await {
                    // etcd answers a lease it does not know with a TTL of 0.
                    Ok(Some(r)) => Ok(r.ttl() > 0),
                    Ok(None) => Err(self.err(
                        "keeping the reservation lease",
                        "the keep-alive stream closed",
                    )),
                    Err(e) => Err(self.err("keeping the reservation lease", e)),
                }
            }
            Reserver::Memory(kv) => Ok(kv.lease_alive(lease)),
        }
    }

    /// Writes the tool's `value/` key for `label_key` again, on `lease`, if the master key
    /// `id/<id>` is still the one written at `revision`; `false` when it changed since.
    pub async fn restore(
        &self,
        prefix: &str,
        id: u32,
        label_key: &[u8],
        revision: i64,
        lease: i64,
    ) -> Result<bool> {
        let (master, slave) = (master_key(prefix, id), slave_key(prefix, label_key));
        let value = id.to_string().into_bytes();
        match self {
            Reserver::Etcd(c) => {
                let txn = Txn::new()
                    .when([Compare::mod_revision(master, CompareOp::Equal, revision)])
                    .and_then([TxnOp::put(
                        slave,
                        value,
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                let resp = c
                    .client()
                    .txn(txn)
                    .await
                    .map_err(|e| self.err("restoring a reservation", e))?;
                Ok(resp.succeeded())
            }
            Reserver::Memory(kv) => {
                Ok(kv.put_if_unchanged(&master, revision, &slave, &value, lease))
            }
        }
    }

    /// The revision the master key of `id` was last written at, if it exists: whether a
    /// reservation is still the key it wrote.
    pub async fn master_revision(&self, prefix: &str, id: u32) -> Result<Option<i64>> {
        let master = master_key(prefix, id);
        match self {
            Reserver::Etcd(c) => {
                let resp = c
                    .client()
                    .get(master, None)
                    .await
                    .map_err(|e| self.err("reading a reserved master key", e))?;
                Ok(resp.kvs().first().map(|kv| kv.mod_revision()))
            }
            Reserver::Memory(kv) => Ok(kv.mod_revision(&master)),
        }
    }

    /// Revokes the lease: every `value/` key of the tool's goes with it.
    pub async fn revoke(&self, lease: i64) -> Result<()> {
        match self {
            Reserver::Etcd(c) => {
                c.client()
                    .lease_revoke(lease)
                    .await
                    .map_err(|e| self.err("revoking the reservation lease", e))?;
                Ok(())
            }
            Reserver::Memory(kv) => {
                kv.revoke_lease(lease);
                Ok(())
            }
        }
    }

    /// Reserves `id` for `label_key`, only if the kvstore does not hold the id.
    pub async fn reserve(
        &self,
        prefix: &str,
        id: u32,
        label_key: &[u8],
        lease: i64,
    ) -> Result<Reserved> {
        let (master, slave) = (master_key(prefix, id), slave_key(prefix, label_key));
        let value = id.to_string().into_bytes();
        match self {
            Reserver::Etcd(c) => {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        master.clone(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([
                        TxnOp::put(master.clone(), label_key.to_vec(), None),
                        TxnOp::put(slave, value, Some(PutOptions::new().with_lease(lease))),
                    ])
                    .or_else([TxnOp::get(master, None)]);
                let resp = c
                    .client()
                    .txn(txn)
                    .await
                    .map_err(|e| self.err("reserving an id", e))?;
                let revision = resp.header().map_or(0, |h| h.revision());
                if resp.succeeded() {
                    return Ok(Reserved::Written { revision });
                }
                let held = resp
                    .op_responses()
                    .into_iter()
                    .find_map(|r| match r {
                        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                        _ => None,
                    })
                    .unwrap_or_default();
                Ok(Reserved::Held(held))
            }
            Reserver::Memory(kv) => Ok(
                match kv.create_pair(&master, label_key, &slave, &value, lease) {
                    Ok(revision) => Reserved::Written { revision },
                    Err(held) => Reserved::Held(held),
                },
            ),
        }
    }

    /// Deletes the tool's `value/` key for `label_key` (its object went from Kubernetes).
    pub async fn unreserve(&self, prefix: &str, label_key: &[u8]) -> Result<bool> {
        let slave = slave_key(prefix, label_key);
        match self {
            Reserver::Etcd(c) => Ok(c
                .client()
                .delete(slave, None)
                .await
                .map_err(|e| self.err("deleting a reservation", e))?
                .deleted()
                > 0),
            Reserver::Memory(kv) => Ok(kv.delete(&slave)),
        }
    }

    /// Deletes the master key `id/<id>` written at `revision`, if it is unchanged since and
    /// no `value/` key refers to its labels (call it after revoking the lease).
    pub async fn release(
        &self,
        prefix: &str,
        id: u32,
        label_key: &[u8],
        revision: i64,
    ) -> Result<Released> {
        let master = master_key(prefix, id);
        let users = users_prefix(prefix, label_key);
        match self {
            Reserver::Etcd(c) => {
                let mut client = c.client();
                // Whether a node uses it is checked in the delete itself, so an agent that
                // starts using the id (its `value/` key) just before keeps it. Over a
                // prefix, etcd's compare holds only if every key under it does, and `version
                // == 0` holds for none: so it holds exactly when no key is there.
                let txn = Txn::new()
                    .when([
                        Compare::mod_revision(master.clone(), CompareOp::Equal, revision),
                        Compare::version(users.clone(), CompareOp::Equal, 0).with_prefix(),
                    ])
                    .and_then([TxnOp::delete(master.clone(), None)])
                    .or_else([
                        TxnOp::get(master, None),
                        TxnOp::get(
                            users,
                            Some(GetOptions::new().with_prefix().with_count_only()),
                        ),
                    ]);
                let resp = client
                    .txn(txn)
                    .await
                    .map_err(|e| self.err("releasing a reservation", e))?;
                if resp.succeeded() {
                    return Ok(Released::Deleted);
                }
                let used_now = resp.op_responses().into_iter().any(
                    |r| matches!(r, TxnOpResponse::Get(g) if g.count() > 0 && g.kvs().is_empty()),
                );
                Ok(Released::Kept(if used_now {
                    "a node's value/ key uses it"
                } else {
                    "changed since it was written"
                }))
            }
            Reserver::Memory(kv) => {
                if !kv.range(&users).0.is_empty() {
                    return Ok(Released::Kept("a node's value/ key uses it"));
                }
                Ok(if kv.delete_if_unchanged(&master, revision) {
                    Released::Deleted
                } else {
                    Released::Kept("changed since it was written")
                })
            }
        }
    }

    /// Whether these credentials may write under the identities prefix, without touching a
    /// key of the cluster's: a key of the tool's own is written and deleted at once.
    pub async fn probe_write(&self, prefix: &str) -> Result<()> {
        let key = format!(
            "{}cilium-idmig-write-check/{}",
            normalize_prefix(prefix),
            std::process::id()
        )
        .into_bytes();
        match self {
            Reserver::Etcd(c) => {
                let mut client = c.client();
                client.put(key.clone(), b"".to_vec(), None).await.map_err(|e| {
                    Error::Config(format!(
                        "--reserve-in-kvstore writes under {prefix}/ and these etcd credentials may not ({}): grant their role readwrite on the prefix, e.g. `etcdctl role grant-permission ROLE --prefix=true readwrite {prefix}/`",
                        self.err("write check", e)
                    ))
                })?;
                client
                    .delete(key, None)
                    .await
                    .map_err(|e| self.err("write check", e))?;
                Ok(())
            }
            Reserver::Memory(_) => Ok(()),
        }
    }
}
