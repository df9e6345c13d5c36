//! `update(&mut Model, Msg) -> Vec<Command>`: every change to the TUI's state happens here,
//! synchronously; IO is only ever requested, as commands for the engine service.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEventKind};

use super::decisions::{decide, undo};
use super::keys::{Action, action_for};
use super::model::{CommitPhase, CommitState, Modal, Model, Screen};
use super::popups::on_modal_key;
use crate::engine::{EngineEvent, Outcome, Progress};
use crate::planner::{Action as PlanAction, Kind, PlanItem};
use crate::service::{Event, Request};

/// Inputs to `update`.
#[derive(Debug, Clone)]
pub enum Msg {
    Key(KeyEvent),
    Scroll(i32),
    Resize {
        rows: u16,
    },
    /// A frame tick; `elapsed` is time since the commit started, when one runs.
    Tick {
        now: Instant,
    },
    Engine(Event),
    /// The running commit's totals (from the engine's watch channel).
    Progress(Progress),
    /// SIGTERM or SIGHUP (a dropped SSH session): behave like Ctrl-C.
    Signal,
}

/// What `update` asks the runtime to do.
#[derive(Debug, Clone)]
pub enum Command {
    Send(Request),
}

/// Commands to run at start.
pub fn init(model: &mut Model) -> Vec<Command> {
    model.generation += 1;
    model.scanning = true;
    vec![
        Command::Send(Request::Preflight),
        Command::Send(Request::Scan {
            generation: model.generation,
        }),
    ]
}

pub fn update(model: &mut Model, msg: Msg) -> Vec<Command> {
    match msg {
        Msg::Key(key) => on_key(model, key),
        Msg::Scroll(n) => {
            if model.screen == Screen::Identities && model.modal.is_none() {
                move_selection(model, n as isize);
            }
            vec![]
        }
        Msg::Resize { rows } => {
            // Header, tabs, table header, footer and borders take 8 rows.
            model.page = usize::from(rows).saturating_sub(8).max(1);
            model.clamp_offset();
            vec![]
        }
        Msg::Tick { now } => {
            if let Some(start) = model.commit_started {
                model.commit.elapsed = now.saturating_duration_since(start);
            }
            vec![]
        }
        Msg::Engine(ev) => on_engine(model, ev),
        Msg::Progress(p) => {
            let c = &mut model.commit;
            if matches!(c.phase, CommitPhase::Running | CommitPhase::Stopping) {
                (c.total, c.writes, c.done, c.created, c.retries) =
                    (p.total, p.writes, p.done, p.created, p.retries);
            }
            vec![]
        }
        Msg::Signal => stop_or_quit(model),
    }
}

pub(super) fn stop_or_quit(model: &mut Model) -> Vec<Command> {
    if model.commit.phase == CommitPhase::Running {
        model.commit.phase = CommitPhase::Stopping;
        model.quit_after_commit = true;
        model.status = "stopping: no new writes; waiting for those in flight".into();
        vec![Command::Send(Request::Stop)]
    } else if model.commit.phase == CommitPhase::Stopping {
        model.quit_after_commit = true;
        vec![]
    } else {
        model.quit = true;
        vec![]
    }
}

fn on_engine(model: &mut Model, ev: Event) -> Vec<Command> {
    match ev {
        Event::Preflight(p) => {
            model.preflight = Some(p);
            vec![]
        }
        Event::Scanned { generation, scan } => {
            if generation != model.generation {
                return vec![]; // a stale scan
            }
            model.scanning = false;
            model.counting = true;
            model.drift = (0, 0);
            let kept = merge_decisions(&model.items, scan.items);
            model.k8s = scan.k8s;
            model.crd_present = scan.crd_present;
            model.status = format!(
                "scanned {} identities at revision {}{}",
                kept.len(),
                scan.source.revision,
                if scan.other_names > 0 {
                    format!("; {} CiliumIdentity names are not ids", scan.other_names)
                } else {
                    String::new()
                }
            );
            model.source = Some(scan.source);
            model.set_items(kept);
            model.undo.clear();
            let first = model.conflicts().next();
            model.conflict = first;
            vec![]
        }
        Event::NodeCounts { generation, counts } => {
            if generation != model.generation {
                return vec![];
            }
            model.counting = false;
            for item in &mut model.items {
                item.nodes = counts.get(&item.labels).copied().unwrap_or(0);
            }
            model.rebuild_view();
            vec![]
        }
        Event::Failed {
            generation,
            what,
            error,
        } => {
            if generation != 0 && generation != model.generation && what == "scan" {
                return vec![];
            }
            if what == "scan" {
                model.scanning = false;
            }
            if what == "node count" {
                model.counting = false;
            }
            if what == "commit" {
                model.commit.phase = CommitPhase::Done;
                model.commit_started = None;
            }
            model.modal = Some(Modal::Message(format!("{what} failed: {error}")));
            if model.quit_after_commit && what == "commit" {
                model.quit = true;
            }
            vec![]
        }
        Event::Apply(ev) => {
            on_apply(&mut model.commit, ev);
            vec![]
        }
        Event::Committed {
            generation,
            report,
            verify,
        } => {
            if generation != model.commit.generation {
                return vec![];
            }
            model.commit.phase = CommitPhase::Done;
            model.commit_started = None;
            model.commit.stop_reason = report.stopped.clone();
            model.commit.retries = report.retries;
            model.commit.report = Some(report);
            model.commit.verify = verify;
            if model.quit_after_commit {
                model.quit = true;
            }
            // The cluster changed: read it again so the table shows what is there now.
            rescan(model)
        }
        Event::Drift { added, removed } => {
            model.drift = (added, removed);
            vec![]
        }
        Event::DriftCompacted { .. } => {
            model.status = "the kvstore was compacted past the watched revision: rescanning".into();
            rescan(model)
        }
        Event::Exported { paths } => {
            let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            model.modal = Some(Modal::Message(format!("exported {}", list.join(" and "))));
            vec![]
        }
    }
}

fn on_apply(c: &mut CommitState, ev: EngineEvent) {
    match ev {
        EngineEvent::CrdCreating => {
            c.crd_note = Some("creating CRD ciliumidentities.cilium.io ...".into())
        }
        EngineEvent::CrdEstablished => {
            c.crd_note = Some("CRD ciliumidentities.cilium.io created and Established".into())
        }
        EngineEvent::Started { writes, total } => {
            c.writes = writes;
            c.total = total;
        }
        // Totals arrive on the progress watch; events carry what needs a line of its own.
        EngineEvent::Retrying { .. } => {}
        EngineEvent::Stopping { reason } => c.stop_reason = Some(reason),
        EngineEvent::Problem(r) => match &r.outcome {
            Outcome::Failed { error } => c.failures.push((r.id.clone(), error.clone())),
            Outcome::Conflict { existing } => c
                .failures
                .push((r.id.clone(), format!("conflict: {existing}"))),
            _ => {}
        },
    }
}

/// Keeps the operator's decisions for items whose id and labels did not change.
pub fn merge_decisions(old: &[PlanItem], mut new: Vec<PlanItem>) -> Vec<PlanItem> {
    let by_id: HashMap<&str, &PlanItem> = old
        .iter()
        .filter(|i| i.decided)
        .map(|i| (i.id.as_str(), i))
        .collect();
    for item in &mut new {
        if let Some(o) = by_id.get(item.id.as_str())
            && o.labels == item.labels
            && o.kind == item.kind
        {
            item.action = o.action;
            item.target_id = o.target_id;
            item.decided = true;
        }
    }
    new
}

fn rescan(model: &mut Model) -> Vec<Command> {
    model.generation += 1;
    model.scanning = true;
    vec![Command::Send(Request::Scan {
        generation: model.generation,
    })]
}

fn move_selection(model: &mut Model, delta: isize) {
    if model.view.is_empty() {
        return;
    }
    let max = model.view.len() as isize - 1;
    model.selected = (model.selected as isize + delta).clamp(0, max) as usize;
    model.clamp_offset();
}

fn on_key(model: &mut Model, key: KeyEvent) -> Vec<Command> {
    if let Some(modal) = model.modal.take() {
        return on_modal_key(model, modal, key);
    }
    let Some(action) = action_for(model.screen, &key) else {
        return vec![];
    };
    match action {
        Action::Quit => {
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
            model.quit = true;
            vec![]
        }
        Action::Stop => stop_or_quit(model),
        Action::Help => {
            model.modal = Some(Modal::Help);
            vec![]
        }
        Action::NextScreen => {
            let i = Screen::ALL
                .iter()
                .position(|s| *s == model.screen)
                .unwrap_or(0);
            model.screen = Screen::ALL[(i + 1) % Screen::ALL.len()];
            vec![]
        }
        Action::Go(s) => {
            model.screen = s;
            vec![]
        }
        Action::Up => nav(model, -1),
        Action::Down => nav(model, 1),
        Action::PageUp => nav(model, -(model.page as isize)),
        Action::PageDown => nav(model, model.page as isize),
        Action::Home => nav(model, isize::MIN / 2),
        Action::End => nav(model, isize::MAX / 2),
        Action::CycleFilter => {
            model.filter = model.filter.next();
            model.selected = 0;
            model.rebuild_view();
            vec![]
        }
        Action::Search => {
            model.modal = Some(Modal::Search {
                input: model.search.clone(),
            });
            vec![]
        }
        Action::CycleSort => {
            model.sort = model.sort.next();
            model.rebuild_view();
            vec![]
        }
        Action::ReverseSort => {
            model.descending = !model.descending;
            model.rebuild_view();
            vec![]
        }
        Action::Open => {
            if let Some(&i) = model.view.get(model.selected)
                && model.items[i].kind.is_conflict()
            {
                model.conflict = Some(i);
                model.screen = Screen::Conflicts;
            }
            vec![]
        }
        Action::NextConflict => step_conflict(model, true),
        Action::PrevConflict => step_conflict(model, false),
        Action::Accept => decide(model, "accept", |item| {
            item.decided = true;
            Ok(())
        }),
        Action::EditTarget => {
            if let Some(i) = model.conflict {
                let current = model.items[i]
                    .target_id
                    .map(|t| t.to_string())
                    .unwrap_or_default();
                model.modal = Some(Modal::EditTarget {
                    input: current,
                    error: None,
                });
            }
            vec![]
        }
        Action::Reuse => decide(model, "reuse", |item| match item.labels_present_at {
            Some(x) => {
                item.action = PlanAction::None;
                item.target_id = Some(x);
                item.decided = true;
                Ok(())
            }
            None => Err("no other id holds these labels".to_string()),
        }),
        Action::Skip => decide(model, "skip", |item| {
            item.action = PlanAction::Skip;
            item.decided = true;
            Ok(())
        }),
        Action::CreateAnyway => decide(model, "create-anyway", |item| {
            if item.kind != Kind::Duplicate {
                return Err("create anyway is for duplicates; use e to pick an id".into());
            }
            item.action = PlanAction::Create;
            item.target_id = item.numeric_id();
            item.decided = true;
            Ok(())
        }),
        Action::Undo => undo(model),
        Action::AcceptAll => {
            let count = model
                .conflicts()
                .filter(|&i| !model.items[i].decided)
                .count();
            model.modal = Some(if count == 0 {
                Modal::Message("no undecided conflicts left".into())
            } else {
                Modal::ConfirmAcceptAll { count }
            });
            vec![]
        }
        Action::Commit => {
            if matches!(
                model.commit.phase,
                CommitPhase::Running | CommitPhase::Stopping
            ) || model.scanning
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
                    typed: String::new(),
                }
            });
            vec![]
        }
        Action::Retry => {
            if model.commit.phase == CommitPhase::Done
                && !model.commit.failures.is_empty()
                && !model.scanning
            {
                return start_commit(model);
            }
            vec![]
        }
        Action::Rescan => rescan(model),
        Action::Export => {
            model.modal = Some(Modal::Export {
                input: "cilium-idmig-export".into(),
            });
            vec![]
        }
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
        .conflict
        .and_then(|c| all.iter().position(|&i| i == c));
    let next = match (pos, forward) {
        (None, _) => 0,
        (Some(p), true) => (p + 1) % all.len(),
        (Some(p), false) => (p + all.len() - 1) % all.len(),
    };
    model.conflict = Some(all[next]);
    vec![]
}

pub(super) fn start_commit(model: &mut Model) -> Vec<Command> {
    let generation = model.commit.generation + 1;
    model.commit = CommitState {
        phase: CommitPhase::Running,
        generation,
        ..Default::default()
    };
    model.commit_started = Some(Instant::now());
    model.commit.elapsed = Duration::ZERO;
    model.screen = Screen::Commit;
    vec![Command::Send(Request::Commit {
        generation,
        items: model.items.clone(),
    })]
}

/// Mouse wheel events become scroll messages.
pub fn scroll_of(kind: MouseEventKind) -> Option<i32> {
    match kind {
        MouseEventKind::ScrollUp => Some(-3),
        MouseEventKind::ScrollDown => Some(3),
        _ => None,
    }
}
