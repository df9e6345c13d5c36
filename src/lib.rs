//! cilium-idmig: move Cilium security identities from the etcd kvstore into `CiliumIdentity` resources.
//!
//! The library is split so that the terminal never touches IO: `labels`, `range`, `kvstore`,
//! `planner` and `verify` are pure; `etcd_source`, `k8s_target` and `engine` do the IO;
//! `sandbox` is the in-process Kubernetes API server used by tests and the demo; `tui` only
//! talks to the engine through owned messages.

pub mod decision_log;
pub mod engine;
pub mod error;
pub mod etcd_source;
pub mod generator;
#[cfg(test)]
mod hostile_input;
pub mod identity;
pub mod k8s_target;
pub mod kvstore;
pub mod labels;
pub mod plan_file;
pub mod planner;
pub mod preflight;
pub mod range;
pub mod ratelimit;
pub mod report;
pub mod sandbox;
pub mod service;
pub mod session;
#[doc(hidden)]
pub mod testkit;
pub mod tui;
pub mod verify;

pub use error::{Error, Result};
