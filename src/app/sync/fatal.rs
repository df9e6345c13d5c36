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

/// What a batch of creates came back as, by core's one reading
/// (`core::sync::batch::batch_outcome`), with an error that ended the batch read as a fault.
pub fn batch_outcome(result: Result<ApplyReport>) -> BatchOutcome {
    crate::core::sync::batch::batch_outcome(
        result.map_err(|e| (fault(Path::Create, &e), e.to_string())),
    )
}
