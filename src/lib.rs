//! cilium-idmig: move Cilium security identities from the etcd kvstore into `CiliumIdentity` resources.
//!
//! The folders are the layers (ARCHITECTURE.md says what each may import):
//! `core` is pure (label keys, ranges, the planner's rules, decisions, verification);
//! `io` is the only code that talks to etcd, Kubernetes and files; `apply` carries out
//! operations against the API server; `app` composes them into flows and the engine service;
//! `tui` is the terminal front end, which sees only `core` data and the service's messages;
//! `sandbox` is the in-process Kubernetes API server of the demo and the tests; `sim` runs the
//! real sync machine through whole simulated rollouts, deterministic from a seed.

pub mod app;
pub mod apply;
pub mod core;
pub mod error;
pub mod io;
pub mod sandbox;
pub mod sim;
pub mod tui;

pub use error::{Error, Result};

/// What the guide shows that is drawn from the code: the pictures of the TUI (tests).
#[cfg(test)]
mod guide;
