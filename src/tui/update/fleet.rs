//! The Fleet screen's `update`: keys, rows as each cluster answers, and the return from a
//! cluster's screens. Synchronous; opening a cluster and reading again are asked for as
//! commands.

use crossterm::event::KeyCode;

use crate::tui::keys::{KeyAction, action_for};
use crate::tui::model::{FleetModel, READ_EVERY, Screen, TextField};
use crate::tui::msg::{FleetCommand, FleetMsg};

pub fn update_fleet(model: &mut FleetModel, msg: FleetMsg) -> Vec<FleetCommand> {
    match msg {
        FleetMsg::Key(key) => on_key(model, key),
        FleetMsg::Resize { rows } => {
            // Header, table header, the selected one's lines, note, footer and borders
            // take 9 rows.
            model.page = usize::from(rows).saturating_sub(9).max(1);
            model.clamp();
            vec![]
        }
        FleetMsg::Tick { now } => {
            let due = model
                .last_read
                .is_some_and(|at| now.saturating_duration_since(at) >= READ_EVERY);
            if due && model.reading == 0 && model.opening.is_none() {
                return read_again(model);
            }
            vec![]
        }
        FleetMsg::Row { index, row, now } => {
            if let Some(entry) = model.clusters.get_mut(index) {
                entry.row = Some(*row);
            }
            model.reading = model.reading.saturating_sub(1);
            if model.reading == 0 {
                model.last_read = Some(now);
            }
            model.clamp();
            vec![]
        }
        FleetMsg::OpenFailed { index, error } => {
            model.opening = None;
            let name = model.clusters.get(index).map_or("?", |c| c.name.as_str());
            model.note = Some(format!("{name} was not opened: {error}"));
            vec![]
        }
        FleetMsg::Back { index, said, now } => {
            model.opening = None;
            let name = model.clusters.get(index).map_or("?", |c| c.name.as_str());
            model.note = Some(match said.is_empty() {
                true => format!("back from {name}"),
                false => format!("back from {name}: {}", said.join("; ")),
            });
            // What was done there shows at once: read every cluster again.
            model.last_read = Some(now);
            read_again(model)
        }
        FleetMsg::Signal => {
            model.quit = true;
            vec![]
        }
    }
}

fn read_again(model: &mut FleetModel) -> Vec<FleetCommand> {
    if model.reading > 0 {
        return vec![];
    }
    model.reading = model.clusters.len();
    vec![FleetCommand::ReadAgain]
}

fn on_key(model: &mut FleetModel, key: crossterm::event::KeyEvent) -> Vec<FleetCommand> {
    if model.help {
        // Any key closes the help.
        model.help = false;
        return vec![];
    }
    if let Some(field) = &mut model.typing {
        match key.code {
            KeyCode::Enter => {
                model.filter = field.text().to_string();
                model.typing = None;
            }
            KeyCode::Esc => {
                model.filter.clear();
                model.typing = None;
            }
            _ => {
                field.on_key(&key, |c| !c.is_control());
            }
        }
        model.selected = 0;
        model.offset = 0;
        model.clamp();
        return vec![];
    }
    let Some(action) = action_for(Screen::Fleet, &key) else {
        return vec![];
    };
    let shown = model.shown();
    let last = shown.len().saturating_sub(1);
    match action {
        KeyAction::Help => model.help = true,
        KeyAction::Quit => {
            // Esc clears a filter kept before it quits.
            if key.code == KeyCode::Esc && !model.filter.is_empty() {
                model.filter.clear();
                model.clamp();
            } else {
                model.quit = true;
            }
        }
        KeyAction::Up => model.selected = model.selected.saturating_sub(1),
        KeyAction::Down => model.selected = (model.selected + 1).min(last),
        KeyAction::PageUp => model.selected = model.selected.saturating_sub(model.page),
        KeyAction::PageDown => model.selected = (model.selected + model.page).min(last),
        KeyAction::Home => model.selected = 0,
        KeyAction::End => model.selected = last,
        KeyAction::NextConflict | KeyAction::PrevConflict => {
            let forward = action == KeyAction::NextConflict;
            let n = shown.len();
            // From the row after (or before) the selection, round the list once.
            let found = (1..=n)
                .map(|step| match forward {
                    true => (model.selected + step) % n,
                    false => (model.selected + n - step % n) % n,
                })
                .find(|&at| model.clusters[shown[at]].needs_attention());
            match found {
                Some(at) => model.selected = at,
                None => model.note = Some("no cluster shown needs attention".into()),
            }
        }
        KeyAction::Search => model.typing = Some(TextField::new(model.filter.clone())),
        KeyAction::Rescan => return read_again(model),
        KeyAction::Open => {
            if model.opening.is_some() {
                return vec![];
            }
            if let Some(index) = model.selected_cluster() {
                model.opening = Some(index);
                model.note = Some(format!("opening {}…", model.clusters[index].name));
                return vec![FleetCommand::Open(index)];
            }
        }
        _ => {}
    }
    model.clamp();
    vec![]
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    use super::*;
    use crate::core::fleet::row::{ClusterFacts, ClusterRow};

    fn key(m: &mut FleetModel, code: KeyCode) -> Vec<FleetCommand> {
        update_fleet(m, FleetMsg::Key(KeyEvent::new(code, KeyModifiers::NONE)))
    }

    fn typed(m: &mut FleetModel, text: &str) {
        for c in text.chars() {
            key(m, KeyCode::Char(c));
        }
    }

    /// Four clusters: `prod-a` and `stage-c` answered and need nothing, `prod-b` was
    /// refused, `stage-d` has not answered yet.
    fn fleet(now: Instant) -> FleetModel {
        let mut m = FleetModel::new(
            ["prod-a", "prod-b", "stage-c", "stage-d"]
                .map(String::from)
                .to_vec(),
            false,
        );
        let quiet = |name: &str| ClusterRow {
            cluster: name.into(),
            server: "s".into(),
            error: None,
            facts: Some(ClusterFacts::default()),
            attention: None,
        };
        let rows = [
            (0, quiet("prod-a")),
            (
                1,
                ClusterRow::unread("prod-b".into(), "s".into(), "refused".into()),
            ),
            (2, quiet("stage-c")),
        ];
        for (index, row) in rows {
            update_fleet(
                &mut m,
                FleetMsg::Row {
                    index,
                    row: Box::new(row),
                    now,
                },
            );
        }
        m
    }

    #[test]
    fn n_and_n_go_round_the_clusters_that_need_attention_and_the_filter_narrows_them() {
        let now = Instant::now();
        let mut m = fleet(now);
        assert_eq!(m.reading, 1, "stage-d has not answered");
        assert_eq!(m.last_read, None, "a read ends when every cluster answered");
        key(&mut m, KeyCode::Char('n'));
        assert_eq!(m.selected_cluster(), Some(1), "prod-b needs attention");
        key(&mut m, KeyCode::Char('n'));
        assert_eq!(
            m.selected_cluster(),
            Some(1),
            "the only one: round to itself"
        );
        // stage-d answers with a refusal: now two need attention.
        let row = ClusterRow::unread("stage-d".into(), "s".into(), "no answer".into());
        update_fleet(
            &mut m,
            FleetMsg::Row {
                index: 3,
                row: Box::new(row),
                now,
            },
        );
        assert_eq!(m.last_read, Some(now));
        key(&mut m, KeyCode::Char('n'));
        assert_eq!(m.selected_cluster(), Some(3));
        key(&mut m, KeyCode::Char('n'));
        assert_eq!(m.selected_cluster(), Some(1), "round the end");
        key(&mut m, KeyCode::Char('N'));
        assert_eq!(m.selected_cluster(), Some(3), "N goes back round");
        assert_eq!(m.counts(), (0, 2));

        // `/` filters as it is typed, by name or by what is needed; Enter keeps it.
        key(&mut m, KeyCode::Char('/'));
        typed(&mut m, "STAGE");
        assert_eq!(m.shown(), vec![2, 3]);
        key(&mut m, KeyCode::Enter);
        assert_eq!(m.filter, "STAGE");
        assert_eq!(m.selected_cluster(), Some(2), "the selection starts over");
        key(&mut m, KeyCode::Char('n'));
        assert_eq!(m.selected_cluster(), Some(3));
        assert_eq!(key(&mut m, KeyCode::Enter), vec![FleetCommand::Open(3)]);
        assert_eq!(m.opening, Some(3));
        assert_eq!(
            key(&mut m, KeyCode::Enter),
            vec![],
            "one cluster opens at a time"
        );
        update_fleet(
            &mut m,
            FleetMsg::OpenFailed {
                index: 3,
                error: "no kvstore is named for it".into(),
            },
        );
        assert_eq!(m.opening, None);
        assert!(
            m.note
                .as_deref()
                .unwrap()
                .starts_with("stage-d was not opened")
        );
        // `/` starts from the filter kept; Esc while typing clears it.
        key(&mut m, KeyCode::Char('/'));
        key(&mut m, KeyCode::Esc);
        assert_eq!((m.filter.as_str(), m.shown().len()), ("", 4));
        key(&mut m, KeyCode::Char('/'));
        typed(&mut m, "refused");
        key(&mut m, KeyCode::Enter);
        assert_eq!(m.shown(), vec![1], "what a cluster needs matches too");
        // Esc clears a kept filter before it quits.
        key(&mut m, KeyCode::Esc);
        assert_eq!(m.shown().len(), 4);
        assert!(!m.quit);
        key(&mut m, KeyCode::Esc);
        assert!(m.quit);
    }

    /// Every cluster answers the read under way, refused.
    fn answer_all(m: &mut FleetModel, now: Instant) {
        for index in 0..m.clusters.len() {
            let row = ClusterRow::unread(format!("{index}"), "s".into(), "x".into());
            let row = Box::new(row);
            update_fleet(m, FleetMsg::Row { index, row, now });
        }
    }

    #[test]
    fn the_fleet_is_read_again_every_30_s_at_r_and_after_a_visit_never_twice_at_once() {
        let t0 = Instant::now();
        let mut m = fleet(t0);
        let tick = |m: &mut FleetModel, after: Duration| {
            update_fleet(m, FleetMsg::Tick { now: t0 + after })
        };
        assert_eq!(
            tick(&mut m, READ_EVERY * 2),
            vec![],
            "the first read is not over"
        );
        assert_eq!(key(&mut m, KeyCode::Char('R')), vec![], "nor at R");
        let row = ClusterRow::unread("stage-d".into(), "s".into(), "no answer".into());
        update_fleet(
            &mut m,
            FleetMsg::Row {
                index: 3,
                row: Box::new(row),
                now: t0,
            },
        );
        assert_eq!(tick(&mut m, READ_EVERY / 2), vec![]);
        assert_eq!(tick(&mut m, READ_EVERY), vec![FleetCommand::ReadAgain]);
        assert_eq!(m.reading, 4);
        assert_eq!(tick(&mut m, READ_EVERY * 3), vec![], "one read at a time");
        answer_all(&mut m, t0 + READ_EVERY);
        assert_eq!(
            key(&mut m, KeyCode::Char('R')),
            vec![FleetCommand::ReadAgain]
        );
        answer_all(&mut m, t0 + READ_EVERY);
        // Back from a cluster: read again at once, and say what the visit left.
        m.opening = Some(0);
        let back = FleetMsg::Back {
            index: 0,
            said: vec!["commit: 3 created".into()],
            now: t0 + READ_EVERY * 2,
        };
        assert_eq!(update_fleet(&mut m, back), vec![FleetCommand::ReadAgain]);
        assert_eq!(m.opening, None);
        assert_eq!(
            m.note.as_deref(),
            Some("back from prod-a: commit: 3 created")
        );
    }
}
