//! `fleet`: where every cluster's migration stands, read from one place. Each cluster named
//! (contexts of kubeconfigs) is read side by side, each within its own timeout: Cilium's
//! version and modes, its identities, the standing its sync publishes, and what the switch
//! to operator-managed identities would do. A cluster that hangs or refuses is a row that
//! says so; it never holds the others up.

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use kube::config::Kubeconfig;

use tokio::sync::mpsc;

use crate::core::fleet::row::{Cells, ClusterFacts, ClusterRow, KvstoreSeen, SwitchSeen, SyncSeen};
use crate::core::fleet::{Standing, status_name};
use crate::core::range::ClusterScope;
use crate::error::{Error, Result};
use crate::io::etcd::{EtcdConnection, EtcdOptions};
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

/// One cluster to read: a context of a kubeconfig, and its kvstore where one was named.
#[derive(Debug, Clone)]
pub struct ClusterRef {
    /// What its row is called: the context's name.
    pub name: String,
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Its Cilium kvstore (`--etcd-config-for CONTEXT=FILE`): counted by `fleet`, scanned
    /// by the TUI's screens of the cluster.
    pub etcd: Option<EtcdOptions>,
}

/// Gives each cluster named in `kvstores` (its row's name or its context, then its etcd)
/// its kvstore. A name no cluster has is refused, as a typo would otherwise count nothing
/// silently; so is a context two kubeconfigs share (its rows are named `FILE:CONTEXT`).
pub fn with_kvstores(
    clusters: &mut [ClusterRef],
    kvstores: Vec<(String, EtcdOptions)>,
) -> Result<()> {
    for (name, etcd) in kvstores {
        let by_name = clusters.iter().position(|c| c.name == name);
        let by_context: Vec<usize> = (0..clusters.len())
            .filter(|&i| clusters[i].context.as_deref() == Some(name.as_str()))
            .collect();
        let at = match (by_name, by_context.as_slice()) {
            (Some(i), _) => i,
            (None, [i]) => *i,
            (None, []) => {
                return Err(Error::Config(format!(
                    "--etcd-config-for names context {name}, which is not among the clusters read: name one of {}",
                    clusters
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            (None, _) => {
                return Err(Error::Config(format!(
                    "--etcd-config-for names context {name}, which several kubeconfigs have: name the cluster as its row is named (FILE:CONTEXT)"
                )));
            }
        };
        clusters[at].etcd = Some(etcd);
    }
    Ok(())
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
            etcd: None,
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
    let kvstore = async {
        let etcd = c.etcd.as_ref()?;
        let read = tokio::time::timeout(opts.timeout, count_kvstore(etcd))
            .await
            .map_err(within("the kvstore"));
        Some(match read {
            Ok(Ok(n)) => KvstoreSeen {
                identities: Some(n),
                error: None,
            },
            Ok(Err(e)) => KvstoreSeen {
                identities: None,
                error: Some(e.to_string()),
            },
            Err(e) => KvstoreSeen {
                identities: None,
                error: Some(e),
            },
        })
    };
    let (facts, switch, kvstore) = tokio::join!(facts, switch, kvstore);
    match facts.map_err(within("reading the cluster")) {
        Ok(Ok(mut f)) => {
            f.switch = switch;
            f.kvstore = kvstore;
            ClusterRow::read(c.name.clone(), server, f)
        }
        Ok(Err(e)) => ClusterRow::unread(c.name.clone(), server, e.to_string()),
        Err(e) => ClusterRow::unread(c.name.clone(), server, e),
    }
}

/// The identities (`id/` keys) the cluster's kvstore holds: one count-only request.
async fn count_kvstore(etcd: &EtcdOptions) -> Result<usize> {
    EtcdConnection::connect(etcd)
        .await?
        .count_identities(&etcd.prefix)
        .await
}

/// Clusters read again on request, each row sent as its cluster answers (with its place
/// among the clusters), so that one that hangs holds no other row up. Every cluster is
/// read once at the start; each `()` sent on `again` reads them all again.
pub struct FleetReader {
    pub again: mpsc::Sender<()>,
    pub rows: mpsc::Receiver<(usize, ClusterRow)>,
}

/// Starts the task that reads `clusters` for the TUI's Fleet screen; it ends when the
/// screen drops its side.
pub fn spawn_reader(clusters: Vec<ClusterRef>, opts: FleetOptions) -> FleetReader {
    let (again_tx, mut again) = mpsc::channel::<()>(1);
    let (rows_tx, rows) = mpsc::channel(clusters.len().max(1));
    tokio::spawn(async move {
        loop {
            // Owned per cluster: a spawned task's stream cannot lend out its own borrows.
            let mut read = futures::stream::iter(clusters.clone().into_iter().enumerate())
                .map(|(i, c)| {
                    let opts = opts.clone();
                    async move { (i, read_cluster(&c, &opts).await) }
                })
                .buffer_unordered(AT_ONCE);
            while let Some(row) = read.next().await {
                if rows_tx.send(row).await.is_err() {
                    return;
                }
            }
            if again.recv().await.is_none() {
                return;
            }
        }
    });
    FleetReader {
        again: again_tx,
        rows,
    }
}

/// How a cluster is opened from the Fleet screen.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Where Cilium runs: its `cilium-config` gives the cluster's range.
    pub cilium_namespace: String,
    /// The range where `cilium-config` is not found (the flags').
    pub fallback: ClusterScope,
    /// How long reaching it may take.
    pub timeout: Duration,
    pub consistent_reads: bool,
}

/// A cluster reached from the Fleet screen: its API server, its range, its kvstore.
pub struct Reached {
    pub target: K8sTarget,
    pub scope: ClusterScope,
    pub etcd: EtcdOptions,
}

/// Reaches a cluster to open its screens: it needs its kvstore named, an API server that
/// answers within the timeout, and a `cilium-config` that reads (or none).
pub async fn reach(c: &ClusterRef, opts: &OpenOptions) -> Result<Reached> {
    let Some(etcd) = c.etcd.clone() else {
        return Err(Error::Config(format!(
            "no kvstore is named for it: pass --etcd-config-for {}=FILE (its Cilium etcd config)",
            c.context.as_deref().unwrap_or(&c.name)
        )));
    };
    let reach = async {
        let mut target = K8sTarget::connect(&K8sOptions {
            kubeconfig: c.kubeconfig.clone(),
            context: c.context.clone(),
        })
        .await?;
        target.consistent_reads = opts.consistent_reads;
        let scope = scope_of(&target, &opts.cilium_namespace, opts.fallback).await?;
        Ok::<_, Error>((target, scope))
    };
    let (target, scope) = tokio::time::timeout(opts.timeout, reach)
        .await
        .map_err(|_| {
            Error::Config(format!(
                "no answer within {}s: check that its API server is up, or pass a longer --timeout",
                opts.timeout.as_secs_f64()
            ))
        })??;
    Ok(Reached {
        target,
        scope,
        etcd,
    })
}

/// The identity range of a cluster opened from the fleet: what its `cilium-config` says
/// (its agents allocate there), else `fallback` (the flags'). A value Cilium's agents would
/// refuse is refused here too rather than guessed.
pub async fn scope_of(
    target: &K8sTarget,
    cilium_namespace: &str,
    fallback: ClusterScope,
) -> Result<ClusterScope> {
    let config = crate::app::switch::CILIUM_CONFIG;
    let data = target
        .config_map_data(cilium_namespace, config)
        .await
        .map_err(|e| Error::kube(target.server.clone(), "reading cilium-config", e))?;
    let Some(data) = data else {
        return Ok(fallback);
    };
    let bad = |what: &str, why: String| {
        Error::Config(format!(
            "{cilium_namespace}/{config}'s {what} {why}: fix it there (Cilium's agents refuse it too)"
        ))
    };
    let mesh = crate::core::switch::settings::mesh_of(&data);
    let cluster_id = mesh
        .cluster_id
        .map_err(|r| bad("cluster-id", format!("is {:?}, {}", r.value, r.why)))?;
    let mcc = mesh
        .max_connected_clusters
        .map_err(|r| bad("max-connected-clusters", r.why))?;
    ClusterScope::new(cluster_id, mcc).map_err(|e| bad("cluster-id", e))
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
        kvstore: None,
    })
}

/// Seconds since `updated` (RFC 3339), if it reads as a time.
fn age_of(updated: &str) -> Option<i64> {
    let t: jiff::Timestamp = updated.parse().ok()?;
    Some(jiff::Timestamp::now().as_second() - t.as_second())
}

/// The fleet as a table: one row per cluster, then the counts.
pub fn text(rows: &[ClusterRow]) -> String {
    let line = |c: [&str; 8]| {
        format!(
            "{:<20} {:<10} {:<15} {:>10} {:>8} {:<22} {:>6}  {}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
        )
    };
    let mut out = line(Cells::HEADER);
    for r in rows {
        let c = Cells::of(r);
        out.push_str(&line([
            &r.cluster,
            &c.cilium,
            &c.modes,
            &c.identities,
            &c.kvstore,
            &c.sync,
            &c.age,
            &c.next,
        ]));
    }
    let reached = rows.iter().filter(|r| r.reached_cutover()).count();
    let attention = rows.iter().filter(|r| r.attention.is_some()).count();
    out.push_str(&format!(
        "{}: {reached} reached cutover, {attention} need attention\n",
        crate::core::words::count(rows.len(), "cluster")
    ));
    out
}
