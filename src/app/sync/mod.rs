//! `sync`: carries a cluster through the rollout window. After a first apply it follows both
//! sides: every identity that appears in the kvstore is planned against the live Kubernetes
//! view and, when it is a plain create (or decided), written within seconds; conflicts wait
//! for a decision; objects CRD-mode agents create at ids the kvstore holds for other labels
//! (split allocations) are reported with the nodes they affect. It never overwrites, updates
//! or deletes a `CiliumIdentity`, and writes to etcd only with `--reserve-in-kvstore`
//! (`app::reserve`, keys of its own). Cutover: no `value/` key left, nothing pending, and a
//! consistent `verify` passes.
//!
//! What to do with each event is `core::sync::shell`'s (the shell the simulation runs too,
//! over `core::sync::machine`); this module only reads both sides, runs the watches and the
//! timers, and hands each input to the shell with the IO of `io`. Nothing slow is awaited in
//! the loop: writes, reservations, cutover checks and split reports run as tasks and answer
//! as messages.

mod event;
mod fatal;
mod io;
mod outbox;
pub mod publish;
mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::config::ServiceConfig;
use super::decisions_file;
pub use super::decisions_file::DecisionChange;
use super::flows;
use super::lease::{LeaseKeeper, LeaseOptions, Writer};
use super::metrics::Metrics;
use super::reserve::{self, ReservationTask, Reservations};
use crate::apply::executor::StopFlag;
use crate::apply::outcome::ApplyReport;
use crate::core::planner::Op;
use crate::core::planner::resume::LoggedDecision;
use crate::core::sync::failure::Path;
pub use crate::core::sync::machine::{CutoverReport, SyncEnd};
use crate::core::sync::machine::{Input, LeaseHolder, Settings};
use crate::core::sync::shell::{self, AfterFailure, Failed, Refusal, RoundEnd, Shell, Turn};
use crate::core::sync::{CutoverWait, SyncState};
use crate::error::{Error, Result};
use crate::io::etcd::KvWatchEvent;
use crate::io::k8s::{K8sChange, ReadMode};
use crate::io::kv_source::{KvFollower, KvSource};
use crate::io::lease::LeaseApi;
use crate::io::retry::{Backoff, Policy};
pub use event::{SplitAllocation, SyncEvent, SyncStatus, catch_up_text, moot_text};
use fatal::batch_outcome;
use io::{Answers, AppIo, stopped};

/// How sync runs.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// Decide remaps and duplicates as proposed; otherwise they wait for a decision.
    pub accept_proposals: bool,
    /// End (exit 0) at cutover, after a final consistent verify.
    pub until_cutover: bool,
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
            cutover_grace: Duration::from_secs(120),
            reserve_in_kvstore: false,
            release_reservations: false,
            lease: LeaseOptions::default(),
            decisions_file: None,
        }
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
    let (decisions, from_file) = resume_decisions(&cfg, file.as_ref().map(|f| &f.1))?;
    // Followed while sync runs, unless decisions come from a screen instead (the TUI's).
    let _following_file = match (&opts.decisions_file, decided.is_none()) {
        (Some(path), true) => {
            let seen = file.map_or_else(Default::default, |(bytes, _)| (bytes, from_file));
            let (tx, rx) = mpsc::channel(64);
            decided = Some(rx);
            Some(AbortOnDrop(decisions_file::follow(
                path.clone(),
                seen,
                cfg.log.clone(),
                tx,
                events.clone(),
            )))
        }
        _ => None,
    };
    let heard_from = cfg.target.notes().mark();
    metrics.hear(cfg.target.notes().clone());
    let lease = take_lease(&cfg, &opts, &events).await?;
    let settings = settings(&cfg, &opts);
    let mut shell = Shell::new(settings, decisions, opts.release_reservations);
    // Who holds the Lease now, known before the first round (said when the keeper says it).
    shell.know_holder(holder_of(lease.writer.borrow().clone()));
    let outbox = outbox::Outbox::new(events.clone());
    // Where it stands, published beside its Lease for `kubectl` and `fleet`.
    let publisher = publish::Publisher::start(
        cfg.target.clone(),
        opts.lease.namespace.clone(),
        &opts.lease.name,
        crate::core::fleet::About {
            version: env!("CARGO_PKG_VERSION").to_string(),
            decision_log: cfg.log.path().display().to_string(),
        },
    );
    let sync = Sync {
        standings: publisher.standings(),
        outbox,
        writer: lease.writer.clone(),
        lease,
        cfg,
        opts,
        metrics,
        events,
        stop,
        decided,
        shell,
        reservations: None,
        releasing: None,
        heard_from,
    };
    let ended = sync.rounds().await;
    match &ended {
        Ok(end) => publisher.end(end.cutover, None).await,
        Err(e) => publisher.end(false, Some(e.to_string())).await,
    }
    ended
}

/// What the machine is set to, from the options.
fn settings(cfg: &ServiceConfig, opts: &SyncOptions) -> Settings {
    let keys_go_at_once = matches!(&cfg.kv, KvSource::Live(_));
    let cutover_grace = shell::cutover_grace(opts.cutover_grace, keys_go_at_once);
    Settings {
        range: cfg.scope.range,
        accept_proposals: opts.accept_proposals,
        until_cutover: opts.until_cutover,
        reserve_in_kvstore: opts.reserve_in_kvstore,
        cutover_grace,
        lease: format!("{}/{}", opts.lease.namespace, opts.lease.name),
    }
}

/// A task that ends with the value that owns it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The decisions recorded so far (any --resume logs, this log and the decisions file, in the
/// order they were made, so the newest word on an identity wins wherever it is written): a
/// restart resumes them. What the file decides that the logs do not hold yet is logged in
/// this log first: the log is the record of every decision sync acts on. Also returned:
/// the file's own decisions in force, from which following it starts. A log that cannot be
/// read is an error: going on without its decisions could create what the operator skipped.
fn resume_decisions(
    cfg: &ServiceConfig,
    file: Option<&crate::io::decision_log::LogContents>,
) -> Result<(BTreeMap<String, LoggedDecision>, decisions_file::InForce)> {
    let mut resumed = Vec::new();
    for p in &cfg.resume {
        resumed.push(flows::read_log(p)?);
    }
    let own = flows::read_log(cfg.log.path())?;
    let mut append = |r| cfg.log.append(r).map_err(|e| e.to_string());
    let resumed: Vec<_> = resumed.iter().collect();
    let merged = crate::core::decision_log::file::resume(&resumed, &own, file, &mut append)
        .map_err(|why| crate::Error::file(cfg.log.path(), why))?;
    Ok((merged.decisions, merged.file))
}

/// The kvstore reservations the logs (any --resume logs, then this log) record as made and
/// not released now.
fn unreleased_in_logs(cfg: &ServiceConfig) -> Result<reserve::Unreleased> {
    let mut logs = Vec::new();
    for p in cfg.resume.iter().chain([&cfg.log.path().to_path_buf()]) {
        logs.push(flows::read_log(p)?);
    }
    let logs: Vec<_> = logs.iter().collect();
    Ok(crate::core::sync::reserve::unreleased_in(&logs))
}

/// What lives across rounds: the configuration, the lease, the shell (with the machine
/// that decides), the reservation writer.
struct Sync {
    cfg: Arc<ServiceConfig>,
    opts: SyncOptions,
    metrics: Arc<Metrics>,
    events: mpsc::Sender<SyncEvent>,
    stop: StopFlag,
    lease: LeaseKeeper,
    writer: tokio::sync::watch::Receiver<Writer>,
    decided: Option<mpsc::Receiver<DecisionChange>>,
    /// Every decision sync takes, and how each is carried out: `core::sync::shell`.
    shell: Shell,
    reservations: Option<ReservationTask>,
    /// Releasing the reservations at cutover (a task); a sync that ends waits for it.
    releasing: Option<tokio::task::JoinHandle<()>>,
    /// What sync says, on its way to the front end: the loop never waits on it.
    outbox: outbox::Outbox,
    /// What the API server had said when sync started: its 429s and warnings since go into
    /// the decision log's record of the run.
    heard_from: crate::io::k8s::Mark,
    /// Where it stands, for the ConfigMap beside the Lease.
    standings: publish::Standings,
}

/// The error sync ends with on a refusal the shell ended it on (exit 2).
fn ended_on(opts: &SyncOptions, refusal: Refusal) -> Error {
    match refusal {
        Refusal::Create(why) => fatal::refused("creating a CiliumIdentity", &why),
        Refusal::Lease(why) => lease_refused(opts, &why),
        Refusal::Read {
            fault,
            doing,
            error,
        } => fatal::read_refused(fault, &doing, &error),
    }
}

/// Why a round could not start.
enum Retry {
    /// Waiting will not fix it (no endpoints, an unreadable certificate, a refused write).
    Fatal(Error),
    /// A server failed: try again after a wait.
    After(String),
}

/// How a round ended, as the loop sees it.
enum Ended {
    Shell(RoundEnd),
    /// A watch task ended: said, then a fresh round after a wait.
    WatchLost(&'static str),
}

/// One round: from a read of both sides, following both watches, until a stop, cutover,
/// or a compaction. It holds the channels; what to do is the shell's.
struct Round {
    /// What a watch task met: the shell judges whether sync ends.
    failed_rx: mpsc::Receiver<Failed>,
    kv_rx: mpsc::Receiver<KvWatchEvent>,
    k8s_rx: mpsc::Receiver<K8sChange>,
    watches: [tokio::task::JoinHandle<()>; 2],
    answers: Answers,
    done_rx: mpsc::Receiver<(Vec<Op>, Result<ApplyReport>)>,
    /// A cutover check (a full consistent verify, 18 s at 65k on a real server) runs as a
    /// task and its verdict comes back here, so the loop keeps mirroring meanwhile.
    verdict_rx: mpsc::Receiver<std::result::Result<(), CutoverWait>>,
}

/// What ends a round from outside the shell.
enum Interrupt {
    /// A watch task ended.
    WatchLost(&'static str),
    /// The reservation writer's task is gone: sync ends.
    Fatal(Error),
}

impl Sync {
    /// Rounds until sync ends: each starts on a fresh read (retried after a wait when a
    /// server fails) and follows both sides until the shell ends it.
    async fn rounds(mut self) -> Result<SyncEnd> {
        let mut backoff = Backoff::new(Policy::FOLLOW);
        loop {
            self.metrics.turned();
            if self.stop.is_stopped() {
                return self.end(None).await;
            }
            // A stop while both sides are read (a full read can take tens of seconds) ends
            // sync at once, not after the read.
            let stop = self.stop.clone();
            let started = tokio::select! {
                r = self.start_round() => r,
                () = stopped(&stop) => return self.end(None).await,
            };
            let round = match started {
                Ok(r) => r,
                Err(Retry::Fatal(e)) => return self.end(Some(e)).await,
                Err(Retry::After(trouble)) => {
                    self.outbox.say(SyncEvent::Trouble(trouble));
                    backoff.wait().await;
                    continue;
                }
            };
            backoff.reset();
            let ended = match self.follow(round).await {
                Ok(ended) => ended,
                // A refusal ends sync: what it holds goes first (the Lease, for a standby).
                Err(e) => return self.end(Some(e)).await,
            };
            match ended {
                Ended::Shell(RoundEnd::Resnapshot) => {}
                Ended::WatchLost(what) => {
                    let trouble = format!("{what}; reading both sides again");
                    self.outbox.say(SyncEvent::Trouble(trouble));
                    backoff.wait().await;
                }
                Ended::Shell(RoundEnd::Done(end)) => {
                    self.end(None).await?;
                    return Ok(*end);
                }
                Ended::Shell(RoundEnd::Refused(refusal)) => {
                    let refused = ended_on(&self.opts, refusal);
                    return self.end(Some(refused)).await;
                }
            }
        }
    }

    /// Ends sync: the reservation writer finished (and released on a clean stop with
    /// `--release-reservations`, while holding the Lease), a release in flight waited for,
    /// the Lease given back; `error` returned if there is one.
    async fn end(mut self, error: Option<Error>) -> Result<SyncEnd> {
        // What the writer is still to be sent before it releases, if it releases (the
        // shell's word, as in the simulation).
        let release = match error {
            None => self.shell.release_at_stop(self.lease.holding()),
            Some(_) => None,
        };
        let ended = self.shell.end_now();
        if let Some(task) = self.reservations.take() {
            if let Some(requests) = release.as_ref().filter(|r| !r.is_empty()) {
                task.send(requests.clone());
            }
            let kept = task.finish(shell::FINISH_WAIT).await;
            if release.is_some() {
                io::release(kept, &self.events).await;
            }
        }
        if let Some(releasing) = self.releasing.take() {
            let _ = releasing.await;
        }
        self.lease.release().await;
        // The last of what sync said reaches a front end that is still reading.
        self.outbox.drain(Duration::from_secs(2)).await;
        flows::record_server(&self.cfg.target, self.heard_from, &self.cfg.log);
        match error {
            Some(e) => Err(e),
            None => Ok(ended),
        }
    }

    /// Reads both sides, Kubernetes first: an identity both GCs take between the two reads
    /// (the kvstore's first, as they go) is then missing from the kvstore's read as well,
    /// not made again at once. Starts the shell's round on them (the first reservations go
    /// before the watches start, so the ids are taken from the first moment on), and both
    /// watches from where each read was.
    async fn start_round(&mut self) -> std::result::Result<Round, Retry> {
        let (cfg, prefix) = (self.cfg.clone(), self.cfg.kv.prefix());
        let conn = cfg
            .kv
            .follower()
            .await
            .map_err(|e| self.judged(Path::KvRead, "connecting to the kvstore", &e))?;
        let listed = cfg
            .target
            .list_identities(ReadMode::Cache, None)
            .await
            .map_err(|e| self.judged(Path::K8sList, "listing ciliumidentities.cilium.io", &e))?;
        let snap = conn
            .read_snapshot(&prefix)
            .await
            .map_err(|e| self.judged(Path::KvRead, "reading the kvstore", &e))?;
        if self.shell.wants_writer() {
            self.start_writer(&conn, &prefix).await?;
        }
        let state = SyncState::from_snapshot(snap)
            .with_kubernetes(listed.identities, listed.resource_version);
        let (kv_revision, k8s_version) = (state.kv_revision(), state.k8s_version().to_string());
        let (done_tx, done_rx) = mpsc::channel(4);
        let (verdict_tx, verdict_rx) = mpsc::channel(1);
        let answers = Answers {
            done_tx,
            verdict_tx,
            conn: conn.clone(),
            prefix: prefix.clone(),
        };
        let gate = self.lease.gate.open();
        let mut said = Vec::new();
        self.with_io(&answers, &mut said, |shell, io| {
            shell.start_round(state, Instant::now(), gate, io)
        });
        self.say(said);
        let (kv_tx, kv_rx) = mpsc::channel::<KvWatchEvent>(256);
        let (k8s_tx, k8s_rx) = mpsc::channel::<K8sChange>(1024);
        let (failed_tx, failed_rx) = mpsc::channel(4);
        let kv_watch = tokio::spawn(watch::follow_kvstore(
            (conn, prefix),
            kv_revision,
            kv_tx,
            self.metrics.clone(),
            failed_tx.clone(),
        ));
        let k8s_watch = tokio::spawn(watch::follow_kubernetes(
            cfg.clone(),
            k8s_version,
            k8s_tx,
            self.metrics.clone(),
            failed_tx,
        ));
        Ok(Round {
            failed_rx,
            kv_rx,
            k8s_rx,
            watches: [kv_watch, k8s_watch],
            answers,
            done_rx,
            verdict_rx,
        })
    }

    /// A read at a round's start that failed (`e`, met on `path` doing `what`), as the
    /// shell judges it (`Shell::failed`, as the simulation's reads are judged).
    fn judged(&self, path: Path, what: &str, e: &Error) -> Retry {
        match self.shell.failed(fatal::failed(path, what, e, |t| t)) {
            AfterFailure::Retry { trouble } => Retry::After(trouble),
            AfterFailure::End(refusal) => Retry::Fatal(ended_on(&self.opts, refusal)),
        }
    }

    /// Starts the reservation writer: a write the credentials may not make is the
    /// operator's to fix (exit 2); a server that failed is tried again, as a failed read is.
    async fn start_writer(
        &mut self,
        conn: &KvFollower,
        prefix: &str,
    ) -> std::result::Result<(), Retry> {
        let mut started =
            match Reservations::start(conn, prefix, self.cfg.clone(), self.metrics.clone()).await {
                Ok(r) => r,
                Err(e) => {
                    let (path, what) = (Path::ReservationStart, "writing to the kvstore");
                    return Err(self.judged(path, what, &e));
                }
            };
        started.gate_writes(self.lease.gate.clone());
        // A release still running (at cutover) ends first: what it left is in the log.
        if let Some(releasing) = self.releasing.take() {
            let _ = releasing.await;
        }
        // Whole logs read: on a thread for blocking work, never on the loop's.
        let cfg = self.cfg.clone();
        let unreleased = tokio::task::spawn_blocking(move || unreleased_in_logs(&cfg))
            .await
            .map_err(|e| Retry::Fatal(crate::Error::file("the decision logs", e)))?
            .map_err(Retry::Fatal)?;
        let task = ReservationTask::spawn(started);
        self.reservations = Some(task);
        self.shell.writer_started(unreleased);
        Ok(())
    }

    /// Runs `f` on the shell with the binary's IO; what it says gathers in `said`.
    fn with_io<T>(
        &mut self,
        answers: &Answers,
        said: &mut Vec<SyncEvent>,
        f: impl FnOnce(&mut Shell, &mut AppIo<'_>) -> T,
    ) -> T {
        let mut io = AppIo {
            cfg: &self.cfg,
            metrics: &self.metrics,
            events: &self.events,
            stop: &self.stop,
            gate: &self.lease.gate,
            answers,
            reservations: &mut self.reservations,
            releasing: &mut self.releasing,
            standings: &self.standings,
            said: Vec::new(),
        };
        let out = f(&mut self.shell, &mut io);
        said.append(&mut io.said);
        out
    }

    /// Hands what the shell said to the front end, in order, without waiting on it.
    fn say(&mut self, said: Vec<SyncEvent>) {
        for ev in said {
            self.outbox.say(ev);
        }
    }

    /// Follows both sides until the round ends: each event goes to the shell.
    async fn follow(&mut self, mut round: Round) -> Result<Ended> {
        let mut settle = tokio::time::interval(shell::SETTLE_EVERY);
        let mut status_tick = tokio::time::interval(shell::STATUS_EVERY);
        let ended = loop {
            let turn = match self
                .next_turn(&mut round, &mut settle, &mut status_tick)
                .await
            {
                Ok(turn) => turn,
                Err(Interrupt::WatchLost(what)) => break Ended::WatchLost(what),
                Err(Interrupt::Fatal(e)) => {
                    abort_watches(&round, &self.metrics);
                    return Err(e);
                }
            };
            self.metrics.turned();
            if let Some(end) = self.take(turn, &round.answers).await {
                break Ended::Shell(end);
            }
        };
        let mut ended = ended;
        if let Ended::Shell(RoundEnd::Resnapshot) = &ended
            && let Some(refused) = self.drain_batch(&mut round).await
        {
            // The batch taken in before a fresh read was refused: sync ends instead.
            ended = Ended::Shell(refused);
        }
        if !matches!(ended, Ended::Shell(RoundEnd::Done(_))) {
            self.shell.end_round();
        }
        abort_watches(&round, &self.metrics);
        Ok(ended)
    }

    /// One turn handed to the shell, what it said sent; the round's end if it ends it.
    async fn take(&mut self, turn: Turn, answers: &Answers) -> Option<RoundEnd> {
        let gate = self.lease.gate.open();
        // The ticks carry what the loop knows now: a stop asked for, both watches up.
        let turn = match turn {
            Turn::Settle { .. } => Turn::Settle {
                stopped: self.stop.is_stopped(),
            },
            Turn::Status { .. } => Turn::Status {
                watching: self.metrics.healthy(),
            },
            other => other,
        };
        let mut said = Vec::new();
        let end = self.with_io(answers, &mut said, |shell, io| {
            shell.take(turn, Instant::now(), gate, io)
        });
        self.say(said);
        end
    }

    /// Before a fresh read: the batch in flight is taken in first, so the next round never
    /// writes beside it and its outcomes are part of what is carried.
    async fn drain_batch(&mut self, round: &mut Round) -> Option<RoundEnd> {
        if self.shell.awaits_batch()
            && let Some((ops, result)) = round.done_rx.recv().await
        {
            let outcome = batch_outcome(result);
            let end = self
                .take(
                    Turn::Input(Input::BatchDone { ops, outcome }),
                    &round.answers,
                )
                .await;
            return end.filter(|e| matches!(e, RoundEnd::Refused(_)));
        }
        None
    }

    /// The next thing to hand the shell, or what interrupts the round.
    async fn next_turn(
        &mut self,
        round: &mut Round,
        settle: &mut tokio::time::Interval,
        status_tick: &mut tokio::time::Interval,
    ) -> std::result::Result<Turn, Interrupt> {
        let turn = tokio::select! {
            ev = round.kv_rx.recv() => match ev {
                Some(ev) => Turn::Input(Input::Kv(ev)),
                // The watch task ended (it never does on its own): start over rather than
                // spin on a closed channel.
                None => return Err(Interrupt::WatchLost("the kvstore watch ended")),
            },
            ch = round.k8s_rx.recv() => match ch {
                Some(ch) => Turn::Input(Input::K8s(ch)),
                None => return Err(Interrupt::WatchLost("the Kubernetes watch ended")),
            },
            Some(f) = round.failed_rx.recv() => Turn::Failed(f),
            Ok(()) = self.writer.changed() => {
                let now = self.writer.borrow_and_update().clone();
                match now {
                    Writer::Refused(why) => Turn::LeaseRefused(why),
                    w => Turn::Input(Input::Lease(holder_of(w))),
                }
            }
            Some(d) = next_decision(&mut self.decided) => match d {
                DecisionChange::Decided(d) => Turn::Input(Input::Decided(d)),
                DecisionChange::Undone(id) => Turn::Input(Input::Undone(id)),
            },
            Some((ops, result)) = round.done_rx.recv() => {
                Turn::Input(Input::BatchDone { ops, outcome: batch_outcome(result) })
            }
            _ = settle.tick() => Turn::Settle { stopped: false },
            _ = status_tick.tick() => Turn::Status { watching: false },
            heard = reserve::next_reply(&mut self.reservations) => match heard {
                reserve::Heard::Reply(reply) => Turn::Reply(reply),
                reserve::Heard::Gone(why) => return Err(Interrupt::Fatal(Error::Config(why))),
            },
            Some(verdict) = round.verdict_rx.recv() => Turn::Input(Input::Verdict(verdict)),
        };
        Ok(turn)
    }
}

/// Ends both watch tasks; until a new round's watches connect, neither counts as up
/// (`/healthz` and `cilium_idmig_watch_up` say so).
fn abort_watches(round: &Round, metrics: &Metrics) {
    for w in &round.watches {
        w.abort();
    }
    metrics.etcd_live.store(false, Ordering::Relaxed);
    metrics.k8s_live.store(false, Ordering::Relaxed);
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

/// The next decision made (or undone) while sync runs; never, when nobody can make one.
async fn next_decision(
    decided: &mut Option<mpsc::Receiver<DecisionChange>>,
) -> Option<DecisionChange> {
    match decided {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
