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
    counts.add(&masters[1].value, &masters[1].id, 4);
    Event::NodeCounts { generation, counts }
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
    // Four lines logged (302 accepted; 303 skipped, undone, then skipped again): the quit
    // prompt counts the two identities decided now, not the lines.
    update(&mut m, key('s'));
    update(&mut m, key('q'));
    assert!(
        matches!(m.modal, Some(Modal::ConfirmQuit { uncommitted: 2 })),
        "{:?}",
        m.modal
    );
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

#[test]
fn a_failed_export_opens_its_prompt_again_and_what_is_typed_next_goes_there() {
    let mut m = scanned_model();
    m.screen = Screen::Conflicts;
    update(&mut m, key('x'));
    for _ in 0.."cilium-idmig-export".len() {
        update(&mut m, code(KeyCode::Backspace));
    }
    for c in "/nope/x".chars() {
        update(&mut m, key(c));
    }
    let cmds = update(&mut m, code(KeyCode::Enter));
    assert!(matches!(
        cmds.as_slice(),
        [Command::Send(Request::Export { path, .. })] if path.as_os_str() == "/nope/x"
    ));
    update(
        &mut m,
        Msg::Engine(Event::Failed {
            generation: 0,
            task: crate::app::service::Task::Export,
            error: std::sync::Arc::new(crate::Error::Config("no such directory".into())),
        }),
    );
    match &m.modal {
        Some(Modal::Export { input, error }) => {
            assert_eq!(input.text(), "/nope/x");
            assert!(
                error
                    .as_deref()
                    .is_some_and(|e| e.contains("no such directory"))
            );
        }
        other => panic!("{other:?}"),
    }
    let picture = render(&m);
    assert!(picture.contains("no such directory"), "{picture}");
    // The operator, thinking the prompt still open, types on: nothing is decided.
    let mut logged_now = Vec::new();
    for c in "e5000".chars() {
        logged_now.extend(logged(&update(&mut m, key(c))));
    }
    assert!(logged_now.is_empty(), "{logged_now:?}");
    assert!(
        matches!(&m.modal, Some(Modal::Export { input, .. }) if input.text().ends_with("e5000"))
    );
}

#[test]
fn every_screens_tab_shows_at_80_columns() {
    let m = scanned_model();
    let top = render_at(&m, 80, 24).lines().next().unwrap().to_string();
    assert!(top.contains("7 Switch"), "{top}");
    let wide = render_at(&m, 120, 24).lines().next().unwrap().to_string();
    assert!(
        wide.contains("cilium-idmig") && wide.contains("7 Switch"),
        "{wide}"
    );
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

mod audit;
mod commit;
mod node_counts;
mod pictures;
mod rollback;
mod switch;
mod sync;

#[test]
fn esc_on_a_cluster_opened_from_the_fleet_goes_back_past_the_same_question_and_q_quits() {
    let mut m = scanned_model();
    m.fleet_cluster = Some("prod-a".into());
    update(&mut m, key('3'));
    update(&mut m, key('a'));
    update(&mut m, code(KeyCode::Esc));
    assert!(
        matches!(m.modal, Some(Modal::ConfirmQuit { uncommitted: 1 })),
        "decided and not committed: asked first, as q asks; {:?}",
        m.modal
    );
    assert!(!m.quit);
    update(&mut m, key('y'));
    assert!(m.quit && m.back, "back to the fleet");
    assert!(crate::tui::TuiEnd::of(&m).back);

    // `q` ends the session; Esc on a cluster not opened from a fleet quits as before.
    for (fleet, k, back) in [(true, key('q'), false), (false, code(KeyCode::Esc), false)] {
        let mut m = scanned_model();
        m.fleet_cluster = fleet.then(|| "prod-a".to_string());
        update(&mut m, k);
        assert!(m.quit);
        assert_eq!(m.back, back);
    }
}
