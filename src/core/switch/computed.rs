//! The label set Cilium 1.18's operator computes for a pod (`k8s.GetPodMetadata`, then the
//! identity key): the pod's labels without Cilium's own `io.cilium.k8s` ones, the
//! namespace's name and labels, the pod's service account, the cluster name, all of source
//! `k8s`, through the label filter. An existing `CiliumIdentity` is adopted only when its
//! `security-labels` are exactly this set.

use std::collections::BTreeMap;

use crate::core::labels::SecurityLabels;
use crate::core::switch::filter::LabelFilter;

/// What the operator reads of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `spec.serviceAccountName`; empty when the pod names none.
    pub service_account: String,
    /// `spec.hostNetwork`: the operator computes nothing for such a pod (it has the host's
    /// identity), as the agents do.
    pub host_network: bool,
}

/// Cilium's label keys the operator adds.
pub const NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const NAMESPACE_LABELS_PREFIX: &str = "io.cilium.k8s.namespace.labels";
pub const SERVICE_ACCOUNT_LABEL: &str = "io.cilium.k8s.policy.serviceaccount";
pub const CLUSTER_LABEL: &str = "io.cilium.k8s.policy.cluster";
/// A pod may not set labels under Cilium's own prefix: they are dropped before the rest.
pub const CILIUM_OWN_PREFIX: &str = "io.cilium.k8s";

/// The security labels the operator computes for `pod` in a namespace labelled
/// `namespace_labels`.
pub fn operator_labels(
    pod: &PodFacts,
    namespace_labels: &BTreeMap<String, String>,
    cluster_name: &str,
    filter: &LabelFilter,
) -> SecurityLabels {
    let mut all: BTreeMap<String, String> = pod
        .labels
        .iter()
        .filter(|(k, _)| !k.starts_with(CILIUM_OWN_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in namespace_labels {
        all.insert(format!("{NAMESPACE_LABELS_PREFIX}.{k}"), v.clone());
    }
    all.insert(NAMESPACE_LABEL.to_string(), pod.namespace.clone());
    if pod.service_account.is_empty() {
        all.remove(SERVICE_ACCOUNT_LABEL);
    } else {
        all.insert(
            SERVICE_ACCOUNT_LABEL.to_string(),
            pod.service_account.clone(),
        );
    }
    all.insert(CLUSTER_LABEL.to_string(), cluster_name.to_string());
    all.into_iter()
        .filter(|(k, _)| filter.keeps("k8s", k))
        .map(|(k, v)| (format!("k8s:{k}"), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_pod_gets_its_namespace_service_account_and_cluster() {
        let pod = PodFacts {
            namespace: "shop".into(),
            name: "web-1".into(),
            labels: map(&[
                ("app", "web"),
                ("pod-template-hash", "abc"),
                ("io.cilium.k8s.policy.cluster", "spoofed"),
                ("io.cilium.k8s.namespace.labels.team", "spoofed"),
            ]),
            service_account: "default".into(),
            host_network: false,
        };
        let filter = LabelFilter::cilium_1_18(&[]).expect("filter");
        let ns = map(&[("kubernetes.io/metadata.name", "shop"), ("team", "a")]);
        let got = operator_labels(&pod, &ns, "east", &filter);
        assert_eq!(
            got,
            map(&[
                ("k8s:app", "web"),
                (
                    "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name",
                    "shop"
                ),
                ("k8s:io.cilium.k8s.namespace.labels.team", "a"),
                ("k8s:io.cilium.k8s.policy.cluster", "east"),
                ("k8s:io.cilium.k8s.policy.serviceaccount", "default"),
                ("k8s:io.kubernetes.pod.namespace", "shop"),
            ])
        );
    }

    #[test]
    fn no_service_account_no_label_and_an_allow_list_drops_the_rest() {
        let pod = PodFacts {
            namespace: "shop".into(),
            name: "web-1".into(),
            labels: map(&[("app", "web"), ("tier", "front")]),
            service_account: String::new(),
            host_network: false,
        };
        let filter = LabelFilter::cilium_1_18(&["k8s:app".into()]).expect("filter");
        let got = operator_labels(&pod, &BTreeMap::new(), "default", &filter);
        assert_eq!(
            got,
            map(&[
                ("k8s:app", "web"),
                ("k8s:io.cilium.k8s.policy.cluster", "default"),
                ("k8s:io.kubernetes.pod.namespace", "shop"),
            ])
        );
    }
}
