//! The engine service: one task that owns every piece of IO (etcd, Kubernetes, the decision
//! log, files) and talks to a front end only through owned requests and events over bounded
//! channels. Results carry the generation of the request so a front end can drop stale ones.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::decision_log::{DecisionLog, Record};
use crate::engine::{ApplyOptions, ApplyReport, EngineEvent, Progress, StopFlag, Watchers};
use crate::error::{Error, Result};
use crate::etcd_source::{Drift, EtcdConnection};
use crate::k8s_target::K8sTarget;
use crate::kvstore::SourceInfo;
use crate::labels::LabelKey;
use crate::plan_file::PlanFile;
use crate::planner::{Kind, PlanItem};
use crate::range::IdRange;
use crate::session::{self, ApplyRequest, KvSource};
use crate::verify::VerifyReport;

pub use crate::preflight::{Check, PreflightReport};

/// What the service needs to run.
pub struct ServiceConfig {
    pub kv: KvSource,
    pub target: K8sTarget,
    pub cluster_id: u32,
    pub range: IdRange,
    pub log: Arc<DecisionLog>,
    pub apply: ApplyOptions,
}

/// Requests from the front end.
#[derive(Debug, Clone)]
pub enum Request {
    Preflight,
    Scan {
        generation: u64,
    },
    /// Append one decision record to the log, now.
    Log(Record),
    /// Write what the operator confirmed. `items` carry their decisions.
    Commit {
        generation: u64,
        items: Vec<PlanItem>,
    },
    /// Stop starting new writes.
    Stop,
    /// Write the decision log and a Markdown summary next to `path`.
    Export {
        path: PathBuf,
        items: Vec<PlanItem>,
    },
}

/// A finished scan: everything the front end shows, as plain data.
#[derive(Debug, Clone)]
pub struct ScanResult {
    pub items: Vec<PlanItem>,
    pub k8s: BTreeMap<u32, LabelKey>,
    pub source: SourceInfo,
    pub crd_present: bool,
    pub other_names: usize,
}

/// Events to the front end.
#[derive(Debug, Clone)]
pub enum Event {
    Preflight(PreflightReport),
    /// The table's data; node counts follow in `NodeCounts`.
    Scanned {
        generation: u64,
        scan: Box<ScanResult>,
    },
    /// Nodes using each label key (keyed by the label key as text).
    NodeCounts {
        generation: u64,
        counts: std::collections::HashMap<String, u32>,
    },
    Apply(EngineEvent),
    Committed {
        generation: u64,
        report: ApplyReport,
        verify: Option<VerifyReport>,
    },
    Drift {
        added: u64,
        removed: u64,
    },
    /// The kvstore was compacted past the watched revision; a rescan was started.
    DriftCompacted {
        generation: u64,
    },
    Exported {
        paths: Vec<PathBuf>,
    },
    Failed {
        generation: u64,
        what: String,
        error: String,
    },
}

impl Event {
    fn failed(generation: u64, what: &str, error: impl std::fmt::Display) -> Self {
        Event::Failed {
            generation,
            what: what.to_string(),
            error: error.to_string(),
        }
    }
}

/// Starts the service; it ends when the request sender is dropped.
/// The service's channels: requests in, events out (both bounded), commit progress on a watch.
pub struct Handle {
    pub requests: mpsc::Sender<Request>,
    pub events: mpsc::Receiver<Event>,
    pub progress: watch::Receiver<Progress>,
}

pub fn spawn(cfg: ServiceConfig) -> Handle {
    let (req_tx, req_rx) = mpsc::channel(64);
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    let (progress_tx, progress_rx) = watch::channel(Progress::default());
    tokio::spawn(run(Arc::new(cfg), req_rx, ev_tx, Arc::new(progress_tx)));
    Handle {
        requests: req_tx,
        events: ev_rx,
        progress: progress_rx,
    }
}

async fn run(
    cfg: Arc<ServiceConfig>,
    mut rx: mpsc::Receiver<Request>,
    tx: mpsc::Sender<Event>,
    progress: Arc<watch::Sender<Progress>>,
) {
    // A fresh stop switch per commit, so a retry after a stop can write again.
    let mut stop = StopFlag::default();
    let mut drift_task: Option<tokio::task::JoinHandle<()>> = None;
    while let Some(req) = rx.recv().await {
        match req {
            Request::Preflight => {
                let (cfg, tx) = (cfg.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = tx
                        .send(Event::Preflight(
                            crate::preflight::run(&cfg.kv, &cfg.target, cfg.cluster_id, cfg.range)
                                .await,
                        ))
                        .await;
                });
            }
            Request::Scan { generation } => {
                let (cfg, tx) = (cfg.clone(), tx.clone());
                if let Some(t) = drift_task.take() {
                    t.abort();
                }
                let (drift_tx, drift_rx) = mpsc::channel(16);
                drift_task = Some(tokio::spawn(watch_drift(cfg.clone(), drift_rx, tx.clone())));
                tokio::spawn(async move {
                    let scan =
                        match session::scan_without_counts(&cfg.kv, &cfg.target, cfg.range).await {
                            Ok(scan) => scan,
                            Err(e) => {
                                let _ = tx.send(Event::failed(generation, "scan", e)).await;
                                return;
                            }
                        };
                    let _ = drift_tx.send(scan.kv.source.revision).await;
                    let kv = scan.kv;
                    let ev = Event::Scanned {
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
                    // The table is on screen; now the slow count of node references.
                    let ev = match cfg.kv.count_nodes(&kv).await {
                        Ok(counts) => Event::NodeCounts {
                            generation,
                            counts: counts
                                .into_iter()
                                .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
                                .collect(),
                        },
                        Err(e) => Event::failed(generation, "node count", e),
                    };
                    let _ = tx.send(ev).await;
                });
            }
            Request::Log(record) => {
                if let Err(e) = cfg.log.append(record) {
                    let _ = tx.send(Event::failed(0, "decision log", e)).await;
                }
            }
            Request::Commit { generation, items } => {
                let (cfg, tx, progress) = (cfg.clone(), tx.clone(), progress.clone());
                stop = StopFlag::default();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let ev = match commit(&cfg, items, &tx, &progress, stop).await {
                        Ok((report, verify)) => Event::Committed {
                            generation,
                            report,
                            verify,
                        },
                        Err(e) => Event::failed(generation, "commit", e),
                    };
                    let _ = tx.send(ev).await;
                });
            }
            Request::Stop => stop.stop(),
            Request::Export { path, items } => {
                let ev = match export(&cfg, &path, &items) {
                    Ok(paths) => Event::Exported { paths },
                    Err(e) => Event::failed(0, "export", e),
                };
                let _ = tx.send(ev).await;
            }
        }
    }
    if let Some(t) = drift_task {
        t.abort();
    }
}

async fn commit(
    cfg: &ServiceConfig,
    items: Vec<PlanItem>,
    tx: &mpsc::Sender<Event>,
    progress: &watch::Sender<Progress>,
    stop: StopFlag,
) -> Result<(ApplyReport, Option<VerifyReport>)> {
    let (apply_tx, mut apply_rx) = mpsc::channel(1024);
    let forward = {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = apply_rx.recv().await {
                if tx.send(Event::Apply(ev)).await.is_err() {
                    break;
                }
            }
        })
    };
    let source = SourceInfo {
        prefix: cfg.kv.prefix(),
        ..Default::default()
    };
    let plan = PlanFile::new(
        source,
        session::target_info(&cfg.target),
        cfg.cluster_id,
        cfg.range,
        true,
        items,
    );
    let req = ApplyRequest {
        plan: Some(plan),
        accept_proposals: false,
        options: cfg.apply.clone(),
    };
    let run = session::apply(
        &cfg.kv,
        &cfg.target,
        cfg.range,
        &req,
        &cfg.log,
        Watchers {
            events: Some(&apply_tx),
            progress: Some(progress),
        },
        stop,
    )
    .await;
    drop(apply_tx);
    let _ = forward.await;
    let run = run?;
    let verify = if run.report.stopped.is_none() {
        let mappings = session::mappings_from_logs(&[cfg.log.path().to_path_buf()])?;
        Some(session::verify(&cfg.kv, &cfg.target, cfg.range, &mappings).await?)
    } else {
        None
    };
    Ok((run.report, verify))
}

async fn watch_drift(
    cfg: Arc<ServiceConfig>,
    mut revision_rx: mpsc::Receiver<i64>,
    tx: mpsc::Sender<Event>,
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
            let _ = tx.send(Event::failed(0, "drift watch", e)).await;
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
                Event::Drift { added, removed }
            }
            Drift::Compacted { compact_revision } => {
                tracing::warn!(
                    compact_revision,
                    "kvstore compacted past the watched revision; rescanning"
                );
                Event::DriftCompacted { generation: 0 }
            }
        };
        if tx.send(ev).await.is_err() {
            break;
        }
    }
    if let Ok(Err(e)) = watcher.await {
        let _ = tx.send(Event::failed(0, "drift watch", e)).await;
    }
}

fn export(cfg: &ServiceConfig, path: &std::path::Path, items: &[PlanItem]) -> Result<Vec<PathBuf>> {
    let log_out = path.with_extension("jsonl");
    let md_out = path.with_extension("md");
    let log_text = std::fs::read(cfg.log.path()).map_err(|e| Error::file(cfg.log.path(), e))?;
    write_new(&log_out, &log_text)?;
    write_new(&md_out, summary_markdown(cfg, items).as_bytes())?;
    Ok(vec![log_out, md_out])
}

fn write_new(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| Error::file(path, e))
}

/// A human-readable summary of the session's decisions.
pub fn summary_markdown(cfg: &ServiceConfig, items: &[PlanItem]) -> String {
    let mut out = String::new();
    out.push_str("# cilium-idmig migration summary\n\n");
    out.push_str(&format!(
        "- operator: {}\n- API server: {}\n- range: {}\n- decision log: {}\n\n",
        cfg.log.operator(),
        cfg.target.server,
        cfg.range,
        cfg.log.path().display()
    ));
    out.push_str("| kind | count |\n|---|---|\n");
    for kind in Kind::ALL {
        out.push_str(&format!(
            "| {kind} | {} |\n",
            items.iter().filter(|i| i.kind == kind).count()
        ));
    }
    out.push_str("\n## Conflicts and their decisions\n\n| id | kind | action | target | decided | labels |\n|---|---|---|---|---|---|\n");
    for i in items.iter().filter(|i| i.kind.is_conflict()) {
        let t = i.target_id.map_or("-".to_string(), |t| t.to_string());
        out.push_str(&format!(
            "| {} | {} | {} | {t} | {} | `{}` |\n",
            i.id,
            i.kind,
            i.action.as_str(),
            if i.decided { "yes" } else { "no" },
            i.labels
        ));
    }
    let invalid: BTreeSet<&str> = items
        .iter()
        .filter(|i| i.kind == Kind::Invalid)
        .map(|i| i.id.as_str())
        .collect();
    if !invalid.is_empty() {
        out.push_str("\n## Invalid kvstore entries (never written)\n\n");
        for i in items.iter().filter(|i| i.kind == Kind::Invalid) {
            out.push_str(&format!("- `{}`: {}\n", i.id, i.reason));
        }
    }
    out
}
