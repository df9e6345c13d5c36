//! Preparing the switch so that it draws nothing: for each label set the operator will
//! compute that no identity holds exactly, an identity created beforehand at an id nothing
//! holds (no identity, no endpoint, no kvstore key, which sync's reservations are); for each
//! duplicate label set whose extra identities are this tool's, the one the endpoints use kept
//! and the others removed; and, when the operator asks, this tool's identities nothing uses
//! removed after a grace. Identities this tool did not create are never touched: what to do
//! with them is said.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::core::labels::SecurityLabels;
use crate::core::range::IdRange;
use crate::core::switch::report::{ExistingIdentity, Outcome, SwitchReport, difference_text};

/// An identity to create before the switch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PreparedCreate {
    pub id: u32,
    pub labels: SecurityLabels,
    /// The pods that will adopt it.
    pub pods: Vec<String>,
    /// Why the operator would otherwise draw (`re-minted: ...`, `no identity`).
    pub because: String,
}

/// Why one of this tool's identities goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemovalOf {
    /// Another identity holds its labels and is kept.
    Duplicate,
    /// No pod and no endpoint uses it (`--remove-unused-after`).
    Unused,
}

impl RemovalOf {
    /// Its kind of decision in the decision log.
    pub fn kind(self) -> crate::core::planner::Kind {
        match self {
            RemovalOf::Duplicate => crate::core::planner::Kind::SwitchRemoveDuplicate,
            RemovalOf::Unused => crate::core::planner::Kind::SwitchRemoveUnused,
        }
    }
}

/// One of this tool's identities to remove, exactly as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PreparedRemoval {
    pub id: u32,
    pub of: RemovalOf,
    pub labels: SecurityLabels,
    #[serde(skip)]
    pub uid: String,
    #[serde(skip)]
    pub resource_version: String,
    pub why: String,
}

/// What the operator asked of the preparation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrepareOptions {
    /// Remove this tool's identities no pod and no endpoint uses, once created at least this
    /// many seconds before `now`; also the grace of this tool's duplicates (else
    /// `DUPLICATE_GRACE`).
    pub remove_unused_after: Option<i64>,
    /// Seconds since the epoch.
    pub now: i64,
    /// No endpoint could be read: any identity may be in use, so none is removed.
    pub endpoints_unknown: bool,
}

/// How long a duplicate this tool created is kept at least, when the operator named no
/// grace: an agent in CRD mode may have just taken it, its endpoint not written yet. Two
/// heartbeat timeouts, as Cilium's identity GC waits.
pub const DUPLICATE_GRACE: i64 = 3600;

/// The preparation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PreparePlan {
    pub creates: Vec<PreparedCreate>,
    pub removals: Vec<PreparedRemoval>,
    /// What this tool will not do, and what the operator may do instead.
    pub advice: Vec<String>,
    /// Label sets left without an identity because the range has no free id.
    pub no_free_id: usize,
    /// Nodes whose agents still allocate from the kvstore (they hold `value/` keys): nothing
    /// is written while there is one.
    pub kvstore_nodes: Vec<String>,
}

impl PreparePlan {
    pub fn is_empty(&self) -> bool {
        self.creates.is_empty() && self.removals.is_empty()
    }

    /// Why nothing may be written now: an agent still on the kvstore draws ids there at any
    /// moment, and this tool does not write the kvstore to hold its ids against it (only
    /// sync does, when asked). The operator's controller runs only once every agent is in
    /// CRD mode; so does this.
    pub fn refuse_while_agents_on_kvstore(&self) -> Option<String> {
        self.refusal_with(&self.kvstore_nodes)
    }

    /// The refusal while `nodes` allocate from the kvstore, for a plan that writes.
    fn refusal_with(&self, nodes: &[String]) -> Option<String> {
        (!nodes.is_empty() && !self.is_empty()).then(|| {
            format!(
                "{} from the kvstore ({}): an agent there may draw any id between this read and a create, so nothing is written while one does; move every agent to CRD mode (identity-allocation-mode: crd; `sync` reaches cutover when none is left), then run switch-prepare again",
                still_allocating(nodes.len()),
                crate::core::audit::names_list(nodes, 5)
            )
        })
    }

    /// Why the kvstore, read again just before the writes, forbids them: an agent came to
    /// allocate there, or an id to create was taken there since the plan was made.
    pub fn kvstore_moved(&self, now: &KvstoreHolds) -> Option<String> {
        let nodes: Vec<String> = now.nodes.iter().cloned().collect();
        if let Some(why) = self.refusal_with(&nodes) {
            return Some(why);
        }
        let taken: Vec<u32> = self
            .creates
            .iter()
            .map(|c| c.id)
            .filter(|id| now.ids.contains(id))
            .collect();
        (!taken.is_empty()).then(|| {
            format!(
                "the kvstore took {} after the plan was made: nothing was written; run switch-prepare again for other ids",
                join(&taken)
            )
        })
    }
}

/// `1 node still allocates`, `2 nodes still allocate`.
pub fn still_allocating(nodes: usize) -> String {
    let verb = if nodes == 1 { "allocates" } else { "allocate" };
    format!("{} still {verb}", crate::core::words::count(nodes, "node"))
}

/// What the kvstore holds now: ids (`id/` keys, sync's reservations among them, and the ids
/// `value/` keys name) and the nodes whose agents still allocate there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvstoreHolds {
    pub ids: BTreeSet<u32>,
    pub nodes: BTreeSet<String>,
}

/// What the preparation reads besides the report.
pub struct PrepareInput<'a> {
    pub report: &'a SwitchReport,
    pub identities: &'a [ExistingIdentity],
    /// What the kvstore holds.
    pub kvstore: &'a KvstoreHolds,
    /// Ids `CiliumEndpoint`s use, those of pods gone or not yet listed too.
    pub endpoint_ids: &'a BTreeSet<u32>,
    pub range: IdRange,
    pub options: PrepareOptions,
}

/// The ids nothing holds, from the top of the range down: the agents and Cilium's allocators
/// draw at random, and the top is where the fewest sequential tools look.
fn free_ids<'a>(taken: &'a BTreeSet<u32>, range: IdRange) -> impl Iterator<Item = u32> + 'a {
    (range.min..=range.max)
        .rev()
        .filter(|id| !taken.contains(id))
}

fn because(outcome: &Outcome) -> String {
    match outcome {
        Outcome::ReMinted {
            nearest,
            lacks,
            extra,
        } => format!(
            "re-minted: the nearest identity {nearest} {}",
            difference_text(lacks, extra)
        ),
        _ => "no identity has these labels".to_string(),
    }
}

/// The preparation for this report.
pub fn prepare(input: &PrepareInput) -> PreparePlan {
    let by_id: BTreeMap<u32, &ExistingIdentity> =
        input.identities.iter().map(|i| (i.id, i)).collect();
    let endpoint_ids = input.endpoint_ids;
    let mut taken: BTreeSet<u32> = by_id.keys().copied().collect();
    taken.extend(endpoint_ids);
    taken.extend(&input.kvstore.ids);
    let mut plan = PreparePlan {
        kvstore_nodes: input.kvstore.nodes.iter().cloned().collect(),
        ..PreparePlan::default()
    };

    // One create per label set, in label order, with the pods that will adopt it.
    let mut drawn: BTreeMap<&SecurityLabels, (String, Vec<String>)> = BTreeMap::new();
    let mut duplicates: BTreeMap<&SecurityLabels, &Outcome> = BTreeMap::new();
    for p in &input.report.pods {
        if p.outcome.draws() {
            drawn
                .entry(&p.labels)
                .or_insert_with(|| (because(&p.outcome), Vec::new()))
                .1
                .push(p.pod.clone());
        } else if matches!(p.outcome, Outcome::Duplicate { .. }) {
            duplicates.insert(&p.labels, &p.outcome);
        }
    }
    let mut free = free_ids(&taken, input.range);
    for (labels, (because, pods)) in drawn {
        match free.next() {
            Some(id) => plan.creates.push(PreparedCreate {
                id,
                labels: labels.clone(),
                pods,
                because,
            }),
            None => plan.no_free_id += 1,
        }
    }

    if input.options.endpoints_unknown {
        plan.advice.push(
            "no endpoint could be read (neither CiliumEndpoints nor CiliumEndpointSlices are served): nothing is removed, duplicates and unused identities alike".into(),
        );
        return plan;
    }
    let mut removed: BTreeSet<u32> = BTreeSet::new();
    for (labels, outcome) in duplicates {
        let Outcome::Duplicate {
            ids, agents_pick, ..
        } = outcome
        else {
            continue;
        };
        settle_duplicate(
            labels,
            ids,
            *agents_pick,
            endpoint_ids,
            &by_id,
            &mut plan,
            &mut removed,
        );
    }

    if input.options.remove_unused_after.is_some() {
        for u in &input.report.unused {
            let Some(i) = by_id.get(&u.id) else { continue };
            if i.run.is_none() || removed.contains(&i.id) {
                continue;
            }
            plan.removals.push(removal(
                i,
                RemovalOf::Unused,
                format!(
                    "this tool created it ({}) and no pod or endpoint uses it",
                    i.run.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    hold_back(&mut plan, input, &by_id);
    let theirs = input
        .report
        .unused
        .iter()
        .filter(|u| u.run.is_none())
        .count();
    if theirs > 0 {
        plan.advice.push(format!(
            "{theirs} unused identities were not created by this tool: left alone; Cilium's identity GC deletes them once no endpoint has used them for two heartbeat timeouts (30 min each by default)"
        ));
    }
    plan
}

/// Removals not made now, each said: of an id the kvstore holds while an agent still
/// allocates there (it may take the id again by its labels, and a CRD-mode agent would then
/// draw it anew), or of an identity younger than the grace (an agent may have just taken
/// it, its endpoint not written yet).
fn hold_back(
    plan: &mut PreparePlan,
    input: &PrepareInput,
    by_id: &BTreeMap<u32, &ExistingIdentity>,
) {
    let opts = input.options;
    let agents_on_kvstore = !input.kvstore.nodes.is_empty();
    let (mut kvstore_held, mut young) = (Vec::new(), Vec::new());
    plan.removals.retain(|r| {
        if agents_on_kvstore && input.kvstore.ids.contains(&r.id) {
            kvstore_held.push(r.id);
            return false;
        }
        let grace = match r.of {
            RemovalOf::Duplicate => opts.remove_unused_after.unwrap_or(DUPLICATE_GRACE),
            RemovalOf::Unused => opts.remove_unused_after.unwrap_or(i64::MAX),
        };
        let created = by_id.get(&r.id).map_or(opts.now, |i| i.created);
        if opts.now.saturating_sub(created) < grace {
            young.push(r.id);
            return false;
        }
        true
    });
    if !kvstore_held.is_empty() {
        plan.advice.push(format!(
            "identities {} are kept while agents still allocate from the kvstore, which holds their ids: remove them once every agent is in CRD mode",
            join(&kvstore_held)
        ));
    }
    if !young.is_empty() {
        plan.advice.push(format!(
            "identities {} are younger than the grace ({}): kept, since an agent may have just taken one; run again later, or pass a shorter --remove-unused-after",
            join(&young),
            grace_text(opts.remove_unused_after)
        ));
    }
}

fn grace_text(asked: Option<i64>) -> String {
    match asked {
        Some(s) => format!("{s} s, --remove-unused-after"),
        None => format!("{DUPLICATE_GRACE} s for a duplicate"),
    }
}

fn removal(i: &ExistingIdentity, of: RemovalOf, why: String) -> PreparedRemoval {
    PreparedRemoval {
        id: i.id,
        of,
        labels: i.labels.clone(),
        uid: i.uid.clone(),
        resource_version: i.resource_version.clone(),
        why,
    }
}

/// Two or more identities with one label set: the one the endpoints use is kept (else the
/// one the agents take, the oldest), this tool's others are removed, and the rest is said.
fn settle_duplicate(
    labels: &SecurityLabels,
    ids: &[u32],
    agents_pick: u32,
    endpoint_ids: &BTreeSet<u32>,
    by_id: &BTreeMap<u32, &ExistingIdentity>,
    plan: &mut PreparePlan,
    removed: &mut BTreeSet<u32>,
) {
    let used: Vec<u32> = ids
        .iter()
        .copied()
        .filter(|id| endpoint_ids.contains(id))
        .collect();
    let key = crate::core::labels::canonical_key(labels);
    let keep = match used.as_slice() {
        [] => agents_pick,
        [one] => *one,
        _ => {
            plan.advice.push(format!(
                "identities {} hold {key} and endpoints use {}: the operator will take one of them, and the endpoints of the others move to it when their pods are handled; nothing is removed",
                join(ids),
                join(&used)
            ));
            return;
        }
    };
    let mut theirs = Vec::new();
    for id in ids.iter().copied().filter(|id| *id != keep) {
        match by_id.get(&id) {
            Some(i) if i.run.is_some() => {
                removed.insert(id);
                plan.removals.push(removal(
                    i,
                    RemovalOf::Duplicate,
                    format!(
                        "a duplicate of {keep} ({key}), which is kept: {}",
                        if used.is_empty() {
                            "the agents take it (the oldest)"
                        } else {
                            "its endpoints use it"
                        }
                    ),
                ));
            }
            _ => theirs.push(id),
        }
    }
    if !theirs.is_empty() {
        plan.advice.push(format!(
            "identities {} hold {key} as {keep} does, and this tool did not create them: the operator may take any one of them (its pick can change at a restart) while the agents take {agents_pick}; if it takes another than {keep}, the pods on {keep} move to it. Remove them yourself once nothing uses them, or leave them to Cilium's identity GC",
            join(&theirs)
        ));
    }
}

fn join(ids: &[u32]) -> String {
    ids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
