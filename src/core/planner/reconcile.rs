//! Re-validates a plan's decisions (possibly edited by hand) against the live state and turns
//! them into the operations apply will carry out. Pure: no IO.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

use super::decision::DecidedBy;
use super::item::{Action, Kind, PlanItem};
use crate::core::labels::{LabelKey, parse_label_key};
use crate::core::range::IdRange;

/// What apply does for one identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    /// POST a new `CiliumIdentity` at the target id.
    Create,
    /// The target already holds exactly these labels: nothing to write.
    AlreadyDone,
    /// Served by another id that holds (or will hold) these labels: nothing to write.
    Map,
    /// The operator (or the rules) chose not to migrate it.
    Skip,
    /// Rollback: DELETE the object this tool created, only if it is still that object
    /// (uid and resourceVersion preconditions).
    Delete,
    /// Rollback: leave the object alone (`reason` says why).
    Keep,
}

impl OpKind {
    /// Whether the operation sends a write to the API server.
    pub fn writes(self) -> bool {
        matches!(self, OpKind::Create | OpKind::Delete)
    }
}

/// One operation of an apply, with everything the decision log needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub id: String,
    /// The canonical label key: what is compared, and what the create sends as `security-labels`.
    pub label_key: LabelKey,
    pub kind: Kind,
    pub op: OpKind,
    pub target_id: Option<u32>,
    /// How the decision was reached.
    pub decided_by: DecidedBy,
    /// For a delete: the uid and resourceVersion the object must still have.
    pub expect: Option<(String, String)>,
    /// For a keep: why.
    pub reason: Option<String>,
}

/// Why one item of a plan cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileError {
    pub id: String,
    pub reason: String,
}

impl std::fmt::Display for ReconcileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "item {}: {}", self.id, self.reason)
    }
}

/// The outcome of reconciling: operations, plus what changed in the kvstore since the plan.
#[derive(Debug, Clone, Default)]
pub struct Reconciled {
    pub ops: Vec<Op>,
    /// Kvstore identities the plan has no item for (they appeared after it was made, or their
    /// item was taken out by hand): left alone.
    pub not_in_plan: Vec<String>,
    /// Plan items whose identity is no longer in the kvstore: left alone.
    pub gone_from_kvstore: Vec<String>,
}

/// Checks every decision against the live plan and Kubernetes, and returns the operations,
/// or every reason an item is refused (nothing is applied unless all items pass).
pub fn reconcile(
    decisions: &[PlanItem],
    live: &[PlanItem],
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
    accept_proposals: bool,
) -> Result<Reconciled, Vec<ReconcileError>> {
    let (mut out, from) = reconcile_indexed(Some(decisions), live, k8s, range, accept_proposals)?;
    for (op, &i) in out.ops.iter_mut().zip(&from) {
        op.label_key = live[i].labels.clone();
    }
    Ok(out)
}

/// `reconcile` that moves each live item's label key into its operation instead of copying
/// it (a large apply's re-read need not hold the label keys twice); `decisions` `None` takes
/// the live plan's own proposals.
pub fn reconcile_taking(
    decisions: Option<&[PlanItem]>,
    live: Vec<PlanItem>,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
    accept_proposals: bool,
) -> Result<Reconciled, Vec<ReconcileError>> {
    let (mut out, from) = reconcile_indexed(decisions, &live, k8s, range, accept_proposals)?;
    let mut labels: Vec<String> = live.into_iter().map(|l| l.labels).collect();
    // Each live item backs at most one operation (a decision's id appears once).
    for (op, &i) in out.ops.iter_mut().zip(&from) {
        op.label_key = std::mem::take(&mut labels[i]);
    }
    Ok(out)
}

/// The operations with their label keys left empty, and for each the index of the live item
/// it comes from (whose label key it carries); the kvstore's ids are those of `live`.
fn reconcile_indexed(
    decisions: Option<&[PlanItem]>,
    live: &[PlanItem],
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
    accept_proposals: bool,
) -> Result<(Reconciled, Vec<usize>), Vec<ReconcileError>> {
    let kv_ids: HashSet<u32> = live.iter().filter_map(|i| i.numeric_id()).collect();
    let among = Among {
        is_kv_id: &|t| kv_ids.contains(&t),
    };
    reconcile_among(decisions, live, k8s, range, accept_proposals, among)
}

/// What a plan's items are among: which ids the kvstore holds. `live` may be part of the
/// plan only (sync resuming decisions onto the items they touch), so the kvstore's ids are
/// asked of the whole.
#[derive(Clone, Copy)]
pub struct Among<'a> {
    pub is_kv_id: &'a dyn Fn(u32) -> bool,
}

/// `reconcile` of `decisions` against `live`, with the kvstore's ids from `among`: the
/// operations with their label keys left empty, and for each the index of the live item it
/// comes from (whose label key it carries).
pub fn reconcile_among(
    decisions: Option<&[PlanItem]>,
    live: &[PlanItem],
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
    accept_proposals: bool,
    among: Among<'_>,
) -> Result<(Reconciled, Vec<usize>), Vec<ReconcileError>> {
    let mut out = Reconciled::default();
    let mut from: Vec<usize> = Vec::new();
    let mut errors = Vec::new();
    // Each decision with the index of its live item.
    let mut decided: Vec<(&PlanItem, usize)> = Vec::new();
    match decisions {
        // No saved plan and nothing resumed: each live item is its own decision, and every
        // one is in the plan. No index by id is needed (at 65,280 items the three would be
        // 9 MiB of a rerun's peak).
        None => decided.extend(live.iter().enumerate().map(|(n, item)| (item, n))),
        Some(decisions) => {
            let live_by_id: HashMap<&str, usize> = live
                .iter()
                .enumerate()
                .map(|(n, i)| (i.id.as_str(), n))
                .collect();
            let mut seen: HashSet<&str> = HashSet::new();
            for d in decisions {
                if !seen.insert(d.id.as_str()) {
                    errors.push(err(&d.id, "appears twice in the plan"));
                    continue;
                }
                let Some(&n) = live_by_id.get(d.id.as_str()) else {
                    out.gone_from_kvstore.push(d.id.clone());
                    continue;
                };
                decided.push((d, n));
            }
            out.not_in_plan = live
                .iter()
                .filter(|l| !seen.contains(l.id.as_str()))
                .map(|l| l.id.clone())
                .collect();
        }
    }
    for (d, n) in decided {
        match decide(d, &live[n], k8s, range, among.is_kv_id, accept_proposals) {
            Ok(op) => {
                out.ops.push(op);
                from.push(n);
            }
            Err(reason) => errors.push(err(&d.id, &reason)),
        }
    }
    let labels_of = |k: usize| live[from[k]].labels.as_str();

    cross_check(&out.ops, &labels_of, k8s, &mut errors);
    if errors.is_empty() {
        Ok((out, from))
    } else {
        errors.sort_by(|a, b| a.id.cmp(&b.id).then(a.reason.cmp(&b.reason)));
        Err(errors)
    }
}

/// What no single decision shows: no two creates may claim one id, and a mapping must land
/// on labels that Kubernetes holds there or that this plan creates there.
fn cross_check<'a>(
    ops: &[Op],
    labels_of: &dyn Fn(usize) -> &'a str,
    k8s: &BTreeMap<u32, LabelKey>,
    errors: &mut Vec<ReconcileError>,
) {
    // No two creates may claim one id.
    let mut creates: HashMap<u32, Vec<usize>> = HashMap::new();
    for (k, op) in ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.op == OpKind::Create)
    {
        if let Some(t) = op.target_id {
            creates.entry(t).or_default().push(k);
        }
    }
    for (t, ks) in &creates {
        if ks.len() > 1 {
            let ops: Vec<&Op> = ks.iter().map(|&k| &ops[k]).collect();
            let ids: Vec<&str> = ops.iter().map(|o| o.id.as_str()).collect();
            for op in ops {
                errors.push(err(
                    &op.id,
                    &format!(
                        "id {t} is the target of more than one create ({})",
                        ids.join(", ")
                    ),
                ));
            }
        }
    }
    // A mapping must land on labels that exist in Kubernetes or that this plan creates.
    for (k, op) in ops.iter().enumerate().filter(|(_, o)| o.op == OpKind::Map) {
        let Some(t) = op.target_id else { continue };
        let labels = labels_of(k);
        let served = k8s.get(&t).is_some_and(|l| l == labels)
            || creates
                .get(&t)
                .is_some_and(|c| c.iter().any(|&c| labels_of(c) == labels));
        if !served {
            errors.push(err(
                &op.id,
                &format!("maps to id {t}, but id {t} does not hold these labels in Kubernetes and the plan creates nothing with them there"),
            ));
        }
    }
}

fn err(id: &str, reason: &str) -> ReconcileError {
    ReconcileError {
        id: id.to_string(),
        reason: reason.to_string(),
    }
}

fn decide(
    d: &PlanItem,
    l: &PlanItem,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
    is_kv_id: &dyn Fn(u32) -> bool,
    accept_proposals: bool,
) -> Result<Op, String> {
    if d.labels != l.labels {
        return Err(format!(
            "labels in the plan ({:?}) differ from the kvstore now ({:?}); make a new plan",
            d.labels, l.labels
        ));
    }
    let mut op = Op {
        id: l.id.clone(),
        // Filled in by the caller, by copy or by move.
        label_key: String::new(),
        kind: l.kind,
        op: OpKind::Skip,
        target_id: None,
        decided_by: DecidedBy::of(d, l, accept_proposals),
        expect: None,
        reason: None,
    };
    if !kind_may_have_become(d.kind, l.kind) {
        return Err(format!(
            "the plan says it is a {}, but it is a {} now: a kind is what the tool found, not a choice. If the plan was edited, put the kind back; if the cluster changed since the plan, make a new plan",
            d.kind, l.kind
        ));
    }
    if l.kind == Kind::Invalid {
        if d.action != Action::Skip {
            return Err(format!("is invalid and is never written ({})", l.reason));
        }
        return Ok(op);
    }
    let own = l
        .numeric_id()
        .ok_or_else(|| "has no numeric id".to_string())?;
    parse_label_key(&l.labels).map_err(|e| format!("labels do not parse: {e}"))?;
    match d.action {
        Action::Skip => Ok(op),
        Action::None => {
            let t = d.target_id.unwrap_or(own);
            op.target_id = Some(t);
            if t == own {
                if k8s.get(&own) == Some(&l.labels) {
                    op.op = OpKind::AlreadyDone;
                    return Ok(op);
                }
                return Err(format!(
                    "action none at its own id {own}, but Kubernetes does not hold these labels there; use create or skip"
                ));
            }
            // Whether t really serves these labels is checked once all creates are known.
            op.op = OpKind::Map;
            Ok(op)
        }
        Action::Create => {
            let t = d.target_id.unwrap_or(own);
            op.target_id = Some(t);
            may_move(own, t, &l.labels, k8s.get(&own))?;
            if check_create_target(own, t, &l.labels, range, is_kv_id, k8s.get(&t))? {
                op.op = OpKind::AlreadyDone;
                return Ok(op);
            }
            if l.kind.needs_decision() && !d.decided && !accept_proposals {
                return Err(format!(
                    "is a {} and needs a decision: decide it in the TUI or in a plan (\"decided\": true), or pass --accept-proposals",
                    l.kind
                ));
            }
            op.op = OpKind::Create;
            Ok(op)
        }
    }
}

/// Whether an item the plan calls `planned` may be `live` now without a hand edit: what
/// applying the plan itself changes (a create now in Kubernetes, a remap's labels now at
/// their new id), or nothing.
fn kind_may_have_become(planned: Kind, live: Kind) -> bool {
    planned == live
        || matches!(
            (planned, live),
            (Kind::Create | Kind::Duplicate, Kind::AlreadyMigrated) | (Kind::Remap, Kind::Reuse)
        )
}

/// Checks that kvstore identity `own` may be created at another id `t` at all: only a remap
/// may, when Kubernetes holds `own` for other labels. Anywhere else, kvstore-mode nodes keep
/// tagging the traffic as `own` while CRD-mode nodes would see `t`, and where `own` already
/// holds these labels a second object with them would be a duplicate nobody decided.
pub fn may_move(
    own: u32,
    t: u32,
    labels: &str,
    k8s_at_own: Option<&LabelKey>,
) -> Result<(), String> {
    if t == own || k8s_at_own.is_some_and(|l| l.as_str() != labels) {
        return Ok(());
    }
    let at_own = match k8s_at_own {
        Some(_) => "Kubernetes already holds these labels there",
        None => "that id is free in Kubernetes",
    };
    Err(format!(
        "is created at its own id {own} ({at_own}); only a remap, whose id Kubernetes holds for other labels, may take another id such as {t}, since kvstore-mode nodes keep tagging this traffic as {own}. Set its target_id back to {own}, or skip it"
    ))
}

/// Checks that kvstore identity `own` may be created at `t`: in range, not another kvstore
/// identity's id, and not taken in Kubernetes by other labels. `Ok(true)` when `t` already
/// holds exactly these labels (nothing to write).
pub fn check_create_target(
    own: u32,
    t: u32,
    labels: &str,
    range: IdRange,
    is_kv_id: &dyn Fn(u32) -> bool,
    k8s_at_t: Option<&LabelKey>,
) -> Result<bool, String> {
    if !range.contains(t) {
        return Err(format!(
            "target id {t} is outside the allocation range {range}"
        ));
    }
    if t != own && is_kv_id(t) {
        return Err(format!(
            "target id {t} belongs to another kvstore identity (the kvstore's id/{t}): an agent in kvstore mode may be given it at any time"
        ));
    }
    match k8s_at_t {
        Some(existing) if existing.as_str() == labels => Ok(true),
        Some(_) => Err(format!(
            "target id {t} is taken in Kubernetes by other labels; it is never overwritten"
        )),
        None => Ok(false),
    }
}

/// Validates an operator's new target id for `items[index]` against the plan and Kubernetes:
/// the rules of `check_create_target`, and no other create in the plan may claim it.
pub fn validate_new_target(
    items: &[PlanItem],
    index: usize,
    t: u32,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> Result<(), String> {
    let item = items.get(index).ok_or("no such item")?;
    let own = item
        .numeric_id()
        .ok_or("an invalid item cannot be created")?;
    parse_label_key(&item.labels).map_err(|e| format!("labels do not parse: {e}"))?;
    let labels = item.labels.as_str();
    may_move(own, t, labels, k8s.get(&own))?;
    let kv_ids: HashSet<u32> = items.iter().filter_map(|i| i.numeric_id()).collect();
    check_create_target(own, t, labels, range, &|n| kv_ids.contains(&n), k8s.get(&t))?;
    if let Some((_, other)) = items
        .iter()
        .enumerate()
        .find(|(j, i)| *j != index && i.action == Action::Create && i.target_id == Some(t))
    {
        return Err(format!(
            "id {t} is already the target of identity {}",
            other.id
        ));
    }
    Ok(())
}
