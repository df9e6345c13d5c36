//! The application layer: the flows behind every command, preflight, the engine service the
//! TUI drives, the stop signals, exports and the plain-text reports.

pub mod export;
pub mod flows;
pub mod preflight;
pub mod report;
pub mod service;
pub mod signals;
