//! Starting, stopping and following a commit: the only place the commit's phase changes
//! in answer to the operator (the engine's answers are folded in by `update`).

use std::time::{Duration, Instant};

use crate::app::service::ServiceRequest;
use crate::apply::outcome::{ApplyEvent, Outcome};
use crate::tui::model::{CommitPhase, CommitState, Modal, Model, Screen};
use crate::tui::msg::Command;

/// Ctrl-C, SIGTERM, SIGHUP: a running commit stops starting writes and the TUI quits once
/// those in flight finish; with no commit running, quit now.
pub(super) fn stop_or_quit(model: &mut Model) -> Vec<Command> {
    match model.commit.phase {
        CommitPhase::Running => {
            model.commit.phase = CommitPhase::Stopping;
            model.quit_after_commit = true;
            model.status = "stopping: no new writes; waiting for those in flight".into();
            vec![Command::Send(ServiceRequest::Stop)]
        }
        CommitPhase::Stopping => {
            model.quit_after_commit = true;
            vec![]
        }
        CommitPhase::Idle | CommitPhase::Done if model.sync.running => {
            // Sync ends after its writes in flight; the TUI quits then.
            model.sync.stopping = true;
            model.quit_after_commit = true;
            model.status = "stopping sync: no new writes; waiting for those in flight".into();
            vec![Command::Send(ServiceRequest::StopSync)]
        }
        CommitPhase::Idle | CommitPhase::Done => {
            model.quit = true;
            vec![]
        }
    }
}

/// Stops starting writes and stays on the commit screen; `r` resumes (a commit of the same
/// decisions writes only what is still missing).
pub(super) fn pause(model: &mut Model) -> Vec<Command> {
    if model.commit.phase != CommitPhase::Running {
        model.status = "nothing to pause: no writes are running".into();
        return vec![];
    }
    model.commit.phase = CommitPhase::Stopping;
    model.status = "pausing: no new writes; waiting for those in flight (r resumes)".into();
    vec![Command::Send(ServiceRequest::Stop)]
}

/// Folds one executor event into the commit's state.
pub(super) fn on_apply(c: &mut CommitState, ev: ApplyEvent) {
    match ev {
        ApplyEvent::CrdCreating => {
            c.crd_note = Some("creating CRD ciliumidentities.cilium.io ...".into())
        }
        ApplyEvent::CrdEstablished => {
            c.crd_note = Some("CRD ciliumidentities.cilium.io created and Established".into())
        }
        ApplyEvent::Started { writes, total, .. } => {
            c.writes = writes;
            c.total = total;
        }
        // Totals arrive on the progress watch; events carry what needs a line of its own.
        ApplyEvent::Retrying { .. } => {}
        ApplyEvent::Stopping { reason } => c.stop_reason = Some(reason),
        ApplyEvent::Problem(r) => match r.outcome {
            Outcome::Failed => c
                .failures
                .push((r.id.clone(), r.error.clone().unwrap_or_default())),
            Outcome::Conflict => c.failures.push((
                r.id.clone(),
                format!("conflict: {}", r.existing.as_deref().unwrap_or("")),
            )),
            _ => {}
        },
    }
}

/// Sends the items, with their decisions, to be written; only the confirm popup calls this.
pub(super) fn start_commit(model: &mut Model) -> Vec<Command> {
    let generation = model.commit.generation + 1;
    model.commit = CommitState {
        phase: CommitPhase::Running,
        generation,
        started: Some(Instant::now()),
        elapsed: Duration::ZERO,
        ..Default::default()
    };
    model.screen = Screen::Commit;
    vec![Command::Send(ServiceRequest::Commit {
        generation,
        items: model.cluster.items.clone(),
    })]
}

/// Asks for (a fresh read of) the rollback plan.
pub(super) fn plan_rollback(model: &mut Model) -> Vec<Command> {
    let Some(rb) = &mut model.rollback else {
        return vec![];
    };
    rb.generation += 1;
    rb.ops = None;
    model.status = "reading the objects the runs created…".into();
    vec![Command::Send(ServiceRequest::PlanRollback {
        generation: rb.generation,
        spec: rb.spec(),
    })]
}

/// The operator typed `in use`: identities live endpoints use are planned for deletion too.
pub(super) fn include_in_use(model: &mut Model) -> Vec<Command> {
    let Some(rb) = &mut model.rollback else {
        return vec![];
    };
    rb.include_in_use = true;
    plan_rollback(model)
}

/// Enter on the rollback screen: the typed-`yes` popup, once there is something to delete.
pub(super) fn confirm_rollback(model: &mut Model) -> Vec<Command> {
    if matches!(
        model.commit.phase,
        CommitPhase::Running | CommitPhase::Stopping
    ) {
        return vec![];
    }
    let Some(ops) = model.rollback.as_ref().and_then(|rb| rb.ops.as_ref()) else {
        return vec![];
    };
    let s = crate::app::rollback::summarize(ops);
    model.modal = Some(if s.delete + s.gone + s.restore == 0 {
        Modal::Message("nothing to delete: every object these runs created is gone or kept".into())
    } else {
        Modal::ConfirmRollback {
            typed: Default::default(),
        }
    });
    vec![]
}

/// Sends the rollback (re-planned by the service on a fresh read); only the confirm popup and
/// `r` call this.
pub(super) fn start_rollback(model: &mut Model) -> Vec<Command> {
    let Some(rb) = &model.rollback else {
        return vec![];
    };
    let generation = model.commit.generation + 1;
    let spec = rb.spec();
    model.commit = CommitState {
        phase: CommitPhase::Running,
        generation,
        started: Some(Instant::now()),
        rollback: true,
        ..Default::default()
    };
    vec![Command::Send(ServiceRequest::Rollback { generation, spec })]
}

/// Scrolls the rollback plan.
pub(super) fn scroll_rollback(model: &mut Model, delta: isize) {
    if let Some(rb) = &mut model.rollback {
        let rows = rb.ops.as_ref().map_or(0, Vec::len);
        rb.offset = (rb.offset as isize + delta).clamp(0, rows.saturating_sub(1) as isize) as usize;
    }
}

/// Starting sync writes: it takes the same typed `yes` as a commit.
pub(super) fn confirm_sync(model: &mut Model) {
    model.modal = Some(Modal::ConfirmSync {
        typed: crate::tui::model::TextField::default(),
    });
}
