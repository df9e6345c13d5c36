//! `demo` and `sandbox`: the embedded sandbox and its world, in the TUI or headless.

use super::*;

/// `demo`: the embedded sandbox's world, in the TUI or headless (then, with `--sync`, the
/// rollout followed to cutover).
pub(super) async fn demo_command(args: DemoArgs) -> anyhow::Result<Exit> {
    let DemoArgs {
        identities,
        seed,
        decision_log,
        port,
        headless,
        sandbox_latency,
        from_snapshot,
        k8s_snapshot,
        kvstore_prefix,
        nodes,
        rollout_speed,
        sync: then_sync,
        reserve_in_kvstore,
        ..
    } = args;
    let what = match &from_snapshot {
        Some(p) => format!("a rehearsal on the identities in {}", p.display()),
        None => format!("{identities} generated identities (seed {seed})"),
    };
    let cfg = DemoConfig {
        identities,
        seed,
        port,
        latency: sandbox_latency,
        kvstore_dump: from_snapshot,
        k8s_dump: k8s_snapshot,
        dump_prefix: kvstore_prefix,
        nodes,
    };
    let demo = demo::world(cfg).await?;
    if demo.leases.is_empty() {
        eprintln!(
            "note: the kvstore holds no value/ keys: no node uses its identities (a dump of id/ alone reads the same: dump the whole prefix to see the nodes)"
        );
    }
    let world = || -> anyhow::Result<World> {
        Ok(World {
            kv: demo.kv_source(),
            target: K8sTarget::from_url(&demo.sandbox.url())?,
            scope: ClusterScope::new(0, MaxConnectedClusters::default())
                .map_err(cilium_idmig::Error::Config)?,
            cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
        })
    };
    // The rollout plays once sync follows the kvstore (`y` after a commit, or --sync).
    let (rollout_tx, rollout_rx) = tokio::sync::mpsc::channel(64);
    let rollout = tokio::spawn(rollout::run(
        demo.kv.clone(),
        demo.sandbox.agent(),
        demo.leases.clone(),
        RolloutConfig {
            speed: rollout_speed,
            ..Default::default()
        },
        rollout_tx,
    ));
    let result = if headless {
        outln!(
            "demo: {what} against the sandbox API server at {}\n",
            demo.sandbox.url()
        )?;
        let log_path = decision_log.unwrap_or_else(decision_log::default_path);
        let exit = demo_headless(world()?, log_path.clone()).await?;
        if then_sync {
            follow_the_rollout(world()?, log_path, rollout_rx, reserve_in_kvstore).await
        } else {
            Ok(exit)
        }
    } else {
        let opts = ApplyOptions::default();
        let session = Session {
            reserve_in_kvstore,
            ..Session::default()
        };
        interactive(world()?, decision_log, opts, session, Finish::Demo).await
    };
    rollout.abort();
    result
}

/// `demo --headless --sync`: sync follows the rollout to cutover, every proposal accepted,
/// with what the simulated cluster does printed beside what sync reports.
async fn follow_the_rollout(
    world: World,
    log_path: PathBuf,
    mut rollout_rx: tokio::sync::mpsc::Receiver<String>,
    reserve_in_kvstore: bool,
) -> anyhow::Result<Exit> {
    outln!("\nsync: following the rollout until cutover (every proposal accepted) ...")?;
    tokio::spawn(async move {
        while let Some(line) = rollout_rx.recv().await {
            let _ = outln!("{line}");
        }
    });
    let opts = cilium_idmig::app::sync::SyncOptions {
        accept_proposals: true,
        until_cutover: true,
        reserve_in_kvstore,
        ..Default::default()
    };
    sync(
        world,
        Some(log_path),
        Vec::new(),
        opts,
        None,
        ApplyOptions::default(),
    )
    .await
}

/// `sandbox`: the sandbox API server until Ctrl-C.
pub(super) async fn sandbox(
    port: u16,
    kubeconfig_out: Option<PathBuf>,
    no_crd: bool,
) -> anyhow::Result<Exit> {
    let sb = Sandbox::start(SandboxConfig {
        port,
        with_crd: !no_crd,
        ..Default::default()
    })
    .await?;
    if let Some(p) = &kubeconfig_out {
        sb.write_kubeconfig(p)?;
        outln!("kubeconfig written to {}", p.display())?;
    }
    outln!(
        "sandbox API server listening on {} (Ctrl-C to stop)",
        sb.url()
    )?;
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(Exit::Ok)
}

/// `demo --headless`: plan, apply with every proposal accepted, verify.
pub(super) async fn demo_headless(world: World, log_path: PathBuf) -> anyhow::Result<Exit> {
    let scan = flows::scan(&world.kv, &world.target, world.scope.range).await?;
    out!(
        "{}",
        report::plan_summary(&flows::plan_file(scan, &world.target, world.scope))
    )?;
    outln!("\napplying with --accept-proposals ...")?;
    // Kept for the verification after the apply, which consumes the world.
    let (kv, target, range) = (world.kv.clone(), world.target.clone(), world.scope.range);
    let spec = ApplySpec {
        plan: None,
        resume: Vec::new(),
        accept_proposals: true,
        options: ApplyOptions::default(),
    };
    let exit = apply(world, spec, Some(log_path.clone()), false).await?;
    let mappings = flows::expectations_from_logs(std::slice::from_ref(&log_path))?;
    let report = flows::verify(&kv, &target, range, &mappings).await?;
    outln!()?;
    print_verify(&report, false)?;
    Ok(if report.passed() { exit } else { Exit::Failed })
}
