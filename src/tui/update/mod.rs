//! `update(&mut Model, Msg) -> Vec<Command>`: every change to the TUI's state happens here,
//! synchronously; IO is only ever requested, as commands for the engine service.

use std::collections::HashMap;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEventKind};

mod commit;
mod decisions;
mod popups;

use super::keys::{KeyAction, action_for};
use super::model::{CommitPhase, Modal, Model, Screen, TextField};
use super::msg::{Command, Msg};
use crate::app::service::{ServiceEvent, ServiceRequest, Task};
use crate::core::planner::{Decision, PlanItem};
use commit::{on_apply, pause, start_commit, stop_or_quit};
use decisions::{decide, undo};
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
        Msg::Key(key) => on_key(model, key),
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
            }
            vec![]
        }
        Msg::Signal => stop_or_quit(model),
    }
}

fn on_engine(model: &mut Model, ev: ServiceEvent) -> Vec<Command> {
    match ev {
        ServiceEvent::Preflight(p) => {
            model.cluster.preflight = Some(p);
            vec![]
        }
        ServiceEvent::Scanned { generation, scan } => {
            if generation != model.scan.generation {
                return vec![]; // a stale scan
            }
            model.scan.scanning = false;
            model.scan.counting = true;
            model.scan.drift = (0, 0);
            model.scan.k8s_pending = false;
            model.scan.listing = None;
            let kept = merge_decisions(&model.cluster.items, scan.items);
            model.cluster.k8s = scan.k8s;
            model.cluster.crd_present = scan.crd_present;
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
            model.cluster.source = Some(scan.source);
            model.set_items(kept);
            model.review.undo.clear();
            let first = model.conflicts().next();
            model.review.conflict = first;
            // A resume asked for while this scan ran starts now, on the fresh items.
            if std::mem::take(&mut model.commit.resume_after_scan) {
                return start_commit(model);
            }
            vec![]
        }
        ServiceEvent::NodeCounts { generation, counts } => {
            if generation != model.scan.generation {
                return vec![];
            }
            model.scan.counting = false;
            for item in &mut model.cluster.items {
                item.nodes = counts.get(item.labels.as_bytes());
            }
            model.rebuild_view();
            vec![]
        }
        ServiceEvent::Failed {
            generation,
            task,
            error,
        } => {
            match task {
                Task::Scan if generation != model.scan.generation => return vec![],
                Task::Scan => {
                    model.scan.scanning = false;
                    model.scan.listing = None;
                }
                Task::NodeCount => model.scan.counting = false,
                Task::Apply => {
                    model.commit.phase = CommitPhase::Done;
                    model.commit.started = None;
                    if model.quit_after_commit {
                        model.quit = true;
                    }
                }
                Task::Rollback => {
                    if model.commit.phase != CommitPhase::Idle {
                        model.commit.phase = CommitPhase::Done;
                    }
                    model.commit.started = None;
                    if model.quit_after_commit {
                        model.quit = true;
                    }
                }
                Task::Sync => {
                    model.sync.running = false;
                    model.sync.following = false;
                    model.sync.stopping = false;
                    if model.quit_after_commit {
                        model.quit = true;
                    }
                }
                Task::DecisionLog | Task::DriftWatch | Task::Export | Task::Resume => {}
            }
            model.modal = Some(Modal::Message(format!("{task} failed: {error}")));
            vec![]
        }
        ServiceEvent::Apply(ev) => {
            on_apply(&mut model.commit, ev);
            vec![]
        }
        ServiceEvent::Committed {
            generation,
            run,
            verify,
        } => {
            let report = run.report;
            if generation != model.commit.generation {
                return vec![];
            }
            model.commit.phase = CommitPhase::Done;
            model.commit.started = None;
            model.commit.stop_reason = report.stopped.clone();
            model.commit.retries = report.retries;
            model.commit.report = Some(report);
            model.commit.verify = verify;
            if model.quit_after_commit {
                model.quit = true;
            }
            // The cluster changed: read it again so the screen shows what is there now.
            if model.rollback.is_some() {
                return commit::plan_rollback(model);
            }
            rescan(model)
        }
        ServiceEvent::KvRead { generation, items } => {
            // The first scan shows the kvstore side at once; a rescan keeps the table it has.
            if generation == model.scan.generation && model.cluster.items.is_empty() {
                model.scan.k8s_pending = true;
                model.status = format!(
                    "read {} kvstore identities; listing Kubernetes…",
                    items.len()
                );
                model.set_items(items);
            }
            vec![]
        }
        ServiceEvent::Listing {
            generation,
            listed,
            elapsed,
        } => {
            if generation == model.scan.generation && model.scan.scanning {
                model.scan.listing = Some((listed, elapsed));
            }
            vec![]
        }
        ServiceEvent::Drift { added, removed } => {
            model.scan.drift = (added, removed);
            vec![]
        }
        ServiceEvent::DriftCompacted => {
            model.status = "the kvstore was compacted past the watched revision: rescanning".into();
            rescan(model)
        }
        ServiceEvent::Resumed {
            generation,
            from,
            resumed,
            dropped,
        } => {
            if generation != model.scan.generation {
                return vec![];
            }
            let from: Vec<String> = from.iter().map(|p| p.display().to_string()).collect();
            model.status = format!(
                "resumed {resumed} decisions from {}; {} dropped",
                from.join(", "),
                dropped.len()
            );
            if !dropped.is_empty() {
                let mut text = format!(
                    "Resumed {resumed} decisions. {} no longer fit and were dropped (their items keep the fresh proposal):",
                    dropped.len()
                );
                for d in dropped.iter().take(12) {
                    text.push_str(&format!("\n  {}: {}", d.id, d.reason));
                }
                if dropped.len() > 12 {
                    text.push_str(&format!("\n  ... and {} more", dropped.len() - 12));
                }
                model.modal = Some(Modal::Message(text));
            }
            vec![]
        }
        ServiceEvent::ResumeOffer {
            path,
            decisions,
            operator,
            when,
        } => {
            if model.modal.is_none() {
                model.modal = Some(Modal::ResumeOffer {
                    path,
                    decisions,
                    operator,
                    when,
                });
            } else {
                model.status = format!(
                    "{} holds {decisions} decisions never committed: restart with --resume {} to resume them",
                    path.display(),
                    path.display()
                );
            }
            vec![]
        }
        ServiceEvent::Sync(ev) => on_sync(model, ev),
        ServiceEvent::SyncEnded { end } => {
            model.sync.running = false;
            model.sync.following = false;
            model.sync.stopping = false;
            model.sync.push(format!("sync ended: {}", end.status));
            if model.quit_after_commit {
                model.quit = true;
            }
            vec![]
        }
        ServiceEvent::RollbackPlanned { generation, ops } => {
            let Some(rb) = &mut model.rollback else {
                return vec![];
            };
            if generation != rb.generation {
                return vec![];
            }
            let s = crate::app::rollback::summarize(&ops);
            model.status = format!(
                "rollback plan: {} to delete, {} already gone, {} kept",
                s.delete, s.gone, s.keep
            );
            rb.ops = Some(ops);
            rb.offset = 0;
            vec![]
        }
        ServiceEvent::Exported { paths } => {
            let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            model.modal = Some(Modal::Message(format!("exported {}", list.join(" and "))));
            vec![]
        }
    }
}

/// Folds what a running sync reports into the Sync screen; a conflict found live joins the
/// Conflicts screen (a rescan brings it in, keeping every decision), marked as new.
fn on_sync(model: &mut Model, ev: crate::app::sync::SyncEvent) -> Vec<Command> {
    use crate::app::sync::SyncEvent;
    match ev {
        SyncEvent::Status(s) => {
            model.sync.status = Some(s);
            vec![]
        }
        SyncEvent::Conflict { id, kind, reason } => {
            model.sync.push(format!(
                "conflict: {id} is a {kind} and waits for a decision: {reason}"
            ));
            model.review.new_since_snapshot.insert(id);
            if model.scan.scanning {
                vec![]
            } else {
                rescan(model)
            }
        }
        SyncEvent::Split(split) => {
            model.sync.push(split.to_string());
            vec![]
        }
        SyncEvent::Invalid { id, reason } => {
            model
                .sync
                .push(format!("invalid: {id}: {reason} (never written)"));
            vec![]
        }
        SyncEvent::Following => {
            model.sync.following = true;
            model.sync.push("sync started: following both sides".into());
            vec![]
        }
        SyncEvent::Trouble(t) => {
            model.sync.push(format!("retrying: {t}"));
            vec![]
        }
        SyncEvent::Note(n) => {
            model.sync.push(n);
            vec![]
        }
        SyncEvent::Moot { id, labels } => {
            model.sync.push(crate::app::sync::moot_text(&id, &labels));
            vec![]
        }
        SyncEvent::Cutover(report) => {
            model.sync.cutover = true;
            model.sync.push(report.to_string());
            vec![]
        }
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
    model.scan.generation += 1;
    model.scan.scanning = true;
    vec![Command::Send(ServiceRequest::Scan {
        generation: model.scan.generation,
    })]
}

fn move_selection(model: &mut Model, delta: isize) {
    if model.table.view.is_empty() {
        return;
    }
    let max = model.table.view.len() as isize - 1;
    model.table.selected = (model.table.selected as isize + delta).clamp(0, max) as usize;
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
        KeyAction::Quit => {
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
        KeyAction::Stop => stop_or_quit(model),
        KeyAction::Help => {
            model.modal = Some(Modal::Help);
            vec![]
        }
        KeyAction::NextScreen => {
            let tabs = model.tabs;
            let i = tabs.iter().position(|s| *s == model.screen).unwrap_or(0);
            model.screen = tabs[(i + 1) % tabs.len()];
            vec![]
        }
        KeyAction::Go(s) => {
            if model.tabs.contains(&s) {
                model.screen = s;
            }
            vec![]
        }
        KeyAction::Up | KeyAction::Down | KeyAction::PageUp | KeyAction::PageDown
            if model.screen == Screen::Rollback =>
        {
            let page = model.table.page as isize;
            let delta = match action {
                KeyAction::Up => -1,
                KeyAction::Down => 1,
                KeyAction::PageUp => -page,
                _ => page,
            };
            commit::scroll_rollback(model, delta);
            vec![]
        }
        KeyAction::Up => nav(model, -1),
        KeyAction::Down => nav(model, 1),
        KeyAction::PageUp => nav(model, -(model.table.page as isize)),
        KeyAction::PageDown => nav(model, model.table.page as isize),
        KeyAction::Home => nav(model, isize::MIN / 2),
        KeyAction::End => nav(model, isize::MAX / 2),
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
            if let Some(&index) = model.table.view.get(model.table.selected) {
                model.modal = Some(Modal::Detail { index });
            }
            vec![]
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
            if model.sync.running || model.scan.scanning {
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
            model.sync.running = true;
            // "started" waits for both watches (`SyncEvent::Following`).
            model.sync.push("sync starting: reading both sides".into());
            model.screen = Screen::Sync;
            vec![Command::Send(ServiceRequest::StartSync {
                accept_proposals: false,
            })]
        }
        KeyAction::Retry => {
            if model.commit.phase != CommitPhase::Done || !model.commit.has_work_left() {
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
        KeyAction::Rescan => rescan(model),
        KeyAction::Export => {
            model.modal = Some(Modal::Export {
                input: TextField::new("cilium-idmig-export"),
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
        .review
        .conflict
        .and_then(|c| all.iter().position(|&i| i == c));
    let next = match (pos, forward) {
        (None, _) => 0,
        (Some(p), true) => (p + 1) % all.len(),
        (Some(p), false) => (p + all.len() - 1) % all.len(),
    };
    model.review.conflict = Some(all[next]);
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
