//! `view(&Model, &mut Frame)`: draws the current screen, the header, the footer and any popup.
//! Pure rendering: reads the model, changes nothing.

mod commit;
mod conflicts;
mod identities;
mod modal;
mod preflight;
mod theme;

pub use theme::{Theme, symbol};

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::keys::bindings_for;
use super::model::{Model, Screen};
use crate::core::planner::Kind;

pub fn view(model: &Model, frame: &mut Frame) {
    let area = frame.area();
    let [header, body, status, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(3),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(model, frame, header);
    match model.screen {
        Screen::Preflight => preflight::draw(model, frame, body),
        Screen::Identities => identities::draw(model, frame, body),
        Screen::Conflicts => conflicts::draw(model, frame, body),
        Screen::Commit => commit::draw(model, frame, body),
    }
    let t = Theme::of(model);
    let mut status_spans = vec![Span::raw(model.status.clone())];
    if model.scan.scanning {
        status_spans.insert(0, Span::styled("scanning… ", t.fg(Color::Yellow)));
    } else if model.scan.counting {
        status_spans.insert(0, Span::styled("counting nodes… ", t.fg(Color::Yellow)));
    }
    if model.scan.drift != (0, 0) {
        status_spans.push(Span::styled(
            format!(
                "  drift since scan: +{} -{} identities (R rescans)",
                model.scan.drift.0, model.scan.drift.1
            ),
            t.fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(status_spans)), status);
    draw_footer(model, frame, footer);
    if let Some(m) = &model.modal {
        modal::draw(model, m, frame, area);
    }
}

fn draw_header(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let mut tabs = vec![Span::styled(
        " cilium-idmig ",
        Style::default().add_modifier(Modifier::BOLD),
    )];
    for (n, s) in Screen::ALL.iter().enumerate() {
        let label = format!(" {} {} ", n + 1, s.title());
        tabs.push(if *s == model.screen {
            Span::styled(label, t.selected())
        } else {
            Span::raw(label)
        });
    }
    let mut counts = vec![Span::raw(format!(
        " {} identities: ",
        model.cluster.items.len()
    ))];
    for kind in Kind::ALL {
        counts.push(Span::styled(
            format!(
                "{} {} {}  ",
                symbol(kind),
                short_kind(kind),
                model.count(kind)
            ),
            t.kind(kind),
        ));
    }
    let undecided = model.undecided();
    if undecided > 0 {
        counts.push(Span::styled(format!("| {undecided} undecided"), t.bad()));
    }
    frame.render_widget(
        Paragraph::new(vec![Line::from(tabs), Line::from(counts)]),
        area,
    );
}

fn draw_footer(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let mut spans = Vec::new();
    for b in bindings_for(model.screen) {
        if matches!(b.label, "1" | "2" | "3" | "4") {
            continue;
        }
        spans.push(Span::styled(
            format!(" {}", b.label),
            Style::default().add_modifier(Modifier::BOLD),
        ));
        spans.push(Span::styled(format!(" {} ", short(b.help)), t.dim()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Kind names short enough for the header at 100 columns.
fn short_kind(kind: Kind) -> &'static str {
    match kind {
        Kind::AlreadyMigrated => "migrated",
        Kind::Duplicate => "dup",
        other => other.as_str(),
    }
}

/// The first words of a help text, for the footer.
fn short(help: &str) -> &str {
    help.split([':', '(', ',']).next().unwrap_or(help).trim()
}
