//! The executor over HTTP: core's rules (`core::executor`) carried out against the API
//! server, each request through a client rate limit with its deadline; the write gate and
//! the stop switch; the decision log's lines of an operation. It knows nothing about
//! terminals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::outcome::{ApplyEvent, ApplyReport, Progress};
use super::ratelimit::RateLimiter;
pub use crate::core::executor::ApplyOptions;
pub use crate::core::executor::record;
use crate::core::executor::{self, Existing, IdentityWrites, Written};
use crate::core::labels::SecurityLabels;
use crate::core::lease::write_held_back;
use crate::core::planner::{Op, OpKind};
use crate::error::Result;
use crate::io::decision_log::{DecisionLog, Record};
use crate::io::k8s::{K8sTarget, ObjectRef, RequestError};

/// Who watches an apply: discrete events on a bounded channel, running totals on a watch.
#[derive(Clone, Copy, Default)]
pub struct Watchers<'a> {
    pub events: Option<&'a mpsc::Sender<ApplyEvent>>,
    pub progress: Option<&'a watch::Sender<Progress>>,
}

/// Until when writes may start, on the monotonic clock (`None`: not now). Whoever grants
/// the right to write (sync's lease) moves it; the executor reads it before every request.
#[derive(Clone, Default)]
pub struct WriteGate(Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl WriteGate {
    /// Whether a write may start now.
    pub fn open(&self) -> bool {
        self.until().is_some_and(|t| std::time::Instant::now() < t)
    }

    pub fn until(&self) -> Option<std::time::Instant> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set(&self, until: Option<std::time::Instant>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = until;
    }
}

/// Shared stop switch: set it and no new write starts; writes in flight finish. With a gate,
/// it also reads as stopped whenever the gate is closed, checked before every request.
#[derive(Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>, Option<WriteGate>);

impl StopFlag {
    /// A stop switch that also stops while `gate` is closed.
    pub fn gated(gate: WriteGate) -> Self {
        StopFlag(Arc::default(), Some(gate))
    }
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_stopped(&self) -> bool {
        self.held_back().is_some()
    }

    /// Why no new write may start now, if none may (core's rule and words).
    pub fn held_back(&self) -> Option<&'static str> {
        let gate_open = self.1.as_ref().map(WriteGate::open);
        write_held_back(self.0.load(Ordering::SeqCst), gate_open)
    }
}

/// The executor's IO in the binary: each request through the client rate limit, with its
/// deadline, against the API server; the waits slept; the log on disk; the watchers'
/// channels. The rules of what to do with each answer are core's (`core::executor`).
struct Http<'a> {
    target: &'a K8sTarget,
    op_timeout: Duration,
    limiter: RateLimiter,
    events: Option<&'a mpsc::Sender<ApplyEvent>>,
    progress: Option<&'a watch::Sender<Progress>>,
    stop: StopFlag,
    log: Option<&'a DecisionLog>,
    /// Where this apply starts in what the server said: its 429s are counted from here.
    heard_from: crate::io::k8s::Mark,
}

impl Http<'_> {
    async fn attempt<T>(
        &self,
        fut: impl Future<Output = std::result::Result<T, RequestError>>,
    ) -> std::result::Result<T, RequestError> {
        self.limiter.acquire().await;
        let r = tokio::time::timeout(self.op_timeout, fut)
            .await
            .unwrap_or(Err(RequestError::Timeout));
        if let Err(e) = &r {
            // A stalled request: the next one opens a fresh connection.
            self.target.after_error(e);
        }
        r
    }
}

fn written(o: ObjectRef) -> Written {
    Written {
        uid: o.uid,
        resource_version: o.resource_version,
    }
}

impl IdentityWrites for Http<'_> {
    async fn create(
        &self,
        id: u32,
        labels: &SecurityLabels,
    ) -> std::result::Result<Written, RequestError> {
        self.attempt(self.target.create_identity(id, labels))
            .await
            .map(written)
    }

    async fn read(&self, id: u32) -> std::result::Result<Option<Existing>, RequestError> {
        let found = self.attempt(self.target.get_identity_object(id)).await?;
        Ok(found.map(|(meta, labels)| Existing {
            this_run: meta.created_by_run() == Some(crate::io::decision_log::run_id()),
            written: written(meta),
            labels,
        }))
    }

    async fn delete(&self, id: u32, expected: &Written) -> std::result::Result<(), RequestError> {
        let expected = ObjectRef {
            uid: expected.uid.clone(),
            resource_version: expected.resource_version.clone(),
            ..Default::default()
        };
        self.attempt(self.target.delete_identity(id, &expected))
            .await
    }

    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    fn held_back(&self) -> Option<&'static str> {
        self.stop.held_back()
    }

    fn stop(&self) {
        self.stop.stop();
    }

    fn throttled(&self) -> u64 {
        self.target.notes().since(self.heard_from).throttled
    }

    fn sent_with_old_token(&self, e: &RequestError) -> bool {
        self.target.sent_with_old_token(e)
    }

    type LogError = crate::Error;

    fn log(&self, line: Record) -> Result<()> {
        match self.log {
            // A slow disk holds this worker only, never the loop that carries the batch.
            Some(log) => crate::io::blocking::off_the_loop(|| log.append(line)),
            None => Ok(()),
        }
    }

    async fn emit(&self, e: ApplyEvent) {
        if let Some(tx) = self.events {
            // A watcher that went away must not stop the apply.
            let _ = tx.send(e).await;
        }
    }

    fn progress(&self, change: impl FnOnce(&mut Progress)) {
        if let Some(p) = self.progress {
            p.send_modify(change);
        }
    }

    fn server(&self) -> String {
        self.target.server.to_string()
    }
}

/// Applies the operations: the CRD first when asked and needed, then core's executor
/// (`core::executor::carry_out`) over the API server. Only `OpKind::Create` and (in a
/// rollback) `OpKind::Delete` reach the API server; everything else is recorded. Every
/// decision and outcome goes to the decision log as it happens.
pub async fn apply(
    target: &K8sTarget,
    ops: Vec<Op>,
    create_crd: bool,
    opts: &ApplyOptions,
    log: Option<&DecisionLog>,
    watchers: Watchers<'_>,
    stop: StopFlag,
) -> Result<ApplyReport> {
    let started = Instant::now();
    let http = Http {
        target,
        op_timeout: opts.op_timeout,
        limiter: RateLimiter::new(opts.qps, opts.burst),
        events: watchers.events,
        progress: watchers.progress,
        stop,
        log,
        heard_from: target.notes().mark(),
    };
    let creates = ops.iter().any(|o| o.op == OpKind::Create);
    let crd_created = create_crd && creates;
    if crd_created {
        http.emit(ApplyEvent::CrdCreating).await;
        target.create_crd().await?;
        target.wait_crd_established(opts.crd_timeout).await?;
        http.emit(ApplyEvent::CrdEstablished).await;
    }
    let mut report = executor::carry_out(&http, ops, opts).await?;
    report.crd_created = crd_created;
    report.elapsed_ms = started.elapsed().as_millis();
    tracing::info!(
        items = report.results.len(),
        retries = report.retries,
        elapsed_ms = report.elapsed_ms as u64,
        "apply finished"
    );
    Ok(report)
}

fn log_decision(log: &DecisionLog, op: &Op) -> Result<()> {
    log.append(record(op, None))
}

/// Logs the decision behind every write before any write starts, so the log shows what was
/// decided even if the process dies before the outcome. Operations that write nothing get a
/// single line with their decision and outcome together, from `apply`.
pub fn log_decisions(log: &DecisionLog, ops: &[Op]) -> Result<()> {
    ops.iter()
        .filter(|op| op.op.writes())
        .try_for_each(|op| log_decision(log, op))
}
