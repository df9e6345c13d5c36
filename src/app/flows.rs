//! The flows behind the commands: scan both sides, plan, apply a plan, verify. Every apply,
//! headless or from the TUI, goes through `apply` here and then the executor.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::apply::executor::{self, ApplyOptions, StopFlag, Watchers};
use crate::apply::outcome::ApplyReport;
use crate::core::kvstore::{KvSnapshot, SourceInfo};
use crate::core::planner::{self, PlanItem, reconcile};
use crate::core::range::{ClusterScope, IdRange};
use crate::core::verify::{self, VerifyReport};
use crate::error::{Error, Result};
use crate::io::decision_log::DecisionLog;
use crate::io::k8s::{K8sSnapshot, K8sTarget};
use crate::io::kv_source::KvSource;
use crate::io::plan_file::{PlanFile, TargetInfo};

/// Both sides read, and the plan made from them.
pub struct Scan {
    pub kv: KvSnapshot,
    pub k8s: K8sSnapshot,
    pub items: Vec<PlanItem>,
}

pub const LIST_PAGE: u32 = 500;

/// Reads the kvstore and Kubernetes concurrently and plans.
pub async fn scan(kv: &KvSource, target: &K8sTarget, range: IdRange) -> Result<Scan> {
    let (kv, k8s) = tokio::try_join!(kv.read(), target.list_identities(LIST_PAGE))?;
    let items = planner::plan(&kv.masters, &kv.node_counts, &k8s.identities, range);
    Ok(Scan { kv, k8s, items })
}

/// Reads the identities and Kubernetes and plans, leaving node counts at zero: what a front
/// end shows first, while `KvSource::count_nodes` runs.
pub async fn scan_without_counts(
    kv: &KvSource,
    target: &K8sTarget,
    range: IdRange,
) -> Result<Scan> {
    let (kv, k8s) = tokio::try_join!(kv.read_masters(), target.list_identities(LIST_PAGE))?;
    let items = planner::plan(&kv.masters, &kv.node_counts, &k8s.identities, range);
    Ok(Scan { kv, k8s, items })
}

pub fn target_info(target: &K8sTarget) -> TargetInfo {
    TargetInfo {
        server: target.server.clone(),
        context: target.context.clone(),
    }
}

pub fn plan_file(scan: &Scan, target: &K8sTarget, scope: ClusterScope) -> PlanFile {
    PlanFile::new(
        scan.kv.source.clone(),
        target_info(target),
        scope,
        scan.k8s.crd_present,
        scan.items.clone(),
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
    pub accept_proposals: bool,
    pub options: ApplyOptions,
}

#[derive(Debug, Clone, Default)]
pub struct ApplyRun {
    /// Kvstore identities that appeared after the plan was made: left alone.
    pub not_in_plan: Vec<String>,
    /// Plan items no longer in the kvstore: left alone.
    pub gone_from_kvstore: Vec<String>,
    pub report: ApplyReport,
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
    let range = scope.range;
    // Node counts inform the operator, not the writes: apply skips that pass.
    let scan = scan_without_counts(kv, target, range).await?;
    tracing::info!(identities = scan.items.len(), "scanned both sides");
    if let Some(plan) = &req.plan
        && plan.source.prefix != scan.kv.source.prefix
    {
        return Err(Error::Refused(format!(
            "the plan reads kvstore prefix {:?}, this run reads {:?}",
            plan.source.prefix, scan.kv.source.prefix
        )));
    }
    let decisions = req
        .plan
        .as_ref()
        .map(|p| p.items.as_slice())
        .unwrap_or(&scan.items);
    let reconciled = reconcile(
        decisions,
        &scan.items,
        &scan.k8s.identities,
        range,
        req.accept_proposals,
    )
    .map_err(|errs| {
        let shown: Vec<String> = errs.iter().take(20).map(|e| format!("  {e}")).collect();
        let more = if errs.len() > 20 {
            format!("\n  ... and {} more", errs.len() - 20)
        } else {
            String::new()
        };
        Error::Refused(format!(
            "{} item(s) refused, nothing written:\n{}{more}",
            errs.len(),
            shown.join("\n")
        ))
    })?;
    let planner::Reconciled {
        ops,
        not_in_plan,
        gone_from_kvstore,
    } = reconciled;
    tracing::info!(ops = ops.len(), "decisions re-validated");
    executor::log_decisions(log, &ops)?;
    let report = executor::apply(
        target,
        ops,
        !scan.k8s.crd_present,
        &req.options,
        Some(log),
        watchers,
        stop,
    )
    .await?;
    Ok(ApplyRun {
        not_in_plan,
        gone_from_kvstore,
        report,
    })
}

/// Verifies the migration; `mappings` come from a decision log (empty: every identity at its own id).
pub async fn verify(
    kv: &KvSource,
    target: &K8sTarget,
    range: IdRange,
    mappings: &BTreeMap<String, Option<u32>>,
) -> Result<VerifyReport> {
    let (kv, k8s) = tokio::try_join!(kv.read_masters(), target.list_identities(LIST_PAGE))?;
    Ok(verify::verify(
        &kv.masters,
        &k8s.identities,
        mappings,
        range,
    ))
}

/// Mappings from one or more decision logs (later files win).
pub fn mappings_from_logs(paths: &[PathBuf]) -> Result<BTreeMap<String, Option<u32>>> {
    let mut m = BTreeMap::new();
    for p in paths {
        let c = crate::io::decision_log::read(p)?;
        if c.torn_tail {
            tracing::warn!(path = %p.display(), "decision log ends in a torn line (a write cut short); it was ignored");
        }
        m.extend(c.mappings());
    }
    Ok(m)
}
