//! Audit: both identity stores compared by labels (splits, doubles, duplicates, one side
//! only, stale `value/` keys, GC-marked objects in use), each finding with its nodes,
//! endpoints and what to do. The same audit as `cilium-idmig audit`; reads only.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::theme::Theme;
use crate::app::audit::counts_text;
use crate::core::audit::{Finding, FindingKind, Side, names_list};
use crate::tui::model::Model;

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" Audit of both identity stores (reads only) ");
    let Some(run) = &model.audit.run else {
        let text = if model.audit.running {
            "reading the kvstore, the CiliumIdentity objects and the CiliumEndpoints…"
        } else {
            "R audits both stores by labels"
        };
        frame.render_widget(Paragraph::new(text).block(block), area);
        return;
    };
    let r = &run.report;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut lines = vec![
        Line::from(vec![
            Span::styled("read   ", bold),
            Span::raw(format!(
                "{} valid kvstore identities (revision {}; {} invalid not audited), {} CiliumIdentity objects{}",
                r.kvstore_identities,
                run.kvstore_revision,
                r.invalid_ignored,
                r.objects,
                if model.audit.running {
                    " · auditing again…"
                } else {
                    ""
                }
            )),
        ]),
        Line::from(vec![
            Span::styled("found  ", bold),
            Span::styled(counts_text(r), if r.clean() { t.good() } else { t.warn() }),
        ]),
        // The header counts the planner's kinds of kvstore identities; the audit counts
        // findings by labels in both stores (a remap is a split and a double here).
        Line::styled(
            "by labels in both stores: not the planner's kinds in the header",
            t.dim(),
        ),
    ];
    if let Some(n) = run.not_checked.first() {
        let more = run.not_checked.len() - 1;
        lines.push(Line::styled(
            format!(
                "not checked: {n}{}",
                if more > 0 {
                    format!(" (and {more} more)")
                } else {
                    String::new()
                }
            ),
            t.dim(),
        ));
    }
    // As tall as the lines are once wrapped, so no count is cut off at 80 columns.
    let inner = area.width.saturating_sub(2).max(1) as usize;
    let rows: usize = lines.iter().map(|l| l.width().max(1).div_ceil(inner)).sum();
    let [head, list] =
        Layout::vertical([Constraint::Length(rows as u16 + 2), Constraint::Min(3)]).areas(area);
    frame.render_widget(
        Paragraph::new(lines)
            .block(block.clone())
            .wrap(Wrap { trim: false }),
        head,
    );
    let title = if r.clean() {
        " Findings ".to_string()
    } else {
        format!(
            " Findings {}-{} of {} (↑/↓ scroll, R audits again) ",
            model.audit.offset + 1,
            r.findings.len(),
            r.findings.len()
        )
    };
    let body: Vec<Line> = if r.clean() {
        vec![Line::styled(
            "clean: the two stores agree by labels",
            t.good(),
        )]
    } else {
        r.findings
            .iter()
            .skip(model.audit.offset)
            .flat_map(|f| finding_lines(f, &t))
            .collect()
    };
    frame.render_widget(
        Paragraph::new(body)
            .block(Block::default().borders(Borders::ALL).title(title))
            .wrap(Wrap { trim: false }),
        list,
    );
}

/// A finding: what and where, who is behind it, what to do.
fn finding_lines(f: &Finding, t: &Theme) -> Vec<Line<'static>> {
    let side = match f.side {
        Some(Side::Kvstore) => " (kvstore)",
        Some(Side::Kubernetes) => " (Kubernetes)",
        None => "",
    };
    let other = match (f.other_id, &f.other_labels) {
        (Some(id), Some(l)) => format!(" · other: {id} {l}"),
        (Some(id), None) => format!(" · other id: {id}"),
        (None, Some(l)) => format!(" · other labels: {l}"),
        (None, None) => String::new(),
    };
    let style = match f.kind {
        FindingKind::Split | FindingKind::GcMarked => t.bad(),
        FindingKind::Double | FindingKind::StaleValue => t.warn(),
        FindingKind::Duplicate | FindingKind::OneSide => t.fg(Color::Cyan),
    };
    let mut out = vec![Line::from(vec![
        Span::styled(format!("{} {}{side}", f.kind.as_str(), f.id), style),
        Span::raw(format!(": {}{other}", f.labels)),
    ])];
    if !f.nodes.is_empty() || !f.endpoints.is_empty() {
        out.push(Line::styled(
            format!(
                "  nodes: {} · endpoints: {}",
                names_list(&f.nodes, 4),
                names_list(&f.endpoints, 4)
            ),
            t.dim(),
        ));
    }
    out.push(Line::raw(format!("  do: {}", f.action)));
    out
}
