//! The engine service the TUI drives: preflight, scan, drift, commit, export, against a real
//! etcd and the sandbox.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use cilium_idmig::app::service::{
    self, ServiceConfig, ServiceEvent as Event, ServiceRequest as Request,
};
use cilium_idmig::apply::executor::ApplyOptions;
use cilium_idmig::core::range::ClusterScope;
use cilium_idmig::io::decision_log::DecisionLog;
use cilium_idmig::io::etcd::{Drift, EtcdConnection, EtcdOptions};
use cilium_idmig::io::k8s::K8sTarget;
use cilium_idmig::io::kv_source::KvSource;
use cilium_idmig::sandbox::{Sandbox, SandboxConfig};

use crate::harness::Etcd;

const P: &str = "cilium/state/identities/v1";

async fn next(rx: &mut mpsc::Receiver<Event>, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {what} event"));
        let ev = ev.expect("service ended");
        if pred(&ev) {
            return ev;
        }
    }
}

fn opts(etcd: &Etcd) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![etcd.endpoint.clone()],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_scan_drift_commit_and_export() {
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    etcd.put(&format!("{P}/id/301"), b"k8s:app=b;").await;
    let sb = Sandbox::start(SandboxConfig {
        with_crd: false,
        denied: vec![("create".into(), "customresourcedefinitions".into())],
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(DecisionLog::open(&dir.path().join("log.jsonl")).unwrap());
    let service::Handle {
        requests: tx,
        events: mut rx,
        progress,
    } = service::spawn(ServiceConfig {
        kv: KvSource::Etcd(opts(&etcd)),
        target: K8sTarget::from_url(&sb.url()).unwrap(),
        scope: ClusterScope::new(0, Default::default()).unwrap(),
        log,
        apply: ApplyOptions::default(),
        command: "test",
        resume: Vec::new(),
        sync_reserve_in_kvstore: false,
        cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
    });

    tx.send(Request::Preflight).await.unwrap();
    let Event::Preflight(p) =
        next(&mut rx, "preflight", |e| matches!(e, Event::Preflight(_))).await
    else {
        unreachable!()
    };
    assert!(!p.crd_present);
    let crd_rbac = p
        .checks
        .iter()
        .find(|c| c.name.contains("create customresourcedefinitions"))
        .unwrap();
    assert!(crd_rbac.failed());
    assert!(
        crd_rbac
            .fix
            .as_ref()
            .unwrap()
            .contains("assets/clusterrole.yaml")
    );
    assert!(
        p.checks
            .iter()
            .filter(|c| c.name.contains("ciliumidentities"))
            .all(|c| c.status == cilium_idmig::app::preflight::CheckStatus::Ok)
    );
    assert!(
        p.checks
            .iter()
            .any(|c| c.name == "Cilium versions" && c.detail.contains("1.18"))
    );
    assert!(p.checks.iter().any(|c| c.name == "kvstore readable"
        && c.status == cilium_idmig::app::preflight::CheckStatus::Ok
        && c.detail.contains("2 identities")));

    // The details of an identity name the nodes whose value/ keys use it, read from etcd.
    etcd.put(&format!("{P}/value/k8s:app=a;/10.0.0.7"), b"300")
        .await;
    tx.send(Request::NodesUsing {
        id: "300".into(),
        labels: "k8s:app=a;".into(),
    })
    .await
    .unwrap();
    let ev = next(&mut rx, "nodes", |e| matches!(e, Event::NodesUsing { .. })).await;
    let Event::NodesUsing { id, nodes } = ev else {
        unreachable!()
    };
    assert_eq!(
        (id.as_str(), nodes),
        ("300", Some(vec!["10.0.0.7".to_string()]))
    );

    tx.send(Request::Scan { generation: 7 }).await.unwrap();
    let Event::Scanned { generation, scan } =
        next(&mut rx, "scan", |e| matches!(e, Event::Scanned { .. })).await
    else {
        unreachable!()
    };
    assert_eq!(
        (generation, scan.items.len(), scan.crd_present),
        (7, 2, false)
    );

    // Drift: the kvstore changes after the snapshot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    etcd.put(&format!("{P}/id/302"), b"k8s:app=c;").await;
    let ev = next(&mut rx, "drift", |e| matches!(e, Event::Drift { .. })).await;
    assert!(
        matches!(
            ev,
            Event::Drift {
                added: 1,
                removed: 0
            }
        ),
        "{ev:?}"
    );
    etcd.client()
        .await
        .unwrap()
        .delete(format!("{P}/id/300"), None)
        .await
        .unwrap();
    let ev = next(&mut rx, "drift", |e| matches!(e, Event::Drift { .. })).await;
    assert!(
        matches!(
            ev,
            Event::Drift {
                added: 1,
                removed: 1
            }
        ),
        "{ev:?}"
    );

    // Commit what was scanned; the CRD is created first. 300 is gone from the kvstore now
    // and is left alone; 302 appeared after the scan and is not in the decisions.
    // A stop left over from an earlier commit does not stop the next one.
    tx.send(Request::Stop).await.unwrap();
    tx.send(Request::Commit {
        generation: 1,
        items: scan.items.clone(),
    })
    .await
    .unwrap();
    let ev = next(&mut rx, "commit", |e| {
        matches!(e, Event::Committed { .. } | Event::Failed { .. })
    })
    .await;
    let Event::Committed {
        generation: 1,
        run,
        verify,
    } = ev
    else {
        panic!("{ev:?}")
    };
    let report = run.report;
    assert!(report.crd_created);
    // The progress watch holds the final totals.
    let p = *progress.borrow();
    assert_eq!((p.total, p.writes, p.done, p.created), (1, 1, 1, 1));
    assert_eq!(
        report.count(cilium_idmig::core::outcome::Outcome::Created),
        1
    );
    let verify = verify.unwrap();
    assert_eq!(
        verify.problems.len(),
        1,
        "302 was not in the decisions: {verify:?}"
    );
    assert_eq!(verify.problems[0].id, 302);
    assert!(sb.objects().contains_key("301"));

    let export = dir.path().join("export");
    tx.send(Request::Export {
        path: export.clone(),
        items: scan.items.clone(),
    })
    .await
    .unwrap();
    let Event::Exported { paths } = next(&mut rx, "export", |e| {
        matches!(e, Event::Exported { .. } | Event::Failed { .. })
    })
    .await
    else {
        panic!()
    };
    assert_eq!(paths.len(), 2);
    let md = std::fs::read_to_string(dir.path().join("export.md")).unwrap();
    assert!(md.contains("| create | 2 |"), "{md}");
    let jsonl = std::fs::read_to_string(dir.path().join("export.jsonl")).unwrap();
    assert!(jsonl.contains("\"outcome\":\"created\""));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(dir.path().join("export.md"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    // Exporting again never overwrites.
    tx.send(Request::Export {
        path: export,
        items: scan.items,
    })
    .await
    .unwrap();
    let ev = next(&mut rx, "export", |e| {
        matches!(e, Event::Exported { .. } | Event::Failed { .. })
    })
    .await;
    assert!(matches!(ev, Event::Failed { .. }), "{ev:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn drift_watch_reports_compaction_past_the_snapshot() {
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    let conn = EtcdConnection::connect(&opts(&etcd)).await.unwrap();
    let snap = conn.read_snapshot(P, 100).await.unwrap();
    for i in 0..5 {
        etcd.put(&format!("{P}/id/{}", 400 + i), b"k8s:app=x;")
            .await;
    }
    let mut c = etcd.client().await.unwrap();
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, None).await.unwrap();
    let (tx, mut rx) = mpsc::channel(8);
    conn.watch_drift(P, snap.source.revision, tx).await.unwrap();
    match rx.recv().await {
        Some(Drift::Compacted { compact_revision }) => assert_eq!(compact_revision, rev),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_in_place_takes_decisions_made_while_it_runs() {
    use cilium_idmig::app::sync::SyncEvent;
    use cilium_idmig::core::planner::{Action, Kind, PlanItem};
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    sb.seed_identity(
        302,
        &[("k8s:app".to_string(), "squatter".to_string())].into(),
    );
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(DecisionLog::open(&dir.path().join("log.jsonl")).unwrap());
    let service::Handle {
        requests: tx,
        events: mut rx,
        ..
    } = service::spawn(ServiceConfig {
        kv: KvSource::Etcd(opts(&etcd)),
        target: K8sTarget::from_url(&sb.url()).unwrap(),
        scope: ClusterScope::new(0, Default::default()).unwrap(),
        log,
        apply: ApplyOptions::default(),
        command: "test",
        resume: Vec::new(),
        sync_reserve_in_kvstore: false,
        cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
    });
    tx.send(Request::StartSync {
        accept_proposals: false,
    })
    .await
    .unwrap();
    // The first round mirrors what is there; a remap arriving live waits for a decision.
    let start = std::time::Instant::now();
    while !sb.objects().contains_key("300") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "300 not mirrored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    etcd.put(&format!("{P}/id/302"), b"k8s:app=c;").await;
    next(
        &mut rx,
        "a live conflict",
        |e| matches!(e, Event::Sync(SyncEvent::Conflict { id, .. }) if id == "302"),
    )
    .await;
    // The operator decides in the TUI: the decision is logged and sync writes it.
    let decided = PlanItem {
        id: "302".into(),
        labels: "k8s:app=c;".into(),
        kind: Kind::Remap,
        action: Action::Create,
        target_id: Some(7000),
        existing_labels: None,
        labels_present_at: None,
        nodes: 0,
        reason: Default::default(),
        decided: true,
    };
    tx.send(Request::Decided {
        name: "edit",
        item: Box::new(decided),
    })
    .await
    .unwrap();
    while !sb.objects().contains_key("7000") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the decision was not written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        sb.objects()["302"]["security-labels"]["k8s:app"],
        "squatter",
        "never overwritten"
    );
    tx.send(Request::StopSync).await.unwrap();
    next(&mut rx, "sync ended", |e| {
        matches!(e, Event::SyncEnded { .. })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_checks_the_kvstore_write_right_only_when_sync_will_reserve() {
    let etcd = Etcd::start().await;
    etcd.put(&format!("{P}/id/300"), b"k8s:app=a;").await;
    let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let all_keys = || async {
        let mut c = etcd.client().await.unwrap();
        c.get("", Some(etcd_client::GetOptions::new().with_all_keys()))
            .await
            .unwrap()
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
            .collect::<Vec<_>>()
    };
    let before = all_keys().await;
    for reserve in [false, true] {
        let log =
            Arc::new(DecisionLog::open(&dir.path().join(format!("log-{reserve}.jsonl"))).unwrap());
        let service::Handle {
            requests: tx,
            events: mut rx,
            ..
        } = service::spawn(ServiceConfig {
            kv: KvSource::Etcd(opts(&etcd)),
            target: K8sTarget::from_url(&sb.url()).unwrap(),
            scope: ClusterScope::new(0, Default::default()).unwrap(),
            log,
            apply: ApplyOptions::default(),
            command: "test",
            resume: Vec::new(),
            sync_reserve_in_kvstore: reserve,
            cilium_namespace: cilium_idmig::app::switch::CILIUM_NAMESPACE.into(),
        });
        tx.send(Request::Preflight).await.unwrap();
        let Event::Preflight(p) =
            next(&mut rx, "preflight", |e| matches!(e, Event::Preflight(_))).await
        else {
            unreachable!()
        };
        let check = p
            .checks
            .iter()
            .find(|c| c.name.contains("kvstore writable"));
        match reserve {
            false => assert!(check.is_none(), "{check:?}"),
            true => assert_eq!(
                check.map(|c| c.status),
                Some(cilium_idmig::app::preflight::CheckStatus::Ok),
                "{check:?}"
            ),
        }
    }
    // The check's key of the tool's own is gone: the cluster's keys are as they were.
    assert_eq!(all_keys().await, before);
}
