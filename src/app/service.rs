//! The engine service: one task that owns every piece of IO (etcd, Kubernetes, the decision
//! log, files) and talks to a front end only through owned requests and events over bounded
//! channels. Results carry the generation of the request so a front end can drop stale ones.
//! It only relays: the work itself is in `flows`, the executor and `export`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, watch};

use super::flows::{self, ApplyRun, ApplySpec};
pub use super::preflight::{Check, CheckStatus, PreflightReport};
use crate::apply::executor::{StopFlag, Watchers};
use crate::apply::outcome::{ApplyEvent, Progress};
use crate::core::kvstore::{NodeCounts, SourceInfo};
use crate::core::labels::LabelKey;
use crate::core::planner::resume::{Dropped, LoggedDecision};
use crate::core::planner::{Op, PlanItem, describe};
use crate::core::verify::VerifyReport;
use crate::error::{Error, Result};
use crate::io::decision_log::Record;
use crate::io::etcd::{Drift, EtcdConnection};
use crate::io::kv_source::KvSource;

pub use super::config::ServiceConfig;
use super::rollback::RollbackSpec;
use super::sync::DecisionChange;

/// The service's jobs, named in failures so a front end can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Scan,
    NodeCount,
    Apply,
    DecisionLog,
    DriftWatch,
    Export,
    Resume,
    Rollback,
    Sync,
    Audit,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Scan => "scan",
            Task::NodeCount => "node count",
            Task::Apply => "commit",
            Task::DecisionLog => "decision log",
            Task::DriftWatch => "drift watch",
            Task::Export => "export",
            Task::Resume => "resume",
            Task::Rollback => "rollback",
            Task::Sync => "sync",
            Task::Audit => "audit",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Requests from a front end.
#[derive(Debug, Clone)]
pub enum ServiceRequest {
    Preflight,
    Scan {
        generation: u64,
    },
    /// The operator decided on `item` (already changed by the decision): log it now.
    /// `name` is the decision's word (`accept`, `edit`, `undo`, ...).
    Decided {
        name: &'static str,
        item: Box<PlanItem>,
    },
    /// Write what the operator confirmed in the TUI. `items` carry their decisions.
    Commit {
        generation: u64,
        items: Vec<PlanItem>,
    },
    /// A headless apply: a saved plan, or plan and apply in one go.
    Apply {
        generation: u64,
        spec: Box<ApplySpec>,
    },
    /// Scan again and replay the decisions recorded in these logs onto the fresh plan.
    Resume {
        generation: u64,
        paths: Vec<PathBuf>,
    },
    /// Read what these logs' runs created and plan its deletion; changes nothing.
    PlanRollback {
        generation: u64,
        spec: RollbackSpec,
    },
    /// Delete exactly what these runs created (re-planned on a fresh read).
    Rollback {
        generation: u64,
        spec: RollbackSpec,
    },
    /// Stop starting new writes.
    Stop,
    /// Start `sync` in place (after a commit): follow both sides, mirror, report.
    StartSync {
        accept_proposals: bool,
    },
    /// Stop sync: no new writes; it ends after those in flight.
    StopSync,
    /// Audit both identity stores by labels (`core::audit`); reads only.
    Audit {
        generation: u64,
    },
    /// The nodes that use one identity's labels now (for its details).
    NodesUsing {
        id: String,
        labels: String,
    },
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

/// Events to a front end.
#[derive(Debug, Clone)]
pub enum ServiceEvent {
    Preflight(PreflightReport),
    /// The table's data; node counts follow in `NodeCounts`.
    Scanned {
        generation: u64,
        scan: Box<ScanResult>,
    },
    /// Nodes using each label key.
    NodeCounts {
        generation: u64,
        counts: NodeCounts,
    },
    Apply(ApplyEvent),
    /// An apply finished; `verify` is there when the commit asked for it and was not stopped.
    Committed {
        generation: u64,
        run: Box<ApplyRun>,
        verify: Option<VerifyReport>,
    },
    /// The kvstore side of a scan, planned before Kubernetes is read: the table can show
    /// ids and labels while the list runs (kinds are not known yet).
    KvRead {
        generation: u64,
        items: Vec<PlanItem>,
    },
    /// Kubernetes objects listed so far in a running scan.
    Listing {
        generation: u64,
        listed: usize,
        elapsed: std::time::Duration,
    },
    Drift {
        added: u64,
        removed: u64,
    },
    /// The kvstore was compacted past the watched revision; a rescan is due.
    DriftCompacted,
    Exported {
        paths: Vec<PathBuf>,
    },
    /// Decisions replayed from decision logs onto the scan just sent (same generation).
    Resumed {
        generation: u64,
        from: Vec<PathBuf>,
        resumed: usize,
        dropped: Vec<Dropped>,
    },
    /// An earlier session's log in the working directory, for this cluster and kvstore,
    /// holds decisions never committed: the front end may offer to resume it.
    ResumeOffer {
        path: PathBuf,
        decisions: usize,
        operator: String,
        when: String,
    },
    /// A rollback's plan: one operation per object the logs say was created.
    RollbackPlanned {
        generation: u64,
        ops: Vec<Op>,
    },
    /// The nodes that use `id`'s labels (`None`: the source keeps no names).
    NodesUsing {
        id: String,
        nodes: Option<Vec<String>>,
    },
    /// An audit of both stores finished.
    Audited {
        generation: u64,
        run: Box<super::audit::AuditRun>,
    },
    /// What a running sync reports.
    Sync(super::sync::SyncEvent),
    /// Sync ended (stopped, or at cutover).
    SyncEnded {
        end: super::sync::SyncEnd,
    },
    /// The API server sent a `Warning` header with a text not heard before in this process
    /// (headless, it is on stderr already; the TUI shows it on its status line).
    ServerWarning {
        text: String,
    },
    /// A task failed; the error is shared so events stay cheap to clone.
    Failed {
        generation: u64,
        task: Task,
        error: Arc<Error>,
    },
}

impl ServiceEvent {
    fn failed(generation: u64, task: Task, error: Error) -> Self {
        ServiceEvent::Failed {
            generation,
            task,
            error: Arc::new(error),
        }
    }
}

/// The service's channels: requests in, events out (both bounded), apply progress on a watch.
pub struct Handle {
    pub requests: mpsc::Sender<ServiceRequest>,
    pub events: mpsc::Receiver<ServiceEvent>,
    pub progress: watch::Receiver<Progress>,
}

/// Starts the service; it ends when the request sender is dropped.
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
    mut rx: mpsc::Receiver<ServiceRequest>,
    tx: mpsc::Sender<ServiceEvent>,
    progress: Arc<watch::Sender<Progress>>,
) {
    // Every run's lines start with what it works on, for resumes, rollbacks and auditors.
    if let Err(e) = cfg.log.begin_session(cfg.session()) {
        let _ = tx.send(ServiceEvent::failed(0, Task::DecisionLog, e)).await;
    }
    let warnings = tokio::spawn(relay_warnings(cfg.target.notes().clone(), tx.clone()));
    let mut service = Service {
        resume: cfg.resume.clone(),
        cfg,
        tx,
        progress,
        stop: StopFlag::default(),
        drift_task: None,
        sync: None,
    };
    while let Some(req) = rx.recv().await {
        service.handle(req).await;
    }
    if let Some(t) = service.drift_task {
        t.abort();
    }
    warnings.abort();
}

/// Hands each new warning of the API server to the front end as it is heard.
async fn relay_warnings(notes: Arc<crate::io::k8s::ServerNotes>, tx: mpsc::Sender<ServiceEvent>) {
    let mut heard = notes.subscribe();
    let mut told = 0;
    loop {
        let texts = notes.warnings();
        for text in texts.into_iter().skip(told) {
            told += 1;
            if tx.send(ServiceEvent::ServerWarning { text }).await.is_err() {
                return;
            }
        }
        if heard.changed().await.is_err() {
            return;
        }
    }
}

/// What the service keeps between requests.
struct Service {
    cfg: Arc<ServiceConfig>,
    tx: mpsc::Sender<ServiceEvent>,
    progress: Arc<watch::Sender<Progress>>,
    /// A fresh stop switch per apply, so a retry after a stop can write again.
    stop: StopFlag,
    drift_task: Option<tokio::task::JoinHandle<()>>,
    /// `--resume` applies to the first scan.
    resume: Vec<std::path::PathBuf>,
    /// A running sync: its stop switch, and where decisions made meanwhile go.
    sync: Option<(StopFlag, mpsc::Sender<DecisionChange>)>,
}

impl Service {
    /// One request: what takes time runs as a task and answers with an event.
    async fn handle(&mut self, req: ServiceRequest) {
        let cfg = &self.cfg;
        match req {
            ServiceRequest::Preflight => self.preflight(),
            ServiceRequest::Scan { generation } => {
                let paths = std::mem::take(&mut self.resume);
                restart_drift(cfg, &mut self.drift_task, &self.tx, generation, paths);
            }
            ServiceRequest::Resume { generation, paths } => {
                restart_drift(cfg, &mut self.drift_task, &self.tx, generation, paths);
            }
            ServiceRequest::PlanRollback { generation, spec } => {
                let (cfg, tx) = (cfg.clone(), self.tx.clone());
                tokio::spawn(async move {
                    let planned = async {
                        super::preflight::require_rollback_rights(&cfg.target).await?;
                        super::rollback::plan(&cfg.target, &spec).await
                    };
                    let ev = match planned.await {
                        Ok(ops) => ServiceEvent::RollbackPlanned { generation, ops },
                        Err(e) => ServiceEvent::failed(generation, Task::Rollback, e),
                    };
                    let _ = tx.send(ev).await;
                });
            }
            ServiceRequest::Rollback { generation, spec } => {
                self.stop = StopFlag::default();
                tokio::spawn(rollback(
                    cfg.clone(),
                    generation,
                    spec,
                    self.tx.clone(),
                    self.progress.clone(),
                    self.stop.clone(),
                ));
            }
            ServiceRequest::Decided { name, item } => self.decided(name, *item).await,
            ServiceRequest::StartSync { accept_proposals } => {
                self.start_sync(accept_proposals).await;
            }
            ServiceRequest::Audit { generation } => {
                let (cfg, tx) = (cfg.clone(), self.tx.clone());
                tokio::spawn(async move {
                    let range = cfg.scope.range;
                    let ev = match super::audit::run(&cfg.kv, &cfg.target, range).await {
                        Ok(run) => ServiceEvent::Audited {
                            generation,
                            run: Box::new(run),
                        },
                        Err(e) => ServiceEvent::failed(generation, Task::Audit, e),
                    };
                    let _ = tx.send(ev).await;
                });
            }
            ServiceRequest::NodesUsing { id, labels } => {
                let (cfg, tx) = (cfg.clone(), self.tx.clone());
                tokio::spawn(async move {
                    let ev = match cfg.kv.nodes_using(labels.as_bytes()).await {
                        Ok(nodes) => ServiceEvent::NodesUsing { id, nodes },
                        Err(e) => ServiceEvent::failed(0, Task::NodeCount, e),
                    };
                    let _ = tx.send(ev).await;
                });
            }
            ServiceRequest::StopSync => {
                if let Some((stop, _)) = &self.sync {
                    stop.stop();
                }
            }
            ServiceRequest::Commit { generation, items } => {
                let plan = flows::plan_of_items(&cfg.kv, &cfg.target, cfg.scope, items);
                let spec = ApplySpec {
                    plan: Some(plan),
                    resume: Vec::new(),
                    accept_proposals: false,
                    options: cfg.apply.clone(),
                };
                self.apply(generation, spec, true);
            }
            ServiceRequest::Apply { generation, spec } => self.apply(generation, *spec, false),
            ServiceRequest::Stop => self.stop.stop(),
            ServiceRequest::Export { path, items } => {
                let ev = match super::export::export(
                    &cfg.log,
                    &cfg.target.server,
                    cfg.scope.range,
                    &path,
                    &items,
                ) {
                    Ok(paths) => ServiceEvent::Exported { paths },
                    Err(e) => ServiceEvent::failed(0, Task::Export, e),
                };
                let _ = self.tx.send(ev).await;
            }
        }
    }

    /// Preflight (with the kvstore write check when sync will reserve), then the offer to
    /// resume a log found beside this one.
    fn preflight(&self) {
        let (cfg, tx) = (self.cfg.clone(), self.tx.clone());
        let offer = self.resume.is_empty();
        tokio::spawn(async move {
            let mut report = super::preflight::run(&cfg.kv, &cfg.target, cfg.scope).await;
            if cfg.sync_reserve_in_kvstore {
                report
                    .checks
                    .push(super::preflight::reservation_check(&cfg.kv).await);
            }
            let _ = tx.send(ServiceEvent::Preflight(report)).await;
            if offer && let Some(ev) = resume_offer(&cfg) {
                let _ = tx.send(ev).await;
            }
        });
    }

    /// An operator's decision: logged, and handed to a running sync only once logged (sync
    /// never acts on a decision its log does not hold; the failure says to make it again).
    async fn decided(&self, name: &str, item: PlanItem) {
        if let Err(e) = self.cfg.log.append(decision_record(name, &item)) {
            let e = crate::Error::file(
                self.cfg.log.path(),
                format!(
                    "the decision on {} could not be logged ({e}): it is not carried out; make it again once the log can be written",
                    item.id
                ),
            );
            let _ = self
                .tx
                .send(ServiceEvent::failed(0, Task::DecisionLog, e))
                .await;
            return;
        }
        // A running sync takes every change: a decision, and an undo (without which a skip
        // undone would stay skipped in sync, and expected nowhere at cutover).
        if let Some((_, decided)) = &self.sync {
            let change = if item.decided {
                DecisionChange::Decided(LoggedDecision {
                    id: item.id,
                    labels: item.labels,
                    action: item.action,
                    target_id: item.target_id,
                })
            } else {
                DecisionChange::Undone(item.id)
            };
            let _ = decided.send(change).await;
        }
    }

    /// Starts sync unless one runs; its events are relayed as `ServiceEvent::Sync`.
    async fn start_sync(&mut self, accept_proposals: bool) {
        if self
            .sync
            .as_ref()
            .is_some_and(|(stop, _)| !stop.is_stopped())
        {
            return;
        }
        let metrics = match super::metrics::Metrics::new() {
            Ok(m) => Arc::new(m),
            Err(e) => {
                let _ = self.tx.send(ServiceEvent::failed(0, Task::Sync, e)).await;
                return;
            }
        };
        let sync_stop = StopFlag::default();
        let (dec_tx, dec_rx) = mpsc::channel(256);
        let (ev_tx, mut ev_rx) = mpsc::channel(256);
        self.sync = Some((sync_stop.clone(), dec_tx));
        let fwd = self.tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = ev_rx.recv().await {
                if fwd.send(ServiceEvent::Sync(ev)).await.is_err() {
                    return;
                }
            }
        });
        let (cfg, tx) = (self.cfg.clone(), self.tx.clone());
        tokio::spawn(async move {
            let opts = super::sync::SyncOptions {
                accept_proposals,
                reserve_in_kvstore: cfg.sync_reserve_in_kvstore,
                ..Default::default()
            };
            let ev =
                match super::sync::run(cfg, opts, metrics, ev_tx, sync_stop, Some(dec_rx)).await {
                    Ok(end) => ServiceEvent::SyncEnded { end },
                    Err(e) => ServiceEvent::failed(0, Task::Sync, e),
                };
            let _ = tx.send(ev).await;
        });
    }

    /// An apply (a commit from the TUI, or the headless apply), with a fresh stop switch.
    fn apply(&mut self, generation: u64, spec: ApplySpec, commit: bool) {
        self.stop = StopFlag::default();
        tokio::spawn(apply(
            self.cfg.clone(),
            generation,
            spec,
            commit,
            self.tx.clone(),
            self.progress.clone(),
            self.stop.clone(),
        ));
    }
}

/// The decision log line for an operator's decision in a front end.
/// An undo is logged as what is in force after it: the earlier decision it brings back, or
/// `undecided` (back to the proposal), so every line states its identity's decision and a
/// replay never depends on how many lines an earlier decision left.
pub fn decision_record(name: &str, item: &PlanItem) -> Record {
    let action = if name == "undo" && !item.decided {
        "undecided"
    } else {
        item.action.as_str()
    };
    Record::new(
        &item.id,
        &item.labels,
        item.kind,
        describe(name, item),
        item.target_id,
    )
    .with_fields(crate::core::planner::DecidedBy::Operator.as_str(), action)
}

/// Starts a scan (resuming `paths` onto it, if any) with a fresh drift watch.
fn restart_drift(
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
fn resume_offer(cfg: &ServiceConfig) -> Option<ServiceEvent> {
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
fn same_cluster(
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
async fn read_both(
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
async fn scan(
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
async fn apply(
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
fn forward_apply_events(
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

async fn rollback(
    cfg: Arc<ServiceConfig>,
    generation: u64,
    spec: RollbackSpec,
    tx: mpsc::Sender<ServiceEvent>,
    progress: Arc<watch::Sender<Progress>>,
    stop: StopFlag,
) {
    let run = async {
        let heard_from = cfg.target.notes().mark();
        let ops = super::rollback::plan(&cfg.target, &spec).await?;
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
        super::flows::note_server(&cfg.target, heard_from, &cfg.log, &mut report);
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

async fn apply_and_verify(
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

async fn watch_drift(
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

#[cfg(test)]
mod tests {
    use super::same_cluster;
    use crate::io::decision_log::Session;

    fn session(server: &str, kvstore: &str) -> Session {
        Session {
            command: "tui".into(),
            server: server.into(),
            context: None,
            kvstore_endpoints: vec![kvstore.into()],
            kvstore_prefix: "cilium/state/identities/v1".into(),
            cluster_id: 0,
            max_connected_clusters: Default::default(),
            run: None,
        }
    }

    #[test]
    fn a_later_demo_of_the_same_world_is_the_same_cluster_whatever_its_port() {
        let demo = "in-memory demo kvstore (seed 42, 2000 identities)";
        let a = session("http://127.0.0.1:40001", demo);
        assert!(same_cluster(&a, &session("http://127.0.0.1:40777", demo)));
        let other_seed = "in-memory demo kvstore (seed 7, 2000 identities)";
        assert!(!same_cluster(
            &a,
            &session("http://127.0.0.1:40777", other_seed)
        ));
        // A real cluster: the same API server, or the same etcd behind another URL.
        let b = session("https://10.0.0.1:6443", "https://10.0.0.10:2379");
        assert!(same_cluster(
            &b,
            &session("https://10.0.0.1:6443", "https://10.0.0.11:2379")
        ));
        assert!(same_cluster(
            &b,
            &session("https://api.prod:6443", "https://10.0.0.10:2379")
        ));
        let mut other = session("https://10.0.0.1:6443", "https://10.0.0.10:2379");
        other.cluster_id = 3;
        assert!(!same_cluster(&b, &other));
        // No endpoints recorded (an etcd config file): only the server decides.
        let (mut c, mut d) = (b.clone(), session("https://api.staging:6443", ""));
        c.kvstore_endpoints.clear();
        d.kvstore_endpoints.clear();
        assert!(!same_cluster(&c, &d));
    }
}
