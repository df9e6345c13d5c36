//! The operator's decisions on conflicts: applied to the item under review, kept for undo,
//! and logged the moment they are made.

use super::model::{Modal, Model};
use super::update::Command;
use crate::decision_log::Record;
use crate::planner::PlanItem;
use crate::service::Request;

pub(super) fn decision_record(item: &PlanItem, decision: &str) -> Record {
    Record {
        ts: String::new(),
        operator: String::new(),
        id: item.id.clone(),
        labels: item.labels.clone(),
        kind: item.kind.as_str().to_string(),
        decision: format!(
            "{decision} ({} {})",
            item.action.as_str(),
            item.target_id.map_or("-".into(), |t| t.to_string())
        ),
        target_id: item.target_id,
        outcome: None,
        error: None,
    }
}

/// Applies one decision to the conflict under review, records it for undo, logs it at once,
/// and moves on to the next undecided conflict.
pub(super) fn decide(
    model: &mut Model,
    name: &str,
    f: impl FnOnce(&mut PlanItem) -> Result<(), String>,
) -> Vec<Command> {
    let Some(i) = model.conflict else {
        return vec![];
    };
    let before = model.items[i].clone();
    let mut item = before.clone();
    if let Err(e) = f(&mut item) {
        model.modal = Some(Modal::Message(e));
        return vec![];
    }
    model.items[i] = item;
    model.undo.push((i, before));
    let record = decision_record(&model.items[i], name);
    model.status = format!("{} {}: {}", name, model.items[i].id, record.decision);
    let next = model
        .conflicts()
        .find(|&c| c > i && !model.items[c].decided);
    if let Some(next) = next {
        model.conflict = Some(next);
    }
    vec![Command::Send(Request::Log(record))]
}

pub(super) fn undo(model: &mut Model) -> Vec<Command> {
    let Some((i, before)) = model.undo.pop() else {
        model.status = "nothing to undo".into();
        return vec![];
    };
    model.items[i] = before;
    model.conflict = Some(i);
    let record = decision_record(&model.items[i], "undo");
    model.status = format!(
        "undone: {} is back to {}",
        model.items[i].id, record.decision
    );
    vec![Command::Send(Request::Log(record))]
}
