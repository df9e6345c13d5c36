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
use super::decisions_file;
pub use super::decisions_file::DecisionChange;
use super::flows;
use super::lease::{LeaseKeeper, LeaseOptions, Writer};
use super::metrics::{Metrics, Source};
use super::reserve::{self, ReservationTask, Reservations};
use crate::apply::executor::{self, StopFlag, Watchers};
use crate::apply::outcome::{ApplyReport, Outcome};
use crate::core::kvstore::NodeCounts;
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::planner::resume::{self, LoggedDecision};
use crate::core::planner::{Kind, Op};
use crate::core::sync::machine::{
    Input, LeaseHolder, Machine, Output, Reserve, Settings, SplitFound,
};
use crate::core::sync::reserve as reserve_rules;
use crate::core::sync::{BatchOutcome, CutoverWait, SyncReport, SyncState, Taken};
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
    /// Decisions made elsewhere, in a file sync reads at the start and again when it
    /// changes (`app::decisions_file`); no file yet is no decisions yet.
    pub decisions_file: Option<std::path::PathBuf>,
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
            decisions_file: None,
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
        let (id, kv, k8s) = (self.id, &self.kvstore_labels, &self.k8s_labels);
        if self.nodes.is_empty() {
            return write!(
                f,
                "split allocation at id {id}: the kvstore holds {kv}, Kubernetes holds {k8s}; no kvstore-mode node uses the kvstore's labels now, so there is nothing to roll (they get a remap proposal)"
            );
        }
        write!(
            f,
            "split allocation at id {id}: the kvstore holds {kv} (used by kvstore-mode nodes {}), Kubernetes holds {k8s}: roll those nodes to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels); the kvstore's labels get a remap proposal",
            self.nodes.join(", ")
        )
    }
}

impl SplitAllocation {
    /// The same report for a terminal line by line: what to do first, then each label set
    /// on a line of its own, so no line carries both label keys.
    pub fn lines(&self) -> Vec<String> {
        let id = self.id;
        let first = if self.nodes.is_empty() {
            format!(
                "split allocation at id {id}: no kvstore-mode node uses the kvstore's labels now, so there is nothing to roll (they get a remap proposal)"
            )
        } else {
            format!(
                "split allocation at id {id}: roll {} to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels; the kvstore's labels get a remap proposal)",
                crate::core::audit::names_list(&self.nodes, 8)
            )
        };
        vec![
            first,
            format!("  the kvstore holds  {}", self.kvstore_labels),
            format!("  Kubernetes holds   {}", self.k8s_labels),
        ]
    }
}

pub use crate::core::sync::SyncStatus;

/// What sync reports as it goes.
#[derive(Debug, Clone)]
pub enum SyncEvent {
    Status(SyncStatus),
    /// Which nodes use each label set now (from the kvstore watch), when they moved.
    NodeCounts(NodeCounts),
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

/// How a round's first creates read: what sync wrote as it started (or after a fresh read),
/// before anything arrived through its watches.
pub fn catch_up_text(n: u64) -> String {
    format!(
        "wrote {}: decided, or missing in Kubernetes, when sync read both sides (counted as mirrored)",
        crate::core::words::count(n, "CiliumIdentity object")
    )
}

/// How a conflict closed as moot reads, on the terminal and in the TUI.
pub fn moot_text(id: &str, labels: &str) -> String {
    format!(
        "moot: {id} ({labels}) waited for a decision, but no kvstore-mode node uses it any more: closed without a write"
    )
}

pub use crate::core::sync::machine::{CutoverReport, SyncEnd};

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
    mut decided: Option<mpsc::Receiver<DecisionChange>>,
) -> Result<SyncEnd> {
    if let KvSource::Memory(_) = &cfg.kv {
        // Refused before anything is read or written (`follower` says why).
        cfg.kv.follower().await?;
    }
    let file = match &opts.decisions_file {
        Some(p) => decisions_file::read(p)?,
        None => None,
    };
    let (decisions, earlier) = resume_decisions(&cfg, file.as_ref().map(|f| f.1.clone()))?;
    // Followed while sync runs, unless decisions come from a screen instead (the TUI's).
    let _following_file = match (&opts.decisions_file, decided.is_none()) {
        (Some(path), true) => {
            let seen = file.map_or_else(Default::default, |(bytes, steps)| {
                (bytes, resume::replay(steps))
            });
            let (tx, rx) = mpsc::channel(64);
            decided = Some(rx);
            Some(AbortOnDrop(decisions_file::follow(
                path.clone(),
                seen,
                tx,
                events.clone(),
            )))
        }
        _ => None,
    };
    let lease = take_lease(&cfg, &opts, &events).await?;
    // The grace starts when the last kvstore-mode node goes. In the demo's in-memory kvstore
    // a node's keys go the moment it moves (its lease is revoked, none lapses later), so a
    // few seconds do.
    let cutover_grace = match &cfg.kv {
        KvSource::Live(_) => Duration::from_secs(5).min(opts.cutover_grace),
        _ => opts.cutover_grace,
    };
    let settings = Settings {
        range: cfg.scope.range,
        accept_proposals: opts.accept_proposals,
        until_cutover: opts.until_cutover,
        reserve_in_kvstore: opts.reserve_in_kvstore,
        cutover_grace,
        lease: format!("{}/{}", opts.lease.namespace, opts.lease.name),
    };
    let mut machine = Machine::new(settings, decisions);
    // Who holds the Lease now, known before the first round (said when the keeper says it).
    machine.know_holder(holder_of(lease.writer.borrow().clone()));
    let mut sync = Sync {
        writer: lease.writer.clone(),
        lease,
        cfg,
        opts,
        metrics,
        events,
        stop,
        decided,
        machine,
        earlier,
        carried: None,
        reservations: None,
        releasing: None,
    };
    let mut backoff = Backoff::new(Policy::FOLLOW);
    loop {
        sync.metrics.turned();
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

/// A task that ends with the value that owns it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The decisions recorded so far (any --resume logs, then the decisions file's `from_file`,
/// then this log): a restart resumes them; and the kvstore reservations the logs record as
/// made and not released. A log that cannot be read is an error: going on without its
/// decisions could create what the operator skipped.
fn resume_decisions(
    cfg: &ServiceConfig,
    from_file: Option<Vec<resume::LogStep>>,
) -> Result<(BTreeMap<String, LoggedDecision>, reserve::Unreleased)> {
    let (mut steps, mut reserved) = (Vec::new(), BTreeMap::new());
    for p in &cfg.resume {
        let log = flows::read_log(p)?;
        steps.extend(log.steps());
        reserve::note_reservations(&mut reserved, &log);
    }
    steps.extend(from_file.unwrap_or_default());
    let own = flows::read_log(cfg.log.path())?;
    steps.extend(own.steps());
    reserve::note_reservations(&mut reserved, &own);
    Ok((resume::replay(steps), reserved))
}

/// What lives across rounds: the configuration, the lease, the machine that decides (with
/// the decisions), the reservations.
struct Sync {
    cfg: Arc<ServiceConfig>,
    opts: SyncOptions,
    metrics: Arc<Metrics>,
    events: mpsc::Sender<SyncEvent>,
    stop: StopFlag,
    lease: LeaseKeeper,
    writer: tokio::sync::watch::Receiver<Writer>,
    decided: Option<mpsc::Receiver<DecisionChange>>,
    /// Every decision sync takes: `core::sync::machine`. The handlers below only carry its
    /// commands out and feed the results back.
    machine: Machine,
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
/// cutover, or a compaction. It holds the channels; what to do is the machine's.
struct Round {
    /// A refusal a watch task met: sync ends.
    fatal_rx: mpsc::Receiver<Error>,
    conn: KvFollower,
    prefix: String,
    kv_rx: mpsc::Receiver<KvWatchEvent>,
    k8s_rx: mpsc::Receiver<K8sChange>,
    watches: [tokio::task::JoinHandle<()>; 2],
    done_tx: mpsc::Sender<(Vec<Op>, Result<ApplyReport>)>,
    done_rx: mpsc::Receiver<(Vec<Op>, Result<ApplyReport>)>,
    /// A cutover check (a full consistent verify, 18 s at 65k on a real server) runs as a
    /// task and its verdict comes back here, so the loop keeps mirroring meanwhile.
    verdict_tx: mpsc::Sender<std::result::Result<(), CutoverWait>>,
    verdict_rx: mpsc::Receiver<std::result::Result<(), CutoverWait>>,
    /// The stop was handed to the machine.
    stop_told: bool,
    /// The round's first creates (what was decided or missing when sync read both sides)
    /// were announced: they count as mirrored, and would otherwise go unsaid.
    catch_up_said: bool,
}

impl Sync {
    /// Reads both sides, starts the machine's round on them (the first reservations go before
    /// the watches start, so the ids are taken from the first moment on), and starts both
    /// watches.
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
        // Released at cutover: a fresh snapshot after it reserves nothing again.
        if self.opts.reserve_in_kvstore && self.reservations.is_none() && self.releasing.is_none() {
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
        // Taken only now: a list that fails (the API server down during a resnapshot) must
        // leave what sync made, reported and waits for, for the round that succeeds.
        if let Some(old) = self.carried.take() {
            state.carry_over(old, Instant::now());
        }
        let (kv_revision, k8s_version) = (state.kv_revision, state.k8s_version.clone());
        let first = self.machine.start_round(state, self.lease.gate.open());
        for o in first {
            if let Output::Reserve(cmd) = o {
                self.reserve(cmd);
            }
        }
        let (kv_tx, kv_rx) = mpsc::channel::<KvWatchEvent>(256);
        let (k8s_tx, k8s_rx) = mpsc::channel::<K8sChange>(1024);
        let kv_watch = tokio::spawn(follow_kvstore(
            conn.clone(),
            prefix.clone(),
            kv_revision,
            kv_tx,
            self.metrics.clone(),
            self.events.clone(),
        ));
        let (fatal_tx, fatal_rx) = mpsc::channel(1);
        let k8s_watch = tokio::spawn(follow_kubernetes(
            cfg.clone(),
            k8s_version,
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
            conn,
            prefix,
            kv_rx,
            k8s_rx,
            watches: [kv_watch, k8s_watch],
            done_tx,
            done_rx,
            stop_told: false,
            catch_up_said: false,
        })
    }

    /// Carries a reservation command out on the reservations task, if sync reserves.
    fn reserve(&mut self, cmd: Reserve) {
        let now = Instant::now();
        if let Reserve::AdoptEarlier = cmd {
            return self.adopt_earlier();
        }
        if let Reserve::Release = cmd {
            // No kvstore-mode node is left to need them. Released in a task; a sync that
            // ends (`--until-cutover`) waits for it.
            if let Some(task) = self.reservations.take() {
                let (cfg, metrics, events) =
                    (self.cfg.clone(), self.metrics.clone(), self.events.clone());
                self.releasing = Some(tokio::spawn(async move {
                    let kept = task.finish(FINISH_WAIT).await;
                    release(kept, &cfg, &metrics, &events).await;
                }));
            }
            return;
        }
        let Some(r) = self.reservations.as_mut() else {
            return;
        };
        match cmd {
            Reserve::MasterGone { id, k8s } => r.master_gone(id, k8s),
            Reserve::Want { id, labels } => r.want(id, labels),
            Reserve::Deleted { id } => r.deleted(id),
            Reserve::ViewChanged => r.view_changed(),
            Reserve::Pump => r.pump(&self.machine.state, self.cfg.scope.range, now),
            Reserve::AdoptEarlier | Reserve::Release => {}
        }
    }

    /// Hands what an earlier sync reserved and did not release to the reservations task,
    /// once, by the lease's holder (only it writes).
    fn adopt_earlier(&mut self) {
        let Some(r) = self.reservations.as_mut() else {
            return;
        };
        let holding = self.machine.holding();
        let earlier =
            reserve_rules::earlier_to_adopt(&mut self.earlier, &self.machine.state, holding);
        r.adopt(earlier);
    }
}

impl Round {
    /// Follows both sides until the round ends: each event goes to the machine, and what it
    /// says is carried out.
    async fn follow(mut self, sync: &mut Sync) -> Result<RoundEnd> {
        let mut settle = tokio::time::interval(sync.opts.settle);
        let mut status_tick = tokio::time::interval(sync.opts.status_every);
        let end = loop {
            let input = tokio::select! {
                ev = self.kv_rx.recv() => match ev {
                    Some(ev) => Input::Kv(ev),
                    // The watch task ended (it never does on its own): start over rather
                    // than spin on a closed channel.
                    None => break RoundEnd::WatchLost("the kvstore watch ended"),
                },
                ch = self.k8s_rx.recv() => match ch {
                    Some(ch) => Input::K8s(ch),
                    None => break RoundEnd::WatchLost("the Kubernetes watch ended"),
                },
                Some(e) = self.fatal_rx.recv() => {
                    self.abort_watches(&sync.metrics);
                    return Err(e);
                }
                Ok(()) = sync.writer.changed() => {
                    let now = sync.writer.borrow_and_update().clone();
                    match now {
                        Writer::Refused(why) => {
                            self.abort_watches(&sync.metrics);
                            return Err(lease_refused(&sync.opts, &why));
                        }
                        w => Input::Lease(holder_of(w)),
                    }
                }
                Some(d) = next_decision(&mut sync.decided) => match d {
                    DecisionChange::Decided(d) => Input::Decided(d),
                    DecisionChange::Undone(id) => Input::Undone(id),
                },
                Some((ops, result)) = self.done_rx.recv() => {
                    if let Some(e) = refused_write(&result) {
                        self.abort_watches(&sync.metrics);
                        return Err(e);
                    }
                    Input::BatchDone { ops, outcome: batch_outcome(result) }
                }
                _ = settle.tick() => {
                    if sync.stop.is_stopped() && !self.stop_told {
                        self.stop_told = true;
                        self.step(sync, Input::Stop).await?;
                    }
                    Input::Settle
                }
                _ = status_tick.tick() => Input::Status { watching: sync.metrics.healthy() },
                Some(reply) = reserve::next_reply(&mut sync.reservations) => {
                    let Some(r) = sync.reservations.as_mut() else { continue };
                    let said = r.on_reply(reply, Instant::now());
                    let (held, own) = (r.held(), r.own_masters().clone());
                    match said {
                        Some(reserve::Said::Trouble(t)) => {
                            let _ = sync.events.send(SyncEvent::Trouble(t)).await;
                        }
                        Some(reserve::Said::Note(n)) => {
                            let _ = sync.events.send(SyncEvent::Note(n)).await;
                        }
                        None => {}
                    }
                    Input::Reservations { held, own_masters: own }
                }
                Some(verdict) = self.verdict_rx.recv() => Input::Verdict(verdict),
            };
            sync.metrics.turned();
            if let Some(end) = self.step(sync, input).await? {
                break end;
            }
        };
        self.abort_watches(&sync.metrics);
        Ok(end)
    }

    /// One input to the machine, and its commands carried out in order; the round's end if
    /// one of them ends it.
    async fn step(&mut self, sync: &mut Sync, input: Input) -> Result<Option<RoundEnd>> {
        let outs = sync
            .machine
            .step(input, Instant::now(), sync.lease.gate.open());
        let mut queue: std::collections::VecDeque<Output> = outs.into();
        let mut end = None;
        while let Some(o) = queue.pop_front() {
            match o {
                Output::Following => {
                    let _ = sync.events.send(SyncEvent::Following).await;
                }
                Output::Note(n) => {
                    let _ = sync.events.send(SyncEvent::Note(n)).await;
                }
                Output::Trouble(t) => {
                    let _ = sync.events.send(SyncEvent::Trouble(t)).await;
                }
                Output::Report(r) => report(r, &sync.events, &sync.cfg).await,
                Output::Write(ops) => {
                    let (cfg, done_tx) = (sync.cfg.clone(), self.done_tx.clone());
                    let (stop, gate) = (sync.stop.clone(), sync.lease.gate.clone());
                    tokio::spawn(async move {
                        let result = write(&cfg, ops.clone(), stop, gate).await;
                        let _ = done_tx.send((ops, result)).await;
                    });
                }
                Output::Taken(taken) => {
                    record_taken(&taken, &sync.metrics);
                    // Creates with no lag are no arrival through a watch: the catch-up.
                    if !self.catch_up_said && taken.mirrored > 0 && taken.lags.is_empty() {
                        self.catch_up_said = true;
                        let _ = sync
                            .events
                            .send(SyncEvent::Note(catch_up_text(taken.mirrored)))
                            .await;
                    }
                }
                Output::Reserve(cmd) => sync.reserve(cmd),
                Output::ReportSplits(found) => {
                    report_splits(found, &self.conn, &self.prefix, &sync.events, &sync.cfg);
                }
                Output::CloseMoot(moot) => {
                    let logged = log_moot(moot, &sync.cfg);
                    let more = sync.machine.step(
                        Input::MootLogged(logged),
                        Instant::now(),
                        sync.lease.gate.open(),
                    );
                    queue.extend(more);
                }
                Output::Moot { id, labels } => {
                    let _ = sync.events.send(SyncEvent::Moot { id, labels }).await;
                }
                Output::Verify { reused, nowhere } => {
                    let (cfg, tx) = (sync.cfg.clone(), self.verdict_tx.clone());
                    tokio::spawn(async move {
                        let _ = tx
                            .send(cutover_verified(&cfg, &reused, &nowhere).await)
                            .await;
                    });
                }
                Output::Status(status) => {
                    return_freed_memory();
                    sync.metrics
                        .cutover_waiting(status.cutover_wait.as_ref().map(|w| w.reason()));
                    let _ = sync.events.send(SyncEvent::Status(status)).await;
                }
                Output::NodeCounts(counts) => {
                    let _ = sync.events.send(SyncEvent::NodeCounts(counts)).await;
                }
                Output::Cutover(report) => {
                    let _ = sync.events.send(SyncEvent::Cutover(report)).await;
                }
                Output::Resnapshot => {
                    // The batch in flight is taken in first: the next round must not write
                    // beside it, and its outcomes are part of what is carried.
                    if sync.machine.batch_running()
                        && let Some((ops, result)) = self.done_rx.recv().await
                    {
                        let outcome = batch_outcome(result);
                        let outs = sync.machine.step(
                            Input::BatchDone { ops, outcome },
                            Instant::now(),
                            sync.lease.gate.open(),
                        );
                        for o in outs {
                            if let Output::Taken(t) = o {
                                record_taken(&t, &sync.metrics);
                            }
                        }
                    }
                    sync.carried = Some(std::mem::take(&mut sync.machine.state));
                    end = Some(RoundEnd::Resnapshot);
                }
                Output::End(e) => end = Some(RoundEnd::Done(Box::new(e))),
            }
        }
        publish(&sync.machine.state, &sync.metrics);
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
}

/// The lease keeper's word as the machine takes it (a refusal ends sync before).
fn holder_of(w: Writer) -> LeaseHolder {
    match w {
        Writer::Us => LeaseHolder::Us,
        Writer::Other { holder } => LeaseHolder::Other(holder),
        Writer::Unknown | Writer::Refused(_) => LeaseHolder::Unknown,
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

/// Logs each conflict the machine closes as moot (no kvstore-mode node uses its labels any
/// more, so no agent will use the id the kvstore held for them): the ones logged, which the
/// machine then closes. A log that fails stops the closing there.
fn log_moot(moot: Vec<(String, LabelKey, Kind)>, cfg: &ServiceConfig) -> Vec<(String, LabelKey)> {
    let mut logged = Vec::new();
    for (id, labels, kind) in moot {
        let mut r = Record::decision(&id, &labels, kind, ("moot", "rule"), None);
        r.outcome = Some(Outcome::Skipped);
        r.error =
            Some("no kvstore-mode node uses these labels any more: closed without a write".into());
        if cfg.log.append(r).is_err() {
            break;
        }
        logged.push((id, labels));
    }
    logged
}

impl From<decisions_file::Said> for SyncEvent {
    fn from(said: decisions_file::Said) -> Self {
        match said {
            decisions_file::Said::Note(n) => SyncEvent::Note(n),
            decisions_file::Said::Trouble(t) => SyncEvent::Trouble(t),
        }
    }
}

/// The next decision made (or undone) while sync runs; never, when nobody can make one.
async fn next_decision(
    decided: &mut Option<mpsc::Receiver<DecisionChange>>,
) -> Option<DecisionChange> {
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
    nowhere: &BTreeSet<String>,
) -> std::result::Result<(), CutoverWait> {
    let logs: Vec<std::path::PathBuf> = cfg
        .resume
        .iter()
        .cloned()
        .chain(std::iter::once(cfg.log.path().to_path_buf()))
        .collect();
    let failed = |first: String| CutoverWait::Verify { problems: 1, first };
    let logged = flows::expectations_from_logs(&logs)
        .map_err(|e| failed(format!("the decision logs cannot be read: {e}")))?;
    let expect = crate::core::sync::machine::cutover_expectations(logged, reused, nowhere);
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

/// Reports the splits the machine found, each once its kvstore labels' nodes can be named
/// (up to `SPLIT_NODES_WAIT` for their `value/` keys): in a task, so the loop does not wait
/// on etcd.
fn report_splits(
    found: Vec<SplitFound>,
    conn: &KvFollower,
    prefix: &str,
    events: &mpsc::Sender<SyncEvent>,
    cfg: &Arc<ServiceConfig>,
) {
    let (conn, prefix) = (conn.clone(), prefix.to_string());
    let (events, cfg) = (events.clone(), cfg.clone());
    tokio::spawn(async move {
        for f in found {
            let Ok(kv_labels) = valid_label_key(&f.kv_value) else {
                continue;
            };
            let nodes = loop {
                let nodes = conn
                    .nodes_using(&prefix, &f.kv_value)
                    .await
                    .unwrap_or_default();
                if !nodes.is_empty() || f.found.elapsed() >= SPLIT_NODES_WAIT {
                    break nodes;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            };
            let split = SplitAllocation {
                id: f.id,
                kvstore_labels: kv_labels.to_string(),
                k8s_labels: f.k8s_labels,
                nodes,
            };
            let mut record = Record::decision(
                &f.id.to_string(),
                kv_labels,
                Kind::Remap,
                ("split-allocation", "rule"),
                Some(f.id),
            );
            record.error = Some(split.to_string());
            let _ = cfg.log.append(record);
            let _ = events.send(SyncEvent::Split(split)).await;
        }
    });
}

/// A report of the machine's: a malformed entry is logged as skipped; both are sent.
async fn report(report: SyncReport, events: &mpsc::Sender<SyncEvent>, cfg: &ServiceConfig) {
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

/// A batch's result as the machine takes it in.
fn batch_outcome(result: Result<ApplyReport>) -> BatchOutcome {
    match result {
        Err(e) => BatchOutcome::Failed(e.to_string()),
        Ok(report) => BatchOutcome::Done {
            results: report
                .results
                .iter()
                .filter_map(|r| r.target_id.map(|t| (t, r.outcome)))
                .collect(),
            halted: report.stopped.clone(),
        },
    }
}

/// What a batch changed, in the metrics.
fn record_taken(taken: &Taken, metrics: &Metrics) {
    metrics.mirrored.inc_by(taken.mirrored);
    metrics.write_failures.inc_by(taken.failures);
    for lag in &taken.lags {
        metrics.lag.observe(lag.as_secs_f64());
    }
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
            // A 401 just after the token file was renewed was sent with the old token.
            if matches!(e.code(), Some(401 | 403)) && !cfg.target.sent_with_old_token(&e) {
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
