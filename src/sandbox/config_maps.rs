//! ConfigMaps written, as a real API server takes them: created by name in a namespace (409
//! `AlreadyExists` when taken) and replaced only at the resourceVersion read (409 `Conflict`
//! otherwise). What sync publishes its standing in; reads are `pods`' (with `cilium-config`).

use http::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::http::{Body, json_response, status};
use super::state::Shared;

/// Answers a create or a replace of a ConfigMap; `None` for any other request.
pub(super) fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response<Body>> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once("/configmaps")?;
    let name = rest.strip_prefix('/').unwrap_or("");
    let creating = match (method, name.is_empty()) {
        (&Method::POST, true) => true,
        (&Method::PUT, false) => false,
        _ => return None,
    };
    let mut cm: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Some(status(
                400,
                "BadRequest",
                &format!("the body of the request was in an unknown format: {e}"),
                None,
            ));
        }
    };
    let name = cm["metadata"]["name"].as_str().unwrap_or(name).to_string();
    let key = (namespace.to_string(), name.clone());
    let details = Some(json!({"name": name, "kind": "configmaps"}));
    let mut store = shared.store();
    let current = store.config_maps.get(&key).cloned();
    Some(match (creating, current) {
        (true, Some(_)) => status(
            409,
            "AlreadyExists",
            &format!("configmaps \"{name}\" already exists"),
            details,
        ),
        (false, None) => status(
            404,
            "NotFound",
            &format!("configmaps \"{name}\" not found"),
            details,
        ),
        (false, Some(now))
            if cm["metadata"]["resourceVersion"] != now["metadata"]["resourceVersion"] =>
        {
            status(
                409,
                "Conflict",
                &format!(
                    "Operation cannot be fulfilled on configmaps \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                ),
                details,
            )
        }
        (_, current) => {
            cm["metadata"]["namespace"] = json!(namespace);
            match current {
                None => store.stamp(&mut cm),
                Some(now) => {
                    for k in ["uid", "creationTimestamp"] {
                        cm["metadata"][k] = now["metadata"][k].clone();
                    }
                    let rv = store.bump_rv();
                    cm["metadata"]["resourceVersion"] = json!(rv.to_string());
                }
            }
            store.config_maps.insert(key, cm.clone());
            let code = if creating {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(code, &cm)
        }
    })
}
