//! Preflight: both ends, the CRD, RBAC and the range; each failure says how to fix it.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::theme::Theme;
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
    for c in &p.checks {
        let (mark, style) = if c.ok {
            ("[ok]  ", t.good())
        } else {
            ("[FAIL]", t.bad())
        };
        lines.push(Line::from(vec![
            Span::styled(mark, style),
            Span::raw(format!(" {}: {}", c.name, c.detail)),
        ]));
        if let Some(fix) = &c.fix {
            lines.push(Line::raw(format!("        fix: {fix}")));
        }
    }
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block),
        area,
    );
}
