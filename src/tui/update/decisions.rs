//! The operator's decisions on conflicts: applied to the item under review with the core's
//! rules, kept for undo, and logged the moment they are made.

use crate::app::service::ServiceRequest;
use crate::core::planner::{Decision, PlanItem};
use crate::tui::model::{Modal, Model};
use crate::tui::msg::Command;

/// Asks the service to log a decision on `item` (already changed by it).
pub(super) fn log_decision(name: &'static str, item: &PlanItem) -> Command {
    Command::Send(ServiceRequest::Decided {
        name,
        item: Box::new(item.clone()),
    })
}

/// Applies one decision to the conflict under review, records it for undo, logs it at once,
/// and moves on to the next undecided conflict.
pub(super) fn decide(model: &mut Model, decision: Decision) -> Vec<Command> {
    let Some(i) = model.review.conflict else {
        return vec![];
    };
    let before = model.cluster.items[i].clone();
    let mut item = before.clone();
    if let Err(e) = decision.apply_to(&mut item) {
        model.modal = Some(Modal::Message(e));
        return vec![];
    }
    model.cluster.items[i] = item;
    model.review.undo.push((i, before));
    let item = &model.cluster.items[i];
    model.status = format!(
        "{} {}: {}",
        decision.name(),
        item.id,
        crate::core::planner::describe(decision.name(), item)
    );
    let cmd = log_decision(decision.name(), item);
    let next = model
        .conflicts()
        .find(|&c| c > i && !model.cluster.items[c].decided);
    if let Some(next) = next {
        model.review.conflict = Some(next);
    }
    vec![cmd]
}

pub(super) fn undo(model: &mut Model) -> Vec<Command> {
    let Some((i, before)) = model.review.undo.pop() else {
        model.status = "nothing to undo".into();
        return vec![];
    };
    model.cluster.items[i] = before;
    model.review.conflict = Some(i);
    let item = &model.cluster.items[i];
    model.status = format!(
        "undone: {} is back to {}",
        item.id,
        crate::core::planner::describe("undo", item)
    );
    vec![log_decision("undo", item)]
}
