//! Popups: help (generated from the key table), search, target edit, confirmations, export.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::theme::{Theme, centered};
use crate::core::labels::parse_label_key;
use crate::core::planner::{Action, Kind};
use crate::tui::keys::bindings_for;
use crate::tui::model::{CommitPhase, Modal, Model, TextField};

/// `3 remap, 2 duplicate (1 already decided)`: what a bulk decision would touch.
fn describe_targets(model: &Model, targets: &[usize]) -> String {
    let items = &model.cluster.items;
    let mut parts: Vec<String> = [Kind::Remap, Kind::Reuse, Kind::Duplicate]
        .into_iter()
        .map(|k| (k, targets.iter().filter(|&&i| items[i].kind == k).count()))
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    if parts.is_empty() {
        parts.push("no conflicts".into());
    }
    let decided = targets.iter().filter(|&&i| items[i].decided).count();
    format!(
        "{}{}",
        parts.join(", "),
        if decided > 0 {
            format!(" ({decided} already decided)")
        } else {
            String::new()
        }
    )
}

/// A text field with its cursor drawn as a block.
fn with_cursor(field: &TextField) -> String {
    let (before, after) = field.split();
    format!("{before}█{after}")
}

/// Everything about one identity: each label on its own line, nodes, kind, reason, the
/// decision and who made it, and what Kubernetes holds at its id.
fn detail(
    model: &Model,
    index: usize,
    nodes: Option<&Option<Vec<String>>>,
    area: Rect,
) -> (&'static str, Vec<Line<'static>>, u16) {
    let item = &model.cluster.items[index];
    let mut lines = vec![Line::raw(format!(
        "id {}  ·  {}  ·  used by {} node(s)",
        item.id, item.kind, item.nodes
    ))];
    lines.push(Line::raw(match nodes {
        None => "nodes: reading…".to_string(),
        Some(None) => "nodes: not known (this kvstore source keeps counts only)".to_string(),
        Some(Some(n)) if n.is_empty() => "nodes: none uses it now".to_string(),
        Some(Some(n)) => format!("nodes: {}", crate::core::audit::names_list(n, 8)),
    }));
    let target = item.target_id.map_or("-".to_string(), |t| t.to_string());
    let decision = match item.action {
        Action::Create => format!("create at {target}"),
        Action::None if item.kind == Kind::AlreadyMigrated => "nothing to write".to_string(),
        Action::None => format!("write nothing; map to {target}"),
        Action::Skip => "skip: write nothing".to_string(),
    };
    let who = if item.kind == Kind::Invalid {
        "the rules (invalid entries are never written)"
    } else if item.decided {
        "decided by the operator"
    } else if item.kind.needs_decision() {
        "proposed, not decided yet"
    } else {
        "the planner's proposal"
    };
    lines.push(Line::raw(format!("decision: {decision} ({who})")));
    let k8s = item
        .numeric_id()
        .and_then(|id| model.cluster.k8s.get(&id))
        .map_or("nothing".to_string(), |l| {
            if *l == item.labels {
                "these labels".to_string()
            } else {
                l.clone()
            }
        });
    lines.push(Line::raw(format!("Kubernetes at {}: {k8s}", item.id)));
    lines.push(Line::raw("labels:"));
    let labels: Vec<String> = match parse_label_key(&item.labels) {
        Ok(ls) => ls
            .iter()
            .map(|l| format!("  {}:{} = {:?}", l.source, l.key, l.value))
            .collect(),
        Err(_) => vec![format!("  (not a valid label key) {}", item.labels)],
    };
    // Room for the lines around the labels, the borders and a wrapped reason.
    let room = usize::from(area.height.saturating_sub(16)).max(3);
    let shown = labels.len().min(room);
    for l in &labels[..shown] {
        lines.push(Line::raw(l.clone()));
    }
    if labels.len() > shown {
        lines.push(Line::raw(format!(
            "  ... and {} more",
            labels.len() - shown
        )));
    }
    let why = format!("why: {}", item.reason);
    // The popup is 96 wide: 94 columns of text.
    let why_rows = why.chars().count().div_ceil(94).max(1);
    lines.push(Line::raw(why));
    lines.push(Line::raw(if item.kind.is_conflict() {
        "Enter: review this conflict · any other key closes"
    } else {
        "any key closes"
    }));
    let h = (lines.len() + why_rows - 1) as u16 + 2;
    (" Identity ", lines, h)
}

/// The lines of a popup that asks for a typed word, and the word as typed so far.
fn typed_word(mut lines: Vec<Line<'static>>, typed: &TextField) -> Vec<Line<'static>> {
    lines.push(Line::styled(
        format!("> {}", with_cursor(typed)),
        Style::default().add_modifier(Modifier::BOLD),
    ));
    lines
}

/// The commit's confirmation: how many objects it may write, and where.
fn confirm_commit(model: &Model, typed: &TextField) -> (&'static str, Vec<Line<'static>>, u16) {
    let writes = crate::core::planner::WriteSummary::of(&model.cluster.items).creates();
    let server = model
        .cluster
        .preflight
        .as_ref()
        .map_or("the cluster", |p| p.server.as_str());
    let lines = vec![
        Line::raw(format!(
            "This writes up to {writes} CiliumIdentity objects to {server}."
        )),
        Line::raw("Nothing existing is overwritten. Type yes and press Enter (Esc cancels)."),
    ];
    (" Commit ", typed_word(lines, typed), 5)
}

/// Sync's confirmation: what it writes at once, whether a commit is still to be made, and
/// what it leaves to the operator.
fn confirm_sync(model: &Model, typed: &TextField) -> (&'static str, Vec<Line<'static>>, u16) {
    let now = crate::core::planner::sync_writes_at_start(&model.cluster.items);
    let undecided = model.undecided();
    let server = model
        .cluster
        .preflight
        .as_ref()
        .map_or("the cluster", |p| p.server.as_str());
    let mut lines = vec![Line::raw(format!(
        "Sync writes to {server} as the rollout goes: {now} CiliumIdentity objects at once, then one for every new kvstore identity, never overwriting one."
    ))];
    lines.push(Line::raw(if model.commit.phase == CommitPhase::Done {
        "The commit is done: what it wrote is not written again.".to_string()
    } else {
        format!("No commit was made in this session: sync writes those {now} itself (c commits them first, with its own progress).")
    }));
    if undecided > 0 {
        lines.push(Line::raw(format!(
            "{undecided} conflicts are undecided: sync writes nothing for them until they are decided (screen 3)."
        )));
    }
    lines.push(Line::raw("Type yes and press Enter (Esc cancels)."));
    // The typed word's line below the text.
    let h = wrapped_height(&lines) + 1;
    (" Start sync ", typed_word(lines, typed), h)
}

/// Leaving while sync runs: where the rollout stands, and that sync stops with the TUI.
fn confirm_leave(model: &Model, typed: &TextField) -> (&'static str, Vec<Line<'static>>, u16) {
    let stands = crate::tui::model::RolloutSummary::of(model)
        .map(|s| {
            s.to_string()
                .replacen("sync: stopped before cutover: ", "", 1)
        })
        .unwrap_or_default();
    let lines = vec![
        Line::raw(format!(
            "Sync is running and cutover is not reached: {stands}. Leaving stops it: nothing mirrors what kvstore-mode agents allocate until sync runs again."
        )),
        Line::raw("Type leave and press Enter to stop sync and quit (Esc stays)."),
    ];
    // The typed word's line below the text.
    let h = wrapped_height(&lines) + 1;
    (" Leave while sync runs? ", typed_word(lines, typed), h)
}

/// The rollback's confirmation: how many objects it may delete.
fn confirm_rollback(model: &Model, typed: &TextField) -> (&'static str, Vec<Line<'static>>, u16) {
    let s = model
        .rollback
        .as_ref()
        .and_then(|rb| rb.ops.as_ref())
        .map(|ops| crate::app::rollback::summarize(ops))
        .unwrap_or_default();
    let lines = vec![
        Line::raw(format!(
            "This deletes up to {} CiliumIdentity objects these runs created ({} are already gone), each only if it is still that object.{}",
            s.delete,
            s.gone,
            match s.restore {
                0 => String::new(),
                n => format!(
                    " It creates again {n} that switch-prepare removed, where the id is free."
                ),
            }
        )),
        Line::raw("Type yes and press Enter (Esc cancels)."),
    ];
    (" Roll back ", typed_word(lines, typed), 5)
}

/// One decision for every conflict the table shows: which, and the keys for each decision.
fn confirm_bulk(model: &Model, targets: &[usize]) -> (&'static str, Vec<Line<'static>>, u16) {
    let search = if model.table.search.is_empty() {
        "no search".to_string()
    } else {
        format!("search {:?}", model.table.search)
    };
    let lines = vec![
        Line::raw(format!(
            "{} conflicts match the filter ({}) and {search}: {}.",
            targets.len(),
            model.table.filter.label(),
            describe_targets(model, targets)
        )),
        Line::raw(
            "a accept the proposals · s skip · u reuse the id that has the labels · c create duplicates anyway",
        ),
        Line::raw(
            "A decision that does not fit an item leaves it as it was; each item is logged as a bulk decision; z undoes the whole step.",
        ),
        Line::raw("Esc (or any other key) cancels."),
    ];
    // Room for each line as it wraps in the narrowest popup (80 columns).
    let h = wrapped_height(&lines);
    (" One decision for every conflict shown ", lines, h)
}

/// The rows `lines` take in the narrowest popup (80 columns), plus its borders.
fn wrapped_height(lines: &[Line]) -> u16 {
    lines
        .iter()
        .map(|l| l.width().max(1).div_ceil(74) as u16)
        .sum::<u16>()
        + 2
}

/// The keys of this screen; longer than the terminal, a line says which show and ↓/↑ scroll.
fn help<'a>(model: &Model, area: Rect) -> (&'static str, Vec<Line<'a>>, u16) {
    let t = Theme::of(model);
    let mut lines: Vec<Line> = bindings_for(model.screen)
        .map(|b| Line::raw(format!("{:>8}  {}", b.label, b.help)))
        .collect();
    // Longer than the terminal (the Identities screen's keys at 80x24): a line says
    // which keys show, and ↓/↑ scroll them.
    let rows = usize::from(area.height.saturating_sub(2));
    if lines.len() > rows {
        let shown = rows.saturating_sub(1).max(1);
        let first = usize::from(model.help_scroll).min(lines.len() - shown);
        let total = lines.len();
        lines = lines.into_iter().skip(first).take(shown).collect();
        lines.insert(
            0,
            Line::styled(
                format!(
                    "keys {}-{} of {total}: ↓/↑ scroll, any other key closes",
                    first + 1,
                    first + shown
                ),
                t.dim(),
            ),
        );
    }
    let h = lines.len() as u16 + 2;
    (" Keys (any key closes) ", lines, h)
}

/// Accept all: the header's undecided, and the rest (reuses the plan resolves itself), the
/// same counts as everywhere else.
fn confirm_accept_all<'a>(model: &Model, count: usize) -> (&'static str, Vec<Line<'a>>, u16) {
    let undecided = model.undecided().min(count);
    let what = match count - undecided {
        0 => format!(
            "the {undecided} undecided conflicts (the header's count) take their proposed resolution."
        ),
        rest => format!(
            "{count} conflicts take their proposed resolution: the header's {undecided} undecided (remaps, duplicates) and {rest} the plan already resolves (reuses)."
        ),
    };
    (
        " Accept all remaining proposals? ",
        vec![
            Line::raw(what),
            Line::raw("y or Enter: accept · any other key: cancel"),
        ],
        4,
    )
}

pub fn draw(model: &Model, modal: &Modal, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let (title, lines, h): (&str, Vec<Line>, u16) = match modal {
        Modal::Help => help(model, area),
        Modal::Search { input } => (
            " Search labels and ids (Enter keeps, Esc clears) ",
            vec![Line::raw(format!("/{}", with_cursor(input)))],
            3,
        ),
        Modal::EditTarget { input, error } => edit_target(model, &t, input, error.as_deref()),
        Modal::ConfirmQuit { uncommitted } => (
            " Quit with decisions not committed? ",
            vec![
                Line::raw(format!(
                    "{} in the decision log, not committed: nothing was written for them.",
                    crate::core::words::count(*uncommitted, "decision")
                )),
                Line::raw("The next start offers to resume them (or `tui --resume LOG`)."),
                Line::raw("y or q: quit · any other key: stay"),
            ],
            5,
        ),
        Modal::ConfirmAcceptAll { count } => confirm_accept_all(model, *count),
        Modal::ConfirmCommit { typed } => confirm_commit(model, typed),
        Modal::ConfirmSync { typed } => confirm_sync(model, typed),
        Modal::ConfirmRollback { typed } => confirm_rollback(model, typed),
        Modal::ConfirmLeave { typed } => confirm_leave(model, typed),
        Modal::ConfirmIncludeInUse { typed } => (
            " Delete identities in use ",
            typed_word(
                vec![
                    Line::raw(
                        "Identities that live endpoints use are kept. Deleting one makes its agents create it again (another uid) and leaves its endpoints without an identity meanwhile.",
                    ),
                    Line::raw(
                        "To mark them delete too, type in use and press Enter (Esc cancels).",
                    ),
                ],
                typed,
            ),
            7,
        ),
        Modal::Export { input, error } => {
            let mut lines = vec![
                Line::raw(
                    "Writes <path>.jsonl (the decision log) and <path>.md (a summary); existing files are kept.",
                ),
                Line::raw(format!("path: {}", with_cursor(input))),
            ];
            if let Some(e) = error {
                lines.push(Line::styled(e.clone(), t.bad()));
                lines.push(Line::raw("Enter tries again · Esc closes"));
            }
            let h = lines.len() as u16 + 2;
            (" Export ", lines, h)
        }
        Modal::ConfirmBulk { targets } => confirm_bulk(model, targets),
        Modal::Detail { index, nodes } => detail(model, *index, nodes.as_ref(), area),
        Modal::ResumeOffer {
            path,
            decisions,
            operator,
            when,
        } => (
            " Resume an earlier review? ",
            vec![
                Line::raw(format!(
                    "{} ({operator}, started {when}) holds {decisions} decisions for this cluster that were never committed.",
                    path.display()
                )),
                Line::raw(
                    "y: resume them (each is checked again against the cluster as it is now) · any other key: start fresh",
                ),
            ],
            5,
        ),
        Modal::Message(m) => {
            let lines: Vec<Line> = m.lines().map(|l| Line::raw(l.to_string())).collect();
            let h = lines.len() as u16 + 3;
            (" Note (any key closes) ", lines, h)
        }
    };
    let rect = centered(area, 96, h + 1);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(title)),
        rect,
    );
}

/// The target id being typed, with what Enter checks and why the last one was refused.
fn edit_target(
    model: &Model,
    t: &Theme,
    input: &TextField,
    error: Option<&str>,
) -> (&'static str, Vec<Line<'static>>, u16) {
    let mut lines = vec![
        Line::raw(format!(
            "New target id in {}: {}",
            model.cluster.range,
            with_cursor(input)
        )),
        Line::raw(
            "Enter checks it: in range, free in Kubernetes and in the kvstore, not taken by another proposal.",
        ),
    ];
    if let Some(e) = error {
        lines.push(Line::styled(e.to_string(), t.bad()));
    }
    (" Edit target id ", lines, 6)
}
