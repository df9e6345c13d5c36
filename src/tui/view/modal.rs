//! Popups: help (generated from the key table), search, target edit, confirmations, export.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::theme::{Theme, centered};
use crate::tui::keys::bindings_for;
use crate::tui::model::{Modal, Model};

pub fn draw(model: &Model, modal: &Modal, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let (title, lines, h): (&str, Vec<Line>, u16) = match modal {
        Modal::Help => {
            let lines: Vec<Line> = bindings_for(model.screen)
                .map(|b| Line::raw(format!("{:>8}  {}", b.label, b.help)))
                .collect();
            let h = lines.len() as u16 + 2;
            (" Keys (any key closes) ", lines, h)
        }
        Modal::Search { input } => (
            " Search labels and ids (Enter keeps, Esc clears) ",
            vec![Line::raw(format!("/{input}█"))],
            3,
        ),
        Modal::EditTarget { input, error } => {
            let mut lines = vec![
                Line::raw(format!(
                    "New target id in {}: {input}█",
                    model.cluster.range
                )),
                Line::raw(
                    "Enter checks it: in range, free in Kubernetes and in the kvstore, not taken by another proposal.",
                ),
            ];
            if let Some(e) = error {
                lines.push(Line::styled(e.clone(), t.bad()));
            }
            (" Edit target id ", lines, 6)
        }
        Modal::ConfirmAcceptAll { count } => (
            " Accept all remaining proposals? ",
            vec![
                Line::raw(format!(
                    "{count} conflicts will take their proposed resolution."
                )),
                Line::raw("y or Enter: accept · any other key: cancel"),
            ],
            4,
        ),
        Modal::ConfirmCommit { typed } => {
            let writes = crate::core::planner::WriteSummary::of(&model.cluster.items).creates();
            (
                " Commit ",
                vec![
                    Line::raw(format!(
                        "This writes up to {writes} CiliumIdentity objects to {}.",
                        model
                            .cluster
                            .preflight
                            .as_ref()
                            .map_or("the cluster", |p| p.server.as_str())
                    )),
                    Line::raw(
                        "Nothing existing is overwritten. Type yes and press Enter (Esc cancels).",
                    ),
                    Line::styled(
                        format!("> {typed}█"),
                        Style::default().add_modifier(Modifier::BOLD),
                    ),
                ],
                5,
            )
        }
        Modal::Export { input } => (
            " Export ",
            vec![
                Line::raw(
                    "Writes <path>.jsonl (the decision log) and <path>.md (a summary); existing files are kept.",
                ),
                Line::raw(format!("path: {input}█")),
            ],
            4,
        ),
        Modal::Message(m) => (" Note (any key closes) ", vec![Line::raw(m.clone())], 4),
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
