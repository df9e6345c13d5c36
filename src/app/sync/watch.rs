//! Sync's two watches: the kvstore's and Kubernetes', each watched again after a failure
//! from where it left off, delivering to the loop over channels. A 410 from Kubernetes means
//! one consistent list, handed to the loop as `Relisted`. Each failure goes to the loop for
//! the shell to judge (`Shell::failed`, as the simulation's are): a refusal ends the round
//! and its watches with it; anything else is watched again after the backoff's wait.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc;

use super::fatal::{failed, failed_as, request_fault};
use crate::app::config::ServiceConfig;
use crate::app::metrics::{Metrics, Source};
use crate::core::sync::failure::{self, Path};
use crate::core::sync::shell::Failed;
use crate::io::etcd::KvWatchEvent;
use crate::io::k8s::{K8sChange, ReadMode};
use crate::io::kv_source::KvFollower;
use crate::io::retry::{Backoff, Policy};

/// Follows the kvstore, watching again from the last revision after a failure.
pub async fn follow_kvstore(
    (conn, prefix): (KvFollower, String),
    mut revision: i64,
    tx: mpsc::Sender<KvWatchEvent>,
    metrics: Arc<Metrics>,
    failures: mpsc::Sender<Failed>,
) {
    let mut backoff = Backoff::new(Policy::FOLLOW);
    loop {
        let (inner_tx, mut inner_rx) = mpsc::channel(256);
        let watch = {
            let (conn, prefix) = (conn.clone(), prefix.clone());
            tokio::spawn(async move { conn.watch_identities(&prefix, revision, inner_tx).await })
        };
        while let Some(ev) = inner_rx.recv().await {
            backoff.reset();
            metrics.heard(Source::Etcd);
            match ev {
                KvWatchEvent::Connected => metrics.etcd_live.store(true, Ordering::Relaxed),
                // Heard; nothing for the loop.
                KvWatchEvent::Progress { revision: r } => {
                    revision = revision.max(r);
                    continue;
                }
                _ => {}
            }
            if let KvWatchEvent::Changes { revision: r, .. } = &ev {
                revision = *r;
            }
            let compacted = matches!(ev, KvWatchEvent::Compacted { .. });
            if tx.send(ev).await.is_err() || compacted {
                watch.abort();
                return;
            }
        }
        metrics.etcd_live.store(false, Ordering::Relaxed);
        if let Ok(Err(e)) = watch.await {
            let again = |t| format!("{t}; watching again from revision {revision}");
            let f = failed(Path::KvWatch, "watching the kvstore", &e, again);
            if failures.send(f).await.is_err() {
                return;
            }
        }
        backoff.wait().await;
    }
}

/// Follows Kubernetes, watching again from the last version after a failure; a 410 means
/// a fresh list (`Expired` tells the sync loop).
pub async fn follow_kubernetes(
    cfg: Arc<ServiceConfig>,
    mut version: String,
    tx: mpsc::Sender<K8sChange>,
    metrics: Arc<Metrics>,
    failures: mpsc::Sender<Failed>,
) {
    let mut backoff = Backoff::new(Policy::FOLLOW);
    loop {
        let (inner_tx, mut inner_rx) = mpsc::channel(1024);
        let watch = {
            let (cfg, version) = (cfg.clone(), version.clone());
            tokio::spawn(async move { cfg.target.watch_identities(&version, inner_tx).await })
        };
        let mut expired = false;
        let (opened, mut heard) = (Instant::now(), false);
        while let Some(ch) = inner_rx.recv().await {
            heard = true;
            backoff.reset();
            metrics.heard(Source::Kubernetes);
            match &ch {
                K8sChange::Connected => metrics.k8s_live.store(true, Ordering::Relaxed),
                K8sChange::Upsert {
                    resource_version, ..
                }
                | K8sChange::Deleted {
                    resource_version, ..
                }
                | K8sChange::Bookmark { resource_version } => version = resource_version.clone(),
                K8sChange::Expired => expired = true,
                K8sChange::Relisted { .. } => {}
            }
            if tx.send(ch).await.is_err() {
                watch.abort();
                return;
            }
        }
        let ended = watch.await;
        if matches!(ended, Ok(Ok(()))) && failure::closed_at_once(heard, opened.elapsed()) {
            // Ended cleanly at once with nothing said (a proxy closing streams): not again
            // at once.
            metrics.k8s_live.store(false, Ordering::Relaxed);
            backoff.wait().await;
        }
        if let Ok(Err(e)) = ended {
            metrics.k8s_live.store(false, Ordering::Relaxed);
            // A 401 just after the token file was renewed was sent with the old token.
            let fault = request_fault(&e, cfg.target.sent_with_old_token(&e));
            let doing = "watching ciliumidentities.cilium.io";
            let f = failed_as(Path::K8sWatch, fault, doing, &e, |e| {
                format!("Kubernetes watch: {e}; watching again")
            });
            if failures.send(f).await.is_err() {
                return;
            }
            backoff.wait().await;
        }
        if expired {
            // One consistent list (a cache list can be older than what the watch delivered),
            // handed to the loop and watched on from: the state and the resume point come
            // from the same list.
            loop {
                match cfg.target.list_identities(ReadMode::Consistent, None).await {
                    Ok(k) => {
                        version = k.resource_version.clone();
                        metrics.relists.inc();
                        let relisted = K8sChange::Relisted {
                            identities: k.identities,
                            resource_version: k.resource_version,
                        };
                        if tx.send(relisted).await.is_err() {
                            return;
                        }
                        break;
                    }
                    Err(e) => {
                        let (path, what) = (Path::K8sList, "listing ciliumidentities.cilium.io");
                        let again = |t| format!("listing again after the watch expired: {t}");
                        if failures.send(failed(path, what, &e, again)).await.is_err() {
                            return;
                        }
                        backoff.wait().await;
                    }
                }
            }
        }
    }
}
