//! What the engine reports, folded into the model: scans, commits and rollbacks, resumes,
//! failures, and a running sync's reports. Stale results are dropped by generation.

use std::collections::HashMap;

use super::super::model::{CommitPhase, Modal, Model};
use super::super::msg::Command;
use super::commit::{self, on_apply, start_commit};
use crate::app::service::{ServiceEvent, ServiceRequest, Task};
use crate::core::planner::PlanItem;

pub(super) fn on_engine(model: &mut Model, ev: ServiceEvent) -> Vec<Command> {
    match ev {
        ServiceEvent::Preflight(p) => {
            model.cluster.preflight = Some(p);
            vec![]
        }
        ServiceEvent::Scanned { generation, scan } => scanned(model, generation, *scan),
        ServiceEvent::NodeCounts { generation, counts } => {
            on_node_counts(model, generation, &counts);
            vec![]
        }
        ServiceEvent::Failed {
            generation,
            task,
            error,
        } => failed(model, generation, task, error),
        ServiceEvent::Apply(ev) => {
            on_apply(&mut model.commit, ev);
            vec![]
        }
        ServiceEvent::ServerWarning { text } => {
            // As kubectl shows it; the decision log keeps it with the run's record.
            model.status = format!("Warning (from the API server): {text}");
            vec![]
        }
        ServiceEvent::Committed {
            generation,
            run,
            verify,
        } => committed(model, generation, *run, verify),
        ServiceEvent::KvRead { generation, items } => {
            on_kv_read(model, generation, items);
            vec![]
        }
        ServiceEvent::Listing {
            generation,
            listed,
            elapsed,
        } => {
            on_listing(model, generation, (listed, elapsed));
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
        } => on_resumed(model, generation, from, resumed, dropped),
        ServiceEvent::ResumeOffer {
            path,
            decisions,
            operator,
            when,
        } => {
            on_resume_offer(model, path, decisions, operator, when);
            vec![]
        }
        ServiceEvent::NodesUsing { id, nodes: names } => {
            on_nodes_using(model, &id, names);
            vec![]
        }
        ServiceEvent::Audited { generation, run } => {
            on_audited(model, generation, run);
            vec![]
        }
        ServiceEvent::SwitchRead { generation, report } => {
            if generation == model.switch.generation {
                model.switch.arrived(report);
            }
            vec![]
        }
        ServiceEvent::Sync(ev) => on_sync(model, ev),
        ServiceEvent::SyncEnded { end } => {
            on_sync_ended(model, &end);
            vec![]
        }
        ServiceEvent::RollbackPlanned { generation, ops } => {
            on_rollback_planned(model, generation, ops);
            vec![]
        }
        ServiceEvent::Exported { paths } => {
            on_exported(model, &paths);
            vec![]
        }
    }
}

/// How far the Kubernetes list of the scan under way has come.
fn on_listing(model: &mut Model, generation: u64, listing: (usize, std::time::Duration)) {
    if generation == model.scan.generation && model.scan.scanning {
        model.scan.listing = Some(listing);
    }
}

/// An audit's run, shown if it is the one asked for last.
fn on_audited(model: &mut Model, generation: u64, run: Box<crate::app::audit::AuditRun>) {
    if generation == model.audit.generation {
        model.audit.running = false;
        model.audit.offset = 0;
        model.audit.run = Some(run);
    }
}

/// An export's files, named in a message.
fn on_exported(model: &mut Model, paths: &[std::path::PathBuf]) {
    model.exporting = None;
    let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    model.modal = Some(Modal::Message(format!("exported {}", list.join(" and "))));
}

/// The kvstore's side of the first scan, shown at once; a rescan keeps the table it has.
fn on_kv_read(model: &mut Model, generation: u64, items: Vec<crate::core::planner::PlanItem>) {
    if generation == model.scan.generation && model.cluster.items.is_empty() {
        model.scan.k8s_pending = true;
        model.status = format!(
            "read {} kvstore identities; listing Kubernetes…",
            items.len()
        );
        model.set_items(items);
    }
}

/// The nodes using an identity, for its details if they are still open; a later answer
/// for another is dropped.
fn on_nodes_using(model: &mut Model, id: &str, names: Option<Vec<String>>) {
    if let Some(crate::tui::model::Modal::Detail { index, nodes }) = &mut model.modal
        && model.cluster.items.get(*index).is_some_and(|i| i.id == id)
    {
        *nodes = Some(names);
    }
}

/// A scan's node counts, unless sync's (from its watch, newer than any scan's read) are
/// shown already.
fn on_node_counts(model: &mut Model, generation: u64, counts: &crate::core::kvstore::NodeCounts) {
    if generation != model.scan.generation {
        return;
    }
    model.scan.counting = false;
    if model.sync.node_counts.is_none() {
        set_node_counts(&mut model.cluster.items, counts);
        model.rebuild_view();
    }
}

/// An earlier session's decisions never committed: offered at once, or named on the status
/// line when a popup is open.
fn on_resume_offer(
    model: &mut Model,
    path: std::path::PathBuf,
    decisions: usize,
    operator: String,
    when: String,
) {
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
}

fn on_sync_ended(model: &mut Model, end: &crate::app::sync::SyncEnd) {
    model.sync.running = false;
    model.sync.following = false;
    model.sync.stopping = false;
    // No longer followed: the next scan's counts are the newest again.
    model.sync.node_counts = None;
    model.sync.push(format!("sync ended: {}", end.status));
    if model.quit_after_commit {
        model.quit = true;
    }
}

/// A rollback's plan, for the rollback it answers (a stale one is dropped).
fn on_rollback_planned(model: &mut Model, generation: u64, ops: Vec<crate::core::planner::Op>) {
    let Some(rb) = &mut model.rollback else {
        return;
    };
    if generation != rb.generation {
        return;
    }
    let s = crate::app::rollback::summarize(&ops);
    model.status = format!(
        "rollback plan: {} to delete, {} already gone, {} kept{}",
        s.delete,
        s.gone,
        s.keep,
        match s.restore {
            0 => String::new(),
            n => format!(", {n} to restore"),
        }
    );
    rb.ops = Some(ops);
    rb.offset = 0;
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
        SyncEvent::NodeCounts(counts) => {
            set_node_counts(&mut model.cluster.items, &counts);
            model.rebuild_view();
            model.sync.node_counts = Some(counts);
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
        SyncEvent::Invalid { id, reason, .. } => {
            model.sync.push(if reason.contains("never written") {
                format!("invalid: {id}: {reason}")
            } else {
                format!("invalid: {id}: {reason} (never written)")
            });
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
            // Closed without a write: no longer waiting for a decision on any screen (a
            // decided item keeps its decision through rescans).
            if let Some(item) = model
                .cluster
                .items
                .iter_mut()
                .find(|i| i.id == id && i.labels == labels)
            {
                let _ = crate::core::planner::Decision::Skip.apply_to(item);
                model.rebuild_view();
            }
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

pub(super) fn rescan(model: &mut Model) -> Vec<Command> {
    model.scan.generation += 1;
    model.scan.scanning = true;
    vec![Command::Send(ServiceRequest::Scan {
        generation: model.scan.generation,
    })]
}

fn scanned(
    model: &mut Model,
    generation: u64,
    scan: crate::app::service::ScanResult,
) -> Vec<Command> {
    if generation != model.scan.generation {
        return vec![]; // a stale scan
    }
    model.scan.scanning = false;
    model.scan.counting = true;
    model.scan.drift = (0, 0);
    model.scan.k8s_pending = false;
    model.scan.listing = None;
    // The planner's proposals, before kept decisions cover them: what `a` takes.
    let mut proposals: std::collections::HashMap<_, _> = scan
        .items
        .iter()
        .filter(|i| i.kind.is_conflict())
        .map(|i| (i.id.clone(), (i.action, i.target_id)))
        .collect();
    let mut kept = merge_decisions(&model.cluster.items, scan.items);
    // A kept decision holds its target: no fresh proposal may land on it too.
    crate::core::planner::repropose_taken_targets(&mut kept, &scan.k8s, model.cluster.range);
    for i in kept.iter().filter(|i| i.kind.is_conflict() && !i.decided) {
        proposals.insert(i.id.clone(), (i.action, i.target_id));
    }
    model.review.proposals = proposals;
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
    if let Some(counts) = &model.sync.node_counts {
        set_node_counts(&mut model.cluster.items, counts);
        model.rebuild_view();
    }
    model.review.undo.clear();
    let first = model.conflicts().next();
    model.review.conflict = first;
    // A resume asked for while this scan ran starts now, on the fresh items.
    if std::mem::take(&mut model.commit.resume_after_scan) {
        return start_commit(model);
    }
    // So does sync's confirmation, asked for with `y` meanwhile (unless a popup is up).
    if std::mem::take(&mut model.sync.start_after_scan)
        && model.modal.is_none()
        && !model.sync.running
    {
        commit::confirm_sync(model);
    }
    vec![]
}

/// Every identity's node count from `counts`: the table, its sort, the detail popup and the
/// conflicts all read them from the items (rebuild the view after).
fn set_node_counts(items: &mut [PlanItem], counts: &crate::core::kvstore::NodeCounts) {
    for item in items {
        item.nodes = counts.of_identity(item.labels.as_bytes(), item.id.as_bytes());
    }
}

fn failed(
    model: &mut Model,
    generation: u64,
    task: Task,
    error: std::sync::Arc<crate::Error>,
) -> Vec<Command> {
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
        Task::Audit if generation != model.audit.generation => return vec![],
        Task::Audit => model.audit.running = false,
        Task::Switch if generation != model.switch.generation => return vec![],
        Task::Switch => model.switch.running = false,
        // The prompt again, its path kept and why it failed said: what the operator types
        // next goes into it, never to the screen behind as commands.
        Task::Export => {
            let path = model.exporting.take().unwrap_or_default();
            model.modal = Some(Modal::Export {
                input: crate::tui::model::TextField::new(path),
                error: Some(format!("{task} failed: {error}")),
            });
            return vec![];
        }
        Task::DecisionLog | Task::DriftWatch | Task::Resume => {}
    }
    model.modal = Some(Modal::Message(format!("{task} failed: {error}")));
    vec![]
}

fn committed(
    model: &mut Model,
    generation: u64,
    run: crate::app::flows::ApplyRun,
    verify: Option<crate::core::verify::VerifyReport>,
) -> Vec<Command> {
    let report = run.report;
    if generation != model.commit.generation {
        return vec![];
    }
    model.commit.phase = CommitPhase::Done;
    model.commit.started = None;
    model.commit.stop_reason = report.stopped.clone();
    model.commit.retries = report.retries;
    // The report is the last word: the progress watch may lag it by a write or two.
    use crate::apply::outcome::Outcome;
    model.commit.created = report.count(Outcome::Created);
    model.commit.done = report.results.len();
    if !model.commit.rollback {
        model.session.commits += 1;
        model.session.created += report.count(Outcome::Created);
        model.session.already_there += report.count(Outcome::AlreadyExisted);
    }
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

fn on_resumed(
    model: &mut Model,
    generation: u64,
    from: Vec<std::path::PathBuf>,
    count: usize,
    dropped: Vec<crate::core::planner::resume::Dropped>,
) -> Vec<Command> {
    if generation != model.scan.generation {
        return vec![];
    }
    let from: Vec<String> = from.iter().map(|p| p.display().to_string()).collect();
    model.status = format!(
        "resumed {count} decisions from {}; {} dropped",
        from.join(", "),
        dropped.len()
    );
    if !dropped.is_empty() {
        let mut text = format!(
            "Resumed {count} decisions. {} no longer fit and were dropped (their items keep the fresh proposal):",
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
