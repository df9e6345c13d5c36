//! The engine service: one task that owns every piece of IO (etcd, Kubernetes, the decision
//! log, files) and talks to a front end only through owned requests and events over bounded
//! channels. Results carry the generation of the request so a front end can drop stale ones.
//! It only relays: the work itself is in `flows`, the executor and `export`.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::flows::{self, ApplySpec};
pub use super::preflight::{Check, CheckStatus, PreflightReport};
use crate::apply::executor::StopFlag;
use crate::apply::outcome::Progress;
use crate::core::planner::PlanItem;
use crate::core::planner::resume::LoggedDecision;

pub use super::config::ServiceConfig;
use super::sync::DecisionChange;

mod events;
mod tasks;

pub use events::{ScanResult, ServiceEvent, ServiceRequest, Task};
pub use tasks::decision_record;
use tasks::{apply, restart_drift, resume_offer, rollback};

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
            ServiceRequest::PlanRollback { generation, spec } => self.answer(|cfg| async move {
                let planned = async {
                    super::preflight::require_rollback_rights(&cfg.target).await?;
                    super::rollback::plan(&cfg.target, &spec).await
                };
                match planned.await {
                    Ok(ops) => ServiceEvent::RollbackPlanned { generation, ops },
                    Err(e) => ServiceEvent::failed(generation, Task::Rollback, e),
                }
            }),
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
            ServiceRequest::Audit { generation } => self.answer(|cfg| async move {
                let range = cfg.scope.range;
                match super::audit::run(&cfg.kv, &cfg.target, range).await {
                    Ok(run) => ServiceEvent::Audited {
                        generation,
                        run: Box::new(run),
                    },
                    Err(e) => ServiceEvent::failed(generation, Task::Audit, e),
                }
            }),
            ServiceRequest::Switch { generation } => self.answer(|cfg| async move {
                match super::switch::read_report(&cfg.target, &cfg.cilium_namespace).await {
                    Ok(report) => ServiceEvent::SwitchRead {
                        generation,
                        report: Box::new(report),
                    },
                    Err(e) => ServiceEvent::failed(generation, Task::Switch, e),
                }
            }),
            ServiceRequest::NodesUsing { id, labels } => self.answer(|cfg| async move {
                match cfg.kv.nodes_using(labels.as_bytes(), id.as_bytes()).await {
                    Ok(nodes) => ServiceEvent::NodesUsing { id, nodes },
                    Err(e) => ServiceEvent::failed(0, Task::NodeCount, e),
                }
            }),
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
            // A whole log read and written again: on a thread for blocking work, answered
            // when done, so the service goes on taking requests meanwhile.
            ServiceRequest::Export { path, items } => self.answer(|cfg| async move {
                let export = tokio::task::spawn_blocking(move || {
                    super::export::export(
                        &cfg.log,
                        &cfg.target.server,
                        cfg.scope.range,
                        &path,
                        &items,
                    )
                });
                match export.await {
                    Ok(Ok(paths)) => ServiceEvent::Exported { paths },
                    Ok(Err(e)) => ServiceEvent::failed(0, Task::Export, e),
                    Err(e) => {
                        ServiceEvent::failed(0, Task::Export, crate::Error::file("export", e))
                    }
                }
            }),
        }
    }

    /// A request answered by a task of its own: `work`'s event, sent when it is done.
    fn answer<F>(&self, work: impl FnOnce(Arc<ServiceConfig>) -> F)
    where
        F: std::future::Future<Output = ServiceEvent> + Send + 'static,
    {
        let (work, tx) = (work(self.cfg.clone()), self.tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(work.await).await;
        });
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
        let line = decision_record(name, &item);
        if let Err(e) = crate::io::blocking::off_the_loop(|| self.cfg.log.append(line)) {
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

#[cfg(test)]
mod tests {
    use super::tasks::same_cluster;
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
