//! The library's error type: every variant names the thing that failed and what to do about it.

use std::path::PathBuf;

/// Result alias used across the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("etcd at {endpoints}: {message}")]
    Etcd { endpoints: String, message: String },

    #[error("Kubernetes API server {server}: {message}")]
    Kube { server: String, message: String },

    #[error("kubeconfig: {0}")]
    Kubeconfig(String),

    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },

    #[error("plan file {path}: {message}")]
    PlanFile { path: PathBuf, message: String },

    #[error("plan item {id}: {reason}")]
    PlanItem { id: String, reason: String },

    #[error("{0}")]
    Config(String),

    #[error("{0}")]
    Refused(String),

    #[error("sandbox API server: {0}")]
    Sandbox(String),

    #[error("terminal: {0}")]
    Terminal(String),
}

impl Error {
    /// An IO error on a named file, worded for the operator.
    pub fn file(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Error::File {
            path: path.into(),
            message: err.to_string(),
        }
    }

    /// Whether this error is the operator's to fix (exit 2) rather than a failed operation (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Kubeconfig(_)
                | Error::PlanFile { .. }
                | Error::PlanItem { .. }
                | Error::Config(_)
                | Error::Refused(_)
                | Error::File { .. }
                | Error::Etcd { .. }
                | Error::Kube { .. }
        )
    }
}
