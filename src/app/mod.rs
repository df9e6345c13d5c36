//! The application layer: the flows behind every command (and rollback's), preflight, the
//! engine service the front ends drive, the stop signals, exports and the plain-text reports.

pub mod audit;
pub mod config;
pub mod decisions_file;
pub mod export;
pub mod fleet;
pub mod flows;
pub mod lease;
pub mod metrics;
pub mod preflight;
pub mod report;
pub mod reserve;
pub mod rollback;
pub mod service;
pub mod signals;
pub mod switch;
pub mod sync;
