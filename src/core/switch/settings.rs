//! What the operator's identity rules depend on in a cluster, read from Cilium's
//! `cilium-config` ConfigMap: the label patterns, the cluster name and id, a label prefix
//! file. Where the map is missing or says what this tool cannot read, the report says so
//! rather than guess silently.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core::range::MaxConnectedClusters;
use crate::core::switch::filter::{BadPattern, LabelFilter};

/// The settings the report computes with, and where each came from.
#[derive(Debug, Clone)]
pub struct Settings {
    pub filter: LabelFilter,
    pub cluster_name: String,
    pub cluster_id: u32,
    /// `max-connected-clusters` (255 unless the mesh was installed with 511): with the
    /// cluster id, the range the operator allocates from.
    pub max_connected_clusters: MaxConnectedClusters,
    /// Whether a `cilium-config` was read: when not, what the report cannot know and what
    /// it guessed each begin with that.
    config_read: bool,
    /// What the settings are, as the report shows them.
    pub shown: ShownSettings,
}

/// The settings as the report prints them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ShownSettings {
    /// `kube-system/cilium-config`, or why none was read.
    pub from: String,
    pub cluster_name: String,
    pub cluster_id: u32,
    /// Serialized as its number, 255 or 511.
    pub max_connected_clusters: MaxConnectedClusters,
    /// The operator's own label patterns (`labels`), after Cilium 1.18's defaults.
    pub labels: Vec<String>,
    pub identity_management_mode: Option<String>,
    /// What the report cannot know from the settings, each a sentence.
    pub cannot_know: Vec<String>,
    /// What was assumed because it could not be read, each with what settles it: nothing
    /// that decides ids or labels is written on such a guess (`switch-prepare --yes`).
    pub guessed: Vec<Guess>,
}

/// A setting that decides ids or labels, assumed because it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Guess {
    /// What was assumed, and why.
    pub what: String,
    /// What settles it.
    pub settle: String,
}

impl ShownSettings {
    /// Why `--cluster-id` or `--max-connected-clusters` (each counted as given when not its
    /// default) cannot stand beside what `cilium-config` says: the agents allocate in the
    /// range the ConfigMap sets, and an identity made in another is another cluster's.
    pub fn contradicted_by(&self, cluster_id: u32, mcc: MaxConnectedClusters) -> Option<String> {
        let mut said = Vec::new();
        if cluster_id != 0 && cluster_id != self.cluster_id {
            said.push(format!(
                "--cluster-id {cluster_id} contradicts {} (cluster-id {})",
                self.from, self.cluster_id
            ));
        }
        if mcc != MaxConnectedClusters::default() && mcc != self.max_connected_clusters {
            said.push(format!(
                "--max-connected-clusters {mcc} contradicts {} (max-connected-clusters {})",
                self.from, self.max_connected_clusters
            ));
        }
        (!said.is_empty()).then(|| {
            format!(
                "{}: the agents allocate in the range the ConfigMap sets; drop the flag, or fix the ConfigMap",
                said.join(", and ")
            )
        })
    }

    /// Why `--yes` writes nothing while something that decides ids or labels was guessed.
    pub fn refuse_guesses(&self) -> Option<String> {
        let listed: Vec<String> = self
            .guessed
            .iter()
            .map(|g| format!("{} ({})", g.what, g.settle))
            .collect();
        (!listed.is_empty()).then(|| {
            format!(
                "nothing is written on a guess: {}; or pass --assume-defaults to prepare with what the report assumed",
                listed.join("; ")
            )
        })
    }
}

/// What `cilium-config` says of the mesh, as Cilium's agents read it: the cluster id and
/// max-connected-clusters, absent or empty meaning 0 and 255.
pub struct Mesh {
    pub cluster_id: Result<u32, Refused>,
    pub max_connected_clusters: Result<MaxConnectedClusters, Refused>,
}

/// A value Cilium's agents refuse: what is written there, and why.
#[derive(Debug)]
pub struct Refused {
    pub value: String,
    pub why: String,
}

/// The mesh `cilium-config`'s `data` sets (see `Mesh`).
pub fn mesh_of(data: &BTreeMap<String, String>) -> Mesh {
    let get = |k: &str| data.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let refused = |v: &str, why: String| Refused {
        value: v.to_string(),
        why,
    };
    Mesh {
        cluster_id: get("cluster-id").map_or(Ok(0), |v| {
            v.parse::<u32>()
                .map_err(|_| refused(v, "not a number".into()))
        }),
        max_connected_clusters: get("max-connected-clusters")
            .map_or(Ok(MaxConnectedClusters::default()), |v| {
                v.parse::<MaxConnectedClusters>().map_err(|e| refused(v, e))
            }),
    }
}

/// What settles a `cilium-config` that could not be read.
const SETTLE_NAMESPACE: &str = "pass --cilium-namespace with the namespace Cilium runs in";

/// What the report says when no `cilium-config` was read (`why`, and `settle` in its
/// words), and the guess that stands for it.
fn not_read(why: String, settle: &str) -> (String, Guess) {
    let said = format!(
        "{why}: Cilium's defaults are assumed (cluster name `default`, id 0, the default label filter); {settle}"
    );
    let guess = Guess {
        what: why,
        settle: SETTLE_NAMESPACE.into(),
    };
    (said, guess)
}

/// Cilium's default cluster name.
pub const DEFAULT_CLUSTER_NAME: &str = "default";

impl Settings {
    /// Says that `cilium-config` was not found because its `namespace` does not exist (a
    /// mistyped `--cilium-namespace`), not as a ConfigMap missing from Cilium's namespace.
    pub fn namespace_missing(&mut self, namespace: &str) {
        if self.config_read {
            return;
        }
        let why = format!("namespace {namespace} does not exist, so no cilium-config was read");
        let (said, guess) = not_read(why, SETTLE_NAMESPACE);
        self.shown.cannot_know[0] = said;
        self.shown.guessed[0] = guess;
    }

    /// The settings of a cluster whose `cilium-config` reads `data` (`None`: not found, so
    /// Cilium's defaults). `from` names where it was read.
    pub fn from_config(
        from: &str,
        data: Option<&BTreeMap<String, String>>,
    ) -> Result<Settings, BadPattern> {
        let mut cannot_know = Vec::new();
        let mut guessed = Vec::new();
        let empty = BTreeMap::new();
        let data_read = data.is_some();
        let data = match data {
            Some(d) => d,
            None => {
                let (said, guess) = not_read(
                    format!("{from} was not found"),
                    "pass --cilium-namespace where Cilium runs elsewhere",
                );
                cannot_know.push(said);
                guessed.push(guess);
                &empty
            }
        };
        let get = |k: &str| data.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        // Viper reads a list option from a ConfigMap string split on white space.
        let labels: Vec<String> = get("labels")
            .map(|v| v.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        if let Some(file) = get("label-prefix-file") {
            cannot_know.push(format!(
                "label-prefix-file is set ({file}): the operator reads its patterns from a file inside its pod instead of Cilium's defaults; this report uses the defaults, so check the outcomes of labels that file names"
            ));
            guessed.push(Guess {
                what: format!(
                    "label-prefix-file {file} (read inside the operator's pod) decides the labels"
                ),
                settle:
                    "check the outcomes of the labels that file names, then pass --assume-defaults"
                        .into(),
            });
        }
        let cluster_name = get("cluster-name")
            .unwrap_or(DEFAULT_CLUSTER_NAME)
            .to_string();
        let mesh = mesh_of(data);
        let cluster_id = match mesh.cluster_id {
            Ok(id) => id,
            Err(Refused { value: v, .. }) => {
                cannot_know.push(format!(
                    "cluster-id is {v:?}, not a number: id 0 is assumed"
                ));
                guessed.push(Guess {
                    what: format!("cluster-id {v:?} in cilium-config is not a number"),
                    settle: "fix cluster-id in cilium-config (Cilium's agents refuse it too)"
                        .into(),
                });
                0
            }
        };
        let max_connected_clusters = match mesh.max_connected_clusters {
            Ok(m) => m,
            Err(Refused { value: v, why: e }) => {
                cannot_know.push(format!(
                    "max-connected-clusters is {v:?} ({e}): 255 is assumed"
                ));
                guessed.push(Guess {
                    what: format!("max-connected-clusters {v:?} in cilium-config is not 255 or 511"),
                    settle: "fix max-connected-clusters in cilium-config (Cilium's agents refuse it too)".into(),
                });
                MaxConnectedClusters::default()
            }
        };
        let filter = LabelFilter::cilium_1_18(&labels)?;
        for p in filter.patterns_matching_nothing() {
            let meant = p
                .strip_prefix('!')
                .and_then(|rest| rest.split_once(':'))
                .map(|(src, prefix)| format!("{src}:!{prefix}"))
                .unwrap_or_default();
            cannot_know.push(format!(
                "label pattern {p:?} matches no label (Cilium reads `{}` as its source), yet it makes the filter an allow list; `{meant}` is the ignore it looks meant to be",
                p.split(':').next().unwrap_or_default()
            ));
        }
        Ok(Settings {
            filter,
            cluster_name: cluster_name.clone(),
            cluster_id,
            max_connected_clusters,
            config_read: data_read,
            shown: ShownSettings {
                from: from.to_string(),
                cluster_name,
                cluster_id,
                max_connected_clusters,
                labels,
                identity_management_mode: get("identity-management-mode").map(str::to_string),
                cannot_know,
                guessed,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_config_names_the_cluster_and_the_patterns() {
        let d = data(&[
            ("cluster-name", "east"),
            ("cluster-id", "7"),
            ("labels", " k8s:app  k8s:!tier "),
            ("identity-management-mode", "agent"),
        ]);
        let s = Settings::from_config("kube-system/cilium-config", Some(&d)).expect("settings");
        assert_eq!(s.cluster_name, "east");
        assert_eq!(s.cluster_id, 7);
        assert_eq!(s.shown.labels, vec!["k8s:app", "k8s:!tier"]);
        assert!(s.filter.is_allow_list());
        assert!(s.shown.cannot_know.is_empty(), "{:?}", s.shown.cannot_know);
    }

    #[test]
    fn what_cannot_be_known_is_said() {
        let mut s = Settings::from_config("kube-system/cilium-config", None).expect("settings");
        assert_eq!(s.cluster_name, "default");
        assert!(s.shown.cannot_know[0].contains("was not found"));
        // A namespace that does not exist is said as one, not as a ConfigMap missing.
        s.namespace_missing("kube-sytem");
        assert_eq!(s.shown.cannot_know.len(), 1);
        assert!(
            s.shown.cannot_know[0].starts_with("namespace kube-sytem does not exist"),
            "{:?}",
            s.shown.cannot_know
        );
        let d = data(&[
            ("label-prefix-file", "/etc/cilium/prefixes.json"),
            ("cluster-id", "x"),
            ("labels", "!k8s:tier"),
        ]);
        let s = Settings::from_config("kube-system/cilium-config", Some(&d)).expect("settings");
        let all = s.shown.cannot_know.join("\n");
        assert!(all.contains("label-prefix-file"), "{all}");
        assert!(all.contains("cluster-id is \"x\""), "{all}");
        assert!(all.contains("`k8s:!tier`"), "{all}");
    }

    #[test]
    fn a_pattern_cilium_cannot_compile_is_an_error() {
        let d = data(&[("labels", "k8s:(")]);
        assert!(Settings::from_config("x", Some(&d)).is_err());
    }

    #[test]
    fn a_mesh_cluster_has_its_own_layout_and_what_is_guessed_is_named_with_what_settles_it() {
        let d = data(&[("cluster-id", "3"), ("max-connected-clusters", "511")]);
        let s = Settings::from_config("kube-system/cilium-config", Some(&d)).expect("settings");
        assert_eq!(
            (s.cluster_id, s.max_connected_clusters),
            (3, MaxConnectedClusters::C511)
        );
        assert!(s.shown.guessed.is_empty());
        let s = Settings::from_config("kube-system/cilium-config", None).expect("settings");
        assert!(s.shown.guessed[0].settle.contains("--cilium-namespace"));
        let d = data(&[
            ("cluster-id", "five"),
            ("max-connected-clusters", "300"),
            ("label-prefix-file", "/p.json"),
        ]);
        let s = Settings::from_config("kube-system/cilium-config", Some(&d)).expect("settings");
        let what: Vec<&str> = s.shown.guessed.iter().map(|g| g.what.as_str()).collect();
        assert_eq!(what.len(), 3, "{what:?}");
        assert!(
            what.iter().any(|w| w.contains("label-prefix-file")),
            "{what:?}"
        );
        assert!(
            what.iter().any(|w| w.contains("cluster-id \"five\"")),
            "{what:?}"
        );
        assert!(
            what.iter()
                .any(|w| w.contains("max-connected-clusters \"300\"")),
            "{what:?}"
        );
    }

    #[test]
    fn a_flag_that_contradicts_the_config_is_named_beside_it() {
        let d = data(&[("cluster-id", "3"), ("max-connected-clusters", "511")]);
        let s = Settings::from_config("kube-system/cilium-config", Some(&d)).expect("settings");
        assert_eq!(s.shown.contradicted_by(0, MaxConnectedClusters::C255), None);
        assert_eq!(s.shown.contradicted_by(3, MaxConnectedClusters::C511), None);
        let why = s
            .shown
            .contradicted_by(5, MaxConnectedClusters::C255)
            .expect("refused");
        assert!(
            why.starts_with("--cluster-id 5 contradicts kube-system/cilium-config (cluster-id 3)"),
            "{why}"
        );
        let d = data(&[("cluster-id", "3")]);
        let s = Settings::from_config("kube-system/cilium-config", Some(&d)).expect("settings");
        let why = s
            .shown
            .contradicted_by(3, MaxConnectedClusters::C511)
            .expect("refused");
        assert!(why.contains("(max-connected-clusters 255)"), "{why}");
        assert!(s.shown.refuse_guesses().is_none());
        let s = Settings::from_config("x/cilium-config", None).expect("settings");
        let why = s.shown.refuse_guesses().expect("refused");
        assert!(
            why.contains("--cilium-namespace") && why.contains("--assume-defaults"),
            "{why}"
        );
    }
}
