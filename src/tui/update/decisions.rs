//! The operator's decisions on conflicts: applied with the core's rules to the item under
//! review or, in bulk, to every conflict the table shows; kept for undo; logged the moment
//! they are made.

use crate::app::service::ServiceRequest;
use crate::core::planner::{Decision, PlanItem, describe};
use crate::tui::model::{Modal, Model};
use crate::tui::msg::Command;

/// Asks the service to log a decision on `item` (already changed by it).
pub(super) fn log_decision(name: &'static str, item: &PlanItem) -> Command {
    Command::Send(ServiceRequest::Decided {
        name,
        item: Box::new(item.clone()),
    })
}

/// `decision` applied to a copy of `item`: an accept takes the planner's proposal, whatever
/// was decided on the item before (a reuse, an edit), as the Why pane explains it.
fn decided(model: &Model, item: &PlanItem, decision: Decision) -> Result<PlanItem, String> {
    let mut item = item.clone();
    if decision == Decision::Accept
        && let Some(&(action, target)) = model.review.proposals.get(&item.id)
    {
        item.action = action;
        item.target_id = target;
    }
    decision.apply_to(&mut item)?;
    Ok(item)
}

/// Applies one decision to the conflict under review, records it for undo, logs it at once,
/// and moves on to the next undecided conflict.
pub(super) fn decide(model: &mut Model, decision: Decision) -> Vec<Command> {
    if scan_running(model) {
        return vec![];
    }
    let Some(i) = model.review.conflict else {
        return vec![];
    };
    let before = model.cluster.items[i].clone();
    let item = match decided(model, &before, decision) {
        Ok(item) => item,
        Err(e) => {
            model.modal = Some(Modal::Message(e));
            return vec![];
        }
    };
    model.cluster.items[i] = item;
    model.review.undo.push(vec![(i, before)]);
    let item = &model.cluster.items[i];
    model.status = format!(
        "{} {}: {}",
        decision.name(),
        item.id,
        describe(decision.name(), item)
    );
    let cmd = log_decision(decision.name(), item);
    let next = model
        .conflicts()
        .find(|&c| c > i && !model.cluster.items[c].decided);
    if let Some(next) = next {
        model.review.conflict = Some(next);
        model.review.label_scroll = 0;
    }
    vec![cmd]
}

/// The conflicts among the table's visible rows: what a bulk decision applies to.
pub(super) fn visible_conflicts(model: &Model) -> Vec<usize> {
    model
        .table
        .view
        .iter()
        .copied()
        .filter(|&i| model.cluster.items[i].kind.is_conflict())
        .collect()
}

/// How the decision log marks a decision made in bulk.
fn bulk_name(decision: Decision) -> &'static str {
    match decision {
        Decision::Accept => "bulk-accept",
        Decision::Skip => "bulk-skip",
        Decision::Reuse => "bulk-reuse",
        Decision::CreateAnyway => "bulk-create-anyway",
        Decision::EditTarget(_) => "bulk-edit",
    }
}

/// Decisions wait for a running scan: the items they would change are about to be replaced.
fn scan_running(model: &mut Model) -> bool {
    if model.scan.scanning {
        model.modal = Some(Modal::Message(
            "the scan is still running: decisions wait until both sides are read".into(),
        ));
    }
    model.scan.scanning
}

/// Applies `decision` to each of `targets` it fits, as one undo step; each item gets its own
/// decision log line, marked as a bulk decision. Items it does not fit stay as they were.
pub(super) fn decide_bulk(
    model: &mut Model,
    targets: &[usize],
    decision: Decision,
) -> Vec<Command> {
    if scan_running(model) {
        return vec![];
    }
    let mut step = Vec::new();
    let mut cmds = Vec::new();
    let mut refused = 0;
    for &i in targets {
        let before = model.cluster.items[i].clone();
        let Ok(item) = decided(model, &before, decision) else {
            refused += 1;
            continue;
        };
        model.cluster.items[i] = item;
        cmds.push(log_decision(bulk_name(decision), &model.cluster.items[i]));
        step.push((i, before));
    }
    let decided = step.len();
    if !step.is_empty() {
        model.review.undo.push(step);
    }
    model.status = format!(
        "{}: {decided} decided{}",
        bulk_name(decision),
        if refused > 0 {
            format!(", {refused} left as they were (the decision does not fit them)")
        } else {
            String::new()
        }
    );
    cmds
}

/// Undoes the last step (one decision, or a whole bulk decision), logging each item restored.
pub(super) fn undo(model: &mut Model) -> Vec<Command> {
    let Some(step) = model.review.undo.pop() else {
        model.status = "nothing to undo".into();
        return vec![];
    };
    let mut cmds = Vec::new();
    for (i, before) in step.into_iter().rev() {
        model.cluster.items[i] = before;
        model.review.conflict = Some(i);
        cmds.push(log_decision("undo", &model.cluster.items[i]));
    }
    if let [Command::Send(ServiceRequest::Decided { item, .. })] = cmds.as_slice() {
        let what = match (item.action, item.target_id) {
            (crate::core::planner::Action::Create, Some(t)) => format!("create at {t}"),
            (crate::core::planner::Action::None, Some(t)) => format!("map to {t}"),
            (action, _) => action.as_str().to_string(),
        };
        let whose = if item.decided {
            "the earlier decision"
        } else {
            "its proposal"
        };
        model.status = format!("undone: {} is back to {whose} ({what})", item.id);
    } else {
        model.status = format!("undone: {} decisions", cmds.len());
    }
    cmds
}
