//! The switch to operator-managed identities, read side: what the operator's identity
//! controller reads (pods, namespaces, `cilium-config`, identities, endpoints), read at once,
//! handed to `core::switch::report`, and the report as text.

use std::collections::BTreeMap;

use std::collections::BTreeSet;

use serde::Serialize;

use crate::apply::executor::{ApplyOptions, StopFlag, Watchers, apply, log_decisions};
use crate::apply::outcome::ApplyReport;
use crate::core::kvstore::parse_id;
use crate::core::labels::{SecurityLabels, canonical_key};
use crate::core::planner::reconcile::{Op, OpKind};
use crate::core::planner::{DecidedBy, Kind};
use crate::core::range::IdRange;
use crate::core::switch::computed::PodFacts;
use crate::core::switch::endpoints::{EndpointUse, endpoint_use};
use crate::core::switch::prepare::{
    KvstoreHolds, PrepareInput, PrepareOptions, PreparePlan, prepare,
};
use crate::core::switch::report::{
    ExistingIdentity, Outcome, SwitchInput, SwitchReport, difference_text, switch_report,
};
use crate::core::switch::settings::Settings;
use crate::error::{Error, Result};
use crate::io::decision_log::DecisionLog;
use crate::io::k8s::K8sTarget;
use crate::io::kv_source::KvSource;

/// Where Cilium's ConfigMap is, by default.
pub const CILIUM_NAMESPACE: &str = "kube-system";
pub const CILIUM_CONFIG: &str = "cilium-config";

/// What the operator's controller reads, as read now.
pub struct SwitchFacts {
    pub settings: Settings,
    pub pods: Vec<PodFacts>,
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub identities: Vec<ExistingIdentity>,
    /// The ids `CiliumEndpoint`s and slice entries use, and whether that is known.
    pub endpoints: EndpointUse,
    pub range: IdRange,
}

impl SwitchFacts {
    /// What the switch would do to them.
    pub fn report(&self) -> SwitchReport {
        switch_report(&SwitchInput {
            settings: &self.settings,
            pods: &self.pods,
            namespaces: &self.namespaces,
            identities: &self.identities,
            endpoints: &self.endpoints,
            range: self.range,
        })
    }
}

/// Reads what the operator's controller reads.
pub async fn read_facts(target: &K8sTarget, cilium_namespace: &str) -> Result<SwitchFacts> {
    let kube = |what: &'static str| {
        let server = target.server.clone();
        move |e| Error::kube(server, what, e)
    };
    let from = format!("{cilium_namespace}/{CILIUM_CONFIG}");
    // The lists are independent: read them side by side, as the controller's informers do.
    let (config, pods, namespaces, identities, endpoints) = tokio::try_join!(
        async {
            target
                .config_map_data(cilium_namespace, CILIUM_CONFIG)
                .await
                .map_err(kube("reading cilium-config"))
        },
        async { target.pod_facts().await.map_err(kube("listing pods")) },
        async {
            target
                .namespace_labels()
                .await
                .map_err(kube("listing namespaces"))
        },
        async {
            target
                .identities_for_switch()
                .await
                .map_err(kube("listing CiliumIdentities"))
        },
        async {
            let ceps = crate::io::endpoints::identities_in_use(target).await;
            let slices = crate::io::endpoints::endpoints_in_slices(target).await;
            Ok::<_, Error>((
                served(ceps).map_err(kube("listing CiliumEndpoints"))?,
                served(slices).map_err(kube("listing CiliumEndpointSlices"))?,
            ))
        },
    )?;
    let (ceps, slices) = endpoints;
    let mut settings = Settings::from_config(&from, config.as_ref()).map_err(|e| {
        Error::Config(format!(
            "{from}: {e}: Cilium itself refuses this pattern; fix `labels` there first"
        ))
    })?;
    if config.is_none() && !namespaces.contains_key(cilium_namespace) {
        settings.namespace_missing(cilium_namespace);
    }
    // The cluster's own range, as its agents and operator allocate: its id in the mesh's
    // layout (255 or 511 clusters).
    let range =
        crate::core::range::ClusterScope::new(settings.cluster_id, settings.max_connected_clusters)
            .map_err(|e| Error::Config(format!("{from}: cluster-id {}: {e}", settings.cluster_id)))?
            .range;
    let ceps = ceps.map(|by_id| {
        by_id
            .into_iter()
            .flat_map(|(id, users)| users.into_iter().map(move |u| (u, id)))
            .collect()
    });
    let with_endpoint = pods.iter().filter(|p| !p.host_network).count();
    let endpoints = endpoint_use(ceps, slices, with_endpoint);
    if let Some(why) = &endpoints.unknown {
        settings.shown.cannot_know.push(why.clone());
    }
    Ok(SwitchFacts {
        settings,
        pods,
        namespaces,
        identities,
        endpoints,
        range,
    })
}

/// A list of a kind the server may not serve (its CRD not installed): `None` then.
fn served<T>(
    r: std::result::Result<T, crate::io::k8s::RequestError>,
) -> std::result::Result<Option<T>, crate::io::k8s::RequestError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_404() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the cluster and reports what the switch would do.
pub async fn read_report(target: &K8sTarget, cilium_namespace: &str) -> Result<SwitchReport> {
    Ok(read_facts(target, cilium_namespace).await?.report())
}

/// The report and what preparing for it takes.
#[derive(Debug, Serialize)]
pub struct Preparation {
    pub report: SwitchReport,
    pub plan: PreparePlan,
}

/// Reads Kubernetes and the kvstore (whose ids, sync's reservations among them, a prepared
/// identity must not take, and whose nodes still allocate there) and plans the preparation.
pub async fn read_preparation(
    target: &K8sTarget,
    kv: &KvSource,
    cilium_namespace: &str,
    options: PrepareOptions,
) -> Result<Preparation> {
    let (facts, kvstore) =
        tokio::try_join!(read_facts(target, cilium_namespace), read_kvstore_holds(kv))?;
    let report = facts.report();
    let plan = prepare(&PrepareInput {
        report: &report,
        identities: &facts.identities,
        kvstore: &kvstore,
        endpoint_ids: &facts.endpoints.ids,
        range: facts.range,
        options: PrepareOptions {
            // Unknown endpoints could use any identity: nothing is removed then.
            endpoints_unknown: !facts.endpoints.known(),
            ..options
        },
    });
    Ok(Preparation { report, plan })
}

/// The ids the kvstore holds and the nodes still allocating there, read at one revision.
pub async fn read_kvstore_holds(kv: &KvSource) -> Result<KvstoreHolds> {
    let snap = kv.read_masters().await?;
    let mut holds = KvstoreHolds {
        ids: snap
            .masters
            .iter()
            .filter_map(|m| parse_id(&m.id).ok())
            .collect(),
        nodes: BTreeSet::new(),
    };
    for key in kv.read_value_keys(&snap).await?.unwrap_or_default() {
        holds.ids.extend(parse_id(key.id.as_bytes()).ok());
        holds.nodes.insert(key.node);
    }
    Ok(holds)
}

/// The preparation as the executor's operations, each of its own kind in the decision log
/// (`switch-create`, `switch-remove-duplicate`, `switch-remove-unused`): creates at the
/// chosen ids, deletes of exactly the objects read.
pub fn operations(plan: &PreparePlan) -> Vec<Op> {
    let op = |id: u32,
              labels: &SecurityLabels,
              kind: Kind,
              write: OpKind,
              expect: Option<(String, String)>| Op {
        id: id.to_string(),
        label_key: canonical_key(labels),
        kind,
        op: write,
        target_id: Some(id),
        decided_by: DecidedBy::SwitchPrepare,
        expect,
        reason: None,
    };
    let creates = plan
        .creates
        .iter()
        .map(|c| op(c.id, &c.labels, Kind::SwitchCreate, OpKind::Create, None));
    let removals = plan.removals.iter().map(|r| {
        op(
            r.id,
            &r.labels,
            r.of.kind(),
            OpKind::Delete,
            Some((r.uid.clone(), r.resource_version.clone())),
        )
    });
    creates.chain(removals).collect()
}

/// Whether the kvstore, read again now, still lets the preparation be written (no agent
/// allocating there, no id to create taken there since the plan): checked just before the
/// writes, as the last read before them.
pub async fn kvstore_still_clear(kv: &KvSource, plan: &PreparePlan) -> Result<()> {
    let now = read_kvstore_holds(kv).await?;
    match plan.kvstore_moved(&now) {
        Some(why) => Err(Error::Config(why)),
        None => Ok(()),
    }
}

/// Carries the preparation out: every decision logged first, then the writes (never an
/// overwrite: a create that meets an object is a conflict; a delete only of the object read).
pub async fn carry_out(
    target: &K8sTarget,
    plan: &PreparePlan,
    log: &DecisionLog,
    opts: &ApplyOptions,
    stop: StopFlag,
) -> Result<ApplyReport> {
    let ops = operations(plan);
    log_decisions(log, &ops)?;
    apply(
        target,
        ops,
        false,
        opts,
        Some(log),
        Watchers::default(),
        stop,
    )
    .await
}

/// The preparation as text: each identity to create with the pods that will adopt it, each
/// removal and why, and what is left to the operator.
pub fn plan_text(p: &Preparation) -> String {
    let plan = &p.plan;
    let mut out = String::new();
    // What the plan was made on without knowing it: said first, as the report says it.
    for n in &p.report.settings.cannot_know {
        out.push_str(&format!("cannot know: {n}\n"));
    }
    for c in plan.creates.iter().take(SHOWN) {
        out.push_str(&format!(
            "create {} {} for {} ({})\n",
            c.id,
            canonical_key(&c.labels),
            crate::core::audit::names_list(&c.pods, 3),
            c.because
        ));
    }
    if plan.creates.len() > SHOWN {
        out.push_str(&format!(
            "create: {} more (--output json lists every one)\n",
            plan.creates.len() - SHOWN
        ));
    }
    for r in plan.removals.iter().take(SHOWN) {
        out.push_str(&format!("remove {}: {}\n", r.id, r.why));
    }
    if plan.removals.len() > SHOWN {
        out.push_str(&format!(
            "remove: {} more (--output json lists every one)\n",
            plan.removals.len() - SHOWN
        ));
    }
    if !plan.kvstore_nodes.is_empty() {
        out.push_str(&format!(
            "kvstore: {} there ({}): --yes writes nothing until every agent is in CRD mode\n",
            crate::core::switch::prepare::still_allocating(plan.kvstore_nodes.len()),
            crate::core::audit::names_list(&plan.kvstore_nodes, 5)
        ));
    }
    if plan.no_free_id > 0 {
        out.push_str(&format!(
            "{} label sets get no identity: no id of the range is free; remove unused identities first\n",
            plan.no_free_id
        ));
    }
    for a in &plan.advice {
        out.push_str(&format!("left to you: {a}\n"));
    }
    out.push_str(&format!(
        "to create: {}, to remove: {}\n",
        plan.creates.len(),
        plan.removals.len()
    ));
    out
}

/// What carrying the preparation out did: each write that did not go as planned, and the
/// counts.
pub fn carried_out_text(done: &ApplyReport) -> String {
    use crate::core::outcome::Outcome as Done;
    let mut out = String::new();
    let (mut created, mut removed) = (0, 0);
    for r in &done.results {
        match r.outcome {
            Done::Created => created += 1,
            Done::Deleted | Done::AlreadyGone => removed += 1,
            Done::Conflict => out.push_str(&format!(
                "conflict {}: another object took the id meanwhile ({}); run switch-prepare again for a new id\n",
                r.target_id.unwrap_or_default(),
                r.existing.as_deref().unwrap_or("labels unknown")
            )),
            other => out.push_str(&format!(
                "{} {}: {}\n",
                other.as_str(),
                r.target_id.unwrap_or_default(),
                r.problem().unwrap_or_default()
            )),
        }
    }
    if let Some(why) = &done.stopped {
        out.push_str(&format!("stopped: {why}\n"));
    }
    out.push_str(&format!("created {created}, removed {removed}\n"));
    out
}

/// Pods of one outcome printed in full; the rest are counted (JSON lists every one).
const SHOWN: usize = 20;

/// The report as text: the settings, the counts, each pod that does not simply keep its id,
/// the unused identities, and what the draws are expected to rewrite.
pub fn text(report: &SwitchReport) -> String {
    let s = &report.settings;
    let c = &report.counts;
    let mut out = format!("rules: {}\n", report.rules);
    for r in report.releases {
        out.push_str(&format!("release: {r}\n"));
    }
    out.push_str(&format!(
        "settings from {}: cluster {} (id {}), label patterns: {}, identity-management-mode: {}\n",
        s.from,
        s.cluster_name,
        s.cluster_id,
        if s.labels.is_empty() {
            "Cilium's defaults".to_string()
        } else {
            format!("the defaults then {}", s.labels.join(" "))
        },
        s.identity_management_mode
            .as_deref()
            .unwrap_or("agent (not set)")
    ));
    for n in &s.cannot_know {
        out.push_str(&format!("cannot know: {n}\n"));
    }
    out.push_str(&format!(
        "{} pods: {} adopted, {} re-minted, {} with no identity, {} duplicate, {} in no namespace, {} in the host's network (nothing to compute); {} endpoints would change identity\n",
        c.pods, c.adopted, c.re_minted, c.no_identity, c.duplicate, c.no_namespace, c.host_network, c.endpoints_moving
    ));
    for name in ["re-minted", "no-identity", "duplicate", "no-namespace"] {
        let of: Vec<_> = report
            .pods
            .iter()
            .filter(|p| p.outcome.name() == name)
            .collect();
        for p in of.iter().take(SHOWN) {
            let ep = p
                .endpoint_id
                .map(|id| format!(" · endpoint uses {id}"))
                .unwrap_or_default();
            let what = outcome_text(&p.outcome);
            out.push_str(&format!("{name} {}: {what}{ep}\n", p.pod));
        }
        if of.len() > SHOWN {
            out.push_str(&format!(
                "{name}: {} more (--output json lists every one)\n",
                of.len() - SHOWN
            ));
        }
    }
    moving_endpoints_text(report, &mut out);
    let ours = report.unused.iter().filter(|u| u.run.is_some()).count();
    out.push_str(&format!(
        "{} identities, {} used by no pod and no endpoint ({ours} created by this tool, the rest left to Cilium's identity GC)\n",
        c.identities, c.unused_identities
    ));
    if c.label_sets_drawn > 0 {
        out.push_str(&format!(
            "at the switch {} label sets each draw a new id at random from the whole range, where {} identities stand that no pod has claimed yet: expect about {:.1} unused identities rewritten to other labels and up to {:.1} identities of pods not handled yet taken over\n",
            c.label_sets_drawn,
            c.unreserved_identities,
            c.expected_unused_rewritten,
            c.expected_live_taken_over_at_most
        ));
    }
    if c.no_namespace > 0 {
        out.push_str(&format!(
            "{} in a namespace that is gone: the operator computes no identity for them and they go with it; nothing to prepare\n",
            crate::core::words::count(c.no_namespace, "pod")
        ));
    }
    if report.is_safe() {
        out.push_str(
            "safe: every pod is adopted by exactly one identity; the switch draws nothing\n",
        );
    } else {
        out.push_str("not safe yet: switch-prepare creates an identity for each label set above, at an id nothing holds, and settles this tool's duplicates\n");
    }
    out
}

/// Why a pod does not simply keep its id, for the report's line about it.
fn outcome_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::ReMinted {
            nearest,
            lacks,
            extra,
        } => format!(
            "nearest identity {nearest}: it {}",
            difference_text(lacks, extra)
        ),
        Outcome::NoIdentity => "no identity has its pod labels".to_string(),
        Outcome::Duplicate {
            ids,
            agents_pick,
            ours,
        } => format!(
            "identities {} hold its labels: the agents take {agents_pick} (the oldest), the operator any one of them{}",
            join_ids(ids),
            if ours.is_empty() {
                String::new()
            } else {
                format!("; this tool created {}", join_ids(ours))
            }
        ),
        Outcome::NoNamespace => {
            "its namespace was not found: the operator gives it no identity".to_string()
        }
        Outcome::Adopted { .. } | Outcome::HostNetwork => String::new(),
    }
}

/// The endpoints whose pods would change identity, the first few by name.
fn moving_endpoints_text(report: &SwitchReport, out: &mut String) {
    let moving: Vec<_> = report.pods.iter().filter(|p| p.endpoint_moves()).collect();
    for p in moving.iter().take(SHOWN) {
        let to = match &p.outcome {
            Outcome::Adopted { id } => id.to_string(),
            Outcome::Duplicate { ids, .. } => format!("one of {}", join_ids(ids)),
            Outcome::NoNamespace => "no identity".to_string(),
            _ => "a new id".to_string(),
        };
        out.push_str(&format!(
            "endpoint {} uses {}: the operator gives its pod {to}\n",
            p.pod,
            p.endpoint_id.unwrap_or_default()
        ));
    }
    if moving.len() > SHOWN {
        out.push_str(&format!(
            "endpoints: {} more (--output json lists every pod with its endpoint_id)\n",
            moving.len() - SHOWN
        ));
    }
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::switch::report::SwitchCounts;
    use crate::core::switch::settings::ShownSettings;

    fn report(counts: SwitchCounts) -> SwitchReport {
        SwitchReport {
            rules: crate::core::switch::report::RULES,
            releases: &[],
            settings: ShownSettings {
                from: "kube-system/cilium-config".into(),
                cluster_name: "default".into(),
                cluster_id: 0,
                max_connected_clusters: Default::default(),
                labels: Vec::new(),
                identity_management_mode: None,
                cannot_know: Vec::new(),
                guessed: Vec::new(),
            },
            counts,
            pods: Vec::new(),
            unused: Vec::new(),
        }
    }

    #[test]
    fn the_text_says_the_draw_is_from_the_whole_range_and_a_gone_namespace_apart() {
        let r = report(SwitchCounts {
            no_identity: 10,
            no_namespace: 1,
            label_sets_drawn: 10,
            unreserved_identities: 100,
            ..Default::default()
        });
        let text = text(&r);
        assert!(text.contains("at random from the whole range"), "{text}");
        assert!(
            text.contains(
                "1 pod in a namespace that is gone: the operator computes no identity for them"
            ),
            "{text}"
        );
        assert!(text.contains("not safe yet"), "{text}");
        let gone_only = report(SwitchCounts {
            adopted: 1,
            no_namespace: 1,
            ..Default::default()
        });
        assert!(text_of_safe(&gone_only), "{}", super::text(&gone_only));
    }

    fn text_of_safe(r: &SwitchReport) -> bool {
        text(r).contains("\nsafe: ")
    }
}
