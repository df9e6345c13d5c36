//! TUI tests of what trying it as a new user found: leaving while sync runs, `y` while the
//! scan after a commit runs, `a` after another decision.

use crossterm::event::KeyCode;

use super::model::{CommitPhase, Modal, Screen};
use super::msg::{Command, Msg};
use super::tests::{
    accept_all_and_commit, code, first_of, item, key, logged, render, scanned_model,
};
use super::update::update;
use crate::app::service::{ServiceEvent as Event, ServiceRequest as Request};
use crate::app::sync::{SyncEvent, SyncStatus};
use crate::core::planner::{Action, Kind};

/// A model whose sync runs mid-rollout: two kvstore-mode nodes, one pending decision.
fn syncing() -> super::model::Model {
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    m.commit.phase = CommitPhase::Done;
    update(&mut m, key('y'));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    update(&mut m, code(KeyCode::Enter));
    assert!(m.sync.running);
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Following)));
    let status = SyncStatus {
        kvstore_nodes: 2,
        pending: 1,
        splits: 1,
        mirrored: 12,
        watching: true,
        ..Default::default()
    };
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Status(status))));
    m.modal = None;
    m
}

#[test]
fn leaving_while_sync_runs_asks_for_a_typed_word_and_says_where_the_rollout_stands() {
    for quit in [code(KeyCode::Esc), key('q')] {
        let mut m = syncing();
        assert!(update(&mut m, quit).is_empty());
        assert!(
            !m.quit,
            "Esc or q with no popup does not leave while sync runs"
        );
        assert!(
            matches!(m.modal, Some(Modal::ConfirmLeave { .. })),
            "{:?}",
            m.modal
        );
        let popup = render(&m);
        assert!(popup.contains("2 kvstore-mode nodes left"), "{popup}");
        // Esc stays; a wrong word does nothing.
        assert!(update(&mut m, code(KeyCode::Esc)).is_empty());
        assert!(m.modal.is_none() && !m.quit && m.sync.running);
        update(&mut m, key('q'));
        update(&mut m, key('y'));
        assert!(update(&mut m, code(KeyCode::Enter)).is_empty());
        assert!(!m.quit && m.sync.running);
        // The popup stays, its field cleared: the word stops sync, and the TUI quits once
        // sync has stopped.
        assert!(matches!(m.modal, Some(Modal::ConfirmLeave { .. })));
        for c in "leave".chars() {
            update(&mut m, key(c));
        }
        let cmds = update(&mut m, code(KeyCode::Enter));
        assert!(
            matches!(&cmds[..], [Command::Send(Request::StopSync)]),
            "{cmds:?}"
        );
        assert!(m.quit_after_commit && m.sync.stopping);
    }
    // What the terminal keeps says where the rollout stands, as headless sync does.
    let m = syncing();
    let end = super::model::RolloutSummary::of(&m).unwrap();
    assert!(!end.cutover);
    assert_eq!(
        end.to_string(),
        "sync: stopped before cutover: 2 kvstore-mode nodes left, 1 pending decision, 1 split allocation now (12 mirrored by sync)"
    );
    // Without sync, or past cutover, q quits at once.
    let mut m = scanned_model();
    update(&mut m, key('q'));
    assert!(m.quit);
    assert!(super::model::RolloutSummary::of(&m).is_none());
    let mut m = syncing();
    m.sync.cutover = true;
    update(&mut m, key('q'));
    assert!(m.quit);
}

#[test]
fn y_while_the_scan_after_a_commit_runs_opens_the_confirmation_once_it_is_in() {
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    let generation = m.commit.generation;
    let cmds = update(
        &mut m,
        super::tests::committed(generation, Default::default()),
    );
    assert!(m.scan.scanning, "a commit ends with a rescan: {cmds:?}");
    assert!(update(&mut m, key('y')).is_empty());
    assert!(m.modal.is_none(), "{:?}", m.modal);
    assert!(m.status.contains("once the scan is in"), "{}", m.status);
    let generation = m.scan.generation;
    update(&mut m, Msg::Engine(super::tests::scan_event(generation)));
    assert!(
        matches!(m.modal, Some(Modal::ConfirmSync { .. })),
        "{:?}",
        m.modal
    );
    assert!(!m.sync.running, "the confirmation, not sync itself");
}

#[test]
fn accept_after_another_decision_takes_the_planners_proposal_again() {
    let mut m = scanned_model();
    update(&mut m, key('3'));
    // The duplicate: the planner proposes its own id; `u` maps it to the other id instead.
    let dup = first_of(&m, Kind::Duplicate);
    m.review.conflict = Some(dup);
    let id = m.cluster.items[dup].id.clone();
    let proposal = (item(&m, &id).action, item(&m, &id).target_id);
    assert_eq!(proposal.0, Action::Create);
    update(&mut m, key('u'));
    assert_eq!(item(&m, &id).action, Action::None);
    m.review.conflict = Some(dup);
    let cmds = update(&mut m, key('a'));
    assert_eq!((item(&m, &id).action, item(&m, &id).target_id), proposal);
    assert!(item(&m, &id).decided);
    let target = proposal.1.unwrap();
    assert_eq!(
        logged(&cmds),
        vec![format!("{id} accept (create {target})")]
    );
    assert_eq!(m.screen, Screen::Conflicts);
}

#[test]
fn a_sync_that_stands_by_says_so_on_its_state_line() {
    let mut m = syncing();
    assert!(render(&m).contains("following both sides"));
    let status = SyncStatus {
        standby: Some("bastion-2:/var/log/rollout.jsonl".into()),
        watching: true,
        ..Default::default()
    };
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Status(status))));
    let screen = render(&m);
    assert!(
        screen.contains("standby: bastion-2:/var/log/rollout.jsonl holds the lease"),
        "{screen}"
    );
}

/// The screen at 80x24, the smallest terminal the TUI supports.
fn small(m: &mut super::model::Model) -> String {
    update(m, Msg::Resize { rows: 24 });
    super::tests::render_at(m, 80, 24)
}

#[test]
fn at_80x24_every_preflight_check_can_be_scrolled_to() {
    use crate::app::service::{Check, CheckStatus, PreflightReport};
    let mut m = scanned_model();
    let checks = (0..14)
        .map(|n| Check {
            name: format!("check number {n}"),
            status: CheckStatus::Ok,
            detail: "allowed".into(),
            fix: None,
        })
        .collect();
    let report = PreflightReport {
        etcd: "https://10.0.0.10:2379".into(),
        server: "https://10.0.0.1:6443".into(),
        context: "prod".into(),
        version: "v1.33.2".into(),
        crd_present: true,
        cluster_id: 0,
        max_connected_clusters: Default::default(),
        range: None,
        checks,
    };
    update(&mut m, Msg::Engine(Event::Preflight(report)));
    update(&mut m, key('1'));
    let screen = small(&mut m);
    assert!(!screen.contains("check number 13"), "{screen}");
    assert!(screen.contains("rows 1-18 of 19"), "{screen}");
    for _ in 0..3 {
        update(&mut m, key('j'));
    }
    let screen = small(&mut m);
    assert!(screen.contains("check number 13: allowed"), "{screen}");
    assert!(
        !screen.contains("kvstore     https"),
        "scrolled past the top:\n{screen}"
    );
    update(&mut m, code(KeyCode::PageUp));
    assert!(small(&mut m).contains("kvstore     https"));
}

#[test]
fn at_80x24_a_long_label_set_scrolls_and_says_how_much_is_left() {
    let mut m = scanned_model();
    update(&mut m, key('3'));
    let i = m.review.conflict.unwrap();
    // Twelve labels, more than the panes hold at 80x24.
    let long: String = (0..12)
        .map(|n| format!("k8s:label-{n:02}=value;"))
        .collect();
    m.cluster.items[i].labels = long;
    let screen = small(&mut m);
    assert!(!screen.contains("label-11"), "{screen}");
    assert!(screen.contains("of 12 (PgDn)"), "{screen}");
    // The conflict's line wraps rather than cutting "needs a decision".
    assert!(
        screen.contains("needs a") && screen.contains("│decision"),
        "{screen}"
    );
    update(&mut m, code(KeyCode::PageDown));
    update(&mut m, code(KeyCode::PageDown));
    let screen = small(&mut m);
    assert!(screen.contains("label-11"), "{screen}");
    // Moving on shows the next conflict from its first label.
    update(&mut m, key('n'));
    assert_eq!(m.review.label_scroll, 0);
}

#[test]
fn at_80x24_the_commits_result_lines_wrap_whole() {
    use crate::apply::outcome::ApplyReport;
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    let generation = m.commit.generation;
    update(
        &mut m,
        Msg::Engine(Event::Committed {
            generation,
            run: Box::new(crate::app::flows::ApplyRun {
                report: ApplyReport::default(),
                ..Default::default()
            }),
            verify: Some(crate::core::verify::VerifyReport {
                checked: 1900,
                ok: 1900,
                mapped: 172,
                ..Default::default()
            }),
        }),
    );
    update(&mut m, key('4'));
    let screen = small(&mut m);
    // Each line of the pane read on from one row to the next, as it wraps.
    let flat = screen
        .lines()
        .map(|l| l.trim_matches(['│', ' ']))
        .collect::<Vec<_>>()
        .join(" ");
    for whole in ["0 failed, 0 conflicts", "(172 via a mapping)"] {
        assert!(flat.contains(whole), "{whole}:\n{screen}");
    }
}

#[test]
fn counts_that_differ_say_why() {
    let mut m = syncing();
    update(&mut m, key('5'));
    let remap = first_of(&m, Kind::Remap);
    m.cluster.items[remap].decided = false;
    let screen = render(&m);
    // Sync's pending decisions are its live view's; the header's undecided, the last scan's.
    assert!(
        screen.contains("1 pending decision in sync's live view"),
        "{screen}"
    );
    assert!(screen.contains("undecided (last scan)"), "{screen}");
    // Sync counts its own creates, and says what the commit before it wrote.
    m.session.created = 1718;
    let screen = render(&m);
    assert!(
        screen.contains("12 mirrored by sync (the commit before it"),
        "{screen}"
    );
    assert!(screen.contains("wrote 1718)"), "{screen}");
    // No lag yet: what sync mirrored so far was missing at its start.
    assert!(screen.contains("none yet"), "{screen}");
}

#[test]
fn at_80x24_every_key_of_the_help_can_be_scrolled_to() {
    let mut m = scanned_model();
    update(&mut m, key('2'));
    update(&mut m, key('?'));
    let screen = small(&mut m);
    let last = crate::tui::keys::bindings_for(Screen::Identities)
        .last()
        .unwrap()
        .help;
    assert!(!screen.contains(last), "{screen}");
    assert!(screen.contains("↓/↑ scroll"), "{screen}");
    // As far down as it goes (the scroll stops at the last key).
    for _ in 0..20 {
        update(&mut m, code(KeyCode::Down));
    }
    assert!(
        matches!(m.modal, Some(Modal::Help)),
        "scrolling keeps it open"
    );
    let screen = small(&mut m);
    assert!(screen.contains(last), "{screen}");
    // Any other key closes it.
    update(&mut m, key('x'));
    assert!(m.modal.is_none());
}

#[test]
fn at_80x24_the_sync_screens_waiting_line_is_shown_whole() {
    let mut m = syncing();
    let status = SyncStatus {
        watching: true,
        pending: 19,
        splits: 2,
        failures: 3,
        reservations: 4,
        kvstore_nodes: 5,
        identities: 2053,
        ..Default::default()
    };
    update(&mut m, Msg::Engine(Event::Sync(SyncEvent::Status(status))));
    update(&mut m, key('5'));
    let screen = small(&mut m);
    // The waiting line wraps at 80 columns; its every part is on screen.
    for part in [
        "19 pending decisions",
        "2 splits",
        "3 failed writes",
        "4 reserved in the kvstore",
    ] {
        assert!(screen.contains(part), "{part}:\n{screen}");
    }
}
