//! What ends sync rather than being retried: a refusal (401, 403, or etcd's permission
//! denied) of something sync needs is configuration, which waiting never fixes, so sync ends
//! (exit 2) naming what was refused and what to grant. Outages (refused connections, 5xx,
//! timeouts) are not refusals and are retried.

use crate::apply::outcome::ApplyReport;
use crate::error::{Error, Result};

/// The refusal `e` is, if it is one, as sync's error naming `what`.
pub fn refusal(what: &str, e: &Error) -> Option<Error> {
    crate::io::refusal::refused_by_server(e).then(|| refused(what, &e.to_string()))
}

pub fn refused(what: &str, e: &str) -> Error {
    Error::Refused(format!(
        "sync stops: {what} was refused ({e}). Waiting will not fix this: grant these credentials what sync needs (assets/clusterrole.yaml: get, list, watch and create on ciliumidentities.cilium.io and get on the CRD, and the Lease Role there; for the kvstore, read on the identities prefix), then start sync again"
    ))
}

/// A create the server refused (401, 403): sync cannot write, and waiting will not fix it.
pub fn refused_write(result: &Result<ApplyReport>) -> Option<Error> {
    match result {
        Err(e) => refusal("creating a CiliumIdentity", e),
        Ok(report) => report.results.iter().find(|r| r.refused).map(|r| {
            refused(
                "creating a CiliumIdentity",
                r.error.as_deref().unwrap_or(""),
            )
        }),
    }
}
