//! Rollback: what the logs say this tool created, and for each object whether it is deleted,
//! already gone or kept (with why); then the deletion's progress, as a commit's.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};

use super::theme::Theme;
use crate::app::rollback::summarize;
use crate::core::planner::OpKind;
use crate::tui::model::{CommitPhase, Model};

pub fn draw(model: &Model, frame: &mut Frame, area: Rect) {
    let Some(rb) = &model.rollback else {
        return;
    };
    if model.commit.phase != CommitPhase::Idle {
        return super::commit::progress(model, frame, area);
    }
    let t = Theme::of(model);
    let [head, list] = Layout::vertical([Constraint::Length(7), Constraint::Min(3)]).areas(area);
    let logs: Vec<String> = rb.logs.iter().map(|p| p.display().to_string()).collect();
    let Some(ops) = &rb.ops else {
        frame.render_widget(
            Paragraph::new(format!(
                "reading the objects created by {} …",
                logs.join(", ")
            ))
            .block(Block::default().borders(Borders::ALL).title(" Rollback ")),
            area,
        );
        return;
    };
    let s = summarize(ops);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let lines = vec![
        Line::from(vec![
            Span::styled("runs   ", bold),
            Span::raw(logs.join(", ")),
        ]),
        Line::from(vec![
            Span::styled(format!("{:>6} to delete", s.delete), t.bad()),
            Span::raw(format!(
                " · {} already gone · {}{} kept ({})",
                s.gone,
                match s.restore {
                    0 => String::new(),
                    n => format!("{n} to restore (switch-prepare removed them) · "),
                },
                s.keep,
                if rb.include_in_use {
                    "not the object this tool created; identities in use included"
                } else {
                    "not the object this tool created, or in use: I includes those"
                }
            )),
        ]),
        Line::styled(
            if s.delete + s.gone + s.restore > 0 {
                "Enter deletes them (you type yes), each only if its uid and labels are as recorded"
            } else {
                "nothing to delete"
            },
            t.dim(),
        ),
    ];
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(Block::default().borders(Borders::ALL).title(" Rollback ")),
        head,
    );
    // Kept objects first: they are what the operator has to read.
    let mut rows: Vec<&crate::core::planner::Op> = ops.iter().collect();
    rows.sort_by_key(|op| (op.op != OpKind::Keep, op.target_id));
    let room = usize::from(list.height.saturating_sub(2));
    let shown: Vec<Line> = rows
        .iter()
        .skip(rb.offset)
        .take(room)
        .map(|op| {
            let name = op.target_id.map_or("-".into(), |n| n.to_string());
            match (op.op, &op.expect) {
                (OpKind::Keep, _) => Line::from(vec![
                    Span::styled(format!("keep    {name:<8} "), t.good()),
                    Span::raw(op.reason.clone().unwrap_or_default()),
                ]),
                (OpKind::Create, _) => Line::from(vec![
                    Span::styled(format!("restore {name:<8} "), t.good()),
                    Span::raw(op.label_key.clone()),
                ]),
                (_, Some((_, rv))) if rv.is_empty() => Line::from(vec![
                    Span::styled(format!("gone    {name:<8} "), t.dim()),
                    Span::raw(op.label_key.clone()),
                ]),
                _ => Line::from(vec![
                    Span::styled(format!("delete  {name:<8} "), t.bad()),
                    Span::raw(op.label_key.clone()),
                ]),
            }
        })
        .collect();
    frame.render_widget(
        Paragraph::new(shown).block(Block::default().borders(Borders::ALL).title(format!(
            " Objects: {} (rows {}-{}) ",
            rows.len(),
            (rb.offset + 1).min(rows.len()),
            (rb.offset + room).min(rows.len())
        ))),
        list,
    );
}
