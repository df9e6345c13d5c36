//! TUI tests: `update` driven by synthetic engine events, and snapshots of every screen on
//! ratatui's TestBackend at 100x30 (set UPDATE_SNAPSHOTS=1 to rewrite them after a deliberate change).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::model::{CommitPhase, Modal, Model, Screen};
use super::msg::{Command, Msg};
use super::update::{init, merge_decisions, update};
use crate::app::flows::ApplyRun;
use crate::app::service::{
    Check, CheckStatus, PreflightReport, ScanResult, ServiceEvent as Event,
    ServiceRequest as Request,
};
use crate::app::sync::{SyncEvent, SyncStatus};
use crate::apply::outcome::{ApplyEvent, ApplyReport, OpResult, Outcome, Progress};
use crate::core::kvstore::{MasterEntry, SourceInfo};
use crate::core::labels::parse_label_key;
use crate::core::planner::{Action, Kind, plan};
use crate::core::range::IdRange;

fn sl(k: &str) -> String {
    assert!(parse_label_key(k).is_ok(), "{k}");
    k.to_string()
}

fn world() -> (Vec<MasterEntry>, BTreeMap<u32, String>) {
    let masters = vec![
        MasterEntry::new("300", "k8s:app=web;k8s:io.kubernetes.pod.namespace=shop;"),
        MasterEntry::new("301", "k8s:app=api;k8s:io.kubernetes.pod.namespace=shop;"),
        MasterEntry::new("302", "k8s:app=db;k8s:io.kubernetes.pod.namespace=shop;"),
        MasterEntry::new("303", "k8s:app=cache;k8s:io.kubernetes.pod.namespace=shop;"),
        MasterEntry::new("304", "k8s:app=queue;k8s:io.kubernetes.pod.namespace=shop;"),
        MasterEntry::new("305", "k8s:app=mail;k8s:io.kubernetes.pod.namespace=shop;"),
        MasterEntry::new("0306", "k8s:app=zero;"),
    ];
    let mut k8s = BTreeMap::new();
    k8s.insert(300, sl("k8s:app=web;k8s:io.kubernetes.pod.namespace=shop;"));
    k8s.insert(
        302,
        sl("k8s:app=squatter;k8s:io.kubernetes.pod.namespace=shop;"),
    );
    k8s.insert(303, sl("k8s:app=other;"));
    k8s.insert(
        900,
        sl("k8s:app=cache;k8s:io.kubernetes.pod.namespace=shop;"),
    );
    k8s.insert(
        901,
        sl("k8s:app=queue;k8s:io.kubernetes.pod.namespace=shop;"),
    );
    (masters, k8s)
}

pub(super) fn scan_event(generation: u64) -> Event {
    let (masters, k8s) = world();
    let mut nodes = HashMap::new();
    nodes.insert(masters[1].value.clone(), 4);
    let items = plan(&masters, &nodes, &k8s, IdRange::for_cluster(0).unwrap());
    scanned_event(generation, items, k8s, 42)
}

/// A finished scan of `items` and `k8s`, read at `revision`.
fn scanned_event(
    generation: u64,
    items: Vec<crate::core::planner::PlanItem>,
    k8s: BTreeMap<u32, String>,
    revision: i64,
) -> Event {
    Event::Scanned {
        generation,
        scan: Box::new(ScanResult {
            items,
            k8s,
            source: SourceInfo {
                endpoints: vec!["http://127.0.0.1:2379".into()],
                revision,
                prefix: "cilium/state/identities/v1".into(),
            },
            crd_present: true,
            other_names: 0,
        }),
    }
}

pub(super) fn scanned_model() -> Model {
    let mut m = Model::new(IdRange::for_cluster(0).unwrap(), true);
    update(&mut m, Msg::Resize { rows: 30 });
    let cmds = init(&mut m);
    assert!(matches!(
        cmds[1],
        Command::Send(Request::Scan { generation: 1 })
    ));
    update(&mut m, Msg::Engine(scan_event(1)));
    assert!(m.scan.counting);
    update(&mut m, Msg::Engine(counts_event(1)));
    assert!(!m.scan.counting);
    m
}

fn counts_event(generation: u64) -> Event {
    let (masters, _) = world();
    let mut counts = crate::core::kvstore::NodeCounts::default();
    counts.add(&masters[1].value, 4);
    Event::NodeCounts { generation, counts }
}

#[test]
fn node_counts_arrive_after_the_table_and_stale_ones_are_dropped() {
    let mut m = Model::new(IdRange::for_cluster(0).unwrap(), true);
    init(&mut m);
    let mut ev = scan_event(1);
    if let Event::Scanned { scan, .. } = &mut ev {
        for i in &mut scan.items {
            i.nodes = 0;
        }
    }
    update(&mut m, Msg::Engine(ev));
    assert!(m.scan.counting, "the table shows before the counts");
    assert_eq!(item(&m, "301").nodes, 0);
    update(&mut m, Msg::Engine(counts_event(0)));
    assert!(m.scan.counting, "counts of another scan are dropped");
    update(&mut m, Msg::Engine(counts_event(1)));
    assert!(!m.scan.counting);
    assert_eq!(item(&m, "301").nodes, 4);
    assert_eq!(item(&m, "300").nodes, 0);
}

/// While sync runs, its counts (from the kvstore watch) are every screen's node counts: a
/// later scan's older read gives way to them, and once sync ends a scan's own count again.
#[test]
fn node_counts_while_sync_runs_are_syncs_on_every_screen() {
    let mut m = Model::new(IdRange::for_cluster(0).unwrap(), true);
    init(&mut m);
    update(&mut m, Msg::Engine(scan_event(1)));
    update(&mut m, Msg::Engine(counts_event(1)));
    assert_eq!(item(&m, "301").nodes, 4);
    let (masters, _) = world();
    let mut live = crate::core::kvstore::NodeCounts::default();
    live.add(&masters[1].value, 1);
    update(
        &mut m,
        Msg::Engine(Event::Sync(SyncEvent::NodeCounts(live))),
    );
    assert_eq!(item(&m, "301").nodes, 1, "the table follows sync");
    // A rescan's counts (read before the watch moved on) do not bring 4 back.
    update(&mut m, Msg::Engine(scan_event(1)));
    assert_eq!(item(&m, "301").nodes, 1);
    update(&mut m, Msg::Engine(counts_event(1)));
    assert_eq!(item(&m, "301").nodes, 1);
    // Sync over: the next scan's counts are the newest again.
    update(
        &mut m,
        Msg::Engine(Event::SyncEnded {
            end: crate::app::sync::SyncEnd::default(),
        }),
    );
    update(&mut m, Msg::Engine(counts_event(1)));
    assert_eq!(item(&m, "301").nodes, 4);
}

/// The engine's word that commit `generation` ended with `report` (not verified).
pub(super) fn committed(generation: u64, report: ApplyReport) -> Msg {
    Msg::Engine(Event::Committed {
        generation,
        run: Box::new(ApplyRun {
            report,
            ..Default::default()
        }),
        verify: None,
    })
}

pub(super) fn key(c: char) -> Msg {
    Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
}

pub(super) fn code(c: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(c, KeyModifiers::NONE))
}

pub(super) fn logged(cmds: &[Command]) -> Vec<String> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Send(Request::Decided { name, item }) => Some(format!(
                "{} {}",
                item.id,
                crate::core::planner::describe(name, item)
            )),
            _ => None,
        })
        .collect()
}

/// The index of the first item of `kind` (the small world has one of each).
pub(super) fn first_of(m: &Model, kind: Kind) -> usize {
    m.cluster
        .items
        .iter()
        .position(|i| i.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} in the world"))
}

pub(super) fn item<'a>(m: &'a Model, id: &str) -> &'a crate::core::planner::PlanItem {
    m.cluster.items.iter().find(|i| i.id == id).unwrap()
}

#[test]
fn stale_scans_are_dropped() {
    let mut m = scanned_model();
    assert_eq!(m.cluster.items.len(), 7);
    update(&mut m, key('R'));
    assert_eq!(m.scan.generation, 2);
    // A result for generation 1 arriving late changes nothing.
    let mut stale = scan_event(1);
    if let Event::Scanned { scan, .. } = &mut stale {
        scan.items.truncate(1);
    }
    update(&mut m, Msg::Engine(stale));
    assert_eq!(m.cluster.items.len(), 7);
    assert!(m.scan.scanning);
    update(&mut m, Msg::Engine(scan_event(2)));
    assert!(!m.scan.scanning);
}

#[test]
fn decisions_are_logged_at_once_and_undo_restores() {
    let mut m = scanned_model();
    update(&mut m, key('3'));
    assert_eq!(m.screen, Screen::Conflicts);
    assert_eq!(
        m.cluster.items[m.review.conflict.unwrap()].id,
        "302",
        "first conflict is the remap"
    );
    let cmds = update(&mut m, key('a'));
    assert_eq!(logged(&cmds), vec!["302 accept (create 256)".to_string()]);
    assert!(item(&m, "302").decided);
    assert_eq!(
        m.cluster.items[m.review.conflict.unwrap()].id,
        "303",
        "moves to the next undecided conflict"
    );
    let cmds = update(&mut m, key('s'));
    assert_eq!(logged(&cmds), vec!["303 skip (skip -)".to_string()]);
    assert_eq!(item(&m, "303").action, Action::Skip);
    let cmds = update(&mut m, key('z'));
    assert_eq!(logged(&cmds), vec!["303 undo (none 900)".to_string()]);
    assert_eq!(item(&m, "303").action, Action::None);
    assert!(!item(&m, "303").decided);
    assert_eq!(m.cluster.items[m.review.conflict.unwrap()].id, "303");
}

#[test]
fn edit_target_is_validated_before_it_counts() {
    let mut m = scanned_model();
    update(&mut m, key('3'));
    update(&mut m, key('e'));
    assert!(matches!(m.modal, Some(Modal::EditTarget { .. })));
    for _ in 0..4 {
        update(&mut m, code(KeyCode::Backspace));
    }
    for c in "301".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(logged(&cmds).is_empty());
    match &m.modal {
        Some(Modal::EditTarget { error: Some(e), .. }) => {
            assert!(e.contains("another kvstore identity"), "{e}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
    for _ in 0..3 {
        update(&mut m, code(KeyCode::Backspace));
    }
    for c in "70000".chars() {
        update(&mut m, key(c));
    }
    update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(&m.modal, Some(Modal::EditTarget { error: Some(e), .. }) if e.contains("outside"))
    );
    for _ in 0..5 {
        update(&mut m, code(KeyCode::Backspace));
    }
    for c in "4000".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert_eq!(logged(&cmds), vec!["302 edit (create 4000)".to_string()]);
    assert!(m.modal.is_none());
    assert_eq!(
        (item(&m, "302").target_id, item(&m, "302").decided),
        (Some(4000), true)
    );
}

#[test]
fn commit_needs_every_decision_and_the_word_yes() {
    let mut m = scanned_model();
    update(&mut m, key('4'));
    update(&mut m, code(KeyCode::Enter));
    assert!(matches!(&m.modal, Some(Modal::Message(t)) if t.contains("need a decision")));
    update(&mut m, code(KeyCode::Esc));
    update(&mut m, key('3'));
    update(&mut m, key('A'));
    assert!(matches!(
        m.modal,
        Some(Modal::ConfirmAcceptAll { count: 3 })
    ));
    let cmds = update(&mut m, key('y'));
    assert_eq!(logged(&cmds).len(), 3);
    assert_eq!(m.undecided(), 0);
    update(&mut m, key('4'));
    update(&mut m, code(KeyCode::Enter));
    for c in "no".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(cmds.is_empty(), "only yes commits");
    assert!(matches!(&m.modal, Some(Modal::ConfirmCommit { typed }) if typed.is_empty()));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    match &cmds[..] {
        [
            Command::Send(Request::Commit {
                generation: 1,
                items,
            }),
        ] => assert_eq!(items.len(), 7),
        other => panic!("{other:?}"),
    }
    assert_eq!(m.commit.phase, CommitPhase::Running);
}

/// Accepts every proposal and confirms a commit by typing `yes`.
pub(super) fn accept_all_and_commit(m: &mut Model) {
    update(m, key('3'));
    update(m, key('A'));
    update(m, key('y'));
    update(m, key('4'));
    update(m, code(KeyCode::Enter));
    for c in "yes".chars() {
        update(m, key(c));
    }
    update(m, code(KeyCode::Enter));
}

#[test]
fn progress_signal_and_stale_commit_results() {
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    update(
        &mut m,
        Msg::Engine(Event::Apply(ApplyEvent::Started {
            deletes: 0,
            writes: 4,
            total: 7,
        })),
    );
    update(
        &mut m,
        Msg::Progress(Progress {
            total: 7,
            writes: 4,
            done: 2,
            created: 1,
            deleted: 0,
            failed: 1,
            retries: 3,
            throttled: 0,
        }),
    );
    update(
        &mut m,
        Msg::Engine(Event::Apply(ApplyEvent::Problem(OpResult {
            error: Some("HTTP 500".into()),
            attempts: 8,
            ..OpResult::new("304", Some(304), Outcome::Failed)
        }))),
    );
    assert_eq!(m.commit.retries, 3);
    assert_eq!(
        (m.commit.done, m.commit.created, m.commit.failures.len()),
        (2, 1, 1)
    );
    // A dropped SSH session: stop new writes, quit when the commit has finished.
    let cmds = update(&mut m, Msg::Signal);
    assert!(matches!(cmds[..], [Command::Send(Request::Stop)]));
    assert!(!m.quit);
    let report = ApplyReport {
        stopped: Some("stopped by the operator".into()),
        ..Default::default()
    };
    update(&mut m, committed(99, report.clone()));
    assert!(!m.quit, "a result for another commit is ignored");
    update(&mut m, committed(1, report));
    assert!(m.quit);
    assert_eq!(m.commit.phase, CommitPhase::Done);
}

#[test]
fn drift_is_shown_and_a_compaction_rescans() {
    let mut m = scanned_model();
    update(
        &mut m,
        Msg::Engine(Event::Drift {
            added: 2,
            removed: 1,
        }),
    );
    assert_eq!(m.scan.drift, (2, 1));
    assert!(render(&m).contains("drift since scan: +2 -1"));
    let cmds = update(&mut m, Msg::Engine(Event::DriftCompacted));
    assert!(matches!(
        cmds[..],
        [Command::Send(Request::Scan { generation: 2 })]
    ));
    assert!(m.scan.scanning);
    update(&mut m, Msg::Engine(scan_event(2)));
    assert_eq!(m.scan.drift, (0, 0), "a fresh snapshot clears the drift");
}

#[test]
fn rescan_keeps_decisions_only_for_unchanged_items() {
    let mut m = scanned_model();
    update(&mut m, key('3'));
    update(&mut m, key('a')); // 302 accepted
    update(&mut m, key('s')); // 303 skipped
    let mut fresh = match scan_event(2) {
        Event::Scanned { scan, .. } => scan.items,
        _ => unreachable!(),
    };
    for i in &mut fresh {
        if i.id == "303" {
            i.labels = "k8s:app=changed;".into();
        }
    }
    let merged = merge_decisions(&m.cluster.items, fresh);
    let get = |id: &str| merged.iter().find(|i| i.id == id).unwrap().clone();
    assert!(get("302").decided);
    assert!(
        !get("303").decided,
        "labels changed: the decision is dropped"
    );
    assert_eq!(get("303").action, Action::None);
}

#[test]
fn filter_search_sort_and_scrolling() {
    let mut m = scanned_model();
    update(&mut m, key('2'));
    update(&mut m, key('f'));
    assert_eq!(m.table.view.len(), 3, "conflicts");
    update(&mut m, key('f'));
    update(&mut m, key('f'));
    update(&mut m, key('f'));
    assert_eq!(m.table.view.len(), 1, "invalid");
    update(&mut m, key('f'));
    update(&mut m, key('/'));
    for c in "QUEUE".chars() {
        update(&mut m, key(c));
    }
    assert_eq!(
        m.table.view.len(),
        1,
        "case-insensitive search while typing"
    );
    update(&mut m, code(KeyCode::Esc));
    assert_eq!(m.table.view.len(), 7);
    update(&mut m, key('s')); // kind
    assert_eq!(m.cluster.items[m.table.view[0]].kind, Kind::AlreadyMigrated);
    update(&mut m, key('S'));
    assert_eq!(m.cluster.items[m.table.view[0]].kind, Kind::Invalid);
    update(&mut m, key('G'));
    assert_eq!(m.table.selected, 6);
    update(&mut m, Msg::Scroll(-3));
    assert_eq!(m.table.selected, 3);
    update(&mut m, key('g'));
    assert_eq!(m.table.selected, 0);
}

#[test]
fn quit_is_refused_while_a_commit_runs() {
    let mut m = scanned_model();
    m.commit.phase = CommitPhase::Running;
    update(&mut m, key('q'));
    assert!(!m.quit);
    update(&mut m, code(KeyCode::Esc));
    let cmds = update(
        &mut m,
        Msg::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
    );
    assert!(matches!(cmds[..], [Command::Send(Request::Stop)]));
}

#[test]
fn enter_shows_the_identity_behind_a_row() {
    let mut m = scanned_model();
    update(&mut m, key('2'));
    // Row of 302: a remap (302 is taken in Kubernetes by the squatter's labels).
    let row = m
        .table
        .view
        .iter()
        .position(|&i| m.cluster.items[i].id == "302")
        .unwrap();
    m.table.selected = row;
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(matches!(m.modal, Some(Modal::Detail { .. })));
    // The nodes behind it are asked for, and named once they come (an answer for another
    // identity is dropped).
    assert!(
        cmds.iter()
            .any(|c| matches!(c, Command::Send(Request::NodesUsing { id, .. }) if id == "302")),
        "{cmds:?}"
    );
    assert!(render(&m).contains("nodes: reading"));
    update(
        &mut m,
        Msg::Engine(Event::NodesUsing {
            id: "301".into(),
            nodes: Some(vec!["10.0.0.9".into()]),
        }),
    );
    assert!(render(&m).contains("nodes: reading"));
    update(
        &mut m,
        Msg::Engine(Event::NodesUsing {
            id: "302".into(),
            nodes: Some(vec!["10.0.0.1".into(), "10.0.0.2".into()]),
        }),
    );
    let screen = render(&m);
    for expected in [
        "nodes: 10.0.0.1, 10.0.0.2",
        "id 302",
        "remap",
        "app = \"db\"",
        "io.kubernetes.pod.namespace = \"shop\"",
        "Kubernetes at 302: k8s:app=squatter;",
        "proposed, not decided yet",
    ] {
        assert!(screen.contains(expected), "{expected:?} not on\n{screen}");
    }
    // Enter again reviews it.
    update(&mut m, code(KeyCode::Enter));
    assert_eq!(m.screen, Screen::Conflicts);
    assert_eq!(
        item(&m, "302").id,
        m.cluster.items[m.review.conflict.unwrap()].id
    );
}

#[test]
fn bulk_decisions_apply_to_the_conflicts_shown_and_undo_as_one_step() {
    let mut m = scanned_model();
    update(&mut m, key('2'));
    // Only conflicts, then only the shop namespace.
    while m.table.filter.label() != "conflicts" {
        update(&mut m, key('f'));
    }
    update(&mut m, key('/'));
    for c in "shop".chars() {
        update(&mut m, key(c));
    }
    update(&mut m, code(KeyCode::Enter));
    let shown: Vec<String> = m
        .table
        .view
        .iter()
        .map(|&i| m.cluster.items[i].id.clone())
        .collect();
    assert!(shown.len() >= 2, "{shown:?}");
    update(&mut m, key('b'));
    let Some(Modal::ConfirmBulk { targets }) = &m.modal else {
        panic!("{:?}", m.modal)
    };
    assert_eq!(targets.len(), shown.len());
    assert!(render(&m).contains(&format!("{} conflicts match", shown.len())));
    let cmds = update(&mut m, key('s'));
    let lines = logged(&cmds);
    assert_eq!(lines.len(), shown.len());
    assert!(
        lines.iter().all(|l| l.contains("bulk-skip (skip")),
        "{lines:?}"
    );
    for id in &shown {
        assert_eq!(item(&m, id).action, Action::Skip);
        assert!(item(&m, id).decided);
    }
    // One z undoes the whole step, logging each item: on the Identities screen itself, as
    // the guide and the help say.
    assert!(m.screen == Screen::Identities);
    let cmds = update(&mut m, key('z'));
    assert_eq!(logged(&cmds).len(), shown.len());
    for id in &shown {
        assert_ne!(item(&m, id).action, Action::Skip);
    }
    assert!(m.status.contains("undone"), "{}", m.status);
    // One decision undone names what the item is back to, in words.
    update(&mut m, key('3'));
    update(&mut m, key('s'));
    update(&mut m, key('z'));
    assert!(
        m.status.contains("is back to its proposal (") && !m.status.contains("back to undo"),
        "{}",
        m.status
    );
    // A decision that fits only some leaves the others as they were.
    update(&mut m, key('2'));
    update(&mut m, key('b'));
    let cmds = update(&mut m, key('c'));
    let dups = logged(&cmds);
    assert!(
        dups.iter().all(|l| l.contains("bulk-create-anyway")),
        "{dups:?}"
    );
    assert!(
        dups.len() < shown.len(),
        "create anyway fits duplicates only: {dups:?}"
    );
    assert!(m.status.contains("left as they were"), "{}", m.status);
}

#[test]
fn the_footer_fits_every_width_and_says_when_keys_are_left_out() {
    for screen in Screen::ALL {
        for width in 80..=200u16 {
            let (hints, cut) = super::view::footer_hints(screen, width, |_| true);
            let line: String = hints
                .iter()
                .map(|(l, t)| format!(" {l} {t} "))
                .chain([format!(" ? {} ", if cut { "more" } else { "help" })])
                .collect();
            assert!(
                line.chars().count() <= usize::from(width),
                "{screen:?} at {width}: {line}"
            );
            assert!(!hints.is_empty());
        }
        // Wide enough, nothing is left out; at 80 something always is.
        assert!(
            !super::view::footer_hints(screen, 400, |_| true).1,
            "{screen:?}"
        );
    }
    let (hints, cut) = super::view::footer_hints(Screen::Conflicts, 80, |_| true);
    assert!(cut);
    assert_eq!(hints[0].0, "n", "the screen's own keys come first");
    let mut m = scanned_model();
    update(&mut m, key('3'));
    let screen = render(&m);
    let footer = screen.lines().last().unwrap();
    assert!(footer.ends_with("? more"), "{footer}");
}

#[test]
fn text_fields_edit_like_a_shell_line() {
    let mut m = scanned_model();
    update(&mut m, key('2'));
    update(&mut m, key('/'));
    for c in "shop web".chars() {
        update(&mut m, key(c));
    }
    update(
        &mut m,
        Msg::Key(KeyEvent::new(KeyCode::Char('w'), KeyModifiers::CONTROL)),
    );
    assert_eq!(m.table.search, "shop ");
    update(&mut m, code(KeyCode::Home));
    update(&mut m, key('k'));
    assert_eq!(m.table.search, "kshop ");
    update(
        &mut m,
        Msg::Key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL)),
    );
    assert_eq!(m.table.search, "shop ");
    update(&mut m, code(KeyCode::Esc));
    assert_eq!(m.table.search, "");
}

#[test]
fn pause_stays_and_r_resumes_what_is_left() {
    let mut m = scanned_model();
    accept_all_and_commit(&mut m);
    assert_eq!(m.commit.phase, CommitPhase::Running);
    let cmds = update(&mut m, key('p'));
    assert!(matches!(cmds[..], [Command::Send(Request::Stop)]));
    assert_eq!(m.commit.phase, CommitPhase::Stopping);
    let mut report = ApplyReport {
        stopped: Some("stopped by the operator".into()),
        ..Default::default()
    };
    report
        .results
        .push(OpResult::new("301", Some(301), Outcome::Created));
    report
        .results
        .push(OpResult::new("303", Some(303), Outcome::NotAttempted));
    let generation = m.commit.generation;
    update(&mut m, committed(generation, report));
    assert!(!m.quit, "a pause stays");
    assert_eq!(m.commit.phase, CommitPhase::Done);
    let screen = render(&m);
    assert!(
        screen.contains("written: 1 created, 0 already there · not written: 1 not attempted"),
        "{screen}"
    );
    assert!(screen.contains("Commit: Paused"), "{screen}");
    assert!(
        screen.contains("created 1 of") && !screen.contains("ETA 0s"),
        "{screen}"
    );
    let summary = super::CommitSummary::of(&m).unwrap();
    assert!(summary.unfinished());
    assert_eq!(
        summary.to_string(),
        "commit: 1 created, 0 already there, 1 not attempted, 0 failed (stopped)"
    );
    // r during the rescan that follows a commit waits for it, then resumes: the same
    // decisions go out again.
    assert!(m.scan.scanning);
    assert!(update(&mut m, key('r')).is_empty());
    let generation = m.scan.generation;
    let cmds = update(&mut m, Msg::Engine(scan_event(generation)));
    assert!(
        matches!(&cmds[..], [Command::Send(Request::Commit { .. })]),
        "{cmds:?}"
    );
    assert_eq!(m.commit.phase, CommitPhase::Running);
    assert!(
        render(&m).contains("earlier this session: 1 created"),
        "{}",
        render(&m)
    );
    // The resumed commit writes the rest; the panel and the quit summary count both.
    let mut rest = ApplyReport::default();
    rest.results
        .push(OpResult::new("303", Some(303), Outcome::Created));
    let generation = m.commit.generation;
    update(&mut m, committed(generation, rest));
    let screen = render(&m);
    assert!(screen.contains("Commit: Done"), "{screen}");
    assert!(
        screen.contains("this session: 2 created, 0 already there, in 2 commits"),
        "{screen}"
    );
    assert_eq!(
        super::CommitSummary::of(&m).unwrap().to_string(),
        "commit: 2 created, 0 already there, 0 not attempted, 0 failed (this session, 2 commits)"
    );
}

// ---- snapshots ---------------------------------------------------------------------------

pub(super) fn render(m: &Model) -> String {
    render_at(m, 100, 30)
}

pub(super) fn render_at(m: &Model, width: u16, height: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
    t.draw(|f| super::view::view(m, f)).unwrap();
    let buf = t.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width)
            .map(|x| buf[(x, y)].symbol().to_string())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The screen at the two sizes every screen is checked at: the smallest terminal the TUI
/// supports and a common large one. The model is told each size, as a resize would.
fn check_screen(name: &str, m: &mut Model) {
    for (width, height) in [(80, 24), (120, 35)] {
        update(m, Msg::Resize { rows: height });
        check_snapshot(
            &format!("{name}-{width}x{height}"),
            &render_at(m, width, height),
        );
    }
    update(m, Msg::Resize { rows: 30 });
}

fn check_snapshot(name: &str, text: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/tui/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing snapshot {}: run with UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    assert_eq!(
        text,
        expected,
        "screen {name} differs from {}",
        path.display()
    );
}

fn preflight() -> PreflightReport {
    PreflightReport {
        etcd: "https://10.0.0.10:2379".into(),
        server: "https://10.0.0.1:6443".into(),
        context: "prod".into(),
        version: "v1.33.2".into(),
        crd_present: true,
        cluster_id: 0,
        max_connected_clusters: Default::default(),
        range: Some(IdRange::for_cluster(0).unwrap()),
        checks: vec![
            Check {
                name: "kvstore readable".into(),
                status: CheckStatus::Ok,
                detail: "7 identities at revision 42".into(),
                fix: None,
            },
            Check {
                name: "identities in range".into(),
                status: CheckStatus::Warn,
                detail: "2 of 7 kvstore ids outside 256..=65535 (cluster 0, max-connected-clusters 255)".into(),
                fix: Some("they are planned as invalid and never written; if this cluster has another ID, or the mesh was installed with max-connected-clusters 511, pass --cluster-id and --max-connected-clusters to match the agents' settings".into()),
            },
            Check {
                name: "RBAC: create ciliumidentities.cilium.io".into(),
                status: CheckStatus::Fail,
                detail: "denied".into(),
                fix: Some("bind the ClusterRole in assets/clusterrole.yaml".into()),
            },
        ],
    }
}

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

#[test]
fn identities_in_use_are_deleted_only_after_typing_in_use() {
    let logs = vec![std::path::PathBuf::from("run.jsonl")];
    let mut m = Model::for_rollback(IdRange::for_cluster(0).unwrap(), true, logs);
    update(&mut m, Msg::Resize { rows: 30 });
    init(&mut m);
    update(&mut m, key('I'));
    assert!(matches!(m.modal, Some(Modal::ConfirmIncludeInUse { .. })));
    check_screen("rollback-in-use", &mut m);
    // `yes` is not the word here: the field clears and nothing is asked for.
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    assert!(update(&mut m, code(KeyCode::Enter)).is_empty());
    assert!(!m.rollback.as_ref().unwrap().include_in_use);
    for c in "in use".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::PlanRollback { generation: 2, spec })] if spec.include_in_use
        ),
        "{cmds:?}"
    );
    // Asked once: the key does nothing more.
    update(&mut m, key('I'));
    assert!(m.modal.is_none());
}

#[test]
fn a_rollback_is_reviewed_then_confirmed_by_typing_yes() {
    use crate::core::planner::{DecidedBy, Op, OpKind};
    let logs = vec![std::path::PathBuf::from("run.jsonl")];
    let mut m = Model::for_rollback(IdRange::for_cluster(0).unwrap(), true, logs.clone());
    update(&mut m, Msg::Resize { rows: 30 });
    let cmds = init(&mut m);
    assert!(
        matches!(&cmds[..], [Command::Send(Request::PlanRollback { generation: 1, spec })] if spec.logs == logs && !spec.include_in_use),
        "{cmds:?}"
    );
    let op = |id: &str, op: OpKind, expect: Option<(&str, &str)>, reason: Option<&str>| Op {
        id: id.into(),
        label_key: format!("k8s:app=a{id};"),
        kind: Kind::Create,
        op,
        target_id: Some(id.parse().unwrap()),
        decided_by: DecidedBy::Operator,
        expect: expect.map(|(u, r)| (u.to_string(), r.to_string())),
        reason: reason.map(str::to_string),
    };
    let ops = vec![
        op("300", OpKind::Delete, Some(("u1", "7")), None),
        op(
            "301",
            OpKind::Keep,
            None,
            Some("deleted and created again since"),
        ),
        op("302", OpKind::Delete, Some(("u3", "")), None),
    ];
    // A plan for an older request is dropped.
    update(
        &mut m,
        Msg::Engine(Event::RollbackPlanned {
            generation: 0,
            ops: ops.clone(),
        }),
    );
    assert!(m.rollback.as_ref().unwrap().ops.is_none());
    update(
        &mut m,
        Msg::Engine(Event::RollbackPlanned { generation: 1, ops }),
    );
    check_screen("rollback", &mut m);
    let screen = render(&m);
    for expected in [
        "1 to delete",
        "1 already gone",
        "1 kept",
        "keep    301",
        "deleted and created again",
        "delete  300",
    ] {
        assert!(screen.contains(expected), "{expected:?} not on\n{screen}");
    }
    // Only the rollback's screen exists in this session.
    update(&mut m, key('2'));
    assert_eq!(m.screen, Screen::Rollback);
    update(&mut m, code(KeyCode::Enter));
    assert!(matches!(m.modal, Some(Modal::ConfirmRollback { .. })));
    for c in "yes".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::Rollback { generation: 1, .. })]
        ),
        "{cmds:?}"
    );
    assert_eq!(m.commit.phase, CommitPhase::Running);
    let mut report = ApplyReport::default();
    report
        .results
        .push(OpResult::new("300", Some(300), Outcome::Deleted));
    report
        .results
        .push(OpResult::new("302", Some(302), Outcome::AlreadyGone));
    let mut kept = OpResult::new("301", Some(301), Outcome::Kept);
    kept.error = Some("deleted and created again since".into());
    report.results.push(kept);
    let cmds = update(&mut m, committed(1, report));
    assert_eq!(m.commit.phase, CommitPhase::Done);
    // What is left is read again.
    assert!(
        matches!(
            &cmds[..],
            [Command::Send(Request::PlanRollback { generation: 2, .. })]
        ),
        "{cmds:?}"
    );
    assert!(render(&m).contains("deleted 1 · already gone 1 · kept 1"));
    assert_eq!(
        super::CommitSummary::of(&m).unwrap().to_string(),
        "rollback: 1 deleted, 1 already gone, 1 kept, 0 not attempted, 0 failed"
    );
}

#[test]
fn the_table_shows_while_kubernetes_is_listed() {
    let mut m = Model::new(IdRange::for_cluster(0).unwrap(), true);
    update(&mut m, Msg::Resize { rows: 30 });
    init(&mut m);
    let (masters, k8s) = world();
    // The kvstore side first: rows with ids and labels, kinds pending.
    let kv_only = plan(
        &masters,
        &HashMap::new(),
        &BTreeMap::new(),
        IdRange::for_cluster(0).unwrap(),
    );
    update(
        &mut m,
        Msg::Engine(Event::KvRead {
            generation: 1,
            items: kv_only,
        }),
    );
    update(
        &mut m,
        Msg::Engine(Event::Listing {
            generation: 1,
            listed: 3000,
            elapsed: Duration::from_secs(2),
        }),
    );
    update(&mut m, key('2'));
    let screen = render(&m);
    assert!(
        screen.contains("listing CiliumIdentity objects: 3000 so far (1500/s)"),
        "{screen}"
    );
    assert!(
        screen.contains("k8s:app=web;"),
        "labels show at once:\n{screen}"
    );
    assert!(
        !screen.contains("already-migrated"),
        "kinds wait for Kubernetes:\n{screen}"
    );
    // Keys work meanwhile; decisions wait.
    update(&mut m, key('j'));
    assert_eq!(m.table.selected, 1);
    update(&mut m, key('3'));
    m.review.conflict = Some(0);
    assert!(update(&mut m, key('a')).is_empty());
    assert!(matches!(&m.modal, Some(Modal::Message(t)) if t.contains("scan is still running")));
    m.modal = None;
    // The whole scan replaces the rows, with their kinds.
    update(&mut m, Msg::Engine(scan_event(1)));
    assert!(!m.scan.k8s_pending && m.scan.listing.is_none());
    update(&mut m, key('2'));
    assert!(render(&m).contains("already-migrated"));
    let _ = k8s;
}

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
    assert!(!super::view::offered(
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

#[test]
fn a_duplicate_of_another_kvstore_id_shows_that_entry_not_an_empty_object() {
    let mut m = scanned_model();
    let i = first_of(&m, Kind::Duplicate);
    // Its labels are under another kvstore id that Kubernetes does not hold.
    let other = (300..65000)
        .find(|x| !m.cluster.k8s.contains_key(x))
        .unwrap();
    m.cluster.items[i].labels_present_at = Some(other);
    m.cluster.items[i].existing_labels = None;
    update(&mut m, key('3'));
    m.review.conflict = Some(i);
    let screen = render(&m);
    assert!(
        screen.contains(&format!("kvstore {other}, same labels")),
        "{screen}"
    );
    assert!(!screen.contains("(no object)"), "{screen}");
}

/// An audit of a small world: a split with a node behind it, a double, and one id only
/// Kubernetes holds.
fn audit_run() -> crate::app::audit::AuditRun {
    use crate::core::audit::{AuditInput, AuditObject, ValueKey, audit};
    let a = sl("k8s:app=a;k8s:io.kubernetes.pod.namespace=shop;");
    let b = sl("k8s:app=b;k8s:io.kubernetes.pod.namespace=shop;");
    let masters = vec![MasterEntry::new("300", &*a), MasterEntry::new("301", &*b)];
    let values = vec![ValueKey {
        label_key: a.clone(),
        node: "10.0.0.1".into(),
        id: "300".into(),
    }];
    let objects = vec![
        AuditObject {
            id: 300,
            labels: b.as_str().into(),
            gc_marked: false,
        },
        AuditObject {
            id: 400,
            labels: a.as_str().into(),
            gc_marked: false,
        },
    ];
    crate::app::audit::AuditRun {
        report: audit(&AuditInput {
            masters: &masters,
            values: &values,
            objects: &objects,
            endpoints: None,
            range: IdRange::for_cluster(0).unwrap(),
        }),
        kvstore_revision: 42,
        not_checked: vec![
            "endpoints behind findings: ciliumendpoints.cilium.io is not served".into(),
        ],
    }
}

fn audit_requests(cmds: &[Command]) -> Vec<u64> {
    cmds.iter()
        .filter_map(|c| match c {
            Command::Send(Request::Audit { generation }) => Some(*generation),
            _ => None,
        })
        .collect()
}

#[test]
fn the_audit_screen_audits_on_its_first_visit_and_again_on_r_dropping_stale_answers() {
    let mut m = scanned_model();
    assert_eq!(audit_requests(&update(&mut m, key('6'))), vec![1]);
    assert_eq!(m.screen, Screen::Audit);
    assert!(render(&m).contains("reading the kvstore"), "{}", render(&m));
    // Running: neither a second visit nor R asks again.
    update(&mut m, key('1'));
    assert!(audit_requests(&update(&mut m, key('6'))).is_empty());
    assert!(audit_requests(&update(&mut m, key('R'))).is_empty());
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation: 1,
            run: Box::new(audit_run()),
        }),
    );
    assert!(!m.audit.running);
    let counts = &m.audit.run.as_ref().unwrap().report.counts;
    assert_eq!((counts["split"], counts["double"]), (1, 2));
    assert!(render(&m).contains("split 300"), "{}", render(&m));
    // A later visit shows that audit; R reads again, and the old answer is dropped.
    update(&mut m, key('1'));
    assert!(audit_requests(&update(&mut m, key('6'))).is_empty());
    assert_eq!(audit_requests(&update(&mut m, key('R'))), vec![2]);
    let mut stale = audit_run();
    stale.kvstore_revision = 7;
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation: 1,
            run: Box::new(stale),
        }),
    );
    assert!(m.audit.running, "a stale answer ends nothing");
    assert_eq!(m.audit.run.as_ref().unwrap().kvstore_revision, 42);
    update(
        &mut m,
        Msg::Engine(Event::Failed {
            generation: 2,
            task: crate::app::service::Task::Audit,
            error: std::sync::Arc::new(crate::Error::Config("etcd is down".into())),
        }),
    );
    assert!(!m.audit.running);
    assert!(matches!(&m.modal, Some(Modal::Message(t)) if t.contains("audit failed")));
    // Scrolling stays within the findings.
    m.modal = None;
    let n = m.audit.run.as_ref().unwrap().report.findings.len();
    for _ in 0..10 {
        update(&mut m, code(KeyCode::Down));
    }
    assert_eq!(m.audit.offset, n - 1);
    update(&mut m, code(KeyCode::PageUp));
    assert_eq!(m.audit.offset, 0);
}

#[test]
fn the_audit_screen_matches_its_snapshot() {
    let mut m = scanned_model();
    update(&mut m, key('6'));
    update(
        &mut m,
        Msg::Engine(Event::Audited {
            generation: 1,
            run: Box::new(audit_run()),
        }),
    );
    check_screen("audit", &mut m);
}

#[test]
fn every_sorted_column_shows_its_arrow() {
    let mut m = scanned_model();
    update(&mut m, key('2'));
    for (col, name) in [
        ("kind", "kind"),
        ("target", "target"),
        ("nodes", "nodes"),
        ("labels", "labels"),
    ] {
        update(&mut m, key('s'));
        assert!(
            render(&m).contains(&format!("{name}↑")),
            "{col}:\n{}",
            render(&m)
        );
        update(&mut m, key('S'));
        assert!(render(&m).contains(&format!("{name}↓")), "{col} reversed");
        update(&mut m, key('S'));
    }
}

#[test]
fn a_rescan_never_proposes_a_target_a_kept_decision_holds() {
    let mut m = scanned_model();
    // 302 is a remap; the operator sent it to 257, the next id the plan would propose.
    let remap = m.cluster.items.iter_mut().find(|i| i.id == "302").unwrap();
    let proposed = remap.target_id.unwrap();
    remap.target_id = Some(proposed + 1);
    remap.decided = true;
    // Sync brought a second remap in (310, its id taken by other labels): the rescan's plan,
    // not knowing the decision, proposes 257 for it.
    let cmds = update(&mut m, key('R'));
    assert!(
        matches!(cmds.first(), Some(Command::Send(Request::Preflight))),
        "R reads the preflight's counts again too: {cmds:?}"
    );
    let generation = match cmds.last() {
        Some(Command::Send(Request::Scan { generation })) => *generation,
        other => panic!("{other:?}"),
    };
    let (mut masters, mut k8s) = world();
    masters.push(MasterEntry::new("310", "k8s:app=late;"));
    k8s.insert(310, sl("k8s:app=other-late;"));
    let items = plan(
        &masters,
        &HashMap::new(),
        &k8s,
        IdRange::for_cluster(0).unwrap(),
    );
    let fresh_310 = items.iter().find(|i| i.id == "310").unwrap().target_id;
    assert_eq!(fresh_310, Some(proposed + 1), "the collision this is about");
    update(
        &mut m,
        Msg::Engine(scanned_event(generation, items, k8s, 43)),
    );
    assert_eq!(
        item(&m, "302").target_id,
        Some(proposed + 1),
        "the decision stays"
    );
    let late = item(&m, "310").target_id.unwrap();
    assert_ne!(late, proposed + 1);
    assert!(item(&m, "310").reason.contains(&format!("at {late}")));
}

#[test]
fn accept_all_counts_as_the_header_does() {
    let mut m = scanned_model();
    update(&mut m, key('3'));
    let undecided = m.undecided();
    assert!(undecided > 0);
    update(&mut m, key('A'));
    for (w, h) in [(80, 24), (120, 35)] {
        let screen = render_at(&m, w, h);
        assert!(
            screen.contains(&format!("{undecided} undecided")) && screen.contains("reuses"),
            "{w}x{h}:\n{screen}"
        );
        assert!(
            screen.contains("y or Enter"),
            "the popup's last line shows: {screen}"
        );
    }
}

#[test]
fn a_warning_of_the_api_server_is_on_the_status_line() {
    let mut m = scanned_model();
    let cmds = update(
        &mut m,
        Msg::Engine(Event::ServerWarning {
            text: "cilium.io/v2 CiliumIdentity is deprecated".into(),
        }),
    );
    assert!(cmds.is_empty());
    let screen = render_at(&m, 120, 35);
    assert!(
        screen.contains("Warning (from the API server): cilium.io/v2 CiliumIdentity is deprecated"),
        "{screen}"
    );
}
