//! The TUI's sync: started in place after a commit, its reports, its live conflicts.

use super::*;

#[test]
fn starting_sync_before_a_commit_says_so_and_counts_what_it_writes() {
    let mut m = scanned_model();
    let writes = crate::core::planner::sync_writes_at_start(&m.cluster.items);
    let undecided = m.undecided();
    assert!(writes > 0 && undecided > 0, "{writes} {undecided}");
    update(&mut m, key('5'));
    assert!(update(&mut m, key('y')).is_empty());
    let popup = render(&m);
    assert!(popup.contains("No commit was made"), "{popup}");
    assert!(
        popup.contains(&format!("{writes} CiliumIdentity")),
        "{popup}"
    );
    assert!(
        popup.contains(&format!("{undecided} conflicts are undecided")),
        "{popup}"
    );
    // Esc cancels: nothing is sent and sync does not run.
    assert!(update(&mut m, code(KeyCode::Esc)).is_empty());
    assert!(m.modal.is_none() && !m.sync.running);
    // While sync runs, `y` says so and the footer no longer offers it.
    m.sync.running = true;
    assert!(!crate::tui::view::offered(
        &m,
        crate::tui::keys::KeyAction::StartSync
    ));
    assert!(update(&mut m, key('y')).is_empty());
    assert!(
        matches!(&m.modal, Some(Modal::Message(t)) if t.contains("already running")),
        "{:?}",
        m.modal
    );
}

#[test]
fn sync_starts_in_place_after_a_commit_and_brings_live_conflicts_in() {
    use crate::app::sync::SyncEnd;
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    m.commit.phase = CommitPhase::Done;
    // `y` alone writes nothing: it asks for a typed `yes`, saying what sync will write.
    assert!(update(&mut m, key('y')).is_empty());
    assert!(matches!(m.modal, Some(Modal::ConfirmSync { .. })));
    assert!(!m.sync.running);
    let popup = render(&m);
    assert!(popup.contains("Start sync"), "{popup}");
    assert!(popup.contains("The commit is done"), "{popup}");
    // A wrong word clears the field and starts nothing.
    update(&mut m, key('n'));
    assert!(update(&mut m, code(KeyCode::Enter)).is_empty());
    assert!(!m.sync.running);
    assert!(m.status.contains("\"n\" is not \"yes\""), "{}", m.status);
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::StartSync {
                accept_proposals: false
            })]
        ),
        "{cmds:?}"
    );
    assert_eq!(m.screen, Screen::Sync);
    assert!(m.sync.running);
    // "started" only once both watches are established, never before a failure.
    assert!(!render(&m).contains("sync started"), "{}", render(&m));
    assert!(render(&m).contains("sync starting"), "{}", render(&m));
    // A status while both sides are still read shows no counts yet.
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Status(SyncStatus::default()))),
    );
    assert!(!render(&m).contains("0 identities"), "{}", render(&m));
    assert!(render(&m).contains("starting: reading"), "{}", render(&m));
    update(
        &mut m,
        Msg::Engine(Event::Failed {
            generation: 0,
            task: crate::app::service::Task::Sync,
            error: std::sync::Arc::new(crate::Error::Config(
                "sync follows a live etcd: pass --etcd-endpoints or --etcd-config".into(),
            )),
        }),
    );
    assert!(!m.sync.running);
    let screen = render(&m);
    assert!(screen.contains("sync failed"), "{screen}");
    assert!(!screen.contains("sync started"), "{screen}");
    update(&mut m, code(KeyCode::Esc));
    update(&mut m, key('y'));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    update(&mut m, code(KeyCode::Enter));
    assert!(m.sync.running);
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Following)));
    assert!(render(&m).contains("sync started: following both sides"));
    let status = SyncStatus {
        kvstore_nodes: 3,
        identities: 7,
        mirrored: 2,
        pending: 1,
        lag_p99: Some(Duration::from_millis(140)),
        watching: true,
        ..Default::default()
    };
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Status(status.clone()))),
    );
    let screen = render(&m);
    assert!(screen.contains("3 kvstore-mode nodes left"), "{screen}");
    assert!(screen.contains("p99 140 ms"), "{screen}");
    assert!(screen.contains("1 pending decision in"), "{screen}");
    // A conflict found live: reported, marked new, and a rescan brings it to screen 3.
    let cmds = update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Conflict {
            id: "302".into(),
            kind: Kind::Remap,
            reason: "taken".into(),
        })),
    );
    assert!(
        matches!(&cmds[..], [Command::Send(Request::Scan { .. })]),
        "{cmds:?}"
    );
    assert!(m.review.new_since_snapshot.contains("302"));
    assert!(render(&m).contains("conflict: 302 is a remap"));
    // Quitting while sync runs stops it first and quits when it has ended.
    let cmds = update(
        &mut m,
        Msg::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
    );
    assert!(
        matches!(&cmds[..], [Command::Send(Request::StopSync)]),
        "{cmds:?}"
    );
    assert!(!m.quit);
    update(
        &mut m,
        Msg::Engine(Event::SyncEnded {
            end: SyncEnd {
                cutover: false,
                status,
                unwritten: 0,
            },
        }),
    );
    assert!(m.quit && !m.sync.running);
}

#[test]
fn the_sync_screen_shows_its_newest_reports_whole_however_long_the_older_ones() {
    let mut m = scanned_model();
    update(&mut m, key('5'));
    for n in 0..30 {
        m.sync.push(format!(
            "split allocation at id {n}: {}",
            "k8s:app=long;k8s:io.kubernetes.pod.namespace=shop; ".repeat(4)
        ));
    }
    m.sync
        .push("cutover reached: the newest report, at the very end".into());
    for (w, h) in [(80, 24), (120, 35)] {
        let screen = render_at(&m, w, h);
        assert!(
            screen.contains("cutover reached: the newest report, at the very end"),
            "{w}x{h}:\n{screen}"
        );
    }
    // The pane scrolls back through the older ones, and Enter shows one whole.
    update(&mut m, code(KeyCode::Up));
    update(&mut m, code(KeyCode::Up));
    let screen = render(&m);
    assert!(screen.contains("Reports: 2 back of 31"), "{screen}");
    assert!(!screen.contains("cutover reached"), "{screen}");
    update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(&m.modal, Some(Modal::Message(t)) if t.starts_with("split allocation at id 28:") && t.ends_with("shop; ")),
        "{:?}",
        m.modal
    );
    update(&mut m, code(KeyCode::Esc));
    // A report arriving keeps the pane on what it shows; PgDn goes back to the newest.
    m.sync.push("a newer report".into());
    assert!(render(&m).contains("Reports: 3 back of 32"));
    update(&mut m, code(KeyCode::PageDown));
    update(&mut m, code(KeyCode::PageDown));
    assert!(render(&m).contains("the newest of 32"), "{}", render(&m));
}

#[test]
fn a_conflict_sync_closes_as_moot_no_longer_counts_as_undecided() {
    let mut m = scanned_model();
    let before = m.undecided();
    let remap = m
        .cluster
        .items
        .iter()
        .find(|i| i.kind == Kind::Remap && !i.decided)
        .cloned()
        .expect("a remap waits");
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Moot {
            id: remap.id.clone(),
            labels: remap.labels.clone(),
        })),
    );
    assert_eq!(m.undecided(), before - 1);
    // Another id with the same labels is not touched.
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::Moot {
            id: "99999".into(),
            labels: remap.labels.clone(),
        })),
    );
    assert_eq!(m.undecided(), before - 1);
}
