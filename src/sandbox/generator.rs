//! Generates Cilium-shaped identity datasets (for the demo, tests and benchmarks), with a
//! chosen share of every conflict kind and of malformed entries, and loads them into etcd.

use std::collections::HashMap;

use super::Rng;
use crate::core::kvstore::MasterEntry;
use crate::core::labels::{Label, SecurityLabels, encode_label_key, to_security_labels};
use crate::core::range::IdRange;
use crate::error::{Error, Result};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub identities: usize,
    pub nodes: u32,
    pub seed: u64,
    pub cluster_id: u32,
    /// Shares (0..1) of identities that are already migrated, need a remap, a reuse, are
    /// duplicates, and are malformed.
    pub migrated: f64,
    pub remap: f64,
    pub reuse: f64,
    pub duplicate: f64,
    pub invalid: f64,
    /// Every valid identity is used by exactly `nodes` nodes (otherwise 0 to `nodes`).
    pub every_node: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            identities: 2000,
            nodes: 10,
            seed: 42,
            cluster_id: 0,
            migrated: 0.05,
            remap: 0.05,
            reuse: 0.05,
            duplicate: 0.05,
            invalid: 0.05,
            every_node: false,
        }
    }
}

/// A generated cluster: the kvstore side and what Kubernetes already holds.
#[derive(Debug, Clone, Default)]
pub struct Generated {
    pub masters: Vec<MasterEntry>,
    /// Nodes using each label key (the `value/` keys a real cluster would have).
    pub node_counts: HashMap<Vec<u8>, u32>,
    pub k8s: Vec<(u32, SecurityLabels)>,
}

impl Generated {
    /// The kvstore keys of this cluster under `prefix`: each identity's master key, and for a
    /// label key used by `n` nodes, the `value/` keys of nodes `node_name(0)` to
    /// `node_name(n - 1)`. Identities that share a label key (duplicates) share its `value/`
    /// keys: a node's key for a label key names one id, the first.
    pub fn kvstore_keys(
        &self,
        prefix: &str,
        node_name: impl Fn(u32) -> String,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let prefix = crate::core::kvstore::normalize_prefix(prefix);
        let mut keys = Vec::new();
        let mut seen_label_keys = std::collections::HashSet::new();
        for m in &self.masters {
            let mut key = format!("{prefix}id/").into_bytes();
            key.extend_from_slice(&m.id);
            keys.push((key, m.value.clone()));
            let nodes = if seen_label_keys.insert(m.value.as_slice()) {
                self.node_counts.get(&m.value).copied().unwrap_or(0)
            } else {
                0
            };
            for node in 0..nodes {
                let mut key = format!("{prefix}value/").into_bytes();
                key.extend_from_slice(&m.value);
                key.push(b'/');
                key.extend_from_slice(node_name(node).as_bytes());
                keys.push((key, m.id.clone()));
            }
        }
        keys
    }
}

const NAMESPACES: &[&str] = &[
    "shop",
    "payments",
    "checkout",
    "search",
    "kube-system",
    "monitoring",
    "logging",
    "ingress-nginx",
    "cert-manager",
    "data",
    "ml-serving",
    "auth",
    "billing",
    "catalog",
    "frontend",
    "backend",
];
const APPS: &[&str] = &[
    "web",
    "api",
    "worker",
    "cache",
    "db",
    "queue",
    "gateway",
    "scheduler",
    "indexer",
    "exporter",
    "proxy",
    "cron",
    "notifier",
    "renderer",
    "uploader",
    "ledger",
];
const TIERS: &[&str] = &["frontend", "backend", "data", "ops"];

fn k8s(key: &str, value: &str) -> Label {
    Label {
        source: "k8s".into(),
        key: key.into(),
        value: value.into(),
    }
}

/// One realistic label set, unique per `n`.
fn label_set(rng: &mut Rng, n: usize) -> Vec<Label> {
    let ns = NAMESPACES[rng.below(NAMESPACES.len() as u64) as usize];
    let app = APPS[rng.below(APPS.len() as u64) as usize];
    let mut labels = vec![
        k8s("io.kubernetes.pod.namespace", ns),
        k8s("app", &format!("{app}-{n}")),
    ];
    let extra = rng.below(11); // 2..=12 labels in all
    let optional = [
        k8s("io.cilium.k8s.policy.serviceaccount", &format!("{app}-sa")),
        k8s("io.cilium.k8s.policy.cluster", "default"),
        k8s(
            "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name",
            ns,
        ),
        k8s(
            "io.cilium.k8s.namespace.labels.team",
            TIERS[n % TIERS.len()],
        ),
        k8s("version", &format!("v{}", 1 + rng.below(5))),
        k8s("app.kubernetes.io/name", app),
        k8s(
            "app.kubernetes.io/component",
            TIERS[rng.below(TIERS.len() as u64) as usize],
        ),
        k8s("app.kubernetes.io/part-of", ns),
        k8s("tier", TIERS[rng.below(TIERS.len() as u64) as usize]),
        k8s("io.cilium.k8s.namespace.labels.istio-injection", "enabled"),
        k8s(
            "security.example.com/compliance-zone-with-a-long-key-name",
            "pci-dss-level-1",
        ),
    ];
    labels.extend(optional.into_iter().take(extra as usize));
    labels
}

/// Malformed kvstore entries of every shape the planner must refuse.
fn malformed(rng: &mut Rng, n: usize, range: IdRange) -> MasterEntry {
    let good = format!("k8s:app=broken-{n};");
    match rng.below(10) {
        0 => MasterEntry::new(format!("x{n}"), good),
        1 => MasterEntry::new(format!("0{}", range.min + n as u32), good),
        2 => MasterEntry::new(format!("+{}", range.min + n as u32), good),
        3 => MasterEntry::new(format!("{}", 4_294_967_296u64 + n as u64), good),
        // Reserved ids below the range while they last, then ids above it.
        4 if n < 150 => MasterEntry::new(format!("{}", 100 + n), good),
        4 => MasterEntry::new(format!("{}", u64::from(range.max) + 1 + n as u64), good),
        5 => MasterEntry::new(format!("id{n}"), ""),
        6 => MasterEntry::new(format!("e{n}"), format!("k8s:app=x-{n}")),
        7 => MasterEntry::new(
            format!("u{n}"),
            vec![b'k', b'8', b's', b':', 0xff, b'=', b';'],
        ),
        8 => MasterEntry::new(format!("d{n}"), format!("k8s:app=a-{n};k8s:app=b;")),
        _ => MasterEntry::new(format!("o{n}"), format!("k8s:zeta=1-{n};k8s:alpha=2;")),
    }
}

/// Generates a dataset. Ids run up from the bottom of the range; Kubernetes-only ids are
/// taken from the top so they never collide with kvstore ones.
pub fn generate(cfg: &GenConfig) -> Result<Generated> {
    let range = IdRange::for_cluster(cfg.cluster_id).map_err(Error::Config)?;
    if cfg.identities as u64 > u64::from(range.len()) {
        return Err(Error::Config(format!(
            "{} identities do not fit in the range {range} ({} ids)",
            cfg.identities,
            range.len()
        )));
    }
    let mut rng = Rng::new(cfg.seed);
    let mut out = Generated::default();
    let mut top = range.max;
    let n_invalid = (cfg.identities as f64 * cfg.invalid) as usize;
    let valid = cfg.identities - n_invalid;
    // Earlier identities whose labels a reuse or a duplicate can share, so those kinds need
    // no extra ids and the whole range can be filled.
    let mut migrated_anchor: Option<Vec<Label>> = None;
    let mut create_anchor: Option<Vec<Label>> = None;
    for n in 0..valid {
        let id = range.min + n as u32;
        let mut labels = label_set(&mut rng, n);
        let squatter = to_security_labels(&[k8s("app", &format!("squatter-{n}"))]);
        let r = rng.next_f64();
        let (c_migrated, c_remap, c_reuse, c_dup) = (
            cfg.migrated,
            cfg.migrated + cfg.remap,
            cfg.migrated + cfg.remap + cfg.reuse,
            cfg.migrated + cfg.remap + cfg.reuse + cfg.duplicate,
        );
        if r < c_migrated {
            out.k8s.push((id, to_security_labels(&labels)));
            migrated_anchor = Some(labels.clone());
        } else if r < c_remap {
            out.k8s.push((id, squatter));
        } else if r < c_reuse {
            // Own id squatted; the labels already live at an earlier, migrated id.
            out.k8s.push((id, squatter));
            match &migrated_anchor {
                Some(a) => labels = a.clone(),
                None => {
                    out.k8s.push((top, to_security_labels(&labels)));
                    top -= 1;
                }
            }
        } else if r < c_dup {
            // Own id free; the labels also sit under an earlier kvstore id that will be created.
            match &create_anchor {
                Some(a) => labels = a.clone(),
                None => {
                    out.k8s.push((top, to_security_labels(&labels)));
                    top -= 1;
                }
            }
        } else {
            create_anchor = Some(labels.clone());
        }
        let key = encode_label_key(&labels);
        let nodes = if cfg.every_node {
            cfg.nodes
        } else if cfg.nodes == 0 {
            0
        } else {
            rng.below(u64::from(cfg.nodes) + 1) as u32
        };
        if nodes > 0 {
            out.node_counts.insert(key.clone().into_bytes(), nodes);
        }
        out.masters.push(MasterEntry::new(id.to_string(), key));
    }
    for n in 0..n_invalid {
        out.masters.push(malformed(&mut rng, n, range));
    }
    // kvstore ids are min..min+valid; Kubernetes-only ones top+1..=max.
    if u64::from(top) + 1 < u64::from(range.min) + valid as u64 {
        return Err(Error::Config(
            "too many identities for the conflict shares asked for".into(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::planner::{Kind, plan, summarize};
    use std::collections::BTreeMap;

    #[test]
    fn generates_every_kind_deterministically() {
        let cfg = GenConfig::default();
        let a = generate(&cfg).unwrap();
        let b = generate(&cfg).unwrap();
        assert_eq!(a.masters, b.masters);
        let k8s: BTreeMap<u32, String> = a
            .k8s
            .iter()
            .map(|(id, l)| (*id, crate::core::labels::canonical_key(l)))
            .collect();
        let items = plan(
            &a.masters,
            &a.node_counts,
            &k8s,
            IdRange::for_cluster(0).unwrap(),
        );
        let s = summarize(&items);
        for kind in Kind::ALL {
            assert!(s[&kind] > 20, "{kind}: {s:?}");
        }
        assert_eq!(items.len(), 2000);
        let ids: std::collections::BTreeSet<&[u8]> =
            a.masters.iter().map(|m| m.id.as_slice()).collect();
        assert_eq!(ids.len(), a.masters.len(), "kvstore keys are unique");
        for m in &a.masters[..100] {
            let n = crate::core::labels::parse_label_key_bytes(&m.value)
                .unwrap()
                .len();
            assert!((2..=12).contains(&n));
        }
    }
}
