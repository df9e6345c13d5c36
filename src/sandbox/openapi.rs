//! The OpenAPI documents kubectl reads before it sends an object (`kubectl create -f`,
//! `apply`): v3's root listing each group version, and cilium.io/v2's with the
//! CiliumIdentity schema and operations. They say the server validates fields itself
//! (`fieldValidation` on writes), so kubectl sends `fieldValidation=Strict` and leaves the
//! checking to the sandbox, as it does against a real 1.27+ server. Only what is served is
//! described: list, watch, get, create, patch, delete. And a v2 document without
//! definitions, which kubectl reads to validate a `v1 List`.

use serde_json::{Value, json};

use crate::core::identity::{GROUP, KIND, PLURAL, VERSION};

/// Where kubectl looks first.
pub(super) const ROOT: &str = "/openapi/v3";

/// The group version the sandbox documents (its only custom resource).
fn group_version_path() -> String {
    format!("apis/{GROUP}/{VERSION}")
}

/// The document at `path` (the query is not part of it), if there is one. The cilium.io
/// document exists only once the CRD is established, as a real server publishes it.
pub(super) fn document(path: &str, crd_established: bool) -> Option<Value> {
    let path = path.trim_end_matches('/');
    if path == ROOT {
        let mut paths = serde_json::Map::new();
        if crd_established {
            // The hash lets clients cache the document; it changes only with the schema.
            paths.insert(
                group_version_path(),
                json!({"serverRelativeURL": format!("{ROOT}/{}?hash=sandbox-1", group_version_path())}),
            );
        }
        return Some(json!({ "paths": paths }));
    }
    if crd_established && path == format!("{ROOT}/{}", group_version_path()) {
        return Some(group_version());
    }
    None
}

/// Where kubectl reads the OpenAPI v2 document: it validates a `v1 List` (`kubectl create -f`
/// of several objects in one file) against v2, not v3.
pub(super) const V2: &str = "/openapi/v2";

/// The media type the v2 document is served as. kubectl asks for
/// `...spec.v2@v1.0+protobuf`, but an `@` does not parse as a media type in Go: the API
/// server answers with a dot, as here.
pub(super) const V2_MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// The v2 document, as the protobuf kubectl reads (gnostic's `openapi_v2.Document`):
/// `swagger: "2.0"` and its `info`, and no definitions. kubectl validates only the kinds a
/// document defines, so it leaves a List's items to the server's field validation, as the v3
/// document makes it leave a lone CiliumIdentity.
pub(super) fn v2_document() -> Vec<u8> {
    // Each field: its number and wire type 2 (length-delimited), its length, its bytes.
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }
    let info = [field(1, b"cilium-idmig sandbox"), field(2, b"v2")].concat();
    [field(1, b"2.0"), field(2, &info)].concat()
}

fn schema_name() -> String {
    format!("io.cilium.{VERSION}.{KIND}")
}

/// An operation on CiliumIdentities, with the query parameters it takes.
fn operation(action: &str, kind: &str, params: &[&str]) -> Value {
    let parameters: Vec<Value> = params
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": true}}))
        .collect();
    json!({
        "operationId": format!("{action}CiliumIo{}{kind}", VERSION.to_uppercase()),
        "parameters": parameters,
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION, "kind": kind},
    })
}

fn group_version() -> Value {
    let writes = ["dryRun", "fieldManager", "fieldValidation"];
    let list = [
        "labelSelector",
        "limit",
        "continue",
        "resourceVersion",
        "watch",
        "timeoutSeconds",
        "allowWatchBookmarks",
    ];
    let meta = "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": {
            format!("/apis/{GROUP}/{VERSION}/{PLURAL}"): {
                "get": operation("list", &format!("{KIND}List"), &list),
                "post": operation("post", KIND, &writes),
            },
            format!("/apis/{GROUP}/{VERSION}/{PLURAL}/{{name}}"): {
                "get": operation("get", KIND, &[]),
                "patch": operation("patch", KIND, &writes),
                "delete": operation("delete", KIND, &["dryRun"]),
            },
        },
        "components": {"schemas": {
            schema_name(): {
                "type": "object",
                "required": ["metadata", "security-labels"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"allOf": [{"$ref": meta}], "default": {}},
                    "security-labels": string_map,
                },
                "x-kubernetes-group-version-kind": [{"group": GROUP, "version": VERSION, "kind": KIND}],
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "labels": string_map,
                    "annotations": string_map,
                    "resourceVersion": {"type": "string"},
                    "uid": {"type": "string"},
                },
            },
        }},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_names_cilium_io_only_once_the_crd_is_established() {
        let before = document(ROOT, false).unwrap_or_default();
        assert_eq!(before["paths"], json!({}));
        let after = document(ROOT, true).unwrap_or_default();
        let url = after["paths"]["apis/cilium.io/v2"]["serverRelativeURL"]
            .as_str()
            .unwrap_or("");
        let path = url.split('?').next().unwrap_or("");
        assert!(document(path, true).is_some(), "{url}");
        assert!(document(path, false).is_none());
    }

    #[test]
    fn writes_take_field_validation_so_kubectl_leaves_it_to_the_server() {
        let doc = group_version();
        let patch = &doc["paths"]["/apis/cilium.io/v2/ciliumidentities/{name}"]["patch"];
        let names: Vec<&str> = patch["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert!(names.contains(&"fieldValidation"), "{names:?}");
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "CiliumIdentity"
        );
    }
}
