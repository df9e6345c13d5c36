//! The interactive terminal front end. One task owns the terminal and `select!`s over
//! input, engine events and a frame tick; state changes only in `update`; `view` draws.
//! It talks to the engine service only through owned messages, and never touches kube or etcd.

mod end;
mod fleet;
pub mod keys;
pub mod model;
pub mod msg;
mod terminal;
pub mod update;
pub mod view;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_new_user;

use crate::app::service::Handle;
use crate::app::signals::StopSignals;
use crate::core::range::IdRange;
use crate::error::Result;
use crossterm::event::EventStream;
pub use end::{CommitSummary, TuiEnd};
pub use fleet::{OpenedCluster, Opener, Visit, fleet_loop, run_fleet};
use model::Model;
use terminal::TerminalGuard;
pub use terminal::{Input, run_cluster};

/// Runs the TUI until the operator quits, over the engine service's channels; returns what
/// the terminal keeps (the last commit's totals, where the rollout stands).
/// `rollback` non-empty opens the rollback of those decision logs' runs instead of a migration.
pub async fn run(
    range: IdRange,
    no_color: bool,
    rollback: Vec<std::path::PathBuf>,
    handle: Handle,
) -> Result<TuiEnd> {
    let mut signals = StopSignals::new()?;
    let (_guard, mut terminal) = TerminalGuard::enter()?;
    let model = if rollback.is_empty() {
        Model::new(range, no_color)
    } else {
        Model::for_rollback(range, no_color, rollback)
    };
    let mut input = EventStream::new();
    run_cluster(&mut terminal, &mut input, &mut signals, model, handle).await
}
