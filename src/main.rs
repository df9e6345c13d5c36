//! The `cilium-idmig` command line: parses flags, runs a flow from the library, prints the
//! result and maps it to the exit-code contract (0 ok, 1 failed work, 2 usage/config).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use tokio::sync::mpsc;

use cilium_idmig::decision_log::{self, DecisionLog};
use cilium_idmig::engine::{
    ApplyOptions, ApplyReport, EngineEvent, Outcome, Progress, StopFlag, Watchers,
};
use cilium_idmig::etcd_source::EtcdOptions;
use cilium_idmig::generator::{self, GenConfig};
use cilium_idmig::k8s_target::{K8sOptions, K8sTarget};
use cilium_idmig::kvstore::{DEFAULT_PREFIX, KvSnapshot, SourceInfo};
use cilium_idmig::plan_file::PlanFile;
use cilium_idmig::range::IdRange;
use cilium_idmig::report;
use cilium_idmig::sandbox::{Sandbox, SandboxConfig};
use cilium_idmig::session::{self, ApplyRequest, KvSource};
use cilium_idmig::verify::VerifyReport;

#[derive(Parser)]
#[command(
    name = "cilium-idmig",
    version,
    about = "Migrate Cilium security identities from the etcd kvstore to CiliumIdentity resources"
)]
struct Cli {
    /// Write logs to this file (tracing-appender); otherwise warnings go to stderr.
    #[arg(long, global = true)]
    log_file: Option<PathBuf>,
    /// Log filter, e.g. info or cilium_idmig=debug.
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
    /// Without a command, opens the interactive migrator with these flags.
    #[command(flatten)]
    tui: TuiArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

/// The interactive migrator's flags, both as `tui` and as the default with no command.
#[derive(Args, Clone, Default)]
struct TuiArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(flatten)]
    tuning: Tuning,
    #[arg(long)]
    decision_log: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// The interactive migrator (the default when no command is given).
    Tui(TuiArgs),
    /// Read both sides and write the plan; changes nothing.
    Plan {
        #[command(flatten)]
        conn: Conn,
        /// Where to write the plan (a new file, mode 0600).
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Apply a saved plan, or plan and apply in one go.
    Apply {
        #[command(flatten)]
        conn: Conn,
        /// A plan written by `plan` (possibly edited); re-checked against the live cluster.
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Required: apply writes to the cluster.
        #[arg(long)]
        yes: bool,
        /// Accept every remap and duplicate proposal that has no decision.
        #[arg(long)]
        accept_proposals: bool,
        #[arg(long)]
        decision_log: Option<PathBuf>,
        #[command(flatten)]
        tuning: Tuning,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check that every valid kvstore identity has its CiliumIdentity.
    Verify {
        #[command(flatten)]
        conn: Conn,
        /// Decision log(s) whose recorded mappings count as the expected ids.
        #[arg(long)]
        decision_log: Vec<PathBuf>,
        /// `text` or `json`.
        #[arg(long, default_value = "text")]
        output: String,
    },
    /// The interactive migrator on the embedded sandbox: an in-memory kvstore and the
    /// in-process API server, seeded with generated identities of every kind. Needs no etcd,
    /// no Kubernetes, no network.
    Demo {
        #[arg(long, default_value_t = 2000)]
        identities: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Where the demo's decision log goes.
        #[arg(long)]
        decision_log: Option<PathBuf>,
        /// Serve the sandbox API server on this port (0 picks one), e.g. to inspect it with kubectl.
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Run plan, apply (accepting every proposal) and verify without the TUI.
        #[arg(long)]
        headless: bool,
        /// Latency the sandbox adds to every identity request, to feel a slow API server (e.g. 20ms).
        #[arg(long, value_parser = parse_duration)]
        sandbox_latency: Option<Duration>,
    },
    /// Serve the sandbox API server on 127.0.0.1 until Ctrl-C, for trying other tools against it.
    Sandbox {
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Write a kubeconfig pointing at it here.
        #[arg(long)]
        kubeconfig_out: Option<PathBuf>,
        /// Start without the CiliumIdentity CRD.
        #[arg(long)]
        no_crd: bool,
    },
}

#[derive(Args, Clone, Default)]
struct Conn {
    /// etcd endpoints, comma-separated.
    #[arg(long, value_delimiter = ',', env = "CILIUM_IDMIG_ETCD_ENDPOINTS")]
    etcd_endpoints: Vec<String>,
    /// Cilium's etcd config file (endpoints, trusted-ca-file, cert-file, key-file, username, password).
    #[arg(long)]
    etcd_config: Option<PathBuf>,
    #[arg(long, default_value = DEFAULT_PREFIX)]
    kvstore_prefix: String,
    #[arg(long, default_value_t = 2000)]
    etcd_page_size: i64,
    /// kubeconfig file (default: KUBECONFIG, ~/.kube/config, then in-cluster).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    #[arg(long)]
    context: Option<String>,
    /// Cilium cluster ID (0..=255); sets the identity range.
    #[arg(long, default_value_t = 0)]
    cluster_id: u32,
}

#[derive(Args, Clone, Default)]
struct Tuning {
    /// Creates in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Client-side request rate limit; 0 leaves pacing to the API server (429 + Retry-After).
    #[arg(long, default_value_t = 0.0)]
    k8s_qps: f64,
    #[arg(long, default_value_t = 100)]
    k8s_burst: u32,
    /// Deadline of one request, e.g. 30s, 500ms, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    op_timeout: Duration,
    /// Attempts per identity before it is reported failed.
    #[arg(long, default_value_t = 8)]
    max_attempts: u32,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s, 500ms or 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s or m)")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Outcome of a command: exit code 0, 1 or 2.
enum Exit {
    Ok,
    Failed,
}

impl Conn {
    fn etcd(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            config_file: self.etcd_config.clone(),
            prefix: self.kvstore_prefix.clone(),
            page_size: self.etcd_page_size,
            ..Default::default()
        }
    }
    fn range(&self) -> cilium_idmig::Result<IdRange> {
        IdRange::for_cluster(self.cluster_id).map_err(cilium_idmig::Error::Config)
    }
    async fn target(&self) -> cilium_idmig::Result<K8sTarget> {
        K8sTarget::connect(&K8sOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        })
        .await
    }
}

impl Tuning {
    fn options(&self) -> ApplyOptions {
        ApplyOptions {
            concurrency: self.concurrency.max(1),
            op_timeout: self.op_timeout,
            max_attempts: self.max_attempts.max(1),
            qps: self.k8s_qps,
            burst: self.k8s_burst,
            ..Default::default()
        }
    }
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let interactive = match &cli.command {
        None | Some(Command::Tui(_)) => true,
        Some(Command::Demo { headless, .. }) => !headless,
        _ => false,
    };
    let _guard = match init_logging(&cli, interactive) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let command = cli.command.take().unwrap_or(Command::Tui(cli.tui.clone()));
    match rt.block_on(run(command)) {
        Ok(Exit::Ok) => ExitCode::SUCCESS,
        Ok(Exit::Failed) => ExitCode::from(1),
        Err(e) => {
            let code = match e.downcast_ref::<cilium_idmig::Error>() {
                Some(le) if !le.is_usage() => 1,
                _ => 2,
            };
            eprintln!("error: {e:#}");
            ExitCode::from(code)
        }
    }
}

fn init_logging(
    cli: &Cli,
    interactive: bool,
) -> anyhow::Result<Option<tracing_appender::non_blocking::WorkerGuard>> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .with_context(|| format!("--log-level {:?}", cli.log_level))?;
    match &cli.log_file {
        Some(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let name = path.file_name().context("--log-file needs a file name")?;
            let appender = tracing_appender::rolling::never(dir, name);
            let (writer, guard) = tracing_appender::non_blocking(appender);
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(writer)
                .init();
            Ok(Some(guard))
        }
        // While the TUI owns the screen nothing may print to it: no log file, no logs.
        None if interactive => Ok(None),
        None => {
            // On the terminal, only this tool's own warnings: errors reach the operator as one
            // clear line, not as the client library's log.
            let filter =
                tracing_subscriber::EnvFilter::try_new("cilium_idmig=warn").unwrap_or(filter);
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .init();
            Ok(None)
        }
    }
}

async fn run(cmd: Command) -> anyhow::Result<Exit> {
    match cmd {
        Command::Plan { conn, output } => plan(conn, output).await,
        Command::Apply {
            conn,
            plan,
            yes,
            accept_proposals,
            decision_log,
            tuning,
            json,
        } => {
            if !yes {
                return Err(cilium_idmig::Error::Config(
                    "apply writes CiliumIdentity objects: review the plan, then pass --yes".into(),
                )
                .into());
            }
            let plan = plan.map(|p| PlanFile::load(&p)).transpose()?;
            let range = match &plan {
                Some(p) => p.range,
                None => conn.range()?,
            };
            let target = conn.target().await?;
            let kv = KvSource::Etcd(conn.etcd());
            let req = ApplyRequest {
                plan,
                accept_proposals,
                options: tuning.options(),
            };
            apply(&kv, &target, range, &req, decision_log, json).await
        }
        Command::Verify {
            conn,
            decision_log,
            output,
        } => {
            let range = conn.range()?;
            let mappings = session::mappings_from_logs(&decision_log)?;
            let target = conn.target().await?;
            let report =
                session::verify(&KvSource::Etcd(conn.etcd()), &target, range, &mappings).await?;
            print_verify(&report, output == "json")?;
            Ok(if report.passed() {
                Exit::Ok
            } else {
                Exit::Failed
            })
        }
        Command::Demo {
            identities,
            seed,
            decision_log,
            port,
            headless: true,
            sandbox_latency,
        } => demo(identities, seed, decision_log, port, sandbox_latency).await,
        Command::Demo {
            identities,
            seed,
            decision_log,
            port,
            headless: false,
            sandbox_latency,
        } => {
            let (sandbox, kv) = demo_world(identities, seed, port, sandbox_latency).await?;
            let target = K8sTarget::from_url(&sandbox.url())?;
            let range = IdRange::for_cluster(0).map_err(cilium_idmig::Error::Config)?;
            interactive(kv, target, 0, range, decision_log, ApplyOptions::default()).await
        }
        Command::Tui(TuiArgs {
            conn,
            tuning,
            decision_log,
        }) => {
            let range = conn.range()?;
            let target = conn.target().await?;
            interactive(
                KvSource::Etcd(conn.etcd()),
                target,
                conn.cluster_id,
                range,
                decision_log,
                tuning.options(),
            )
            .await
        }
        Command::Sandbox {
            port,
            kubeconfig_out,
            no_crd,
        } => {
            let sb = Sandbox::start(SandboxConfig {
                port,
                with_crd: !no_crd,
                ..Default::default()
            })
            .await?;
            if let Some(p) = &kubeconfig_out {
                sb.write_kubeconfig(p)?;
                println!("kubeconfig written to {}", p.display());
            }
            println!(
                "sandbox API server listening on {} (Ctrl-C to stop)",
                sb.url()
            );
            tokio::signal::ctrl_c()
                .await
                .context("waiting for Ctrl-C")?;
            Ok(Exit::Ok)
        }
    }
}

async fn plan(conn: Conn, output: Option<PathBuf>) -> anyhow::Result<Exit> {
    let range = conn.range()?;
    let target = conn.target().await?;
    let scan = session::scan(&KvSource::Etcd(conn.etcd()), &target, range).await?;
    let plan = session::plan_file(&scan, &target, conn.cluster_id, range);
    print_plan_summary(&plan);
    if let Some(path) = output {
        plan.save(&path)?;
        println!("plan written to {}", path.display());
    }
    Ok(Exit::Ok)
}

fn print_plan_summary(plan: &PlanFile) {
    print!("{}", report::plan_summary(plan));
}

async fn apply(
    kv: &KvSource,
    target: &K8sTarget,
    range: IdRange,
    req: &ApplyRequest,
    log_path: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<Exit> {
    let log_path = log_path.unwrap_or_else(decision_log::default_path);
    let log = DecisionLog::open(&log_path)?;
    let stop = StopFlag::default();
    let (tx, mut rx) = mpsc::channel::<EngineEvent>(1024);
    let (progress_tx, mut progress_rx) = tokio::sync::watch::channel(Progress::default());
    let printer = tokio::spawn(async move {
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(EngineEvent::CrdCreating) => eprintln!("creating CRD ciliumidentities.cilium.io ..."),
                    Some(EngineEvent::CrdEstablished) => eprintln!("CRD established"),
                    Some(EngineEvent::Started { writes, total }) => eprintln!("applying {total} items ({writes} creates)"),
                    Some(EngineEvent::Stopping { reason }) => eprintln!("stopping: {reason}"),
                    Some(EngineEvent::Problem(r)) => eprintln!(
                        "  {} -> {}: {}: {}",
                        r.id,
                        r.target_id.map_or("-".to_string(), |t| t.to_string()),
                        r.outcome.as_str(),
                        match &r.outcome {
                            Outcome::Failed { error } => error.as_str(),
                            Outcome::Conflict { existing } => existing.as_str(),
                            _ => "",
                        }
                    ),
                    Some(EngineEvent::Retrying { .. }) => {}
                    None => break,
                },
                Ok(()) = progress_rx.changed() => {
                    let p = *progress_rx.borrow_and_update();
                    if p.writes > 0 && p.done > 0 && p.done.is_multiple_of(5000) {
                        eprintln!("  {} of {} done", p.done, p.total);
                    }
                }
            }
        }
    });
    let ctrlc_stop = stop.clone();
    let ctrlc = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("Ctrl-C: no new writes; waiting for those in flight");
            ctrlc_stop.stop();
        }
    });
    let watchers = Watchers {
        events: Some(&tx),
        progress: Some(&progress_tx),
    };
    let run = session::apply(kv, target, range, req, &log, watchers, stop).await;
    drop(tx);
    let _ = printer.await;
    ctrlc.abort();
    let run = run?;
    print_report(&run.report, json)?;
    for id in &run.not_in_plan {
        println!(
            "note: kvstore identity {id} appeared after the plan was made; left alone (make a new plan)"
        );
    }
    for id in &run.gone_from_kvstore {
        println!("note: plan item {id} is no longer in the kvstore; left alone");
    }
    println!("decision log: {}", log.path().display());
    Ok(if run.report.succeeded() && run.report.stopped.is_none() {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

fn print_report(r: &ApplyReport, json: bool) -> anyhow::Result<()> {
    match json {
        true => println!("{}", serde_json::to_string_pretty(r)?),
        false => print!("{}", report::apply_summary(r)),
    }
    Ok(())
}

fn print_verify(r: &VerifyReport, json: bool) -> anyhow::Result<()> {
    match json {
        true => println!("{}", serde_json::to_string_pretty(r)?),
        false => print!("{}", report::verify_summary(r)),
    }
    Ok(())
}

/// The demo's world: a sandbox API server and an in-memory kvstore, seeded from the generator.
async fn demo_world(
    identities: usize,
    seed: u64,
    port: u16,
    latency: Option<Duration>,
) -> anyhow::Result<(Sandbox, KvSource)> {
    let cfg = GenConfig {
        identities,
        seed,
        ..Default::default()
    };
    let data = generator::generate(&cfg)?;
    let sandbox = Sandbox::start(SandboxConfig {
        port,
        ..Default::default()
    })
    .await?;
    for (id, labels) in &data.k8s {
        sandbox.seed_identity(*id, labels);
    }
    if let Some(latency) = latency {
        sandbox.set_faults(cilium_idmig::sandbox::FaultConfig {
            latency,
            ..Default::default()
        });
    }
    let kv = KvSource::Memory(KvSnapshot {
        source: SourceInfo {
            endpoints: vec!["in-memory demo kvstore".into()],
            revision: 1,
            prefix: DEFAULT_PREFIX.into(),
        },
        masters: data.masters,
        node_counts: data.node_counts,
    });
    Ok((sandbox, kv))
}

/// Opens the TUI over the engine service.
async fn interactive(
    kv: KvSource,
    target: K8sTarget,
    cluster_id: u32,
    range: IdRange,
    log_path: Option<PathBuf>,
    apply: ApplyOptions,
) -> anyhow::Result<Exit> {
    let log_path = log_path.unwrap_or_else(decision_log::default_path);
    let log = std::sync::Arc::new(DecisionLog::open(&log_path)?);
    let handle = cilium_idmig::service::spawn(cilium_idmig::service::ServiceConfig {
        kv,
        target,
        cluster_id,
        range,
        log,
        apply,
    });
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    cilium_idmig::tui::run(range, no_color, handle).await?;
    println!("decision log: {}", log_path.display());
    Ok(Exit::Ok)
}

async fn demo(
    identities: usize,
    seed: u64,
    log_path: Option<PathBuf>,
    port: u16,
    latency: Option<Duration>,
) -> anyhow::Result<Exit> {
    let (sandbox, kv) = demo_world(identities, seed, port, latency).await?;
    let target = K8sTarget::from_url(&sandbox.url())?;
    let range = IdRange::for_cluster(0).map_err(cilium_idmig::Error::Config)?;
    println!(
        "demo: {identities} generated identities (seed {seed}) against the sandbox API server at {}\n",
        sandbox.url()
    );
    let scan = session::scan(&kv, &target, range).await?;
    print_plan_summary(&session::plan_file(&scan, &target, 0, range));
    println!("\napplying with --accept-proposals ...");
    let log_path = log_path.unwrap_or_else(decision_log::default_path);
    let req = ApplyRequest {
        plan: None,
        accept_proposals: true,
        options: ApplyOptions::default(),
    };
    let exit = apply(&kv, &target, range, &req, Some(log_path.clone()), false).await?;
    let mappings = session::mappings_from_logs(std::slice::from_ref(&log_path))?;
    let report = session::verify(&kv, &target, range, &mappings).await?;
    println!();
    print_verify(&report, false)?;
    Ok(if report.passed() { exit } else { Exit::Failed })
}
