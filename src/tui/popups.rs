//! Keys while a popup is open: search, target edit, confirmations (commit needs the typed
//! word `yes`), export, help and notes.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::decisions::{decide, decision_record};
use super::model::{Modal, Model};
use super::update::{Command, start_commit, stop_or_quit};
use crate::planner::{Action as PlanAction, validate_new_target};
use crate::service::Request;

pub(super) fn on_modal_key(model: &mut Model, modal: Modal, key: KeyEvent) -> Vec<Command> {
    let ctrl_c = key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl_c {
        return stop_or_quit(model);
    }
    match modal {
        Modal::Help | Modal::Message(_) => vec![],
        Modal::Search { mut input } => {
            // Enter keeps the search and closes the popup; Esc clears it.
            if !matches!(key.code, KeyCode::Esc | KeyCode::Enter) {
                type_into(&mut input, &key, |_| true);
                model.modal = Some(Modal::Search {
                    input: input.clone(),
                });
            }
            // Filter as the operator types; Esc clears.
            model.search = if key.code == KeyCode::Esc {
                String::new()
            } else {
                input
            };
            model.selected = 0;
            model.rebuild_view();
            vec![]
        }
        Modal::EditTarget { mut input, .. } => match key.code {
            KeyCode::Esc => vec![],
            KeyCode::Enter => {
                let Some(i) = model.conflict else {
                    return vec![];
                };
                let parsed = input
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{:?} is not an id", input.trim()));
                let checked = parsed.and_then(|t| {
                    validate_new_target(&model.items, i, t, &model.k8s, model.range).map(|_| t)
                });
                match checked {
                    Ok(t) => decide(model, "edit", |item| {
                        item.action = PlanAction::Create;
                        item.target_id = Some(t);
                        item.decided = true;
                        Ok(())
                    }),
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
                type_into(&mut input, &key, |c| c.is_ascii_digit());
                model.modal = Some(Modal::EditTarget { input, error: None });
                vec![]
            }
        },
        Modal::ConfirmAcceptAll { count } => match key.code {
            KeyCode::Char('y') | KeyCode::Enter => {
                let pending: Vec<usize> = model
                    .conflicts()
                    .filter(|&i| !model.items[i].decided)
                    .collect();
                let mut cmds = Vec::new();
                for i in pending {
                    model.items[i].decided = true;
                    cmds.push(Command::Send(Request::Log(decision_record(
                        &model.items[i],
                        "accept-all",
                    ))));
                }
                model.undo.clear();
                model.status = format!("accepted {count} proposals");
                cmds
            }
            _ => vec![],
        },
        Modal::ConfirmCommit { mut typed } => match key.code {
            KeyCode::Esc => vec![],
            KeyCode::Enter if typed == "yes" => start_commit(model),
            KeyCode::Enter => {
                model.modal = Some(Modal::ConfirmCommit {
                    typed: String::new(),
                });
                vec![]
            }
            _ => {
                type_into(&mut typed, &key, |_| true);
                model.modal = Some(Modal::ConfirmCommit { typed });
                vec![]
            }
        },
        Modal::Export { mut input } => match key.code {
            KeyCode::Esc => vec![],
            KeyCode::Enter if !input.trim().is_empty() => vec![Command::Send(Request::Export {
                path: input.trim().into(),
                items: model.items.clone(),
            })],
            _ => {
                type_into(&mut input, &key, |_| true);
                model.modal = Some(Modal::Export { input });
                vec![]
            }
        },
    }
}

/// Applies a typing key (a character `accept` allows, or Backspace) to a popup's text field.
fn type_into(text: &mut String, key: &KeyEvent, accept: impl Fn(char) -> bool) {
    match key.code {
        KeyCode::Backspace => {
            text.pop();
        }
        KeyCode::Char(c) if accept(c) => text.push(c),
        _ => {}
    }
}
