//! Sync's reservations in the kvstore (`--reserve-in-kvstore`, off by default): every
//! `CiliumIdentity` in range whose id the kvstore does not hold (objects CRD-mode agents
//! created, sync's own remap targets) is reserved there, so that a kvstore-mode agent's pool
//! drops the id and an agent allocating the same labels finds and reuses it: split
//! allocations are prevented instead of reported. Each write and delete is a decision-log
//! line and counted; the lease is kept alive, revoked at cutover (or on a clean stop with
//! `--release-reservations`), and then each master key written is deleted if it is unchanged
//! and no node uses it. A killed sync leaves its keys to lapse with the lease.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tokio::sync::mpsc;

use super::metrics::Metrics;
use crate::core::kvstore::RESERVATION_NODE;
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::planner::Kind;
use crate::core::range::IdRange;
use crate::error::Result;
use crate::io::decision_log::{DecisionLog, Record};
use crate::io::kv_source::KvFollower;
use crate::io::reservation::{LEASE_TTL_SECS, Released, Reserved, Reserver};

/// What sync holds in the kvstore.
pub struct Reservations {
    reserver: Reserver,
    prefix: String,
    lease: i64,
    /// Reserved ids: the label key and the revision of the master key's write.
    held: BTreeMap<u32, (LabelKey, i64)>,
    /// Ids found held in the kvstore meanwhile (nothing written; a split is reported by the
    /// watch if the labels differ).
    tried: HashSet<u32>,
    keepalive: tokio::task::JoinHandle<()>,
}

impl Drop for Reservations {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// A line about a kvstore write: `action` is what sync did (a rule's, never a person's).
fn line(id: u32, labels: &str, action: &str, kvstore: String) -> Record {
    let mut r = Record::decision(
        &id.to_string(),
        labels,
        Kind::Create,
        (action, "rule"),
        Some(id),
    );
    r.kvstore = Some(kvstore);
    r
}

impl Reservations {
    /// Checks that these credentials may write under the prefix (a key of the tool's own,
    /// deleted at once), takes a lease and keeps it alive.
    /// A keep-alive that fails is said on `troubles` (and tried again at the next interval).
    pub async fn start(
        conn: &KvFollower,
        prefix: &str,
        troubles: mpsc::Sender<String>,
    ) -> Result<Self> {
        let reserver = conn.reserver();
        reserver.probe_write(prefix).await?;
        let lease = reserver.grant_lease().await?;
        let keepalive = {
            let reserver = reserver.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(LEASE_TTL_SECS as u64 / 3)).await;
                    if let Err(e) = reserver.keep_alive(lease).await {
                        let _ = troubles.send(format!("{e}; trying again")).await;
                    }
                }
            })
        };
        Ok(Reservations {
            reserver,
            prefix: prefix.to_string(),
            lease,
            held: BTreeMap::new(),
            tried: HashSet::new(),
            keepalive,
        })
    }

    pub fn count(&self) -> usize {
        self.held.len()
    }

    /// Reserves each id in range that Kubernetes holds and the kvstore does not (at start,
    /// and after a fresh list).
    pub async fn reserve_missing(
        &mut self,
        k8s: &BTreeMap<u32, LabelKey>,
        masters: &BTreeMap<Vec<u8>, Vec<u8>>,
        range: IdRange,
        log: &DecisionLog,
        metrics: &Metrics,
    ) -> Result<()> {
        for (id, labels) in k8s {
            self.reserve_one(*id, labels, masters, range, log, metrics)
                .await?;
        }
        Ok(())
    }

    /// Reserves `id` for `labels` if it is in range, the kvstore does not hold it, and it was
    /// neither reserved nor found held before.
    pub async fn reserve_one(
        &mut self,
        id: u32,
        labels: &LabelKey,
        masters: &BTreeMap<Vec<u8>, Vec<u8>>,
        range: IdRange,
        log: &DecisionLog,
        metrics: &Metrics,
    ) -> Result<()> {
        if !range.contains(id)
            || self.held.contains_key(&id)
            || self.tried.contains(&id)
            || masters.contains_key(id.to_string().as_bytes())
            // Labels that are no valid label key (an object no agent wrote) are never written.
            || valid_label_key(labels.as_bytes()).is_err()
        {
            return Ok(());
        }
        match self
            .reserver
            .reserve(&self.prefix, id, labels.as_bytes(), self.lease)
            .await?
        {
            Reserved::Written { revision } => {
                // No write without its log line: a log that cannot be written stops here.
                log.append(line(
                    id,
                    labels,
                    "reserve-in-kvstore",
                    format!(
                        "put id/{id} and value/{labels}/{RESERVATION_NODE} at revision {revision}: reserved"
                    ),
                ))?;
                metrics.kvstore_writes.inc_by(2);
                self.held.insert(id, (labels.clone(), revision));
            }
            Reserved::Held(other) => {
                log.append(line(
                    id,
                    labels,
                    "reserve-in-kvstore",
                    format!(
                        "id/{id} already held for {}: nothing written",
                        String::from_utf8_lossy(&other)
                    ),
                ))?;
                self.tried.insert(id);
            }
        }
        metrics.kvstore_reservations.set(self.held.len() as i64);
        Ok(())
    }

    /// The reserved object went from Kubernetes (GC, a person): its `value/` key goes too.
    pub async fn object_deleted(&mut self, id: u32, log: &DecisionLog, metrics: &Metrics) {
        let Some((labels, _)) = self.held.get(&id) else {
            return;
        };
        if let Ok(true) = self
            .reserver
            .unreserve(&self.prefix, labels.as_bytes())
            .await
        {
            metrics.kvstore_writes.inc();
            let _ = log.append(line(
                id,
                labels,
                "unreserve",
                format!(
                    "deleted value/{labels}/{RESERVATION_NODE}: its CiliumIdentity was deleted"
                ),
            ));
        }
    }

    /// Revokes the lease (every `value/` key of the tool's goes), then deletes each master
    /// key written that is unchanged and unused.
    pub async fn release(self, log: &DecisionLog, metrics: &Metrics) -> Result<usize> {
        self.reserver.revoke(self.lease).await?;
        let mut deleted = 0;
        for (id, (labels, revision)) in &self.held {
            let what = match self
                .reserver
                .release(&self.prefix, *id, labels.as_bytes(), *revision)
                .await?
            {
                Released::Deleted => {
                    metrics.kvstore_writes.inc();
                    deleted += 1;
                    format!("deleted id/{id} (written at revision {revision}): released")
                }
                Released::Kept(why) => format!("kept id/{id}: {why}"),
            };
            let _ = log.append(line(*id, labels, "release-reservation", what));
        }
        metrics.kvstore_reservations.set(0);
        Ok(deleted)
    }
}
