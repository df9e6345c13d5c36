//! `CiliumEndpoint` objects (`cilium.io/v2`, namespaced), enough for rollback's question
//! "which identities do live endpoints use": listed across all namespaces or in one, in
//! pages (`limit`, `continue`), each with `status.identity.id` as an agent writes it.

use http::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::http::{Body, json_response, status};
use super::state::Shared;

const ALL: &str = "/apis/cilium.io/v2/ciliumendpoints";
const NAMESPACED: &str = "/apis/cilium.io/v2/namespaces/";

/// An endpoint as a CRD-mode (or kvstore-mode) agent publishes it.
pub fn endpoint_object(namespace: &str, name: &str, identity: u32) -> Value {
    json!({
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumEndpoint",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"identity": {"id": identity, "labels": []}, "state": "ready"},
    })
}

/// Answers a list of endpoints; `None` for any other path.
pub(super) fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    params: &[(String, String)],
) -> Option<Response<Body>> {
    let namespace = if path == ALL {
        None
    } else {
        let rest = path.strip_prefix(NAMESPACED)?;
        let (ns, tail) = rest.split_once('/')?;
        if tail != "ciliumendpoints" {
            return None;
        }
        Some(ns.to_string())
    };
    if method != Method::GET {
        return Some(status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            None,
        ));
    }
    let store = shared.store();
    let all: Vec<&Value> = store
        .endpoints
        .iter()
        .filter(|((ns, _), _)| namespace.as_ref().is_none_or(|n| n == ns))
        .map(|(_, v)| v)
        .collect();
    Some(paged_list(
        "cilium.io/v2",
        "CiliumEndpointList",
        &all,
        params,
        store.rv,
    ))
}

/// A list answered in pages (`limit`, `continue`) as a real server pages it. The continue
/// token is the index of the next item: the sandbox's endpoints and pods do not change under
/// a paged read in the tests and the demo that read them.
pub(super) fn paged_list(
    api_version: &str,
    kind: &str,
    all: &[&Value],
    params: &[(String, String)],
    rv: u64,
) -> Response<Body> {
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let limit = param("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let start = param("continue")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(0);
    let end = limit.map_or(all.len(), |l| (start + l).min(all.len()));
    let items = all.get(start..end).unwrap_or_default();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if end < all.len() {
        meta["continue"] = json!(end.to_string());
        meta["remainingItemCount"] = json!(all.len() - end);
    }
    json_response(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": kind, "metadata": meta, "items": items}),
    )
}
