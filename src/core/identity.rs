//! The `CiliumIdentity` resource: names, the object we create, and reading objects back.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::core::labels::{SecurityLabels, left_out_of_metadata, metadata_labels};

pub const GROUP: &str = "cilium.io";
pub const VERSION: &str = "v2";
pub const KIND: &str = "CiliumIdentity";
pub const PLURAL: &str = "ciliumidentities";
pub const CRD_NAME: &str = "ciliumidentities.cilium.io";
/// The annotation on every object this tool creates: the run (process) that created it, as
/// its session line in the decision log names it. Cilium reads no annotation of a
/// CiliumIdentity but its own heartbeat, so this one changes nothing for the agents.
pub const RUN_ANNOTATION: &str = "cilium-idmig.io/run";
/// The annotation that says which labels were left out of `metadata.labels` because the API
/// server would refuse them (they stay exact in `security-labels`, all Cilium reads).
pub const LEFT_OUT_ANNOTATION: &str = "cilium-idmig.io/labels-left-out";
/// The CRD we install when the cluster has none (apiextensions v1, schema compatible with Cilium's).
pub const CRD_YAML: &str = include_str!("../../assets/ciliumidentities.cilium.io.yaml");
/// The least-privilege ClusterRole the tool needs.
pub const CLUSTER_ROLE_YAML: &str = include_str!("../../assets/clusterrole.yaml");
/// The ClusterRole a rollback needs (the only command that deletes).
pub const ROLLBACK_ROLE_YAML: &str = include_str!("../../assets/clusterrole-rollback.yaml");

/// What the tool is tested with, against the real code: said by `--version` and the
/// preflight.
pub const TESTED_WITH: &str = "tested with Cilium 1.9's and 1.18's own identity allocators (kvstore, crd, doublewrite-readcrd modes), Cilium 1.6.11's migrator side by side, kube-apiserver 1.19.0 over etcd 3.4 and 1.36.2 over etcd 3.6";

/// The collection path of CiliumIdentity objects.
pub fn collection_path() -> String {
    format!("/apis/{GROUP}/{VERSION}/{PLURAL}")
}

/// The object Cilium's CRD backend would write for this identity. Empty values travel as
/// `""`, never `null`: the v1 schema declares every `security-labels` value a string.
pub fn identity_object(id: u32, labels: &SecurityLabels) -> Value {
    let mut obj = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": id.to_string(),
            "labels": metadata_labels(labels),
        },
        "security-labels": labels,
    });
    let left_out = left_out_of_metadata(labels);
    if !left_out.is_empty() {
        obj["metadata"]["annotations"] = json!({ LEFT_OUT_ANNOTATION: left_out.join(",") });
    }
    obj
}

/// The object this tool creates: `identity_object` with the run that creates it.
pub fn identity_object_of_run(id: u32, labels: &SecurityLabels, run: &str) -> Value {
    let mut obj = identity_object(id, labels);
    if !obj["metadata"]["annotations"].is_object() {
        obj["metadata"]["annotations"] = json!({});
    }
    obj["metadata"]["annotations"][RUN_ANNOTATION] = json!(run);
    obj
}

/// An identity as read from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedIdentity {
    pub name: String,
    pub labels: SecurityLabels,
}

/// Reads `metadata.name` and `security-labels` from an object. A `null` value reads as `""`,
/// which is what an agent unmarshalling into a Go string sees.
pub fn parse_identity(obj: &Value) -> Result<ObservedIdentity, String> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or("object has no metadata.name")?
        .to_string();
    let mut labels = BTreeMap::new();
    match obj.get("security-labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                let v = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => {
                        return Err(format!(
                            "{name}: security-labels[{k}] is {other}, not a string"
                        ));
                    }
                };
                labels.insert(k.clone(), v);
            }
        }
        Some(other) => return Err(format!("{name}: security-labels is {other}, not a map")),
    }
    Ok(ObservedIdentity { name, labels })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collection_path_is_the_api_servers() {
        assert_eq!(collection_path(), "/apis/cilium.io/v2/ciliumidentities");
    }

    #[test]
    fn object_round_trips_and_sanitizes() {
        let mut l = SecurityLabels::new();
        l.insert("k8s:app".into(), "web".into());
        l.insert("reserved:host".into(), "".into());
        l.insert("k8s:odd".into(), "not valid!".into());
        l.insert(
            "k8s:io.cilium.k8s.namespace.labels.team".into(),
            "payments".into(),
        );
        let obj = identity_object(300, &l);
        assert_eq!(obj["metadata"]["name"], "300");
        // As Cilium 1.18's CRD backend: k8s: labels without the prefix, never the namespace's
        // own labels; what the API server would refuse is left out and said.
        assert_eq!(obj["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(obj["metadata"]["annotations"][LEFT_OUT_ANNOTATION], "odd");
        let run = identity_object_of_run(300, &l, "r1");
        assert_eq!(run["metadata"]["annotations"][LEFT_OUT_ANNOTATION], "odd");
        assert_eq!(run["metadata"]["annotations"][RUN_ANNOTATION], "r1");
        let mut plain = SecurityLabels::new();
        plain.insert("k8s:app".into(), "web".into());
        assert!(
            identity_object(301, &plain)["metadata"]
                .get("annotations")
                .is_none()
        );
        assert_eq!(obj["security-labels"]["reserved:host"], "");
        let back = parse_identity(&obj).unwrap();
        assert_eq!(back.labels, l);
        let with_null =
            json!({"metadata": {"name": "5"}, "security-labels": {"reserved:host": null}});
        assert_eq!(
            parse_identity(&with_null).unwrap().labels["reserved:host"],
            ""
        );
        assert!(parse_identity(&json!({"metadata": {}})).is_err());
        assert!(
            parse_identity(&json!({"metadata": {"name": "1"}, "security-labels": {"a": 1}}))
                .is_err()
        );
    }

    #[test]
    fn crd_asset_is_cilium_compatible() {
        let crd: Value = serde_yaml_ng::from_str(CRD_YAML).unwrap();
        assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(crd["metadata"]["name"], CRD_NAME);
        assert_eq!(crd["spec"]["scope"], "Cluster");
        assert_eq!(crd["spec"]["names"]["plural"], PLURAL);
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], VERSION);
        assert_eq!(v["storage"], true);
        assert_eq!(
            v["schema"]["openAPIV3Schema"]["properties"]["security-labels"]["additionalProperties"]
                ["type"],
            "string"
        );
    }
}
