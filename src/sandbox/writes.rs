//! Writes to CiliumIdentity objects as the API server takes them: create, patch (merge and
//! JSON patch, as `kubectl label`, `annotate` and `patch` send), delete with preconditions,
//! each validated by the rules a real server applies to the CRD.

use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::http::{Body, json_response, status};
use super::state::Shared;
use crate::core::identity::{GROUP, KIND, PLURAL, VERSION};
use crate::core::labels::{is_dns1123_subdomain, is_valid_label_key, is_valid_label_value};

pub(super) fn not_found(name: &str) -> Response<Body> {
    status(
        404,
        "NotFound",
        &format!("{PLURAL}.{GROUP} \"{name}\" not found"),
        Some(json!({"name": name, "group": GROUP, "kind": PLURAL})),
    )
}

fn invalid(name: &str, causes: Vec<(String, String)>) -> Response<Body> {
    let msg = causes
        .iter()
        .map(|(f, m)| format!("{f}: {m}"))
        .collect::<Vec<_>>()
        .join(", ");
    status(
        422,
        "Invalid",
        &format!("{KIND}.{GROUP} \"{name}\" is invalid: {msg}"),
        Some(json!({"name": name, "group": GROUP, "kind": KIND,
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "field": f, "message": m})).collect::<Vec<_>>()})),
    )
}

/// DELETE, honouring `DeleteOptions.preconditions` (uid, resourceVersion) as the API server
/// does: a mismatch is a 409 Conflict, and the object stays.
pub(super) fn delete_identity(
    shared: &Shared,
    name: &str,
    body: &[u8],
    dry_run: bool,
) -> Response<Body> {
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return status(
                    400,
                    "BadRequest",
                    &format!("invalid DeleteOptions: {e}"),
                    None,
                );
            }
        }
    };
    let mut store = shared.store();
    let Some(obj) = store.objects.get(name) else {
        return not_found(name);
    };
    let meta = |field: &str| {
        obj.pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    // What kube-apiserver says for a custom resource, and what the object may have
    // become since the caller read it.
    for (field, label, since) in [
        ("uid", "UID", "deleted and then recreated"),
        ("resourceVersion", "ResourceVersion", "modified"),
    ] {
        if let Some(want) = options
            .pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
        {
            let have = meta(field);
            if want != have {
                let message = format!(
                    "Operation cannot be fulfilled on {KIND}.{GROUP} \"{name}\": the {label} in the precondition ({want}) does not match the {label} in record ({have}). The object might have been {since}"
                );
                return status(
                    409,
                    "Conflict",
                    &message,
                    Some(json!({"name": name, "group": GROUP, "kind": KIND})),
                );
            }
        }
    }
    // `--dry-run=server`: every check made, nothing deleted, the object as it would go.
    if dry_run || is_dry_run(&options["dryRun"]) {
        return json_response(StatusCode::OK, obj);
    }
    match store.delete(name) {
        Some(o) => json_response(StatusCode::OK, &o),
        None => not_found(name),
    }
}

/// `dryRun: ["All"]` in a body's options (the query's `dryRun=All` is read by the router).
fn is_dry_run(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some("All")))
}

pub(super) fn create_identity(
    shared: &Shared,
    body: &[u8],
    manager: &str,
    dry_run: bool,
    fields: FieldValidation,
) -> Response<Body> {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return status(
                400,
                "BadRequest",
                &format!("the body of the request was in an unknown format: {e}"),
                None,
            );
        }
    };
    if obj["apiVersion"] != format!("{GROUP}/{VERSION}") || obj["kind"] != KIND {
        return status(
            400,
            "BadRequest",
            &format!(
                "the API version in the data ({}) does not match the expected API version ({GROUP}/{VERSION})",
                obj["apiVersion"]
            ),
            None,
        );
    }
    let warnings = match fields.prune(&mut obj) {
        Ok(w) => w,
        Err(message) => return status(400, "BadRequest", &message, None),
    };
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let causes = validation_causes(&obj, &name);
    if !causes.is_empty() {
        return invalid(&name, causes);
    }
    let mut store = shared.store();
    if store.objects.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("{PLURAL}.{GROUP} \"{name}\" already exists"),
            Some(json!({"name": name, "group": GROUP, "kind": PLURAL})),
        );
    }
    if dry_run {
        // Validated and answered as created; nothing stored, no resourceVersion spent.
        return warned(json_response(StatusCode::CREATED, &obj), &warnings);
    }
    let created = store.insert_by(name, obj, manager);
    warned(json_response(StatusCode::CREATED, &created), &warnings)
}

/// The media types a PATCH of a custom resource may carry, as the API server lists them.
const PATCH_TYPES: &str =
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";

/// The fields of a CiliumIdentity the CRD's structural schema keeps; others are unknown.
const KNOWN_FIELDS: [&str; 4] = ["apiVersion", "kind", "metadata", "security-labels"];

/// The fields of `ObjectMeta`; others under `metadata` are unknown.
const OBJECT_META: [&str; 14] = [
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
];

/// What a write does with fields the schema does not know (`?fieldValidation=`), as a
/// 1.27+ server: `Strict` refuses the write, `Warn` (the default) drops them and says so
/// in a `Warning` header, `Ignore` drops them silently. kubectl sends `Strict` when the
/// OpenAPI document offers the parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub(super) fn of(params: &[(String, String)]) -> Self {
        match params.iter().find(|(k, _)| k == "fieldValidation") {
            Some((_, v)) if v == "Strict" => FieldValidation::Strict,
            Some((_, v)) if v == "Ignore" => FieldValidation::Ignore,
            _ => FieldValidation::Warn,
        }
    }

    /// Drops the unknown fields of `obj` and returns the warnings to send; `Err` is the
    /// message of the 400 a strict write gets.
    fn prune(self, obj: &mut Value) -> Result<Vec<String>, String> {
        let mut unknown = Vec::new();
        if let Some(map) = obj.as_object_mut() {
            unknown.extend(
                map.keys()
                    .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
                    .cloned(),
            );
            map.retain(|k, _| KNOWN_FIELDS.contains(&k.as_str()));
            if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
                // managedFields is the server's; a client's copy is kept as the server's.
                let known = |k: &str| OBJECT_META.contains(&k) || k == "managedFields";
                unknown.extend(
                    meta.keys()
                        .filter(|k| !known(k))
                        .map(|k| format!("metadata.{k}")),
                );
                meta.retain(|k, _| known(k));
            }
        }
        let said: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
        if self == FieldValidation::Strict && !said.is_empty() {
            return Err(format!("strict decoding error: {}", said.join(", ")));
        }
        Ok(if self == FieldValidation::Warn {
            said
        } else {
            Vec::new()
        })
    }
}

/// The answer with a `Warning` header (RFC 7234 code 299) for each thing said.
fn warned(mut res: Response<Body>, warnings: &[String]) -> Response<Body> {
    for w in warnings {
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - {w:?}")) {
            res.headers_mut().append(http::header::WARNING, v);
        }
    }
    res
}

/// The metadata the server owns: a patch cannot change it (uid is refused as immutable,
/// the others are put back).
const SERVER_METADATA: [&str; 5] = [
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "resourceVersion",
];

/// The patch in `body`, applied to `new` as its media type says; the server's answer when
/// the patch is refused.
fn apply_patch(new: &mut Value, media: &str, body: &[u8]) -> Result<(), Box<Response<Body>>> {
    match media {
        "application/merge-patch+json" => match serde_json::from_slice::<Value>(body) {
            Ok(patch) => json_patch::merge(new, &patch),
            // What kube-apiserver answers: a bare 500 with this message.
            Err(_) => return Err(Box::new(status(500, "", "Invalid JSON Patch", None))),
        },
        "application/json-patch+json" => {
            let patch: json_patch::Patch = match serde_json::from_slice(body) {
                Ok(p) => p,
                Err(e) => return Err(Box::new(status(400, "BadRequest", &e.to_string(), None))),
            };
            if json_patch::patch(new, &patch).is_err() {
                return Err(Box::new(status(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                    Some(json!({})),
                )));
            }
        }
        "application/apply-patch+yaml" => {
            return Err(Box::new(status(
                415,
                "UnsupportedMediaType",
                "server-side apply is not served by the sandbox: use a merge or JSON patch (kubectl label, annotate, patch --type=merge|json)",
                None,
            )));
        }
        _ => {
            return Err(Box::new(status(
                415,
                "UnsupportedMediaType",
                &format!(
                    "the body of the request was in an unknown format - accepted media types include: {PATCH_TYPES}"
                ),
                None,
            )));
        }
    }
    Ok(())
}

/// PATCH, as kube-apiserver takes it for a custom resource: a merge patch (RFC 7386) or a
/// JSON patch (RFC 6902); strategic merge is refused with 415 as for every CRD. The result
/// is validated like a create; a `metadata.resourceVersion` in the patch is a precondition;
/// a patch that changes nothing spends no resourceVersion; a change outside the metadata
/// bumps `generation`; unknown fields go as `fields` says. Server-side apply (`apply-patch+yaml`) is not served (415, said).
pub(super) fn patch_identity(
    shared: &Shared,
    name: &str,
    body: &[u8],
    content_type: &str,
    dry_run: bool,
    fields: FieldValidation,
) -> Response<Body> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let mut store = shared.store();
    let Some(old) = store.objects.get(name).cloned() else {
        return not_found(name);
    };
    let mut new = old.clone();
    if let Err(refused) = apply_patch(&mut new, media, body) {
        return *refused;
    }
    let warnings = match fields.prune(&mut new) {
        Ok(w) => w,
        Err(message) => return status(400, "BadRequest", &message, None),
    };
    let meta = |v: &Value, field: &str| v["metadata"][field].clone();
    // Go omits an empty map: a patch that removes the last label leaves no `labels`.
    if let Some(m) = new["metadata"].as_object_mut() {
        m.retain(|k, v| {
            !(["labels", "annotations"].contains(&k.as_str())
                && v.as_object().is_some_and(|o| o.is_empty()))
        });
    }
    if meta(&new, "name") != meta(&old, "name") {
        return status(
            400,
            "BadRequest",
            &format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta(&new, "name").as_str().unwrap_or("")
            ),
            None,
        );
    }
    if meta(&new, "resourceVersion") != meta(&old, "resourceVersion") {
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {PLURAL}.{GROUP} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
            Some(json!({"name": name, "group": GROUP, "kind": PLURAL})),
        );
    }
    let mut causes = Vec::new();
    if meta(&new, "uid") != meta(&old, "uid") {
        let message = format!("Invalid value: {}: field is immutable", meta(&new, "uid"));
        causes.push(("metadata.uid".to_string(), message));
    }
    if new["kind"] != KIND {
        causes.push((
            "kind".into(),
            format!("Invalid value: {}: must be {KIND}", new["kind"]),
        ));
    }
    let api_version = format!("{GROUP}/{VERSION}");
    if new["apiVersion"] != api_version.as_str() {
        causes.push((
            "apiVersion".into(),
            format!(
                "Invalid value: {}: must be {api_version}",
                new["apiVersion"]
            ),
        ));
    }
    causes.extend(validation_causes(&new, name));
    if !causes.is_empty() {
        return invalid(name, causes);
    }
    for field in SERVER_METADATA {
        match old["metadata"].get(field) {
            Some(v) => new["metadata"][field] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(field);
                }
            }
        }
    }
    if new == old {
        return warned(json_response(StatusCode::OK, &old), &warnings);
    }
    if new["security-labels"] != old["security-labels"] {
        let generation = old["metadata"]["generation"].as_u64().unwrap_or(1);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    if dry_run {
        return warned(json_response(StatusCode::OK, &new), &warnings);
    }
    let stored = store.replace(name, new);
    warned(json_response(StatusCode::OK, &stored), &warnings)
}

/// What the API server's validation says of an object (the CRD's schema and the object
/// meta rules), as `(field, message)` causes; empty when it is valid.
fn validation_causes(obj: &Value, name: &str) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push((
            "metadata.name".into(),
            "Required value: name or generateName is required".into(),
        ));
    } else if !is_dns1123_subdomain(name) {
        causes.push(("metadata.name".into(), format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'")));
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let vs = v.as_str().unwrap_or("");
            if !is_valid_label_key(k) {
                causes.push(("metadata.labels".into(), format!("Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.'")));
            }
            if !v.is_string() || !is_valid_label_value(vs) {
                causes.push(("metadata.labels".into(), format!("Invalid value: {v}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")));
            }
        }
    }
    match obj.get("security-labels") {
        Some(Value::Object(m)) => {
            for (k, v) in m {
                if !v.is_string() {
                    causes.push((format!("security-labels.{k}"), format!("Invalid value: \"{}\": security-labels.{k} in body must be of type string: \"{}\"", json_type(v), json_type(v))));
                }
            }
        }
        None => causes.push(("security-labels".into(), "Required value".into())),
        Some(v) => causes.push((
            "security-labels".into(),
            format!(
                "Invalid value: \"{}\": security-labels in body must be of type object",
                json_type(v)
            ),
        )),
    }
    causes
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        // As Go's JSON schema validator names them: a whole number is an integer.
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
