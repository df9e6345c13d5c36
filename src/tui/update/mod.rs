//! `update(&mut Model, Msg) -> Vec<Command>`: every change to the TUI's state happens here,
//! synchronously; IO is only ever requested, as commands for the engine service.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEventKind};

mod commit;
mod decisions;
mod engine;
mod fleet;
mod popups;

use super::keys::{KeyAction, action_for};
use super::model::{CommitPhase, Modal, Model, Screen, TextField};
use super::msg::{Command, Msg};
use crate::app::service::ServiceRequest;
use crate::core::planner::Decision;
use commit::{pause, start_commit, stop_or_quit};
use decisions::{decide, undo};
pub use engine::merge_decisions;
use engine::{on_engine, rescan};
pub use fleet::update_fleet;
use popups::on_modal_key;

/// Commands to run at start.
pub fn init(model: &mut Model) -> Vec<Command> {
    if model.rollback.is_some() {
        return commit::plan_rollback(model);
    }
    model.scan.generation += 1;
    model.scan.scanning = true;
    vec![
        Command::Send(ServiceRequest::Preflight),
        Command::Send(ServiceRequest::Scan {
            generation: model.scan.generation,
        }),
    ]
}

pub fn update(model: &mut Model, msg: Msg) -> Vec<Command> {
    match msg {
        Msg::Key(key) => {
            let cmds = on_key(model, key);
            count_uncommitted(model, &cmds);
            cmds
        }
        Msg::Scroll(n) => {
            if model.screen == Screen::Identities && model.modal.is_none() {
                move_selection(model, n as isize);
            }
            vec![]
        }
        Msg::Resize { rows } => {
            // Header, tabs, table header, footer and borders take 8 rows.
            model.table.page = usize::from(rows).saturating_sub(8).max(1);
            model.clamp_offset();
            vec![]
        }
        Msg::Tick { now } => {
            if let Some(start) = model.commit.started {
                model.commit.elapsed = now.saturating_duration_since(start);
            }
            vec![]
        }
        Msg::Engine(ev) => on_engine(model, ev),
        Msg::Progress(p) => {
            let c = &mut model.commit;
            if matches!(c.phase, CommitPhase::Running | CommitPhase::Stopping) {
                (c.total, c.writes, c.done, c.created, c.deleted, c.retries) =
                    (p.total, p.writes, p.done, p.created, p.deleted, p.retries);
                c.throttled = p.throttled;
            }
            vec![]
        }
        Msg::Signal => {
            // A signal ends the whole session, the fleet's too.
            model.back = false;
            stop_or_quit(model)
        }
    }
}

/// The arrows and PgUp/PgDn on the screens that scroll a pane rather than the table. A page
/// is the table's rows; the Sync and Audit panes move half as many entries, each taking two
/// rows or more.
fn scroll(model: &mut Model, action: KeyAction) -> Vec<Command> {
    let page = model.table.page as isize;
    let delta = |page: isize| match action {
        KeyAction::Up => -1,
        KeyAction::Down => 1,
        KeyAction::PageUp => -page,
        _ => page,
    };
    match model.screen {
        // Counted back from the newest report: up is older.
        Screen::Sync => model.sync.scroll_by(-delta((page / 2).max(1))),
        Screen::Audit => model.audit.scroll(delta(page / 2)),
        // The views keep the offsets within what they draw.
        Screen::Preflight => {
            // At most as far as the checks could reach, each wrapping to a few rows.
            let rows = model
                .cluster
                .preflight
                .as_ref()
                .map_or(0, |p| 6 + 6 * p.checks.len());
            model.preflight_scroll = shift(model.preflight_scroll, delta(page / 2), rows);
        }
        Screen::Conflicts => {
            let rows = model.review.conflict.map_or(0, |i| {
                2 * model.cluster.items[i].labels.matches(';').count()
            });
            model.review.label_scroll = shift(model.review.label_scroll, delta(page / 4), rows);
        }
        _ => commit::scroll_rollback(model, delta(page)),
    }
    vec![]
}

/// `at` moved by `by` rows, within `0..=max` (the views stop it at their last row).
fn shift(at: u16, by: isize, max: usize) -> u16 {
    (at as isize + by).clamp(0, max.min(u16::MAX as usize) as isize) as u16
}

/// The Audit screen's first visit reads both stores, the Switch screen's the cluster; later
/// visits show what was read until `R`.
fn first_audit(model: &mut Model) -> Vec<Command> {
    if model.screen == Screen::Audit && model.audit.run.is_none() {
        return audit(model);
    }
    if model.screen == Screen::Switch && model.switch.report.is_none() {
        return switch_report(model);
    }
    vec![]
}

/// Asks for the switch report, unless one is being read.
fn switch_report(model: &mut Model) -> Vec<Command> {
    match model.switch.request() {
        Some(generation) => vec![Command::Send(ServiceRequest::Switch { generation })],
        None => vec![],
    }
}

/// The Switch screen's keys: the conflict review's moves over the pods.
fn switch_key(model: &mut Model, action: KeyAction) -> Vec<Command> {
    let page = model.table.page.max(1) as isize;
    let view = &mut model.switch;
    match action {
        KeyAction::SwitchReport => return switch_report(model),
        KeyAction::NextConflict => view.next_needing(true),
        KeyAction::PrevConflict => view.next_needing(false),
        KeyAction::Up => view.move_by(-1),
        KeyAction::Down => view.move_by(1),
        KeyAction::PageUp => view.move_by(-page),
        KeyAction::PageDown => view.move_by(page),
        KeyAction::Home => view.to_end(false),
        KeyAction::End => view.to_end(true),
        _ => {}
    }
    vec![]
}

/// Asks for an audit of both stores, unless one is running.
fn audit(model: &mut Model) -> Vec<Command> {
    match model.audit.request() {
        Some(generation) => vec![Command::Send(ServiceRequest::Audit { generation })],
        None => vec![],
    }
}

fn move_selection(model: &mut Model, delta: isize) {
    if model.table.view.is_empty() {
        return;
    }
    let max = model.table.view.len() as isize - 1;
    model.table.selected = (model.table.selected as isize + delta).clamp(0, max) as usize;
    model.clamp_offset();
}

/// Each decision logged counts as not committed until a commit starts.
fn count_uncommitted(model: &mut Model, cmds: &[Command]) {
    for c in cmds {
        match c {
            Command::Send(ServiceRequest::Decided { item, .. }) => {
                model.review.uncommitted.insert(item.id.clone());
            }
            Command::Send(ServiceRequest::Commit { .. }) => model.review.uncommitted.clear(),
            _ => {}
        }
    }
}

fn on_key(model: &mut Model, key: KeyEvent) -> Vec<Command> {
    if let Some(modal) = model.modal.take() {
        return on_modal_key(model, modal, key);
    }
    let Some(action) = action_for(model.screen, &key) else {
        return vec![];
    };
    match action {
        KeyAction::Quit => on_quit(model, &key),
        KeyAction::Stop => stop_or_quit(model),
        KeyAction::Help => {
            model.help_scroll = 0;
            model.modal = Some(Modal::Help);
            vec![]
        }
        KeyAction::NextScreen => {
            let tabs = model.tabs;
            let i = tabs.iter().position(|s| *s == model.screen).unwrap_or(0);
            model.screen = tabs[(i + 1) % tabs.len()];
            first_audit(model)
        }
        KeyAction::Go(s) => {
            if model.tabs.contains(&s) {
                model.screen = s;
            }
            first_audit(model)
        }
        KeyAction::Audit => audit(model),
        _ if model.screen == Screen::Switch
            && matches!(
                action,
                KeyAction::SwitchReport
                    | KeyAction::NextConflict
                    | KeyAction::PrevConflict
                    | KeyAction::Up
                    | KeyAction::Down
                    | KeyAction::PageUp
                    | KeyAction::PageDown
                    | KeyAction::Home
                    | KeyAction::End
            ) =>
        {
            switch_key(model, action)
        }
        // Bound on the Switch screen alone, where the arm above takes it.
        KeyAction::SwitchReport => vec![],
        KeyAction::Up | KeyAction::Down | KeyAction::PageUp | KeyAction::PageDown
            if matches!(
                model.screen,
                Screen::Sync | Screen::Audit | Screen::Rollback | Screen::Preflight
            ) || (model.screen == Screen::Conflicts
                && matches!(action, KeyAction::PageUp | KeyAction::PageDown)) =>
        {
            scroll(model, action)
        }
        KeyAction::Open if model.screen == Screen::Sync => {
            model.modal = Some(Modal::Message(match model.sync.current() {
                Some(report) => report.clone(),
                None => "no report yet".into(),
            }));
            vec![]
        }
        KeyAction::Up => nav(model, -1),
        KeyAction::Down => nav(model, 1),
        KeyAction::PageUp => nav(model, -(model.table.page as isize)),
        KeyAction::PageDown => nav(model, model.table.page as isize),
        KeyAction::Home => nav(model, isize::MIN / 2),
        KeyAction::End => nav(model, isize::MAX / 2),
        KeyAction::CycleFilter
        | KeyAction::Search
        | KeyAction::CycleSort
        | KeyAction::ReverseSort
        | KeyAction::Open
        | KeyAction::Bulk => table_key(model, action),
        KeyAction::NextConflict
        | KeyAction::PrevConflict
        | KeyAction::Accept
        | KeyAction::EditTarget
        | KeyAction::Reuse
        | KeyAction::Skip
        | KeyAction::CreateAnyway
        | KeyAction::Undo
        | KeyAction::AcceptAll => review_key(model, action),
        KeyAction::Commit
        | KeyAction::IncludeInUse
        | KeyAction::Pause
        | KeyAction::StartSync
        | KeyAction::Retry
        | KeyAction::Rescan
        | KeyAction::Export => work_key(model, action),
    }
}

/// `q` (or Ctrl-C): quits, unless a commit runs (Ctrl-C stops it first), sync runs short
/// of cutover (a typed word first) or decisions are not committed (asked first).
fn on_quit(model: &mut Model, key: &KeyEvent) -> Vec<Command> {
    // Opened from the Fleet screen, Esc goes back to it, past the same questions as `q`.
    model.back = model.fleet_cluster.is_some() && key.code == KeyCode::Esc;
    if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
        return stop_or_quit(model);
    }
    if matches!(
        model.commit.phase,
        CommitPhase::Running | CommitPhase::Stopping
    ) {
        model.modal = Some(Modal::Message(
            "a commit is running: Ctrl-C stops it first".into(),
        ));
        return vec![];
    }
    if model.sync.running && !model.sync.cutover && !model.sync.stopping {
        // Leaving stops sync before cutover: a typed word, as starting it took.
        model.modal = Some(Modal::ConfirmLeave {
            typed: TextField::default(),
        });
        return vec![];
    }
    // The identities decided since the last commit and still decided now (one undone back
    // to its proposal leaves nothing to resume).
    let uncommitted = model
        .cluster
        .items
        .iter()
        .filter(|i| i.decided && model.review.uncommitted.contains(&i.id))
        .count();
    if uncommitted > 0 && !model.sync.running {
        // Decided and not committed: in the log, not in the cluster. Ask first.
        model.modal = Some(Modal::ConfirmQuit { uncommitted });
        return vec![];
    }
    model.quit = true;
    vec![]
}

/// The Identities table: filter, search, sort, open a row, one decision for the rows shown.
fn table_key(model: &mut Model, action: KeyAction) -> Vec<Command> {
    match action {
        KeyAction::CycleFilter => {
            model.table.filter = model.table.filter.next();
            model.table.selected = 0;
            model.rebuild_view();
            vec![]
        }
        KeyAction::Search => {
            model.modal = Some(Modal::Search {
                input: TextField::new(model.table.search.clone()),
            });
            vec![]
        }
        KeyAction::CycleSort => {
            model.table.sort = model.table.sort.next();
            model.rebuild_view();
            vec![]
        }
        KeyAction::ReverseSort => {
            model.table.descending = !model.table.descending;
            model.rebuild_view();
            vec![]
        }
        KeyAction::Open => {
            let Some(&index) = model.table.view.get(model.table.selected) else {
                return vec![];
            };
            model.modal = Some(Modal::Detail { index, nodes: None });
            let item = &model.cluster.items[index];
            // The names come from the kvstore now; the count is shown until they do.
            vec![Command::Send(ServiceRequest::NodesUsing {
                id: item.id.clone(),
                labels: item.labels.clone(),
            })]
        }
        KeyAction::Bulk => {
            let targets = decisions::visible_conflicts(model);
            model.modal = Some(if targets.is_empty() {
                Modal::Message(
                    "no conflicts among the rows shown: f filters by kind, / searches".into(),
                )
            } else {
                Modal::ConfirmBulk { targets }
            });
            vec![]
        }
        _ => vec![],
    }
}

/// Reviewing conflicts: move between them, decide, undo.
fn review_key(model: &mut Model, action: KeyAction) -> Vec<Command> {
    match action {
        KeyAction::NextConflict => step_conflict(model, true),
        KeyAction::PrevConflict => step_conflict(model, false),
        KeyAction::Accept => decide(model, Decision::Accept),
        KeyAction::EditTarget => {
            if let Some(i) = model.review.conflict {
                let current = model.cluster.items[i]
                    .target_id
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                model.modal = Some(Modal::EditTarget {
                    input: TextField::new(current),
                    error: None,
                });
            }
            vec![]
        }
        KeyAction::Reuse => decide(model, Decision::Reuse),
        KeyAction::Skip => decide(model, Decision::Skip),
        KeyAction::CreateAnyway => decide(model, Decision::CreateAnyway),
        KeyAction::Undo => undo(model),
        KeyAction::AcceptAll => {
            let count = model
                .conflicts()
                .filter(|&i| !model.cluster.items[i].decided)
                .count();
            model.modal = Some(if count == 0 {
                Modal::Message("no undecided conflicts left".into())
            } else {
                Modal::ConfirmAcceptAll { count }
            });
            vec![]
        }
        _ => vec![],
    }
}

/// Work on the cluster: commit, rollback, pause, retry, sync, rescan, export.
fn work_key(model: &mut Model, action: KeyAction) -> Vec<Command> {
    match action {
        KeyAction::Commit if model.screen == Screen::Rollback => commit::confirm_rollback(model),
        KeyAction::IncludeInUse => {
            if model.rollback.as_ref().is_some_and(|rb| !rb.include_in_use) {
                model.modal = Some(Modal::ConfirmIncludeInUse {
                    typed: Default::default(),
                });
            }
            vec![]
        }
        KeyAction::Commit => {
            if matches!(
                model.commit.phase,
                CommitPhase::Running | CommitPhase::Stopping
            ) || model.scan.scanning
            {
                return vec![];
            }
            let undecided = model.undecided();
            model.modal = Some(if undecided > 0 {
                Modal::Message(format!(
                    "{undecided} remap/duplicate conflicts still need a decision (screen 3; A accepts all)"
                ))
            } else {
                Modal::ConfirmCommit {
                    typed: TextField::default(),
                }
            });
            vec![]
        }
        KeyAction::Pause => pause(model),
        KeyAction::StartSync => {
            if model.sync.running {
                model.modal = Some(Modal::Message(
                    "sync is already running: screen 5 shows it, Ctrl-C stops it".into(),
                ));
                return vec![];
            }
            if model.scan.scanning {
                // The rescan after a commit: sync's confirmation opens on its result.
                model.sync.start_after_scan = true;
                model.status = "sync's confirmation opens once the scan is in".into();
                return vec![];
            }
            if matches!(
                model.commit.phase,
                CommitPhase::Running | CommitPhase::Stopping
            ) {
                model.modal = Some(Modal::Message(
                    "a commit is running: sync starts once it is done".into(),
                ));
                return vec![];
            }
            commit::confirm_sync(model);
            vec![]
        }
        KeyAction::Retry => {
            if model.commit.phase != CommitPhase::Done || !model.commit.has_work_left() {
                model.status = "nothing to retry or resume: no write was paused or failed".into();
                return vec![];
            }
            if model.rollback.is_some() {
                return commit::start_rollback(model);
            }
            if model.scan.scanning {
                // The rescan after the commit is still running: resume on its result.
                model.commit.resume_after_scan = true;
                model.status = "resuming once the rescan is in".into();
                return vec![];
            }
            start_commit(model)
        }
        KeyAction::Rescan if model.rollback.is_some() => commit::plan_rollback(model),
        KeyAction::Rescan => {
            // The preflight counts what the scan reads: both are read again.
            let mut cmds = vec![Command::Send(ServiceRequest::Preflight)];
            cmds.extend(rescan(model));
            cmds
        }
        KeyAction::Export => {
            model.modal = Some(Modal::Export {
                input: TextField::new("cilium-idmig-export"),
                error: None,
            });
            vec![]
        }
        _ => vec![],
    }
}

fn nav(model: &mut Model, delta: isize) -> Vec<Command> {
    move_selection(model, delta);
    vec![]
}

fn step_conflict(model: &mut Model, forward: bool) -> Vec<Command> {
    let all: Vec<usize> = model.conflicts().collect();
    if all.is_empty() {
        return vec![];
    }
    let pos = model
        .review
        .conflict
        .and_then(|c| all.iter().position(|&i| i == c));
    let next = match (pos, forward) {
        (None, _) => 0,
        (Some(p), true) => (p + 1) % all.len(),
        (Some(p), false) => (p + all.len() - 1) % all.len(),
    };
    model.review.conflict = Some(all[next]);
    model.review.label_scroll = 0;
    vec![]
}

/// Mouse wheel events become scroll messages.
pub fn scroll_of(kind: MouseEventKind) -> Option<i32> {
    match kind {
        MouseEventKind::ScrollUp => Some(-3),
        MouseEventKind::ScrollDown => Some(3),
        _ => None,
    }
}
