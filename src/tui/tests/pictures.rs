//! Every screen against its picture.

use super::*;

#[test]
fn screens_match_their_snapshots() {
    let mut m = scanned_model();
    m.status = "scanned 7 identities at revision 42".into();
    update(&mut m, Msg::Engine(Event::Preflight(preflight())));
    check_screen("preflight", &mut m);
    update(&mut m, key('2'));
    check_screen("identities", &mut m);
    update(&mut m, key('3'));
    check_screen("conflict", &mut m);
    update(&mut m, key('?'));
    check_screen("help", &mut m);
    update(&mut m, code(KeyCode::Esc));
    update(&mut m, key('A'));
    update(&mut m, key('y'));
    m.status.clear();
    update(&mut m, key('4'));
    check_screen("commit-summary", &mut m);
    update(&mut m, code(KeyCode::Enter));
    for c in "ye".chars() {
        update(&mut m, key(c));
    }
    check_screen("commit-confirm", &mut m);
    m.modal = None;
    m.commit.phase = CommitPhase::Done;
    m.commit.total = 7;
    m.commit.done = 7;
    m.commit.writes = 4;
    m.commit.created = 3;
    m.commit
        .failures
        .push(("304".into(), "HTTP 422 Invalid: metadata.labels".into()));
    m.commit.elapsed = Duration::from_millis(3500);
    check_screen("commit-done", &mut m);
    let _ = Instant::now();

    // The Sync screen while a rollout goes on, its reports newest last.
    m.commit.phase = CommitPhase::Done;
    update(&mut m, key('y'));
    check_screen("sync-confirm", &mut m);
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    update(&mut m, code(KeyCode::Enter));
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Following)));
    let status = SyncStatus {
        kvstore_nodes: 2,
        identities: 7,
        mirrored: 12,
        pending: 1,
        splits: 1,
        cutover_wait: Some(crate::core::sync::CutoverWait::Nodes(2)),
        lag_last: Some(Duration::from_millis(85)),
        lag_p50: Some(Duration::from_millis(60)),
        lag_p99: Some(Duration::from_millis(140)),
        watching: true,
        ..Default::default()
    };
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Status(status))));
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Split(
            crate::app::sync::SplitAllocation {
                id: 4100,
                kvstore_labels: "k8s:app=cart;k8s:io.kubernetes.pod.namespace=shop;".into(),
                k8s_labels: "k8s:app=search;k8s:io.kubernetes.pod.namespace=shop;".into(),
                nodes: vec!["node-3".into(), "node-5".into()],
            },
        ))),
    );
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Trouble(
            "Kubernetes watch: connection reset; watching again".into(),
        ))),
    );
    m.modal = None;
    check_screen("sync", &mut m);
}
