//! The command line's shape: every flag and subcommand, declared once with clap, and how
//! the shared flag groups turn into the library's options.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use cilium_idmig::apply::executor::ApplyOptions;
use cilium_idmig::core::kvstore::DEFAULT_PREFIX;
use cilium_idmig::core::range::{ClusterScope, MaxConnectedClusters};
use cilium_idmig::io::etcd::EtcdOptions;
use cilium_idmig::io::k8s::{K8sOptions, K8sTarget};

/// What `--version` says: the tool's version and what it works with.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\nCilium: 1.6 and later in kvstore identity mode (identities under cilium/state/identities/v1;",
    "\n        --max-connected-clusters 511 for meshes installed so on Cilium 1.15 and later)",
    "\nKubernetes: 1.16 and later (CiliumIdentity cilium.io/v2, CRD apiextensions.k8s.io/v1)",
    "\nTested with: Cilium 1.9's and 1.18's own identity allocators (kvstore, crd,",
    "\n        doublewrite-readcrd modes), Cilium 1.6.11's migrator side by side,",
    "\n        kube-apiserver 1.19.0 over etcd 3.4 and 1.36.2 over etcd 3.6"
);

/// What each command's long help (and man page) ends with: examples, which the guide uses
/// too (a test checks that they parse and that the guide shows them), and the exit status.
pub mod examples {
    pub const MAIN: &str = "Examples:\n  # The interactive migrator against Cilium's etcd (the kubeconfig as kubectl finds it)\n  cilium-idmig --etcd-config etcd.yaml\n  # The same on the embedded sandbox: no etcd, no Kubernetes\n  cilium-idmig demo\n\nExit status (the same for every command):\n  0  done\n  1  failed work: writes that failed, a verify mismatch, objects a rollback kept, etcd or the API server unreachable or failing after the retries\n  2  usage or configuration: bad flags or files, a refused plan, missing permissions (a 401/403, etcd's permission denied), a decision log another sync holds";
    pub const TUI: &str = "Examples:\n  # Review and commit against Cilium's etcd (the kubeconfig as kubectl finds it)\n  cilium-idmig tui --etcd-config etcd.yaml\n  # Review what a run created, then delete it\n  cilium-idmig tui --rollback rollout.jsonl\n  # The Fleet screen over two clusters; Enter opens either's screens on its own kvstore\n  cilium-idmig tui --context east --context west --etcd-config-for east=east-etcd.yaml --etcd-config-for west=west-etcd.yaml\n\nExit status:\n  0  quit after the work was done, or with nothing to do\n  1  a commit or rollback left writes failed or not made\n  2  usage or configuration: bad flags, unreadable files, a damaged log";
    pub const PLAN: &str = "Examples:\n  # Read both sides and write the plan; changes nothing\n  cilium-idmig plan --etcd-config etcd.yaml --output plan.json\n  # A cluster of a mesh installed with max-connected-clusters 511\n  cilium-idmig plan --etcd-config etcd.yaml --cluster-id 3 --max-connected-clusters 511\n\nExit status:\n  0  both sides read and the plan made (and written with --output)\n  1  etcd or the API server unreachable or failing after the retries\n  2  usage or configuration: bad flags, an existing --output file, missing permissions";
    pub const APPLY: &str = "Examples:\n  # Apply a reviewed plan\n  cilium-idmig apply --etcd-config etcd.yaml --plan plan.json --yes\n  # Apply the decisions made in the TUI\n  cilium-idmig apply --etcd-config etcd.yaml --resume review.jsonl --yes\n  # Plan and apply in one go, every proposal accepted\n  cilium-idmig apply --etcd-config etcd.yaml --yes --accept-proposals\n\nExit status:\n  0  every write made or already there\n  1  writes failed or not attempted (a rerun finishes them)\n  2  usage or configuration: no --yes, a refused plan, undecided conflicts, missing permissions";
    pub const ROLLBACK: &str = "Examples:\n  # What a rollback would delete; changes nothing\n  cilium-idmig rollback --decision-log rollout.jsonl\n  # Delete exactly what that run created\n  cilium-idmig rollback --decision-log rollout.jsonl --yes\n  # A run whose log is lost, by the annotation on its objects\n  cilium-idmig rollback --run 20261201T010203Z-4f2a --yes\n\nExit status:\n  0  everything planned deleted or already gone (without --yes: the plan printed)\n  1  an object kept or a delete failed\n  2  usage or configuration, including a missing rollback role";
    pub const AUDIT: &str = "Examples:\n  # Each finding with its nodes, endpoints and what to do\n  cilium-idmig audit --etcd-config etcd.yaml\n  # The same as JSON, for a script\n  cilium-idmig audit --etcd-config etcd.yaml --output json\n  # Watch a double-write rollout from a dashboard\n  cilium-idmig audit --etcd-config etcd.yaml --watch --status-addr 127.0.0.1:9465\n\nExit status:\n  0  the stores agree (with --watch: stopped by a signal)\n  1  findings\n  2  usage or configuration";
    pub const FLEET: &str = "Examples:\n  # Every context of the kubeconfig, one row each\n  cilium-idmig fleet --all-contexts\n  # Two clusters of two files, with what the switch would do, as JSON\n  cilium-idmig fleet --kubeconfig east.yaml --kubeconfig west.yaml --switch --output json\n\nExit status:\n  0  every cluster's sync reached cutover\n  1  some cluster needs attention (or could not be read)\n  2  usage or configuration: a context that does not exist, an unreadable kubeconfig";
    pub const SWITCH_REPORT: &str = "Examples:\n  # What Cilium 1.18's operator would do to every pod if it managed identities now\n  cilium-idmig switch-report\n  # Cilium runs in its own namespace; every pod as JSON\n  cilium-idmig switch-report --cilium-namespace cilium --output json\n\nExit status:\n  0  safe: every pod is adopted by exactly one identity; the switch draws nothing\n  1  pods would be re-minted or drawn, or duplicates found\n  2  usage or configuration: a label pattern Cilium refuses, the API server unreachable";
    pub const SWITCH_PREPARE: &str = "Examples:\n  # What the preparation would create and remove; changes nothing\n  cilium-idmig switch-prepare --etcd-config etcd.yaml\n  # Do it, recorded in a decision log that rollback can undo\n  cilium-idmig switch-prepare --etcd-config etcd.yaml --decision-log switch.jsonl --yes\n  # Also remove this tool's identities nothing has used for a day\n  cilium-idmig switch-prepare --etcd-config etcd.yaml --decision-log switch.jsonl --remove-unused-after 24h --yes\n\nExit status:\n  0  prepared (without --yes: the plan printed)\n  1  a write failed or met an object it may not touch\n  2  usage or configuration";
    pub const VERIFY: &str = "Examples:\n  # Every kvstore identity at its id, or where the log maps it\n  cilium-idmig verify --etcd-config etcd.yaml --decision-log rollout.jsonl\n  # Every log of the migration, as JSON\n  cilium-idmig verify --etcd-config etcd.yaml --decision-log cilium-idmig-decisions-*.jsonl --output json\n\nExit status:\n  0  every valid kvstore identity is where it belongs\n  1  missing or different identities, or a store unreachable\n  2  usage or configuration: bad flags, an unreadable or damaged decision log";
    pub const DEMO: &str = "Examples:\n  # The TUI on 2,000 generated identities\n  cilium-idmig demo\n  # An API server slow enough to stop a commit with Ctrl-C\n  cilium-idmig demo --sandbox-latency 200ms\n  # Rehearse on your own cluster's dumps\n  cilium-idmig demo --from-snapshot kvstore.json --k8s-snapshot identities.json\n\nExit status:\n  0  done (with --headless: applied and verified; with --sync: cutover reached)\n  1  failed work\n  2  usage: bad flags, a refused dump";
    pub const LOG: &str = "Examples:\n  # The decisions made in the TUI, alone, for a sync that runs in the cluster\n  cilium-idmig log --decisions-only review.jsonl > decisions.jsonl\n  # In the pod of the sync in the cluster (kubectl exec): its decision log, whole lines only\n  cilium-idmig log /var/lib/cilium-idmig/rollout.jsonl\n\nExit status:\n  0  printed (with --hold: stopped by a signal)\n  2  usage or configuration: a log that cannot be read, or a damaged line in one";
    pub const SYNC: &str = "Examples:\n  # Through the rollout, until cutover\n  cilium-idmig sync --etcd-config etcd.yaml --decision-log rollout.jsonl --status-addr 127.0.0.1:9464 --until-cutover\n  # The same with the TUI's decisions, and no split allocations\n  cilium-idmig sync --etcd-config etcd.yaml --decision-log rollout.jsonl --resume review.jsonl --reserve-in-kvstore --until-cutover\n\nExit status:\n  0  cutover reached (--until-cutover), or a clean stop with no failed write left\n  1  a write failed and was still not made at the stop\n  2  usage or configuration: a refused permission, a decision log another sync holds";
    pub const COMPLETIONS: &str = "Examples:\n  # Bash\n  cilium-idmig completions bash > /etc/bash_completion.d/cilium-idmig\n  # Zsh, into a folder on $fpath\n  cilium-idmig completions zsh > ~/.zfunc/_cilium-idmig\n\nExit status:\n  0  printed\n  2  usage";
    pub const MAN: &str = "Examples:\n  # The tool's page\n  cilium-idmig man > /usr/local/share/man/man1/cilium-idmig.1\n  # A command's page\n  cilium-idmig man apply > /usr/local/share/man/man1/cilium-idmig-apply.1\n\nExit status:\n  0  printed\n  2  usage: no such command";
    pub const SANDBOX: &str = "Examples:\n  # Serve it, with a kubeconfig for kubectl\n  cilium-idmig sandbox --port 8080 --kubeconfig-out sandbox.kubeconfig\n  # Without the CRD, to see a first migration install it\n  cilium-idmig sandbox --no-crd\n\nExit status:\n  0  stopped by Ctrl-C\n  1  the server failed\n  2  usage: bad flags, a port in use";
}

#[derive(Parser)]
#[command(
    name = "cilium-idmig",
    version,
    long_version = LONG_VERSION,
    about = "Migrate Cilium security identities from the etcd kvstore to CiliumIdentity resources",
    after_long_help = examples::MAIN,
    // The interactive migrator's flags belong to it: before a command they would be
    // silently ignored, so they are refused there instead.
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Without a command, opens the interactive migrator with these flags.
    #[command(flatten)]
    pub tui: TuiArgs,
    #[command(subcommand)]
    pub command: Option<CliCommand>,
}

/// Who runs a command that records decisions (the decision log, the plan). Not global:
/// `sandbox`, `man` and `completions` record nothing and do not take it.
#[derive(Args, Clone, Default)]
pub struct Operator {
    /// Who is running the migration, for the decision log and the plan (a shared account's
    /// person); by default the user behind sudo, else the account.
    #[arg(long, env = "CILIUM_IDMIG_OPERATOR")]
    pub operator: Option<String>,
}

/// Where a command's logs go. Not global: `man` and `completions` only print.
#[derive(Args, Clone)]
pub struct Logging {
    /// Write logs to this file (tracing-appender); otherwise warnings go to stderr.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Log filter, e.g. info or cilium_idmig=debug.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log_level: String,
}

impl Default for Logging {
    fn default() -> Self {
        Logging {
            log_file: None,
            log_level: "info".into(),
        }
    }
}

impl Cli {
    /// The command to run: the one named, else the interactive migrator.
    pub fn into_command(self) -> CliCommand {
        self.command.unwrap_or(CliCommand::Tui(self.tui))
    }
}

impl CliCommand {
    /// The operator named on the command line, for the commands that record decisions.
    pub fn operator(&self) -> Option<&str> {
        let who = match self {
            CliCommand::Tui(a) => &a.who,
            CliCommand::Demo(a) => &a.who,
            CliCommand::Sync(a) => &a.who,
            CliCommand::Plan { who, .. }
            | CliCommand::Apply { who, .. }
            | CliCommand::Rollback { who, .. }
            | CliCommand::SwitchPrepare { who, .. } => who,
            _ => return None,
        };
        who.operator.as_deref()
    }

    /// Where logs go; `None` for the commands that only print (`man`, `completions`).
    pub fn logging(&self) -> Option<&Logging> {
        match self {
            CliCommand::Tui(a) => Some(&a.log),
            CliCommand::Demo(a) => Some(&a.log),
            CliCommand::Sync(a) => Some(&a.log),
            CliCommand::Plan { log, .. }
            | CliCommand::Apply { log, .. }
            | CliCommand::Rollback { log, .. }
            | CliCommand::Audit { log, .. }
            | CliCommand::SwitchReport { log, .. }
            | CliCommand::Fleet { log, .. }
            | CliCommand::SwitchPrepare { log, .. }
            | CliCommand::Verify { log, .. }
            | CliCommand::Sandbox { log, .. } => Some(log),
            CliCommand::Completions { .. } | CliCommand::Man { .. } | CliCommand::Log { .. } => {
                None
            }
        }
    }
}

/// The interactive migrator's flags, both as `tui` and as the default with no command.
#[derive(Args, Clone, Default)]
pub struct TuiArgs {
    #[command(flatten)]
    pub conn: Conn,
    #[command(flatten)]
    pub who: Operator,
    #[command(flatten)]
    pub log: Logging,
    #[command(flatten)]
    pub tuning: Tuning,
    /// Where this session's decisions and outcomes go (appended; created with mode 0600).
    #[arg(long)]
    pub decision_log: Option<PathBuf>,
    /// Resume the decisions recorded in these decision logs (repeatable); each is checked
    /// again against the cluster as it is now, and those that no longer fit are listed.
    #[arg(long)]
    pub resume: Vec<PathBuf>,
    /// Open the rollback of the runs recorded in these decision logs (repeatable) instead of
    /// a migration: review what would be deleted, then type yes.
    #[arg(long, conflicts_with = "resume")]
    pub rollback: Vec<PathBuf>,
    /// A sync started here (`y` after a commit) reserves in the kvstore what Kubernetes holds
    /// and it does not (see `sync --reserve-in-kvstore`); preflight checks the write right.
    #[arg(long, conflicts_with = "rollback")]
    pub reserve_in_kvstore: bool,
    /// The namespace Cilium runs in: the Switch screen reads its cilium-config, as
    /// switch-report does.
    #[arg(long, default_value = "kube-system")]
    pub cilium_namespace: String,
    /// Open the Fleet screen over every context of the kubeconfig (as `--context` given
    /// for each).
    #[arg(long)]
    pub all_contexts: bool,
    /// With several clusters: the etcd config of one cluster's Cilium kvstore, as
    /// CONTEXT=FILE (repeatable); Enter on the Fleet screen opens a cluster that has one.
    #[arg(long, value_name = "CONTEXT=FILE", value_parser = parse_etcd_config_for)]
    pub etcd_config_for: Vec<(String, PathBuf)>,
    /// With several clusters: how long one may take to be read or opened, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `CONTEXT=FILE`: a cluster's context and its kvstore's etcd config.
pub fn parse_etcd_config_for(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((context, file)) if !context.is_empty() && !file.is_empty() => {
            Ok((context.to_string(), PathBuf::from(file)))
        }
        _ => Err(format!(
            "{s:?} is not CONTEXT=FILE: name the kubeconfig context, then its Cilium etcd config file"
        )),
    }
}

#[derive(Subcommand)]
pub enum CliCommand {
    /// The interactive migrator (the default when no command is given).
    #[command(after_long_help = examples::TUI)]
    Tui(TuiArgs),
    /// Read both sides and write the plan; changes nothing.
    #[command(after_long_help = examples::PLAN)]
    Plan {
        #[command(flatten)]
        who: Operator,
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        conn: Conn,
        /// Where to write the plan (a new file, mode 0600); `-o json` prints the plan as
        /// JSON on stdout instead, as kubectl's `-o json` does (a file named `json` is
        /// `./json`).
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Apply a saved plan, or plan and apply in one go.
    #[command(after_long_help = examples::APPLY)]
    Apply {
        #[command(flatten)]
        who: Operator,
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        conn: Conn,
        /// A plan written by `plan` (possibly edited); re-checked against the live cluster.
        #[arg(long)]
        plan: Option<PathBuf>,
        /// Required: apply writes to the cluster.
        #[arg(long)]
        yes: bool,
        /// Apply the decisions recorded in these decision logs (repeatable), replayed onto a
        /// fresh plan the way --plan applies a reviewed plan.
        #[arg(long, conflicts_with = "plan")]
        resume: Vec<PathBuf>,
        /// Accept every remap and duplicate proposal that has no decision.
        #[arg(long)]
        accept_proposals: bool,
        /// Where decisions and outcomes go (appended; created with mode 0600); default
        /// cilium-idmig-decisions-<UTC time>-<pid>.jsonl here.
        #[arg(long)]
        decision_log: Option<PathBuf>,
        #[command(flatten)]
        tuning: Tuning,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete exactly the CiliumIdentity objects that earlier runs created (from their
    /// decision logs), each only if it is still the object the run created; create again,
    /// at its id, what switch-prepare removed, where the id is free. Without --yes it prints
    /// the plan and changes nothing.
    #[command(
        group(clap::ArgGroup::new("runs").required(true).multiple(true)),
        after_long_help = examples::ROLLBACK
    )]
    Rollback {
        #[command(flatten)]
        who: Operator,
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        conn: K8sConn,
        /// Decision logs of the runs to roll back (repeatable); the rollback's own decisions
        /// and outcomes are appended to the last one.
        #[arg(long, num_args = 1.., group = "runs")]
        decision_log: Vec<PathBuf>,
        /// A run to roll back by the annotation on its objects (repeatable), when its log
        /// is lost: the id from the log's session line or an object's
        /// `cilium-idmig.io/run` annotation. Each object is still checked (uid, labels) and
        /// deleted with preconditions.
        #[arg(long, value_name = "RUN_ID", group = "runs")]
        run: Vec<String>,
        /// Required to delete anything.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        tuning: Tuning,
        /// Print the plan (without --yes) or the report (with it) as JSON.
        #[arg(long)]
        json: bool,
        /// Delete identities that live endpoints use too. Without it they are kept and
        /// listed: deleting one makes its agents create it again and leaves its endpoints
        /// without an identity meanwhile.
        #[arg(long)]
        include_in_use: bool,
    },
    /// Audit both identity stores by labels: ids that hold two label sets (split), label
    /// sets under different ids on the two sides (double), duplicates inside one store, ids
    /// on one side only, value/ keys whose id holds other labels (stale-value), objects the
    /// operator's GC marked while in use (gc-marked). Each finding names its nodes, its
    /// endpoints and what to do. Works before, during and after a migration, and on
    /// Cilium 1.17+ double-write clusters. Writes nothing. Exit 0 clean, 1 findings.
    #[command(after_long_help = examples::AUDIT)]
    Audit {
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        conn: Conn,
        /// How the report is printed (json: one object with `counts` and `findings`).
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
        /// Audit again and again (every --every) until stopped, printing the counts when they
        /// change; with --status-addr, export them as cilium_idmig_audit_findings{kind}.
        #[arg(long)]
        watch: bool,
        /// With --watch: serve /healthz and Prometheus /metrics here, e.g. 127.0.0.1:9465.
        #[arg(long, requires = "watch")]
        status_addr: Option<std::net::SocketAddr>,
        /// With --watch: how long between audits.
        #[arg(long, default_value = "30s", value_parser = parse_duration, requires = "watch")]
        every: Duration,
        /// Decision logs whose recorded remaps, reuses and skips explain findings (as verify
        /// reads them): those are listed as decided, not counted as findings.
        #[arg(long, num_args = 1..)]
        decision_log: Vec<PathBuf>,
    },
    /// Where every cluster's migration stands, one row per cluster: Cilium's version and
    /// identity modes, its identities, the standing its sync publishes and how old it is,
    /// what needs attention. Clusters are read side by side, each within --timeout; one that
    /// hangs or refuses is a row that says so. Reads only.
    #[command(after_long_help = examples::FLEET)]
    Fleet {
        #[command(flatten)]
        log: Logging,
        /// kubeconfig files to read clusters from (repeatable; default: KUBECONFIG, then
        /// ~/.kube/config).
        #[arg(long)]
        kubeconfig: Vec<PathBuf>,
        /// Contexts to read (repeatable; default: each file's current context).
        #[arg(long, conflicts_with = "all_contexts")]
        context: Vec<String>,
        /// The etcd config of one cluster's Cilium kvstore, as CONTEXT=FILE (repeatable):
        /// its identities are counted beside Kubernetes'.
        #[arg(long, value_name = "CONTEXT=FILE", value_parser = parse_etcd_config_for)]
        etcd_config_for: Vec<(String, PathBuf)>,
        /// Where Cilium keeps identities in each kvstore named.
        #[arg(long, default_value = DEFAULT_PREFIX)]
        kvstore_prefix: String,
        /// Read every context of the kubeconfig files.
        #[arg(long)]
        all_contexts: bool,
        /// How long one cluster may take, e.g. 10s.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        timeout: Duration,
        /// Also say what the switch to operator-managed identities would do (switch-report's
        /// verdict, counts only; reads every pod).
        #[arg(long)]
        switch: bool,
        /// The namespace Cilium runs in (its cilium-config and DaemonSet).
        #[arg(long, default_value = "kube-system")]
        cilium_namespace: String,
        /// Where sync's Lease is (its standing is beside it), as sync's --lease-namespace.
        #[arg(long, default_value = "kube-system")]
        lease_namespace: String,
        /// The name of sync's Lease, as sync's --lease-name: its standing is `<name>-status`.
        #[arg(long, default_value = "cilium-idmig-sync")]
        lease_name: String,
        /// How the fleet is printed (json: one object per cluster).
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Before switching to operator-managed identities (Cilium 1.18's
    /// identity-management-mode: operator): for every pod, the labels the operator will
    /// compute and whether it adopts the pod's identity, finds two, or draws a new id at
    /// random; every identity no pod and no endpoint uses (a draw can rewrite it). Reads
    /// Kubernetes only (pods, namespaces, cilium-config, identities, endpoints); writes
    /// nothing. Exit 0 safe, 1 findings.
    #[command(after_long_help = examples::SWITCH_REPORT)]
    SwitchReport {
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        k8s: K8sConn,
        /// The namespace Cilium runs in: its cilium-config names the cluster and the
        /// identity label patterns the operator computes with.
        #[arg(long, default_value = "kube-system")]
        cilium_namespace: String,
        /// How the report is printed (json: `settings`, `counts`, every pod and every
        /// unused identity).
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Prepare the switch to operator-managed identities so that it draws nothing: for each
    /// label set the operator will compute that no identity holds exactly, create one at an
    /// id nothing holds (no identity, endpoint or kvstore key, sync's reservations
    /// included); of duplicates this tool created, keep the one endpoints use and remove the
    /// others. Never touches an identity it did not create, and writes nothing while a node
    /// still allocates from the kvstore. Without --yes it prints the plan and changes
    /// nothing.
    #[command(after_long_help = examples::SWITCH_PREPARE)]
    SwitchPrepare {
        #[command(flatten)]
        who: Operator,
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        conn: Conn,
        /// The namespace Cilium runs in (its cilium-config), as for switch-report.
        #[arg(long, default_value = "kube-system")]
        cilium_namespace: String,
        /// Required to create or remove anything.
        #[arg(long)]
        yes: bool,
        /// Prepare even though something that decides ids or labels was assumed (no
        /// cilium-config found, a label-prefix-file): --yes refuses without it, naming each.
        #[arg(long)]
        assume_defaults: bool,
        /// Also remove the identities this tool created that no pod and no endpoint uses,
        /// once they are at least this old (e.g. 24h); also the age a duplicate of this tool
        /// must reach before it goes (else 1h).
        #[arg(long, value_parser = parse_duration)]
        remove_unused_after: Option<Duration>,
        /// Where decisions and outcomes go (appended; created with mode 0600); default
        /// cilium-idmig-decisions-<UTC time>-<pid>.jsonl here. `rollback` with this log
        /// removes what the preparation created.
        #[arg(long)]
        decision_log: Option<PathBuf>,
        #[command(flatten)]
        tuning: Tuning,
        /// How the plan and the outcome are printed.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Check that every valid kvstore identity has its CiliumIdentity.
    #[command(after_long_help = examples::VERIFY)]
    Verify {
        #[command(flatten)]
        log: Logging,
        #[command(flatten)]
        conn: Conn,
        /// Decision log(s) whose recorded mappings count as the expected ids: repeat the
        /// flag or list several after it (a shell glob such as
        /// `cilium-idmig-decisions-*.jsonl`).
        #[arg(long, num_args = 1..)]
        decision_log: Vec<PathBuf>,
        /// How the report is printed.
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// The interactive migrator on the embedded sandbox: an in-memory kvstore and the
    /// in-process API server, seeded with generated identities of every kind. Needs no etcd,
    /// no Kubernetes, no network.
    #[command(after_long_help = examples::DEMO)]
    Demo(DemoArgs),
    /// Carry the cluster through the rollout window: apply what is decided, then follow both
    /// sides, mirror every new kvstore identity within seconds, report conflicts and split
    /// allocations, and know when cutover is reached.
    #[command(after_long_help = examples::SYNC)]
    Sync(SyncArgs),
    /// Print decision logs as they are (whole lines only, each log checked to read as one),
    /// or with --decisions-only the decisions in force alone: a compact log that
    /// `sync --decisions` and `--resume` take, small enough for a ConfigMap. Reads only.
    #[command(after_long_help = examples::LOG)]
    Log {
        /// The decision logs, read in order (later decisions and undos win).
        #[arg(required = true, value_name = "DECISION_LOG")]
        files: Vec<PathBuf>,
        /// Only the decisions in force: one line per identity, no outcomes.
        #[arg(long)]
        decisions_only: bool,
        /// Check the logs, then wait for a stop signal instead of printing: a pod of an
        /// image without a shell stays up for `kubectl exec POD -- cilium-idmig log FILE`.
        #[arg(long, conflicts_with = "decisions_only")]
        hold: bool,
    },
    /// Print a shell completion script (e.g. `cilium-idmig completions bash > /etc/bash_completion.d/cilium-idmig`).
    #[command(after_long_help = examples::COMPLETIONS)]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff): the tool's, e.g. `cilium-idmig man > cilium-idmig.1`,
    /// or a command's, e.g. `cilium-idmig man apply > cilium-idmig-apply.1`.
    #[command(after_long_help = examples::MAN)]
    Man {
        /// The command whose page to print (cilium-idmig-COMMAND(1)).
        command: Option<String>,
    },
    /// Serve the sandbox API server on 127.0.0.1 until Ctrl-C, for trying other tools against it.
    #[command(after_long_help = examples::SANDBOX)]
    Sandbox {
        #[command(flatten)]
        log: Logging,
        /// Port on 127.0.0.1 to serve on (0 picks a free one, printed at start).
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

/// Both ends: the kvstore and Kubernetes.
#[derive(Args, Clone, Default)]
pub struct Conn {
    #[command(flatten)]
    pub etcd: EtcdConn,
    #[command(flatten)]
    pub k8s: K8sConn,
}

/// Where Cilium's kvstore is.
#[derive(Args, Clone, Default)]
pub struct EtcdConn {
    /// etcd endpoints, comma-separated.
    #[arg(long, value_delimiter = ',', env = "CILIUM_IDMIG_ETCD_ENDPOINTS")]
    pub etcd_endpoints: Vec<String>,
    /// Cilium's etcd config file (endpoints, trusted-ca-file, cert-file, key-file, username, password).
    #[arg(long)]
    pub etcd_config: Option<PathBuf>,
    /// Where Cilium keeps identities in etcd; change it only if Cilium was set up with
    /// another kvstore prefix.
    #[arg(long, default_value = DEFAULT_PREFIX)]
    pub kvstore_prefix: String,
    /// Keys per etcd read (read in pages at one revision): etcd 3.4 caps a response at
    /// 4 MiB, so lower it for clusters with very large label keys.
    #[arg(long, default_value_t = 2000)]
    pub etcd_page_size: i64,
}

/// Which cluster: the API server and the identity range (all `rollback` needs).
#[derive(Args, Clone, Default)]
pub struct K8sConn {
    /// kubeconfig file (default: KUBECONFIG, ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context to use (default: the kubeconfig's current context). `tui` takes
    /// it more than once and opens the Fleet screen over those clusters.
    #[arg(long)]
    pub context: Vec<String>,
    /// Cilium cluster ID (0..=255, or 0..=511 with --max-connected-clusters 511); sets the identity range.
    #[arg(long, default_value_t = 0)]
    pub cluster_id: u32,
    /// Read every Kubernetes list as a quorum read from etcd, even where a read from the API
    /// server's watch cache would do (checks such as verify always read consistently).
    #[arg(long)]
    pub consistent_reads: bool,
    /// Cilium's max-connected-clusters (1.15+): 255 (the default) or 511, as the mesh was
    /// installed; 511 gives the cluster ID 9 bits, so cluster 0 allocates 256..=32767.
    #[arg(long, default_value = "255")]
    pub max_connected_clusters: MaxConnectedClusters,
}

#[derive(Args, Clone, Default)]
pub struct Tuning {
    /// Creates in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Client-side request rate limit; 0 leaves pacing to the API server (429 + Retry-After).
    #[arg(long, default_value_t = 0.0)]
    k8s_qps: f64,
    /// With --k8s-qps: requests allowed at once before the rate limit paces them.
    #[arg(long, default_value_t = 100)]
    k8s_burst: u32,
    /// Deadline of one request, e.g. 30s, 500ms, 2m.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub op_timeout: Duration,
    /// Attempts per identity before it is reported failed.
    #[arg(long, default_value_t = 8)]
    pub max_attempts: u32,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
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
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{s:?} is not a duration this tool can count (too long or negative)"))
}

impl Conn {
    pub fn etcd(&self) -> EtcdOptions {
        let e = &self.etcd;
        EtcdOptions {
            endpoints: e.etcd_endpoints.clone(),
            config_file: e.etcd_config.clone(),
            prefix: e.kvstore_prefix.clone(),
            page_size: e.etcd_page_size,
            ..Default::default()
        }
    }
    pub fn scope(&self) -> cilium_idmig::Result<ClusterScope> {
        self.k8s.scope()
    }
    pub async fn target(&self) -> cilium_idmig::Result<K8sTarget> {
        self.k8s.target().await
    }
}

impl K8sConn {
    pub fn scope(&self) -> cilium_idmig::Result<ClusterScope> {
        ClusterScope::new(self.cluster_id, self.max_connected_clusters)
            .map_err(cilium_idmig::Error::Config)
    }
    /// The one context named, if any: only `tui` opens several (its Fleet screen).
    pub fn one_context(&self) -> cilium_idmig::Result<Option<String>> {
        match self.context.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.clone())),
            many => Err(cilium_idmig::Error::Config(format!(
                "--context is given {} times ({}): this command works on one cluster; pass one, or use `tui` or `fleet` for several",
                many.len(),
                many.join(", ")
            ))),
        }
    }
    pub async fn target(&self) -> cilium_idmig::Result<K8sTarget> {
        let mut target = K8sTarget::connect(&K8sOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.one_context()?,
        })
        .await?;
        target.consistent_reads = self.consistent_reads;
        Ok(target)
    }
}

impl Tuning {
    pub fn options(&self) -> ApplyOptions {
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

/// A rollout speed: a positive factor, at most 1000.
pub fn parse_speed(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1000.0 => Ok(x),
        _ => Err(format!(
            "{s:?} is not a speed: a factor above 0 and at most 1000 (1 plays the rollout in about two minutes)"
        )),
    }
}

/// How a report is printed: a typo is refused by the parser, never printed as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// The flags of `demo`.
#[derive(Args, Clone)]
pub struct DemoArgs {
    #[command(flatten)]
    pub who: Operator,
    #[command(flatten)]
    pub log: Logging,
    /// Identities of the generated cluster, of every kind (conflicts and malformed entries
    /// included).
    #[arg(long, default_value_t = 2000)]
    pub identities: usize,
    /// Seed of the generated cluster and of its rollout: the same seed, the same world.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the demo's decision log goes.
    #[arg(long)]
    pub decision_log: Option<PathBuf>,
    /// Serve the sandbox API server on this port (0 picks one), e.g. to inspect it with kubectl.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Run plan, apply (accepting every proposal) and verify without the TUI.
    #[arg(long)]
    pub headless: bool,
    /// Latency the sandbox adds to every identity request, to feel a slow API server (e.g. 20ms).
    #[arg(long, value_parser = parse_duration)]
    pub sandbox_latency: Option<Duration>,
    /// Rehearse on your own cluster's identities: a kvstore dump made with
    /// `etcdctl get --prefix cilium/state/identities/v1 -w json > kvstore.json`
    /// (read-only), loaded instead of generated data.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["identities", "seed"])]
    pub from_snapshot: Option<PathBuf>,
    /// With --from-snapshot: the cluster's CiliumIdentity objects, dumped with
    /// `kubectl get ciliumidentities -o json > identities.json` (read-only).
    #[arg(long, value_name = "FILE", requires = "from_snapshot")]
    pub k8s_snapshot: Option<PathBuf>,
    /// With --from-snapshot: the kvstore prefix the dump's keys are under, when Cilium was
    /// set up with another than the default (the rehearsal keeps them under the default).
    #[arg(long, value_name = "PREFIX", requires = "from_snapshot")]
    pub kvstore_prefix: Option<String>,
    /// Kvstore-mode nodes of the generated cluster; the rollout moves them to CRD mode
    /// one by one once sync runs.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes: u32,
    /// How fast the rollout plays: 1 takes about two minutes from sync's start to cutover,
    /// 10 about half a minute (the nodes move ten times faster; the demo's 5 s cutover grace
    /// and sync's checks do not).
    #[arg(long, default_value_t = 1.0, value_parser = parse_speed)]
    pub rollout_speed: f64,
    /// With --headless: after the apply, follow the rollout with sync (every proposal
    /// accepted) until cutover.
    #[arg(long, requires = "headless")]
    pub sync: bool,
    /// The demo's sync reserves in the kvstore (see `sync --reserve-in-kvstore`): the
    /// same rollout without split allocations.
    #[arg(long)]
    pub reserve_in_kvstore: bool,
}

/// The flags of `sync`.
#[derive(Args, Clone)]
pub struct SyncArgs {
    #[command(flatten)]
    pub who: Operator,
    #[command(flatten)]
    pub log: Logging,
    #[command(flatten)]
    pub conn: Conn,
    /// Where decisions and outcomes go; a restart with the same log resumes its decisions.
    #[arg(long)]
    pub decision_log: Option<PathBuf>,
    /// Also resume the decisions recorded in these decision logs (repeatable).
    #[arg(long)]
    pub resume: Vec<PathBuf>,
    /// Decisions made elsewhere (`cilium-idmig log --decisions-only`, e.g. a mounted
    /// ConfigMap): read at the start, then again whenever the file changes, each change
    /// carried out while sync runs. No file yet means no decisions yet.
    #[arg(long, value_name = "FILE")]
    pub decisions: Option<PathBuf>,
    /// Decide remaps and duplicates as proposed; otherwise they wait for a decision.
    #[arg(long)]
    pub accept_proposals: bool,
    /// End at cutover (no value/ key left, nothing pending, verify passes), exit 0; a stop
    /// (SIGINT, SIGTERM, SIGHUP) before it also exits 0 unless a write failed.
    #[arg(long)]
    pub until_cutover: bool,
    /// Serve /healthz and Prometheus /metrics here, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub status_addr: Option<std::net::SocketAddr>,
    /// How long no kvstore-mode node (no value/ key) must be seen before cutover: an
    /// agent's keys can linger until its lease lapses (Cilium's is 15 minutes at most).
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub cutover_grace: Duration,
    /// Prevent split allocations: reserve in the kvstore every id Kubernetes holds and it
    /// does not (a master key and a value/ key of the tool's own, on its lease), so
    /// kvstore-mode agents neither hand the id out for other labels nor allocate a second
    /// id for those labels. The only way this tool ever writes to etcd; needs readwrite
    /// on the identities prefix. Released at cutover.
    #[arg(long)]
    pub reserve_in_kvstore: bool,
    /// With --reserve-in-kvstore: on a clean stop before cutover, release the
    /// reservations too (otherwise they lapse with the lease, 15 minutes after the stop).
    #[arg(long, requires = "reserve_in_kvstore")]
    pub release_reservations: bool,
    /// Namespace of the one-writer Lease: only the sync that holds it writes; a second
    /// sync follows and waits, and takes over within 15 s when the first dies.
    #[arg(long, value_name = "NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,
    /// Name of the one-writer Lease.
    #[arg(long, value_name = "NAME", default_value = "cilium-idmig-sync")]
    pub lease_name: String,
    #[command(flatten)]
    pub tuning: Tuning,
}
