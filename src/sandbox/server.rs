//! HTTP handling of the sandbox API server: routing, validation and Status bodies.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::discovery;
use super::endpoints;
use super::faults::Fault;
use super::http::{Body, full, json_response, page_not_found, query_params, status};
use super::leases;
use super::list_watch::{list, watch};
use super::openapi;
use super::pods;
use super::state::Shared;
use super::writes::{FieldValidation, create_identity, delete_identity, not_found, patch_identity};
use crate::core::identity::{CRD_NAME, GROUP, PLURAL, VERSION};

/// Returned by the service to make hyper close the connection without an answer.
#[derive(Debug)]
struct DropConnection;
impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected dropped connection")
    }
}
impl std::error::Error for DropConnection {}

pub(crate) async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    // Connections live in this set, so aborting `serve` closes every one of them.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(shared.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let params = query_params(req.uri().query());
    let identities = format!("/apis/{GROUP}/{VERSION}/{PLURAL}");
    let is_identity = path == identities || path.starts_with(&format!("{identities}/"));
    count_request(&shared, &method, &path, is_identity);
    if !authorized(&shared, &req) {
        return Ok(status(401, "Unauthorized", "Unauthorized", None));
    }
    let lose_response = if is_identity {
        match inject_fault(&shared, &method).await? {
            Injected::Answer(res) => return Ok(res),
            Injected::LoseResponse => true,
            Injected::Nothing => false,
        }
    } else {
        false
    };
    let (table, manager) = (wants_table(&req), field_manager(&req));
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let dry_run = params.iter().any(|(k, v)| k == "dryRun" && v == "All");
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(DropConnection),
    };
    let res = if is_identity {
        let name = path
            .strip_prefix(&identities)
            .unwrap_or("")
            .trim_start_matches('/');
        let call = IdentityCall {
            name,
            params: &params,
            body: &body,
            table,
            dry_run,
            manager: &manager,
            content_type: &content_type,
        };
        route_identity(&shared, method, call).await
    } else {
        if path.starts_with(leases::PREFIX) {
            let delay = *shared.lease_delay.lock().unwrap_or_else(|p| p.into_inner());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        route(&shared, method, &path, &params, &body)
    };
    if lose_response {
        return Err(DropConnection);
    }
    Ok(with_warning(&shared, is_identity, res))
}

/// An answer about identities with the configured `Warning` header, quoted as Kubernetes
/// quotes it (`299 - "text"`).
fn with_warning(shared: &Shared, is_identity: bool, mut res: Response<Body>) -> Response<Body> {
    let warning = shared
        .faults
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .0
        .warning
        .clone();
    if let Some(text) = warning.filter(|_| is_identity) {
        let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
            res.headers_mut().append("warning", v);
        }
    }
    res
}

/// Counts the request by method and resource, for tests that assert what was sent.
fn count_request(shared: &Shared, method: &Method, path: &str, is_identity: bool) {
    let resource = if is_identity {
        PLURAL
    } else {
        path.rsplit('/').next().unwrap_or("")
    };
    *shared
        .counts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(format!("{method} {resource}"))
        .or_default() += 1;
}

/// Whether the request carries the bearer token, when the sandbox asks for one.
fn authorized(shared: &Shared, req: &Request<Incoming>) -> bool {
    let Some(token) = &shared.config.token else {
        return true;
    };
    req.headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {token}"))
}

/// What an injected fault does to a request on identities.
enum Injected {
    Nothing,
    /// Answered at once with this (a 5xx, a 429).
    Answer(Response<Body>),
    /// Carried out, and then its answer is lost.
    LoseResponse,
}

/// Picks and applies the fault for this request (after its latency), as configured.
async fn inject_fault(shared: &Shared, method: &Method) -> Result<Injected, DropConnection> {
    let (delay, fault) = {
        let mut f = shared.faults.lock().unwrap_or_else(|p| p.into_inner());
        let (cfg, rng) = &mut *f;
        cfg.pick(rng, *method == Method::POST)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Ok(match fault {
        Some(Fault::Drop) => return Err(DropConnection),
        Some(Fault::Status(code)) => Injected::Answer(status(
            code,
            "InternalError",
            "injected fault: the server is having a bad day",
            None,
        )),
        Some(Fault::TooManyRequests { retry_after_secs }) => {
            let mut res = status(
                429,
                "TooManyRequests",
                "injected fault: too many requests, please try again later",
                Some(json!({"retryAfterSeconds": retry_after_secs})),
            );
            if let Ok(v) = http::HeaderValue::from_str(&retry_after_secs.to_string()) {
                res.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            Injected::Answer(res)
        }
        Some(Fault::LoseResponse) => Injected::LoseResponse,
        Some(Fault::Delay(_)) | None => Injected::Nothing,
    })
}

/// Server-side printing, as `kubectl get` asks for it.
fn wants_table(req: &Request<Incoming>) -> bool {
    req.headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(discovery::wants_table)
}

/// The field manager a real server records: the client's program name.
fn field_manager(req: &Request<Incoming>) -> String {
    req.headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|m| !m.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

/// Everything but identities: version, health, discovery, the CRD, CiliumEndpoints,
/// Leases, access reviews.
fn route(
    shared: &Arc<Shared>,
    method: Method,
    path: &str,
    params: &[(String, String)],
    body: &[u8],
) -> Response<Body> {
    let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    // A write: answered once (a second call would find its own object).
    if let Some(written) = super::config_maps::route(shared, &method, path, body) {
        return written;
    }
    // Discovery documents only; every other path under /api and /apis has its own route.
    let discovery_doc = if method == Method::GET && path.starts_with("/api") {
        discovery::document(path, shared.store().crd_established())
    } else {
        None
    };
    match (method, path) {
        (m, p) if pods::route(shared, &m, p, params).is_some() => {
            pods::route(shared, &m, p, params).unwrap_or_else(page_not_found)
        }
        (Method::GET, "/version") => {
            let (minor, git) = shared.config.release.version();
            json_response(
                StatusCode::OK,
                &json!({"major": "1", "minor": minor, "gitVersion": git, "platform": "linux/amd64"}),
            )
        }
        (Method::GET, "/healthz") | (Method::GET, "/readyz") => {
            full(StatusCode::OK, b"ok".to_vec(), "text/plain")
        }
        (Method::GET, p) if discovery::is_events_list(p) => discovery::empty_events(),
        (Method::GET, _) if discovery_doc.is_some() => {
            json_response(StatusCode::OK, &discovery_doc.unwrap_or_default())
        }
        (Method::GET, openapi::V2) => full(
            StatusCode::OK,
            openapi::v2_document(),
            openapi::V2_MEDIA_TYPE,
        ),
        (Method::GET, p) if p.starts_with(openapi::ROOT) => {
            match openapi::document(p, shared.store().crd_established()) {
                Some(doc) => json_response(StatusCode::OK, &doc),
                None => page_not_found(),
            }
        }
        (Method::POST, p) if p == crd_path => create_crd(shared, body),
        (Method::GET, p) if p == crd_path => crd_list(shared),
        (Method::GET, p) if p == format!("{crd_path}/{CRD_NAME}") => crd_get(shared),
        (m, p) if endpoints::route(shared, &m, p, params).is_some() => {
            endpoints::route(shared, &m, p, params).unwrap_or_else(page_not_found)
        }
        (Method::GET, p) if namespace_name(p).is_some() => namespace(p),
        (m, p) if p.starts_with(leases::PREFIX) => {
            leases::route(shared, &m, p, body).unwrap_or_else(page_not_found)
        }
        (Method::POST, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews") => {
            access_review(shared, body)
        }
        _ => page_not_found(),
    }
}

/// `kubectl get crd`: the list holds the one CRD the sandbox serves, once created.
fn crd_list(shared: &Arc<Shared>) -> Response<Body> {
    let store = shared.store();
    let items: Vec<Value> = store.crd_object().into_iter().collect();
    json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinitionList",
            "metadata": {"resourceVersion": store.rv.to_string()},
            "items": items,
        }),
    )
}

/// The CiliumIdentity CRD, or NotFound before it is created.
fn crd_get(shared: &Arc<Shared>) -> Response<Body> {
    match shared.store().crd_object() {
        Some(crd) => json_response(StatusCode::OK, &crd),
        None => status(
            404,
            "NotFound",
            &format!("customresourcedefinitions.apiextensions.k8s.io \"{CRD_NAME}\" not found"),
            Some(
                json!({"name": CRD_NAME, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"}),
            ),
        ),
    }
}

/// The namespace a path names (`/api/v1/namespaces/{name}`), if it names one.
fn namespace_name(path: &str) -> Option<&str> {
    path.strip_prefix("/api/v1/namespaces/")
        .filter(|n| !n.is_empty() && !n.contains('/'))
}

/// kubectl reads the namespace after a NotFound inside it, to say which is missing. The
/// sandbox's namespaces are implicit: every one exists.
fn namespace(path: &str) -> Response<Body> {
    let name = namespace_name(path).unwrap_or_default();
    json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }),
    )
}

/// A request on CiliumIdentities, as read from its path, query and body.
struct IdentityCall<'a> {
    /// The object's name; empty for the collection.
    name: &'a str,
    params: &'a [(String, String)],
    body: &'a [u8],
    table: bool,
    dry_run: bool,
    manager: &'a str,
    content_type: &'a str,
}

/// CiliumIdentities: list, watch, create, get, delete (404 until the CRD is established).
async fn route_identity(
    shared: &Arc<Shared>,
    method: Method,
    call: IdentityCall<'_>,
) -> Response<Body> {
    if !shared.store().crd_established() {
        return page_not_found();
    }
    let IdentityCall {
        name,
        params,
        body,
        table,
        dry_run,
        manager,
        content_type,
    } = call;
    let fields = FieldValidation::of(params);
    let watching = params
        .iter()
        .any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
    match (method, name.is_empty()) {
        (Method::GET, true) if watching => watch(shared, params),
        (Method::GET, true) => list(shared, params, table).await,
        (Method::POST, true) => create_identity(shared, body, manager, dry_run, fields),
        (Method::GET, false) => match shared.store().objects.get(name) {
            Some(o) if table => {
                let rv = o["metadata"]["resourceVersion"].as_str().unwrap_or("");
                json_response(
                    StatusCode::OK,
                    &discovery::table(&[o], rv, jiff::Timestamp::now()),
                )
            }
            Some(o) => json_response(StatusCode::OK, o),
            None => not_found(name),
        },
        (Method::PATCH, false) => patch_identity(shared, name, body, content_type, dry_run, fields),
        (Method::DELETE, false) => delete_identity(shared, name, body, dry_run),
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            None,
        ),
    }
}

fn create_crd(shared: &Shared, body: &[u8]) -> Response<Body> {
    let crd: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &format!("invalid JSON: {e}"), None),
    };
    if crd.pointer("/metadata/name").and_then(Value::as_str) != Some(CRD_NAME) {
        return status(
            422,
            "Invalid",
            "this sandbox serves only the CiliumIdentity CRD",
            None,
        );
    }
    let mut store = shared.store();
    if store.crd.is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!(
                "customresourcedefinitions.apiextensions.k8s.io \"{CRD_NAME}\" already exists"
            ),
            Some(
                json!({"name": CRD_NAME, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"}),
            ),
        );
    }
    let obj = store.install_crd(crd);
    json_response(StatusCode::CREATED, &obj)
}

fn access_review(shared: &Shared, body: &[u8]) -> Response<Body> {
    let mut review: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return status(400, "BadRequest", &format!("invalid JSON: {e}"), None),
    };
    let attrs = &review["spec"]["resourceAttributes"];
    let verb = attrs["verb"].as_str().unwrap_or("").to_string();
    let resource = attrs["resource"].as_str().unwrap_or("").to_string();
    let denied = shared
        .config
        .denied
        .iter()
        .any(|(v, r)| *v == verb && *r == resource);
    review["status"] = json!({"allowed": !denied, "reason": if denied { "denied by the sandbox's RBAC" } else { "" }});
    json_response(StatusCode::CREATED, &review)
}
