//! Sync: the rollout as it happens — kvstore-mode nodes left, identities mirrored, lag,
//! pending decisions, split allocations, failures — and what sync reported, newest last.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::theme::Theme;
use crate::tui::model::Model;

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let t = Theme::of(model);
    let s = &model.sync;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut lines = vec![Line::from(vec![
        Span::styled("state    ", bold),
        if s.cutover {
            Span::styled("cutover reached", t.good())
        } else if s.stopping {
            Span::raw("stopping: writes in flight finish")
        } else if let Some(holder) = s
            .status
            .as_ref()
            .and_then(|st| st.standby.as_ref())
            .filter(|_| s.running && s.following)
        {
            Span::styled(
                format!("standby: {holder} holds the lease; following both sides, writing nothing"),
                t.warn(),
            )
        } else if s.running && s.following {
            Span::raw("following both sides")
        } else if s.running {
            Span::raw("starting: reading the kvstore and Kubernetes")
        } else {
            Span::raw("not running: y starts it (after a commit)")
        },
    ])];
    lines.extend(count_lines(model, &t));
    // As tall as its lines once wrapped (at 80 columns the waiting line takes two rows), so
    // none is cut; at least 8 rows, at most half the screen.
    let inner = usize::from(area.width.saturating_sub(2)).max(1);
    let rows: usize = lines
        .iter()
        .map(|l| {
            let text: String = l.spans.iter().map(|s| s.content.as_ref()).collect();
            super::wrap::words(&text, inner).len().max(1)
        })
        .sum();
    let height = u16::try_from(rows + 2)
        .unwrap_or(u16::MAX)
        .clamp(8, (area.height / 2).max(8));
    let [head, list] =
        Layout::vertical([Constraint::Length(height), Constraint::Min(3)]).areas(area);
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(" Sync ")),
        head,
    );
    reports(model, frame, list);
}

/// Where sync stands, counted: only once both sides are read ("0 identities" while
/// starting would be wrong).
fn count_lines(model: &Model, t: &Theme) -> Vec<Line<'static>> {
    let s = &model.sync;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let ms =
        |d: Option<std::time::Duration>| d.map_or("-".into(), |d| format!("{} ms", d.as_millis()));
    let mut lines = Vec::new();
    if let Some(st) = s.status.as_ref().filter(|_| s.following || !s.running) {
        if let Some(wait) = &st.cutover_wait {
            lines.push(Line::from(vec![
                Span::styled("cutover  ", bold),
                Span::raw(wait.to_string()),
            ]));
        }
        lines.push(Line::from(vec![
            Span::styled("rollout  ", bold),
            Span::raw(format!(
                "{} left · {} identities · {} mirrored by sync{}",
                crate::core::words::count(st.kvstore_nodes, "kvstore-mode node"),
                st.identities,
                st.mirrored,
                // Sync counts its own creates; the commit's are the commit's.
                match model.session.created {
                    0 => String::new(),
                    n => format!(" (the commit before it wrote {n})"),
                }
            )),
        ]));
        lines.push(Line::from(vec![
            Span::styled("lag      ", bold),
            Span::raw(format!(
                "{}last {} · p50 {} · p99 {}{}",
                // Lag is measured from an identity's arrival through the watch; what sync
                // wrote as it started arrived through no watch.
                if st.lag_last.is_none() && st.lag_p99.is_none() && st.mirrored > 0 {
                    "none yet: what sync mirrored so far was missing at its start · "
                } else {
                    ""
                },
                ms(st.lag_last),
                ms(st.lag_p50),
                ms(st.lag_p99),
                st.decision_wait_last.map_or(String::new(), |d| format!(
                    " · waited {} for a decision (apart)",
                    ms(Some(d))
                ))
            )),
        ]));
        // Sync's own count, from its live view; the header's "undecided" counts the last scan.
        let pending = Span::styled(
            format!(
                "{} in sync's live view (decide on screen 3)",
                crate::core::words::count(st.pending, "pending decision")
            ),
            if st.pending > 0 { t.bad() } else { t.good() },
        );
        lines.push(Line::from(vec![Span::styled("waiting  ", bold), pending]));
        // The rest on a line of its own: at 80 columns one line would break mid-count.
        lines.push(Line::from(vec![
            Span::raw("         "),
            Span::raw(format!(
                "{} · {}{}{}",
                crate::core::words::count(st.splits, "split"),
                crate::core::words::count(st.failures, "failed write"),
                if st.reservations > 0 {
                    format!(" · {} reserved in the kvstore", st.reservations)
                } else {
                    String::new()
                },
                if st.watching {
                    ""
                } else {
                    " · a watch is catching up"
                }
            )),
        ]));
    }
    lines
}

/// The newest reports that fit, counting the rows each takes once wrapped.
fn reports(model: &Model, frame: &mut Frame, list: Rect) {
    let s = &model.sync;
    let room = usize::from(list.height.saturating_sub(2));
    let width = usize::from(list.width.saturating_sub(2)).max(1);
    let mut shown: Vec<Line> = Vec::new();
    for l in s.lines.iter().rev().skip(s.scroll) {
        let rows = super::wrap::words(l, width);
        if shown.len() + rows.len() > room {
            break;
        }
        shown.extend(rows.into_iter().rev().map(Line::raw));
    }
    shown.reverse();
    let title = match (s.lines.len(), s.scroll) {
        (0, _) => " Reports ".to_string(),
        (n, 0) => format!(" Reports: the newest of {n} (↑ older, Enter whole) "),
        (n, k) => format!(" Reports: {k} back of {n} (↓ newer, Enter whole) "),
    };
    frame.render_widget(
        Paragraph::new(shown).block(Block::default().borders(Borders::ALL).title(title)),
        list,
    );
}
