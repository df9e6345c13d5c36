//! The interactive terminal front end. One task owns the terminal and `select!`s over
//! input, engine events and a frame tick; state changes only in `update`; `view` draws.
//! It talks to the engine service only through owned messages, and never touches kube or etcd.

pub mod keys;
pub mod model;
pub mod msg;
pub mod update;
pub mod view;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_new_user;

use std::io::Stdout;
use std::time::{Duration, Instant};

use crate::app::service::Handle;
use crate::app::signals::StopSignals;
use crate::core::range::IdRange;
use crate::error::{Error, Result};
use crossterm::event::{DisableMouseCapture, EnableMouseCapture, Event as TermEvent, EventStream};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use futures::StreamExt;
use model::Model;
use msg::{Command, Msg};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

fn term_err(e: impl Into<crate::error::BoxError>) -> Error {
    Error::terminal(e)
}

/// Puts the terminal back however the TUI ends: normal quit, error, or panic.
struct TerminalGuard;

impl TerminalGuard {
    fn enter() -> Result<(Self, Terminal<CrosstermBackend<Stdout>>)> {
        enable_raw_mode().map_err(term_err)?;
        let guard = TerminalGuard;
        let mut out = std::io::stdout();
        execute!(out, EnterAlternateScreen, EnableMouseCapture).map_err(term_err)?;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
        let terminal = Terminal::new(CrosstermBackend::new(out)).map_err(term_err)?;
        Ok((guard, terminal))
    }
}

fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        LeaveAlternateScreen,
        DisableMouseCapture,
        crossterm::cursor::Show
    );
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// What a commit did, for the lines the terminal keeps after the TUI exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitSummary {
    /// Commits this session made (a paused one resumed counts twice).
    pub commits: usize,
    pub created: usize,
    pub already_there: usize,
    pub not_attempted: usize,
    pub failed: usize,
    pub stopped: bool,
    /// A rollback's totals instead of a commit's.
    pub rollback: Option<(usize, usize, usize)>,
}

impl CommitSummary {
    /// The last commit's totals, if one finished.
    pub fn of(model: &Model) -> Option<Self> {
        use crate::apply::outcome::Outcome;
        let r = model.commit.report.as_ref()?;
        // What the session wrote, over every commit; what is left, from the last.
        let (created, already_there) = if model.commit.rollback {
            (r.count(Outcome::Created), r.count(Outcome::AlreadyExisted))
        } else {
            (model.session.created, model.session.already_there)
        };
        Some(CommitSummary {
            commits: model.session.commits,
            created,
            already_there,
            not_attempted: r.count(Outcome::NotAttempted),
            failed: r.count(Outcome::Failed) + r.count(Outcome::Conflict),
            stopped: r.stopped.is_some(),
            rollback: model.commit.rollback.then(|| {
                (
                    r.count(Outcome::Deleted),
                    r.count(Outcome::AlreadyGone),
                    r.count(Outcome::Kept),
                )
            }),
        })
    }

    /// Whether a rerun has anything left to write.
    pub fn unfinished(&self) -> bool {
        self.not_attempted > 0 || self.failed > 0
    }
}

impl std::fmt::Display for CommitSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some((deleted, gone, kept)) = self.rollback {
            return write!(
                f,
                "rollback: {deleted} deleted, {gone} already gone, {kept} kept, {} not attempted, {} failed{}",
                self.not_attempted,
                self.failed,
                if self.stopped { " (stopped)" } else { "" }
            );
        }
        write!(
            f,
            "commit: {} created, {} already there, {} not attempted, {} failed{}{}",
            self.created,
            self.already_there,
            self.not_attempted,
            self.failed,
            if self.stopped { " (stopped)" } else { "" },
            if self.commits > 1 {
                format!(" (this session, {} commits)", self.commits)
            } else {
                String::new()
            }
        )
    }
}

/// What the terminal keeps when the TUI ends: the last commit's totals and where the
/// rollout stands, each if there is one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TuiEnd {
    pub commit: Option<CommitSummary>,
    pub rollout: Option<model::RolloutSummary>,
}

impl TuiEnd {
    fn of(model: &Model) -> Self {
        TuiEnd {
            commit: CommitSummary::of(model),
            rollout: model::RolloutSummary::of(model),
        }
    }
}

/// Runs the TUI until the operator quits, over the engine service's channels; returns what
/// the terminal keeps (the last commit's totals, where the rollout stands).
/// `rollback` non-empty opens the rollback of those decision logs' runs instead of a migration.
pub async fn run(
    range: IdRange,
    no_color: bool,
    rollback: Vec<std::path::PathBuf>,
    handle: Handle,
) -> Result<TuiEnd> {
    let Handle {
        requests,
        mut events,
        mut progress,
    } = handle;
    let mut signals = StopSignals::new()?;
    let (_guard, mut terminal) = TerminalGuard::enter()?;
    let mut model = if rollback.is_empty() {
        Model::new(range, no_color)
    } else {
        Model::for_rollback(range, no_color, rollback)
    };
    let size = terminal.size().map_err(term_err)?;
    update::update(&mut model, Msg::Resize { rows: size.height });
    let mut input = EventStream::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut pending: Vec<Command> = update::init(&mut model);
    loop {
        for cmd in pending.drain(..) {
            match cmd {
                Command::Send(req) => {
                    if requests.send(req).await.is_err() {
                        return Err(Error::terminal("the engine stopped"));
                    }
                }
            }
        }
        if model.quit {
            return Ok(TuiEnd::of(&model));
        }
        terminal.draw(|f| view::view(&model, f)).map_err(term_err)?;
        let msg = tokio::select! {
            ev = input.next() => match ev {
                Some(Ok(TermEvent::Key(k))) if k.kind == crossterm::event::KeyEventKind::Press => Msg::Key(k),
                Some(Ok(TermEvent::Mouse(m))) => match update::scroll_of(m.kind) {
                    Some(n) => Msg::Scroll(n),
                    None => continue,
                },
                Some(Ok(TermEvent::Resize(_, rows))) => Msg::Resize { rows },
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(term_err(e)),
                None => return Ok(TuiEnd::of(&model)),
            },
            Some(ev) = events.recv() => Msg::Engine(ev),
            Ok(()) = progress.changed() => Msg::Progress(*progress.borrow_and_update()),
            _ = tick.tick() => Msg::Tick { now: Instant::now() },
            _ = signals.recv() => Msg::Signal,
        };
        pending = update::update(&mut model, msg);
    }
}
