//! Whether a failure from etcd or the API server is a refusal (credentials, permissions, a
//! bad request: the operator's to fix, exit 2) or failed work (unreachable, 5xx, timeouts
//! after the retries: exit 1), so a script can tell a typo from a flaky server.

use crate::error::Error;
use crate::io::k8s::RequestError;

/// An etcd or Kubernetes error whose server refused (see the module).
pub fn refused_by_server(e: &Error) -> bool {
    match e {
        Error::Etcd { source, .. } | Error::Kube { source, .. } => source
            .as_deref()
            .is_some_and(|s| chain_refused(s as &(dyn std::error::Error + 'static))),
        _ => false,
    }
}

/// Whether a server's answer in this chain is a refusal (credentials, permissions, a bad
/// request): a 4xx from Kubernetes other than 408 and 429, or etcd's PermissionDenied,
/// Unauthenticated, InvalidArgument or FailedPrecondition.
fn chain_refused(cause: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(cause);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<RequestError>() {
            return r.code().is_some_and(refusal_code);
        }
        if let Some(kube::Error::Api(s)) = e.downcast_ref::<kube::Error>() {
            return refusal_code(s.code);
        }
        if let Some(kube::Error::Auth(_)) = e.downcast_ref::<kube::Error>() {
            return true;
        }
        if let Some(etcd) = e.downcast_ref::<etcd_client::Error>() {
            return match etcd {
                // gRPC codes: InvalidArgument 3, PermissionDenied 7, FailedPrecondition 9,
                // Unauthenticated 16.
                etcd_client::Error::GRpcStatus(s) => matches!(s.code() as i32, 3 | 7 | 9 | 16),
                etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
                _ => false,
            };
        }
        cur = e.source();
    }
    false
}

pub fn refusal_code(code: u16) -> bool {
    (400..500).contains(&code) && code != 408 && code != 429
}
