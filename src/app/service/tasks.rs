//! The service's jobs, each run as a task of its own: scans, applies and rollbacks with
//! their verify, the drift watch, and what a decision or a resume offer is in the log.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, watch};

use crate::app::flows::{self, ApplyRun, ApplySpec};
use crate::apply::executor::{StopFlag, Watchers};
use crate::apply::outcome::{ApplyEvent, Progress};
use crate::core::verify::VerifyReport;
use crate::error::{Error, Result};
use crate::io::etcd::{Drift, EtcdConnection};
use crate::io::kv_source::KvSource;

use crate::app::config::ServiceConfig;
use crate::app::rollback::RollbackSpec;

use super::events::{ScanResult, ServiceEvent, Task};

/// The decision log line for an operator's decision in a front end.
/// An undo is logged as what is in force after it: the earlier decision it brings back, or
/// `undecided` (back to the proposal), so every line states its identity's decision and a
/// replay never depends on how many lines an earlier decision left.
pub use crate::core::decision_log::decision_record;

/// Starts a scan (resuming `paths` onto it, if any) with a fresh drift watch.
pub(super) fn restart_drift(
    cfg: &Arc<ServiceConfig>,
    drift_task: &mut Option<tokio::task::JoinHandle<()>>,
    tx: &mpsc::Sender<ServiceEvent>,
    generation: u64,
    resume: Vec<PathBuf>,
) {
    if let Some(t) = drift_task.take() {
        t.abort();
    }
    let (drift_tx, drift_rx) = mpsc::channel(16);
    *drift_task = Some(tokio::spawn(watch_drift(cfg.clone(), drift_rx, tx.clone())));
    tokio::spawn(scan(cfg.clone(), generation, resume, drift_tx, tx.clone()));
}

/// The newest decision log in the working directory, other than this run's, that was written
/// for this cluster and kvstore and holds decisions never committed.
pub(super) fn resume_offer(cfg: &ServiceConfig) -> Option<ServiceEvent> {
    let mine = cfg.log.path().canonicalize().ok();
    let session = cfg.session();
    let mut logs: Vec<PathBuf> = std::fs::read_dir(".")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cilium-idmig-decisions-") && n.ends_with(".jsonl"))
        })
        .filter(|p| p.canonicalize().ok() != mine)
        .collect();
    // Their names carry the UTC start time: the newest sorts last.
    logs.sort();
    logs.into_iter().rev().find_map(|path| {
        let c = crate::io::decision_log::read(&path).ok()?;
        let last = c.sessions.last()?;
        let same = same_cluster(&last.session, &session);
        let decisions = c.uncommitted_decisions();
        (same && decisions > 0).then(|| ServiceEvent::ResumeOffer {
            path: path.clone(),
            decisions,
            operator: last.operator.clone(),
            when: last.ts.clone(),
        })
    })
}

/// Whether two sessions worked on one cluster: the same kvstore prefix, cluster ID and mesh
/// layout, reached through the same API server or the same kvstore endpoints. The demo's
/// API server has a new port each run; its kvstore's endpoint names its world (the seed).
pub(super) fn same_cluster(
    a: &crate::io::decision_log::Session,
    b: &crate::io::decision_log::Session,
) -> bool {
    let same_kvstore =
        !a.kvstore_endpoints.is_empty() && a.kvstore_endpoints == b.kvstore_endpoints;
    (a.server == b.server || same_kvstore)
        && a.kvstore_prefix == b.kvstore_prefix
        && a.cluster_id == b.cluster_id
        && a.max_connected_clusters == b.max_connected_clusters
}

/// Reads both sides at once (`flows::read_both`). The kvstore side, usually read first,
/// goes out on its own (`KvRead`, planned without Kubernetes: one extra plan, so the table
/// shows while a large list is still read), and `Listing` events count the objects listed.
pub(super) async fn read_both(
    cfg: &ServiceConfig,
    generation: u64,
    tx: &mpsc::Sender<ServiceEvent>,
) -> Result<flows::Scan> {
    let listed = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let ticker = {
        let (tx, listed) = (tx.clone(), listed.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(LISTING_EVERY);
            loop {
                every.tick().await;
                let ev = ServiceEvent::Listing {
                    generation,
                    listed: listed.load(Ordering::Relaxed),
                    elapsed: started.elapsed(),
                };
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
        })
    };
    let (preview_tx, mut preview_rx) = mpsc::channel(1);
    let relay = {
        let tx = tx.clone();
        tokio::spawn(async move {
            if let Some(items) = preview_rx.recv().await {
                let _ = tx.send(ServiceEvent::KvRead { generation, items }).await;
            }
        })
    };
    let opts = flows::ScanOptions {
        node_counts: false,
        listed: Some(listed),
        kv_first: Some(preview_tx),
    };
    let out = flows::read_both(&cfg.kv, &cfg.target, cfg.scope.range, opts).await;
    ticker.abort();
    let _ = relay.await;
    out
}

/// How often a scan reports the objects listed so far.
const LISTING_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Reads both sides and sends the table (with `resume`'s decisions replayed onto it), then
/// the slower node counts.
pub(super) async fn scan(
    cfg: Arc<ServiceConfig>,
    generation: u64,
    resume: Vec<PathBuf>,
    drift_tx: mpsc::Sender<i64>,
    tx: mpsc::Sender<ServiceEvent>,
) {
    let range = cfg.scope.range;
    let mut scan = match read_both(&cfg, generation, &tx).await {
        Ok(scan) => scan,
        Err(e) => {
            let _ = tx
                .send(ServiceEvent::failed(generation, Task::Scan, e))
                .await;
            return;
        }
    };
    let mut resumed = None;
    if !resume.is_empty() {
        match flows::resume_from_logs(&resume, &scan.items, &scan.k8s.identities, range) {
            Ok(r) => {
                scan.items = r.items;
                resumed = Some(ServiceEvent::Resumed {
                    generation,
                    from: resume,
                    resumed: r.resumed,
                    dropped: r.dropped,
                });
            }
            Err(e) => {
                let _ = tx
                    .send(ServiceEvent::failed(generation, Task::Resume, e))
                    .await;
            }
        }
    }
    let _ = drift_tx.send(scan.kv.source.revision).await;
    let kv = scan.kv;
    let ev = ServiceEvent::Scanned {
        generation,
        scan: Box::new(ScanResult {
            items: scan.items,
            k8s: scan.k8s.identities,
            source: kv.source.clone(),
            crd_present: scan.k8s.crd_present,
            other_names: scan.k8s.other_names.len(),
        }),
    };
    if tx.send(ev).await.is_err() {
        return;
    }
    if let Some(ev) = resumed
        && tx.send(ev).await.is_err()
    {
        return;
    }
    // The table is on screen; now the slow count of node references.
    let ev = match cfg.kv.count_nodes(&kv).await {
        Ok(counts) => ServiceEvent::NodeCounts { generation, counts },
        Err(e) => ServiceEvent::failed(generation, Task::NodeCount, e),
    };
    let _ = tx.send(ev).await;
}

/// One apply, relayed: executor events become service events, the report ends it.
pub(super) async fn apply(
    cfg: Arc<ServiceConfig>,
    generation: u64,
    spec: ApplySpec,
    verify_after: bool,
    tx: mpsc::Sender<ServiceEvent>,
    progress: Arc<watch::Sender<Progress>>,
    stop: StopFlag,
) {
    let ev = match apply_and_verify(&cfg, &spec, verify_after, &tx, &progress, stop).await {
        Ok((run, verify)) => ServiceEvent::Committed {
            generation,
            run: Box::new(run),
            verify,
        },
        Err(e) => ServiceEvent::failed(generation, Task::Apply, e),
    };
    let _ = tx.send(ev).await;
}

/// A rollback, relayed like an apply: planned on a fresh read, then carried out by the
/// executor (deletes with preconditions, retries, the stop switch), every step logged.
/// A channel for the executor's events and the task that passes them on as service events,
/// so a rollback and an apply report progress the same way. Drop the sender, then await the
/// task, to be sure every event went out before the run's result.
pub(super) fn forward_apply_events(
    tx: &mpsc::Sender<ServiceEvent>,
) -> (mpsc::Sender<ApplyEvent>, tokio::task::JoinHandle<()>) {
    let (apply_tx, mut apply_rx) = mpsc::channel(1024);
    let tx = tx.clone();
    let forward = tokio::spawn(async move {
        while let Some(ev) = apply_rx.recv().await {
            if tx.send(ServiceEvent::Apply(ev)).await.is_err() {
                break;
            }
        }
    });
    (apply_tx, forward)
}

pub(super) async fn rollback(
    cfg: Arc<ServiceConfig>,
    generation: u64,
    spec: RollbackSpec,
    tx: mpsc::Sender<ServiceEvent>,
    progress: Arc<watch::Sender<Progress>>,
    stop: StopFlag,
) {
    let run = async {
        let heard_from = cfg.target.notes().mark();
        let ops = crate::app::rollback::plan(&cfg.target, &spec).await?;
        crate::apply::executor::log_decisions(&cfg.log, &ops)?;
        let (apply_tx, forward) = forward_apply_events(&tx);
        let watchers = Watchers {
            events: Some(&apply_tx),
            progress: Some(&progress),
        };
        let report = crate::apply::executor::apply(
            &cfg.target,
            ops,
            false,
            &cfg.apply,
            Some(&cfg.log),
            watchers,
            stop,
        )
        .await;
        drop(apply_tx);
        let _ = forward.await;
        let mut report = report?;
        crate::app::flows::note_server(&cfg.target, heard_from, &cfg.log, &mut report);
        Ok::<_, Error>(report)
    };
    let ev = match run.await {
        Ok(report) => ServiceEvent::Committed {
            generation,
            run: Box::new(ApplyRun {
                report,
                ..Default::default()
            }),
            verify: None,
        },
        Err(e) => ServiceEvent::failed(generation, Task::Rollback, e),
    };
    let _ = tx.send(ev).await;
}

pub(super) async fn apply_and_verify(
    cfg: &ServiceConfig,
    spec: &ApplySpec,
    verify_after: bool,
    tx: &mpsc::Sender<ServiceEvent>,
    progress: &watch::Sender<Progress>,
    stop: StopFlag,
) -> Result<(ApplyRun, Option<VerifyReport>)> {
    let (apply_tx, forward) = forward_apply_events(tx);
    let watchers = Watchers {
        events: Some(&apply_tx),
        progress: Some(progress),
    };
    let run = flows::apply(
        &cfg.kv,
        &cfg.target,
        cfg.scope,
        spec,
        &cfg.log,
        watchers,
        stop,
    )
    .await;
    drop(apply_tx);
    let _ = forward.await;
    let run = run?;
    let verify = if verify_after && run.report.stopped.is_none() {
        let mappings = flows::expectations_from_logs(&[cfg.log.path().to_path_buf()])?;
        Some(flows::verify(&cfg.kv, &cfg.target, cfg.scope.range, &mappings).await?)
    } else {
        None
    };
    Ok((run, verify))
}

pub(super) async fn watch_drift(
    cfg: Arc<ServiceConfig>,
    mut revision_rx: mpsc::Receiver<i64>,
    tx: mpsc::Sender<ServiceEvent>,
) {
    let KvSource::Etcd(opts) = &cfg.kv else {
        return;
    };
    let Some(revision) = revision_rx.recv().await else {
        return;
    };
    let conn = match EtcdConnection::connect(opts).await {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.send(ServiceEvent::failed(0, Task::DriftWatch, e)).await;
            return;
        }
    };
    let (dtx, mut drx) = mpsc::channel(64);
    let prefix = opts.prefix.clone();
    let watcher = tokio::spawn(async move { conn.watch_drift(&prefix, revision, dtx).await });
    let (mut added, mut removed) = (0, 0);
    while let Some(d) = drx.recv().await {
        let ev = match d {
            Drift::Changed {
                added: a,
                removed: r,
                ..
            } => {
                added += a;
                removed += r;
                ServiceEvent::Drift { added, removed }
            }
            Drift::Compacted { compact_revision } => {
                tracing::warn!(
                    compact_revision,
                    "kvstore compacted past the watched revision; rescanning"
                );
                ServiceEvent::DriftCompacted
            }
        };
        if tx.send(ev).await.is_err() {
            break;
        }
    }
    if let Ok(Err(e)) = watcher.await {
        let _ = tx.send(ServiceEvent::failed(0, Task::DriftWatch, e)).await;
    }
}
