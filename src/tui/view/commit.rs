//! Commit: what will be written, then live progress, then the verification.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Gauge, Paragraph};

use super::theme::Theme;
use crate::apply::outcome::Outcome;
use crate::core::planner::WriteSummary;
use crate::tui::model::{CommitPhase, Model};

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    match model.commit.phase {
        CommitPhase::Idle => summary(model, frame, area),
        _ => progress(model, frame, area),
    }
}

fn summary(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let w = WriteSummary::of(&model.cluster.items);
    let mut lines = vec![Line::styled(
        "Writes on commit",
        Style::default().add_modifier(Modifier::BOLD),
    )];
    if !model.cluster.crd_present {
        lines.push(Line::raw(
            "  create CRD ciliumidentities.cilium.io and wait until it is Established",
        ));
    }
    lines.push(Line::raw(format!(
        "  {:>6}  create at the same id",
        w.same_id
    )));
    lines.push(Line::raw(format!(
        "  {:>6}  create at a new id (remap)",
        w.remaps
    )));
    lines.push(Line::raw(format!(
        "  {:>6}  create a duplicate at its own id",
        w.duplicates
    )));
    lines.push(Line::raw(format!(
        "  {:>6}  CiliumIdentity objects in all",
        w.creates()
    )));
    lines.push(Line::raw(""));
    lines.push(Line::styled(
        "Not written",
        Style::default().add_modifier(Modifier::BOLD),
    ));
    lines.push(Line::raw(format!(
        "  {:>6}  already migrated",
        w.already_migrated
    )));
    lines.push(Line::raw(format!(
        "  {:>6}  mapped to an id that holds the labels (reuse)",
        w.mapped
    )));
    lines.push(Line::raw(format!(
        "  {:>6}  skipped by decision",
        w.skipped
    )));
    lines.push(Line::raw(format!(
        "  {:>6}  invalid kvstore entries",
        w.invalid
    )));
    lines.push(Line::raw(""));
    let undecided = model.undecided();
    if undecided > 0 {
        lines.push(Line::styled(
            format!("{undecided} remap/duplicate conflicts need a decision first (screen 3)"),
            t.bad(),
        ));
    } else {
        lines.push(Line::styled(
            "Enter to commit: you will be asked to type yes",
            t.good(),
        ));
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" Commit ")),
        area,
    );
}

pub(super) fn progress(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let c = &model.commit;
    let [gauge_area, stats, failures] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(8),
        Constraint::Min(3),
    ])
    .areas(area);
    let (verb, n) = written(c);
    // The bar measures the writes, as the line under it counts them: a paused commit with
    // most writes not attempted is not shown full.
    let (done, of, unit) = if c.writes > 0 {
        (n, c.writes, "writes")
    } else {
        (c.done, c.total, "items")
    };
    let ratio = if of == 0 {
        0.0
    } else {
        (done as f64 / of as f64).min(1.0)
    };
    let label = format!("{done} / {of} {unit}");
    let what = if c.rollback { "Rollback" } else { "Commit" };
    let gauge = Gauge::default()
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!(" {what}: {} ", c.phase_title())),
        )
        .gauge_style(t.fg(Color::Green))
        .ratio(ratio)
        .label(label);
    frame.render_widget(gauge, gauge_area);
    let secs = c.elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        c.done as f64 / secs
    } else {
        0.0
    };
    // An ETA only while writes run: a paused or finished commit has none.
    let eta = if c.phase == CommitPhase::Running && rate > 0.0 && c.total > c.done {
        format!("{:.0}s", (c.total - c.done) as f64 / rate)
    } else {
        "-".into()
    };
    let mut lines = vec![
        Line::raw(format!(
            "{verb} {n} of {} writes · {} failed · {} retries{}",
            c.writes,
            c.failures.len(),
            c.retries,
            match c.throttled {
                0 => String::new(),
                t => format!(" · {t} throttled (429, waited out)"),
            }
        )),
        Line::raw(format!(
            "elapsed {secs:.1}s · {rate:.0} items/s · ETA {eta}"
        )),
    ];
    if let Some(n) = &c.crd_note {
        lines.push(Line::raw(n.clone()));
    }
    let s = &model.session;
    match (c.phase == CommitPhase::Done, s.commits) {
        (false, n) if n > 0 && !c.rollback => lines.push(Line::raw(format!(
            "earlier this session: {} created, {} already there ({n} commit{})",
            s.created,
            s.already_there,
            if n == 1 { "" } else { "s" }
        ))),
        (true, n) if n > 1 && !c.rollback => lines.push(Line::raw(format!(
            "this session: {} created, {} already there, in {n} commits",
            s.created, s.already_there
        ))),
        _ => {}
    }
    if let Some(s) = &c.stop_reason {
        lines.push(Line::styled(
            format!("stopped: {s}; press r to write what is left"),
            t.bad(),
        ));
    }
    lines.extend(outcome_lines(model, &t));
    // Wrapped: at 80 columns the written and verified lines are longer than a row.
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .block(Block::default().borders(Borders::ALL)),
        stats,
    );
    failures_panel(model, &t, frame, failures);
}

/// What the commit came to: its report's counts, and verify's verdict once it is done.
fn outcome_lines(model: &Model, t: &Theme) -> Vec<Line<'static>> {
    let c = &model.commit;
    let mut lines = Vec::new();
    if let (Some(r), true) = (&c.report, c.rollback) {
        lines.push(Line::raw(format!(
            "deleted {} · already gone {} · kept {} · not attempted {} · failed {}",
            r.count(Outcome::Deleted),
            r.count(Outcome::AlreadyGone),
            r.count(Outcome::Kept),
            r.count(Outcome::NotAttempted),
            r.count(Outcome::Failed)
        )));
    } else if let Some(r) = &c.report {
        lines.push(Line::raw(format!(
            "written: {} created, {} already there · not written: {} not attempted, {} failed, {} conflicts",
            r.count(Outcome::Created),
            r.count(Outcome::AlreadyExisted),
            r.count(Outcome::NotAttempted),
            r.count(Outcome::Failed),
            r.count(Outcome::Conflict)
        )));
    }
    if c.phase == CommitPhase::Done && !c.rollback {
        match &c.verify {
            Some(v) if v.passed() => lines.push(Line::styled(
                format!("verified: {} of {} in place with identical labels ({} via a mapping), {} skipped by decision", v.ok, v.checked, v.mapped, v.skipped.len()),
                t.good(),
            )),
            Some(v) => lines.push(Line::styled(
                format!("verification: {} of {} ok, {} skipped by decision, {} (missing or different)", v.ok, v.checked, v.skipped.len(), crate::core::words::count(v.problems.len(), "problem")),
                t.bad(),
            )),
            None => lines.push(Line::raw("not verified (the commit was stopped)")),
        }
    }
    lines
}

/// The failures so far, the latest first, as many as fit.
fn failures_panel(model: &Model, t: &Theme, frame: &mut Frame, failures: Rect) {
    let c = &model.commit;
    let rows: Vec<Line> = c
        .failures
        .iter()
        .rev()
        .take(usize::from(failures.height.saturating_sub(2)))
        .map(|(id, e)| {
            Line::from(vec![
                Span::styled(format!("{id}: "), t.bad()),
                Span::raw(e.clone()),
            ])
        })
        .collect();
    let title = if c.failures.is_empty() {
        " Failures: none ".to_string()
    } else {
        format!(" Failures: {} (r retries) ", c.failures.len())
    };
    frame.render_widget(
        Paragraph::new(rows).block(Block::default().borders(Borders::ALL).title(title)),
        failures,
    );
}

/// What the commit (or rollback) wrote so far: from the final report once there is one (the
/// last progress update can trail it), else from the progress.
fn written(c: &crate::tui::model::CommitState) -> (&'static str, usize) {
    match (&c.report, c.rollback) {
        (Some(r), true) => (
            "deleted",
            r.count(Outcome::Deleted) + r.count(Outcome::AlreadyGone),
        ),
        (Some(r), false) => (
            "created",
            r.count(Outcome::Created) + r.count(Outcome::AlreadyExisted),
        ),
        (None, true) => ("deleted", c.deleted),
        (None, false) => ("created", c.created),
    }
}
