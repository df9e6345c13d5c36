//! What each command does: builds the library's inputs from the flags, runs the flow,
//! prints the result. Returns whether the work succeeded (exit 0 or 1); errors are exit 2
//! when they are the operator's to fix.

use cilium_idmig::core::words::count;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use super::args::{CliCommand, Conn, DemoArgs, SyncArgs, TuiArgs};
use super::out::{out, outln};
use super::printer;
use cilium_idmig::app::flows::{self, ApplySpec};
use cilium_idmig::app::service::{self, ServiceConfig, ServiceRequest};
use cilium_idmig::app::{preflight, report, rollback};
use cilium_idmig::apply::executor::ApplyOptions;
use cilium_idmig::core::outcome::Outcome;
use cilium_idmig::core::range::{ClusterScope, MaxConnectedClusters};
use cilium_idmig::core::verify::VerifyReport;
use cilium_idmig::io::decision_log::{self, DecisionLog};
use cilium_idmig::io::k8s::K8sTarget;
use cilium_idmig::io::kv_source::KvSource;
use cilium_idmig::io::plan_file::PlanFile;
use cilium_idmig::sandbox::demo::{self, DemoConfig};
use cilium_idmig::sandbox::rollout::{self, RolloutConfig};
use cilium_idmig::sandbox::{Sandbox, SandboxConfig};

mod demo_cmd;
mod local_cmd;
mod sync_cmd;
mod tui_cmd;

use demo_cmd::{demo_command, sandbox};
use local_cmd::{completions, log, man};
use sync_cmd::{sync, sync_command};
use tui_cmd::{Session, interactive, tui};

/// Outcome of a command: exit code 0, 1, or 2 for writes the server refused to these
/// credentials (errors are 1 or 2, see `main`).
pub enum Exit {
    Ok,
    Failed,
    Refused,
}

/// How a command that wrote through the executor ends: 2 when the server refused these
/// credentials a write (said on stderr with the rule to grant, from the ClusterRole in
/// `assets/` named by `role`), 1 when anything else is unfinished (`clean` false, or a
/// stop), else 0.
fn exit_of_writes(
    report: &cilium_idmig::apply::outcome::ApplyReport,
    clean: bool,
    role: &str,
) -> Exit {
    if let Some(r) = report.results.iter().find(|r| r.refused) {
        eprintln!(
            "error: the API server refused a write of {} to these credentials ({}). Waiting will not fix this: grant what {role} names, then run this again",
            r.target_id.map_or_else(|| r.id.clone(), |t| t.to_string()),
            r.error.as_deref().unwrap_or("refused")
        );
        return Exit::Refused;
    }
    if clean && report.stopped.is_none() {
        Exit::Ok
    } else {
        Exit::Failed
    }
}

/// Runs one command; `bin_name` is how the operator invoked the tool (it may be a kubectl
/// plugin), for completions and the commands it suggests.
pub async fn run(cmd: CliCommand, bin_name: &str) -> anyhow::Result<Exit> {
    match cmd {
        CliCommand::Completions { shell } => completions(shell),
        CliCommand::Log {
            files,
            decisions_only,
            hold,
        } => log(files, decisions_only, hold).await,
        CliCommand::Man { command } => man(command),
        CliCommand::Plan { conn, output, .. } => plan(conn, output).await,
        CliCommand::Apply {
            conn,
            plan,
            yes,
            resume,
            accept_proposals,
            decision_log,
            tuning,
            json,
            ..
        } => {
            let spec = apply_spec(yes, plan, resume, accept_proposals, tuning)?;
            apply(World::of(&conn).await?, spec, decision_log, json).await
        }
        CliCommand::Verify {
            conn,
            decision_log,
            output,
            ..
        } => verify(conn, decision_log, output).await,
        CliCommand::Audit {
            conn,
            output,
            watch: false,
            decision_log,
            ..
        } => audit(conn, output, decision_log).await,
        CliCommand::Audit {
            conn,
            status_addr,
            every,
            decision_log,
            ..
        } => audit_watch(conn, status_addr, every, decision_log).await,
        CliCommand::SwitchReport {
            k8s,
            cilium_namespace,
            output,
            ..
        } => switch_report(k8s, cilium_namespace, output).await,
        CliCommand::Fleet {
            kubeconfig,
            context,
            etcd_config_for,
            kvstore_prefix,
            all_contexts,
            timeout,
            switch,
            cilium_namespace,
            lease_namespace,
            lease_name,
            output,
            ..
        } => {
            let opts = cilium_idmig::app::fleet::FleetOptions {
                cilium_namespace,
                lease_namespace,
                lease_name,
                timeout,
                switch,
            };
            let base = cilium_idmig::io::etcd::EtcdOptions {
                prefix: kvstore_prefix,
                ..Default::default()
            };
            let kvstores = kvstores_named(&etcd_config_for, &base);
            fleet(&kubeconfig, &context, all_contexts, kvstores, opts, output).await
        }
        CliCommand::SwitchPrepare {
            conn,
            cilium_namespace,
            yes,
            assume_defaults,
            remove_unused_after,
            decision_log,
            tuning,
            output,
            ..
        } => {
            let options = prepare_options(remove_unused_after);
            let how = PrepareHow {
                yes,
                assume_defaults,
                decision_log,
                tuning,
                json: output == super::args::Output::Json,
            };
            switch_prepare(conn, cilium_namespace, options, how).await
        }
        CliCommand::Demo(args) => demo_command(args).await,
        CliCommand::Tui(args) => tui(args, bin_name).await,
        CliCommand::Sync(args) => sync_command(args).await,
        CliCommand::Rollback {
            conn,
            decision_log,
            yes,
            tuning,
            json,
            include_in_use,
            run,
            ..
        } => {
            let spec = rollback::RollbackSpec {
                logs: decision_log,
                runs: run,
                include_in_use,
            };
            rollback(conn, spec, yes, tuning, json).await
        }
        CliCommand::Sandbox {
            port,
            kubeconfig_out,
            no_crd,
            ..
        } => sandbox(port, kubeconfig_out, no_crd).await,
    }
}

/// What `apply` is to do, refused without `--yes`: the plan file read, the decisions to
/// resume, and the writes' tuning.
fn apply_spec(
    yes: bool,
    plan: Option<PathBuf>,
    resume: Vec<PathBuf>,
    accept_proposals: bool,
    tuning: super::args::Tuning,
) -> anyhow::Result<ApplySpec> {
    if !yes {
        return Err(cilium_idmig::Error::Config(
            "apply writes CiliumIdentity objects: review the plan, then pass --yes".into(),
        )
        .into());
    }
    Ok(ApplySpec {
        plan: plan.map(|p| PlanFile::load(&p)).transpose()?,
        resume,
        accept_proposals,
        options: tuning.options(),
    })
}

/// `switch-prepare`'s options, at this moment.
fn prepare_options(
    remove_unused_after: Option<std::time::Duration>,
) -> cilium_idmig::core::switch::prepare::PrepareOptions {
    cilium_idmig::core::switch::prepare::PrepareOptions {
        // Past i64's seconds is for ever: nothing that old exists.
        remove_unused_after: remove_unused_after
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
        endpoints_unknown: false,
        now: jiff::Timestamp::now().as_second(),
    }
}

/// `verify`: every valid kvstore identity has its CiliumIdentity (or its recorded mapping).
async fn verify(
    conn: Conn,
    decision_log: Vec<PathBuf>,
    output: super::args::Output,
) -> anyhow::Result<Exit> {
    let range = conn.scope()?.range;
    let (mappings, notes) = flows::expectations_and_notes(&decision_log)?;
    let mappings = mappings.for_verify_only();
    for note in notes {
        eprintln!("{note}");
    }
    let target = conn.target().await?;
    let kv = KvSource::Etcd(conn.etcd());
    let report = printer::reading(
        "reading the kvstore and Kubernetes",
        flows::verify(&kv, &target, range, &mappings),
    )
    .await?;
    print_verify(&report, output == super::args::Output::Json)?;
    if output != super::args::Output::Json {
        out!("{}", report::pushed_back(target.notes().throttled()))?;
    }
    Ok(if report.passed() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// `switch-report`: what the operator would do to every pod at the switch; exit 1 unless
/// the switch is safe.
async fn switch_report(
    k8s: super::args::K8sConn,
    cilium_namespace: String,
    output: super::args::Output,
) -> anyhow::Result<Exit> {
    use cilium_idmig::app::switch;
    let target = k8s.target().await?;
    let report = printer::reading(
        "reading pods, namespaces, identities and endpoints",
        switch::read_report(&target, &cilium_namespace),
    )
    .await?;
    if let Some(why) = report
        .settings
        .contradicted_by(k8s.cluster_id, k8s.max_connected_clusters)
    {
        return Err(cilium_idmig::Error::Config(why).into());
    }
    match output {
        super::args::Output::Json => super::out::json(&report)?,
        super::args::Output::Text => out!("{}", switch::text(&report))?,
    }
    Ok(if report.is_safe() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// `fleet`: every cluster named, read side by side; exit 0 when every sync reached cutover.
/// Each cluster's kvstore as `--etcd-config-for NAME=FILE` names it: `base` (prefix, page
/// size) read from that cluster's etcd config.
fn kvstores_named(
    named: &[(String, PathBuf)],
    base: &cilium_idmig::io::etcd::EtcdOptions,
) -> Vec<(String, cilium_idmig::io::etcd::EtcdOptions)> {
    named
        .iter()
        .map(|(name, file)| {
            let etcd = cilium_idmig::io::etcd::EtcdOptions {
                config_file: Some(file.clone()),
                ..base.clone()
            };
            (name.clone(), etcd)
        })
        .collect()
}

async fn fleet(
    kubeconfigs: &[PathBuf],
    contexts: &[String],
    all: bool,
    kvstores: Vec<(String, cilium_idmig::io::etcd::EtcdOptions)>,
    opts: cilium_idmig::app::fleet::FleetOptions,
    output: super::args::Output,
) -> anyhow::Result<Exit> {
    use cilium_idmig::app::fleet;
    let mut clusters = fleet::clusters(kubeconfigs, contexts, all)?;
    fleet::with_kvstores(&mut clusters, kvstores)?;
    let rows = printer::reading(
        &format!(
            "reading {}",
            cilium_idmig::core::words::count(clusters.len(), "cluster")
        ),
        fleet::read_fleet(&clusters, &opts),
    )
    .await;
    match output {
        super::args::Output::Json => super::out::json(&rows)?,
        super::args::Output::Text => out!("{}", fleet::text(&rows))?,
    }
    Ok(
        if cilium_idmig::core::fleet::row::all_reached_cutover(&rows) {
            Exit::Ok
        } else {
            Exit::Failed
        },
    )
}

/// How `switch-prepare` was asked to run.
struct PrepareHow {
    yes: bool,
    /// Write even on settings assumed rather than read.
    assume_defaults: bool,
    decision_log: Option<PathBuf>,
    tuning: super::args::Tuning,
    json: bool,
}

/// `switch-prepare`: the plan (without --yes), or the plan carried out and logged.
async fn switch_prepare(
    conn: Conn,
    cilium_namespace: String,
    options: cilium_idmig::core::switch::prepare::PrepareOptions,
    how: PrepareHow,
) -> anyhow::Result<Exit> {
    use cilium_idmig::app::switch;
    let World { kv, target, .. } = World::of(&conn).await?;
    let prep = printer::reading(
        "reading pods, namespaces, identities, endpoints and the kvstore",
        switch::read_preparation(&target, &kv, &cilium_namespace, options),
    )
    .await?;
    let settings = &prep.report.settings;
    let k8s = &conn.k8s;
    if let Some(why) = settings.contradicted_by(k8s.cluster_id, k8s.max_connected_clusters) {
        return Err(cilium_idmig::Error::Config(why).into());
    }
    // The cluster's own range, as cilium-config sets it: what the session line records.
    let scope = cilium_idmig::core::range::ClusterScope::new(
        settings.cluster_id,
        settings.max_connected_clusters,
    )
    .map_err(cilium_idmig::Error::Config)?;
    if how.yes
        && !how.assume_defaults
        && !prep.plan.is_empty()
        && let Some(why) = settings.refuse_guesses()
    {
        return Err(cilium_idmig::Error::Config(why).into());
    }
    if how.yes
        && let Some(why) = prep.plan.refuse_while_agents_on_kvstore()
    {
        return Err(cilium_idmig::Error::Config(why).into());
    }
    // Label sets the range has no id for: the switch still draws for them.
    let short = if prep.plan.no_free_id > 0 {
        Exit::Failed
    } else {
        Exit::Ok
    };
    if !how.yes || prep.plan.is_empty() {
        match how.json {
            true => super::out::json(&prep)?,
            false => out!("{}", switch::plan_text(&prep))?,
        }
        let note = match (prep.plan.is_empty(), &short) {
            (true, Exit::Ok) => "nothing to prepare",
            (true, _) => "nothing can be prepared: no id of the range is free",
            _ => "nothing was changed; pass --yes to create and remove what is listed",
        };
        // JSON on stdout stays one document.
        match how.json {
            true => eprintln!("{note}"),
            false => outln!("{note}")?,
        }
        return Ok(short);
    }
    // The last read before the writes: no agent came to the kvstore, no id was taken there.
    printer::reading(
        "reading the kvstore again",
        switch::kvstore_still_clear(&kv, &prep.plan),
    )
    .await?;
    let log_path = how.decision_log.unwrap_or_else(decision_log::default_path);
    let log = open_log(&log_path)?;
    log.begin_session(cilium_idmig::io::decision_log::Session {
        command: "switch-prepare".into(),
        server: target.server.clone(),
        context: target.context.clone(),
        kvstore_endpoints: kv.endpoints(),
        kvstore_prefix: kv.prefix(),
        cluster_id: scope.cluster_id,
        max_connected_clusters: scope.max_connected_clusters,
        run: Some(decision_log::run_id().to_string()),
    })?;
    let stop = cilium_idmig::apply::executor::StopFlag::default();
    let mut signals = cilium_idmig::app::signals::StopSignals::new()?;
    let on_signal = stop.clone();
    let listener = tokio::spawn(async move {
        let sig = signals.recv().await;
        eprintln!(
            "{}: no new write starts; writes in flight finish",
            sig.name()
        );
        on_signal.stop();
    });
    let done = switch::carry_out(&target, &prep.plan, &log, &how.tuning.options(), stop).await;
    listener.abort();
    let done = done?;
    match how.json {
        true => super::out::json(&done)?,
        false => out!(
            "{}{}",
            switch::plan_text(&prep),
            switch::carried_out_text(&done)
        )?,
    }
    match how.json {
        true => eprintln!("decision log: {}", log_path.display()),
        false => outln!("decision log: {}", log_path.display())?,
    }
    let clean = done.results.iter().all(|r| {
        matches!(
            r.outcome,
            Outcome::Created | Outcome::Deleted | Outcome::AlreadyGone
        )
    });
    Ok(
        match exit_of_writes(&done, clean, "assets/clusterrole-switch.yaml") {
            Exit::Ok => short,
            other => other,
        },
    )
}

/// `audit`: both stores read and audited by labels; exit 1 when anything was found.
async fn audit(
    conn: Conn,
    output: super::args::Output,
    decision_log: Vec<PathBuf>,
) -> anyhow::Result<Exit> {
    let decisions = cilium_idmig::app::audit::decisions_from_logs(&decision_log)?;
    let World {
        kv, target, scope, ..
    } = World::of(&conn).await?;
    let mut run = printer::reading(
        "reading the kvstore and Kubernetes",
        cilium_idmig::app::audit::run(&kv, &target, scope.range),
    )
    .await?;
    run.report.explain_by_decisions(&decisions);
    match output {
        super::args::Output::Json => super::out::json(&run)?,
        super::args::Output::Text => out!("{}", cilium_idmig::app::audit::summary(&run))?,
    }
    Ok(if run.report.clean() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// `audit --watch`: an audit every `every` until a stop signal, the counts printed when they
/// change and exported; a failed read is said and tried again at the next turn.
async fn audit_watch(
    conn: Conn,
    status_addr: Option<std::net::SocketAddr>,
    every: std::time::Duration,
    decision_log: Vec<PathBuf>,
) -> anyhow::Result<Exit> {
    use cilium_idmig::app::audit::{AuditMetrics, counts_line, run};
    let decisions = cilium_idmig::app::audit::decisions_from_logs(&decision_log)?;
    let World {
        kv, target, scope, ..
    } = World::of(&conn).await?;
    let range = scope.range;
    let metrics = Arc::new(AuditMetrics::new()?);
    let _server = match status_addr {
        Some(addr) => {
            let (bound, task) = cilium_idmig::app::metrics::serve(addr, metrics.clone()).await?;
            outln!("status: http://{bound}/healthz and http://{bound}/metrics")?;
            Some(task)
        }
        None => None,
    };
    let mut signals = cilium_idmig::app::signals::StopSignals::new()?;
    let mut last = String::new();
    loop {
        match run(&kv, &target, range).await {
            Ok(mut audit) => {
                audit.report.explain_by_decisions(&decisions);
                metrics.record(&audit.report);
                let line = counts_line(&audit.report);
                if line != last {
                    outln!("{line}")?;
                    last = line;
                }
            }
            Err(e) => {
                metrics.failed();
                outln!("retrying at the next audit: {e}")?;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            sig = signals.recv() => {
                outln!("{}: audit stopped", sig.name())?;
                return Ok(Exit::Ok);
            }
        }
    }
}

/// Opens a decision log, saying on stderr what opening it repaired (a torn last line).
fn open_log(path: &std::path::Path) -> anyhow::Result<Arc<DecisionLog>> {
    let log = DecisionLog::open(path)?;
    if let Some(note) = log.repaired() {
        eprintln!("warning: {note}");
    }
    Ok(Arc::new(log))
}

/// Both ends and the range a command works on.
struct World {
    kv: KvSource,
    target: K8sTarget,
    scope: ClusterScope,
    /// The namespace Cilium runs in (`--cilium-namespace`), for the TUI's Switch screen.
    cilium_namespace: String,
}

impl World {
    /// The cluster the connection flags name: etcd, the API server, the range.
    async fn of(conn: &Conn) -> anyhow::Result<World> {
        Ok(World {
            kv: KvSource::Etcd(conn.etcd()),
            target: conn.target().await?,
            scope: conn.scope()?,
            cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
        })
    }

    fn service(
        self,
        command: &'static str,
        log: Arc<DecisionLog>,
        apply: ApplyOptions,
        resume: Vec<PathBuf>,
        sync_reserve_in_kvstore: bool,
    ) -> service::Handle {
        service::spawn(ServiceConfig {
            kv: self.kv,
            target: self.target,
            scope: self.scope,
            log,
            apply,
            command,
            resume,
            sync_reserve_in_kvstore,
            cilium_namespace: self.cilium_namespace,
        })
    }
}

async fn plan(conn: Conn, output: Option<PathBuf>) -> anyhow::Result<Exit> {
    // `-o json` and `-o text` are formats, as kubectl users type them; anything else a file.
    let format = output
        .as_ref()
        .and_then(|p| p.to_str())
        .filter(|p| matches!(*p, "json" | "text"))
        .map(str::to_string);
    let output = output.filter(|_| format.is_none());
    // Checked before anything is read: a plan is never overwritten, and a minute of reading
    // should not end in that refusal.
    if let Some(path) = output.as_ref().filter(|p| p.exists()) {
        return Err(cilium_idmig::Error::file(
            path,
            "already exists; a plan is never overwritten: choose another --output",
        )
        .into());
    }
    let scope = conn.scope()?;
    let target = conn.target().await?;
    let kv = KvSource::Etcd(conn.etcd());
    let scan = printer::reading(
        "reading the kvstore and Kubernetes",
        flows::scan(&kv, &target, scope.range),
    )
    .await?;
    let plan = flows::plan_file(scan, &target, scope);
    if format.as_deref() == Some("json") {
        // Written as it serializes: at 65,280 identities the text is some 30 MB.
        super::out::json(&plan)?;
        return Ok(Exit::Ok);
    }
    out!("{}", report::plan_summary(&plan))?;
    out!("{}", report::pushed_back(target.notes().throttled()))?;
    let undecided = plan
        .items
        .iter()
        .filter(|i| i.kind.needs_decision() && !i.decided)
        .count();
    if let Some(path) = &output {
        plan.save(path)?;
        outln!("plan written to {}", path.display())?;
    }
    // What to do next, with this plan; with none written, writing one comes first.
    let Some(file) = output.map(|p| shell_quote(&p.display().to_string())) else {
        if undecided > 0 {
            outln!(
                "next: decide the {}: write the plan with `plan --output plan.json` and set \"decided\": true (or decide in the TUI), then `apply --plan plan.json --yes`; or `apply --yes --accept-proposals` to take every proposal",
                count(undecided, "conflict")
            )?;
        } else {
            outln!(
                "next: `plan --output plan.json` writes it to review, then `apply --plan plan.json --yes`; or `apply --yes` plans and applies in one go"
            )?;
        }
        return Ok(Exit::Ok);
    };
    if undecided > 0 {
        outln!(
            "next: decide the {} (in the TUI, or \"decided\": true in the plan), then `apply --plan {file} --yes`; or `apply --yes --accept-proposals` to take every proposal",
            count(undecided, "conflict")
        )?;
    } else {
        outln!("next: `apply --plan {file} --yes` writes it")?;
    }
    Ok(Exit::Ok)
}

/// A headless apply: the same service and event stream as the TUI's commit, printed.
async fn apply(
    world: World,
    spec: ApplySpec,
    log_path: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<Exit> {
    let log_path = log_path.unwrap_or_else(decision_log::default_path);
    let log = open_log(&log_path)?;
    let kept = log.clone();
    let mut handle = world.service("apply", log, spec.options.clone(), Vec::new(), false);
    let run = printer::apply(&mut handle, spec).await;
    // Refused before anything was decided or written: no log file is left behind.
    if kept.discard_if_unused() {
        eprintln!("decision log: none kept (nothing was decided or written)");
    }
    let run = run?;
    match json {
        true => super::out::json(&run.report)?,
        false => out!("{}", report::apply_summary(&run.report))?,
    }
    for id in &run.not_in_plan {
        outln!(
            "note: kvstore identity {id} is not in the plan (it appeared after the plan was made, or its item was taken out of the plan): left alone, nothing written for it; make a new plan to carry it over"
        )?;
    }
    for id in &run.gone_from_kvstore {
        outln!(
            "note: plan item {id} is not in the kvstore now (deleted since the plan, or never there: check the id); left alone"
        )?;
    }
    if run.resumed > 0 || !run.dropped.is_empty() {
        outln!(
            "resumed {} recorded decisions; {} dropped",
            run.resumed,
            run.dropped.len()
        )?;
    }
    for d in &run.dropped {
        outln!(
            "note: the recorded decision on {} was dropped: {}",
            d.id,
            d.reason
        )?;
    }
    if !run.redecided.is_empty() {
        outln!(
            "note: the logs decide {} more than once; the last decision on each stands: {}",
            count(run.redecided.len(), "kvstore id"),
            run.redecided.join(", ")
        )?;
    }
    // A rerun that found every identity where it belongs, and decided nothing, wrote
    // nothing: its log would only repeat the run that did, so none is left behind. A log
    // with a decision in it (a skip, a mapping, a choice) is kept: the decision is the record.
    let wrote_nothing = run.report.results.iter().all(|r| {
        use cilium_idmig::core::outcome::Outcome;
        matches!(
            r.outcome,
            Outcome::AlreadyMigrated | Outcome::Mapped | Outcome::Skipped
        )
    });
    if run.report.succeeded() && run.report.stopped.is_none() && !json {
        outln!(
            "next: `sync --until-cutover` through the rollout (or `verify` with this decision log once no agent allocates in the kvstore)"
        )?;
    }
    if wrote_nothing && !run.report.crd_created && kept.discard_if_nothing_decided() {
        outln!(
            "decision log: none kept (every identity was already where it belongs, and nothing was decided)"
        )?;
    } else if wrote_nothing && kept.holds_decisions() {
        outln!(
            "decision log: {} (it records the decisions; nothing needed writing to the cluster)",
            log_path.display()
        )?;
    } else {
        outln!("decision log: {}", log_path.display())?;
    }
    Ok(exit_of_writes(
        &run.report,
        run.report.succeeded(),
        "assets/clusterrole.yaml",
    ))
}

fn print_verify(r: &VerifyReport, json: bool) -> anyhow::Result<()> {
    match json {
        true => super::out::json(r)?,
        false => out!("{}", report::verify_summary(r))?,
    }
    Ok(())
}

/// Opens the TUI over the engine service.
/// `rollback`: checks the rollback role, then prints the plan (without `--yes`) or deletes
/// exactly what the runs created, through the same service and printer as an apply.
async fn rollback(
    conn: super::args::K8sConn,
    spec: rollback::RollbackSpec,
    yes: bool,
    tuning: super::args::Tuning,
    json: bool,
) -> anyhow::Result<Exit> {
    let target = conn.target().await?;
    preflight::require_rollback_rights(&target).await?;
    if !yes {
        let ops = printer::reading(
            "reading the objects the runs created",
            rollback::plan(&target, &spec),
        )
        .await?;
        out!("{}", report::rollback_plan(&ops, json)?)?;
        outln!("nothing was changed; pass --yes to delete what is marked delete")?;
        return Ok(Exit::Ok);
    }
    // The rollback's own lines go to the newest log, so verify sees them with the rest (a
    // rollback by --run alone gets a log of its own).
    let log_path = spec
        .logs
        .last()
        .cloned()
        .unwrap_or_else(decision_log::default_path);
    let log = open_log(&log_path)?;
    let world = World {
        kv: KvSource::Memory(Default::default()),
        target,
        scope: conn.scope()?,
        cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
    };
    let mut handle = world.service("rollback", log, tuning.options(), Vec::new(), false);
    let req = ServiceRequest::Rollback {
        generation: 1,
        spec,
    };
    let run = printer::run(&mut handle, req).await?;
    match json {
        true => super::out::json(&run.report)?,
        false => out!("{}", report::rollback_summary(&run.report))?,
    }
    outln!("decision log: {}", log_path.display())?;
    let clean = run.report.results.iter().all(|r| {
        matches!(
            r.outcome,
            Outcome::Deleted | Outcome::AlreadyGone | Outcome::Created
        )
    });
    Ok(exit_of_writes(
        &run.report,
        clean,
        "assets/clusterrole-rollback.yaml",
    ))
}

/// How a commit left unfinished in the TUI is finished afterwards.
enum Finish {
    /// `apply` with the same flags, resuming the decision log.
    Apply { bin_name: String },
    /// The demo's world ends with it.
    Demo,
}

/// Quotes an argument for a POSIX shell when it needs it.
fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::sync_cmd::status_line;
    use super::tui_cmd::{finishing_command, going_on_command};
    use super::*;

    #[test]
    fn the_finishing_command_keeps_the_flags_and_resumes_the_log() {
        let args = [
            "tui",
            "--etcd-config",
            "/etc/cilium/etcd config.yaml",
            "--decision-log",
            "old.jsonl",
            "--cluster-id=3",
        ]
        .map(String::from);
        assert_eq!(
            finishing_command(
                "kubectl cilium-idmig",
                std::path::Path::new("d.jsonl"),
                args.into_iter()
            ),
            "kubectl cilium-idmig apply --yes --resume d.jsonl --decision-log d.jsonl --etcd-config '/etc/cilium/etcd config.yaml' --cluster-id=3"
        );
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        // Sync stopped before cutover goes on headless from the same log and flags.
        let args = ["--etcd-config", "etcd.yaml", "--decision-log", "d.jsonl"].map(String::from);
        assert_eq!(
            going_on_command(
                "cilium-idmig",
                std::path::Path::new("d.jsonl"),
                args.clone().into_iter()
            ),
            "cilium-idmig sync --decision-log d.jsonl --until-cutover --etcd-config etcd.yaml"
        );
        // Before both sides are read, no counts.
        let status = cilium_idmig::app::sync::SyncStatus::default();
        assert_eq!(
            status_line(false, &status),
            "sync: reading the kvstore and Kubernetes"
        );
        assert!(status_line(true, &status).contains("0 identities"));
        use clap::Parser;
        let words = going_on_command(
            "cilium-idmig",
            std::path::Path::new("d.jsonl"),
            args.into_iter(),
        );
        assert!(super::super::args::Cli::try_parse_from(words.split(' ')).is_ok());
    }
}
