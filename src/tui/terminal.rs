//! The terminal itself: taken on entry and put back however the TUI ends, and one cluster's
//! screens run on it (the loop that `select!`s over input, engine events and a tick).

use std::io::Stdout;
use std::time::{Duration, Instant};

use crossterm::event::{DisableMouseCapture, EnableMouseCapture, Event as TermEvent};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use futures::StreamExt;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

use super::end::TuiEnd;
use super::model::Model;
use super::msg::{Command, Msg};
use crate::app::service::Handle;
use crate::app::signals::StopSignals;
use crate::error::{Error, Result};
use crate::tui::update;
use crate::tui::view;

pub(super) fn term_err(e: impl Into<crate::error::BoxError>) -> Error {
    Error::terminal(e)
}

/// Puts the terminal back however the TUI ends: normal quit, error, or panic.
pub(super) struct TerminalGuard;

impl TerminalGuard {
    pub(super) fn enter() -> Result<(Self, Terminal<CrosstermBackend<Stdout>>)> {
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

/// The terminal's events, as crossterm's `EventStream` gives them (or a test's script).
pub trait Input: futures::Stream<Item = std::io::Result<TermEvent>> + Unpin {}
impl<T: futures::Stream<Item = std::io::Result<TermEvent>> + Unpin> Input for T {}

/// One cluster's screens on `terminal` until the operator leaves them: `q` (or a signal)
/// ends the session, Esc on a cluster opened from the Fleet screen goes back to it
/// (`TuiEnd::back`).
pub async fn run_cluster<B: ratatui::backend::Backend>(
    terminal: &mut Terminal<B>,
    input: &mut impl Input,
    signals: &mut StopSignals,
    mut model: Model,
    handle: Handle,
) -> Result<TuiEnd>
where
    B::Error: Send + Sync + 'static,
{
    let Handle {
        requests,
        mut events,
        mut progress,
    } = handle;
    let size = terminal.size().map_err(term_err)?;
    update::update(&mut model, Msg::Resize { rows: size.height });
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
