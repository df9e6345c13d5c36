//! The shell's own rules, one call at a time, against an IO that records every call: what is
//! logged before it is said or closed, the catch-up said once a round, the stop told once,
//! the reservations asked for only once a writer runs and released once, what a round
//! carries, a refused decision logged and sent back to waiting. Whole rollouts are
//! `crate::sim`'s, which runs this same shell.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::*;
use crate::core::outcome::Outcome;
use crate::core::planner::Action;
use crate::core::range::IdRange;
use crate::core::sync::machine::{K8sChange, KvWatchEvent, catch_up_text};
use crate::core::sync::{BatchOutcome, KvChange};

const A: &str = "k8s:app=a;";
const B: &str = "k8s:app=b;";

/// Every call the shell made, in order; `log_room`: how many lines the log takes before it
/// fails (a full disk).
#[derive(Default)]
struct Recorded {
    logged: Vec<Line>,
    said: Vec<Event>,
    writes: Vec<Vec<Op>>,
    verifies: usize,
    splits: Vec<u32>,
    requests: Vec<Request>,
    releases: usize,
    stands: usize,
    log_room: Option<usize>,
}

impl Io for Recorded {
    fn log(&mut self, lines: Vec<Line>) -> usize {
        let room = self.log_room.unwrap_or(usize::MAX);
        let n = lines.len().min(room);
        self.log_room = self.log_room.map(|r| r - n);
        self.logged.extend(lines.into_iter().take(n));
        n
    }
    fn say(&mut self, event: Event) {
        self.said.push(event);
    }
    fn write(&mut self, ops: Vec<Op>) {
        self.writes.push(ops);
    }
    fn verify(&mut self, _reused: BTreeMap<String, u32>, _nowhere: BTreeSet<String>) {
        self.verifies += 1;
    }
    fn report_splits(&mut self, found: Vec<SplitFound>) {
        self.splits.extend(found.iter().map(|f| f.id));
    }
    fn reserve(&mut self, requests: Vec<Request>) {
        self.requests.extend(requests);
    }
    fn release(&mut self) {
        self.releases += 1;
    }
    fn stands(&mut self, _status: &SyncStatus) {
        self.stands += 1;
    }
}

impl Recorded {
    fn notes(&self) -> Vec<&str> {
        self.said
            .iter()
            .filter_map(|e| match e {
                Event::Note(n) => Some(n.as_str()),
                _ => None,
            })
            .collect()
    }
    fn troubles(&self) -> Vec<&str> {
        self.said
            .iter()
            .filter_map(|e| match e {
                Event::Trouble(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }
    fn conflicts(&self) -> usize {
        self.said
            .iter()
            .filter(|e| matches!(e, Event::Conflict { .. }))
            .count()
    }
}

fn settings(reserve: bool, until_cutover: bool) -> Settings {
    Settings {
        range: IdRange::for_cluster(0).unwrap(),
        accept_proposals: false,
        until_cutover,
        reserve_in_kvstore: reserve,
        cutover_grace: Duration::from_secs(10),
        lease: "kube-system/sync".into(),
    }
}

/// A shell with no decisions and nothing reserved earlier, and an IO that records.
fn shell(settings: Settings, release_on_stop: bool) -> (Shell, Recorded) {
    let shell = Shell::new(settings, BTreeMap::new(), release_on_stop);
    (shell, Recorded::default())
}

fn master(id: &str, labels: &str) -> KvChange {
    KvChange::Master {
        id: id.as_bytes().to_vec(),
        value: Some(labels.as_bytes().to_vec()),
        created: true,
    }
}

fn node(labels: &str, present: bool) -> KvChange {
    KvChange::Slave {
        label_key: labels.as_bytes().to_vec(),
        node: b"10.0.0.1".to_vec(),
        present,
        id: None,
    }
}

/// Both sides read: the kvstore holding `kv`, Kubernetes `k8s` (as a snapshot reads them:
/// nothing arrived through a watch, so no create of theirs has a lag).
fn read(kv: &[(&str, &str)], k8s: &[(u32, &str)], _t0: Instant) -> SyncState {
    let mut state = SyncState::default();
    for (id, labels) in kv {
        state
            .masters
            .insert(id.as_bytes().to_vec(), labels.as_bytes().to_vec());
    }
    state.k8s = k8s.iter().map(|(id, l)| (*id, l.to_string())).collect();
    state
}

/// A shell that holds the Lease and follows both sides of `state`.
fn following(shell: &mut Shell, state: SyncState, t0: Instant, io: &mut Recorded) {
    shell.know_holder(LeaseHolder::Us);
    shell.start_round(state, t0, true, io);
    shell.take(
        Turn::Input(Input::Kv(KvWatchEvent::Connected)),
        t0,
        true,
        io,
    );
    shell.take(Turn::Input(Input::K8s(K8sChange::Connected)), t0, true, io);
}

/// The writer's answer to a batch, with nothing to say.
fn answer(held: usize, own_masters: Option<BTreeSet<u32>>) -> Reply {
    Reply {
        held,
        own_masters,
        batch: true,
        failed: false,
        deferred: false,
        said: None,
    }
}

fn settle(shell: &mut Shell, t: Instant, io: &mut Recorded) -> Option<RoundEnd> {
    shell.take(Turn::Settle { stopped: false }, t, true, io)
}

fn created(ops: &[Op]) -> Input {
    Input::BatchDone {
        ops: ops.to_vec(),
        outcome: BatchOutcome::Done {
            results: ops
                .iter()
                .filter_map(|o| o.target_id.map(|t| (t, Outcome::Created)))
                .collect(),
            halted: None,
            denied: Vec::new(),
        },
    }
}

/// A shell following a kvstore of two identities (300, 301) and no objects, with the
/// batch of their two creates out.
fn first_batch_of_two(t0: Instant) -> (Shell, Recorded, Vec<Op>) {
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(
        &mut shell,
        read(&[("300", A), ("301", B)], &[], t0),
        t0,
        &mut io,
    );
    settle(&mut shell, t0, &mut io);
    let ops = io.writes.pop().expect("a batch");
    (shell, io, ops)
}

#[test]
fn a_rounds_first_creates_are_said_once_as_the_catch_up_and_again_after_a_fresh_read() {
    let t0 = Instant::now();
    let (mut shell, mut io, ops) = first_batch_of_two(t0);
    assert_eq!(ops.len(), 2);
    shell.take(Turn::Input(created(&ops)), t0, true, &mut io);
    assert_eq!(io.notes(), vec![catch_up_text(2).as_str()]);
    // A later create that arrived through the watch has a lag: no second catch-up.
    let arrived = Input::Kv(KvWatchEvent::Changes {
        changes: vec![master("302", "k8s:app=c;")],
        revision: 9,
    });
    shell.take(Turn::Input(arrived), t0, true, &mut io);
    settle(&mut shell, t0 + Duration::from_secs(1), &mut io);
    let ops = io.writes.pop().expect("a second batch");
    shell.take(
        Turn::Input(created(&ops)),
        t0 + Duration::from_secs(2),
        true,
        &mut io,
    );
    assert_eq!(io.notes().len(), 1, "{:?}", io.notes());
    // Each write's outcome reached the metrics, and each turn said where sync stands.
    assert_eq!(
        io.said
            .iter()
            .filter(|e| matches!(e, Event::Taken(_)))
            .count(),
        2
    );
    assert!(io.stands >= 6, "{}", io.stands);
    // A fresh round says its catch-up again.
    shell.end_round();
    shell.start_round(read(&[("303", "k8s:app=d;")], &[], t0), t0, true, &mut io);
    settle(&mut shell, t0 + Duration::from_secs(3), &mut io);
    let ops = io.writes.pop().expect("the new round's batch");
    shell.take(
        Turn::Input(created(&ops)),
        t0 + Duration::from_secs(3),
        true,
        &mut io,
    );
    assert_eq!(io.notes().len(), 2, "{:?}", io.notes());
}

#[test]
fn a_stop_is_told_once_and_ends_the_round_only_once_the_batch_is_in() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(&mut shell, read(&[("300", A)], &[], t0), t0, &mut io);
    assert_eq!(settle(&mut shell, t0, &mut io), None);
    let ops = io.writes.pop().expect("a batch");
    // Asked to stop with the batch out: no end yet, at any settle.
    let stop = Turn::Settle { stopped: true };
    assert_eq!(shell.take(stop.clone(), t0, true, &mut io), None);
    assert_eq!(shell.take(stop.clone(), t0, true, &mut io), None);
    shell.take(Turn::Input(created(&ops)), t0, true, &mut io);
    let Some(RoundEnd::Done(end)) = shell.take(stop, t0, true, &mut io) else {
        panic!("the stop ends the round once the batch is in");
    };
    assert!(!end.cutover);
    assert_eq!(end.status.mirrored, 1);
}

#[test]
fn moot_conflicts_are_closed_only_as_far_as_the_log_took_them() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    // Two conflicts: the kvstore's 300 and 301 are held in Kubernetes by other labels.
    let state = read(
        &[("300", A), ("301", B)],
        &[(300, "k8s:app=x;"), (301, "k8s:app=y;")],
        t0,
    );
    following(&mut shell, state, t0, &mut io);
    settle(&mut shell, t0, &mut io);
    assert_eq!(io.conflicts(), 2);
    io.log_room = Some(1);
    // No kvstore-mode node for the grace: both are moot, and the log takes one line.
    let later = t0 + Duration::from_secs(11);
    shell.take(Turn::Status { watching: true }, t0, true, &mut io);
    shell.take(Turn::Status { watching: true }, later, true, &mut io);
    let moot: Vec<&str> = io
        .said
        .iter()
        .filter_map(|e| match e {
            Event::Moot { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(moot.len(), 1, "{:?}", io.said);
    assert_eq!(io.logged.len(), 1);
    let Line::Moot { id, .. } = &io.logged[0] else {
        panic!("{:?}", io.logged);
    };
    assert_eq!(moot[0], id);
    assert_eq!(shell.machine().state().moot.len(), 1);
}

#[test]
fn a_malformed_entry_is_logged_as_skipped_before_it_is_said() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(
        &mut shell,
        read(&[("300", "not a label key")], &[], t0),
        t0,
        &mut io,
    );
    settle(&mut shell, t0, &mut io);
    assert!(
        matches!(&io.logged[..], [Line::Invalid { id, .. }] if id == "300"),
        "{:?}",
        io.logged
    );
    assert!(
        io.said
            .iter()
            .any(|e| matches!(e, Event::Invalid { id, .. } if id == "300"))
    );
    assert!(io.writes.is_empty());
}

#[test]
fn a_malformed_entry_whose_skip_was_not_logged_is_not_said_and_is_logged_at_a_later_round() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    io.log_room = Some(0);
    following(
        &mut shell,
        read(&[("300", "not a label key")], &[], t0),
        t0,
        &mut io,
    );
    settle(&mut shell, t0, &mut io);
    assert!(io.logged.is_empty());
    let said = |io: &Recorded| {
        io.said
            .iter()
            .filter(|e| matches!(e, Event::Invalid { id, .. } if id == "300"))
            .count()
    };
    assert_eq!(said(&io), 0, "said only once logged");
    // The disk has room again: the next round logs it, once, and says it.
    io.log_room = None;
    settle(&mut shell, t0 + SETTLE_EVERY, &mut io);
    settle(&mut shell, t0 + 2 * SETTLE_EVERY, &mut io);
    assert!(
        matches!(&io.logged[..], [Line::Invalid { id, .. }] if id == "300"),
        "{:?}",
        io.logged
    );
    assert_eq!(said(&io), 1);
}

#[test]
fn a_decision_that_cannot_be_carried_out_is_refused_once_logged_and_waits_again() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    // 300 is held in Kubernetes by other labels: a conflict, decided on a screen as a
    // create at 4000.
    following(
        &mut shell,
        read(&[("300", A)], &[(300, B)], t0),
        t0,
        &mut io,
    );
    settle(&mut shell, t0, &mut io);
    assert_eq!(io.conflicts(), 1);
    let decision = LoggedDecision {
        id: "300".into(),
        labels: A.into(),
        action: Action::Create,
        target_id: Some(4000),
    };
    // Meanwhile a CRD-mode agent took 4000 for other labels.
    let taken = Input::K8s(K8sChange::Upsert {
        id: 4000,
        labels: "k8s:app=z;".into(),
        resource_version: "5".into(),
    });
    shell.take(Turn::Input(taken), t0, true, &mut io);
    shell.take(
        Turn::Input(Input::Decided(decision.clone())),
        t0,
        true,
        &mut io,
    );
    settle(&mut shell, t0, &mut io);
    assert!(io.writes.is_empty(), "{:?}", io.writes);
    assert!(
        matches!(&io.logged[..], [Line::Refused { decision: d, .. }] if *d == decision),
        "{:?}",
        io.logged
    );
    let refused = io.troubles();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("300 (create at 4000) cannot be carried out"),
        "{refused:?}"
    );
    // It waits again: its conflict is said again, and it counts as pending.
    assert_eq!(io.conflicts(), 2);
    assert_eq!(shell.machine().state().status.pending, 1);
    // Said once: later rounds (the plan made again) do not say it again.
    let arrived = Input::Kv(KvWatchEvent::Changes {
        changes: vec![master("301", "k8s:app=c;")],
        revision: 9,
    });
    shell.take(Turn::Input(arrived), t0, true, &mut io);
    shell.take(
        Turn::Input(Input::K8s(K8sChange::Relisted {
            identities: shell.machine().state().k8s.clone(),
            resource_version: "6".into(),
        })),
        t0,
        true,
        &mut io,
    );
    settle(&mut shell, t0 + Duration::from_secs(1), &mut io);
    assert_eq!(io.logged.len(), 1, "{:?}", io.logged);
    // Decided again (to a free id): carried out.
    let again = LoggedDecision {
        target_id: Some(4001),
        ..decision
    };
    shell.take(Turn::Input(Input::Decided(again)), t0, true, &mut io);
    if let Some(ops) = io.writes.pop() {
        shell.take(Turn::Input(created(&ops)), t0, true, &mut io);
    }
    settle(&mut shell, t0 + Duration::from_secs(2), &mut io);
    let written: Vec<Option<u32>> = io.writes.iter().flatten().map(|o| o.target_id).collect();
    assert!(written.contains(&Some(4001)), "{written:?}");
}

#[test]
fn reservations_are_asked_for_only_once_a_writer_runs_and_released_once() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(true, false), true);
    assert!(shell.wants_writer());
    assert_eq!(
        shell.release_at_stop(true),
        None,
        "no writer yet: nothing to release"
    );
    // Without a writer, what the machine asks goes nowhere.
    following(
        &mut shell,
        read(&[("300", A)], &[(4000, B)], t0),
        t0,
        &mut io,
    );
    assert!(io.requests.is_empty(), "{:?}", io.requests);
    shell.end_round();
    shell.writer_started(BTreeMap::new());
    assert!(!shell.wants_writer());
    assert!(shell.has_writer());
    assert_eq!(
        shell.release_at_stop(false),
        None,
        "only the Lease's holder releases"
    );
    shell.start_round(read(&[("300", A)], &[(4000, B)], t0), t0, true, &mut io);
    // The first batch goes before the watches deliver: 4000, which the kvstore does not hold.
    assert_eq!(
        io.requests,
        vec![
            Request::LookAgain,
            Request::Reserve(vec![(4000, B.to_string())])
        ]
    );
    // The writer's answer reaches the machine.
    let reply = Reply {
        held: 1,
        own_masters: Some([4000].into()),
        batch: true,
        failed: false,
        deferred: false,
        said: Some(Said::Note("held".into())),
    };
    shell.take(Turn::Reply(reply), t0, true, &mut io);
    assert_eq!(shell.machine().state().status.reservations, 1);
    assert_eq!(shell.machine().state().own_masters, BTreeSet::from([4000]));
    assert!(io.notes().contains(&"held"));
}

#[test]
fn cutover_releases_the_reservations_once_and_a_node_back_reserves_anew() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(true, false), false);
    shell.writer_started(BTreeMap::new());
    // 300 = A is in Kubernetes already; no kvstore-mode node.
    let mut state = read(&[("300", A)], &[(300, A)], t0);
    state.apply_kv_change(node(A, true), t0);
    state.apply_kv_change(node(A, false), t0);
    following(&mut shell, state, t0, &mut io);
    settle(&mut shell, t0, &mut io);
    let later = t0 + Duration::from_secs(11);
    shell.take(Turn::Status { watching: true }, t0, true, &mut io);
    shell.take(Turn::Status { watching: true }, later, true, &mut io);
    settle(&mut shell, later, &mut io);
    shell.take(Turn::Status { watching: true }, later, true, &mut io);
    assert_eq!(io.verifies, 1);
    shell.take(Turn::Input(Input::Verdict(Ok(()))), later, true, &mut io);
    assert!(io.said.iter().any(|e| matches!(e, Event::Cutover(_))));
    assert_eq!(io.releases, 1);
    assert!(!shell.has_writer());
    assert!(!shell.wants_writer(), "released: none is started again");
    // A fresh read after cutover asks for nothing and releases nothing again.
    shell.end_round();
    let before = io.requests.len();
    shell.start_round(
        read(&[("300", A)], &[(300, A), (4000, B)], t0),
        later,
        true,
        &mut io,
    );
    assert_eq!(io.requests.len(), before);
    assert_eq!(io.releases, 1);
    // A node back in kvstore mode needs them again: a fresh read, with a writer started.
    let back = Input::Kv(KvWatchEvent::Changes {
        changes: vec![node(A, true)],
        revision: 20,
    });
    shell.take(Turn::Input(back), later, true, &mut io);
    settle(&mut shell, later, &mut io);
    let end = shell.take(Turn::Status { watching: true }, later, true, &mut io);
    assert_eq!(end, Some(RoundEnd::Resnapshot));
    assert!(
        io.troubles()
            .iter()
            .any(|t| t.contains("back after cutover")),
        "{:?}",
        io.said
    );
    shell.end_round();
    assert!(shell.wants_writer());
    shell.writer_started(BTreeMap::new());
    shell.start_round(
        read(&[("300", A)], &[(300, A), (4000, B)], t0),
        later,
        true,
        &mut io,
    );
    assert_eq!(
        io.requests[before..],
        [
            Request::LookAgain,
            Request::Reserve(vec![(4000, B.to_string())])
        ]
    );
}

#[test]
fn what_a_round_knew_is_carried_to_the_next_only_when_it_ends() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(&mut shell, read(&[("300", A)], &[], t0), t0, &mut io);
    settle(&mut shell, t0, &mut io);
    assert!(shell.awaits_batch());
    let ops = io.writes.pop().expect("a batch");
    shell.take(Turn::Input(created(&ops)), t0, true, &mut io);
    assert!(!shell.awaits_batch());
    // A compaction: the round ends for a fresh read.
    let compacted = Input::Kv(KvWatchEvent::Compacted {
        compact_revision: 50,
    });
    assert_eq!(
        shell.take(Turn::Input(compacted), t0, true, &mut io),
        Some(RoundEnd::Resnapshot)
    );
    shell.end_round();
    shell.start_round(read(&[("300", A)], &[(300, A)], t0), t0, true, &mut io);
    // What was made is remembered: the count goes on, and nothing is made again.
    assert_eq!(shell.machine().state().status.mirrored, 1);
    assert!(shell.machine().state().created.contains(&300));
}

#[test]
fn a_refused_create_ends_sync_with_the_servers_words_and_the_writes_owed_a_fault_ridden_out_is_retried()
 {
    use crate::core::sync::failure::Fault;
    let t0 = Instant::now();
    let (mut shell, mut io, ops) = first_batch_of_two(t0);
    let faulted = |ops: Vec<Op>, refused: bool| {
        Turn::Input(Input::BatchDone {
            ops,
            outcome: BatchOutcome::Faulted {
                fault: Fault {
                    refused,
                    code: Some(if refused { 403 } else { 503 }),
                    ..Fault::default()
                },
                why: format!("{} from the server", if refused { 403 } else { 503 }),
            },
        })
    };
    // A fault the rules ride out: a failed batch, tried again after its wait.
    assert_eq!(shell.take(faulted(ops, false), t0, true, &mut io), None);
    assert!(
        io.troubles()
            .iter()
            .any(|t| t.contains("503 from the server")),
        "{:?}",
        io.troubles()
    );
    settle(&mut shell, t0 + crate::core::sync::RETRY_AFTER, &mut io);
    let again = io.writes.pop().expect("the batch tried again");
    assert_eq!(again.len(), 2);
    // A refusal ends sync, saying nothing of a retry; both writes are owed at its end.
    let troubles = io.troubles().len();
    let t1 = t0 + crate::core::sync::RETRY_AFTER;
    assert_eq!(
        shell.take(faulted(again, true), t1, true, &mut io),
        Some(RoundEnd::Refused(Refusal::Create(
            "403 from the server".into()
        )))
    );
    assert_eq!(io.troubles().len(), troubles, "{:?}", io.troubles());
    shell.end_round();
    assert_eq!(shell.end_now().unwritten, 2);
}

#[test]
fn a_refused_lease_ends_sync_with_the_servers_words() {
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(&mut shell, read(&[("300", A)], &[], t0), t0, &mut io);
    let refused = Turn::LeaseRefused("leases is forbidden".into());
    assert_eq!(
        shell.take(refused, t0, true, &mut io),
        Some(RoundEnd::Refused(Refusal::Lease(
            "leases is forbidden".into()
        )))
    );
}

#[test]
fn a_refused_watch_or_read_ends_sync_and_an_outage_or_a_renewed_token_is_said_and_ridden_out() {
    use crate::core::sync::failure::{Fault, Path};
    use crate::core::sync::shell::{AfterFailure, Failed};
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(&mut shell, read(&[("300", A)], &[], t0), t0, &mut io);
    let failed = |path, fault| Failed {
        path,
        fault,
        doing: "watching ciliumidentities.cilium.io".into(),
        error: "403 Forbidden".into(),
        trouble: "403 Forbidden; watching again".into(),
    };
    // Ridden out: an outage of any path, a 401 sent with a token since renewed, anything
    // the kvstore's watch meets; each said once, as its trouble.
    let renewed = Fault {
        old_token: true,
        code: Some(401),
        ..Fault::forbidden()
    };
    let refused_kv = Fault {
        refused: true,
        ..Fault::default()
    };
    for (path, fault) in [
        (Path::K8sWatch, Fault::outage()),
        (Path::K8sWatch, renewed),
        (Path::KvWatch, refused_kv),
        (Path::K8sList, Fault::outage()),
    ] {
        let before = io.troubles().len();
        assert_eq!(
            shell.take(Turn::Failed(failed(path, fault)), t0, true, &mut io),
            None,
            "{path:?} {fault:?}"
        );
        assert_eq!(io.troubles().len(), before + 1);
        assert!(io.troubles()[before].ends_with("; watching again"));
    }
    // A refusal of the watch ends sync, with what was being done and the server's words.
    let before = io.troubles().len();
    let end = shell.take(
        Turn::Failed(failed(Path::K8sWatch, Fault::forbidden())),
        t0,
        true,
        &mut io,
    );
    assert_eq!(
        end,
        Some(RoundEnd::Refused(Refusal::Read {
            fault: Fault::forbidden(),
            doing: "watching ciliumidentities.cilium.io".into(),
            error: "403 Forbidden".into(),
        }))
    );
    assert_eq!(io.troubles().len(), before, "nothing said of a retry");
    // A round's reads are judged alike: a refused list or kvstore read ends sync, and
    // configuration (no endpoints, an unreadable certificate) too.
    for (path, fault) in [
        (Path::K8sList, Fault::forbidden()),
        (Path::KvRead, refused_kv),
        (
            Path::KvRead,
            Fault {
                config: true,
                ..Fault::default()
            },
        ),
    ] {
        assert!(
            matches!(shell.failed(failed(path, fault)), AfterFailure::End(_)),
            "{path:?} {fault:?}"
        );
    }
    assert_eq!(
        shell.failed(failed(Path::KvRead, Fault::outage())),
        AfterFailure::Retry {
            trouble: "403 Forbidden; watching again".into()
        }
    );
}

#[test]
fn a_stop_between_rounds_ends_with_what_sync_knew_and_the_writes_it_still_owes() {
    let t0 = Instant::now();
    let (mut shell, mut io, ops) = first_batch_of_two(t0);
    let failed = Input::BatchDone {
        ops,
        outcome: BatchOutcome::Failed("the API server is down".into()),
    };
    shell.take(Turn::Input(failed), t0, true, &mut io);
    let compacted = Input::Kv(KvWatchEvent::Compacted {
        compact_revision: 50,
    });
    assert_eq!(
        shell.take(Turn::Input(compacted), t0, true, &mut io),
        Some(RoundEnd::Resnapshot)
    );
    shell.end_round();
    // The stop comes while both sides are read again.
    let end = shell.end_now();
    assert!(!end.cutover);
    assert_eq!(end.unwritten, 2, "both creates failed and are still owed");
    assert_eq!(end.status.identities, 2);
    // And the next round still carries them.
    shell.start_round(read(&[("300", A), ("301", B)], &[], t0), t0, true, &mut io);
    assert_eq!(shell.end_now().unwritten, 2);
}

#[test]
fn each_reservation_command_reaches_the_writer_as_its_request_in_order() {
    let t0 = Instant::now();
    let settings = settings(true, false);
    // An earlier sync left 4003 reserved (at revision 7); Kubernetes still holds it.
    let earlier = BTreeMap::from([(4003, (B.to_string(), 7))]);
    let mut shell = Shell::new(settings, BTreeMap::new(), false);
    let mut io = Recorded::default();
    shell.writer_started(earlier);
    following(
        &mut shell,
        read(&[("4003", B)], &[(4003, B)], t0),
        t0,
        &mut io,
    );
    // Taken over first, once; nothing else to reserve (the kvstore holds no other id).
    let adopted = vec![crate::core::sync::reserve::Earlier {
        id: 4003,
        labels: B.into(),
        revision: 7,
        keep: true,
    }];
    assert_eq!(
        io.requests,
        vec![Request::Adopt(adopted), Request::LookAgain]
    );
    io.requests.clear();
    // An object arrives while that batch is written: reserved once it is answered, at once.
    let c = "k8s:app=c;";
    let upsert = K8sChange::Upsert {
        id: 4001,
        labels: c.into(),
        resource_version: "3".into(),
    };
    shell.take(Turn::Input(Input::K8s(upsert)), t0, true, &mut io);
    assert!(
        io.requests.is_empty(),
        "one batch in flight: {:?}",
        io.requests
    );
    let reply = answer(1, None);
    shell.take(Turn::Reply(reply.clone()), t0, true, &mut io);
    assert_eq!(io.requests, vec![Request::Reserve(vec![(4001, c.into())])]);
    shell.take(Turn::Reply(reply.clone()), t0, true, &mut io);
    io.requests.clear();
    // It goes: its `value/` key goes.
    let deleted = K8sChange::Deleted {
        id: 4001,
        resource_version: "4".into(),
    };
    shell.take(Turn::Input(Input::K8s(deleted)), t0, true, &mut io);
    assert_eq!(io.requests, vec![Request::Unreserve(4001)]);
    shell.take(Turn::Reply(reply), t0, true, &mut io);
    io.requests.clear();
    // The kvstore's GC takes the master key at 4003 while Kubernetes holds it: forgotten,
    // then reserved again.
    let gone = KvChange::Master {
        id: b"4003".to_vec(),
        value: None,
        created: false,
    };
    let changes = Input::Kv(KvWatchEvent::Changes {
        changes: vec![gone],
        revision: 12,
    });
    shell.take(Turn::Input(changes), t0, true, &mut io);
    assert_eq!(
        io.requests,
        vec![
            Request::Forget(4003),
            Request::Reserve(vec![(4003, B.to_string())])
        ]
    );
    // A fresh round adopts nothing again.
    shell.end_round();
    io.requests.clear();
    shell.start_round(read(&[], &[], t0), t0, true, &mut io);
    assert!(
        !io.requests.iter().any(|r| matches!(r, Request::Adopt(_))),
        "{:?}",
        io.requests
    );
}

#[test]
fn the_catch_up_and_the_demos_grace_read_as_documented() {
    assert_eq!(
        catch_up_text(2),
        "wrote 2 CiliumIdentity objects: decided, or missing in Kubernetes, when sync read both sides (counted as mirrored)"
    );
    assert!(catch_up_text(1).starts_with("wrote 1 CiliumIdentity object:"));
    let asked = Duration::from_secs(120);
    assert_eq!(cutover_grace(asked, false), asked);
    assert_eq!(cutover_grace(asked, true), Duration::from_secs(5));
    assert_eq!(
        cutover_grace(Duration::from_secs(3), true),
        Duration::from_secs(3)
    );
}

#[test]
fn only_a_rounds_first_lagless_creates_are_the_catch_up() {
    let t0 = Instant::now();
    // A first batch that fails wrote nothing: no catch-up.
    let (mut shell, mut io, ops) = first_batch_of_two(t0);
    let failed = Input::BatchDone {
        ops: ops.clone(),
        outcome: BatchOutcome::Done {
            results: vec![(300, Outcome::Created), (301, Outcome::Failed)],
            halted: None,
            denied: Vec::new(),
        },
    };
    shell.take(Turn::Input(failed), t0, true, &mut io);
    assert_eq!(io.notes(), vec![catch_up_text(1).as_str()]);
    // The retry of the one that failed has no lag either: said once all the same.
    let later = t0 + Duration::from_secs(11);
    shell.take(Turn::Status { watching: true }, later, true, &mut io);
    settle(&mut shell, later, &mut io);
    let ops = io.writes.pop().expect("the retry");
    assert_eq!(ops.len(), 1);
    shell.take(Turn::Input(created(&ops)), later, true, &mut io);
    assert_eq!(io.notes().len(), 1, "{:?}", io.notes());

    // A round whose first batch fails whole says nothing; one whose first creates arrived
    // through the watch (with a lag) says nothing either.
    let (mut shell, mut io) = shell_with_nothing_read(t0);
    let arrived = Input::Kv(KvWatchEvent::Changes {
        changes: vec![master("302", "k8s:app=c;")],
        revision: 9,
    });
    shell.take(Turn::Input(arrived), t0, true, &mut io);
    settle(&mut shell, t0, &mut io);
    let ops = io.writes.pop().expect("a batch");
    let whole = Input::BatchDone {
        ops: ops.clone(),
        outcome: BatchOutcome::Failed("500".into()),
    };
    shell.take(Turn::Input(whole), t0, true, &mut io);
    assert!(io.notes().is_empty(), "{:?}", io.notes());
    let later = t0 + Duration::from_secs(11);
    shell.take(Turn::Status { watching: true }, later, true, &mut io);
    settle(&mut shell, later, &mut io);
    let ops = io.writes.pop().expect("the retry");
    shell.take(Turn::Input(created(&ops)), later, true, &mut io);
    assert!(io.notes().is_empty(), "{:?}", io.notes());
}

/// A shell following both sides, nothing in either.
fn shell_with_nothing_read(t0: Instant) -> (Shell, Recorded) {
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(&mut shell, read(&[], &[], t0), t0, &mut io);
    (shell, io)
}

#[test]
fn what_the_logs_left_is_taken_over_once_the_lease_is_held_with_its_gate_open() {
    let t0 = Instant::now();
    let mut shell = Shell::new(settings(true, false), BTreeMap::new(), false);
    let mut io = Recorded::default();
    // An earlier writer left 4003 reserved (at revision 7) and its release did not finish.
    shell.writer_started(BTreeMap::from([(4003, (B.to_string(), 7))]));
    // Another sync holds the Lease at the start: nothing is taken over.
    shell.know_holder(LeaseHolder::Other("other".into()));
    shell.start_round(read(&[], &[(4003, B)], t0), t0, false, &mut io);
    assert!(io.requests.is_empty(), "{:?}", io.requests);
    // The Lease is taken while its gate is shut (the renewal came late): still nothing.
    let us = Turn::Input(Input::Lease(LeaseHolder::Us));
    shell.take(us, t0, false, &mut io);
    assert!(io.requests.is_empty(), "{:?}", io.requests);
    // The gate opens: the next command takes it over, once.
    settle(&mut shell, t0 + Duration::from_millis(100), &mut io);
    let adopted = Request::Adopt(vec![crate::core::sync::reserve::Earlier {
        id: 4003,
        labels: B.into(),
        revision: 7,
        keep: true,
    }]);
    assert_eq!(
        io.requests.iter().filter(|r| **r == adopted).count(),
        1,
        "{:?}",
        io.requests
    );
    io.requests.clear();
    settle(&mut shell, t0 + Duration::from_millis(200), &mut io);
    assert!(!io.requests.contains(&adopted), "{:?}", io.requests);
}

#[test]
fn a_restart_counts_what_the_logs_record_as_its_own_until_the_writer_answers_the_adoption() {
    let t0 = Instant::now();
    // An earlier sync reserved 4003 = B; the GC deleted its object while no sync ran. The
    // kvstore still holds the master key, which no node uses.
    let earlier = BTreeMap::from([(4003, (B.to_string(), 7))]);
    let (mut shell, mut io) = shell(settings(true, false), false);
    shell.writer_started(earlier);
    following(&mut shell, read(&[("4003", B)], &[], t0), t0, &mut io);
    settle(&mut shell, t0, &mut io);
    assert!(io.writes.is_empty(), "made again: {:?}", io.writes);
    assert_eq!(shell.machine().state().own_masters, BTreeSet::from([4003]));
    // A reply to a batch without the adoption changes nothing of it.
    shell.take(Turn::Reply(answer(0, None)), t0, true, &mut io);
    settle(&mut shell, t0, &mut io);
    assert!(io.writes.is_empty(), "made again: {:?}", io.writes);
    // The adoption answered: held, so still sync's own.
    let adopted = answer(1, Some([4003].into()));
    shell.take(Turn::Reply(adopted), t0, true, &mut io);
    settle(&mut shell, t0, &mut io);
    assert!(io.writes.is_empty(), "made again: {:?}", io.writes);
    assert_eq!(shell.machine().state().own_masters, BTreeSet::from([4003]));
}

#[test]
fn a_split_there_when_sync_starts_is_counted_and_reported_with_its_nodes() {
    // A restarted sync (its log resumed) reads a split an earlier sync saw: it is one now,
    // and reported, as runbook step 6 needs the nodes to roll next.
    let t0 = Instant::now();
    let (mut shell, mut io) = shell(settings(false, false), false);
    following(
        &mut shell,
        read(&[("300", A)], &[(300, B)], t0),
        t0,
        &mut io,
    );
    assert_eq!(shell.machine.state().status().splits, 1);
    assert_eq!(shell.machine.state().status().splits_found, 1);
    settle(&mut shell, t0 + Duration::from_secs(120), &mut io);
    assert_eq!(io.splits, vec![300]);
}
