//! The decision log as the record of the operator's review, property-tested (the TUI's model,
//! the service's log lines, the log's reader, no server): random accepts,
//! edits, skips, reuses, creates anyway, undos and accept-alls over random conflict sets,
//! through the TUI's own `update`, each logged line made as the service makes it. After
//! every key, replaying the log so far gives exactly the decisions the screen shows; a log
//! cut at any byte replays as its whole lines; the decisions export lists each decision in
//! force exactly once and replays to the same.

use std::collections::{BTreeMap, HashMap};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use proptest::prelude::*;

use cilium_idmig::app::service::{ScanResult, ServiceEvent, ServiceRequest, decision_record};
use cilium_idmig::apply::executor::record;
use cilium_idmig::apply::outcome::{OpResult, Outcome};
use cilium_idmig::core::kvstore::{MasterEntry, SourceInfo};
use cilium_idmig::core::planner::plan;
use cilium_idmig::core::planner::resume::{LoggedDecision, replay};
use cilium_idmig::core::planner::{OpKind, reconcile};
use cilium_idmig::core::range::IdRange;
use cilium_idmig::io::decision_log::{LogContents, Record, read_from, steps_in_time};
use cilium_idmig::tui::model::{Model, Screen};
use cilium_idmig::tui::msg::{Command, Msg};
use cilium_idmig::tui::update::{init, update};

/// What the operator does, one key (or key and answer) at a time.
#[derive(Debug, Clone)]
enum Op {
    Next,
    Prev,
    Accept,
    Skip,
    Reuse,
    CreateAnyway,
    /// Edit the target to the id at this offset above the range's start.
    Edit(u32),
    Undo,
    AcceptAll,
    /// Commit what is decided: apply logs each decision again before its write and with
    /// its outcome (the TUI's items stay as they are, as their decisions do).
    Commit,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        2 => Just(Op::Next),
        1 => Just(Op::Prev),
        3 => Just(Op::Accept),
        3 => Just(Op::Skip),
        1 => Just(Op::Reuse),
        1 => Just(Op::CreateAnyway),
        2 => (0u32..40).prop_map(Op::Edit),
        3 => Just(Op::Undo),
        1 => Just(Op::AcceptAll),
        2 => Just(Op::Commit),
    ];
    proptest::collection::vec(op, 0..40)
}

/// A kvstore of `n` identities from 300 up, and Kubernetes holding some of their ids for
/// other labels (remaps) and some of their labels at other ids (reuses, duplicates).
fn worlds() -> impl Strategy<Value = (Vec<MasterEntry>, BTreeMap<u32, String>)> {
    proptest::collection::vec((0u8..4, 0u8..6), 2..12).prop_map(|spec| {
        let mut masters = Vec::new();
        let mut k8s = BTreeMap::new();
        for (n, (what, app)) in spec.into_iter().enumerate() {
            let id = 300 + n as u32;
            let labels = format!("k8s:app=a{app}-{n};k8s:io.kubernetes.pod.namespace=shop;");
            match what {
                // Its id taken by other labels: a remap.
                0 => {
                    k8s.insert(id, format!("k8s:app=squatter{n};"));
                }
                // Its labels at another id: a duplicate.
                1 => {
                    k8s.insert(900 + n as u32, labels.clone());
                }
                // Both: a reuse.
                2 => {
                    k8s.insert(id, format!("k8s:app=other{n};"));
                    k8s.insert(900 + n as u32, labels.clone());
                }
                _ => {}
            }
            masters.push(MasterEntry::new(id.to_string(), labels));
        }
        (masters, k8s)
    })
}

fn key(c: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(c, KeyModifiers::NONE))
}

fn scanned(masters: &[MasterEntry], k8s: &BTreeMap<u32, String>) -> Model {
    let range = IdRange::for_cluster(0).unwrap();
    let mut m = Model::new(range, true);
    update(&mut m, Msg::Resize { rows: 30 });
    init(&mut m);
    let items = plan(masters, &HashMap::new(), k8s, range);
    let scan = ScanResult {
        items,
        k8s: k8s.clone(),
        source: SourceInfo {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            revision: 1,
            prefix: "cilium/state/identities/v1".into(),
        },
        crd_present: true,
        other_names: 0,
    };
    let generation = m.scan.generation;
    update(
        &mut m,
        Msg::Engine(ServiceEvent::Scanned {
            generation,
            scan: Box::new(scan),
        }),
    );
    update(&mut m, key(KeyCode::Char('3')));
    assert_eq!(m.screen, Screen::Conflicts);
    m
}

/// The keys of one operation; a popup it leaves open (a refusal, a target not free) closed.
fn press(m: &mut Model, op: &Op) -> Vec<Command> {
    let keys: Vec<KeyCode> = match op {
        Op::Next => vec![KeyCode::Char('n')],
        Op::Prev => vec![KeyCode::Char('N')],
        Op::Accept => vec![KeyCode::Char('a')],
        Op::Skip => vec![KeyCode::Char('s')],
        Op::Reuse => vec![KeyCode::Char('u')],
        Op::CreateAnyway => vec![KeyCode::Char('c')],
        Op::Undo => vec![KeyCode::Char('z')],
        Op::AcceptAll => vec![KeyCode::Char('A'), KeyCode::Char('y')],
        Op::Commit => return vec![],
        Op::Edit(offset) => {
            let mut k = vec![KeyCode::Char('e')];
            // Clear what the field holds, then type the id.
            k.extend(std::iter::repeat_n(KeyCode::Backspace, 8));
            k.extend((256 + offset).to_string().chars().map(KeyCode::Char));
            k.push(KeyCode::Enter);
            k
        }
    };
    let mut cmds = Vec::new();
    for k in keys {
        cmds.extend(update(m, key(k)));
    }
    if m.modal.is_some() {
        cmds.extend(update(m, key(KeyCode::Esc)));
    }
    cmds
}

/// The decisions the screen shows: every decided item's action and target.
fn on_screen(m: &Model) -> BTreeMap<String, LoggedDecision> {
    m.cluster
        .items
        .iter()
        .filter(|i| i.decided)
        .map(|i| {
            let d = LoggedDecision {
                id: i.id.clone(),
                labels: i.labels.clone(),
                action: i.action,
                target_id: i.target_id,
            };
            (i.id.clone(), d)
        })
        .collect()
}

/// The lines the service logs for `cmds`, each a millisecond after the last.
fn lines_of(cmds: Vec<Command>, clock: &mut jiff::Timestamp) -> Vec<Record> {
    cmds.into_iter()
        .filter_map(|c| match c {
            Command::Send(ServiceRequest::Decided { name, item }) => {
                let mut r = decision_record(name, &item);
                *clock = clock
                    .checked_add(jiff::SignedDuration::from_millis(1))
                    .unwrap();
                r.ts = clock.to_string();
                r.operator = "alice@bastion".into();
                Some(r)
            }
            _ => None,
        })
        .collect()
}

/// What an apply of the screen's items logs, as the executor logs it: each write's decision
/// before it, then every operation with its outcome; nothing when the plan is refused.
fn committed(m: &Model, clock: &mut jiff::Timestamp) -> Vec<Record> {
    let items = &m.cluster.items;
    let Ok(done) = reconcile(items, items, &m.cluster.k8s, m.cluster.range, false) else {
        return Vec::new();
    };
    let before = done
        .ops
        .iter()
        .filter(|op| op.op.writes())
        .map(|op| record(op, None));
    let outcomes = done.ops.iter().map(|op| {
        let outcome = match op.op {
            OpKind::Create => Outcome::Created,
            OpKind::Map => Outcome::Mapped,
            OpKind::Skip => Outcome::Skipped,
            _ => Outcome::AlreadyMigrated,
        };
        record(op, Some(&OpResult::new(&op.id, op.target_id, outcome)))
    });
    before
        .chain(outcomes)
        .map(|mut r| {
            *clock = clock
                .checked_add(jiff::SignedDuration::from_millis(1))
                .unwrap();
            r.ts = clock.to_string();
            r
        })
        .collect()
}

fn replayed(records: &[Record]) -> BTreeMap<String, LoggedDecision> {
    replay(records.iter().filter_map(Record::step))
}

fn jsonl(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        out.extend(serde_json::to_vec(r).unwrap());
        out.push(b'\n');
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn the_log_replays_to_the_decisions_on_screen_after_every_key(
        (masters, k8s) in worlds(),
        ops in ops(),
        cut in any::<proptest::sample::Index>(),
    ) {
        let mut m = scanned(&masters, &k8s);
        let mut clock: jiff::Timestamp = "2026-12-04T10:00:00Z".parse().unwrap();
        let mut log: Vec<Record> = Vec::new();
        // (lines logged so far, the decisions on screen then) after every key.
        let mut after: Vec<(usize, BTreeMap<String, LoggedDecision>)> = vec![(0, BTreeMap::new())];
        for op in &ops {
            match op {
                Op::Commit => log.extend(committed(&m, &mut clock)),
                _ => log.extend(lines_of(press(&mut m, op), &mut clock)),
            }
            let shown = on_screen(&m);
            prop_assert_eq!(&replayed(&log), &shown, "after {:?}", op);
            after.push((log.len(), shown));
        }
        // Every prefix a resume could read replays to the decisions of that moment.
        for (n, shown) in &after {
            prop_assert_eq!(&replayed(&log[..*n]), shown);
        }
        // Cut at any byte (a crash mid-line): the whole lines are read, the torn one dropped.
        let bytes = jsonl(&log);
        if !bytes.is_empty() {
            let at = cut.index(bytes.len() + 1);
            let read = read_from(&bytes[..at]).unwrap();
            prop_assert!(read.bad_lines.is_empty());
            // A line is whole once its newline is written: one whose JSON is complete but
            // whose newline is missing is torn, as the log's own restart cuts it.
            let mut ends = Vec::new();
            let mut end = 0;
            for r in &log {
                end += serde_json::to_vec(r).unwrap().len() + 1;
                ends.push(end);
            }
            let whole = ends.iter().filter(|e| **e <= at).count();
            prop_assert_eq!(read.records.len(), whole);
            prop_assert_eq!(replayed(&read.records), replayed(&log[..whole]));
            if let Some((_, shown)) = after.iter().find(|(n, _)| *n == whole) {
                prop_assert_eq!(&replayed(&read.records), shown);
            }
        }
        // The decisions export: each decision in force once, replaying to the same.
        let contents = LogContents { records: log.clone(), ..Default::default() };
        let export = cilium_idmig::app::export::decisions_only(std::slice::from_ref(&contents)).unwrap();
        let exported = read_from(export.as_slice()).unwrap();
        let mut ids: Vec<&str> = exported.records.iter().map(|r| r.id.as_str()).collect();
        let n = ids.len();
        ids.dedup();
        prop_assert_eq!(ids.len(), n, "an id twice in the export");
        prop_assert_eq!(replayed(&exported.records), on_screen(&m));
        // Read in time order beside another log, the result is the same.
        let steps = steps_in_time(&[&exported, &contents]);
        prop_assert_eq!(replay(steps.into_iter().map(|(s, _)| s)), on_screen(&m));
    }
}

#[test]
fn accept_all_is_one_undoable_step_and_keeps_the_decisions_before_it_undoable() {
    let masters: Vec<MasterEntry> = (0..4)
        .map(|n| MasterEntry::new((300 + n).to_string(), format!("k8s:app=r{n};")))
        .collect();
    let k8s: BTreeMap<u32, String> = (0..4)
        .map(|n| (300 + n, format!("k8s:app=squatter{n};")))
        .collect();
    let mut m = scanned(&masters, &k8s);
    press(&mut m, &Op::Skip);
    assert_eq!(on_screen(&m).len(), 1);
    let cmds = press(&mut m, &Op::AcceptAll);
    assert_eq!(cmds.len(), 3, "the three undecided, each logged");
    assert_eq!(on_screen(&m).len(), 4);
    let cmds = press(&mut m, &Op::Undo);
    assert_eq!(cmds.len(), 3, "one step: the three accepts");
    let shown = on_screen(&m);
    assert_eq!(shown.keys().collect::<Vec<_>>(), ["300"]);
    press(&mut m, &Op::Undo);
    assert!(
        on_screen(&m).is_empty(),
        "the skip before it is undone next"
    );
}

#[test]
fn quitting_with_decisions_not_committed_asks_first() {
    let masters = vec![MasterEntry::new("300", "k8s:app=r0;")];
    let k8s: BTreeMap<u32, String> = [(300, "k8s:app=squatter;".to_string())].into();
    let mut m = scanned(&masters, &k8s);
    // Nothing decided: q quits.
    let mut fresh = m.clone();
    update(&mut fresh, key(KeyCode::Char('q')));
    assert!(fresh.quit);
    press(&mut m, &Op::Skip);
    update(&mut m, key(KeyCode::Char('q')));
    assert!(!m.quit);
    assert!(matches!(
        m.modal,
        Some(cilium_idmig::tui::model::Modal::ConfirmQuit { uncommitted: 1 })
    ));
    update(&mut m, key(KeyCode::Char('n')));
    assert!(!m.quit && m.modal.is_none(), "any other key stays");
    update(&mut m, key(KeyCode::Char('q')));
    update(&mut m, key(KeyCode::Char('y')));
    assert!(m.quit);
}
