//! The report's outcomes on small clusters built to show each one.

use std::collections::BTreeMap;

use super::*;
use crate::core::switch::settings::Settings;

pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(crate) fn pod(ns: &str, name: &str, app: &str) -> PodFacts {
    PodFacts {
        namespace: ns.into(),
        name: name.into(),
        labels: map(&[("app", app)]),
        service_account: "default".into(),
        host_network: false,
    }
}

/// The set the operator computes for `app` in namespace `shop` on a 1.36 server (which
/// labels every namespace with its name) in cluster `default`.
pub(crate) fn full_set(app: &str) -> SecurityLabels {
    map(&[
        ("k8s:app", app),
        (
            "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name",
            "shop",
        ),
        ("k8s:io.cilium.k8s.policy.cluster", "default"),
        ("k8s:io.cilium.k8s.policy.serviceaccount", "default"),
        ("k8s:io.kubernetes.pod.namespace", "shop"),
    ])
}

pub(crate) fn identity(
    id: u32,
    labels: SecurityLabels,
    created: i64,
    ours: bool,
) -> ExistingIdentity {
    ExistingIdentity {
        id,
        labels,
        created,
        run: ours.then(|| "run-1".to_string()),
        uid: format!("uid-{id}"),
        resource_version: "1".into(),
    }
}

fn report(
    pods: &[PodFacts],
    identities: &[ExistingIdentity],
    endpoints: &[(&str, u32)],
) -> SwitchReport {
    let endpoints: BTreeMap<String, u32> =
        endpoints.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    report_with(pods, identities, &endpoints)
}

/// The report of a cluster whose one namespace, `shop`, carries its name label, on Cilium's
/// defaults.
pub(crate) fn report_with(
    pods: &[PodFacts],
    identities: &[ExistingIdentity],
    endpoints: &BTreeMap<String, u32>,
) -> SwitchReport {
    // Known: the tests that need endpoints unknown say so to the preparation.
    let endpoints = crate::core::switch::endpoints::endpoint_use(
        Some(endpoints.iter().map(|(k, v)| (k.clone(), *v)).collect()),
        None,
        0,
    );
    let settings = Settings::from_config("kube-system/cilium-config", Some(&BTreeMap::new()))
        .expect("settings");
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = [(
        "shop".to_string(),
        map(&[("kubernetes.io/metadata.name", "shop")]),
    )]
    .into();
    switch_report(&SwitchInput {
        settings: &settings,
        pods,
        namespaces: &namespaces,
        identities,
        endpoints: &endpoints,
        range: IdRange::for_cluster(0).expect("range"),
    })
}

fn outcome_of<'a>(r: &'a SwitchReport, pod: &str) -> &'a Outcome {
    &r.pods.iter().find(|p| p.pod == pod).expect("pod").outcome
}

#[test]
fn an_exact_identity_is_adopted_and_a_near_one_is_re_minted_with_what_differs() {
    let mut lacking_ns_name = full_set("api");
    lacking_ns_name.remove("k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name");
    let ids = [
        identity(1000, full_set("web"), 1_577_836_800, true),
        identity(1001, lacking_ns_name, 1_577_836_800, true),
    ];
    let r = report(
        &[pod("shop", "web-1", "web"), pod("shop", "api-1", "api")],
        &ids,
        &[("shop/web-1", 1000), ("shop/api-1", 1001)],
    );
    assert_eq!(outcome_of(&r, "shop/web-1"), &Outcome::Adopted { id: 1000 });
    assert_eq!(
        outcome_of(&r, "shop/api-1"),
        &Outcome::ReMinted {
            nearest: 1001,
            lacks: vec![
                "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop".into()
            ],
            extra: vec![],
        }
    );
    assert_eq!(r.counts.adopted, 1);
    assert_eq!(r.counts.re_minted, 1);
    assert_eq!(r.counts.endpoints_moving, 1, "api-1's endpoint keeps 1001");
    assert_eq!(r.counts.label_sets_drawn, 1);
    // 1001 is used by an endpoint: not unused, but unreserved when the pods are handled.
    assert!(r.unused.is_empty());
    assert_eq!(r.counts.unreserved_identities, 1);
}

#[test]
fn a_cluster_name_that_differs_shows_as_a_changed_value() {
    let mut other_cluster = full_set("web");
    other_cluster.insert("k8s:io.cilium.k8s.policy.cluster".into(), "east".into());
    let r = report(
        &[pod("shop", "web-1", "web")],
        &[identity(1000, other_cluster, 1_577_836_800, false)],
        &[],
    );
    let Outcome::ReMinted { lacks, extra, .. } = outcome_of(&r, "shop/web-1") else {
        panic!("re-minted expected");
    };
    assert_eq!(
        lacks,
        &vec!["k8s:io.cilium.k8s.policy.cluster=default".to_string()]
    );
    assert_eq!(
        extra,
        &vec!["k8s:io.cilium.k8s.policy.cluster=east".to_string()]
    );
}

#[test]
fn duplicates_name_the_agents_pick_and_which_are_ours() {
    let ids = [
        identity(1002, full_set("web"), 1_609_459_200, true),
        identity(1001, full_set("web"), 1_577_836_800, false),
    ];
    let r = report(
        &[pod("shop", "web-1", "web")],
        &ids,
        &[("shop/web-1", 1002)],
    );
    assert_eq!(
        outcome_of(&r, "shop/web-1"),
        &Outcome::Duplicate {
            ids: vec![1001, 1002],
            agents_pick: 1001,
            ours: vec![1002],
        }
    );
    assert_eq!(r.counts.endpoints_moving, 0);
    assert!(r.unused.is_empty(), "neither is free for a draw");
}

#[test]
fn unused_identities_are_listed_and_the_expected_rewrites_follow_the_draws() {
    let mut ids: Vec<ExistingIdentity> = (0..100)
        .map(|i| {
            identity(
                2000 + i,
                full_set(&format!("old-{i}")),
                1_577_836_800,
                i % 2 == 0,
            )
        })
        .collect();
    ids.push(identity(1000, full_set("web"), 1_577_836_800, true));
    let pods: Vec<PodFacts> = (0..10)
        .map(|i| pod("shop", &format!("new-{i}"), &format!("new-{i}")))
        .chain([pod("shop", "web-1", "web"), pod("gone", "x-1", "x")])
        .collect();
    let r = report(&pods, &ids, &[]);
    assert_eq!(r.counts.no_identity, 10);
    assert_eq!(r.counts.no_namespace, 1);
    // A pod whose namespace is gone draws nothing.
    let gone_only = report(
        &[pod("shop", "web-1", "web"), pod("gone", "x-1", "x")],
        &ids,
        &[],
    );
    assert_eq!(gone_only.counts.no_namespace, 1);
    assert!(gone_only.is_safe(), "{:?}", gone_only.counts);
    assert_eq!(r.counts.label_sets_drawn, 10);
    assert_eq!(r.counts.unused_identities, 100);
    assert_eq!(r.unused.iter().filter(|u| u.run.is_some()).count(), 50);
    let expected = 10.0 * 100.0 / 65280.0;
    assert!((r.counts.expected_unused_rewritten - expected).abs() < 1e-9);
    assert!((r.counts.expected_live_taken_over_at_most - 10.0 / 65280.0).abs() < 1e-9);
    // Pods sorted by name, and pods of one label set computed once but each listed.
    let names: Vec<&str> = r.pods.iter().map(|p| p.pod.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
}

#[test]
fn the_json_names_each_outcome() {
    let r = report(&[pod("shop", "web-1", "web")], &[], &[]);
    let v = serde_json::to_value(&r).expect("json");
    assert_eq!(v["pods"][0]["outcome"], "no-identity");
    assert_eq!(v["pods"][0]["pod"], "shop/web-1");
    assert_eq!(v["counts"]["no_identity"], 1);
}

#[test]
fn an_identity_with_labels_the_filter_now_drops_is_still_the_nearest() {
    let mut with_uid = full_set("job");
    with_uid.insert("k8s:controller-uid".into(), "abc".into());
    let r = report(
        &[pod("shop", "job-1", "job")],
        &[identity(1000, with_uid, 1_577_836_800, true)],
        &[],
    );
    assert_eq!(
        outcome_of(&r, "shop/job-1"),
        &Outcome::ReMinted {
            nearest: 1000,
            lacks: vec![],
            extra: vec!["k8s:controller-uid=abc".into()],
        }
    );
}

#[test]
fn a_pod_in_the_hosts_network_gets_nothing_computed() {
    let mut host = pod("shop", "host-1", "host");
    host.host_network = true;
    let r = report(&[host], &[], &[]);
    assert_eq!(outcome_of(&r, "shop/host-1"), &Outcome::HostNetwork);
    assert_eq!(r.counts.host_network, 1);
    assert_eq!(r.counts.label_sets_drawn, 0);
}
