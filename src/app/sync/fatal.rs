//! Each error sync meets, read as a `Fault` for core's rules (`core::sync::failure`), which
//! say whether it ends sync or is ridden out. A refusal that ends sync names what was
//! refused and what to grant.

use crate::apply::outcome::ApplyReport;
use crate::core::sync::BatchOutcome;
use crate::core::sync::failure::{Fault, Path};
use crate::core::sync::shell::Failed;
use crate::error::{Error, Result};
use crate::io::k8s::RequestError;
use crate::io::refusal::{refusal_code, refused_by_server};

/// The fault `e` is, as the rules read it. A file's error is configuration only where files
/// read are configuration (a certificate when connecting); elsewhere it is the decision
/// log's disk, which may come back.
fn fault(path: Path, e: &Error) -> Fault {
    let files_are_config = path == Path::KvRead;
    Fault {
        refused: refused_by_server(e),
        config: matches!(e, Error::Config(_))
            || (files_are_config && matches!(e, Error::File { .. })),
        ..Fault::default()
    }
}

/// The fault a request to the API server met; `old_token`: it was sent with a token since
/// renewed.
pub fn request_fault(e: &RequestError, old_token: bool) -> Fault {
    Fault {
        refused: e.code().is_some_and(refusal_code),
        code: e.code(),
        old_token,
        config: false,
    }
}

/// `e`, met on `path` doing `what`, for the shell to judge (`Shell::failed`); `trouble`
/// turns the error's words into what is said when it is ridden out.
pub fn failed(path: Path, what: &str, e: &Error, trouble: impl FnOnce(String) -> String) -> Failed {
    failed_as(path, fault(path, e), what, e, trouble)
}

/// As `failed`, for an error read as `fault` elsewhere (a request's, `request_fault`).
pub fn failed_as(
    path: Path,
    fault: Fault,
    what: &str,
    e: &impl std::fmt::Display,
    trouble: impl FnOnce(String) -> String,
) -> Failed {
    let error = e.to_string();
    Failed {
        path,
        fault,
        doing: what.to_string(),
        trouble: trouble(error.clone()),
        error,
    }
}

/// The error sync ends with on a read or a watch the shell ended it on: a refusal names
/// what to grant; configuration is said as it is.
pub fn read_refused(fault: Fault, doing: &str, error: &str) -> Error {
    if fault.refused {
        refused(doing, error)
    } else {
        Error::Config(error.to_string())
    }
}

pub fn refused(what: &str, e: &str) -> Error {
    Error::Refused(format!(
        "sync stops: {what} was refused ({e}). Waiting will not fix this: grant these credentials what sync needs (assets/clusterrole.yaml: get, list, watch and create on ciliumidentities.cilium.io and get on the CRD, and the Lease Role there; for the kvstore, read on the identities prefix), then start sync again"
    ))
}

/// What a batch of creates came back as: a fault the rules may end sync on (a refusal, 401
/// or 403, or configuration) as `BatchOutcome::Faulted`, for the shell to judge by
/// `core::sync::failure`; any other error a failed batch; else each create's outcome.
pub fn batch_outcome(result: Result<ApplyReport>) -> BatchOutcome {
    match result {
        Err(e) => {
            let fault = fault(Path::Create, &e);
            let why = e.to_string();
            if fault.refused || fault.config {
                BatchOutcome::Faulted { fault, why }
            } else {
                BatchOutcome::Failed(why)
            }
        }
        Ok(report) => match report.results.iter().find(|r| r.refused) {
            Some(r) => BatchOutcome::Faulted {
                fault: Fault {
                    refused: true,
                    ..Fault::default()
                },
                why: r
                    .error
                    .clone()
                    .unwrap_or_else(|| "the create was refused".into()),
            },
            None => BatchOutcome::Done {
                results: report
                    .results
                    .iter()
                    .filter_map(|r| r.target_id.map(|t| (t, r.outcome)))
                    .collect(),
                halted: report.stopped.clone(),
            },
        },
    }
}
