//! The executor's rules, written once: how a batch of creates and deletes is carried out
//! (bounded concurrency, retries, the 409 re-read that recognises this run's own object,
//! 429s waited out, halts, refusals and an admission check's denial of one object), over
//! `IdentityWrites`, the few Kubernetes requests, waits, log lines and watchers it needs.
//! The binary runs it over HTTP (`apply::executor`), the simulation over its world, unchanged.

pub mod outcome;
#[cfg(test)]
mod tests;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;

use self::outcome::{ApplyEvent, ApplyReport, OpResult, Outcome, Progress};
use crate::core::decision_log::Record;
use crate::core::labels::{SecurityLabels, canonical_key, parse_label_key, to_security_labels};
use crate::core::planner::{Op, OpKind};
use crate::core::request::RequestError;
use crate::core::retry::Policy;

/// Knobs of an apply. `concurrency`, `max_attempts` and `max_backoff` are the rules';
/// the rest is how the binary's requests are sent (its rate limit and deadlines).
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

/// An object as the server stored it: what a rollback deletes it by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    pub uid: String,
    pub resource_version: String,
}

/// An object read back after a create was answered 409.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    pub written: Written,
    pub labels: SecurityLabels,
    /// Created by this very run (its run annotation): a create whose answer was lost.
    pub this_run: bool,
}

/// What the executor asks of the world: Kubernetes' writes and reads, a wait, the write
/// gate, the decision log and whoever watches. Every call takes `&self`: the batch's
/// writes run side by side.
///
/// Its futures are not required to be `Send`: the binary's one implementation is, at its
/// concrete type, and the simulation's never leaves the thread.
#[allow(async_fn_in_trait)]
pub trait IdentityWrites {
    /// Creates `id` with `labels`, marked as this run's; never replaces an object.
    async fn create(&self, id: u32, labels: &SecurityLabels) -> Result<Written, RequestError>;
    /// Reads `id` (`None`: nothing there).
    async fn read(&self, id: u32) -> Result<Option<Existing>, RequestError>;
    /// Deletes `id` only while it is still `expected` (its uid and resourceVersion).
    async fn delete(&self, id: u32, expected: &Written) -> Result<(), RequestError>;
    /// Waits `d` (the binary sleeps; the simulation's clock does not move in a batch).
    async fn sleep(&self, d: Duration);
    /// Why no new write may start now, if none may (a stop, or the write gate shut).
    fn held_back(&self) -> Option<&'static str>;
    /// From now on no new write starts (the batch halts).
    fn stop(&self);
    /// The server's 429s since this batch began, on any of its requests.
    fn throttled(&self) -> u64;
    /// `e` answered a request sent with a credential renewed since: worth another try.
    fn sent_with_old_token(&self, _e: &RequestError) -> bool {
        false
    }
    /// Why the decision log refused a line.
    type LogError: std::fmt::Display;
    /// Appends a line (an operation's outcome, `record`) to the decision log.
    fn log(&self, line: Record) -> Result<(), Self::LogError>;
    /// Tells the watchers an event of their own.
    async fn emit(&self, _event: ApplyEvent) {}
    /// Changes the running totals the watchers see.
    fn progress(&self, _change: impl FnOnce(&mut Progress)) {}
    /// The server, as its words name it.
    fn server(&self) -> String;
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

struct Ctx<'a, W> {
    io: &'a W,
    opts: &'a ApplyOptions,
    retries: AtomicU64,
    stop_reason: Mutex<Option<String>>,
}

impl<W: IdentityWrites> Ctx<'_, W> {
    fn stopped(&self) -> bool {
        self.io.held_back().is_some()
    }

    async fn halt(&self, reason: String) {
        self.io.stop();
        let first = {
            let mut r = self.stop_reason.lock().unwrap_or_else(|p| p.into_inner());
            r.is_none().then(|| *r = Some(reason.clone())).is_some()
        };
        if first {
            self.io.emit(ApplyEvent::Stopping { reason }).await;
        }
    }
}

/// Carries out the operations. Only `OpKind::Create` and (in a rollback) `OpKind::Delete`
/// reach the server; everything else is recorded. Every outcome goes to the log as it
/// happens; a line the log refuses halts the batch and is the error returned.
pub async fn carry_out<W: IdentityWrites>(
    io: &W,
    ops: Vec<Op>,
    opts: &ApplyOptions,
) -> Result<ApplyReport, W::LogError> {
    let ctx = Ctx {
        io,
        opts,
        retries: AtomicU64::new(0),
        stop_reason: Mutex::new(None),
    };
    let writes = ops.iter().filter(|o| o.op.writes()).count();
    let creates = ops.iter().filter(|o| o.op == OpKind::Create).count();
    let total = ops.len();
    io.progress(|p| {
        *p = Progress {
            total,
            writes,
            ..Progress::default()
        }
    });
    let already_gone = ops
        .iter()
        .filter(|o| {
            o.op == OpKind::Delete && o.expect.as_ref().is_some_and(|(_, rv)| rv.is_empty())
        })
        .count();
    io.emit(ApplyEvent::Started {
        writes,
        deletes: writes - creates,
        already_gone,
        total,
    })
    .await;
    let ctx_ref = &ctx;
    let mut stream = futures::stream::iter(ops)
        .map(|op| async move {
            let result = run_op(ctx_ref, &op).await;
            if let Err(e) = ctx_ref.io.log(record(&op, Some(&result))) {
                // A refusal heard is said as one even when its line could not be kept:
                // it is what the operator must fix first.
                return match result.refused {
                    true => Ok(result),
                    false => Err(e),
                };
            }
            ctx_ref.io.progress(|p| {
                p.done += 1;
                p.throttled = ctx_ref.io.throttled();
                match result.outcome {
                    Outcome::Created | Outcome::AlreadyExisted => p.created += 1,
                    Outcome::Deleted | Outcome::AlreadyGone => p.deleted += 1,
                    o if o.is_problem() => p.failed += 1,
                    _ => {}
                }
            });
            if result.outcome.is_problem() {
                ctx_ref.io.emit(ApplyEvent::Problem(result.clone())).await;
            }
            Ok::<_, W::LogError>(result)
        })
        .buffer_unordered(opts.concurrency.max(1));
    let mut report = ApplyReport::default();
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
    if let Some(e) = first_err
        && !report.results.iter().any(|r| r.refused)
    {
        return Err(e);
    }
    report.retries = ctx.retries.load(Ordering::SeqCst);
    report.throttled = io.throttled();
    report.stopped = ctx
        .stop_reason
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .or_else(|| io.held_back().map(str::to_string));
    Ok(report)
}

async fn run_op<W: IdentityWrites>(ctx: &Ctx<'_, W>, op: &Op) -> OpResult {
    let mut result = OpResult::new(&op.id, op.target_id, Outcome::NotAttempted);
    match (op.op, op.target_id) {
        (OpKind::Skip, _) => result.outcome = Outcome::Skipped,
        (OpKind::Map, _) => result.outcome = Outcome::Mapped,
        (OpKind::AlreadyDone, _) => result.outcome = Outcome::AlreadyMigrated,
        (OpKind::Create, None) => fail(&mut result, "create without a target id".into()),
        (OpKind::Create, Some(_)) if ctx.stopped() => {}
        (OpKind::Create, Some(t)) => create_with_retries(ctx, op, t, &mut result).await,
        (OpKind::Keep, _) => {
            result.outcome = Outcome::Kept;
            result.error = op.reason.clone();
        }
        (OpKind::Delete, Some(_)) if ctx.stopped() => {}
        (OpKind::Delete, Some(t)) => match &op.expect {
            Some((uid, rv)) => {
                let expected = Written {
                    uid: uid.clone(),
                    resource_version: rv.clone(),
                };
                delete_with_retries(ctx, op, t, &expected, &mut result).await
            }
            None => fail(&mut result, "delete without a uid to check".into()),
        },
        (OpKind::Delete, None) => fail(&mut result, "delete without a target id".into()),
    }
    result
}

fn fail(result: &mut OpResult, error: String) {
    result.outcome = Outcome::Failed;
    result.error = Some(error);
}

/// The end of an operation on an error no retry answers. A refusal of these credentials
/// (401, 403 from RBAC) will meet every other write too: the batch halts and the result
/// says so, for sync to end on it and apply to exit 2. An admission check's denial is this
/// object's outcome alone, in the server's words; the batch goes on.
async fn met<W: IdentityWrites>(
    ctx: &Ctx<'_, W>,
    result: &mut OpResult,
    doing: &str,
    e: &RequestError,
) {
    let attempts = result.attempts;
    if e.is_denial() {
        result.outcome = Outcome::Denied;
        result.error = Some(e.to_string());
        return;
    }
    if e.is_refusal() {
        result.refused = true;
        ctx.halt(format!(
            "the API server {} refused {doing} ({e}); stopped starting new writes",
            ctx.io.server()
        ))
        .await;
    } else if e.is_retryable() {
        ctx.halt(format!(
            "the API server {} kept failing ({e}); stopped starting new writes",
            ctx.io.server()
        ))
        .await;
    }
    fail(result, format!("{e} after {attempts} attempt(s)"));
}

async fn create_with_retries<W: IdentityWrites>(
    ctx: &Ctx<'_, W>,
    op: &Op,
    target_id: u32,
    result: &mut OpResult,
) {
    // The map is built per create, not held for every identity of the plan.
    let labels = match parse_label_key(&op.label_key) {
        Ok(l) => to_security_labels(&l),
        Err(e) => return fail(result, format!("labels do not parse: {e}")),
    };
    let mut throttled = 0;
    loop {
        // Checked again before each retry: a gate that closed meanwhile (a lease no longer
        // valid) stops the write before it is sent again.
        if (result.attempts > 0 || throttled > 0) && ctx.stopped() {
            result.outcome = Outcome::NotAttempted;
            return;
        }
        result.attempts += 1;
        match ctx.io.create(target_id, &labels).await {
            Err(e) if e.is_throttled() => {
                result.attempts -= 1;
                throttled += 1;
                wait_out_throttling(ctx, op, throttled, &e).await;
            }
            Ok(created) => {
                result.outcome = Outcome::Created;
                keep_written(result, created);
                return;
            }
            Err(e) if e.is_already_exists() => {
                return check_existing(ctx, op, target_id, result).await;
            }
            Err(e)
                if (e.is_retryable() || ctx.io.sent_with_old_token(&e))
                    && result.attempts < ctx.opts.max_attempts =>
            {
                wait_before_retry(ctx, op, result.attempts, &e).await;
            }
            Err(e) => return met(ctx, result, "the create of a CiliumIdentity", &e).await,
        }
    }
}

fn keep_written(result: &mut OpResult, w: Written) {
    result.uid = Some(w.uid).filter(|u| !u.is_empty());
    result.resource_version = Some(w.resource_version).filter(|v| !v.is_empty());
}

/// A 409 on create: read what is there. Identical labels count as migrated; anything else is
/// a conflict to report, never to overwrite. The object this very run created, whose answer
/// was lost (the create was applied, the response dropped, the retry found it), is
/// `created`, with its uid, so rollback deletes it like any other this run created.
async fn check_existing<W: IdentityWrites>(
    ctx: &Ctx<'_, W>,
    op: &Op,
    target_id: u32,
    result: &mut OpResult,
) {
    loop {
        result.attempts += 1;
        match ctx.io.read(target_id).await {
            Ok(Some(found)) if canonical_key(&found.labels) == op.label_key => {
                if found.this_run {
                    result.outcome = Outcome::Created;
                    keep_written(result, found.written);
                } else {
                    result.outcome = Outcome::AlreadyExisted;
                }
                return;
            }
            Ok(Some(found)) => {
                result.outcome = Outcome::Conflict;
                result.existing = Some(canonical_key(&found.labels));
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
            Err(e) => {
                result.refused = e.is_refusal();
                return fail(result, format!("reading existing {target_id}: {e}"));
            }
        }
    }
}

/// A rollback's delete: only the object this tool created, as it was last read. A 404 is
/// already gone; a 409 (uid or resourceVersion changed) is someone else's object now, kept.
async fn delete_with_retries<W: IdentityWrites>(
    ctx: &Ctx<'_, W>,
    op: &Op,
    target_id: u32,
    expected: &Written,
    result: &mut OpResult,
) {
    let mut throttled = 0;
    loop {
        // As a create's: a stop during a wait (a 429's or a retry's) sends it no more.
        if (result.attempts > 0 || throttled > 0) && ctx.stopped() {
            result.outcome = Outcome::NotAttempted;
            return;
        }
        result.attempts += 1;
        match ctx.io.delete(target_id, expected).await {
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
            Err(e) => return met(ctx, result, "the delete of a CiliumIdentity", &e).await,
        }
    }
}

/// A 429 is the API server pushing back (API Priority and Fairness), not the identity
/// failing: waited out as the server asks (its Retry-After, else a doubling wait), for as
/// long as the push-back lasts, never counted as an attempt; counted apart for the progress
/// line, the summary and the log. A stop ends the wait within a tenth of a second.
async fn wait_out_throttling<W: IdentityWrites>(
    ctx: &Ctx<'_, W>,
    op: &Op,
    times: u32,
    e: &RequestError,
) {
    ctx.io.progress(|p| p.throttled = ctx.io.throttled());
    // Without a hint, waits double to a second: API Priority and Fairness itself asks for
    // one second, and a longer silence only idles a queue the server has freed.
    let policy = Policy {
        first: Duration::from_millis(100),
        cap: Duration::from_secs(1).min(ctx.opts.max_backoff),
    };
    let wait = match e.retry_after() {
        Some(asked) => asked.min(ctx.opts.max_backoff),
        None => policy.wait(times, None, &op.id),
    };
    let mut left = wait;
    while !left.is_zero() && !ctx.stopped() {
        let step = left.min(Duration::from_millis(100));
        ctx.io.sleep(step).await;
        left -= step;
    }
}

async fn wait_before_retry<W: IdentityWrites>(
    ctx: &Ctx<'_, W>,
    op: &Op,
    attempt_no: u32,
    e: &RequestError,
) {
    ctx.retries.fetch_add(1, Ordering::SeqCst);
    ctx.io.progress(|p| p.retries += 1);
    let policy = Policy {
        first: Duration::from_millis(100),
        cap: ctx.opts.max_backoff,
    };
    let wait = policy.wait(attempt_no, e.retry_after(), &op.id);
    ctx.io
        .emit(ApplyEvent::Retrying {
            id: op.id.clone(),
            attempt: attempt_no,
            error: e.to_string(),
            wait,
        })
        .await;
    ctx.io.sleep(wait).await;
}
