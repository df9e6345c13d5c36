//! What kubectl needs before it asks for a resource: the legacy discovery documents
//! (`/api`, `/apis`, each group version's resource list), server-side `Table` printing with
//! the CRD's printer columns, and the (empty) events that `kubectl describe` lists. Only
//! what the sandbox serves is advertised: a client must never be told a verb works that
//! answers 405.

use serde_json::{Value, json};

use super::http::{Body, json_response};
use crate::core::identity::{CRD_NAME, GROUP, KIND, PLURAL, VERSION};

/// A group the sandbox serves, with its one version and resources.
struct Group {
    name: &'static str,
    version: &'static str,
    resources: Vec<Value>,
}

fn resource(
    name: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    verbs: &[&str],
    short: &[&str],
) -> Value {
    let mut r = json!({
        "name": name,
        "singularName": singular,
        "namespaced": namespaced,
        "kind": kind,
        "verbs": verbs,
    });
    if !short.is_empty() {
        r["shortNames"] = json!(short);
    }
    r
}

/// The groups served; `cilium.io` only once its CRD is established, as a real server
/// publishes a custom resource's discovery only then.
fn groups(crd_established: bool) -> Vec<Group> {
    let mut groups = vec![
        Group {
            name: "apiextensions.k8s.io",
            version: "v1",
            resources: vec![resource(
                "customresourcedefinitions",
                "customresourcedefinition",
                "CustomResourceDefinition",
                false,
                &["create", "get", "list"],
                &["crd", "crds"],
            )],
        },
        Group {
            name: "coordination.k8s.io",
            version: "v1",
            resources: vec![resource(
                "leases",
                "lease",
                "Lease",
                true,
                &["create", "delete", "get", "list", "update"],
                &[],
            )],
        },
        Group {
            name: "authorization.k8s.io",
            version: "v1",
            resources: vec![resource(
                "selfsubjectaccessreviews",
                "selfsubjectaccessreview",
                "SelfSubjectAccessReview",
                false,
                &["create"],
                &[],
            )],
        },
    ];
    if crd_established {
        let mut r = resource(
            PLURAL,
            "ciliumidentity",
            KIND,
            false,
            &["create", "delete", "get", "list", "patch", "watch"],
            &["ciliumid"],
        );
        r["categories"] = json!(["cilium"]);
        let mut endpoints = resource(
            "ciliumendpoints",
            "ciliumendpoint",
            "CiliumEndpoint",
            true,
            &["list"],
            &["cep", "ciliumep"],
        );
        endpoints["categories"] = json!(["cilium"]);
        groups.push(Group {
            name: GROUP,
            version: VERSION,
            resources: vec![r, endpoints],
        });
    }
    groups
}

/// The discovery document at `path`, if it is one.
pub(super) fn document(path: &str, crd_established: bool) -> Option<Value> {
    let path = path.trim_end_matches('/');
    match path {
        "/api" => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        })),
        "/api/v1" => Some(json!({
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [resource("events", "event", "Event", true, &["list"], &["ev"])],
        })),
        "/apis" => {
            let groups: Vec<Value> = groups(crd_established).iter().map(group_document).collect();
            Some(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
        }
        _ => {
            let rest = path.strip_prefix("/apis/")?;
            let groups = groups(crd_established);
            match rest.split_once('/') {
                None => groups.iter().find(|g| g.name == rest).map(group_document),
                Some((name, version)) => groups
                    .into_iter()
                    .find(|g| g.name == name && g.version == version)
                    .map(|g| {
                        json!({
                            "kind": "APIResourceList",
                            "apiVersion": "v1",
                            "groupVersion": format!("{}/{}", g.name, g.version),
                            "resources": g.resources,
                        })
                    }),
            }
        }
    }
}

fn group_document(g: &Group) -> Value {
    let gv = json!({"groupVersion": format!("{}/{}", g.name, g.version), "version": g.version});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": g.name,
        "versions": [gv.clone()],
        "preferredVersion": gv,
    })
}

/// `kubectl describe` lists the object's events; the sandbox records none.
pub(super) fn is_events_list(path: &str) -> bool {
    path == "/api/v1/events"
        || path
            .strip_prefix("/api/v1/namespaces/")
            .is_some_and(|rest| rest.ends_with("/events") && rest.matches('/').count() == 1)
}

pub(super) fn empty_events() -> http::Response<Body> {
    json_response(
        http::StatusCode::OK,
        &json!({"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []}),
    )
}

/// Whether the client asked for server-side printing (`Accept: ...;as=Table;...`), as
/// kubectl's `get` does.
pub(super) fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// A `meta.k8s.io/v1` Table of CiliumIdentity objects with the CRD's printer columns
/// (Name, Namespace, Age), each row carrying the object's metadata as kubectl expects.
pub(super) fn table(objects: &[&Value], resource_version: &str, now: jiff::Timestamp) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let meta = &o["metadata"];
            let namespace = meta["labels"]["io.kubernetes.pod.namespace"]
                .as_str()
                .map_or(Value::Null, |s| json!(s));
            let age = meta["creationTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map_or("<unknown>".to_string(), |t| short_age(now, t));
            json!({
                "cells": [meta["name"], namespace, age],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": format!("Name of the {KIND} ({CRD_NAME}): the numeric identity"), "priority": 0},
            {"name": "Namespace", "type": "string", "format": "", "description": "The namespace of the entity", "priority": 0},
            {"name": "Age", "type": "date", "format": "", "description": "The age of the identity", "priority": 0},
        ],
        "rows": rows,
    })
}

/// kubectl's short ages: `45s`, `12m`, `5h`, `3d`.
fn short_age(now: jiff::Timestamp, then: jiff::Timestamp) -> String {
    let secs = now.duration_since(then).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cilium_io_is_discoverable_once_the_crd_is_established() {
        let before = document("/apis", false).unwrap();
        assert!(!before.to_string().contains("cilium.io"));
        assert!(document("/apis/cilium.io/v2", false).is_none());
        let after = document("/apis", true).unwrap();
        assert!(after.to_string().contains("\"cilium.io/v2\""));
        let list = document("/apis/cilium.io/v2", true).unwrap();
        let r = &list["resources"][0];
        assert_eq!(r["name"], "ciliumidentities");
        assert_eq!(r["namespaced"], false);
        assert_eq!(r["shortNames"], json!(["ciliumid"]));
        assert!(document("/apis/cilium.io/v3", true).is_none());
        assert_eq!(
            document("/apis/cilium.io", true).unwrap()["kind"],
            "APIGroup"
        );
    }

    #[test]
    fn tables_carry_the_printer_columns() {
        let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let o = json!({"metadata": {"name": "300", "creationTimestamp": "2026-01-01T00:55:00Z",
            "labels": {"io.kubernetes.pod.namespace": "shop"}}});
        let t = table(&[&o], "42", now);
        assert_eq!(t["rows"][0]["cells"], json!(["300", "shop", "5m"]));
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "300");
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
        assert!(is_events_list("/api/v1/namespaces/default/events"));
        assert!(!is_events_list("/api/v1/namespaces/default/pods"));
    }
}
