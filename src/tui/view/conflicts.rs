//! Conflict review: kvstore and Kubernetes labels side by side, differences marked, the
//! proposal and why.

use std::collections::BTreeMap;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::theme::{Theme, symbol};
use crate::core::labels::{SecurityLabels, parse_label_key, to_security_labels};
use crate::core::planner::{Action, Kind};
use crate::tui::model::Model;

fn as_map(key: &str) -> SecurityLabels {
    parse_label_key(key)
        .map(|l| to_security_labels(&l))
        .unwrap_or_default()
}

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let all: Vec<usize> = model.conflicts().collect();
    let Some(i) = model.review.conflict.filter(|i| all.contains(i)) else {
        let msg = if model.scan.scanning {
            "scanning…"
        } else {
            "no conflicts: every identity is a plain create, already migrated, or invalid"
        };
        frame.render_widget(
            Paragraph::new(msg).block(Block::default().borders(Borders::ALL).title(" Conflicts ")),
            area,
        );
        return;
    };
    let item = &model.cluster.items[i];
    let title = title_line(model, &t, i, &all);
    let why = why_lines(item);
    // Each pane as tall as its text wraps to, so nothing stops mid-sentence; the label panes
    // take what is left and scroll (PgUp/PgDn) when a label set is longer.
    let inner = usize::from(area.width.saturating_sub(2)).max(10);
    let rows = |lines: &[Line]| -> u16 {
        lines
            .iter()
            .map(|l| super::wrap::words(&l.to_string(), inner).len() as u16)
            .sum()
    };
    let top_rows = rows(std::slice::from_ref(&title)) + 2;
    let why_rows = (rows(&why) + 2).min(area.height.saturating_sub(top_rows + 4) / 2 + 2);
    let [top, sides, bottom] = Layout::vertical([
        Constraint::Length(top_rows),
        Constraint::Min(4),
        Constraint::Length(why_rows),
    ])
    .areas(area);
    frame.render_widget(
        Paragraph::new(title)
            .wrap(Wrap { trim: true })
            .block(Block::default().borders(Borders::ALL)),
        top,
    );

    let kv = as_map(&item.labels);
    let (k8s_title, k8s): (String, Option<SecurityLabels>) =
        match (item.existing_labels.as_ref(), item.labels_present_at) {
            (Some(existing), _) => (
                format!("Kubernetes at {} (taken)", item.id),
                Some(as_map(existing)),
            ),
            (None, Some(x)) => match model.cluster.k8s.get(&x) {
                Some(k) => (format!("Kubernetes at {x} (same labels)"), Some(as_map(k))),
                // Present under another kvstore id, not (yet) in Kubernetes: that entry's
                // labels are these.
                None => (format!("kvstore {x}, same labels"), Some(kv.clone())),
            },
            _ => ("Kubernetes".into(), None),
        };
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(sides);
    let empty = BTreeMap::new();
    let other = k8s.as_ref().unwrap_or(&empty);
    let scroll = model.review.label_scroll;
    frame.render_widget(
        label_list(&t, (&kv, other), "kvstore".to_string(), left, scroll),
        left,
    );
    frame.render_widget(
        label_list(&t, (other, &kv), k8s_title, right, scroll),
        right,
    );
    frame.render_widget(
        Paragraph::new(why)
            .wrap(Wrap { trim: true })
            .block(Block::default().borders(Borders::ALL).title(" Why ")),
        bottom,
    );
}

/// The conflict's heading: its kind, where it is among the conflicts, the kvstore id and
/// its nodes, whether it waits for a decision, and whether sync found it after the snapshot.
fn title_line(model: &Model, t: &Theme, i: usize, all: &[usize]) -> Line<'static> {
    let item = &model.cluster.items[i];
    let pos = all.iter().position(|&c| c == i).map_or(0, |p| p + 1);
    let state = if item.kind.needs_decision() && !item.decided {
        Span::styled("needs a decision", t.bad())
    } else if item.decided {
        Span::styled("decided", t.good())
    } else {
        Span::raw("proposal stands (no decision needed)")
    };
    Line::from(vec![
        Span::styled(
            format!(" {} {} ", symbol(item.kind), item.kind.as_str()),
            t.kind(item.kind),
        ),
        Span::raw(format!(
            " conflict {pos} of {} · kvstore id {} · used by {} node(s) · ",
            all.len(),
            item.id,
            if model.scan.counting {
                "…".to_string()
            } else {
                item.nodes.to_string()
            }
        )),
        state,
        Span::styled(
            if model.review.new_since_snapshot.contains(&item.id) {
                " · new since the snapshot (found by sync)"
            } else {
                ""
            },
            t.bad(),
        ),
    ])
}

/// The proposal and why: the resolution, where the labels already are, the reason.
fn why_lines<'a>(item: &crate::core::planner::PlanItem) -> Vec<Line<'a>> {
    let own = item.numeric_id();
    let proposal = match (item.action, item.target_id) {
        (Action::Create, Some(tid)) if Some(tid) == own => format!("create at its own id {tid}"),
        (Action::Create, Some(tid)) => format!("create at new id {tid}"),
        (Action::None, Some(tid)) => format!("write nothing; map to id {tid}"),
        (Action::Skip, _) => "skip: write nothing".into(),
        _ => "-".into(),
    };
    let mut lines = vec![Line::from(vec![
        Span::styled(
            "Resolution: ",
            ratatui::style::Style::default().add_modifier(Modifier::BOLD),
        ),
        Span::raw(proposal),
    ])];
    if let Some(x) = item.labels_present_at
        && matches!(item.kind, Kind::Duplicate | Kind::Reuse)
    {
        lines.push(Line::raw(format!(
            "These labels are already present at id {x}."
        )));
    }
    lines.push(Line::raw(item.reason.to_string()));
    lines
}

/// One side's labels; a label missing or different on the other side is marked `*`. Longer
/// than the pane, it shows from row `scroll` on, and its title says which rows and how many.
fn label_list<'a>(
    t: &Theme,
    (mine, theirs): (&SecurityLabels, &SecurityLabels),
    title: String,
    area: Rect,
    scroll: u16,
) -> Paragraph<'a> {
    // Label keys have no spaces to wrap at: cut them into pieces that fit, marker first.
    let width = usize::from(area.width.saturating_sub(4)).max(8);
    let mut lines: Vec<Line> = Vec::new();
    for (k, v) in mine {
        let same = theirs.get(k) == Some(v);
        let style = if same {
            ratatui::style::Style::default()
        } else {
            t.fg(Color::Yellow).add_modifier(Modifier::BOLD)
        };
        let text: Vec<char> = format!("{k}={v}").chars().collect();
        for (n, chunk) in text.chunks(width).enumerate() {
            let mark = match (n, same) {
                (0, false) => "* ",
                _ => "  ",
            };
            lines.push(Line::styled(
                format!("{mark}{}", chunk.iter().collect::<String>()),
                style,
            ));
        }
    }
    let lines = if lines.is_empty() {
        vec![Line::raw("(no object)")]
    } else {
        lines
    };
    let rows = usize::from(area.height.saturating_sub(2));
    let last = lines.len().saturating_sub(rows);
    let first = usize::from(scroll).min(last);
    let title = if last > 0 {
        format!(
            " {title} · {}-{} of {} (PgDn) ",
            first + 1,
            (first + rows).min(lines.len()),
            lines.len()
        )
    } else {
        format!(" {title} ")
    };
    Paragraph::new(lines)
        .scroll((first as u16, 0))
        .block(Block::default().borders(Borders::ALL).title(title))
}
