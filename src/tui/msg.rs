//! The TUI's messages: what `update` takes (`Msg`) and what it asks the runtime to do
//! (`Command`). A leaf: every other TUI module may use it.

use std::time::Instant;

use crossterm::event::KeyEvent;

use crate::app::service::{ServiceEvent, ServiceRequest};
use crate::apply::outcome::Progress;

/// Inputs to `update`.
#[derive(Debug, Clone)]
pub enum Msg {
    Key(KeyEvent),
    Scroll(i32),
    Resize {
        rows: u16,
    },
    /// A frame tick; `elapsed` is time since the commit started, when one runs.
    Tick {
        now: Instant,
    },
    Engine(ServiceEvent),
    /// The running commit's totals (from the engine's watch channel).
    Progress(Progress),
    /// SIGTERM or SIGHUP (a dropped SSH session): behave like Ctrl-C.
    Signal,
}

/// What `update` asks the runtime to do.
#[derive(Debug, Clone)]
pub enum Command {
    Send(ServiceRequest),
}

/// What reaches the Fleet screen's `update`.
#[derive(Debug, Clone)]
pub enum FleetMsg {
    Key(KeyEvent),
    Resize {
        rows: u16,
    },
    Tick {
        now: Instant,
    },
    /// One cluster answered (its place among the clusters, and its row).
    Row {
        index: usize,
        row: Box<crate::core::fleet::row::ClusterRow>,
        now: Instant,
    },
    /// A cluster could not be opened, and why.
    OpenFailed {
        index: usize,
        error: String,
    },
    /// Back from a cluster's screens (Esc), with what the visit left to say.
    Back {
        index: usize,
        said: Vec<String>,
        now: Instant,
    },
    Signal,
}

/// What the Fleet screen's `update` asks the runtime to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetCommand {
    /// Read every cluster again.
    ReadAgain,
    /// Open this cluster's screens.
    Open(usize),
}
