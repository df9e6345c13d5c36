//! Preflight: can this tool read the kvstore, reach the API server, find (or create) the
//! CRD, and do what the shipped ClusterRole grants? Each failure says how to fix it.

use crate::core::identity::CRD_NAME;
use crate::core::range::{ClusterScope, IdRange, MaxConnectedClusters};
use crate::io::k8s::K8sTarget;
use crate::io::kv_source::KvSource;

/// How a check came out. `Fail` is for what blocks a commit; a finding the plan already
/// handles (entries planned as invalid and never written) is a `Warn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
}

/// One preflight check, worded for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    /// How to fix it, when it failed, or what the warning means.
    pub fix: Option<String>,
}

impl Check {
    pub fn failed(&self) -> bool {
        self.status == CheckStatus::Fail
    }
}

#[derive(Debug, Clone, Default)]
pub struct PreflightReport {
    pub etcd: String,
    pub server: String,
    pub context: String,
    pub version: String,
    pub crd_present: bool,
    pub cluster_id: u32,
    pub max_connected_clusters: MaxConnectedClusters,
    pub range: Option<IdRange>,
    pub checks: Vec<Check>,
}

/// `(verb, group, resource)` for every rule of `assets/clusterrole.yaml`.
pub fn required_rules() -> Vec<(String, String, String)> {
    rules_of(crate::core::identity::CLUSTER_ROLE_YAML)
}

/// `(verb, group, resource)` for every rule of `assets/clusterrole-rollback.yaml`.
pub fn rollback_rules() -> Vec<(String, String, String)> {
    rules_of(crate::core::identity::ROLLBACK_ROLE_YAML)
}

fn rules_of(yaml: &str) -> Vec<(String, String, String)> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Rule {
        api_groups: Vec<String>,
        resources: Vec<String>,
        verbs: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    struct Role {
        rules: Vec<Rule>,
    }
    // The file's first document is the ClusterRole; what follows (sync's lease Role) is
    // namespaced and checked where it is used.
    let first = yaml.split("\n---\n").next().unwrap_or(yaml);
    let role: Role = match serde_yaml_ng::from_str(first) {
        Ok(r) => r,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for rule in role.rules {
        for group in &rule.api_groups {
            for resource in &rule.resources {
                for verb in &rule.verbs {
                    out.push((verb.clone(), group.clone(), resource.clone()));
                }
            }
        }
    }
    out
}

/// Whether the kvstore's ids fit this cluster's range: ids outside it usually mean a wrong
/// `--cluster-id` or `--max-connected-clusters` (they are never written either way).
fn range_check(masters: &[crate::core::kvstore::MasterEntry], scope: ClusterScope) -> Check {
    let ids: Vec<u32> = masters
        .iter()
        .filter_map(|m| crate::core::kvstore::parse_id(&m.id).ok())
        .collect();
    let outside = ids.iter().filter(|&&id| !scope.range.contains(id)).count();
    Check {
        name: "identities in range".into(),
        // Never written either way: the plan marks them invalid, nothing is blocked.
        status: if outside == 0 {
            CheckStatus::Ok
        } else {
            CheckStatus::Warn
        },
        detail: {
            // Keys whose id is no number at all are not counted here: the plan lists them
            // as invalid with the rest.
            let not_numbers = masters.len() - ids.len();
            format!(
                "{outside} of the {} numeric kvstore ids outside {scope}{}",
                ids.len(),
                match not_numbers {
                    0 => String::new(),
                    n => format!(" ({n} more keys have no numeric id)"),
                }
            )
        },
        fix: (outside > 0).then(|| {
            "they are planned as invalid and never written; if this cluster has another ID, or the mesh was installed with max-connected-clusters 511, pass --cluster-id and --max-connected-clusters to match the agents' settings".into()
        }),
    }
}

/// Checks both ends, the CRD and RBAC. Reads only.
pub async fn run(kv: &KvSource, target: &K8sTarget, scope: ClusterScope) -> PreflightReport {
    let range = scope.range;
    let mut r = PreflightReport {
        server: target.server.clone(),
        context: target.context.clone().unwrap_or_else(|| "-".into()),
        cluster_id: scope.cluster_id,
        max_connected_clusters: scope.max_connected_clusters,
        range: Some(range),
        ..Default::default()
    };
    r.etcd = kv.endpoints().join(",");
    match kv.read_masters().await {
        Ok(s) => {
            r.checks.push(Check {
                name: "kvstore readable".into(),
                status: CheckStatus::Ok,
                detail: format!("{} identities at revision {} under {}", s.masters.len(), s.source.revision, s.source.prefix),
                fix: None,
            });
            r.checks.push(range_check(&s.masters, scope));
        }
        Err(e) => r.checks.push(Check {
            name: "kvstore readable".into(),
            status: CheckStatus::Fail,
            detail: e.to_string(),
            fix: Some("check --etcd-endpoints / --etcd-config, the CA and client certificate, and that etcd is up".into()),
        }),
    }
    match target.server_version().await {
        Ok(v) => {
            r.version = v.clone();
            r.checks.push(Check {
                name: "API server reachable".into(),
                status: CheckStatus::Ok,
                detail: v,
                fix: None,
            });
        }
        Err(e) => {
            r.checks.push(Check {
                name: "API server reachable".into(),
                status: CheckStatus::Fail,
                detail: e.to_string(),
                fix: Some("check --kubeconfig / --context and that the API server is up".into()),
            });
            return r;
        }
    }
    match target.crd_state().await {
        Ok(state) => {
            r.crd_present = state != crate::io::k8s::CrdState::Missing;
            r.checks.push(Check {
                name: format!("CRD {CRD_NAME}"),
                status: CheckStatus::Ok,
                detail: if r.crd_present {
                    "installed".into()
                } else {
                    "missing: commit creates it first".into()
                },
                fix: None,
            });
        }
        Err(e) => r.checks.push(Check {
            name: format!("CRD {CRD_NAME}"),
            status: CheckStatus::Fail,
            detail: e.to_string(),
            fix: None,
        }),
    }
    // Exactly the rules of the ClusterRole we ship; the CRD rule only while the CRD is missing.
    let wanted: Vec<(String, String, String)> = required_rules()
        .into_iter()
        .filter(|(_, _, resource)| resource != "selfsubjectaccessreviews")
        .filter(|(_, _, resource)| !(r.crd_present && resource == "customresourcedefinitions"))
        .collect();
    r.checks
        .extend(rbac_checks(target, wanted, "assets/clusterrole.yaml").await);
    r.checks.push(Check {
        name: "Cilium versions".into(),
        status: CheckStatus::Ok,
        detail: crate::core::identity::TESTED_WITH.into(),
        fix: None,
    });
    r
}

/// One SelfSubjectAccessReview per rule; each denial names the role file that grants it.
async fn rbac_checks(
    target: &K8sTarget,
    rules: Vec<(String, String, String)>,
    role_file: &str,
) -> Vec<Check> {
    let mut checks = Vec::new();
    for (verb, group, resource) in rules {
        let name = format!("RBAC: {verb} {resource}.{group}");
        checks.push(match target.can_i(&verb, &group, &resource).await {
            Ok(true) => Check {
                name,
                status: CheckStatus::Ok,
                detail: "allowed".into(),
                fix: None,
            },
            Ok(false) => Check {
                name,
                status: CheckStatus::Fail,
                detail: "denied".into(),
                fix: Some(format!(
                    "bind the ClusterRole in {role_file} (it grants {verb} on {resource}.{group})"
                )),
            },
            Err(e) => Check {
                name,
                status: CheckStatus::Fail,
                detail: e.to_string(),
                fix: None,
            },
        });
    }
    checks
}

/// With `--reserve-in-kvstore`: whether these etcd credentials may write under the
/// identities prefix (a key of the tool's own, written and deleted at once; none of the
/// cluster's is touched).
pub async fn reservation_check(kv: &KvSource) -> Check {
    let name = "kvstore writable (--reserve-in-kvstore)".to_string();
    let prefix = kv.prefix();
    let result = match kv.follower().await {
        Ok(f) => f.reserver().probe_write(&prefix).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Check {
            name,
            status: CheckStatus::Ok,
            detail: format!("may write under {prefix}/ (checked with a key of the tool's own)"),
            fix: None,
        },
        Err(e) => Check {
            name,
            status: CheckStatus::Fail,
            detail: e.to_string(),
            fix: Some(format!(
                "grant the etcd user's role readwrite on the prefix: etcdctl role grant-permission ROLE --prefix=true readwrite {prefix}/ (or start without --reserve-in-kvstore)"
            )),
        },
    }
}

/// Refuses, naming every missing rule and the role that grants it, unless the rollback role's
/// rules are all allowed.
pub async fn require_rollback_rights(target: &K8sTarget) -> crate::Result<()> {
    let denied: Vec<String> = rollback_checks(target)
        .await
        .into_iter()
        .filter(Check::failed)
        .map(|c| {
            let fix = c.fix.map(|f| format!("; {f}")).unwrap_or_default();
            format!("  {}: {}{fix}", c.name, c.detail)
        })
        .collect();
    if denied.is_empty() {
        return Ok(());
    }
    Err(crate::Error::Refused(format!(
        "rollback is not allowed here, nothing was deleted:\n{}",
        denied.join("\n")
    )))
}

/// What a rollback needs, and only a rollback: the rules of the rollback role.
pub async fn rollback_checks(target: &K8sTarget) -> Vec<Check> {
    let rules = rollback_rules()
        .into_iter()
        .filter(|(_, _, resource)| resource != "selfsubjectaccessreviews")
        .collect();
    rbac_checks(target, rules, "assets/clusterrole-rollback.yaml").await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::kvstore::MasterEntry;

    #[test]
    fn ids_outside_the_range_warn_since_the_plan_never_writes_them() {
        let scope = ClusterScope::new(0, MaxConnectedClusters::default()).unwrap();
        let entry = |id: &str| MasterEntry::new(id.as_bytes().to_vec(), b"k8s:app=a;".to_vec());
        let inside = range_check(&[entry("300"), entry("301")], scope);
        assert_eq!(inside.status, CheckStatus::Ok);
        let outside = range_check(
            &[entry("300"), entry("70000"), entry("5"), entry("x1")],
            scope,
        );
        assert_eq!(outside.status, CheckStatus::Warn);
        assert!(!outside.failed());
        assert!(
            outside.detail.starts_with("2 of the 3 numeric kvstore ids")
                && outside.detail.ends_with("(1 more keys have no numeric id)"),
            "{}",
            outside.detail
        );
        assert!(outside.fix.unwrap().contains("never written"));
    }

    #[test]
    fn the_shipped_cluster_role_grants_exactly_what_the_tool_uses() {
        let rules = super::required_rules();
        let has =
            |v: &str, g: &str, r: &str| rules.iter().any(|x| x == &(v.into(), g.into(), r.into()));
        for verb in ["list", "get", "create", "watch"] {
            assert!(has(verb, "cilium.io", "ciliumidentities"), "{verb}");
        }
        assert!(has(
            "create",
            "apiextensions.k8s.io",
            "customresourcedefinitions"
        ));
        assert!(has(
            "get",
            "apiextensions.k8s.io",
            "customresourcedefinitions"
        ));
        assert!(has(
            "create",
            "authorization.k8s.io",
            "selfsubjectaccessreviews"
        ));
        for never in ["update", "patch", "delete", "deletecollection", "*"] {
            assert!(
                !rules.iter().any(|(v, _, _)| v == never),
                "the role must not grant {never}"
            );
        }
        assert_eq!(rules.len(), 7);
        // Rollback deletes what runs created, and creates again what switch-prepare
        // removed; it never rewrites an object.
        let rb = super::rollback_rules();
        for verb in ["delete", "create"] {
            assert!(rb.contains(&(verb.into(), "cilium.io".into(), "ciliumidentities".into())));
        }
        assert!(
            !rb.iter()
                .any(|(v, _, r)| r == "ciliumidentities" && (v == "update" || v == "patch"))
        );
    }
}
