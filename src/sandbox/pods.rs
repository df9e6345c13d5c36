//! Pods, namespaces and ConfigMaps, enough for what the switch report reads as Cilium's
//! operator does: pods and namespaces listed (all at once or in pages), one ConfigMap read
//! by name (a NotFound Status as a real server answers when it is missing). The demo's pods
//! are made from its kvstore identities, so its Switch screen has a cluster to report on.

use std::collections::BTreeMap;

use http::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::endpoints::paged_list;
use super::http::{Body, json_response, status};
use super::state::Shared;
use crate::core::labels::parse_label_key_bytes;

const PODS: &str = "/api/v1/pods";
const NAMESPACES: &str = "/api/v1/namespaces";

/// A pod as the API server stores it (the parts the operator reads).
pub fn pod_object(
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    sa: &str,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Pending"},
    })
}

/// A namespace with its labels.
pub fn namespace_object(name: &str, labels: &BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Answers a list of pods or namespaces, or a ConfigMap; `None` for any other path.
pub(super) fn route(
    shared: &Shared,
    method: &Method,
    path: &str,
    params: &[(String, String)],
) -> Option<Response<Body>> {
    if method != Method::GET {
        return None;
    }
    if let Some((ns, name)) = path
        .strip_prefix("/api/v1/namespaces/")
        .and_then(|rest| rest.split_once("/configmaps/"))
    {
        let store = shared.store();
        return Some(
            match store.config_maps.get(&(ns.to_string(), name.to_string())) {
                Some(cm) => json_response(StatusCode::OK, cm),
                None => status(
                    404,
                    "NotFound",
                    &format!("configmaps \"{name}\" not found"),
                    Some(json!({"name": name, "kind": "configmaps"})),
                ),
            },
        );
    }
    let store = shared.store();
    let (kind, all): (&str, Vec<&Value>) = match path {
        PODS => ("PodList", store.pods.values().collect()),
        NAMESPACES => ("NamespaceList", store.namespaces.values().collect()),
        _ => return None,
    };
    Some(paged_list("v1", kind, &all, params, store.rv))
}

/// Pods for the identities of a kvstore (`id/<n>` keys under `prefix`), at most `max`: each
/// identity with a namespace label becomes one pod with its `k8s:` labels, in a namespace
/// labelled as a server since 1.21 labels it. Identities minted before the cluster label, the
/// service account or that namespace label existed are then what the operator re-mints.
pub fn demo_pods(
    keys: &[(Vec<u8>, Vec<u8>)],
    prefix: &str,
    max: usize,
) -> (Vec<Value>, BTreeMap<String, Value>) {
    let id_prefix = format!("{prefix}/id/");
    let mut pods = Vec::new();
    let mut namespaces = BTreeMap::new();
    for (key, value) in keys {
        if pods.len() >= max {
            break;
        }
        let Some(id) = key.strip_prefix(id_prefix.as_bytes()) else {
            continue;
        };
        let Ok(labels) = parse_label_key_bytes(value) else {
            continue;
        };
        let mut ns = None;
        let mut sa = "default".to_string();
        let mut own = BTreeMap::new();
        let mut ns_labels = BTreeMap::new();
        for l in labels.iter().filter(|l| l.source == "k8s") {
            match l.key.as_str() {
                "io.kubernetes.pod.namespace" => ns = Some(l.value.clone()),
                "io.cilium.k8s.policy.serviceaccount" => sa = l.value.clone(),
                k if k.starts_with("io.cilium.k8s.namespace.labels.") => {
                    let k = k.trim_start_matches("io.cilium.k8s.namespace.labels.");
                    ns_labels.insert(k.to_string(), l.value.clone());
                }
                k if k.starts_with("io.cilium.k8s") => {}
                k => {
                    own.insert(k.to_string(), l.value.clone());
                }
            }
        }
        let Some(ns) = ns else { continue };
        let name = format!("pod-{}", String::from_utf8_lossy(id));
        // The first identity of a namespace names its labels, and the server adds its name.
        namespaces.entry(ns.clone()).or_insert_with(|| {
            ns_labels.insert("kubernetes.io/metadata.name".to_string(), ns.clone());
            namespace_object(&ns, &ns_labels)
        });
        pods.push(pod_object(&ns, &name, &own, &sa));
    }
    (pods, namespaces)
}
