//! Switch: what Cilium 1.18's operator would do to every pod if it managed identities now
//! (adopt its identity, re-mint it, find duplicates), the identities a draw could rewrite, and
//! the selected pod's labels. The same report as `cilium-idmig switch-report`; reads only.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::theme::Theme;
use crate::core::switch::report::{Outcome, PodOutcome, SwitchReport, difference_text};
use crate::tui::model::{Model, needs_something};

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" Switch to operator-managed identities (reads only) ");
    let Some(report) = &model.switch.report else {
        let text = if model.switch.running {
            "reading pods, namespaces, cilium-config, identities and endpoints…"
        } else {
            "R reads what Cilium 1.18's operator would do at the switch"
        };
        frame.render_widget(Paragraph::new(text).block(block), area);
        return;
    };
    // One row a line, cut at the edge: the pods below need the room more than the words.
    let lines = head_lines(report, model.switch.running, &t);
    let [head, rest] = Layout::vertical([
        Constraint::Length(lines.len() as u16 + 2),
        Constraint::Min(3),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(lines).block(block), head);
    let [list, details] = Layout::vertical([Constraint::Min(3), Constraint::Length(6)]).areas(rest);
    draw_pods(model, report, frame, list, &t);
    draw_details(model, frame, details, &t);
}

/// Where the settings came from, the counts, and the verdict.
fn head_lines(report: &SwitchReport, running: bool, t: &Theme) -> Vec<Line<'static>> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let c = &report.counts;
    let s = &report.settings;
    let mut lines = vec![
        Line::from(vec![
            Span::styled("rules  ", bold),
            Span::raw(format!(
                "Cilium 1.18 operator · {} · cluster {} ({}){}",
                s.from,
                s.cluster_name,
                s.cluster_id,
                if running { " · reading again…" } else { "" }
            )),
        ]),
        Line::from(vec![
            Span::styled("pods   ", bold),
            Span::raw(pods_counts(c)),
        ]),
        Line::from(vec![
            Span::styled("draws  ", bold),
            Span::raw(format!(
                "{} label sets at random · {} identities unused, ~{:.1} rewritten",
                c.label_sets_drawn, c.unused_identities, c.expected_unused_rewritten
            )),
        ]),
    ];
    lines.push(if report.is_safe() {
        Line::styled(
            "safe: every pod is adopted by exactly one identity; the switch draws nothing",
            t.good(),
        )
    } else {
        Line::styled(
            "not safe yet: switch-prepare makes an identity per label set drawn",
            t.warn(),
        )
    });
    if !s.cannot_know.is_empty() {
        lines.push(Line::styled(
            format!(
                "cannot know {} thing(s): switch-report says which; first: {}",
                s.cannot_know.len(),
                s.cannot_know[0]
            ),
            t.dim(),
        ));
    }
    lines
}

fn outcome_style(p: &PodOutcome, t: &Theme) -> Style {
    match p.outcome {
        Outcome::Adopted { .. } if !p.endpoint_moves() => t.good(),
        Outcome::Adopted { .. } | Outcome::Duplicate { .. } => t.warn(),
        Outcome::HostNetwork => t.dim(),
        _ => t.bad(),
    }
}

/// One row per pod: its outcome, the id, its endpoint's id.
fn draw_pods(model: &Model, report: &SwitchReport, frame: &mut Frame, area: Rect, t: &Theme) {
    let height = area.height.saturating_sub(2) as usize;
    let selected = model.switch.selected;
    // The selection stays in view: the window starts where it must to show it.
    let first = selected.saturating_sub(height.saturating_sub(1));
    let rows: Vec<Line> = report
        .pods
        .iter()
        .enumerate()
        .skip(first)
        .take(height)
        .map(|(i, p)| {
            let id = match &p.outcome {
                Outcome::Adopted { id } => id.to_string(),
                Outcome::ReMinted { nearest, .. } => format!("new (near {nearest})"),
                Outcome::Duplicate { ids, .. } => format!("one of {}", ids.len()),
                Outcome::NoIdentity => "new".into(),
                Outcome::NoNamespace | Outcome::HostNetwork => "-".into(),
            };
            let ep = p
                .endpoint_id
                .map_or(String::new(), |e| format!(" · endpoint {e}"));
            let mark = if needs_something(p) { "!" } else { " " };
            let line = Line::from(vec![
                Span::raw(format!("{mark} ")),
                Span::styled(format!("{:<12}", p.outcome.name()), outcome_style(p, t)),
                Span::raw(format!(" {:<14} {}{ep}", id, p.pod)),
            ]);
            if i == selected {
                line.style(t.selected())
            } else {
                line
            }
        })
        .collect();
    let title = format!(
        " Pods {}/{} (n/N next needing attention, R reads again) ",
        (selected + 1).min(report.pods.len()),
        report.pods.len()
    );
    frame.render_widget(
        Paragraph::new(rows).block(Block::default().borders(Borders::ALL).title(title)),
        area,
    );
}

/// The selected pod: the labels the operator computes and what differs.
fn draw_details(model: &Model, frame: &mut Frame, area: Rect, t: &Theme) {
    let Some(p) = model.switch.current() else {
        frame.render_widget(
            Paragraph::new("no pods").block(Block::default().borders(Borders::ALL)),
            area,
        );
        return;
    };
    let mut lines = vec![Line::styled(
        match &p.outcome {
            Outcome::Adopted { id } => format!("adopts {id}"),
            Outcome::ReMinted {
                nearest,
                lacks,
                extra,
            } => format!("re-minted: {nearest} {}", difference_text(lacks, extra)),
            Outcome::Duplicate {
                ids, agents_pick, ..
            } => format!(
                "duplicate: {} hold its labels; the agents take {agents_pick}, the operator any",
                ids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Outcome::NoIdentity => "no identity has its pod labels: a new id is drawn".into(),
            Outcome::NoNamespace => "its namespace is missing: no identity".into(),
            Outcome::HostNetwork => "in the host's network: the host's identity".into(),
        },
        outcome_style(p, t),
    )];
    if p.endpoint_moves() {
        lines.push(Line::styled(
            format!(
                "its endpoint uses {} and moves at the switch",
                p.endpoint_id.unwrap_or_default()
            ),
            t.warn(),
        ));
    }
    let labels: Vec<String> = p.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    lines.push(Line::styled(
        format!("labels: {}", labels.join(" ")),
        t.dim(),
    ));
    frame.render_widget(
        Paragraph::new(lines)
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(format!(" {} ", p.pod)),
            )
            .wrap(Wrap { trim: false }),
        area,
    );
}

/// The pods' counts as `switch-report` gives them, those that are rare (duplicates, pods in
/// a namespace that is gone) only when there are some: the line fits 80 columns.
fn pods_counts(c: &crate::core::switch::report::SwitchCounts) -> String {
    let mut parts = vec![
        format!("{} adopted", c.adopted),
        format!("{} re-minted", c.re_minted),
        format!("{} no identity", c.no_identity),
    ];
    if c.duplicate > 0 {
        parts.push(format!("{} duplicate", c.duplicate));
    }
    if c.no_namespace > 0 {
        parts.push(format!("{} no namespace", c.no_namespace));
    }
    parts.push(format!("{} endpoints move", c.endpoints_moving));
    parts.join(" · ")
}
