//! `coordination.k8s.io/v1` Leases, as a real API server serves them: namespaced, created by
//! name (409 `AlreadyExists` when taken), read, and replaced only at the resourceVersion the
//! writer read (409 `Conflict` otherwise). Enough for sync's one-writer lease and for
//! `kubectl get lease`.

use http::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::http::{Body, json_response, status};
use super::state::Shared;
use super::store::Store;

pub const PREFIX: &str = "/apis/coordination.k8s.io/v1/namespaces/";

/// Answers a request under `PREFIX`; `None` for a path that is not a lease's.
pub(super) fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response<Body>> {
    let rest = path.strip_prefix(PREFIX)?;
    let mut parts = rest.split('/');
    let namespace = parts.next().filter(|n| !n.is_empty())?.to_string();
    if parts.next() != Some("leases") {
        return None;
    }
    let name = parts.next().unwrap_or("").to_string();
    if parts.next().is_some() {
        return None;
    }
    let verb = match (method, name.is_empty()) {
        (&Method::GET, true) => "list",
        (&Method::GET, false) => "get",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::DELETE, _) => "delete",
        _ => "",
    };
    // The sandbox's RBAC: what its access reviews deny is refused here too, as a real
    // server's authorizer refuses it.
    if shared
        .config
        .denied
        .iter()
        .any(|(v, r)| v == verb && r == "leases")
    {
        let what = if name.is_empty() {
            String::new()
        } else {
            format!(" \"{name}\"")
        };
        return Some(status(
            403,
            "Forbidden",
            &format!(
                "leases.coordination.k8s.io{what} is forbidden: User \"sandbox\" cannot {verb} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"{namespace}\""
            ),
            Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
        ));
    }
    let key = (namespace.clone(), name.clone());
    let mut store = shared.store();
    Some(match (method, name.is_empty()) {
        (&Method::GET, true) => {
            let items: Vec<&Value> = store
                .leases
                .iter()
                .filter(|((ns, _), _)| *ns == namespace)
                .map(|(_, v)| v)
                .collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1",
                    "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}),
            )
        }
        (&Method::GET, false) => match store.leases.get(&key) {
            Some(l) => json_response(StatusCode::OK, l),
            None => not_found(&name),
        },
        (&Method::POST, true) => create(&mut store, &namespace, body),
        (&Method::PUT, false) => update(&mut store, key, &name, body),
        (&Method::DELETE, false) => match store.leases.remove(&key) {
            Some(_) => json_response(
                StatusCode::OK,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
            ),
            None => not_found(&name),
        },
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            None,
        ),
    })
}

/// A Lease created: named, new in its namespace, stamped.
fn create(store: &mut Store, namespace: &str, body: &[u8]) -> Response<Body> {
    let mut lease = match parse(body) {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let name = lease["metadata"]["name"].as_str().unwrap_or("").to_string();
    if name.is_empty() {
        return status(
            422,
            "Invalid",
            "Lease.coordination.k8s.io \"\" is invalid: metadata.name: Required value: name or generateName is required",
            None,
        );
    }
    let key = (namespace.to_string(), name.clone());
    if store.leases.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("leases.coordination.k8s.io \"{name}\" already exists"),
            Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
        );
    }
    lease["metadata"]["namespace"] = json!(namespace);
    store.stamp(&mut lease);
    store.leases.insert(key, lease.clone());
    json_response(StatusCode::CREATED, &lease)
}

/// A Lease replaced, only at the version it was read at.
fn update(store: &mut Store, key: (String, String), name: &str, body: &[u8]) -> Response<Body> {
    let mut lease = match parse(body) {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let Some(current) = store.leases.get(&key).cloned() else {
        return not_found(name);
    };
    let sent = lease["metadata"]["resourceVersion"].as_str().unwrap_or("");
    let now = current["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("");
    // An update carries the version it was read at; another writer in between
    // makes it a conflict, never a lost update.
    if !sent.is_empty() && sent != now {
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
            Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
        );
    }
    let meta = &current["metadata"];
    for k in ["uid", "creationTimestamp", "namespace", "name"] {
        lease["metadata"][k] = meta[k].clone();
    }
    let rv = store.bump_rv();
    lease["metadata"]["resourceVersion"] = json!(rv.to_string());
    store.leases.insert(key, lease.clone());
    json_response(StatusCode::OK, &lease)
}

fn parse(body: &[u8]) -> Result<Value, Box<Response<Body>>> {
    let lease: Value = serde_json::from_slice(body).map_err(|e| {
        Box::new(status(
            400,
            "BadRequest",
            &format!("the body of the request was in an unknown format: {e}"),
            None,
        ))
    })?;
    if lease["kind"] != "Lease" || lease["apiVersion"] != "coordination.k8s.io/v1" {
        return Err(Box::new(status(
            400,
            "BadRequest",
            "the object is not a coordination.k8s.io/v1 Lease",
            None,
        )));
    }
    Ok(lease)
}

fn not_found(name: &str) -> Response<Body> {
    status(
        404,
        "NotFound",
        &format!("leases.coordination.k8s.io \"{name}\" not found"),
        Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
    )
}
