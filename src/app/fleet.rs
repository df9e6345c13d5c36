//! `fleet`: where every cluster's migration stands, read from one place. Each cluster named
//! (contexts of kubeconfigs) is read side by side, each within its own timeout: Cilium's
//! version and modes, its identities, the standing its sync publishes, and what the switch
//! to operator-managed identities would do. A cluster that hangs or refuses is a row that
//! says so; it never holds the others up.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use kube::config::Kubeconfig;

use crate::core::fleet::row::{ClusterFacts, ClusterRow, SwitchSeen, SyncSeen};
use crate::core::fleet::{Standing, status_name};
use crate::error::{Error, Result};
use crate::io::k8s::{K8sOptions, K8sTarget};

/// Clusters read at once (each a handful of requests).
const AT_ONCE: usize = 64;

/// What `fleet` reads in each cluster, and how long it waits for one.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Where Cilium runs: its `cilium-config` and its DaemonSet.
    pub cilium_namespace: String,
    /// Where sync's Lease (and so its standing) is, and the Lease's name.
    pub lease_namespace: String,
    pub lease_name: String,
    /// How long one cluster may take; past it, its row says so.
    pub timeout: Duration,
    /// Also read what the switch to operator-managed identities would do (every pod).
    pub switch: bool,
}

/// One cluster to read: a context of a kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRef {
    /// What its row is called: the context's name.
    pub name: String,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// The clusters named: each `context` (of the kubeconfig files given, else of KUBECONFIG or
/// ~/.kube/config), every context with `all`, else each file's current context.
pub fn clusters(
    kubeconfigs: &[PathBuf],
    contexts: &[String],
    all: bool,
) -> Result<Vec<ClusterRef>> {
    let files: Vec<(Option<PathBuf>, Kubeconfig)> = if kubeconfigs.is_empty() {
        let kc = Kubeconfig::read().map_err(|e| {
            Error::Config(format!(
                "no kubeconfig to read the fleet from ({e}): pass --kubeconfig FILE (repeatable) or set KUBECONFIG"
            ))
        })?;
        vec![(None, kc)]
    } else {
        kubeconfigs
            .iter()
            .map(|p| {
                Kubeconfig::read_from(p)
                    .map(|kc| (Some(p.clone()), kc))
                    .map_err(|e| Error::kubeconfig(Some(&p.display().to_string()), e, ""))
            })
            .collect::<Result<_>>()?
    };
    let mut out = Vec::new();
    for (path, kc) in &files {
        let names: Vec<String> = kc.contexts.iter().map(|c| c.name.clone()).collect();
        let wanted: Vec<String> = match (contexts.is_empty(), all) {
            (_, true) => names.clone(),
            (false, false) => contexts
                .iter()
                .filter(|c| names.contains(c))
                .cloned()
                .collect(),
            (true, false) => kc.current_context.iter().cloned().collect(),
        };
        out.extend(wanted.into_iter().map(|name| ClusterRef {
            kubeconfig: path.clone(),
            context: Some(name.clone()),
            name,
        }));
    }
    // One name per row: a context name found in two files is told apart by its file.
    let names: Vec<String> = out.iter().map(|c| c.name.clone()).collect();
    for c in &mut out {
        if names.iter().filter(|n| **n == c.name).count() > 1
            && let Some(path) = &c.kubeconfig
        {
            c.name = format!("{}:{}", path.display(), c.name);
        }
    }
    let missing: Vec<&String> = contexts
        .iter()
        .filter(|c| !out.iter().any(|r| r.context.as_ref() == Some(*c)))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Config(format!(
            "no context {} in the kubeconfig(s) read: check the names (kubectl config get-contexts), or pass --kubeconfig with the file that has them",
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if out.is_empty() {
        return Err(Error::Config(
            "no cluster to read: the kubeconfig has no current context; pass --context NAME or --all-contexts".into(),
        ));
    }
    Ok(out)
}

/// Every cluster read, side by side, in the order named.
pub async fn read_fleet(clusters: &[ClusterRef], opts: &FleetOptions) -> Vec<ClusterRow> {
    futures::stream::iter(clusters)
        .map(|c| read_cluster(c, opts))
        .buffered(AT_ONCE)
        .collect()
        .await
}

/// One cluster, within the timeout.
pub async fn read_cluster(c: &ClusterRef, opts: &FleetOptions) -> ClusterRow {
    let k8s = K8sOptions {
        kubeconfig: c.kubeconfig.clone(),
        context: c.context.clone(),
    };
    let target = match K8sTarget::connect(&k8s).await {
        Ok(t) => t,
        Err(e) => return ClusterRow::unread(c.name.clone(), String::new(), e.to_string()),
    };
    let server = target.server.clone();
    let within = |what: &'static str| {
        let secs = opts.timeout.as_secs_f64();
        move |_| format!("no answer within {secs}s ({what})")
    };
    let facts = tokio::time::timeout(opts.timeout, facts(&target, opts));
    let switch = async {
        if !opts.switch {
            return None;
        }
        let read = tokio::time::timeout(
            opts.timeout,
            crate::app::switch::read_report(&target, &opts.cilium_namespace),
        )
        .await
        .map_err(within("the switch report"));
        Some(match read {
            Ok(Ok(r)) => SwitchSeen {
                safe: r.is_safe(),
                draws: r.counts.label_sets_drawn,
                duplicates: r.counts.duplicate,
                error: None,
            },
            Ok(Err(e)) => switch_error(e.to_string()),
            Err(e) => switch_error(e),
        })
    };
    let (facts, switch) = tokio::join!(facts, switch);
    match facts.map_err(within("reading the cluster")) {
        Ok(Ok(mut f)) => {
            f.switch = switch;
            ClusterRow::read(c.name.clone(), server, f)
        }
        Ok(Err(e)) => ClusterRow::unread(c.name.clone(), server, e.to_string()),
        Err(e) => ClusterRow::unread(c.name.clone(), server, e),
    }
}

fn switch_error(error: String) -> SwitchSeen {
    SwitchSeen {
        safe: false,
        draws: 0,
        duplicates: 0,
        error: Some(error),
    }
}

/// What one cluster says of itself, its reads side by side.
async fn facts(target: &K8sTarget, opts: &FleetOptions) -> Result<ClusterFacts> {
    let kube = |what: &'static str| {
        let server = target.server.clone();
        move |e| Error::kube(server, what, e)
    };
    let status = status_name(&opts.lease_name);
    let (config, version, identities, standing) = tokio::try_join!(
        async {
            target
                .config_map_data(&opts.cilium_namespace, crate::app::switch::CILIUM_CONFIG)
                .await
                .map_err(kube("reading cilium-config"))
        },
        async {
            target
                .cilium_version(&opts.cilium_namespace)
                .await
                .map_err(kube("reading Cilium's DaemonSet"))
        },
        async {
            target
                .identity_count()
                .await
                .map_err(kube("counting CiliumIdentities"))
        },
        async {
            target
                .config_map_data(&opts.lease_namespace, &status)
                .await
                .map_err(kube("reading sync's standing"))
        },
    )?;
    let mode = |k: &str| config.as_ref().and_then(|c| c.get(k)).cloned();
    let sync = match standing {
        None => None,
        Some(data) => {
            let standing = Standing::from_data(&data).map_err(|why| {
                Error::Config(format!(
                    "{}/{status} is not a standing this tool wrote: {why}",
                    opts.lease_namespace
                ))
            })?;
            let age_s = age_of(&standing.updated);
            Some(SyncSeen { standing, age_s })
        }
    };
    Ok(ClusterFacts {
        cilium_version: version,
        identity_allocation_mode: mode("identity-allocation-mode"),
        identity_management_mode: mode("identity-management-mode"),
        identities,
        sync,
        switch: None,
    })
}

/// Seconds since `updated` (RFC 3339), if it reads as a time.
fn age_of(updated: &str) -> Option<i64> {
    let t: jiff::Timestamp = updated.parse().ok()?;
    Some(jiff::Timestamp::now().as_second() - t.as_second())
}

/// The fleet as a table: one row per cluster, then the counts.
pub fn text(rows: &[ClusterRow]) -> String {
    let mut out = format!(
        "{:<20} {:<10} {:<15} {:>10} {:<22} {:>6}  {}\n",
        "CLUSTER", "CILIUM", "MODES", "IDENTITIES", "SYNC", "AGE", "NEXT"
    );
    for r in rows {
        let f = r.facts.clone().unwrap_or_default();
        let modes = match (&r.facts, &f.identity_allocation_mode) {
            (None, _) => "-".to_string(),
            (_, alloc) => format!(
                "{}/{}",
                alloc.as_deref().unwrap_or("?"),
                f.identity_management_mode.as_deref().unwrap_or("agent")
            ),
        };
        let (sync, age) = match &f.sync {
            Some(s) => (
                s.standing.phase.as_str().to_string(),
                s.age_s.map_or("?".into(), |a| format!("{a}s")),
            ),
            None if r.facts.is_some() => ("none".into(), "-".into()),
            None => ("-".into(), "-".into()),
        };
        out.push_str(&format!(
            "{:<20} {:<10} {:<15} {:>10} {:<22} {:>6}  {}\n",
            r.cluster,
            f.cilium_version.as_deref().unwrap_or("-"),
            modes,
            f.identities.map_or("-".into(), |n| n.to_string()),
            sync,
            age,
            r.attention.as_deref().unwrap_or("nothing: cutover reached")
        ));
    }
    let reached = rows.iter().filter(|r| r.reached_cutover()).count();
    let attention = rows.iter().filter(|r| r.attention.is_some()).count();
    out.push_str(&format!(
        "{}: {reached} reached cutover, {attention} need attention\n",
        crate::core::words::count(rows.len(), "cluster")
    ));
    out
}
