//! The executor: carries out reconciled operations against the API server with bounded
//! concurrency, a client rate limit, per-operation timeouts and retries, and reports every
//! step as an owned event. It knows nothing about terminals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::outcome::{ApplyEvent, ApplyReport, OpResult, Outcome, Progress};
use super::ratelimit::RateLimiter;
use crate::core::labels::{canonical_key, parse_label_key, to_security_labels};
use crate::core::lease::write_held_back;
use crate::core::planner::{Op, OpKind};
use crate::error::Result;
use crate::io::decision_log::{DecisionLog, Record};
use crate::io::k8s::{K8sTarget, ObjectRef, RequestError};

/// Knobs of an apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    pub concurrency: usize,
    pub op_timeout: Duration,
    pub max_attempts: u32,
    pub qps: f64,
    pub burst: u32,
    pub crd_timeout: Duration,
    /// Longest wait between two attempts; a server's `Retry-After` is honoured up to this.
    pub max_backoff: Duration,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            concurrency: 32,
            op_timeout: Duration::from_secs(30),
            max_attempts: 8,
            qps: 0.0,
            burst: 0,
            crd_timeout: Duration::from_secs(60),
            max_backoff: Duration::from_secs(30),
        }
    }
}

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

struct Ctx<'a> {
    target: &'a K8sTarget,
    opts: &'a ApplyOptions,
    limiter: RateLimiter,
    events: Option<&'a mpsc::Sender<ApplyEvent>>,
    progress: Option<&'a watch::Sender<Progress>>,
    stop: StopFlag,
    retries: AtomicU64,
    /// Where this apply starts in what the server said: its 429s are counted from here.
    heard_from: crate::io::k8s::Mark,
    stop_reason: std::sync::Mutex<Option<String>>,
}

impl Ctx<'_> {
    /// The server's 429s since this apply started, on any of its requests (a write, the
    /// re-read after a 409), each waited out.
    fn throttled(&self) -> u64 {
        self.target.notes().since(self.heard_from).throttled
    }

    fn update(&self, f: impl FnOnce(&mut Progress)) {
        if let Some(p) = self.progress {
            p.send_modify(f);
        }
    }

    async fn emit(&self, e: ApplyEvent) {
        if let Some(tx) = self.events {
            // A watcher that went away must not stop the apply.
            let _ = tx.send(e).await;
        }
    }

    async fn halt(&self, reason: String) {
        self.stop.stop();
        let first = {
            let mut r = self.stop_reason.lock().unwrap_or_else(|p| p.into_inner());
            if r.is_none() {
                *r = Some(reason.clone());
                true
            } else {
                false
            }
        };
        if first {
            self.emit(ApplyEvent::Stopping { reason }).await;
        }
    }
}

/// Applies the operations. Only `OpKind::Create` and (in a rollback) `OpKind::Delete` reach
/// the API server; everything else is recorded. Every decision and outcome goes to the
/// decision log as it happens.
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
    let ctx = Ctx {
        target,
        opts,
        limiter: RateLimiter::new(opts.qps, opts.burst),
        events: watchers.events,
        progress: watchers.progress,
        stop,
        retries: AtomicU64::new(0),
        heard_from: target.notes().mark(),
        stop_reason: std::sync::Mutex::new(None),
    };
    let mut report = ApplyReport::default();
    let writes = ops.iter().filter(|o| o.op.writes()).count();
    let creates = ops.iter().filter(|o| o.op == OpKind::Create).count();
    if create_crd && creates > 0 {
        ctx.emit(ApplyEvent::CrdCreating).await;
        target.create_crd().await?;
        target.wait_crd_established(opts.crd_timeout).await?;
        report.crd_created = true;
        ctx.emit(ApplyEvent::CrdEstablished).await;
    }
    let total = ops.len();
    ctx.update(|p| {
        *p = Progress {
            total,
            writes,
            ..Progress::default()
        }
    });
    let deletes = writes - creates;
    ctx.emit(ApplyEvent::Started {
        writes,
        deletes,
        total,
    })
    .await;

    let ctx_ref = &ctx;
    let mut stream = futures::stream::iter(ops)
        .map(|op| async move {
            let result = run_op(ctx_ref, &op).await;
            if let Some(log) = log {
                log_outcome(log, &op, &result)?;
            }
            ctx_ref.update(|p| {
                p.done += 1;
                p.throttled = ctx_ref.throttled();
                match result.outcome {
                    Outcome::Created | Outcome::AlreadyExisted => p.created += 1,
                    Outcome::Deleted | Outcome::AlreadyGone => p.deleted += 1,
                    o if o.is_problem() => p.failed += 1,
                    _ => {}
                }
            });
            if result.outcome.is_problem() {
                ctx_ref.emit(ApplyEvent::Problem(result.clone())).await;
            }
            Ok::<_, crate::Error>(result)
        })
        .buffer_unordered(opts.concurrency.max(1));
    let mut first_err = None;
    while let Some(r) = stream.next().await {
        match r {
            Ok(res) => report.results.push(res),
            Err(e) => {
                // The log could not be written: stop writing to the cluster too.
                ctx.halt(format!("decision log: {e}")).await;
                first_err.get_or_insert(e);
            }
        }
    }
    drop(stream);
    if let Some(e) = first_err {
        return Err(e);
    }
    ctx.close(&mut report, started);
    Ok(report)
}

impl Ctx<'_> {
    /// What the run as a whole comes to: its retries, the server's push-back, why it
    /// stopped early (if it did) and how long it took.
    fn close(&self, report: &mut ApplyReport, started: Instant) {
        report.retries = self.retries.load(Ordering::SeqCst);
        report.throttled = self.throttled();
        report.stopped = self
            .stop_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if report.stopped.is_none() {
            report.stopped = self.stop.held_back().map(str::to_string);
        }
        report.elapsed_ms = started.elapsed().as_millis();
        tracing::info!(
            items = report.results.len(),
            retries = report.retries,
            elapsed_ms = report.elapsed_ms as u64,
            "apply finished"
        );
    }
}

fn decision_name(op: &Op) -> &'static str {
    match op.op {
        OpKind::Create => "create",
        OpKind::AlreadyDone => "none",
        OpKind::Map => "map",
        OpKind::Skip => "skip",
        OpKind::Delete => "delete",
        OpKind::Keep => "keep",
    }
}

/// The log line for an operation: its decision, and its outcome once there is one.
pub fn record(op: &Op, result: Option<&OpResult>) -> Record {
    let decided = (decision_name(op), op.decided_by.as_str());
    let mut r = Record::decision(&op.id, &op.label_key, op.kind, decided, op.target_id);
    if let Some(res) = result {
        r.outcome = Some(res.outcome);
        r.error = res.problem();
        r.uid = res.uid.clone();
        r.resource_version = res.resource_version.clone();
    }
    r
}

fn log_decision(log: &DecisionLog, op: &Op) -> Result<()> {
    log.append(record(op, None))
}

fn log_outcome(log: &DecisionLog, op: &Op, r: &OpResult) -> Result<()> {
    log.append(record(op, Some(r)))
}

async fn run_op(ctx: &Ctx<'_>, op: &Op) -> OpResult {
    let mut result = OpResult::new(&op.id, op.target_id, Outcome::NotAttempted);
    match (op.op, op.target_id) {
        (OpKind::Skip, _) => result.outcome = Outcome::Skipped,
        (OpKind::Map, _) => result.outcome = Outcome::Mapped,
        (OpKind::AlreadyDone, _) => result.outcome = Outcome::AlreadyMigrated,
        (OpKind::Create, None) => fail(&mut result, "create without a target id".into()),
        (OpKind::Create, Some(_)) if ctx.stop.is_stopped() => {}
        (OpKind::Create, Some(t)) => create_with_retries(ctx, op, t, &mut result).await,
        (OpKind::Keep, _) => {
            result.outcome = Outcome::Kept;
            result.error = op.reason.clone();
        }
        (OpKind::Delete, Some(_)) if ctx.stop.is_stopped() => {}
        (OpKind::Delete, Some(t)) => match &op.expect {
            Some((uid, rv)) => {
                let expected = ObjectRef {
                    uid: uid.clone(),
                    resource_version: rv.clone(),
                    ..Default::default()
                };
                delete_with_retries(ctx, op, t, &expected, &mut result).await
            }
            None => fail(&mut result, "delete without a uid to check".into()),
        },
        (OpKind::Delete, None) => fail(&mut result, "delete without a target id".into()),
    }
    result
}

/// A rollback's delete: only the object this tool created, as it was last read. A 404 is
/// already gone; a 409 (uid or resourceVersion changed) is someone else's object now, kept.
async fn delete_with_retries(
    ctx: &Ctx<'_>,
    op: &Op,
    target_id: u32,
    expected: &ObjectRef,
    result: &mut OpResult,
) {
    let mut throttled = 0;
    loop {
        if throttled > 0 && ctx.stop.is_stopped() {
            result.outcome = Outcome::NotAttempted;
            return;
        }
        result.attempts += 1;
        match attempt(ctx, ctx.target.delete_identity(target_id, expected)).await {
            Err(e) if e.is_throttled() => {
                result.attempts -= 1;
                throttled += 1;
                wait_out_throttling(ctx, op, throttled, &e).await;
            }
            Ok(()) => {
                result.outcome = Outcome::Deleted;
                return;
            }
            Err(e) if e.is_not_found() => {
                result.outcome = Outcome::AlreadyGone;
                return;
            }
            Err(e) if e.is_conflict() || e.is_already_exists() => {
                result.outcome = Outcome::Kept;
                result.error = Some(format!(
                    "changed since it was read, so it is not the object this tool created as it was: {e}"
                ));
                return;
            }
            Err(e) if e.is_retryable() && result.attempts < ctx.opts.max_attempts => {
                wait_before_retry(ctx, op, result.attempts, &e).await;
            }
            Err(e) => {
                let attempts = result.attempts;
                result.refused = matches!(e.code(), Some(401 | 403));
                return fail(result, format!("{e} after {attempts} attempt(s)"));
            }
        }
    }
}

fn fail(result: &mut OpResult, error: String) {
    result.outcome = Outcome::Failed;
    result.error = Some(error);
}

async fn attempt<T>(
    ctx: &Ctx<'_>,
    fut: impl Future<Output = Result<T, RequestError>>,
) -> Result<T, RequestError> {
    ctx.limiter.acquire().await;
    let r = tokio::time::timeout(ctx.opts.op_timeout, fut)
        .await
        .unwrap_or(Err(RequestError::Timeout));
    if let Err(e) = &r {
        // A stalled request: the next one opens a fresh connection.
        ctx.target.after_error(e);
    }
    r
}

async fn create_with_retries(ctx: &Ctx<'_>, op: &Op, target_id: u32, result: &mut OpResult) {
    // The map is built per create, not held for every identity of the plan.
    let labels = match parse_label_key(&op.label_key) {
        Ok(l) => to_security_labels(&l),
        Err(e) => return fail(result, format!("labels do not parse: {e}")),
    };
    let mut throttled = 0;
    loop {
        // Checked again before each retry: a gate that closed meanwhile (a lease no longer
        // valid) stops the write before it is sent again.
        if (result.attempts > 0 || throttled > 0) && ctx.stop.is_stopped() {
            result.outcome = Outcome::NotAttempted;
            return;
        }
        result.attempts += 1;
        match attempt(ctx, ctx.target.create_identity(target_id, &labels)).await {
            Err(e) if e.is_throttled() => {
                result.attempts -= 1;
                throttled += 1;
                wait_out_throttling(ctx, op, throttled, &e).await;
            }
            Ok(created) => {
                result.outcome = Outcome::Created;
                result.uid = Some(created.uid).filter(|u| !u.is_empty());
                result.resource_version = Some(created.resource_version).filter(|v| !v.is_empty());
                return;
            }
            Err(e) if e.is_already_exists() => {
                return check_existing(ctx, op, target_id, result).await;
            }
            Err(e)
                if (e.is_retryable() || ctx.target.sent_with_old_token(&e))
                    && result.attempts < ctx.opts.max_attempts =>
            {
                wait_before_retry(ctx, op, result.attempts, &e).await;
            }
            Err(e) => {
                if e.is_retryable() {
                    ctx.halt(format!(
                        "the API server {} kept failing ({e}); stopped starting new writes",
                        ctx.target.server
                    ))
                    .await;
                }
                let attempts = result.attempts;
                return fail(result, format!("{e} after {attempts} attempt(s)"));
            }
        }
    }
}

/// A 409 on create: read what is there. Identical labels count as migrated; anything else is
/// a conflict to report, never to overwrite. The object this very run created, whose answer
/// was lost (the create was applied, the response dropped, the retry found it), is
/// `created`, with its uid, so rollback deletes it like any other this run created.
async fn check_existing(ctx: &Ctx<'_>, op: &Op, target_id: u32, result: &mut OpResult) {
    loop {
        result.attempts += 1;
        match attempt(ctx, ctx.target.get_identity_object(target_id)).await {
            Ok(Some((meta, existing))) if canonical_key(&existing) == op.label_key => {
                if meta.created_by_run() == Some(crate::io::decision_log::run_id()) {
                    result.outcome = Outcome::Created;
                    result.uid = Some(meta.uid).filter(|u| !u.is_empty());
                    result.resource_version = Some(meta.resource_version).filter(|v| !v.is_empty());
                } else {
                    result.outcome = Outcome::AlreadyExisted;
                }
                return;
            }
            Ok(Some((_, existing))) => {
                result.outcome = Outcome::Conflict;
                result.existing = Some(canonical_key(&existing));
                return;
            }
            Ok(None) => {
                return fail(
                    result,
                    format!(
                        "create of {target_id} said it exists, but a read finds nothing; rerun to retry"
                    ),
                );
            }
            Err(e) if e.is_retryable() && result.attempts < ctx.opts.max_attempts => {
                wait_before_retry(ctx, op, result.attempts, &e).await;
            }
            Err(e) => return fail(result, format!("reading existing {target_id}: {e}")),
        }
    }
}

/// A 429 is the API server pushing back (API Priority and Fairness), not the identity
/// failing: waited out as the server asks (its Retry-After, else a doubling wait), for as
/// long as the push-back lasts, never counted as an attempt; counted apart for the progress
/// line, the summary and the log. A stop ends the wait within a tenth of a second.
async fn wait_out_throttling(ctx: &Ctx<'_>, op: &Op, times: u32, e: &RequestError) {
    ctx.update(|p| p.throttled = ctx.throttled());
    // Without a hint, waits double to a second: API Priority and Fairness itself asks for
    // one second, and a longer silence only idles a queue the server has freed.
    let policy = crate::io::retry::Policy {
        first: Duration::from_millis(100),
        cap: Duration::from_secs(1).min(ctx.opts.max_backoff),
    };
    let wait = match e.retry_after() {
        Some(asked) => asked.min(ctx.opts.max_backoff),
        None => policy.wait(times, None, &op.id),
    };
    tracing::debug!(id = %op.id, times, ?wait, "throttled by the API server");
    let until = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < until && !ctx.stop.is_stopped() {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
}

async fn wait_before_retry(ctx: &Ctx<'_>, op: &Op, attempt_no: u32, e: &RequestError) {
    ctx.retries.fetch_add(1, Ordering::SeqCst);
    ctx.update(|p| p.retries += 1);
    let policy = crate::io::retry::Policy {
        first: Duration::from_millis(100),
        cap: ctx.opts.max_backoff,
    };
    let wait = policy.wait(attempt_no, e.retry_after(), &op.id);
    tracing::debug!(id = %op.id, attempt = attempt_no, error = %e, ?wait, "retrying");
    ctx.emit(ApplyEvent::Retrying {
        id: op.id.clone(),
        attempt: attempt_no,
        error: e.to_string(),
        wait,
    })
    .await;
    tokio::time::sleep(wait).await;
}

/// Logs the decision behind every write before any write starts, so the log shows what was
/// decided even if the process dies before the outcome. Operations that write nothing get a
/// single line with their decision and outcome together, from `apply`.
pub fn log_decisions(log: &DecisionLog, ops: &[Op]) -> Result<()> {
    ops.iter()
        .filter(|op| op.op.writes())
        .try_for_each(|op| log_decision(log, op))
}
