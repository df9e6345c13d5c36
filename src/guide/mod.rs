//! What the guide shows that is drawn from the code: pictures of every TUI screen, drawn by
//! the TUI's own `view` on the demo's data (the demo's world with its default seed, read by
//! the same scan, preflight, apply and audit the demo runs) and written as SVG under
//! `docs/src/screens/`, and the key reference from the key table. The tests fail when the
//! TUI changed and the guide was not written again: `UPDATE_SNAPSHOTS=1 cargo test generated_docs`.

mod keys;
mod svg;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::app::flows::ApplySpec;
use crate::app::service::{ScanResult, ServiceEvent as Event};
use crate::app::sync::{CutoverReport, SplitAllocation, SyncEvent, SyncStatus};
use crate::apply::executor::{StopFlag, Watchers};
use crate::core::planner::Kind;
use crate::core::range::ClusterScope;
use crate::core::sync::CutoverWait;
use crate::io::decision_log::DecisionLog;
use crate::io::k8s::K8sTarget;
use crate::sandbox::demo::{self, DemoConfig};
use crate::tui::model::Model;
use crate::tui::msg::Msg;
use crate::tui::update::{init, update};

/// The size the pictures are drawn at: a common terminal, large enough to read at once.
const WIDTH: u16 = 120;
const HEIGHT: u16 = 35;

fn key(c: char) -> Msg {
    Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

fn code(c: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(c, KeyModifiers::NONE))
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/screens")
}

/// Writes `text` to `path` under UPDATE_SNAPSHOTS, else says whether the file holds it.
fn written(path: &Path, text: &str) -> bool {
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        return true;
    }
    std::fs::read_to_string(path).ok().as_deref() == Some(text)
}

#[test]
fn generated_docs_key_reference_is_the_key_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/reference/keys.md");
    assert!(
        written(&path, &keys::reference()),
        "{} differs from the key table: run UPDATE_SNAPSHOTS=1 cargo test generated_docs",
        path.display()
    );
}

/// Draws the model and writes its picture, or compares it with the one written.
fn picture(name: &str, title: &str, m: &Model, stale: &mut Vec<String>) {
    let mut t = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).unwrap();
    t.draw(|f| crate::tui::view::view(m, f)).unwrap();
    let drawn = svg::to_svg(t.backend().buffer(), title);
    let path = dir().join(format!("{name}.svg"));
    if !written(&path, &drawn) {
        stale.push(path.display().to_string());
    }
}

/// Sync's pictures: started with y and a typed yes, then mid-rollout and at cutover.
fn sync_pictures(
    m: &mut Model,
    after: &ScanResult,
    counts: &crate::core::kvstore::NodeCounts,
    identities: usize,
    stale: &mut Vec<String>,
) {
    update(m, key('y'));
    picture("sync-confirm", "Starting sync: typing yes", m, stale);
    for c in "yes".chars() {
        update(m, key(c));
    }
    update(m, code(KeyCode::Enter));
    // Sync starts with a fresh scan, as the commit ends with one.
    scanned(m, after, counts);
    let sync = |m: &mut Model, e: SyncEvent| update(m, Msg::Engine(Event::Sync(e)));
    sync(m, SyncEvent::Following);
    // What the demo's rollout brings: a kvstore-mode agent and a CRD-mode agent that
    // took one id for two label sets, and a new identity whose id Kubernetes holds.
    sync(
        m,
        SyncEvent::Split(SplitAllocation {
            id: 2043,
            kvstore_labels: "k8s:app=cart;k8s:io.kubernetes.pod.namespace=shop;".into(),
            k8s_labels: "k8s:app=search;k8s:io.kubernetes.pod.namespace=shop;".into(),
            nodes: vec!["node-5".into(), "node-6".into()],
        }),
    );
    sync(
        m,
        SyncEvent::Conflict {
            id: "2051".into(),
            kind: Kind::Remap,
            reason: "id taken in Kubernetes by other labels".into(),
        },
    );
    // A conflict found live is brought in by a rescan.
    scanned(m, after, counts);
    let mid = SyncStatus {
        kvstore_nodes: 2,
        identities: identities + 41,
        mirrored: 41,
        pending: 1,
        splits: 1,
        cutover_wait: Some(CutoverWait::Nodes(2)),
        lag_last: Some(Duration::from_millis(70)),
        lag_p50: Some(Duration::from_millis(55)),
        lag_p99: Some(Duration::from_millis(130)),
        watching: true,
        ..Default::default()
    };
    sync(m, SyncEvent::Status(mid.clone()));
    m.modal = None;
    m.status.clear();
    picture("sync-rollout", "Sync screen mid-rollout", m, stale);
    let done = SyncStatus {
        kvstore_nodes: 0,
        pending: 0,
        splits: 0,
        mirrored: 78,
        identities: identities + 78,
        cutover_wait: None,
        ..mid
    };
    sync(m, SyncEvent::Status(done));
    sync(
        m,
        SyncEvent::Cutover(CutoverReport {
            mirrored: 78,
            mapped: 3,
            skipped: 0,
            moot: 1,
        }),
    );
    m.modal = None;
    m.status.clear();
    picture("sync-cutover", "Sync screen at cutover", m, stale);
}

/// A scan as the service reports it, the kvstore named as the demo names it.
fn scan_result(scan: crate::app::flows::Scan) -> ScanResult {
    let mut source = scan.kv.source.clone();
    source.endpoints = vec!["demo: in-memory kvstore".into()];
    ScanResult {
        items: scan.items,
        k8s: scan.k8s.identities,
        source,
        crd_present: scan.k8s.crd_present,
        other_names: scan.k8s.other_names.len(),
    }
}

/// The scan of the current generation as the service reports it: the table, then the nodes
/// behind each identity.
fn scanned(m: &mut Model, scan: &ScanResult, counts: &crate::core::kvstore::NodeCounts) {
    let generation = m.scan.generation;
    update(
        m,
        Msg::Engine(Event::Scanned {
            generation,
            scan: Box::new(scan.clone()),
        }),
    );
    update(
        m,
        Msg::Engine(Event::NodeCounts {
            generation,
            counts: counts.clone(),
        }),
    );
}

/// The demo's sandbox serves at a new port each run; the pictures say where it usually is.
fn steady(text: &str, url: &str) -> String {
    text.replace(url, "http://127.0.0.1:8080")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_docs_pictures_of_every_screen_match_the_tui() {
    let world = demo::world(DemoConfig {
        identities: 2000,
        seed: 42,
        nodes: 6,
        ..Default::default()
    })
    .await
    .unwrap();
    let url = world.sandbox.url();
    let target = K8sTarget::from_url(&url).unwrap();
    let kv = world.kv_source();
    let scope = ClusterScope::new(0, Default::default()).unwrap();
    let mut preflight = crate::app::preflight::run(&kv, &target, scope).await;
    preflight.server = steady(&preflight.server, &url);
    for check in &mut preflight.checks {
        check.detail = steady(&check.detail, &url);
    }
    let scan = crate::app::flows::scan(&kv, &target, scope.range)
        .await
        .unwrap();
    let counts = kv.count_nodes(&scan.kv).await.unwrap();
    let audit = crate::app::audit::run(&kv, &target, scope.range)
        .await
        .unwrap();

    let mut m = Model::new(scope.range, false);
    update(&mut m, Msg::Resize { rows: HEIGHT });
    init(&mut m);
    let first = scan_result(scan);
    scanned(&mut m, &first, &counts);
    update(&mut m, Msg::Engine(Event::Preflight(preflight)));
    m.status.clear();

    let mut stale = Vec::new();
    let shot = |name: &str, title: &str, m: &Model, stale: &mut Vec<String>| {
        picture(name, title, m, stale)
    };
    shot("preflight", "Preflight screen", &m, &mut stale);
    update(&mut m, key('2'));
    shot("identities", "Identities screen", &m, &mut stale);
    update(&mut m, key('?'));
    shot(
        "help",
        "Help popup on the Identities screen",
        &m,
        &mut stale,
    );
    update(&mut m, code(KeyCode::Esc));
    update(&mut m, key('3'));
    shot("conflicts", "Conflicts screen", &m, &mut stale);
    update(&mut m, key('A'));
    shot("accept-all", "Accept all: the confirmation", &m, &mut stale);
    update(&mut m, key('y'));
    m.status.clear();
    update(&mut m, key('4'));
    shot("commit", "Commit screen before writing", &m, &mut stale);
    update(&mut m, code(KeyCode::Enter));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    shot("commit-confirm", "Commit: typing yes", &m, &mut stale);

    // The commit itself: every proposal accepted (as `A` decided), written to the demo's
    // API server and verified, as the service does it.
    update(&mut m, code(KeyCode::Enter));
    let log_dir = tempfile::tempdir().unwrap();
    let log = DecisionLog::open(&log_dir.path().join("decisions.jsonl")).unwrap();
    let spec = ApplySpec {
        plan: None,
        resume: Vec::new(),
        accept_proposals: true,
        options: Default::default(),
    };
    let (progress, totals) = tokio::sync::watch::channel(Default::default());
    let watchers = Watchers {
        events: None,
        progress: Some(&progress),
    };
    let mut run = crate::app::flows::apply(
        &kv,
        &target,
        scope,
        &spec,
        &log,
        watchers,
        StopFlag::default(),
    )
    .await
    .unwrap();
    let expect = crate::app::flows::expectations_from_logs(&[log.path().to_path_buf()]).unwrap();
    let verify = crate::app::flows::verify(&kv, &target, scope.range, &expect)
        .await
        .unwrap();
    let after = scan_result(
        crate::app::flows::scan(&kv, &target, scope.range)
            .await
            .unwrap(),
    );
    // Read after the commit: the kvstore's identities are in Kubernetes now.
    let switch = crate::app::switch::read_report(&target, crate::app::switch::CILIUM_NAMESPACE)
        .await
        .unwrap();
    world.sandbox.shutdown();
    // How long it took is the machine's; the picture says 2.4 s.
    run.report.elapsed_ms = 2400;
    m.commit.elapsed = Duration::from_millis(2400);
    let last = *totals.borrow();
    update(&mut m, Msg::Progress(last));
    let generation = m.commit.generation;
    update(
        &mut m,
        Msg::Engine(Event::Committed {
            generation,
            run: Box::new(run),
            verify: Some(verify),
        }),
    );
    scanned(&mut m, &after, &counts);
    m.commit.elapsed = Duration::from_millis(2400);
    m.status.clear();
    shot(
        "commit-done",
        "Commit screen after the commit",
        &m,
        &mut stale,
    );

    sync_pictures(&mut m, &after, &counts, first.items.len(), &mut stale);

    update(&mut m, key('6'));
    let generation = m.audit.generation;
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation,
            run: Box::new(audit),
        }),
    );
    m.status.clear();
    shot("audit", "Audit screen", &m, &mut stale);

    update(&mut m, key('7'));
    let generation = m.switch.generation;
    update(
        &mut m,
        Msg::Engine(Event::SwitchRead {
            generation,
            report: Box::new(switch),
        }),
    );
    m.status.clear();
    shot("switch", "Switch screen", &m, &mut stale);

    assert!(
        stale.is_empty(),
        "pictures that differ from what the TUI draws now (run UPDATE_SNAPSHOTS=1 cargo test generated_docs):\n{}",
        stale.join("\n")
    );
}

/// The Fleet screen over four clusters as they might stand mid-migration: drawn by the
/// TUI's own view from rows made by `fleet`'s own rules.
#[test]
fn generated_docs_picture_of_the_fleet_screen_matches_the_tui() {
    use crate::core::fleet::About;
    use crate::core::fleet::row::{ClusterFacts, ClusterRow, KvstoreSeen, SyncSeen};
    use crate::core::sync::SyncStatus;
    use crate::tui::model::FleetModel;
    use crate::tui::msg::FleetMsg;
    use crate::tui::update::update_fleet;

    let about = About::default();
    let facts =
        |version: &str, mode: &str, identities: usize, sync: Option<SyncSeen>| ClusterFacts {
            cilium_version: Some(version.into()),
            identity_allocation_mode: Some(mode.into()),
            identities: Some(identities),
            kvstore: Some(KvstoreSeen {
                identities: Some(identities),
                error: None,
            }),
            sync,
            ..Default::default()
        };
    let seen = |status: SyncStatus, age_s| {
        Some(SyncSeen {
            standing: crate::core::fleet::Standing::following(&status, &about),
            age_s: Some(age_s),
        })
    };
    let reached = seen(SyncStatus::default(), 3600).map(|s| SyncSeen {
        standing: s.standing.ended(true, None),
        ..s
    });
    let waiting = SyncStatus {
        pending: 2,
        kvstore_nodes: 3,
        cutover_wait: Some(CutoverWait::Nodes(3)),
        ..Default::default()
    };
    let following = SyncStatus {
        kvstore_nodes: 12,
        cutover_wait: Some(CutoverWait::Nodes(12)),
        ..Default::default()
    };
    let rows = [
        ClusterRow::read(
            "prod-eu".into(),
            "https://10.0.1.1:6443".into(),
            facts("v1.16.4", "crd", 41210, reached),
        ),
        ClusterRow::read(
            "prod-us".into(),
            "https://10.0.2.1:6443".into(),
            facts("v1.16.4", "kvstore", 38877, seen(waiting, 4)),
        ),
        ClusterRow::read(
            "stage".into(),
            "https://10.0.3.1:6443".into(),
            facts("v1.15.11", "kvstore", 2290, seen(following, 12)),
        ),
        ClusterRow::read(
            "edge-1".into(),
            "https://10.0.4.1:6443".into(),
            facts("v1.14.19", "kvstore", 610, None),
        ),
        ClusterRow::unread(
            "edge-2".into(),
            "https://10.0.5.1:6443".into(),
            "no answer within 10s (reading the cluster)".into(),
        ),
    ];
    let mut m = FleetModel::new(rows.iter().map(|r| r.cluster.clone()).collect(), false);
    update_fleet(&mut m, FleetMsg::Resize { rows: HEIGHT });
    let now = std::time::Instant::now();
    for (index, row) in rows.into_iter().enumerate() {
        update_fleet(
            &mut m,
            FleetMsg::Row {
                index,
                row: Box::new(row),
                now,
            },
        );
    }
    update_fleet(
        &mut m,
        FleetMsg::Key(KeyEvent::new(KeyCode::Char('n'), KeyModifiers::NONE)),
    );
    let mut t = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).unwrap();
    t.draw(|f| crate::tui::view::draw_fleet(&m, f)).unwrap();
    let drawn = svg::to_svg(t.backend().buffer(), "Fleet screen");
    let path = dir().join("fleet.svg");
    assert!(
        written(&path, &drawn),
        "{} differs from what the TUI draws: run UPDATE_SNAPSHOTS=1 cargo test generated_docs",
        path.display()
    );
}
