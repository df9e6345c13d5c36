//! What switching to operator-managed identities will do, before it is done: for every pod,
//! the label set Cilium 1.18's operator will compute and whether it adopts an existing
//! `CiliumIdentity`, finds two, or mints a new id at random; and every identity no pod and no
//! endpoint uses, which a new id drawn at the switch can land on and rewrite.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::core::labels::{LabelKey, SecurityLabels, canonical_key};
use crate::core::range::IdRange;
use crate::core::switch::computed::{PodFacts, operator_labels};
use crate::core::switch::endpoints::EndpointUse;
use crate::core::switch::filter::LabelFilter;
use crate::core::switch::settings::{Settings, ShownSettings};

/// A `CiliumIdentity` as the report sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingIdentity {
    pub id: u32,
    pub labels: SecurityLabels,
    /// `metadata.creationTimestamp`, in seconds since the epoch: the agents take the oldest
    /// of two objects with the same labels.
    pub created: i64,
    /// This tool's run that created it (`cilium-idmig.io/run`), if one did.
    pub run: Option<String>,
    /// Its uid and resourceVersion as read: a removal deletes exactly this object.
    pub uid: String,
    pub resource_version: String,
}

/// What the report reads.
pub struct SwitchInput<'a> {
    pub settings: &'a Settings,
    pub pods: &'a [PodFacts],
    /// Each namespace's labels, by name.
    pub namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
    pub identities: &'a [ExistingIdentity],
    /// The ids endpoints and slice entries use, and each pod's.
    pub endpoints: &'a EndpointUse,
    pub range: IdRange,
}

/// What the operator does for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// One identity holds exactly the computed labels: the operator adopts it.
    Adopted { id: u32 },
    /// Several identities hold exactly these labels. The operator takes whichever its index
    /// returns first (it changes between restarts); the agents take the oldest.
    Duplicate {
        ids: Vec<u32>,
        agents_pick: u32,
        /// This tool's objects among them.
        ours: Vec<u32>,
    },
    /// No identity holds exactly these labels: a new id is drawn at random. `nearest` is the
    /// identity with the same pod labels that differs least, with what it lacks and what it
    /// has besides (a missing `kubernetes.io/metadata.name`, a cluster name).
    ReMinted {
        nearest: u32,
        lacks: Vec<String>,
        extra: Vec<String>,
    },
    /// No identity is near these labels: a new id is drawn at random.
    NoIdentity,
    /// The pod's namespace was not found: the operator computes nothing for it.
    NoNamespace,
    /// The pod runs in the host's network: it has the host's identity, and the operator
    /// computes nothing for it.
    HostNetwork,
}

impl Outcome {
    /// Whether the switch draws a new id for this label set.
    pub fn draws(&self) -> bool {
        matches!(self, Outcome::ReMinted { .. } | Outcome::NoIdentity)
    }

    /// Its name in the JSON output and the counts.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Adopted { .. } => "adopted",
            Outcome::Duplicate { .. } => "duplicate",
            Outcome::ReMinted { .. } => "re-minted",
            Outcome::NoIdentity => "no-identity",
            Outcome::NoNamespace => "no-namespace",
            Outcome::HostNetwork => "host-network",
        }
    }
}

/// What a near identity lacks and has besides, in words: `lacks a=b; has c=d`.
pub fn difference_text(lacks: &[String], extra: &[String]) -> String {
    let mut d = Vec::new();
    if !lacks.is_empty() {
        d.push(format!("lacks {}", lacks.join(", ")));
    }
    if !extra.is_empty() {
        d.push(format!("has {}", extra.join(", ")));
    }
    d.join("; ")
}

/// One pod's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodOutcome {
    /// `namespace/name`.
    pub pod: String,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The id its `CiliumEndpoint` uses now, if it has one.
    pub endpoint_id: Option<u32>,
    /// The labels the operator computes.
    pub labels: SecurityLabels,
}

impl PodOutcome {
    /// The endpoint uses an id the operator will not give the pod: its traffic changes
    /// identity at the switch.
    pub fn endpoint_moves(&self) -> bool {
        let Some(ep) = self.endpoint_id else {
            return false;
        };
        match &self.outcome {
            Outcome::HostNetwork => false,
            Outcome::Adopted { id } => *id != ep,
            Outcome::Duplicate { ids, .. } => !ids.contains(&ep),
            _ => true,
        }
    }
}

/// An identity no pod will be given and no endpoint uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnusedIdentity {
    pub id: u32,
    /// This tool's run that created it, if one did (this tool may remove it; Cilium's
    /// identity GC removes the others).
    pub run: Option<String>,
    /// Its labels as a label key (one string: a full cluster has tens of thousands).
    pub labels: LabelKey,
}

/// The counts at the top of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SwitchCounts {
    pub pods: usize,
    pub adopted: usize,
    pub duplicate: usize,
    pub re_minted: usize,
    pub no_identity: usize,
    pub no_namespace: usize,
    /// Pods in the host's network: nothing to compute.
    pub host_network: usize,
    /// Distinct label sets the switch draws a new id for.
    pub label_sets_drawn: usize,
    /// Pods whose endpoint uses another id than the operator will give them.
    pub endpoints_moving: usize,
    pub identities: usize,
    pub unused_identities: usize,
    /// Identities no pod adopts when the pods are handled: what a draw can land on.
    pub unreserved_identities: usize,
    /// Expected rewrites of unused identities by the draws: draws x unused / range size.
    pub expected_unused_rewritten: f64,
    /// At most this many identities of pods not handled yet are expected to be taken over:
    /// draws x adopted identities / range size (fewer when more pods are handled first).
    pub expected_live_taken_over_at_most: f64,
}

impl SwitchReport {
    /// Whether the switch, made now, draws no id and finds no duplicate (endpoints whose
    /// pods' labels are not their identity's still move: that is the labels' doing, not the
    /// switch's). A pod whose namespace is gone draws nothing: the operator computes no
    /// labels for it, and it goes with its namespace; nothing could be prepared for it.
    pub fn is_safe(&self) -> bool {
        let c = &self.counts;
        c.re_minted + c.no_identity + c.duplicate == 0
    }
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchReport {
    /// Which rules were applied.
    pub rules: &'static str,
    /// Which rules apply to which release: why identities minted earlier may differ.
    pub releases: &'static [&'static str],
    pub settings: ShownSettings,
    pub counts: SwitchCounts,
    pub pods: Vec<PodOutcome>,
    pub unused: Vec<UnusedIdentity>,
}

/// The rules this report follows.
pub const RULES: &str = "Cilium 1.18's operator identity controller (operator/pkg/ciliumidentity), the first release with operator-managed identities: exact match of security-labels, else a random id in the cluster's range";

/// What each Cilium release put in an identity, as far as it matters here: the operator of
/// 1.18 computes the newest set, so an identity minted under older rules is re-minted where
/// they differ.
pub const RELEASES: &[&str] = &[
    "operator-managed identities exist from Cilium 1.18 (identity-management-mode operator or both); before it, agents mint every identity and nothing re-mints",
    "agents since 1.0 put the namespace's labels in identities, since 1.4 the cluster label; an identity minted before lacks them",
    "servers since Kubernetes 1.21 label every namespace kubernetes.io/metadata.name: identities minted on older servers lack it",
    "1.18's default filter drops controller-uid and batch.kubernetes.io/controller-uid, which earlier releases kept",
    "with include patterns of its own (labels in cilium-config) 1.18's filter is an allow list: it keeps what they include and the namespace, namespace labels and cluster label its defaults include; the service account only where a pattern names it",
];

/// Keys of Cilium's own labels, set from the namespace, service account and cluster: the
/// rest of a set is the pod's own, which the nearest identity is looked up by. Labels the
/// filter drops now are left out too, so an identity minted when they were kept (a
/// `controller-uid` before 1.18) is still found near.
fn pods_own(labels: &SecurityLabels, filter: &LabelFilter) -> SecurityLabels {
    labels
        .iter()
        .filter(|(k, _)| !k.starts_with("k8s:io.cilium.k8s."))
        .filter(|(k, _)| match k.split_once(':') {
            Some((source, key)) => filter.keeps(source, key),
            None => true,
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// How many label pairs two sets differ by, and which.
fn differences(want: &SecurityLabels, have: &SecurityLabels) -> (Vec<String>, Vec<String>) {
    let lacks = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let extra = have
        .iter()
        .filter(|(k, v)| want.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    (lacks, extra)
}

/// The identities, indexed the ways the report looks them up.
struct Index<'a> {
    by_labels: HashMap<&'a SecurityLabels, Vec<&'a ExistingIdentity>>,
    /// By the label key of the pod's own labels (a string, not a map: one per identity).
    by_pods_own: HashMap<LabelKey, Vec<&'a ExistingIdentity>>,
    filter: &'a LabelFilter,
}

impl<'a> Index<'a> {
    fn new(identities: &'a [ExistingIdentity], filter: &'a LabelFilter) -> Self {
        let mut by_labels: HashMap<&SecurityLabels, Vec<&ExistingIdentity>> = HashMap::new();
        let mut by_pods_own: HashMap<LabelKey, Vec<&ExistingIdentity>> = HashMap::new();
        for i in identities {
            by_labels.entry(&i.labels).or_default().push(i);
            by_pods_own
                .entry(canonical_key(&pods_own(&i.labels, filter)))
                .or_default()
                .push(i);
        }
        Index {
            by_labels,
            by_pods_own,
            filter,
        }
    }

    fn outcome(&self, labels: &SecurityLabels) -> Outcome {
        if let Some(found) = self.by_labels.get(labels) {
            if let [one] = found.as_slice() {
                return Outcome::Adopted { id: one.id };
            }
            let mut ids: Vec<u32> = found.iter().map(|i| i.id).collect();
            ids.sort_unstable();
            let agents_pick = found
                .iter()
                .min_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)))
                .map(|i| i.id)
                .unwrap_or(ids[0]);
            let mut ours: Vec<u32> = found
                .iter()
                .filter(|i| i.run.is_some())
                .map(|i| i.id)
                .collect();
            ours.sort_unstable();
            return Outcome::Duplicate {
                ids,
                agents_pick,
                ours,
            };
        }
        let own = canonical_key(&pods_own(labels, self.filter));
        let Some(near) = self.by_pods_own.get(&own) else {
            return Outcome::NoIdentity;
        };
        near.iter()
            .map(|i| {
                let (lacks, extra) = differences(labels, &i.labels);
                (lacks.len() + extra.len(), i.id, lacks, extra)
            })
            .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, nearest, lacks, extra)| Outcome::ReMinted {
                nearest,
                lacks,
                extra,
            })
            .unwrap_or(Outcome::NoIdentity)
    }
}

/// The report of what the switch does to these pods and identities.
pub fn switch_report(input: &SwitchInput) -> SwitchReport {
    let index = Index::new(input.identities, &input.settings.filter);
    let mut by_set: HashMap<SecurityLabels, Outcome> = HashMap::new();
    let mut counts = SwitchCounts {
        pods: input.pods.len(),
        identities: input.identities.len(),
        ..SwitchCounts::default()
    };
    let mut pods = Vec::with_capacity(input.pods.len());
    let mut adopted_ids: BTreeSet<u32> = BTreeSet::new();
    let mut drawn: BTreeSet<&SecurityLabels> = BTreeSet::new();
    for pod in input.pods {
        let key = format!("{}/{}", pod.namespace, pod.name);
        let endpoint_id = input.endpoints.by_pod.get(&key).copied();
        let (labels, outcome) = match input.namespaces.get(&pod.namespace) {
            _ if pod.host_network => (SecurityLabels::new(), Outcome::HostNetwork),
            None => (SecurityLabels::new(), Outcome::NoNamespace),
            Some(ns_labels) => {
                let labels = operator_labels(
                    pod,
                    ns_labels,
                    &input.settings.cluster_name,
                    &input.settings.filter,
                );
                let outcome = by_set
                    .entry(labels.clone())
                    .or_insert_with(|| index.outcome(&labels))
                    .clone();
                (labels, outcome)
            }
        };
        match &outcome {
            Outcome::Adopted { id } => {
                counts.adopted += 1;
                adopted_ids.insert(*id);
            }
            Outcome::Duplicate { ids, .. } => {
                counts.duplicate += 1;
                // The operator adopts one of them; which is not known, so none is counted
                // as free for a draw.
                adopted_ids.extend(ids.iter().copied());
            }
            Outcome::ReMinted { .. } => counts.re_minted += 1,
            Outcome::NoIdentity => counts.no_identity += 1,
            Outcome::NoNamespace => counts.no_namespace += 1,
            Outcome::HostNetwork => counts.host_network += 1,
        }
        let line = PodOutcome {
            pod: key,
            outcome,
            endpoint_id,
            labels,
        };
        if line.endpoint_moves() {
            counts.endpoints_moving += 1;
        }
        pods.push(line);
    }
    for line in &pods {
        if line.outcome.draws() {
            drawn.insert(&line.labels);
        }
    }
    counts.label_sets_drawn = drawn.len();
    let used_by_endpoints = &input.endpoints.ids;
    let mut unused: Vec<UnusedIdentity> = input
        .identities
        .iter()
        .filter(|i| !adopted_ids.contains(&i.id) && !used_by_endpoints.contains(&i.id))
        .map(|i| UnusedIdentity {
            id: i.id,
            run: i.run.clone(),
            labels: canonical_key(&i.labels),
        })
        .collect();
    unused.sort_by_key(|u| u.id);
    counts.unused_identities = unused.len();
    counts.unreserved_identities = input
        .identities
        .iter()
        .filter(|i| !adopted_ids.contains(&i.id))
        .count();
    let range = f64::from(input.range.len().max(1));
    let draws = counts.label_sets_drawn as f64;
    counts.expected_unused_rewritten = draws * counts.unused_identities as f64 / range;
    counts.expected_live_taken_over_at_most = draws * adopted_ids.len() as f64 / range;
    pods.sort_by(|a, b| a.pod.cmp(&b.pod));
    SwitchReport {
        rules: RULES,
        releases: RELEASES,
        settings: input.settings.shown.clone(),
        counts,
        pods,
        unused,
    }
}

#[cfg(test)]
pub(crate) mod tests;
