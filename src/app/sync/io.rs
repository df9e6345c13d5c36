//! The IO beneath sync's shell (`core::sync::shell`) in the binary: the decision log on
//! disk, events to the front end, creates through the executor, cutover checks, split
//! reports and the reservation writer as tasks whose answers come back as messages. Nothing
//! here decides; each call starts or does one thing and returns at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::event::SyncEvent;
use crate::app::config::ServiceConfig;
use crate::app::flows;
use crate::app::metrics::Metrics;
use crate::app::reserve::{ReservationTask, Reservations};
use crate::apply::executor::{self, StopFlag, Watchers, WriteGate};
use crate::apply::outcome::ApplyReport;
use crate::core::planner::{Kind, Op};
use crate::core::sync::machine::SplitFound;
use crate::core::sync::machine::cutover::{cutover_verdict, logged_verdict};
use crate::core::sync::reserve::Request;
use crate::core::sync::shell::{self, Event, FINISH_WAIT, Line};
use crate::core::sync::split::{self, Named};
use crate::core::sync::{CutoverWait, SyncStatus, Taken};
use crate::error::Result;
use crate::io::decision_log::Record;
use crate::io::kv_source::KvFollower;

/// A round's channels back to the loop: batches ended, cutover verdicts.
pub struct Answers {
    pub done_tx: mpsc::Sender<(Vec<Op>, Result<ApplyReport>)>,
    pub verdict_tx: mpsc::Sender<std::result::Result<(), CutoverWait>>,
    /// The kvstore connection of the round, which names a split's nodes.
    pub conn: KvFollower,
    pub prefix: String,
}

/// The shell's IO for one call. What is said gathers in `said` and is sent once the shell
/// returns: sending waits for the front end, the shell never waits.
pub struct AppIo<'a> {
    pub cfg: &'a Arc<ServiceConfig>,
    pub metrics: &'a Arc<Metrics>,
    pub events: &'a mpsc::Sender<SyncEvent>,
    pub stop: &'a StopFlag,
    pub gate: &'a WriteGate,
    pub answers: &'a Answers,
    pub reservations: &'a mut Option<ReservationTask>,
    pub releasing: &'a mut Option<tokio::task::JoinHandle<()>>,
    pub standings: &'a super::publish::Standings,
    pub said: Vec<SyncEvent>,
}

impl shell::Io for AppIo<'_> {
    fn log(&mut self, lines: Vec<Line>) -> usize {
        let append = || {
            let mut written = 0;
            for line in lines {
                if self.cfg.log.append(line.record()).is_err() {
                    break;
                }
                written += 1;
            }
            written
        };
        // The shell acts only on what the log took, so the appends are made here and now;
        // a slow disk then holds this worker only, while the watches, the writes and the
        // Lease go on on the others.
        crate::io::blocking::off_the_loop(append)
    }

    fn say(&mut self, event: Event) {
        let ev = match event {
            Event::Following => SyncEvent::Following,
            Event::Note(n) => SyncEvent::Note(n),
            Event::Trouble(t) => SyncEvent::Trouble(t),
            Event::Conflict { id, kind, reason } => SyncEvent::Conflict { id, kind, reason },
            Event::Invalid {
                id,
                reason,
                at_read,
            } => SyncEvent::Invalid {
                id,
                reason,
                at_read,
            },
            Event::Moot { id, labels } => SyncEvent::Moot { id, labels },
            Event::Status(mut status) => {
                status.throttled = self.cfg.target.notes().throttled();
                return_freed_memory();
                self.metrics
                    .cutover_waiting(status.cutover_wait.as_ref().map(|w| w.reason()));
                SyncEvent::Status(status)
            }
            Event::NodeCounts(counts) => SyncEvent::NodeCounts(counts),
            Event::Cutover(report) => SyncEvent::Cutover(report),
            Event::Taken(taken) => return record_taken(&taken, self.metrics),
        };
        self.said.push(ev);
    }

    fn write(&mut self, ops: Vec<Op>) {
        let (cfg, done_tx) = (self.cfg.clone(), self.answers.done_tx.clone());
        let (stop, gate) = (self.stop.clone(), self.gate.clone());
        tokio::spawn(async move {
            let result = write(&cfg, ops.clone(), stop, gate).await;
            let _ = done_tx.send((ops, result)).await;
        });
    }

    fn verify(&mut self, reused: BTreeMap<String, u32>, nowhere: BTreeSet<String>) {
        let (cfg, tx) = (self.cfg.clone(), self.answers.verdict_tx.clone());
        tokio::spawn(async move {
            let _ = tx
                .send(cutover_verified(&cfg, &reused, &nowhere).await)
                .await;
        });
    }

    fn report_splits(&mut self, found: Vec<SplitFound>) {
        let a = self.answers;
        report_splits(found, &a.conn, &a.prefix, self.events, self.cfg);
    }

    fn reserve(&mut self, requests: Vec<Request>) {
        if let Some(task) = self.reservations.as_ref() {
            task.send(requests);
        }
    }

    fn release(&mut self) {
        // Released in a task; a sync that ends (`--until-cutover`) waits for it.
        if let Some(task) = self.reservations.take() {
            let events = self.events.clone();
            *self.releasing = Some(tokio::spawn(async move {
                let kept = task.finish(FINISH_WAIT).await;
                release(kept, &events).await;
            }));
        }
    }

    fn stands(&mut self, status: &SyncStatus) {
        self.standings.status(status);
        let m = self.metrics;
        m.kvstore_nodes.set(status.kvstore_nodes as i64);
        m.pending.set(status.pending as i64);
        m.splits.set(status.splits as i64);
        m.doubles.set(status.doubles as i64);
        // The splits found since the last publication.
        let new_splits = status.splits_found.saturating_sub(m.splits_found.get());
        m.splits_found.inc_by(new_splits);
    }
}

/// A line of the shell's as the decision log records it.
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

/// What a batch changed, in the metrics.
fn record_taken(taken: &Taken, metrics: &Metrics) {
    metrics.mirrored.inc_by(taken.mirrored);
    metrics.write_failures.inc_by(taken.failures);
    for lag in &taken.lags {
        metrics.lag.observe(lag.as_secs_f64());
    }
}

/// Returns once `stop` is set.
pub async fn stopped(stop: &StopFlag) {
    while !stop.is_stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    gate: WriteGate,
) -> Result<ApplyReport> {
    crate::io::blocking::off_the_loop(|| executor::log_decisions(&cfg.log, &ops))?;
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

/// Releases the reservations, reporting how many master keys went; `None` when the task did
/// not hand them back in time.
pub async fn release(kept: Option<Reservations>, events: &mpsc::Sender<SyncEvent>) {
    let Some(r) = kept else {
        let _ = events
            .send(SyncEvent::Trouble(
                "releasing the kvstore reservations: the kvstore did not answer; they lapse with the lease".into(),
            ))
            .await;
        return;
    };
    let held = r.masters_written();
    let ev = match r.release().await {
        Ok(deleted) => SyncEvent::Note(format!(
            "released the kvstore reservations: lease revoked, {deleted} of {held} master keys deleted (the rest is in use or changed)"
        )),
        Err(e) => SyncEvent::Trouble(format!(
            "releasing the kvstore reservations: {e}; they lapse with the lease"
        )),
    };
    let _ = events.send(ev).await;
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
    // A whole-log read (130,000 lines at 65,280 identities): on a thread for blocking work,
    // never on one that runs sync's loop.
    let logged = tokio::task::spawn_blocking(move || flows::expectations_from_logs(&logs))
        .await
        .map_err(|e| failed(format!("the decision logs cannot be read: {e}")))?
        .map_err(|e| failed(format!("the decision logs cannot be read: {e}")))?;
    let (masters, identities) = flows::read_for_verify(&cfg.kv, &cfg.target)
        .await
        .map_err(|e| failed(format!("verify could not run: {e}")))?;
    let sides = (masters.as_slice(), &identities);
    let verdict = cutover_verdict(logged, (reused, nowhere), sides, cfg.scope.range);
    // A few lines at most (the plan's reuses no log holds): on a thread for blocking work.
    let log = cfg.log.clone();
    tokio::task::spawn_blocking(move || logged_verdict(verdict, |line| log.append(line)))
        .await
        .map_err(|e| failed(format!("recording the verdict stopped: {e}")))?
}

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
            let named = loop {
                let nodes = conn
                    .nodes_using(&prefix, &f.kv_value, f.id.to_string().as_bytes())
                    .await
                    .unwrap_or_default();
                match split::named(&f, nodes, Instant::now()) {
                    Named::Report(split) => break Some(split),
                    Named::Wait => tokio::time::sleep(Duration::from_millis(250)).await,
                    Named::NotLabels => break None,
                }
            };
            let Some(split) = named else {
                continue;
            };
            let mut record = Record::decision(
                &f.id.to_string(),
                &split.kvstore_labels,
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
