//! `sync`: the rollout window followed headless, its status line, and how it ends.

use super::*;

/// `sync`, from its flags.
pub(super) async fn sync_command(args: SyncArgs) -> anyhow::Result<Exit> {
    let SyncArgs {
        conn,
        decision_log,
        resume,
        accept_proposals,
        until_cutover,
        status_addr,
        cutover_grace,
        reserve_in_kvstore,
        release_reservations,
        lease_namespace,
        lease_name,
        tuning,
        decisions,
        ..
    } = args;
    let world = World::of(&conn).await?;
    let opts = cilium_idmig::app::sync::SyncOptions {
        decisions_file: decisions,
        accept_proposals,
        until_cutover,
        cutover_grace,
        reserve_in_kvstore,
        release_reservations,
        lease: cilium_idmig::app::lease::LeaseOptions {
            namespace: lease_namespace,
            name: lease_name,
            ..Default::default()
        },
    };
    sync(
        world,
        decision_log,
        resume,
        opts,
        status_addr,
        tuning.options(),
    )
    .await
}

/// `sync`, headless: a status line every few seconds (when it changed), a line per conflict,
/// split allocation or trouble; stop signals end it after the writes in flight.
pub(super) async fn sync(
    world: World,
    log_path: Option<PathBuf>,
    resume: Vec<PathBuf>,
    opts: cilium_idmig::app::sync::SyncOptions,
    status_addr: Option<std::net::SocketAddr>,
    apply: ApplyOptions,
) -> anyhow::Result<Exit> {
    use cilium_idmig::app::metrics::{self, Metrics};
    use cilium_idmig::app::sync as sync_engine;
    use cilium_idmig::apply::executor::StopFlag;
    let log_path = log_path.unwrap_or_else(decision_log::default_path);
    let log = open_log(&log_path)?;
    let cfg = Arc::new(ServiceConfig {
        kv: world.kv,
        target: world.target,
        scope: world.scope,
        log,
        apply,
        command: "sync",
        resume,
        sync_reserve_in_kvstore: opts.reserve_in_kvstore,
        cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
    });
    // One writer per log, before its first line: a second sync on this log is refused
    // without writing anything into the first one's.
    cfg.log.lock_for_one_writer()?;
    cfg.log.begin_session(cfg.session())?;
    let metrics = Arc::new(Metrics::new()?);
    let server = match status_addr {
        Some(addr) => {
            let (bound, task) = metrics::serve(addr, metrics.clone()).await?;
            outln!("status: http://{bound}/healthz and http://{bound}/metrics")?;
            Some(task)
        }
        None => None,
    };
    let stop = StopFlag::default();
    let (tx, mut rx) = tokio::sync::mpsc::channel(256);
    let engine = tokio::spawn(sync_engine::run(
        cfg.clone(),
        opts,
        metrics,
        tx,
        stop.clone(),
        None,
    ));
    let mut signals = cilium_idmig::app::signals::StopSignals::new()?;
    let mut shown = Shown::default();
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => shown.show(ev),
                None => break,
            },
            sig = signals.recv() => {
                eprintln!("{}: no new writes; waiting for those in flight", sig.name());
                stop.stop();
            }
        }
    }
    let end = engine.await.context("the sync engine stopped")??;
    if let Some(task) = server {
        task.abort();
    }
    print_end(&end, &log_path)
}

/// What the headless sync has shown: the last status line and when, whether both sides are
/// read, and the malformed entries of the first read (said once, as a count).
#[derive(Default)]
struct Shown {
    status: String,
    status_at: Option<std::time::Instant>,
    /// Until both sides are read, a status has nothing to count: "0 identities, no node
    /// left" would be wrong.
    following: bool,
    /// The malformed entries of the first read are said once, as a count (`plan` lists
    /// each); those that arrive later, one by one.
    invalid_at_start: Vec<(String, String)>,
}

impl Shown {
    /// Prints one event of sync: a status line when it changed (or every 30 s), a line per
    /// conflict, split allocation, malformed entry or note, troubles on stderr.
    fn show(&mut self, ev: cilium_idmig::app::sync::SyncEvent) {
        use cilium_idmig::app::sync::{self as sync_engine, SyncEvent};
        if self.following && !matches!(ev, SyncEvent::Invalid { .. }) {
            self.say_invalid_read();
        }
        match ev {
            SyncEvent::Status(s) => {
                let line = status_line(self.following, &s);
                let stale = self
                    .status_at
                    .is_none_or(|t| t.elapsed() > std::time::Duration::from_secs(30));
                if line != self.status || stale {
                    let _ = outln!("{line}");
                    self.status = line;
                    self.status_at = Some(std::time::Instant::now());
                }
            }
            SyncEvent::Conflict { id, kind, reason } => {
                let _ = outln!("conflict: {id} is a {kind} and waits for a decision: {reason}");
            }
            SyncEvent::Split(split) => {
                for line in split.lines() {
                    let _ = outln!("{line}");
                }
            }
            // Those of a whole read are one count, said once the next thing is.
            SyncEvent::Invalid {
                id,
                reason,
                at_read,
            } if at_read || !self.following => {
                self.invalid_at_start.push((id, reason));
            }
            SyncEvent::Invalid { id, reason, .. } => {
                let _ = outln!("invalid: {id}: {reason}");
            }
            SyncEvent::Following => self.following(),
            SyncEvent::Trouble(t) => eprintln!("retrying: {t}"),
            SyncEvent::Note(n) => {
                let _ = outln!("{n}");
            }
            SyncEvent::Moot { id, labels } => {
                let _ = outln!("{}", sync_engine::moot_text(&id, &labels));
            }
            SyncEvent::Cutover(report) => {
                let _ = outln!("{report}");
                let _ = outln!(
                    "next: `verify --decision-log` with every log of the migration, keep the logs with the change record, then retire the kvstore"
                );
            }
            // Node counts are for the screens; the status line carries the node total.
            SyncEvent::NodeCounts(_) => {}
        }
    }

    /// Both sides are read: the malformed entries of a read so far as one count, then
    /// following.
    fn following(&mut self) {
        self.following = true;
        self.say_invalid_read();
        let _ = outln!("sync started: following both sides");
    }

    /// The malformed entries a whole read found, as one count (`plan` lists each).
    fn say_invalid_read(&mut self) {
        if let Some((id, reason)) = self.invalid_at_start.first() {
            let n = self.invalid_at_start.len();
            let _ = outln!(
                "invalid: {n} malformed {} in the kvstore, never written (the first: {id}: {reason}); `plan` lists each",
                if n == 1 { "entry" } else { "entries" }
            );
            self.invalid_at_start.clear();
        }
    }
}

/// How sync ended, said: its last status, what is left before cutover, the writes it still
/// owes, and the exit (a stop with nothing failing is a success).
fn print_end(
    end: &cilium_idmig::app::sync::SyncEnd,
    log_path: &std::path::Path,
) -> anyhow::Result<Exit> {
    outln!("{}", end.status)?;
    // Said on every stop before cutover, with --until-cutover or without: what is left.
    if !end.cutover {
        outln!(
            "cutover not reached: {}, {}; run sync again to go on",
            count(end.status.kvstore_nodes, "kvstore-mode node"),
            count(end.status.pending, "pending decision")
        )?;
    }
    if end.unwritten > 0 {
        outln!(
            "{} writes failed and were not made before the stop; run sync again to make them",
            end.unwritten
        )?;
    }
    outln!("decision log: {}", log_path.display())?;
    // A stop (SIGINT, SIGTERM, SIGHUP) with nothing left failing is a success,
    // `--until-cutover` included: a service manager must not read a normal shutdown as a
    // crash, nor an outage that sync outlived and caught up.
    Ok(if end.cutover || end.unwritten == 0 {
        Exit::Ok
    } else {
        Exit::Failed
    })
}

/// Sync's status line: its counts once both sides are read, and until then that it reads
/// them (its counts would say "0 identities" and "no kvstore-mode node left").
pub(super) fn status_line(following: bool, s: &cilium_idmig::app::sync::SyncStatus) -> String {
    if following {
        s.to_string()
    } else {
        "sync: reading the kvstore and Kubernetes".to_string()
    }
}
