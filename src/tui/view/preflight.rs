//! Preflight: both ends, the CRD, RBAC and the range; each failure says how to fix it.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};

use super::theme::Theme;
use super::wrap;
use crate::app::service::CheckStatus;
use crate::tui::model::Model;

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" Preflight (nothing is written from here) ");
    let Some(p) = &model.cluster.preflight else {
        frame.render_widget(
            Paragraph::new("checking etcd, the API server, the CRD and RBAC…").block(block),
            area,
        );
        return;
    };
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut lines = vec![
        Line::from(vec![
            Span::styled("kvstore     ", bold),
            Span::raw(p.etcd.clone()),
        ]),
        Line::from(vec![
            Span::styled("kubernetes  ", bold),
            Span::raw(format!(
                "{} (context {}, {})",
                p.server, p.context, p.version
            )),
        ]),
        Line::from(vec![
            Span::styled("cluster     ", bold),
            Span::raw(format!(
                "id {}, max-connected-clusters {}, range {}",
                p.cluster_id,
                p.max_connected_clusters,
                p.range.map_or("-".into(), |r| r.to_string())
            )),
        ]),
    ];
    if let Some(s) = &model.cluster.source {
        lines.push(Line::from(vec![
            Span::styled("snapshot    ", bold),
            Span::raw(format!(
                "revision {} under {}, {} identities",
                s.revision,
                s.prefix,
                model.cluster.items.len()
            )),
        ]));
    }
    lines.push(Line::raw(""));
    // Inside the borders; a check's wrapped lines start under its text, not at column 0.
    let width = usize::from(area.width.saturating_sub(2)).max(20);
    for c in &p.checks {
        let (mark, style) = match c.status {
            CheckStatus::Ok => ("[ok]  ", t.good()),
            CheckStatus::Warn => ("[warn]", t.warn()),
            CheckStatus::Fail => ("[FAIL]", t.bad()),
        };
        let text = format!("{}: {}", c.name, c.detail);
        for (i, part) in wrap::words(&text, width - INDENT).into_iter().enumerate() {
            lines.push(if i == 0 {
                Line::from(vec![
                    Span::styled(mark, style),
                    Span::raw(format!(" {part}")),
                ])
            } else {
                Line::raw(format!("{:INDENT$}{part}", ""))
            });
        }
        if let Some(fix) = &c.fix {
            let label = if c.status == CheckStatus::Warn {
                "note"
            } else {
                "fix"
            };
            let text = format!("{label}: {fix}");
            // Continuation lines start under the fix's text, after `fix: ` or `note: `.
            let under = FIX_INDENT + label.len() + 2;
            for (i, part) in wrap::words(&text, width - under).into_iter().enumerate() {
                let indent = if i == 0 { FIX_INDENT } else { under };
                lines.push(Line::raw(format!("{:indent$}{part}", "")));
            }
        }
    }
    // More checks than rows (80x24 with every RBAC check): scrolled, and the title says so.
    let rows = area.height.saturating_sub(2) as usize;
    let last = lines.len().saturating_sub(rows);
    let first = usize::from(model.preflight_scroll).min(last);
    let block = if last > 0 {
        block.title(format!(
            " rows {}-{} of {} (↑↓ PgUp PgDn) ",
            first + 1,
            (first + rows).min(lines.len()),
            lines.len()
        ))
    } else {
        block
    };
    frame.render_widget(
        Paragraph::new(lines).block(block).scroll((first as u16, 0)),
        area,
    );
}

/// Where a check's text starts: after `[FAIL] `.
const INDENT: usize = 7;
/// Where a fix (or a warning's note) starts, one column in from its check's text.
const FIX_INDENT: usize = INDENT + 1;
