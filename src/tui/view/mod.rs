//! `view(&Model, &mut Frame)`: draws the current screen, the header, the footer and any popup.
//! Pure rendering: reads the model, changes nothing.

mod audit;
mod commit;
mod conflicts;
mod fleet;
mod footer;
mod identities;
mod modal;
mod preflight;
mod rollback;
mod switch;
mod sync;
mod theme;
mod wrap;

pub use fleet::draw_fleet;
pub use footer::footer_hints;
pub use theme::{Theme, symbol};

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

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
        Screen::Rollback => rollback::draw(model, frame, body),
        Screen::Sync => sync::draw(model, frame, body),
        Screen::Audit => audit::draw(model, frame, body),
        Screen::Switch => switch::draw(model, frame, body),
        // Drawn by `fleet::draw` from the fleet's own model; a cluster's is never on it.
        Screen::Fleet => {}
    }
    let t = Theme::of(model);
    let mut status_spans = vec![Span::raw(model.status.clone())];
    if let (true, Some((listed, elapsed))) = (model.scan.scanning, model.scan.listing) {
        let rate = listed as f64 / elapsed.as_secs_f64().max(0.001);
        status_spans.insert(
            0,
            Span::styled(
                format!("listing CiliumIdentity objects: {listed} so far ({rate:.0}/s)… "),
                t.fg(Color::Yellow),
            ),
        );
    } else if model.scan.scanning {
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
    const BRAND: &str = " cilium-idmig ";
    let labels: Vec<String> = model
        .tabs
        .iter()
        .enumerate()
        .map(|(n, s)| format!(" {} {} ", n + 1, s.title()))
        .collect();
    // Every screen's tab shows: at 80 columns the name of the tool gives way to them.
    let width: usize = labels.iter().map(|l| l.chars().count()).sum();
    let mut tabs = Vec::new();
    if width + BRAND.len() <= usize::from(area.width) {
        tabs.push(Span::styled(
            BRAND,
            Style::default().add_modifier(Modifier::BOLD),
        ));
    }
    for (label, s) in labels.into_iter().zip(model.tabs) {
        tabs.push(if *s == model.screen {
            Span::styled(label, t.selected())
        } else {
            Span::raw(label)
        });
    }
    // A rollback session plans no identities: its screen says what it will delete.
    let mut counts = if model.rollback.is_some() {
        vec![Span::raw(" rollback: deletes only what this tool created")]
    } else {
        kind_counts(model, usize::from(area.width))
    };
    // Opened from the Fleet screen: which cluster this is.
    if let Some(name) = &model.fleet_cluster {
        counts.insert(
            0,
            Span::styled(
                format!(" {name} ·"),
                Style::default().add_modifier(Modifier::BOLD),
            ),
        );
    }
    frame.render_widget(
        Paragraph::new(vec![Line::from(tabs), Line::from(counts)]),
        area,
    );
}

/// The count of each kind, named; at a width where the names do not fit (80 columns), by
/// symbol alone, as the Identities screen shows them.
fn kind_counts(model: &Model, width: usize) -> Vec<Span<'static>> {
    let t = Theme::of(model);
    let undecided = model.undecided();
    let named = |named: bool| -> Vec<Span<'static>> {
        let mut spans = vec![Span::raw(format!(
            " {} identities: ",
            model.cluster.items.len()
        ))];
        for kind in Kind::ALL {
            let text = if named {
                format!(
                    "{} {} {}  ",
                    symbol(kind),
                    short_kind(kind),
                    model.count(kind)
                )
            } else {
                format!("{}{} ", symbol(kind), model.count(kind))
            };
            spans.push(Span::styled(text, t.kind(kind)));
        }
        if undecided > 0 {
            // While sync runs it has a count of its own (its live view, on screen 5).
            let of = if model.sync.running {
                " (last scan)"
            } else {
                ""
            };
            spans.push(Span::styled(
                format!("| {undecided} undecided{of}"),
                t.bad(),
            ));
        }
        spans
    };
    let full = named(true);
    if full
        .iter()
        .map(|s| s.content.chars().count())
        .sum::<usize>()
        <= width
    {
        full
    } else {
        named(false)
    }
}

fn draw_footer(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let (hints, cut) = footer_hints(model.screen, area.width, |a| offered(model, a));
    let mut spans = Vec::new();
    let tail = if cut { "more" } else { "help" };
    for (label, text) in hints.into_iter().chain([("?", tail)]) {
        spans.push(Span::styled(
            format!(" {label}"),
            Style::default().add_modifier(Modifier::BOLD),
        ));
        spans.push(Span::styled(format!(" {text} "), t.dim()));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Whether the footer offers a key now: one that would do nothing (start a sync that runs,
/// pause or retry a commit never started) is left out.
pub fn offered(model: &Model, action: crate::tui::keys::KeyAction) -> bool {
    use crate::tui::keys::KeyAction;
    use crate::tui::model::CommitPhase;
    match action {
        KeyAction::StartSync => !model.sync.running,
        KeyAction::Pause => matches!(model.commit.phase, CommitPhase::Running),
        KeyAction::Retry => model.commit.phase == CommitPhase::Done && model.commit.has_work_left(),
        _ => true,
    }
}

/// Kind names short enough for the header at 100 columns.
fn short_kind(kind: Kind) -> &'static str {
    match kind {
        Kind::AlreadyMigrated => "migrated",
        Kind::Duplicate => "dup",
        other => other.as_str(),
    }
}
