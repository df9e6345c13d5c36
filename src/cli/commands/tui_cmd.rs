//! The TUI as a command: the terminal session, and the command the operator runs next.

use super::*;

/// `tui` (and no command): the interactive migrator on the cluster.
pub(super) async fn tui(args: TuiArgs, bin_name: &str) -> anyhow::Result<Exit> {
    if args.all_contexts || args.conn.k8s.context.len() > 1 {
        return fleet_tui(args).await;
    }
    if !args.etcd_config_for.is_empty() {
        return Err(cilium_idmig::Error::Config(
            "--etcd-config-for names the kvstores of several clusters: pass --context more than once (or --all-contexts), or --etcd-config for one cluster".into(),
        )
        .into());
    }
    let TuiArgs {
        conn,
        tuning,
        decision_log,
        resume,
        rollback,
        reserve_in_kvstore,
        cilium_namespace,
        ..
    } = args;
    // A log to resume or roll back that cannot be read is refused before the terminal is
    // taken, as the headless commands refuse it (exit 2).
    for path in resume.iter().chain(&rollback) {
        cilium_idmig::io::decision_log::check_readable(path)?;
    }
    let world = World {
        cilium_namespace,
        ..World::of(&conn).await?
    };
    let finish = Finish::Apply {
        bin_name: bin_name.to_string(),
    };
    let session = Session {
        resume,
        rollback,
        reserve_in_kvstore,
    };
    interactive(world, decision_log, tuning.options(), session, finish).await
}

/// `tui` over several contexts: the Fleet screen first, each cluster's screens opened from it
/// with its own kvstore, range and decision log.
async fn fleet_tui(args: TuiArgs) -> anyhow::Result<Exit> {
    use cilium_idmig::app::fleet::{self, FleetOptions};
    let refuse = |why: &str| -> anyhow::Result<Exit> {
        Err(cilium_idmig::Error::Config(why.to_string()).into())
    };
    if !args.resume.is_empty() || !args.rollback.is_empty() || args.decision_log.is_some() {
        return refuse(
            "--resume, --rollback and --decision-log work on one cluster: pass one --context (each cluster opened from the Fleet screen keeps a decision log of its own)",
        );
    }
    if !args.conn.etcd.etcd_endpoints.is_empty() || args.conn.etcd.etcd_config.is_some() {
        return refuse(
            "--etcd-endpoints and --etcd-config name one kvstore, and several clusters are open: pass --etcd-config-for CONTEXT=FILE for each cluster instead",
        );
    }
    let kubeconfigs: Vec<PathBuf> = args.conn.k8s.kubeconfig.iter().cloned().collect();
    let mut clusters = fleet::clusters(&kubeconfigs, &args.conn.k8s.context, args.all_contexts)?;
    let kvstores = kvstores_named(&args.etcd_config_for, &args.conn.etcd());
    fleet::with_kvstores(&mut clusters, kvstores)?;
    // Sync's standing is read where sync keeps its Lease by default, as `fleet` does.
    let lease = cilium_idmig::app::lease::LeaseOptions::default();
    let opts = FleetOptions {
        cilium_namespace: args.cilium_namespace.clone(),
        lease_namespace: lease.namespace,
        lease_name: lease.name,
        timeout: args.timeout,
        switch: false,
    };
    let reader = fleet::spawn_reader(clusters.clone(), opts);
    let reach = fleet::OpenOptions {
        cilium_namespace: args.cilium_namespace.clone(),
        fallback: args.conn.scope()?,
        timeout: args.timeout,
        consistent_reads: args.conn.k8s.consistent_reads,
    };
    let logs = Arc::new(std::sync::Mutex::new(ClusterLogs::default()));
    let opener = {
        let logs = logs.clone();
        let (apply, reserve) = (args.tuning.options(), args.reserve_in_kvstore);
        let open = move |c: fleet::ClusterRef| -> futures::future::BoxFuture<
            'static,
            Result<cilium_idmig::tui::OpenedCluster, String>,
        > {
            let (logs, apply, reach) = (logs.clone(), apply.clone(), reach.clone());
            Box::pin(async move {
                let fleet::Reached {
                    target,
                    scope,
                    etcd,
                } = fleet::reach(&c, &reach).await.map_err(|e| e.to_string())?;
                let log = logs
                    .lock()
                    .map_err(|_| "the decision logs' list was poisoned".to_string())?
                    .of(&c.name)
                    .map_err(|e| e.to_string())?;
                let world = World {
                    kv: KvSource::Etcd(etcd),
                    target,
                    scope,
                    cilium_namespace: reach.cilium_namespace,
                };
                let range = world.scope.range;
                let handle = world.service("tui", log, apply, Vec::new(), reserve);
                Ok(cilium_idmig::tui::OpenedCluster { handle, range })
            })
        };
        Arc::new(open) as cilium_idmig::tui::Opener
    };
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let visits = cilium_idmig::tui::run_fleet(clusters, reader, opener, no_color).await?;
    // What stays on the terminal: each visit's totals, then each cluster's log.
    let mut unfinished = false;
    for v in &visits {
        for line in v.end.said() {
            outln!("{}: {line}", v.cluster)?;
        }
        unfinished |= v.end.commit.is_some_and(|s| s.unfinished());
    }
    let logs = std::mem::take(
        &mut *logs
            .lock()
            .map_err(|_| anyhow::anyhow!("the decision logs' list was poisoned"))?,
    );
    for (cluster, path, log) in logs.opened {
        if log.discard_if_unused() {
            outln!("{cluster}: decision log: none kept (nothing was decided or written)")?;
        } else {
            outln!("{cluster}: decision log: {}", path.display())?;
        }
    }
    Ok(if unfinished { Exit::Failed } else { Exit::Ok })
}

/// The decision log of each cluster opened from the Fleet screen: one per cluster, kept
/// over its visits, so that a second visit offers what the first left uncommitted.
#[derive(Default)]
struct ClusterLogs {
    opened: Vec<(String, PathBuf, Arc<DecisionLog>)>,
}

impl ClusterLogs {
    fn of(&mut self, cluster: &str) -> anyhow::Result<Arc<DecisionLog>> {
        if let Some((_, _, log)) = self.opened.iter().find(|(c, _, _)| c == cluster) {
            return Ok(log.clone());
        }
        let path = cluster_log_path(cluster);
        let log = open_log(&path)?;
        self.opened.push((cluster.to_string(), path, log.clone()));
        Ok(log)
    }
}

/// The default decision log's name with the cluster's in it (a context's characters that
/// a file name should not hold become `_`).
fn cluster_log_path(cluster: &str) -> PathBuf {
    let safe: String = cluster
        .chars()
        .map(|c| match c.is_ascii_alphanumeric() || "-_.".contains(c) {
            true => c,
            false => '_',
        })
        .collect();
    let default = decision_log::default_path();
    let name = default.display().to_string();
    PathBuf::from(name.replacen(
        "cilium-idmig-decisions-",
        &format!("cilium-idmig-decisions-{safe}-"),
        1,
    ))
}

/// What the TUI session does besides a fresh migration.
#[derive(Default)]
pub(super) struct Session {
    pub(super) resume: Vec<PathBuf>,
    pub(super) rollback: Vec<PathBuf>,
    /// A sync started in the TUI reserves in the kvstore (the demo's `--reserve-in-kvstore`).
    pub(super) reserve_in_kvstore: bool,
}

pub(super) async fn interactive(
    world: World,
    log_path: Option<PathBuf>,
    apply: ApplyOptions,
    session: Session,
    finish: Finish,
) -> anyhow::Result<Exit> {
    // A rollback's lines go to the newest of its logs unless another is named.
    let log_path = log_path
        .or_else(|| session.rollback.last().cloned())
        .unwrap_or_else(decision_log::default_path);
    let log = open_log(&log_path)?;
    let kept = log.clone();
    let range = world.scope.range;
    let command = if session.rollback.is_empty() {
        "tui"
    } else {
        "rollback"
    };
    let handle = world.service(
        command,
        log,
        apply,
        session.resume,
        session.reserve_in_kvstore,
    );
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let end = cilium_idmig::tui::run(range, no_color, session.rollback, handle).await?;
    // Exit 1 when the last commit or rollback left writes failed or not made (stopped with
    // Ctrl-C, say), as `tui --help` and a headless apply say.
    let unfinished = end.commit.is_some_and(|s| s.unfinished());
    // What stays on the terminal: what the last commit did, and how to finish it.
    if let Some(s) = end.commit {
        outln!("{s}")?;
        if s.unfinished() && s.rollback.is_none() {
            how_to_go_on(
                &finish,
                "to finish",
                |bin| finishing_command(bin, &log_path, std::env::args().skip(1)),
                "the demo's kvstore and API server end with it; run the demo again to try once more",
            )?;
        }
    }
    // Where the rollout stands, and how to go on when sync stopped before cutover.
    if let Some(r) = end.rollout {
        outln!("{r}")?;
        if !r.cutover {
            how_to_go_on(
                &finish,
                "to go on",
                |bin| going_on_command(bin, &log_path, std::env::args().skip(1)),
                "the demo's cluster ends with it; run the demo again to play the rollout once more",
            )?;
        }
    }
    if kept.discard_if_unused() {
        outln!("decision log: none kept (nothing was decided or written)")?;
    } else {
        outln!("decision log: {}", log_path.display())?;
    }
    Ok(if unfinished { Exit::Failed } else { Exit::Ok })
}

/// The line after the TUI that says how to carry on: `command` with this run's flags, or,
/// for the demo, `demo` (its world ended with it).
pub(super) fn how_to_go_on(
    finish: &Finish,
    lead: &str,
    command: impl Fn(&str) -> String,
    demo: &str,
) -> anyhow::Result<()> {
    match finish {
        Finish::Apply { bin_name } => outln!("{lead}: {}", command(bin_name))?,
        Finish::Demo => outln!("{lead}: {demo}")?,
    }
    Ok(())
}

/// `apply --yes --resume LOG` with this run's flags: the same cluster, the decisions made
/// in the TUI, and their outcomes appended to the same log.
pub(super) fn finishing_command(
    bin_name: &str,
    log: &std::path::Path,
    args: impl Iterator<Item = String>,
) -> String {
    after_the_tui(
        bin_name,
        "apply --yes --resume {log} --decision-log {log}",
        log,
        args,
    )
}

/// `sync --decision-log LOG --until-cutover` with this run's flags: the sync the TUI ran,
/// resumed from its log (what it made, reported and decided), headless.
pub(super) fn going_on_command(
    bin_name: &str,
    log: &std::path::Path,
    args: impl Iterator<Item = String>,
) -> String {
    after_the_tui(
        bin_name,
        "sync --decision-log {log} --until-cutover",
        log,
        args,
    )
}

/// `what` (its `{log}` the TUI's decision log) followed by the TUI's own flags.
pub(super) fn after_the_tui(
    bin_name: &str,
    what: &str,
    log: &std::path::Path,
    args: impl Iterator<Item = String>,
) -> String {
    let log = shell_quote(&log.display().to_string());
    with_flags(format!("{bin_name} {}", what.replace("{log}", &log)), args)
}

/// `cmd` followed by the TUI's own flags, but for its name and its decision log.
pub(super) fn with_flags(cmd: String, args: impl Iterator<Item = String>) -> String {
    let mut kept = Vec::new();
    let mut args = args.peekable();
    while let Some(a) = args.next() {
        if a == "tui" {
            continue;
        }
        if a == "--decision-log" {
            args.next();
            continue;
        }
        if a.starts_with("--decision-log=") {
            continue;
        }
        kept.push(shell_quote(&a));
    }
    let mut cmd = cmd;
    for a in kept {
        cmd.push(' ');
        cmd.push_str(&a);
    }
    cmd
}
