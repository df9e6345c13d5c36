//! Keys while a popup is open: search, target edit, confirmations (commit needs the typed
//! word `yes`), bulk decisions, identity details, export, help and notes.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::commit::{start_commit, stop_or_quit};
use super::decisions::{decide, decide_bulk, log_decision};
use crate::app::service::ServiceRequest;
use crate::core::planner::{Decision, validate_new_target};
use crate::tui::model::{Modal, Model, Screen, TextField};
use crate::tui::msg::Command;

pub(super) fn on_modal_key(model: &mut Model, modal: Modal, key: KeyEvent) -> Vec<Command> {
    let ctrl_c = key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl_c {
        return stop_or_quit(model);
    }
    match modal {
        Modal::Help => on_help_key(model, &key),
        Modal::Message(_) => vec![],
        Modal::ResumeOffer { path, .. } => on_resume_offer(model, path, &key),
        Modal::Detail { index, .. } => {
            // Enter on a conflict goes on to review it; any other key closes.
            if key.code == KeyCode::Enter && model.cluster.items[index].kind.is_conflict() {
                model.review.conflict = Some(index);
                model.screen = Screen::Conflicts;
            }
            vec![]
        }
        Modal::Search { input } => on_search(model, input, &key),
        Modal::EditTarget { input, .. } => on_edit_target(model, input, &key),
        Modal::ConfirmQuit { .. } => {
            if matches!(key.code, KeyCode::Char('y') | KeyCode::Char('q')) {
                model.quit = true;
            }
            vec![]
        }
        Modal::ConfirmAcceptAll { count } => match key.code {
            KeyCode::Char('y') | KeyCode::Enter => accept_all(model, count),
            _ => vec![],
        },
        Modal::ConfirmBulk { targets } => match bulk_decision(&key) {
            Some(decision) => decide_bulk(model, &targets, decision),
            None => vec![],
        },
        Modal::ConfirmCommit { typed } => typed_word(
            model,
            (typed, "yes"),
            &key,
            |typed| Modal::ConfirmCommit { typed },
            start_commit,
        ),
        Modal::ConfirmSync { typed } => typed_word(
            model,
            (typed, "yes"),
            &key,
            |typed| Modal::ConfirmSync { typed },
            start_sync,
        ),
        Modal::ConfirmLeave { typed } => typed_word(
            model,
            (typed, "leave"),
            &key,
            |typed| Modal::ConfirmLeave { typed },
            super::commit::stop_or_quit,
        ),
        Modal::ConfirmRollback { typed } => typed_word(
            model,
            (typed, "yes"),
            &key,
            |typed| Modal::ConfirmRollback { typed },
            super::commit::start_rollback,
        ),
        Modal::ConfirmIncludeInUse { typed } => typed_word(
            model,
            (typed, "in use"),
            &key,
            |typed| Modal::ConfirmIncludeInUse { typed },
            super::commit::include_in_use,
        ),
        Modal::Export { mut input, .. } => match key.code {
            KeyCode::Esc => vec![],
            KeyCode::Enter if !input.text().trim().is_empty() => {
                let path = input.text().trim().to_string();
                model.exporting = Some(path.clone());
                vec![Command::Send(ServiceRequest::Export {
                    path: path.into(),
                    items: model.cluster.items.clone(),
                })]
            }
            _ => {
                input.on_key(&key, |_| true);
                model.modal = Some(Modal::Export { input, error: None });
                vec![]
            }
        },
    }
}

/// ↓/↑ scroll a help longer than the terminal; any other key closes it.
fn on_help_key(model: &mut Model, key: &KeyEvent) -> Vec<Command> {
    let keys = crate::tui::keys::bindings_for(model.screen).count() as u16;
    let by: i32 = match key.code {
        KeyCode::Down | KeyCode::Char('j') => 1,
        KeyCode::Up | KeyCode::Char('k') => -1,
        KeyCode::PageDown => 10,
        KeyCode::PageUp => -10,
        _ => return vec![],
    };
    model.help_scroll = (i32::from(model.help_scroll) + by).clamp(0, i32::from(keys)) as u16;
    model.modal = Some(Modal::Help);
    vec![]
}

/// The decision a key takes for every selected identity at once, if it takes one.
fn bulk_decision(key: &KeyEvent) -> Option<Decision> {
    match key.code {
        KeyCode::Char('a') => Some(Decision::Accept),
        KeyCode::Char('s') => Some(Decision::Skip),
        KeyCode::Char('u') => Some(Decision::Reuse),
        KeyCode::Char('c') => Some(Decision::CreateAnyway),
        _ => None,
    }
}

/// Starts sync in place, once its confirmation was typed.
fn start_sync(model: &mut Model) -> Vec<Command> {
    model.sync.running = true;
    // "started" waits for both watches (`SyncEvent::Following`).
    model.sync.push("sync starting: reading both sides".into());
    model.screen = Screen::Sync;
    vec![Command::Send(ServiceRequest::StartSync {
        accept_proposals: false,
    })]
}

/// The offer to resume a log found beside this one: `y` resumes it, anything else starts
/// fresh and leaves the log as it is.
fn on_resume_offer(model: &mut Model, path: std::path::PathBuf, key: &KeyEvent) -> Vec<Command> {
    if key.code != KeyCode::Char('y') {
        model.status = format!("starting fresh; {} is left as it is", path.display());
        return vec![];
    }
    model.scan.generation += 1;
    model.scan.scanning = true;
    vec![Command::Send(ServiceRequest::Resume {
        generation: model.scan.generation,
        paths: vec![path],
    })]
}

/// The search popup filters as the operator types; Enter keeps the search and closes the
/// popup, Esc clears it.
fn on_search(model: &mut Model, mut input: TextField, key: &KeyEvent) -> Vec<Command> {
    if !matches!(key.code, KeyCode::Esc | KeyCode::Enter) {
        input.on_key(key, |_| true);
        model.modal = Some(Modal::Search {
            input: input.clone(),
        });
    }
    model.table.search = if key.code == KeyCode::Esc {
        String::new()
    } else {
        input.text().to_string()
    };
    model.table.selected = 0;
    model.rebuild_view();
    vec![]
}

/// Editing a remap's target id: digits only; Enter decides it if the id is free on both
/// sides, else says why and stays open.
fn on_edit_target(model: &mut Model, mut input: TextField, key: &KeyEvent) -> Vec<Command> {
    match key.code {
        KeyCode::Esc => vec![],
        KeyCode::Enter => {
            let Some(i) = model.review.conflict else {
                return vec![];
            };
            let text = input.text().trim();
            let parsed = text
                .parse::<u32>()
                .map_err(|_| format!("{text:?} is not an id"));
            let checked = parsed.and_then(|t| {
                validate_new_target(
                    &model.cluster.items,
                    i,
                    t,
                    &model.cluster.k8s,
                    model.cluster.range,
                )
                .map(|_| t)
            });
            match checked {
                Ok(t) => decide(model, Decision::EditTarget(t)),
                Err(e) => {
                    model.modal = Some(Modal::EditTarget {
                        input,
                        error: Some(e),
                    });
                    vec![]
                }
            }
        }
        _ => {
            input.on_key(key, |c| c.is_ascii_digit());
            model.modal = Some(Modal::EditTarget { input, error: None });
            vec![]
        }
    }
}

/// Accepts every proposal still waiting for a decision (confirmed in its popup).
fn accept_all(model: &mut Model, count: usize) -> Vec<Command> {
    let pending: Vec<usize> = model
        .conflicts()
        .filter(|&i| !model.cluster.items[i].decided)
        .collect();
    let mut cmds = Vec::new();
    let mut step = Vec::new();
    for i in pending {
        step.push((i, model.cluster.items[i].clone()));
        // Accepting a proposal cannot be refused.
        let _ = Decision::Accept.apply_to(&mut model.cluster.items[i]);
        cmds.push(log_decision("accept-all", &model.cluster.items[i]));
    }
    // One step for `z`, as a bulk decision is: the decisions before it stay undoable too.
    if !step.is_empty() {
        model.review.undo.push(step);
    }
    model.status = format!("accepted {count} proposals (z undoes them as one step)");
    cmds
}

/// A popup that asks for a typed word (`yes` before a write) : Enter with the word runs
/// `confirm`, Enter with anything else clears the field, Esc cancels; other keys edit.
fn typed_word(
    model: &mut Model,
    (mut typed, word): (TextField, &str),
    key: &KeyEvent,
    popup: fn(TextField) -> Modal,
    confirm: fn(&mut Model) -> Vec<Command>,
) -> Vec<Command> {
    match key.code {
        KeyCode::Esc => vec![],
        KeyCode::Enter if typed.text() == word => confirm(model),
        KeyCode::Enter => {
            model.status = format!(
                "{:?} is not {word:?}: nothing was done; type {word} and press Enter, or Esc",
                typed.text()
            );
            model.modal = Some(popup(TextField::default()));
            vec![]
        }
        _ => {
            typed.on_key(key, |_| true);
            model.modal = Some(popup(typed));
            vec![]
        }
    }
}
