//! `sync`: carries a cluster through the rollout window. After a first apply it follows both
//! sides: every identity that appears in the kvstore is planned against the live Kubernetes
//! view and, when it is a plain create (or decided), written within seconds; conflicts wait
//! for a decision; objects CRD-mode agents create at ids the kvstore holds for other labels
//! (split allocations) are reported with the nodes they affect. It never overwrites, updates
//! or deletes a `CiliumIdentity`, and writes to etcd only with `--reserve-in-kvstore`
//! (`app::reserve`, keys of its own). Cutover: no `value/` key left, nothing pending, and a
//! consistent `verify` passes. Nothing slow is awaited in the loop that follows both watches:
//! writes, reservations, cutover checks and split reports run as tasks and answer as messages.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::config::ServiceConfig;
use super::flows;
use super::lease::{LeaseKeeper, LeaseOptions, Writer};
use super::metrics::{Metrics, Source};
use super::reserve::{self, ReservationTask, Reservations};
use crate::apply::executor::{self, StopFlag, Watchers};
use crate::apply::outcome::{ApplyReport, Outcome};
use crate::core::kvstore::parse_id;
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::planner::resume::{self, LoggedDecision};
use crate::core::planner::{Kind, Op};
use crate::core::sync::{BatchOutcome, CutoverWait, KvChange, SyncReport, SyncState};
use crate::error::{Error, Result};
use crate::io::decision_log::Record;
use crate::io::etcd::KvWatchEvent;
use crate::io::k8s::{K8sChange, ReadMode};
use crate::io::kv_source::{KvFollower, KvSource};
use crate::io::lease::LeaseApi;
use crate::io::retry::{Backoff, Policy};

/// How sync runs.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Decide remaps and duplicates as proposed; otherwise they wait for a decision.
    pub accept_proposals: bool,
    /// End (exit 0) at cutover, after a final consistent verify.
    pub until_cutover: bool,
    /// How long changes gather before the plan is made again.
    pub settle: Duration,
    /// How often a status is reported.
    pub status_every: Duration,
    /// How long no kvstore-mode node (no `value/` key) must be seen before cutover: an
    /// agent's keys can linger until its lease lapses, and one that comes back resets it.
    pub cutover_grace: Duration,
    /// Reserve in the kvstore the ids Kubernetes holds and it does not (`app::reserve`).
    pub reserve_in_kvstore: bool,
    /// On a clean stop, release the reservations (as at cutover) instead of leaving them to
    /// lapse with the lease.
    pub release_reservations: bool,
    /// The one-writer lease: sync writes only while it holds it.
    pub lease: LeaseOptions,
}

impl Default for SyncOptions {
    fn default() -> Self {
        SyncOptions {
            accept_proposals: false,
            until_cutover: false,
            settle: Duration::from_millis(100),
            status_every: Duration::from_secs(5),
            cutover_grace: Duration::from_secs(120),
            reserve_in_kvstore: false,
            release_reservations: false,
            lease: LeaseOptions::default(),
        }
    }
}

/// An id the kvstore and Kubernetes hold for different labels, found during sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitAllocation {
    pub id: u32,
    pub kvstore_labels: String,
    pub k8s_labels: String,
    /// Kvstore-mode nodes that use the kvstore's labels (their `value/` keys).
    pub nodes: Vec<String>,
}

impl std::fmt::Display for SplitAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "split allocation at id {}: the kvstore holds {} (used by kvstore-mode nodes {}), Kubernetes holds {}. Policy between those nodes and CRD-mode nodes reads {} as the wrong labels until they move to CRD mode: roll them next. The kvstore's labels get a remap proposal.",
            self.id,
            self.kvstore_labels,
            if self.nodes.is_empty() {
                "none right now".to_string()
            } else {
                self.nodes.join(", ")
            },
            self.k8s_labels,
            self.id
        )
    }
}

pub use crate::core::sync::SyncStatus;

/// What sync reports as it goes.
#[derive(Debug, Clone)]
pub enum SyncEvent {
    Status(SyncStatus),
    /// A conflict that waits for a decision (once per identity).
    Conflict {
        id: String,
        kind: Kind,
        reason: String,
    },
    Split(SplitAllocation),
    /// A malformed kvstore entry, never written (once per identity).
    Invalid {
        id: String,
        reason: String,
    },
    /// Both watches are established: sync follows both sides from here (once per snapshot).
    Following,
    /// A watch or a read failed; sync retries.
    Trouble(String),
    /// Something done that is worth a line (the reservations released).
    Note(String),
    /// A conflict that waited for a decision is closed without a write: no kvstore-mode
    /// node uses its labels any more, so no agent can use the id it held (once per identity).
    Moot {
        id: String,
        labels: String,
    },
    /// Cutover reached: no kvstore-mode node for the grace period, nothing pending, verify
    /// passed.
    Cutover(CutoverReport),
}

/// How a conflict closed as moot reads, on the terminal and in the TUI.
pub fn moot_text(id: &str, labels: &str) -> String {
    format!(
        "moot: {id} ({labels}) waited for a decision, but no kvstore-mode node uses it any more: closed without a write"
    )
}

/// What carried each kvstore identity over, when cutover was reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutoverReport {
    /// Objects this sync created.
    pub mirrored: u64,
    /// Identities served at another id that holds their labels.
    pub mapped: usize,
    /// Identities the operator skipped.
    pub skipped: usize,
    /// Conflicts closed as moot.
    pub moot: usize,
}

impl std::fmt::Display for CutoverReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cutover reached: no kvstore-mode node is left, nothing is pending, and verify passes ({} mirrored by sync, {} mapped to an id holding their labels, {} skipped by decision, {} closed as moot)",
            self.mirrored, self.mapped, self.skipped, self.moot
        )
    }
}

/// How sync ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncEnd {
    pub cutover: bool,
    pub status: SyncStatus,
    /// Writes that failed and had not been made when sync stopped (a failure retried
    /// successfully later is not among them).
    pub unwritten: usize,
}

/// Hands memory freed since the last status back to the system. A process that runs for days
/// plans thousands of identities ten times a second; glibc keeps what it freed in its arenas
/// and the resident size would creep up with fragmentation, not with data.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs sync until `stop` (or cutover with `until_cutover`).
/// `decided` carries decisions made while sync runs (the TUI's): each counts from the next
/// round on, as one recorded in the log does.
pub async fn run(
    cfg: Arc<ServiceConfig>,
    opts: SyncOptions,
    metrics: Arc<Metrics>,
    events: mpsc::Sender<SyncEvent>,
    stop: StopFlag,
    decided: Option<mpsc::Receiver<LoggedDecision>>,
) -> Result<SyncEnd> {
    if let KvSource::Memory(_) = &cfg.kv {
        // Refused before anything is read or written (`follower` says why).
        cfg.kv.follower().await?;
    }
    let (decisions, earlier) = resume_decisions(&cfg)?;
    let lease = take_lease(&cfg, &opts, &events).await?;
    let mut sync = Sync {
        writer: lease.writer.clone(),
        lease,
        cfg,
        opts,
        metrics,
        events,
        stop,
        decided,
        decisions,
        earlier,
        carried: None,
        reservations: None,
        releasing: None,
    };
    let mut backoff = Backoff::new(Policy::FOLLOW);
    loop {
        if sync.stop.is_stopped() {
            return Ok(SyncEnd::default());
        }
        // A stop while both sides are read (a full read can take tens of seconds) ends sync
        // at once, not after the read.
        let stop = sync.stop.clone();
        let started = tokio::select! {
            r = sync.start_round() => Some(r),
            () = stopped(&stop) => None,
        };
        let Some(started) = started else {
            sync.lease.release().await;
            return Ok(SyncEnd::default());
        };
        let round = match started {
            Ok(r) => r,
            Err(Retry::Fatal(e)) => {
                sync.lease.release().await;
                return Err(e);
            }
            Err(Retry::After(trouble)) => {
                let _ = sync.events.send(SyncEvent::Trouble(trouble)).await;
                backoff.wait().await;
                continue;
            }
        };
        backoff.reset();
        let ended = match round.follow(&mut sync).await {
            Ok(end) => end,
            Err(e) => {
                // A refusal ends sync: what it holds goes first (the Lease, for a standby).
                if let Some(task) = sync.reservations.take() {
                    task.finish(FINISH_WAIT).await;
                }
                sync.lease.release().await;
                return Err(e);
            }
        };
        match ended {
            RoundEnd::Resnapshot => continue,
            RoundEnd::WatchLost(what) => {
                let _ = sync
                    .events
                    .send(SyncEvent::Trouble(format!(
                        "{what}; reading both sides again"
                    )))
                    .await;
                backoff.wait().await;
            }
            RoundEnd::Done(end) => {
                if let Some(task) = sync.reservations.take() {
                    let kept = task.finish(FINISH_WAIT).await;
                    if sync.opts.release_reservations && sync.lease.holding() {
                        release(kept, &sync.cfg, &sync.metrics, &sync.events).await;
                    }
                }
                if let Some(releasing) = sync.releasing.take() {
                    let _ = releasing.await;
                }
                sync.lease.release().await;
                return Ok(*end);
            }
        }
    }
}

/// Returns once `stop` is set.
async fn stopped(stop: &StopFlag) {
    while !stop.is_stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The decisions recorded so far (this log and any --resume logs): a restart resumes
/// them; and the kvstore reservations they record as made and not released. A log that
/// cannot be read is an error: going on without its decisions could create what the
/// operator skipped.
fn resume_decisions(
    cfg: &ServiceConfig,
) -> Result<(BTreeMap<String, LoggedDecision>, reserve::Unreleased)> {
    let (mut steps, mut reserved) = (Vec::new(), BTreeMap::new());
    for p in cfg
        .resume
        .iter()
        .chain(std::iter::once(&cfg.log.path().to_path_buf()))
    {
        let log = flows::read_log(p)?;
        steps.extend(log.steps());
        reserve::note_reservations(&mut reserved, &log);
    }
    Ok((resume::replay(steps), reserved))
}

/// What lives across rounds: the configuration, the lease, the decisions, the
/// reservations.
struct Sync {
    cfg: Arc<ServiceConfig>,
    opts: SyncOptions,
    metrics: Arc<Metrics>,
    events: mpsc::Sender<SyncEvent>,
    stop: StopFlag,
    lease: LeaseKeeper,
    writer: tokio::sync::watch::Receiver<Writer>,
    decided: Option<mpsc::Receiver<LoggedDecision>>,
    decisions: BTreeMap<String, LoggedDecision>,
    /// Reservations an earlier sync made and did not release, taken over when this one's
    /// reservations start.
    earlier: reserve::Unreleased,
    /// What the last round knew, when it ended for a fresh snapshot (a compaction): the
    /// next round starts from the snapshot and keeps this memory (what was reported, made,
    /// counted), so nothing is reported twice and no count starts over.
    carried: Option<SyncState>,
    reservations: Option<ReservationTask>,
    /// Releasing the reservations at cutover (a task); a sync that ends waits for it.
    releasing: Option<tokio::task::JoinHandle<()>>,
}

/// A refusal (401, 403, or etcd's permission denied) of something sync needs: configuration,
/// which waiting never fixes, so sync ends (exit 2) naming what was refused and what to grant.
/// Outages (refused connections, 5xx, timeouts) are not refusals and are retried.
fn refusal(what: &str, e: &Error) -> Option<Error> {
    crate::io::refusal::refused_by_server(e).then(|| refused(what, &e.to_string()))
}

fn refused(what: &str, e: &str) -> Error {
    Error::Refused(format!(
        "sync stops: {what} was refused ({e}). Waiting will not fix this: grant these credentials what sync needs (assets/clusterrole.yaml: get, list, watch and create on ciliumidentities.cilium.io and get on the CRD, and the Lease Role there; for the kvstore, read on the identities prefix), then start sync again"
    ))
}

/// Why a round could not start.
enum Retry {
    /// Waiting will not fix it (no endpoints, an unreadable certificate, a refused write).
    Fatal(Error),
    /// A server failed: try again after a wait.
    After(String),
}

/// How a round ended.
enum RoundEnd {
    /// The kvstore was compacted past the watched revision: read a fresh snapshot.
    Resnapshot,
    /// A watch task ended: said, then a fresh round after a wait.
    WatchLost(&'static str),
    Done(Box<SyncEnd>),
}

/// One round: from a snapshot of both sides, following both watches, until a stop,
/// cutover, or a compaction.
struct Round {
    /// A refusal a watch task met: sync ends.
    fatal_rx: mpsc::Receiver<Error>,
    conn: KvFollower,
    prefix: String,
    state: SyncState,
    kv_rx: mpsc::Receiver<KvWatchEvent>,
    k8s_rx: mpsc::Receiver<K8sChange>,
    watches: [tokio::task::JoinHandle<()>; 2],
    done_tx: mpsc::Sender<(Vec<Op>, Result<ApplyReport>)>,
    done_rx: mpsc::Receiver<(Vec<Op>, Result<ApplyReport>)>,
    /// A cutover check (a full consistent verify, 18 s at 65k on a real server) runs as a
    /// task and its verdict comes back here, so the loop keeps mirroring meanwhile.
    verdict_tx: mpsc::Sender<std::result::Result<(), CutoverWait>>,
    verdict_rx: mpsc::Receiver<std::result::Result<(), CutoverWait>>,
    /// The last cutover check's problems, said until the next check.
    last_verify_failed: Option<CutoverWait>,
    verifying: bool,
    dirty: bool,
    batch_running: bool,
    last_verify: Option<Instant>,
    cutover_announced: bool,
    /// Announced once both watches are established, not when they are asked for.
    kv_up: bool,
    k8s_up: bool,
    following: bool,
}

impl Sync {
    /// Reads both sides, hands what needs reserving to the reservations task (the first
    /// batch goes before the watches start, so the ids are taken from the first moment on),
    /// and starts both watches.
    async fn start_round(&mut self) -> std::result::Result<Round, Retry> {
        let (cfg, prefix) = (self.cfg.clone(), self.cfg.kv.prefix());
        let conn = match cfg.kv.follower().await {
            Ok(c) => c,
            Err(e @ (Error::Config(_) | Error::File { .. })) => return Err(Retry::Fatal(e)),
            Err(e) => return Err(Retry::After(e.to_string())),
        };
        let snap = conn.read_snapshot(&prefix).await.map_err(|e| {
            refusal("reading the kvstore", &e).map_or(Retry::After(e.to_string()), Retry::Fatal)
        })?;
        if self.opts.reserve_in_kvstore && self.reservations.is_none() {
            // A write the credentials may not make is the operator's to fix: exit 2. A server
            // that failed is tried again, as a failed read is.
            let mut started = match Reservations::start(&conn, &prefix).await {
                Ok(r) => r,
                Err(e @ Error::Config(_)) => return Err(Retry::Fatal(e)),
                Err(e) => return Err(Retry::After(e.to_string())),
            };
            started.gate_writes(self.lease.gate.clone());
            self.reservations = Some(ReservationTask::spawn(
                started,
                cfg.clone(),
                self.metrics.clone(),
            ));
        }
        let mut state = SyncState::from_snapshot(snap);
        let carried = self.carried.take();
        let listed = cfg
            .target
            .list_identities(ReadMode::Cache, None)
            .await
            .map_err(|e| {
                refusal("listing ciliumidentities.cilium.io", &e)
                    .map_or(Retry::After(e.to_string()), Retry::Fatal)
            })?;
        state.k8s = listed.identities;
        state.k8s_version = listed.resource_version;
        if let Some(old) = carried {
            state.carry_over(old, Instant::now());
        }
        self.adopt_earlier(&state);
        if let Some(r) = self.reservations.as_mut()
            && self.lease.holding()
        {
            // A fresh view: every id in it is looked at; the first batch goes before the
            // watches deliver anything.
            r.view_changed();
            r.pump(&state, cfg.scope.range, Instant::now());
            state.status.reservations = r.held();
        }
        let (kv_tx, kv_rx) = mpsc::channel::<KvWatchEvent>(256);
        let (k8s_tx, k8s_rx) = mpsc::channel::<K8sChange>(1024);
        let kv_watch = tokio::spawn(follow_kvstore(
            conn.clone(),
            prefix.clone(),
            state.kv_revision,
            kv_tx,
            self.metrics.clone(),
            self.events.clone(),
        ));
        let (fatal_tx, fatal_rx) = mpsc::channel(1);
        let k8s_watch = tokio::spawn(follow_kubernetes(
            cfg.clone(),
            state.k8s_version.clone(),
            k8s_tx,
            (self.metrics.clone(), self.events.clone()),
            fatal_tx,
        ));
        let (done_tx, done_rx) = mpsc::channel(4);
        let (verdict_tx, verdict_rx) = mpsc::channel(1);
        Ok(Round {
            fatal_rx,
            verdict_tx,
            verdict_rx,
            last_verify_failed: None,
            verifying: false,
            conn,
            prefix,
            state,
            kv_rx,
            k8s_rx,
            watches: [kv_watch, k8s_watch],
            done_tx,
            done_rx,
            dirty: true,
            batch_running: false,
            last_verify: None,
            cutover_announced: false,
            kv_up: false,
            k8s_up: false,
            following: false,
        })
    }

    /// Hands what an earlier sync reserved and did not release to the reservations task,
    /// once, by the lease's holder (only it writes).
    fn adopt_earlier(&mut self, state: &SyncState) {
        let Some(r) = self.reservations.as_mut() else {
            return;
        };
        if self.earlier.is_empty() || !self.lease.holding() {
            return;
        }
        let earlier = std::mem::take(&mut self.earlier)
            .into_iter()
            .map(|(id, (labels, revision))| reserve::Earlier {
                keep: state.k8s.get(&id) == Some(&labels),
                id,
                labels,
                revision,
            })
            .collect();
        r.adopt(earlier);
    }
}

impl Round {
    /// Follows both sides until the round ends; every event has its handler.
    async fn follow(mut self, sync: &mut Sync) -> Result<RoundEnd> {
        let mut settle = tokio::time::interval(sync.opts.settle);
        let mut status_tick = tokio::time::interval(sync.opts.status_every);
        let end = loop {
            if self.kv_up && self.k8s_up && !self.following {
                self.following = true;
                let _ = sync.events.send(SyncEvent::Following).await;
            }
            tokio::select! {
                ev = self.kv_rx.recv() => {
                    let Some(ev) = ev else {
                        // The watch task ended (it never does on its own): start over rather
                        // than spin on a closed channel.
                        break RoundEnd::WatchLost("the kvstore watch ended");
                    };
                    if self.on_kvstore(sync, ev).await {
                        // The batch in flight is taken in first: the next round must not
                        // write beside it, and its outcomes are part of what is carried.
                        if self.batch_running
                            && let Some((ops, result)) = self.done_rx.recv().await
                        {
                            self.batch_running = false;
                            take_results(&mut self.state, ops, result, &sync.metrics);
                        }
                        sync.carried = Some(std::mem::take(&mut self.state));
                        break RoundEnd::Resnapshot;
                    }
                }
                ch = self.k8s_rx.recv() => {
                    let Some(ch) = ch else {
                        break RoundEnd::WatchLost("the Kubernetes watch ended");
                    };
                    self.on_kubernetes(sync, ch).await;
                }
                Some(e) = self.fatal_rx.recv() => {
                    self.abort_watches(&sync.metrics);
                    return Err(e);
                }
                Ok(()) = sync.writer.changed() => {
                    let now = sync.writer.borrow_and_update().clone();
                    self.on_writer(sync, now).await?;
                }
                Some(d) = next_decision(&mut sync.decided) => {
                    self.state.reported.remove(&d.id);
                    // The decisions changed: resumed onto the plan again at the next round.
                    self.state.overlay = None;
                    sync.decisions.insert(d.id.clone(), d);
                    self.dirty = true;
                }
                Some((ops, result)) = self.done_rx.recv() => {
                    self.batch_running = false;
                    if let Some(e) = refused_write(&result) {
                        self.abort_watches(&sync.metrics);
                        return Err(e);
                    }
                    if let Some(trouble) = take_results(&mut self.state, ops, result, &sync.metrics) {
                        let _ = sync.events.send(SyncEvent::Trouble(trouble)).await;
                    }
                    self.dirty = true;
                }
                _ = settle.tick() => {
                    if let Some(end) = self.on_settle(sync).await {
                        break RoundEnd::Done(Box::new(end));
                    }
                }
                _ = status_tick.tick() => self.on_status(sync).await,
                Some(reply) = reserve::next_reply(&mut sync.reservations) => {
                    self.on_reserved(sync, reply).await;
                }
                Some(verdict) = self.verdict_rx.recv() => {
                    if let Some(end) = self.on_verdict(sync, verdict).await {
                        break RoundEnd::Done(Box::new(end));
                    }
                }
            }
        };
        self.abort_watches(&sync.metrics);
        Ok(end)
    }

    /// Ends both watch tasks; until a new round's watches connect, neither counts as up
    /// (`/healthz` and `cilium_idmig_watch_up` say so).
    fn abort_watches(&self, metrics: &Metrics) {
        for w in &self.watches {
            w.abort();
        }
        metrics.etcd_live.store(false, Ordering::Relaxed);
        metrics.k8s_live.store(false, Ordering::Relaxed);
    }

    /// A kvstore watch event; true when the round must start over from a fresh snapshot.
    async fn on_kvstore(&mut self, sync: &mut Sync, ev: KvWatchEvent) -> bool {
        match ev {
            KvWatchEvent::Connected => self.kv_up = true,
            KvWatchEvent::Progress { .. } => {}
            KvWatchEvent::Changes { changes, revision } => {
                self.state.kv_revision = revision;
                let now = Instant::now();
                let gone: Vec<u32> = changes
                    .iter()
                    .filter_map(|c| match c {
                        KvChange::Master {
                            id, value: None, ..
                        } => parse_id(id).ok(),
                        _ => None,
                    })
                    .collect();
                for c in changes {
                    self.state.apply_kv_change(c, now);
                }
                if let Some(r) = sync.reservations.as_mut()
                    && sync.lease.holding()
                    && !gone.is_empty()
                {
                    for id in gone {
                        r.master_gone(id, self.state.k8s.get(&id).cloned());
                    }
                    r.pump(&self.state, sync.cfg.scope.range, now);
                }
                self.dirty = true;
            }
            KvWatchEvent::Compacted { compact_revision } => {
                let _ = sync.events.send(SyncEvent::Trouble(format!(
                    "the kvstore was compacted past the watched revision ({compact_revision}): reading a fresh snapshot, keeping every decision"
                ))).await;
                return true;
            }
        }
        false
    }

    /// A Kubernetes watch event.
    async fn on_kubernetes(&mut self, sync: &mut Sync, ch: K8sChange) {
        let state = &mut self.state;
        match ch {
            K8sChange::Connected => {
                self.k8s_up = true;
                // The API server is back: what failed while it was gone is tried now, not
                // when its wait is over.
                if !state.failed.is_empty() {
                    state.failed.clear();
                    self.dirty = true;
                }
            }
            K8sChange::Upsert {
                id,
                labels,
                resource_version,
            } => {
                state.k8s_upsert(id, labels.clone(), resource_version, Instant::now());
                // At once, not at the next plan: the window in which a kvstore-mode agent
                // can hand the id out again is as short as the watch's lag.
                if let Some(r) = sync.reservations.as_mut()
                    && sync.lease.holding()
                {
                    r.want(id, labels);
                    r.pump(state, sync.cfg.scope.range, Instant::now());
                }
                self.dirty = true;
            }
            K8sChange::Deleted {
                id,
                resource_version,
            } => {
                state.k8s_delete(id, resource_version);
                if let Some(r) = sync.reservations.as_mut() {
                    r.deleted(id);
                }
                self.dirty = true;
            }
            K8sChange::Bookmark { resource_version } => state.k8s_version = resource_version,
            // The follower lists again and sends `Relisted`.
            K8sChange::Expired => {}
            K8sChange::Relisted {
                identities,
                resource_version,
            } => {
                state.k8s_relisted(identities, resource_version, Instant::now());
                if let Some(r) = sync.reservations.as_mut() {
                    r.view_changed();
                }
                self.dirty = true;
            }
        }
    }

    /// The reservations task answered: its count is shown; a failed write is reported.
    async fn on_reserved(&mut self, sync: &mut Sync, reply: reserve::Reply) {
        let Some(r) = sync.reservations.as_mut() else {
            return;
        };
        let said = r.on_reply(reply, Instant::now());
        self.state.status.reservations = r.held();
        if *r.own_masters() != self.state.own_masters {
            // Sync's own master keys are never a kvstore identity to create an object for.
            self.state.own_masters = r.own_masters().clone();
            self.dirty = true;
        }
        let ev = match said {
            Some(reserve::Said::Trouble(t)) => SyncEvent::Trouble(t),
            Some(reserve::Said::Note(n)) => SyncEvent::Note(n),
            None => return,
        };
        let _ = sync.events.send(ev).await;
    }

    /// The lease changed hands (or could not be renewed).
    async fn on_writer(&mut self, sync: &mut Sync, now: Writer) -> Result<()> {
        let what = format!(
            "lease {}/{}",
            sync.opts.lease.namespace, sync.opts.lease.name
        );
        self.state.status.standby = None;
        let ev = match now {
            Writer::Us => {
                // Everything seen while another sync wrote is planned (and reserved) again.
                sync.adopt_earlier(&self.state);
                if let Some(r) = sync.reservations.as_mut() {
                    r.view_changed();
                }
                self.dirty = true;
                SyncEvent::Note(format!("{what} taken: this sync writes"))
            }
            Writer::Other { holder } => {
                self.state.status.standby = Some(holder.clone());
                SyncEvent::Note(format!(
                    "{what} is held by {holder}: following both sides without writing until it is free"
                ))
            }
            Writer::Unknown => SyncEvent::Trouble(format!(
                "{what} could not be renewed: no writes until it is held again"
            )),
            Writer::Refused(why) => return Err(lease_refused(&sync.opts, &why)),
        };
        let _ = sync.events.send(ev).await;
        Ok(())
    }

    /// The settle tick: report the splits that waited for their nodes, end on a stop, and
    /// (only the lease's holder) plan and write what changed.
    async fn on_settle(&mut self, sync: &mut Sync) -> Option<SyncEnd> {
        let cfg = sync.cfg.clone();
        if !self.state.splits_to_report.is_empty() {
            report_splits(
                &mut self.state,
                &self.conn,
                &self.prefix,
                &sync.events,
                &cfg,
            );
        }
        if sync.stop.is_stopped() {
            if self.batch_running {
                return None;
            }
            self.state.refresh_lag_percentiles();
            return Some(SyncEnd {
                cutover: false,
                status: self.state.status.clone(),
                unwritten: self.state.unwritten_now(),
            });
        }
        // Only the lease's holder writes (to the API server, the log, the kvstore).
        if !sync.lease.holding() {
            // A standby plans and writes nothing, but says what it sees.
            self.state.status.kvstore_nodes = self.state.counts.nodes().count();
            self.state.status.identities = self.state.masters.len();
            return None;
        }
        if let Some(r) = sync.reservations.as_mut() {
            r.pump(&self.state, cfg.scope.range, Instant::now());
        }
        if !self.dirty || self.batch_running {
            return None;
        }
        self.dirty = false;
        let ops = plan_round(
            &mut self.state,
            &sync.decisions,
            &sync.opts,
            &sync.events,
            &cfg,
        )
        .await;
        publish(&self.state, &sync.metrics);
        if !ops.is_empty() {
            self.batch_running = true;
            let (done_tx, stop) = (self.done_tx.clone(), sync.stop.clone());
            let gate = sync.lease.gate.clone();
            tokio::spawn(async move {
                let result = write(&cfg, ops.clone(), stop, gate).await;
                let _ = done_tx.send((ops, result)).await;
            });
        }
        None
    }

    /// The status tick: retry failed writes whose wait is over, report the status, close
    /// moot conflicts and, once the rollout is over, start a cutover check.
    async fn on_status(&mut self, sync: &mut Sync) {
        let state = &mut self.state;
        // A failed write is tried again when its wait is over, even when nothing else
        // happens (at the quiet end of a rollout, nothing else would).
        let now = Instant::now();
        if state.failed.values().any(|until| *until <= now) {
            state.failed.retain(|_, until| *until > now);
            self.dirty = true;
        }
        state.refresh_lag_percentiles();
        return_freed_memory();
        state.status.watching = sync.metrics.healthy();
        publish_splits(state, &sync.metrics);
        // The grace starts when the last kvstore-mode node goes. In the demo's in-memory
        // kvstore a node's keys go the moment it moves (its lease is revoked, none lapses
        // later), so a few seconds do.
        let grace = match &sync.cfg.kv {
            KvSource::Live(_) => Duration::from_secs(5).min(sync.opts.cutover_grace),
            _ => sync.opts.cutover_grace,
        };
        if state.status.kvstore_nodes > 0 {
            state.no_nodes_since = None;
            // A kvstore-mode node coming back starts the watch for cutover again.
            self.cutover_announced = false;
            self.last_verify_failed = None;
        } else if state.no_nodes_since.is_none() {
            state.no_nodes_since = Some(now);
        }
        let rollout_over =
            state.no_nodes_since.is_some_and(|t| t.elapsed() >= grace) && sync.lease.holding();
        if rollout_over && close_moot(state, &sync.events, &sync.cfg).await {
            self.dirty = true;
        }
        self.say_cutover_wait(sync, grace);
        let _ = sync
            .events
            .send(SyncEvent::Status(self.state.status.clone()))
            .await;
        // Cutover is checked (a full consistent verify) at most every 30 s while it may be
        // near, and announced once.
        let due = self
            .last_verify
            .is_none_or(|t| t.elapsed() > Duration::from_secs(30));
        if !(rollout_over && self.quiet() && due && !self.cutover_announced && !self.verifying) {
            return;
        }
        self.last_verify = Some(Instant::now());
        self.verifying = true;
        let (cfg, tx) = (sync.cfg.clone(), self.verdict_tx.clone());
        let (reused, mut moot) = (self.state.reused.clone(), self.state.moot.clone());
        // Sync's own reservations are no kvstore identities: verify expects no object there.
        moot.extend(self.state.reservations_alone().map(|id| id.to_string()));
        tokio::spawn(async move {
            let _ = tx.send(cutover_verified(&cfg, &reused, &moot).await).await;
        });
    }

    /// What cutover waits for, on the status line, the Sync screen and in `/metrics`.
    fn say_cutover_wait(&mut self, sync: &Sync, grace: Duration) {
        let state = &self.state;
        let unsettled = state.in_flight.len()
            + state.failed.len()
            + usize::from(self.batch_running || self.dirty);
        let wait = (!self.cutover_announced)
            .then(|| {
                crate::core::sync::cutover_wait(
                    &state.status,
                    state.no_nodes_since.map(|t| t.elapsed()),
                    grace,
                    (unsettled, sync.lease.holding(), self.verifying),
                    self.last_verify_failed.as_ref(),
                )
            })
            .flatten();
        sync.metrics
            .cutover_waiting(wait.as_ref().map(|w| w.reason()));
        self.state.status.cutover_wait = wait;
    }

    /// Nothing pending, in flight, failing or waiting to be planned.
    fn quiet(&self) -> bool {
        self.state.status.pending == 0
            && self.state.in_flight.is_empty()
            && self.state.failed.is_empty()
            && !self.batch_running
            && !self.dirty
    }

    /// A cutover check's verdict: announced if it passed and the rollout is still over and
    /// quiet (a node may have come back, or something arrived, while it ran).
    async fn on_verdict(
        &mut self,
        sync: &mut Sync,
        verdict: std::result::Result<(), CutoverWait>,
    ) -> Option<SyncEnd> {
        self.verifying = false;
        if let Err(failed) = verdict {
            // Said until the next check, so nobody wonders whether sync is stuck.
            let _ = sync
                .events
                .send(SyncEvent::Note(format!("cutover not yet: {failed}")))
                .await;
            self.last_verify_failed = Some(failed);
            return None;
        }
        self.last_verify_failed = None;
        let still_over = self.state.no_nodes_since.is_some() && sync.lease.holding();
        if !still_over || !self.quiet() || self.cutover_announced {
            return None;
        }
        self.cutover_announced = true;
        let state = &mut self.state;
        let report = CutoverReport {
            mirrored: state.status.mirrored,
            mapped: state.reused.len(),
            skipped: state.skipped,
            moot: state.moot.len(),
        };
        let _ = sync.events.send(SyncEvent::Cutover(report)).await;
        // No kvstore-mode node is left to need them. Released in a task; a sync that ends
        // (`--until-cutover`) waits for it.
        if let Some(task) = sync.reservations.take() {
            let (cfg, metrics, events) =
                (sync.cfg.clone(), sync.metrics.clone(), sync.events.clone());
            sync.releasing = Some(tokio::spawn(async move {
                let kept = task.finish(FINISH_WAIT).await;
                release(kept, &cfg, &metrics, &events).await;
            }));
            state.status.reservations = 0;
        }
        sync.opts.until_cutover.then(|| SyncEnd {
            cutover: true,
            status: state.status.clone(),
            unwritten: 0,
        })
    }
}

/// Starts keeping the one-writer lease and waits (up to 5 s) for its first answer, so a
/// sync that is not to write knows it before its first round. One sync per decision log
/// on a host: the log is locked, so the lease's holder name (host and log) is one process.
async fn take_lease(
    cfg: &ServiceConfig,
    opts: &SyncOptions,
    events: &mpsc::Sender<SyncEvent>,
) -> Result<LeaseKeeper> {
    cfg.log.lock_for_one_writer()?;
    let log = std::fs::canonicalize(cfg.log.path()).unwrap_or_else(|_| cfg.log.path().into());
    let me = format!("{}:{}", crate::io::operator::hostname(), log.display());
    let api = LeaseApi::new(&cfg.target, &opts.lease.namespace, &opts.lease.name);
    let lease = LeaseKeeper::start(api, opts.lease.clone(), me);
    let mut writer = lease.writer.clone();
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        writer.wait_for(|w| *w != Writer::Unknown),
    )
    .await
    .ok()
    .and_then(|w| w.ok().map(|w| w.clone()));
    if let Some(w) = first {
        match &w {
            Writer::Refused(why) => return Err(lease_refused(opts, why)),
            Writer::Other { holder } => {
                let _ = events
                    .send(SyncEvent::Note(format!(
                        "lease {}/{} is held by {holder}: following both sides without writing until it is free",
                        opts.lease.namespace, opts.lease.name
                    )))
                    .await;
            }
            _ => {}
        }
    }
    Ok(lease)
}

fn lease_refused(opts: &SyncOptions, why: &str) -> Error {
    Error::Config(format!(
        "the one-writer lease {ns}/{name} is refused to these credentials ({why}): grant get, create and update on leases in namespace {ns} (the Role in assets/clusterrole.yaml), or name another with --lease-namespace/--lease-name",
        ns = opts.lease.namespace,
        name = opts.lease.name
    ))
}

/// How long an ending sync waits for the reservation writes in flight (a stalled kvstore
/// answers a request only at the client's timeout).
const FINISH_WAIT: Duration = Duration::from_secs(10);

/// Releases the reservations, reporting how many master keys went; `None` when the task did
/// not hand them back in time.
async fn release(
    kept: Option<Reservations>,
    cfg: &ServiceConfig,
    metrics: &Metrics,
    events: &mpsc::Sender<SyncEvent>,
) {
    let Some(r) = kept else {
        let _ = events
            .send(SyncEvent::Trouble(
                "releasing the kvstore reservations: the kvstore did not answer; they lapse with the lease".into(),
            ))
            .await;
        return;
    };
    let held = r.masters_written();
    let ev = match r.release(&cfg.log, metrics).await {
        Ok(deleted) => SyncEvent::Note(format!(
            "released the kvstore reservations: lease revoked, {deleted} of {held} master keys deleted (the rest is in use or changed)"
        )),
        Err(e) => SyncEvent::Trouble(format!(
            "releasing the kvstore reservations: {e}; they lapse with the lease"
        )),
    };
    let _ = events.send(ev).await;
}

/// Once the rollout is over, closes each conflict still waiting for a decision whose labels
/// no kvstore-mode node uses: no agent will use the id the kvstore held for them, so there is
/// nothing left to carry over. Logged and reported once each; true if any was closed.
async fn close_moot(
    state: &mut SyncState,
    events: &mpsc::Sender<SyncEvent>,
    cfg: &ServiceConfig,
) -> bool {
    let mut closed = false;
    for (id, labels, kind) in state.moot_now() {
        let mut r = Record::decision(&id, &labels, kind, ("moot", "rule"), None);
        r.outcome = Some(Outcome::Skipped);
        r.error =
            Some("no kvstore-mode node uses these labels any more: closed without a write".into());
        if cfg.log.append(r).is_err() {
            return closed;
        }
        state.moot.insert(id.clone());
        state.reused.remove(&id);
        closed = true;
        let _ = events.send(SyncEvent::Moot { id, labels }).await;
    }
    closed
}

/// The next decision made while sync runs; never, when nobody can make one.
async fn next_decision(
    decided: &mut Option<mpsc::Receiver<LoggedDecision>>,
) -> Option<LoggedDecision> {
    match decided {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The cutover's last check: a consistent verify. Every kvstore identity must be in
/// Kubernetes with its labels at its own id, at the id a decision in any log given maps it
/// to, or at the id the plan reuses for it (labels a CRD-mode agent already holds); one
/// the operator skipped is a decision, not a problem.
async fn cutover_verified(
    cfg: &ServiceConfig,
    reused: &BTreeMap<String, u32>,
    moot: &BTreeSet<String>,
) -> std::result::Result<(), CutoverWait> {
    let logs: Vec<std::path::PathBuf> = cfg
        .resume
        .iter()
        .cloned()
        .chain(std::iter::once(cfg.log.path().to_path_buf()))
        .collect();
    let failed = |first: String| CutoverWait::Verify { problems: 1, first };
    let mut expect = flows::expectations_from_logs(&logs)
        .map_err(|e| failed(format!("the decision logs cannot be read: {e}")))?;
    for (id, target) in reused {
        expect.mappings.entry(id.clone()).or_insert(Some(*target));
    }
    // Closed as moot: like a skip, a decision recorded in the log, not a problem.
    for id in moot {
        expect.mappings.insert(id.clone(), None);
    }
    let report = flows::verify(&cfg.kv, &cfg.target, cfg.scope.range, &expect)
        .await
        .map_err(|e| failed(format!("verify could not run: {e}")))?;
    let problems: Vec<_> = report
        .problems
        .iter()
        .filter(|p| p.problem != crate::core::verify::ProblemKind::Skipped)
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    // The first few, each with its id and why: enough to act on, short enough for a line.
    let first: Vec<String> = problems
        .iter()
        .take(3)
        .map(|p| {
            let at = p
                .expected_at
                .map_or(String::new(), |t| format!(" (at {t})"));
            let found = p
                .found_labels
                .as_deref()
                .map_or(String::new(), |l| format!(", Kubernetes holds {l}"));
            format!("{} {}{at}{found}", p.id, p.problem.as_str())
        })
        .collect();
    Err(CutoverWait::Verify {
        problems: problems.len(),
        first: first.join("; "),
    })
}

/// How long a split waits for the `value/` keys of the nodes that use it before it is
/// reported without them.
const SPLIT_NODES_WAIT: Duration = Duration::from_secs(5);

/// Reports the splits found since the last settle, each once its kvstore labels' nodes can
/// be named (up to `SPLIT_NODES_WAIT` for their `value/` keys): in a task, so the loop does
/// not wait on etcd.
fn report_splits(
    state: &mut SyncState,
    conn: &KvFollower,
    prefix: &str,
    events: &mpsc::Sender<SyncEvent>,
    cfg: &Arc<ServiceConfig>,
) {
    let found: Vec<(u32, LabelKey, Vec<u8>, Instant)> = std::mem::take(&mut state.splits_to_report)
        .into_iter()
        .filter_map(|(id, found)| {
            // Resolved meanwhile (the kvstore's GC, an object deleted): nothing to report.
            let k8s_labels = state.k8s.get(&id)?.clone();
            let kv_value = state.masters.get(id.to_string().as_bytes())?.clone();
            Some((id, k8s_labels, kv_value, found))
        })
        .collect();
    let (conn, prefix) = (conn.clone(), prefix.to_string());
    let (events, cfg) = (events.clone(), cfg.clone());
    tokio::spawn(async move {
        for (id, k8s_labels, kv_value, found) in found {
            let Ok(kv_labels) = valid_label_key(&kv_value) else {
                continue;
            };
            let nodes = loop {
                let nodes = conn
                    .nodes_using(&prefix, &kv_value)
                    .await
                    .unwrap_or_default();
                if !nodes.is_empty() || found.elapsed() >= SPLIT_NODES_WAIT {
                    break nodes;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            };
            let split = SplitAllocation {
                id,
                kvstore_labels: kv_labels.to_string(),
                k8s_labels,
                nodes,
            };
            let mut record = Record::decision(
                &id.to_string(),
                kv_labels,
                Kind::Remap,
                ("split-allocation", "rule"),
                Some(id),
            );
            record.error = Some(split.to_string());
            let _ = cfg.log.append(record);
            let _ = events.send(SyncEvent::Split(split)).await;
        }
    });
}

/// One round of sync's core (`SyncState::round`): the creates it makes; its reports logged
/// and sent.
async fn plan_round(
    state: &mut SyncState,
    decisions: &BTreeMap<String, LoggedDecision>,
    opts: &SyncOptions,
    events: &mpsc::Sender<SyncEvent>,
    cfg: &ServiceConfig,
) -> Vec<Op> {
    let range = cfg.scope.range;
    let (ops, reports) = state.round(decisions, range, opts.accept_proposals, Instant::now());
    for report in reports {
        let ev = match report {
            SyncReport::Invalid { id, labels, reason } => {
                let mut r = Record::decision(&id, &labels, Kind::Invalid, ("skip", "rule"), None);
                r.outcome = Some(Outcome::Skipped);
                r.error = Some(reason.clone());
                let _ = cfg.log.append(r);
                SyncEvent::Invalid { id, reason }
            }
            SyncReport::Conflict { id, kind, reason } => SyncEvent::Conflict { id, kind, reason },
        };
        let _ = events.send(ev).await;
    }
    ops
}

/// A create the server refused (401, 403): sync cannot write, and waiting will not fix it.
fn refused_write(result: &Result<ApplyReport>) -> Option<Error> {
    match result {
        Err(e) => refusal("creating a CiliumIdentity", e),
        Ok(report) => report.results.iter().find(|r| r.refused).map(|r| {
            refused(
                "creating a CiliumIdentity",
                r.error.as_deref().unwrap_or(""),
            )
        }),
    }
}

fn publish(state: &SyncState, metrics: &Metrics) {
    metrics.kvstore_nodes.set(state.status.kvstore_nodes as i64);
    metrics.pending.set(state.status.pending as i64);
    publish_splits(state, metrics);
}

/// The splits now, and those found since the last publication.
fn publish_splits(state: &SyncState, metrics: &Metrics) {
    metrics.splits.set(state.status.splits as i64);
    let new_splits = state
        .status
        .splits_found
        .saturating_sub(metrics.splits_found.get());
    metrics.splits_found.inc_by(new_splits);
}

/// Folds a batch's outcomes into the state (`SyncState::take_results`) and the metrics;
/// returns what to report when the batch as a whole failed or was halted.
fn take_results(
    state: &mut SyncState,
    ops: Vec<Op>,
    result: Result<ApplyReport>,
    metrics: &Metrics,
) -> Option<String> {
    let outcome = match result {
        Err(e) => BatchOutcome::Failed(e.to_string()),
        Ok(report) => BatchOutcome::Done {
            results: report
                .results
                .iter()
                .filter_map(|r| r.target_id.map(|t| (t, r.outcome)))
                .collect(),
            halted: report.stopped.clone(),
        },
    };
    let taken = state.take_results(ops, outcome, Instant::now());
    metrics.mirrored.inc_by(taken.mirrored);
    metrics.write_failures.inc_by(taken.failures);
    for lag in &taken.lags {
        metrics.lag.observe(lag.as_secs_f64());
    }
    taken.trouble
}

/// Writes one round's creates through the executor, logging each decision and outcome.
///
/// The batch has a stop switch of its own: when the API server keeps failing past apply's
/// retry budget the executor halts the batch, not sync. What it did not write is retried on
/// sync's timer, however long the outage lasts; sync's own stop still stops the batch.
async fn write(
    cfg: &ServiceConfig,
    ops: Vec<Op>,
    stop: StopFlag,
    gate: executor::WriteGate,
) -> Result<ApplyReport> {
    executor::log_decisions(&cfg.log, &ops)?;
    // No request starts unless the lease is valid, with margin, at that moment.
    let batch = StopFlag::gated(gate);
    let relay = {
        let batch = batch.clone();
        tokio::spawn(async move {
            stopped(&stop).await;
            batch.stop();
        })
    };
    let report = executor::apply(
        &cfg.target,
        ops,
        false,
        &cfg.apply,
        Some(&cfg.log),
        Watchers::default(),
        batch,
    )
    .await;
    relay.abort();
    report
}

/// Follows the kvstore, watching again from the last revision after a failure.
async fn follow_kvstore(
    conn: KvFollower,
    prefix: String,
    mut revision: i64,
    tx: mpsc::Sender<KvWatchEvent>,
    metrics: Arc<Metrics>,
    events: mpsc::Sender<SyncEvent>,
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
            let _ = events
                .send(SyncEvent::Trouble(format!(
                    "{e}; watching again from revision {revision}"
                )))
                .await;
        }
        backoff.wait().await;
    }
}

/// Follows Kubernetes, watching again from the last version after a failure; a 410 means
/// a fresh list (`Expired` tells the sync loop).
async fn follow_kubernetes(
    cfg: Arc<ServiceConfig>,
    mut version: String,
    tx: mpsc::Sender<K8sChange>,
    (metrics, events): (Arc<Metrics>, mpsc::Sender<SyncEvent>),
    fatal: mpsc::Sender<Error>,
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
        if matches!(ended, Ok(Ok(()))) && !heard && opened.elapsed() < Duration::from_secs(5) {
            // Ended cleanly at once with nothing said (a proxy closing streams): not again
            // at once.
            metrics.k8s_live.store(false, Ordering::Relaxed);
            backoff.wait().await;
        }
        if let Ok(Err(e)) = ended {
            metrics.k8s_live.store(false, Ordering::Relaxed);
            if matches!(e.code(), Some(401 | 403)) {
                let what = "watching ciliumidentities.cilium.io";
                let _ = fatal.send(refused(what, &e.to_string())).await;
                return;
            }
            let _ = events
                .send(SyncEvent::Trouble(format!(
                    "Kubernetes watch: {e}; watching again"
                )))
                .await;
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
                        if let Some(refused) = refusal("listing ciliumidentities.cilium.io", &e) {
                            let _ = fatal.send(refused).await;
                            return;
                        }
                        let _ = events
                            .send(SyncEvent::Trouble(format!(
                                "listing again after the watch expired: {e}"
                            )))
                            .await;
                        backoff.wait().await;
                    }
                }
            }
        }
    }
}
