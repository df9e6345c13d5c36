//! Resuming decisions recorded in decision logs: reading each line's decision back, replaying
//! decisions and undos in order, and re-applying what is left to a fresh plan with the same
//! rules as a hand-edited plan. Those that no longer fit are dropped, each with why. Pure.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashSet, HashSetExt};

use super::decision::DecidedBy;
use super::item::{Action, Kind, PlanItem};
use super::reconcile::{Among, reconcile_among};
use crate::core::labels::LabelKey;
use crate::core::range::IdRange;

/// A decision read back from a log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedDecision {
    pub id: String,
    /// The label key the decision was made on.
    pub labels: String,
    pub action: Action,
    pub target_id: Option<u32>,
}

/// What one log line means for a resume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogStep {
    Decide(LoggedDecision),
    /// The operator undid their last decision on this id (an `undo` line, as logs written
    /// before `undecided` record an undo).
    Undo {
        id: String,
    },
    /// No decision is in force on this id any more: it is back to its proposal, undecided
    /// (an undo that left nothing decided, a decision removed from a decisions file). An
    /// undo that brings back an earlier decision is logged as that decision instead, so each
    /// line states what is in force after it and a replay of any prefix of a log is exact.
    Undecided {
        id: String,
    },
}

/// Reads the `decision` text of a log line. The TUI writes `"<name> (<action> <target>)"`
/// (`describe`); apply writes `"<op> (<who>)"` before a write and with each outcome. Only a
/// person's decisions (or `--accept-proposals`) are resumed: a proposal taken as it is gets
/// proposed again by the fresh plan.
pub fn step_of(id: &str, labels: &str, decision: &str, target_id: Option<u32>) -> Option<LogStep> {
    let (name, rest) = decision.split_once(" (")?;
    let inner = rest.strip_suffix(')')?;
    let decide = |action, target_id: Option<u32>| {
        Some(LogStep::Decide(LoggedDecision {
            id: id.to_string(),
            labels: labels.to_string(),
            action,
            target_id: target_id.filter(|_| action != Action::Skip),
        }))
    };
    if let Some((action, target)) = inner.split_once(' ') {
        // The TUI's form.
        if name == "undo" {
            return Some(LogStep::Undo { id: id.to_string() });
        }
        let action = match action {
            "create" => Action::Create,
            "none" => Action::None,
            "skip" => Action::Skip,
            _ => return None,
        };
        let target = match target {
            "-" => None,
            t => Some(t.parse().ok()?),
        };
        return decide(action, target);
    }
    // Apply's form: only decisions a person made (or asked for with --accept-proposals).
    let person = [DecidedBy::Operator, DecidedBy::AcceptProposals]
        .iter()
        .any(|who| who.as_str() == inner);
    if !person {
        return None;
    }
    let action = match name {
        "create" => Action::Create,
        "map" | "none" => Action::None,
        "skip" => Action::Skip,
        _ => return None,
    };
    decide(action, target_id)
}

/// Reads a log line's structured decision: `decided_by` and `action`, the target being the
/// line's `target_id`. As with the text, only a person's decisions (or
/// `--accept-proposals`) are resumed, and `undo` takes back the last one.
pub fn step_of_fields(
    id: &str,
    labels: &str,
    decided_by: &str,
    action: &str,
    target_id: Option<u32>,
) -> Option<LogStep> {
    let person = [DecidedBy::Operator, DecidedBy::AcceptProposals]
        .iter()
        .any(|who| who.as_str() == decided_by);
    if !person {
        return None;
    }
    let action = match action {
        "undo" => return Some(LogStep::Undo { id: id.to_string() }),
        "undecided" => return Some(LogStep::Undecided { id: id.to_string() }),
        "create" => Action::Create,
        "map" | "none" => Action::None,
        "skip" => Action::Skip,
        _ => return None,
    };
    Some(LogStep::Decide(LoggedDecision {
        id: id.to_string(),
        labels: labels.to_string(),
        action,
        // A skip has no target (logs written before kept the proposal it did not take).
        target_id: target_id.filter(|_| action != Action::Skip),
    }))
}

/// The decision in force per id after replaying `steps` in order (an undo takes back the
/// last decision on its id).
pub fn replay(steps: impl IntoIterator<Item = LogStep>) -> BTreeMap<String, LoggedDecision> {
    replay_with(steps.into_iter().map(|s| (s, ())))
        .into_iter()
        .map(|(id, (d, ()))| (id, d))
        .collect()
}

/// `replay`, each step carrying `T` (the log line it came from): the decision in force per
/// id, with what its step carried.
///
/// A decision is logged more than once without being made again: apply and sync log it
/// before a write, again on a retry and again with its outcome. A line equal to the decision
/// already in force on its id is that same decision, not a new one to undo back to: were it
/// pushed, one `undo` would take back one copy and leave the undone decision in force.
/// `undecided` clears the id whatever came before.
pub fn replay_with<T>(
    steps: impl IntoIterator<Item = (LogStep, T)>,
) -> BTreeMap<String, (LoggedDecision, T)> {
    let mut stacks: BTreeMap<String, Vec<(LoggedDecision, T)>> = BTreeMap::new();
    for (step, tag) in steps {
        match step {
            LogStep::Decide(d) => {
                let stack = stacks.entry(d.id.clone()).or_default();
                match stack.last_mut() {
                    // The same decision again: the newest line stands for it.
                    Some(top) if top.0 == d => *top = (d, tag),
                    _ => stack.push((d, tag)),
                }
            }
            LogStep::Undo { id } => {
                if let Some(s) = stacks.get_mut(&id) {
                    s.pop();
                }
            }
            LogStep::Undecided { id } => {
                stacks.remove(&id);
            }
        }
    }
    stacks
        .into_iter()
        .filter_map(|(id, mut s)| s.pop().map(|d| (id, d)))
        .collect()
}

/// What changed between two replayed sets of decisions (a decisions file read again): the
/// decisions that are new or different, in id order, and the ids whose decision is gone.
pub fn changes(
    before: &BTreeMap<String, LoggedDecision>,
    after: &BTreeMap<String, LoggedDecision>,
) -> (Vec<LoggedDecision>, Vec<String>) {
    let decided = after
        .iter()
        .filter(|(id, d)| before.get(*id) != Some(*d))
        .map(|(_, d)| d.clone())
        .collect();
    let undone = before
        .keys()
        .filter(|id| !after.contains_key(*id))
        .cloned()
        .collect();
    (decided, undone)
}

/// A recorded decision that was not resumed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub id: String,
    pub reason: String,
}

/// A fresh plan with the recorded decisions that still fit.
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    pub items: Vec<PlanItem>,
    pub resumed: usize,
    pub dropped: Vec<Dropped>,
    /// Kvstore ids the logs decide more than once, differently: the last decision stands,
    /// and the operator is told which (a hand-made resume file naming an id twice).
    pub redecided: Vec<String>,
}

/// The ids that `steps` decide more than once with different decisions (the same decision
/// logged again before a write, on a retry, with its outcome, is one).
pub fn redecided(steps: &[LogStep]) -> Vec<String> {
    let mut last: BTreeMap<&str, (&LoggedDecision, usize)> = BTreeMap::new();
    for step in steps {
        if let LogStep::Decide(d) = step {
            let e = last.entry(d.id.as_str()).or_insert((d, 0));
            if e.1 == 0 || e.0 != d {
                *e = (d, e.1 + 1);
            }
        }
    }
    last.into_iter()
        .filter(|(_, (_, n))| *n > 1)
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Applies `decisions` to the fresh plan `live`, matching by kvstore id and label key, and
/// re-validates them as `reconcile` does a hand-edited plan; a decision that no longer fits
/// (the entry changed, its target id was taken meanwhile, ...) is dropped and its item keeps
/// the fresh proposal.
pub fn resume(
    live: &[PlanItem],
    decisions: &BTreeMap<String, LoggedDecision>,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> Resumed {
    let kv_ids: HashSet<u32> = live.iter().filter_map(PlanItem::numeric_id).collect();
    let among = Among {
        is_kv_id: &|t| kv_ids.contains(&t),
    };
    resume_among(live, among, decisions, k8s, range)
}

/// `resume` onto `live`, which may be only the part of the plan the decisions touch: the
/// items they decide, and every item that creates at an id one of them names (a decision's
/// target, or its item's proposal). No other item can refuse a decision or be changed by
/// one, so the outcome is that of the whole plan; the kvstore's ids are asked of `among`.
pub fn resume_among(
    live: &[PlanItem],
    among: Among<'_>,
    decisions: &BTreeMap<String, LoggedDecision>,
    k8s: &BTreeMap<u32, LabelKey>,
    range: IdRange,
) -> Resumed {
    let index: HashMap<&str, usize> = live
        .iter()
        .enumerate()
        .map(|(i, item)| (item.id.as_str(), i))
        .collect();
    let mut items = live.to_vec();
    let mut dropped = Vec::new();
    let mut resumed: HashSet<usize> = HashSet::new();
    for (id, d) in decisions {
        let Some(&i) = index.get(id.as_str()) else {
            dropped.push(drop(
                id,
                "not in the kvstore now (deleted since the decision, or never there: check the id)",
            ));
            continue;
        };
        let item = &mut items[i];
        if item.labels != d.labels {
            dropped.push(drop(
                id,
                "its labels in the kvstore changed since the decision",
            ));
            continue;
        }
        if item.kind == Kind::Invalid {
            dropped.push(drop(id, &format!("is invalid now ({})", item.reason)));
            continue;
        }
        let present = match item.kind {
            Kind::Reuse => item.labels_present_at,
            Kind::AlreadyMigrated => item.numeric_id(),
            _ => None,
        };
        if d.action == Action::Create
            && let Some(x) = present
            && d.target_id != Some(x)
        {
            // Decided before these labels reached Kubernetes at x (a CRD-mode agent, or an
            // object at the kvstore's own id): a create now would be a second object for
            // them, which nobody decided. They are served at x.
            dropped.push(drop(
                id,
                &format!(
                    "its labels are in Kubernetes at {x} now: served there, not created again"
                ),
            ));
            continue;
        }
        item.action = d.action;
        item.target_id = d.target_id;
        item.decided = true;
        resumed.insert(i);
    }
    // Re-validate as a hand-edited plan; each refusal of a resumed item drops it (back to the
    // fresh proposal) and the rest is checked again, since one decision can block another.
    for _ in 0..8 {
        let Err(errors) = reconcile_among(Some(&items), live, k8s, range, true, among) else {
            break;
        };
        let mut changed = false;
        for e in errors {
            if let Some(&i) = index.get(e.id.as_str())
                && resumed.remove(&i)
            {
                items[i] = live[i].clone();
                dropped.push(drop(&e.id, &e.reason));
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    dropped.sort_by(|a, b| a.id.cmp(&b.id));
    Resumed {
        items,
        resumed: resumed.len(),
        dropped,
        redecided: Vec::new(),
    }
}

fn drop(id: &str, reason: &str) -> Dropped {
    Dropped {
        id: id.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kvstore::MasterEntry;
    use crate::core::planner::{describe, plan, reconcile};

    const A: &str = "k8s:app=a;";
    const B: &str = "k8s:app=b;";
    const C: &str = "k8s:app=c;";

    fn range() -> IdRange {
        IdRange::for_cluster(0).unwrap()
    }

    /// Decisions to create each (kvstore id, labels) at a target id.
    fn creates_at(decided: &[(&str, &str, u32)]) -> BTreeMap<String, LoggedDecision> {
        decided
            .iter()
            .map(|&(id, labels, t)| {
                let d = LoggedDecision {
                    id: id.into(),
                    labels: labels.into(),
                    action: Action::Create,
                    target_id: Some(t),
                };
                (id.to_string(), d)
            })
            .collect()
    }

    #[test]
    fn changes_are_the_new_or_different_decisions_and_the_ids_whose_decision_went() {
        let before = creates_at(&[("300", A, 300), ("301", B, 4000), ("302", C, 302)]);
        let after = creates_at(&[("300", A, 300), ("301", B, 4001), ("303", C, 303)]);
        let (decided, undone) = changes(&before, &after);
        let ids: Vec<(&str, Option<u32>)> = decided
            .iter()
            .map(|d| (d.id.as_str(), d.target_id))
            .collect();
        assert_eq!(ids, [("301", Some(4001)), ("303", Some(303))]);
        assert_eq!(undone, ["302"]);
        assert_eq!(changes(&after, &after), (Vec::new(), Vec::new()));
    }

    #[test]
    fn reads_back_what_the_tui_and_apply_write() {
        let mut item = plan(
            &[MasterEntry::new("300", A)],
            &std::collections::HashMap::new(),
            &BTreeMap::new(),
            range(),
        )
        .remove(0);
        item.target_id = Some(400);
        let text = describe("edit", &item);
        assert_eq!(
            step_of("300", A, &text, Some(400)),
            Some(LogStep::Decide(LoggedDecision {
                id: "300".into(),
                labels: A.into(),
                action: Action::Create,
                target_id: Some(400)
            }))
        );
        assert_eq!(
            step_of("300", A, "undo (create 300)", Some(300)),
            Some(LogStep::Undo { id: "300".into() })
        );
        assert!(matches!(
            step_of("301", B, "skip (operator)", None),
            Some(LogStep::Decide(LoggedDecision {
                action: Action::Skip,
                ..
            }))
        ));
        assert!(matches!(
            step_of("301", B, "map (accept-proposals)", Some(900)),
            Some(LogStep::Decide(LoggedDecision {
                action: Action::None,
                target_id: Some(900),
                ..
            }))
        ));
        // A proposal taken as it is is proposed again by a fresh plan: nothing to resume.
        assert_eq!(step_of("301", B, "create (proposal)", Some(301)), None);
        assert_eq!(step_of("301", B, "garbage", None), None);
        assert_eq!(step_of("301", B, "edit (create x)", None), None);
    }

    /// A decision to create `id` at `t`, as a log line replays.
    fn create_step(id: &str, t: u32) -> LogStep {
        LogStep::Decide(LoggedDecision {
            id: id.into(),
            labels: A.into(),
            action: Action::Create,
            target_id: Some(t),
        })
    }

    fn undo_step(id: &str) -> LogStep {
        LogStep::Undo { id: id.into() }
    }

    #[test]
    fn undo_takes_back_the_last_decision_on_its_id() {
        let (d, undo) = (create_step, undo_step);
        let r = replay([
            d("1", 400),
            d("1", 401),
            undo("1"),
            d("2", 500),
            undo("2"),
            undo("2"),
        ]);
        assert_eq!(r.len(), 1);
        assert_eq!(r["1"].target_id, Some(400));
    }

    #[test]
    fn an_undo_takes_back_a_decision_however_often_it_was_logged() {
        let (d, undo) = (create_step, undo_step);
        // 1 decided to 400, logged when decided, before its batch, on a retry and with its
        // outcome; then undone: nothing is in force.
        let r = replay([
            d("1", 400),
            d("1", 400),
            d("1", 400),
            d("1", 400),
            undo("1"),
        ]);
        assert!(r.is_empty(), "{r:?}");
        // 2: 500, then 501 logged twice, one undo: 500 again.
        let r = replay([d("2", 500), d("2", 501), d("2", 501), undo("2")]);
        assert_eq!(r["2"].target_id, Some(500));
        // 3: an edit back to an earlier decision is a decision of its own.
        let r = replay([d("3", 600), d("3", 601), d("3", 600), undo("3")]);
        assert_eq!(r["3"].target_id, Some(601));
    }

    #[test]
    fn an_id_decided_twice_differently_is_named_and_one_logged_again_is_not() {
        let steps = [
            create_step("1", 400),
            create_step("1", 400),
            create_step("2", 500),
            create_step("2", 501),
        ];
        assert_eq!(redecided(&steps), ["2"]);
    }

    #[test]
    fn undecided_clears_whatever_came_before_and_a_later_decision_stands() {
        let d = |t: u32| create_step("1", t);
        let clear = LogStep::Undecided { id: "1".into() };
        assert!(replay([d(400), d(401), d(401), clear.clone()]).is_empty());
        let r = replay([d(400), clear, d(402)]);
        assert_eq!(r["1"].target_id, Some(402));
        assert_eq!(
            step_of_fields("1", A, "operator", "undecided", None),
            Some(LogStep::Undecided { id: "1".into() })
        );
        // Only a person's undo counts, as only a person's decision does.
        assert_eq!(step_of_fields("1", A, "rule", "undecided", None), None);
    }

    #[test]
    fn a_create_decided_before_the_labels_reached_kubernetes_is_not_made_a_second_object() {
        // 300 was a remap (Kubernetes holds 300 for other labels), decided to 5000; since, a
        // CRD-mode agent put A at 400. 301 was a remap too; since, its own id holds B.
        let masters = [MasterEntry::new("300", A), MasterEntry::new("301", B)];
        let mut k8s = BTreeMap::new();
        k8s.insert(300, "k8s:app=x;".to_string());
        k8s.insert(400, A.to_string());
        k8s.insert(301, B.to_string());
        let decisions = creates_at(&[("300", A, 5000), ("301", B, 5001)]);
        let live = plan(&masters, &std::collections::HashMap::new(), &k8s, range());
        let r = resume(&live, &decisions, &k8s, range());
        assert_eq!(r.resumed, 0, "{:?}", r.dropped);
        let item = |id: &str| r.items.iter().find(|i| i.id == id).unwrap();
        assert_eq!(
            (item("300").action, item("300").target_id),
            (Action::None, Some(400))
        );
        assert_eq!(item("301").kind, Kind::AlreadyMigrated);
        assert!(
            r.dropped.iter().all(|d| d.reason.contains("served there")),
            "{:?}",
            r.dropped
        );
    }

    #[test]
    fn a_decision_dropped_can_block_another_which_is_dropped_in_turn() {
        // Kubernetes holds 300 and 301 for other labels: both are remaps, proposed at 256
        // and 257. 300 was decided to 301 (taken now), 301 to 256.
        let masters = [MasterEntry::new("300", A), MasterEntry::new("301", B)];
        let mut k8s = BTreeMap::new();
        k8s.insert(300, "k8s:app=x;".to_string());
        k8s.insert(301, "k8s:app=y;".to_string());
        let live = plan(&masters, &std::collections::HashMap::new(), &k8s, range());
        let proposed: Vec<Option<u32>> = live.iter().map(|i| i.target_id).collect();
        assert_eq!(proposed, [Some(256), Some(257)]);
        let decisions = creates_at(&[("300", A, 301), ("301", B, 256)]);
        let r = resume(&live, &decisions, &k8s, range());
        // 300 back at its proposal, 256, which 301's decision claims: 301 goes back too.
        let dropped: Vec<&str> = r.dropped.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(dropped, ["300", "301"], "{:?}", r.dropped);
        let targets: Vec<Option<u32>> = r.items.iter().map(|i| i.target_id).collect();
        assert_eq!(targets, [Some(256), Some(257)]);
        assert!(reconcile(&r.items, &live, &k8s, range(), true).is_ok());
    }

    #[test]
    fn decisions_that_no_longer_fit_are_dropped_with_why() {
        // 300 and 301 are remaps (their ids are taken by other labels); 302 a plain create.
        let masters = [
            MasterEntry::new("300", A),
            MasterEntry::new("301", B),
            MasterEntry::new("302", C),
        ];
        let mut k8s = BTreeMap::new();
        k8s.insert(300, "k8s:app=x;".to_string());
        k8s.insert(301, "k8s:app=y;".to_string());
        let decide = |id: &str, labels: &str, action, t| {
            (
                id.to_string(),
                LoggedDecision {
                    id: id.into(),
                    labels: labels.into(),
                    action,
                    target_id: t,
                },
            )
        };
        let mut decisions: BTreeMap<String, LoggedDecision> = [
            decide("300", A, Action::Create, Some(5000)),
            // Meanwhile id 6000 was taken in Kubernetes by other labels.
            decide("301", B, Action::Create, Some(6000)),
            // The entry's labels changed since.
            decide("302", "k8s:app=old;", Action::Skip, None),
            decide("399", A, Action::Skip, None),
        ]
        .into_iter()
        .collect();
        k8s.insert(6000, "k8s:app=z;".to_string());
        let live = plan(&masters, &std::collections::HashMap::new(), &k8s, range());
        let r = resume(&live, &decisions, &k8s, range());
        assert_eq!(r.resumed, 1);
        let item = |id: &str| r.items.iter().find(|i| i.id == id).unwrap();
        assert_eq!(
            (item("300").target_id, item("300").decided),
            (Some(5000), true)
        );
        assert_eq!(item("301"), live.iter().find(|i| i.id == "301").unwrap());
        let why: Vec<(&str, &str)> = r
            .dropped
            .iter()
            .map(|d| (d.id.as_str(), d.reason.as_str()))
            .collect();
        assert_eq!(why.len(), 3, "{why:?}");
        assert!(
            why[0].0 == "301" && why[0].1.contains("taken in Kubernetes"),
            "{why:?}"
        );
        assert!(why[1].0 == "302" && why[1].1.contains("labels"), "{why:?}");
        assert!(
            why[2].0 == "399" && why[2].1.contains("not in the kvstore now"),
            "{why:?}"
        );
        // Two resumed decisions claiming one id: both are refused, both keep the proposal.
        decisions.clear();
        decisions.extend([
            decide("300", A, Action::Create, Some(7000)),
            decide("301", B, Action::Create, Some(7000)),
        ]);
        let r = resume(&live, &decisions, &k8s, range());
        assert_eq!(r.resumed, 0);
        assert_eq!(r.items, live);
    }
}
