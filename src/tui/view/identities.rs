//! The identities table: renders only the rows on screen, so 65,280 scroll like 20.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders, Cell, Row, Table};

use super::theme::{Theme, symbol};
use crate::tui::model::{Model, SortColumn};

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let arrow = if model.table.descending { "↓" } else { "↑" };
    let head = |name: &str, col: SortColumn| {
        let label = if model.table.sort == col {
            format!("{name}{arrow}")
        } else {
            name.to_string()
        };
        Cell::from(label)
    };
    let header = Row::new(vec![
        Cell::from(" "),
        head("id", SortColumn::Id),
        head("kind", SortColumn::Kind),
        head("target", SortColumn::Target),
        head("nodes", SortColumn::Nodes),
        head("labels", SortColumn::Labels),
    ])
    .style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    // Rows only for the visible slice of the view.
    let height = usize::from(area.height.saturating_sub(3));
    let start = model.table.offset.min(model.table.view.len());
    let end = (start + height).min(model.table.view.len());
    let rows = model.table.view[start..end]
        .iter()
        .enumerate()
        .map(|(n, &i)| row(model, &t, i, start + n == model.table.selected));
    let title = format!(
        " Identities: {} of {} shown · filter {} · search {} · row {} ",
        model.table.view.len(),
        model.cluster.items.len(),
        model.table.filter.label(),
        if model.table.search.is_empty() {
            "-".to_string()
        } else {
            format!("{:?}", model.table.search)
        },
        if model.table.view.is_empty() {
            0
        } else {
            model.table.selected + 1
        },
    );
    let table = Table::new(
        rows,
        [
            Constraint::Length(2),
            Constraint::Length(8),
            Constraint::Length(16),
            Constraint::Length(14),
            // "nodes" and the sort arrow.
            Constraint::Length(6),
            Constraint::Min(10),
        ],
    )
    .header(header)
    .block(
        Block::default()
            .borders(Borders::ALL)
            .title(Span::raw(title)),
    );
    frame.render_widget(table, area);
}

/// One identity's row: its symbol (with `?` while it waits for a decision), id, kind,
/// target and action, nodes and labels, in its kind's colour.
fn row(model: &Model, t: &Theme, i: usize, selected: bool) -> Row<'static> {
    let item = &model.cluster.items[i];
    let target = match item.target_id {
        Some(tid) if Some(tid) != item.numeric_id() => format!("→{tid}"),
        Some(tid) => tid.to_string(),
        None => "-".into(),
    };
    let decided = if item.kind.needs_decision() && !item.decided {
        "?"
    } else {
        ""
    };
    let mut style = t.kind(item.kind);
    if selected {
        style = style.patch(t.selected());
    }
    // Until Kubernetes is read, only the kvstore's side of a row is known.
    let pending = model.scan.k8s_pending && item.kind != crate::core::planner::Kind::Invalid;
    let (symbol_cell, kind_cell, target_cell) = if pending {
        ("…".to_string(), "…".to_string(), "…".to_string())
    } else {
        (
            format!("{}{decided}", symbol(item.kind)),
            item.kind.as_str().to_string(),
            format!("{target} {}", item.action.as_str()),
        )
    };
    Row::new(vec![
        Cell::from(symbol_cell),
        Cell::from(item.id.clone()),
        Cell::from(kind_cell),
        Cell::from(target_cell),
        Cell::from(if model.scan.counting {
            "…".to_string()
        } else {
            item.nodes.to_string()
        }),
        Cell::from(item.labels.clone()),
    ])
    .style(style)
}
