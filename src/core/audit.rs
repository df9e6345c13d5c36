//! The audit of both identity stores, by labels: what the kvstore and Kubernetes disagree on
//! (one id with two label sets, one label set under different ids), what one store holds
//! twice, what only one side has, `value/` keys that point at an id holding other labels, and
//! objects the operator's GC marked while something still uses them. Each finding names the
//! nodes and endpoints behind it and what to do. Cilium's own double-write modes copy what
//! agents use and its operator compares id sets only, so none of this is reported there.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::core::kvstore::{MasterEntry, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::range::IdRange;

/// A node's `value/<label key>/<node>` key and the id it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueKey {
    pub label_key: String,
    pub node: String,
    /// The value as written (an id, if the agent wrote one).
    pub id: String,
}

/// A `CiliumIdentity` as the audit sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditObject {
    pub id: u32,
    pub labels: LabelKey,
    /// Carries `io.cilium.heartbeat`: the operator's GC marked it for deletion.
    pub gc_marked: bool,
}

/// What the audit reads.
pub struct AuditInput<'a> {
    pub masters: &'a [MasterEntry],
    pub values: &'a [ValueKey],
    pub objects: &'a [AuditObject],
    /// Endpoints (`namespace/name`) by the identity they use; `None`: not known (the
    /// CiliumEndpoint CRD is not served).
    pub endpoints: Option<&'a BTreeMap<u32, Vec<String>>>,
    pub range: IdRange,
}

/// The kinds of finding, by their names in the JSON output and the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// One id, two label sets (the kvstore's and Kubernetes').
    Split,
    /// One label set, different ids on the two sides.
    Double,
    /// One label set under two ids in one store.
    Duplicate,
    /// An id only one side holds.
    OneSide,
    /// A `value/` key whose id holds other labels (or none).
    StaleValue,
    /// An object the operator's GC marked that something still uses.
    GcMarked,
}

impl FindingKind {
    pub const ALL: [FindingKind; 6] = [
        FindingKind::Split,
        FindingKind::Double,
        FindingKind::Duplicate,
        FindingKind::OneSide,
        FindingKind::StaleValue,
        FindingKind::GcMarked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Split => "split",
            FindingKind::Double => "double",
            FindingKind::Duplicate => "duplicate",
            FindingKind::OneSide => "one-side",
            FindingKind::StaleValue => "stale-value",
            FindingKind::GcMarked => "gc-marked",
        }
    }
}

/// Which store a finding is about, where it is about one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    Kvstore,
    Kubernetes,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub id: u32,
    pub labels: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub side: Option<Side>,
    /// The other side's (or the other copy's) id and labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_labels: Option<String>,
    /// Kvstore-mode nodes behind it (their `value/` keys).
    pub nodes: Vec<String>,
    /// CiliumEndpoints behind it (`namespace/name`).
    pub endpoints: Vec<String>,
    pub action: String,
}

/// Every finding, and how many of each kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    pub counts: BTreeMap<&'static str, usize>,
    pub findings: Vec<Finding>,
    /// Valid kvstore identities and objects read.
    pub kvstore_identities: usize,
    pub objects: usize,
    /// Kvstore entries that are no identity (malformed, out of range): not audited.
    pub invalid_ignored: usize,
    /// Findings a recorded decision explains (a remap, a reuse, a skip), each with the
    /// decision: shown, not counted, as `verify` counts them as done.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decided: Vec<Decided>,
}

/// A finding that a decision in a decision log explains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decided {
    #[serde(flatten)]
    pub finding: Finding,
    pub decision: String,
}

impl AuditReport {
    pub fn clean(&self) -> bool {
        self.findings.is_empty()
    }

    /// Moves the findings that recorded decisions explain out of the counts, as `verify`
    /// reads the same logs (a duplicate created at its own id by decision maps it to itself). `decisions` maps a kvstore id to the id it is served at (`None`:
    /// skipped) with the labels the decision was made for. A remap of kvstore id K (labels L)
    /// to T explains the split at K (Kubernetes kept its own labels there), the double of L
    /// (K in the kvstore, T in Kubernetes) and T in Kubernetes alone; a skip explains K's
    /// split or its being in the kvstore alone.
    pub fn explain_by_decisions(&mut self, decisions: &BTreeMap<u32, (Option<u32>, String)>) {
        let why = |f: &Finding| -> Option<String> {
            let decided = |k: u32| decisions.get(&k).filter(|(_, l)| l == &f.labels);
            match f.kind {
                FindingKind::Split | FindingKind::OneSide if f.side != Some(Side::Kubernetes) => {
                    decided(f.id).map(|(to, _)| match to {
                        Some(t) => {
                            format!("remapped by decision: kvstore {} is served at {t}", f.id)
                        }
                        None => format!("skipped by decision: kvstore {} is not migrated", f.id),
                    })
                }
                FindingKind::Double => {
                    decided(f.id).filter(|(to, _)| *to == f.other_id).map(|_| {
                        format!(
                            "remapped by decision: kvstore {} is served at {}",
                            f.id,
                            f.other_id.unwrap_or_default()
                        )
                    })
                }
                FindingKind::OneSide => decisions
                    .iter()
                    .find(|(_, (to, l))| *to == Some(f.id) && l == &f.labels)
                    .map(|(k, _)| format!("remapped by decision: serves kvstore {k}")),
                // A second object for these labels that a person chose to create at the
                // kvstore's own id, so kvstore-mode and CRD-mode nodes agree on it.
                FindingKind::Duplicate if f.side == Some(Side::Kubernetes) => [Some(f.id), f.other_id]
                    .into_iter()
                    .flatten()
                    .find(|k| decisions.get(k).is_some_and(|(to, l)| *to == Some(*k) && l == &f.labels))
                    .map(|k| format!("created by decision: the duplicate at its own id {k}, which kvstore-mode nodes use")),
                _ => None,
            }
        };
        let (mut kept, mut decided) = (Vec::new(), Vec::new());
        for f in std::mem::take(&mut self.findings) {
            match why(&f) {
                Some(decision) => decided.push(Decided {
                    finding: f,
                    decision,
                }),
                None => kept.push(f),
            }
        }
        for d in &decided {
            if let Some(n) = self.counts.get_mut(d.finding.kind.as_str()) {
                *n -= 1;
            }
        }
        self.findings = kept;
        self.decided = decided;
    }
}

/// What both stores hold, indexed for the rules.
struct Stores<'a> {
    kv: BTreeMap<u32, &'a str>,
    k8s: BTreeMap<u32, &'a AuditObject>,
    kv_by_labels: BTreeMap<&'a str, BTreeSet<u32>>,
    k8s_by_labels: BTreeMap<&'a str, BTreeSet<u32>>,
    /// The nodes whose `value/` key for a label set names an id: a node uses that id, not
    /// every id the kvstore holds those labels under.
    nodes_by_identity: BTreeMap<(&'a str, u32), BTreeSet<&'a str>>,
    endpoints: Option<&'a BTreeMap<u32, Vec<String>>>,
    /// Ids `sync --reserve-in-kvstore` holds in the kvstore (its own `value/` keys).
    reserved: BTreeSet<u32>,
}

impl<'a> Stores<'a> {
    /// The nodes using `labels` at any of `ids`.
    fn nodes(&self, labels: &str, ids: impl IntoIterator<Item = u32>) -> Vec<String> {
        let mut out: BTreeSet<&str> = BTreeSet::new();
        for id in ids {
            if let Some(n) = self.nodes_by_identity.get(&(labels, id)) {
                out.extend(n.iter().copied());
            }
        }
        out.into_iter().map(str::to_string).collect()
    }

    fn endpoints(&self, ids: impl IntoIterator<Item = u32>) -> Vec<String> {
        let Some(eps) = self.endpoints else {
            return Vec::new();
        };
        let mut out: Vec<String> = ids
            .into_iter()
            .filter_map(|id| eps.get(&id))
            .flatten()
            .cloned()
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// Audits both stores (see the module).
pub fn audit(input: &AuditInput) -> AuditReport {
    let mut report = AuditReport::default();
    let mut s = Stores {
        kv: BTreeMap::new(),
        k8s: BTreeMap::new(),
        kv_by_labels: BTreeMap::new(),
        k8s_by_labels: BTreeMap::new(),
        nodes_by_identity: BTreeMap::new(),
        endpoints: input.endpoints,
        reserved: input
            .values
            .iter()
            .filter(|v| v.node == crate::core::kvstore::RESERVATION_NODE)
            .filter_map(|v| v.id.parse().ok())
            .collect(),
    };
    for m in input.masters {
        match (parse_id(&m.id), valid_label_key(&m.value)) {
            (Ok(id), Ok(labels)) if input.range.contains(id) => {
                s.kv.insert(id, labels);
                s.kv_by_labels.entry(labels).or_default().insert(id);
            }
            _ => report.invalid_ignored += 1,
        }
    }
    for o in input.objects {
        s.k8s.insert(o.id, o);
        s.k8s_by_labels
            .entry(o.labels.as_str())
            .or_default()
            .insert(o.id);
    }
    for v in input.values {
        let Ok(id) = v.id.parse::<u32>() else {
            continue;
        };
        s.nodes_by_identity
            .entry((v.label_key.as_str(), id))
            .or_default()
            .insert(v.node.as_str());
    }
    report.kvstore_identities = s.kv.len();
    report.objects = s.k8s.len();
    let mut findings = Vec::new();
    splits_and_one_side(&s, &mut findings);
    doubles_and_duplicates(&s, &mut findings);
    stale_values(&s, input.values, &mut findings);
    gc_marked(&s, input.values, &mut findings);
    findings.sort_by(|a, b| (a.kind, a.id, &a.labels).cmp(&(b.kind, b.id, &b.labels)));
    for kind in FindingKind::ALL {
        report.counts.insert(kind.as_str(), 0);
    }
    for f in &findings {
        *report.counts.entry(f.kind.as_str()).or_default() += 1;
    }
    report.findings = findings;
    report
}

fn finding(kind: FindingKind, id: u32, labels: &str) -> Finding {
    Finding {
        kind,
        id,
        labels: labels.to_string(),
        side: None,
        other_id: None,
        other_labels: None,
        nodes: Vec::new(),
        endpoints: Vec::new(),
        action: String::new(),
    }
}

/// Names joined with commas, the first `shown` of them and then how many more; `none`
/// when there are none. Every list of nodes and endpoints the audit prints reads so.
pub fn names_list(names: &[String], shown: usize) -> String {
    match names.len() {
        0 => "none".into(),
        n if n <= shown => names.join(", "),
        n => format!("{} and {} more", names[..shown].join(", "), n - shown),
    }
}

/// As the findings' actions name nodes.
fn list(names: &[String]) -> String {
    names_list(names, 5)
}

/// Ids both sides hold for different labels, and ids only one side holds.
fn splits_and_one_side(s: &Stores, out: &mut Vec<Finding>) {
    for (&id, &kv_labels) in &s.kv {
        let nodes = s.nodes(kv_labels, [id]);
        match s.k8s.get(&id) {
            Some(o) if o.labels.as_str() == kv_labels => {}
            Some(o) => {
                let endpoints = s.endpoints([id]);
                let roll = if nodes.is_empty() {
                    "no kvstore-mode node uses the kvstore's labels now: nothing to roll; `sync` would close its remap as moot".to_string()
                } else {
                    format!(
                        "roll {} to CRD mode next (until then policy between them and CRD-mode nodes reads {id} as the wrong labels); `sync` proposes a remap of the kvstore's labels",
                        list(&nodes)
                    )
                };
                out.push(Finding {
                    other_labels: Some(o.labels.to_string()),
                    nodes,
                    endpoints,
                    action: roll,
                    ..finding(FindingKind::Split, id, kv_labels)
                });
            }
            None => {
                let elsewhere = s.k8s_by_labels.contains_key(kv_labels);
                let action = if elsewhere {
                    "its labels are in Kubernetes under another id (see its double)".to_string()
                } else if nodes.is_empty() {
                    format!(
                        "no node uses it now; `sync` or `apply` would create {id} in Kubernetes"
                    )
                } else {
                    format!(
                        "`sync` or `apply` would create {id} in Kubernetes, so that CRD-mode nodes agree with {}",
                        list(&nodes)
                    )
                };
                out.push(Finding {
                    side: Some(Side::Kvstore),
                    nodes,
                    action,
                    ..finding(FindingKind::OneSide, id, kv_labels)
                });
            }
        }
    }
    for (&id, o) in &s.k8s {
        if s.kv.contains_key(&id) {
            continue;
        }
        let endpoints = s.endpoints([id]);
        out.push(Finding {
            side: Some(Side::Kubernetes),
            action: "a kvstore-mode agent can hand this id out for other labels: `sync --reserve-in-kvstore` reserves it in the kvstore".into(),
            endpoints,
            ..finding(FindingKind::OneSide, id, &o.labels)
        });
    }
}

/// One label set under different ids on the two sides, or twice in one store.
fn doubles_and_duplicates(s: &Stores, out: &mut Vec<Finding>) {
    for (&labels, kv_ids) in &s.kv_by_labels {
        let k8s_ids = s.k8s_by_labels.get(labels);
        if let Some(k8s_ids) = k8s_ids
            && kv_ids.is_disjoint(k8s_ids)
        {
            let (k, c) = (first(kv_ids), first(k8s_ids));
            let nodes = s.nodes(labels, kv_ids.iter().copied());
            let endpoints = s.endpoints(k8s_ids.iter().copied());
            out.push(Finding {
                other_id: Some(c),
                nodes: nodes.clone(),
                endpoints,
                action: if nodes.is_empty() {
                    format!(
                        "no kvstore-mode node uses {k} now; pods on CRD-mode nodes get {c}: nothing to roll, and {k} goes with Cilium's kvstore GC"
                    )
                } else {
                    format!(
                        "pods on kvstore-mode nodes ({}) get {k}, pods on CRD-mode nodes get {c}: policy that selects these labels sees two ids. Roll those nodes next and restart their pods with these labels, so they take {c}",
                        list(&nodes)
                    )
                },
                ..finding(FindingKind::Double, k, labels)
            });
        }
        if kv_ids.len() > 1 {
            let ids: Vec<u32> = kv_ids.iter().copied().collect();
            let listed = ids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let reserved: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|id| s.reserved.contains(id))
                .collect();
            let action = match reserved.as_slice() {
                [] => format!(
                    "the kvstore holds these labels at {listed}: agents reuse whichever their cache finds first; the unused ones go with Cilium's kvstore GC"
                ),
                r => format!(
                    "the kvstore holds these labels at {listed}, {} of them `sync --reserve-in-kvstore`'s reservation of the id Kubernetes holds for them: by design, released at cutover; nothing to do",
                    r.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                ),
            };
            out.push(Finding {
                side: Some(Side::Kvstore),
                other_id: ids.get(1).copied(),
                nodes: s.nodes(labels, ids.iter().copied()),
                action,
                ..finding(FindingKind::Duplicate, ids[0], labels)
            });
        }
    }
    for (&labels, k8s_ids) in &s.k8s_by_labels {
        if k8s_ids.len() < 2 {
            continue;
        }
        let ids: Vec<u32> = k8s_ids.iter().copied().collect();
        out.push(Finding {
            side: Some(Side::Kubernetes),
            other_id: ids.get(1).copied(),
            endpoints: s.endpoints(ids.iter().copied()),
            action: format!(
                "Kubernetes holds these labels at {}: Cilium 1.18's agents use the oldest object (by creationTimestamp; 1.9's took any), and the operator's GC marks and deletes those no endpoint uses",
                ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
            ..finding(FindingKind::Duplicate, ids[0], labels)
        });
    }
}

fn first(ids: &BTreeSet<u32>) -> u32 {
    ids.iter().next().copied().unwrap_or_default()
}

/// `value/` keys whose id the kvstore holds for other labels, or not at all.
fn stale_values(s: &Stores, values: &[ValueKey], out: &mut Vec<Finding>) {
    for v in values {
        let Ok(id) = v.id.parse::<u32>() else {
            continue;
        };
        let holds = s.kv.get(&id).copied();
        if holds == Some(v.label_key.as_str()) {
            continue;
        }
        let what = holds.map_or("nothing".to_string(), str::to_string);
        out.push(Finding {
            side: Some(Side::Kvstore),
            other_labels: holds.map(str::to_string),
            nodes: vec![v.node.clone()],
            action: format!(
                "node {} tags these labels with {id}, which the kvstore holds for {what}: restart the pods with these labels on {} (or the agent) so they allocate again",
                v.node, v.node
            ),
            ..finding(FindingKind::StaleValue, id, &v.label_key)
        });
    }
}

/// Objects the operator's GC marked (`io.cilium.heartbeat`) while kvstore-mode nodes or
/// endpoints still use them: they would be deleted under their users.
fn gc_marked(s: &Stores, values: &[ValueKey], out: &mut Vec<Finding>) {
    let used_ids: BTreeSet<u32> = values.iter().filter_map(|v| v.id.parse().ok()).collect();
    for (&id, o) in &s.k8s {
        if !o.gc_marked {
            continue;
        }
        let nodes = s.nodes(&o.labels, [id]);
        let endpoints = s.endpoints([id]);
        if nodes.is_empty() && endpoints.is_empty() && !used_ids.contains(&id) {
            continue;
        }
        out.push(Finding {
            side: Some(Side::Kubernetes),
            action: format!(
                "the operator's GC will delete it while {} use it (CRD-mode agents take it back only when they allocate again): keep it, e.g. let an agent that uses it remove the mark, or roll those nodes first",
                if nodes.is_empty() {
                    "endpoints".to_string()
                } else {
                    format!("kvstore-mode nodes {}", list(&nodes))
                }
            ),
            nodes,
            endpoints,
            ..finding(FindingKind::GcMarked, id, &o.labels)
        });
    }
}

#[cfg(test)]
mod tests;
