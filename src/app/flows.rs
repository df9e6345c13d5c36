//! The flows behind the commands: scan both sides, plan, apply a plan, verify. Every apply,
//! headless or from the TUI, goes through `apply` here and then the executor.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use crate::apply::executor::{self, ApplyOptions, StopFlag, Watchers};
use crate::apply::outcome::ApplyReport;
use crate::core::kvstore::{KvSnapshot, SourceInfo};
use crate::core::planner::resume::{self, Dropped, Resumed};
use crate::core::planner::{self, PlanItem};
use crate::core::range::{ClusterScope, IdRange};
use crate::core::verify::{self, Expectations, VerifyReport};
use crate::error::{Error, Result};
use crate::io::decision_log::{DecisionLog, LogContents};
use crate::io::k8s::{K8sSnapshot, K8sTarget, ReadMode};
use crate::io::kv_source::KvSource;
use crate::io::plan_file::{PlanFile, TargetInfo};

/// Both sides read, and the plan made from them. The kvstore entries' label keys moved into
/// the items: `kv` keeps the snapshot's source and node counts, not its entries.
pub struct Scan {
    pub kv: KvSnapshot,
    pub k8s: K8sSnapshot,
    pub items: Vec<PlanItem>,
}

/// How a scan reads both sides.
#[derive(Default)]
pub struct ScanOptions {
    /// Count the nodes using each identity with the read (slower); otherwise counts stay
    /// at zero and a front end reads them afterwards (`KvSource::count_nodes`).
    pub node_counts: bool,
    /// Counts the Kubernetes objects listed so far, for a progress display.
    pub listed: Option<Arc<AtomicUsize>>,
    /// Gets the kvstore's own plan (no Kubernetes side yet) as soon as the kvstore is read,
    /// so a front end shows the table while Kubernetes is still listed.
    pub kv_first: Option<tokio::sync::mpsc::Sender<Vec<PlanItem>>>,
}

/// The one way both sides are read: the kvstore and Kubernetes at once, then planned.
pub async fn read_both(
    kv: &KvSource,
    target: &K8sTarget,
    range: IdRange,
    opts: ScanOptions,
) -> Result<Scan> {
    let list = target.list_identities(target.read_mode(), opts.listed);
    let read_kv = async {
        let kv = if opts.node_counts {
            kv.read().await?
        } else {
            kv.read_masters().await?
        };
        if let Some(tx) = &opts.kv_first {
            let preview = planner::plan(&kv.masters, &HashMap::new(), &BTreeMap::new(), range);
            let _ = tx.send(preview).await;
        }
        Ok::<_, crate::Error>(kv)
    };
    let (mut kv, k8s) = tokio::try_join!(read_kv, list)?;
    let masters = std::mem::take(&mut kv.masters);
    let items = planner::plan_taking(masters, &kv.node_counts, &k8s.identities, range);
    Ok(Scan { kv, k8s, items })
}

/// Reads both sides with node counts and plans (the headless commands).
pub async fn scan(kv: &KvSource, target: &K8sTarget, range: IdRange) -> Result<Scan> {
    let opts = ScanOptions {
        node_counts: true,
        ..Default::default()
    };
    read_both(kv, target, range, opts).await
}

pub fn target_info(target: &K8sTarget) -> TargetInfo {
    TargetInfo {
        server: target.server.clone(),
        context: target.context.clone(),
    }
}

/// The plan file of a scan; takes the scan, so the items are moved, not copied (at 65,280
/// identities a copy costs tens of MiB).
pub fn plan_file(scan: Scan, target: &K8sTarget, scope: ClusterScope) -> PlanFile {
    PlanFile::new(
        scan.kv.source,
        target_info(target),
        scope,
        scan.k8s.crd_present,
        scan.items,
    )
}

/// A plan made of the operator's decided items (the TUI's commit): the decisions are
/// re-validated against a fresh read like any saved plan.
pub fn plan_of_items(
    kv: &KvSource,
    target: &K8sTarget,
    scope: ClusterScope,
    items: Vec<PlanItem>,
) -> PlanFile {
    let source = SourceInfo {
        prefix: kv.prefix(),
        ..Default::default()
    };
    PlanFile::new(source, target_info(target), scope, true, items)
}

/// What an apply starts from and how it runs.
#[derive(Debug, Clone)]
pub struct ApplySpec {
    /// A saved plan's items; `None` plans and applies in one go.
    pub plan: Option<PlanFile>,
    /// Decision logs whose decisions are replayed onto a fresh plan (instead of a plan file).
    pub resume: Vec<PathBuf>,
    pub accept_proposals: bool,
    pub options: ApplyOptions,
}

#[derive(Debug, Clone, Default)]
pub struct ApplyRun {
    /// Kvstore identities the plan has no item for (they appeared after it was made, or their
    /// item was taken out by hand): left alone.
    pub not_in_plan: Vec<String>,
    /// Plan items no longer in the kvstore: left alone.
    pub gone_from_kvstore: Vec<String>,
    /// With `resume`: decisions replayed, and those dropped with why.
    pub resumed: usize,
    pub dropped: Vec<Dropped>,
    /// With `resume`: ids the logs decide more than once, differently (the last stands).
    pub redecided: Vec<String>,
    pub report: ApplyReport,
}

/// The decisions recorded in `paths`, replayed onto the fresh plan `items`.
pub fn resume_from_logs(
    paths: &[PathBuf],
    items: &[PlanItem],
    k8s: &std::collections::BTreeMap<u32, crate::core::labels::LabelKey>,
    range: IdRange,
) -> Result<Resumed> {
    let logs = paths
        .iter()
        .map(|p| read_log(p))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&LogContents> = logs.iter().collect();
    let steps: Vec<resume::LogStep> = crate::io::decision_log::steps_in_time(&refs)
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let redecided = resume::redecided(&steps);
    let decisions = resume::replay(steps);
    Ok(Resumed {
        redecided,
        ..resume::resume(items, &decisions, k8s, range)
    })
}

/// The decisions in force at the end of `logs`, replayed in the order they were made.
pub fn decisions_in_force(
    logs: &[&LogContents],
) -> std::collections::BTreeMap<String, resume::LoggedDecision> {
    let steps = crate::io::decision_log::steps_in_time(logs);
    resume::replay(steps.into_iter().map(|(s, _)| s))
}

/// A plan made for another cluster, another cluster id or range, or named with `--resume`
/// as well, is refused before anything is read.
fn refuse_plan_elsewhere(req: &ApplySpec, target: &K8sTarget, scope: ClusterScope) -> Result<()> {
    if req.plan.is_some() && !req.resume.is_empty() {
        return Err(Error::Config(
            "--plan and --resume both say what to apply: pass one of them".into(),
        ));
    }
    if let Some(plan) = &req.plan {
        if plan.target.server != target.server {
            return Err(Error::Refused(format!(
                "the plan was made against {}, but the current context points at {}; make a new plan for this cluster",
                plan.target.server, target.server
            )));
        }
        if plan.cluster_id != scope.cluster_id
            || plan.max_connected_clusters != scope.max_connected_clusters
            || plan.range != scope.range
        {
            return Err(Error::Refused(format!(
                "the plan is for cluster id {} (max-connected-clusters {}, range {}), but this run uses {scope}; pass the same --cluster-id and --max-connected-clusters, or make a new plan",
                plan.cluster_id, plan.max_connected_clusters, plan.range
            )));
        }
    }
    Ok(())
}

/// Every item reconcile refused, named however many (the operator fixes them all at once);
/// under a resume, with why its recorded decision was dropped, which is the cause.
fn refused_items(errs: &[planner::ReconcileError], resumed: Option<&Resumed>) -> Error {
    let dropped: HashMap<&str, &str> = resumed
        .iter()
        .flat_map(|r| &r.dropped)
        .map(|d| (d.id.as_str(), d.reason.as_str()))
        .collect();
    let all: Vec<String> = errs
        .iter()
        .map(|e| match dropped.get(e.id.as_str()) {
            Some(why) => format!("  {e} (its recorded decision was dropped: {why})"),
            None => format!("  {e}"),
        })
        .collect();
    Error::Refused(format!(
        "{} item(s) refused, nothing written:\n{}",
        errs.len(),
        all.join("\n")
    ))
}

/// Re-reads both sides, re-validates every decision against them, logs the decisions, then
/// writes. Nothing is written when any item is refused.
pub async fn apply(
    kv: &KvSource,
    target: &K8sTarget,
    scope: ClusterScope,
    req: &ApplySpec,
    log: &DecisionLog,
    watchers: Watchers<'_>,
    stop: StopFlag,
) -> Result<ApplyRun> {
    refuse_plan_elsewhere(req, target, scope)?;
    let heard_from = target.notes().mark();
    let range = scope.range;
    // Node counts inform the operator, not the writes: apply skips that pass.
    let mut scan = read_both(kv, target, range, ScanOptions::default()).await?;
    tracing::info!(identities = scan.items.len(), "scanned both sides");
    if let Some(plan) = &req.plan
        && plan.source.prefix != scan.kv.source.prefix
    {
        return Err(Error::Refused(format!(
            "the plan reads kvstore prefix {:?}, this run reads {:?}",
            plan.source.prefix, scan.kv.source.prefix
        )));
    }
    let resumed = if req.resume.is_empty() {
        None
    } else {
        let r = resume_from_logs(&req.resume, &scan.items, &scan.k8s.identities, range)?;
        tracing::info!(
            resumed = r.resumed,
            dropped = r.dropped.len(),
            "decisions resumed"
        );
        Some(r)
    };
    let decisions = match (&req.plan, &resumed) {
        (Some(p), _) => Some(p.items.as_slice()),
        (None, Some(r)) => Some(r.items.as_slice()),
        (None, None) => None,
    };
    // The live items are handed over: their label keys move into the operations.
    let live = std::mem::take(&mut scan.items);
    let reconciled = planner::reconcile_taking(
        decisions,
        live,
        &scan.k8s.identities,
        range,
        req.accept_proposals,
    )
    .map_err(|errs| refused_items(&errs, resumed.as_ref()))?;
    let planner::Reconciled {
        ops,
        not_in_plan,
        gone_from_kvstore,
    } = reconciled;
    tracing::info!(ops = ops.len(), "decisions re-validated");
    // The operations carry all the writes need: the scan's items and Kubernetes map go now,
    // not after the last write (tens of MiB on a large cluster).
    let create_crd = !scan.k8s.crd_present;
    let (resumed, dropped, redecided) = resumed.map_or((0, Vec::new(), Vec::new()), |r| {
        (r.resumed, r.dropped, r.redecided)
    });
    drop(scan);
    executor::log_decisions(log, &ops)?;
    let mut report = executor::apply(
        target,
        ops,
        create_crd,
        &req.options,
        Some(log),
        watchers,
        stop,
    )
    .await?;
    note_server(target, heard_from, log, &mut report);
    Ok(ApplyRun {
        not_in_plan,
        gone_from_kvstore,
        resumed,
        dropped,
        redecided,
        report,
    })
}

/// What the API server said since `heard_from` (its 429s on the reads too, not only the
/// writes', and its warnings): into the report and the decision log's record of the run.
pub fn note_server(
    target: &K8sTarget,
    heard_from: crate::io::k8s::Mark,
    log: &DecisionLog,
    report: &mut crate::apply::outcome::ApplyReport,
) {
    // The span began before the executor's, so it holds every 429 the executor counted.
    let said = record_server(target, heard_from, log);
    report.throttled = said.throttled;
    report.server_warnings = said.warnings;
}

/// What the API server said since `heard_from`, recorded in the decision log (apply,
/// rollback and sync each end a run with it).
pub fn record_server(
    target: &K8sTarget,
    heard_from: crate::io::k8s::Mark,
    log: &DecisionLog,
) -> crate::io::k8s::ServerSaid {
    let said = target.notes().since(heard_from);
    if let Err(e) = log.note_server(&said) {
        // Every decision and outcome is in the log already; this line only says how the
        // server met the run.
        tracing::warn!(error = %e, "cannot record what the API server said in the decision log");
    }
    said
}

/// Verifies the migration against what the decision logs expect (empty: every identity at
/// its own id).
pub async fn verify(
    kv: &KvSource,
    target: &K8sTarget,
    range: IdRange,
    expect: &Expectations,
) -> Result<VerifyReport> {
    let (masters, identities) = read_for_verify(kv, target).await?;
    Ok(verify::verify(&masters, &identities, expect, range))
}

/// Both sides as a verdict reads them (`verify`, sync's cutover check): the latest state,
/// a quorum read, never the cache.
pub async fn read_for_verify(
    kv: &KvSource,
    target: &K8sTarget,
) -> Result<(
    Vec<crate::core::kvstore::MasterEntry>,
    BTreeMap<u32, crate::core::labels::LabelKey>,
)> {
    let (kv, k8s) = tokio::try_join!(
        kv.read_masters(),
        target.list_identities(ReadMode::Consistent, None)
    )?;
    Ok((kv.masters, k8s.identities))
}

/// What one or more decision logs expect (later files win).
pub fn expectations_from_logs(paths: &[PathBuf]) -> Result<Expectations> {
    let (e, notes) = expectations_and_notes(paths)?;
    for note in notes {
        tracing::info!("{note}");
    }
    Ok(e)
}

/// `expectations_from_logs`, with what a person should hear of the reading: each log whose
/// torn last line was left out.
pub fn expectations_and_notes(paths: &[PathBuf]) -> Result<(Expectations, Vec<String>)> {
    let mut e = Expectations::default();
    let mut notes = Vec::new();
    for p in paths {
        // Folded as it is read: the log's records are never all held at once.
        let (read, torn) = crate::io::decision_log::read_expectations(p)?;
        e.then(read);
        notes.extend(torn);
    }
    Ok((e, notes))
}

/// Reads a decision log, warning about a torn last line.
pub fn read_log(path: &std::path::Path) -> Result<LogContents> {
    let c = crate::io::decision_log::read(path)?;
    if c.torn_tail {
        tracing::warn!(path = %path.display(), "decision log ends in a torn line (a write cut short); it was ignored");
    }
    Ok(c)
}
