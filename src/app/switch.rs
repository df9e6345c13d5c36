//! The switch to operator-managed identities, read side: what the operator's identity
//! controller reads (pods, namespaces, `cilium-config`, identities, endpoints), read at once,
//! handed to `core::switch::report`, and the report as text.

use std::collections::BTreeMap;

use crate::core::range::IdRange;
use crate::core::switch::report::{Outcome, SwitchInput, SwitchReport, switch_report};
use crate::core::switch::settings::Settings;
use crate::error::{Error, Result};
use crate::io::k8s::K8sTarget;

/// Where Cilium's ConfigMap is, by default.
pub const CILIUM_NAMESPACE: &str = "kube-system";
pub const CILIUM_CONFIG: &str = "cilium-config";

/// Reads the cluster and reports what the switch would do.
pub async fn read_report(target: &K8sTarget, cilium_namespace: &str) -> Result<SwitchReport> {
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
            crate::io::endpoints::identities_in_use(target)
                .await
                .map_err(kube("listing CiliumEndpoints"))
        },
    )?;
    let settings = Settings::from_config(&from, config.as_ref()).map_err(|e| {
        Error::Config(format!(
            "{from}: {e}: Cilium itself refuses this pattern; fix `labels` there first"
        ))
    })?;
    let range = IdRange::for_cluster(settings.cluster_id)
        .map_err(|e| Error::Config(format!("{from}: cluster-id {}: {e}", settings.cluster_id)))?;
    let endpoints: BTreeMap<String, u32> = endpoints
        .into_iter()
        .flat_map(|(id, users)| users.into_iter().map(move |u| (u, id)))
        .collect();
    Ok(switch_report(&SwitchInput {
        settings: &settings,
        pods: &pods,
        namespaces: &namespaces,
        identities: &identities,
        endpoints: &endpoints,
        range,
    }))
}

/// Pods of one outcome printed in full; the rest are counted (JSON lists every one).
const SHOWN: usize = 20;

/// Whether the switch, made now, re-mints nothing, finds no duplicate and moves no endpoint.
pub fn is_safe(report: &SwitchReport) -> bool {
    let c = &report.counts;
    c.re_minted + c.no_identity + c.duplicate + c.no_namespace + c.endpoints_moving == 0
}

/// The report as text: the settings, the counts, each pod that does not simply keep its id,
/// the unused identities, and what the draws are expected to rewrite.
pub fn text(report: &SwitchReport) -> String {
    let s = &report.settings;
    let c = &report.counts;
    let mut out = format!("rules: {}\n", report.rules);
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
        "{} pods: {} adopted, {} re-minted, {} with no identity, {} duplicate, {} in no namespace; {} endpoints would change identity\n",
        c.pods, c.adopted, c.re_minted, c.no_identity, c.duplicate, c.no_namespace, c.endpoints_moving
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
            let what = match &p.outcome {
                Outcome::ReMinted {
                    nearest,
                    lacks,
                    extra,
                } => {
                    let mut d = Vec::new();
                    if !lacks.is_empty() {
                        d.push(format!("it lacks {}", lacks.join(", ")));
                    }
                    if !extra.is_empty() {
                        d.push(format!("it has {}", extra.join(", ")));
                    }
                    format!("nearest identity {nearest}: {}", d.join("; "))
                }
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
                Outcome::Adopted { .. } => String::new(),
            };
            out.push_str(&format!("{name} {}: {what}{ep}\n", p.pod));
        }
        if of.len() > SHOWN {
            out.push_str(&format!(
                "{name}: {} more (--output json lists every one)\n",
                of.len() - SHOWN
            ));
        }
    }
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
    let ours = report.unused.iter().filter(|u| u.run.is_some()).count();
    out.push_str(&format!(
        "{} identities, {} used by no pod and no endpoint ({ours} created by this tool, the rest left to Cilium's identity GC)\n",
        c.identities, c.unused_identities
    ));
    if c.label_sets_drawn > 0 {
        out.push_str(&format!(
            "at the switch {} label sets draw a new id at random from {} ids no pod has claimed yet: expect about {:.1} unused identities rewritten to other labels and up to {:.1} identities of pods not handled yet taken over\n",
            c.label_sets_drawn,
            c.unreserved_identities,
            c.expected_unused_rewritten,
            c.expected_live_taken_over_at_most
        ));
    }
    if is_safe(report) {
        out.push_str("safe: every pod keeps the identity it has; the switch draws nothing\n");
    } else {
        out.push_str("not safe yet: create an identity for each label set above before the switch, at an id nothing holds\n");
    }
    out
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
