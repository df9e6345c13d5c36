//! The Fleet screen: one row per cluster (the same cells as `fleet`'s table), what needs
//! attention first, the filter, and the keys. Pure rendering of a `FleetModel`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table};

use super::footer::footer_hints;
use super::theme::{Theme, centered};
use crate::core::fleet::row::Cells;
use crate::tui::keys::bindings_for;
use crate::tui::model::{FleetModel, Screen};

pub fn draw_fleet(model: &FleetModel, frame: &mut Frame) {
    let t = Theme::plain(model.no_color);
    let area = frame.area();
    let [header, body, detail, note, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(3),
        Constraint::Length(2),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(area);
    let (reached, attention) = model.counts();
    let reading = match model.reading {
        0 => String::new(),
        n => format!(" · reading {n} of {}…", model.clusters.len()),
    };
    let filter = match (&model.typing, model.filter.is_empty()) {
        (Some(f), _) => format!(" · filter: {}▏", f.text()),
        (None, false) => format!(" · filter: {}", model.filter),
        (None, true) => String::new(),
    };
    frame.render_widget(
        Paragraph::new(vec![
            Line::from(vec![
                Span::styled(
                    " cilium-idmig ",
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::styled(" Fleet ", t.selected()),
            ]),
            Line::from(vec![
                Span::raw(format!(
                    " {} clusters: {reached} reached cutover, ",
                    model.clusters.len()
                )),
                Span::styled(
                    format!("{attention} need attention"),
                    if attention > 0 { t.warn() } else { t.good() },
                ),
                Span::styled(format!("{reading}{filter}"), t.dim()),
            ]),
        ]),
        header,
    );
    let shown = model.shown();
    let rows = shown
        .iter()
        .enumerate()
        .skip(model.offset)
        .take(model.page)
        .map(|(at, &i)| {
            let entry = &model.clusters[i];
            let cells = match &entry.row {
                Some(r) => {
                    let c = Cells::of(r);
                    [
                        c.cilium,
                        c.modes,
                        c.identities,
                        c.kvstore,
                        c.sync,
                        c.age,
                        c.next,
                    ]
                }
                None => ["…", "", "", "", "", "", "being read"].map(String::from),
            };
            let style = match (&entry.row, entry.needs_attention()) {
                (None, _) => t.dim(),
                (Some(r), true) if r.error.is_some() => t.bad(),
                (Some(_), true) => t.warn(),
                (Some(_), false) => t.good(),
            };
            let mut row = Row::new(
                std::iter::once(Cell::from(entry.name.clone()))
                    .chain(cells.into_iter().map(Cell::from)),
            )
            .style(style);
            if at == model.selected {
                row = row.style(t.selected());
            }
            row
        });
    let widths = [
        Constraint::Length(15),
        Constraint::Length(8),
        Constraint::Length(13),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Length(21),
        Constraint::Length(5),
        Constraint::Min(10),
    ];
    let head = Row::new(Cells::HEADER).style(Style::default().add_modifier(Modifier::BOLD));
    frame.render_widget(
        Table::new(rows, widths)
            .header(head)
            .block(Block::default().borders(Borders::TOP | Borders::BOTTOM)),
        body,
    );
    // The selected cluster in full: its server, and what it needs in words the column cuts.
    let selected = model.selected_cluster().map(|i| &model.clusters[i]);
    let detail_lines = match selected.and_then(|e| e.row.as_ref().map(|r| (e, r))) {
        Some((e, r)) => vec![
            Line::from(vec![
                Span::styled(
                    format!(" {}", e.name),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::styled(format!("  {}", r.server), t.dim()),
            ]),
            Line::raw(format!(" next: {}", Cells::of(r).next)),
        ],
        None => vec![],
    };
    frame.render_widget(Paragraph::new(detail_lines), detail);
    let note_line = match (&model.note, shown.is_empty()) {
        (_, true) if !model.clusters.is_empty() => {
            Line::styled(" no cluster matches the filter (Esc clears it)", t.warn())
        }
        (Some(n), _) => Line::raw(format!(" {n}")),
        (None, _) => Line::styled(
            " Enter opens a cluster's screens; Esc there comes back here",
            t.dim(),
        ),
    };
    frame.render_widget(Paragraph::new(note_line), note);
    let mut spans = Vec::new();
    let (hints, _) = footer_hints(Screen::Fleet, footer.width, |_| true);
    for (label, text) in hints.into_iter().chain([("?", "help")]) {
        spans.push(Span::styled(
            format!(" {label}"),
            Style::default().add_modifier(Modifier::BOLD),
        ));
        spans.push(Span::styled(format!(" {text} "), t.dim()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), footer);
    if model.help {
        draw_help(model, frame);
    }
}

/// The Fleet screen's keys, from the key table.
fn draw_help(model: &FleetModel, frame: &mut Frame) {
    let t = Theme::plain(model.no_color);
    let lines: Vec<Line> = bindings_for(Screen::Fleet)
        .map(|b| {
            Line::from(vec![
                Span::styled(
                    format!(" {:<8}", b.label),
                    Style::default().add_modifier(Modifier::BOLD),
                ),
                Span::raw(b.help),
            ])
        })
        .chain([Line::styled(" any key closes this help", t.dim())])
        .collect();
    let area = centered(frame.area(), 90, lines.len() as u16 + 2);
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" Fleet: keys ")
                .border_style(t.fg(Color::Cyan)),
        ),
        area,
    );
}
