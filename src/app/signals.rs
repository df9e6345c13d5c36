//! The one place that listens for the signals that stop a run: SIGINT (Ctrl-C in a headless
//! run), SIGTERM, and SIGHUP from a dropped SSH session. Each stops new writes and lets those
//! in flight finish, headless or in the TUI.

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::error::{Error, Result};

/// Which stop signal arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Interrupt,
    Terminate,
    Hangup,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "Ctrl-C",
            StopSignal::Terminate => "SIGTERM",
            StopSignal::Hangup => "SIGHUP",
        }
    }
}

/// Listens for the stop signals from creation on.
pub struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl StopSignals {
    pub fn new() -> Result<Self> {
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|e| Error::Config(format!("cannot listen for signals: {e}")))
        };
        Ok(StopSignals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
        })
    }

    /// The next stop signal.
    pub async fn recv(&mut self) -> StopSignal {
        tokio::select! {
            _ = self.interrupt.recv() => StopSignal::Interrupt,
            _ = self.terminate.recv() => StopSignal::Terminate,
            _ = self.hangup.recv() => StopSignal::Hangup,
        }
    }
}
