//! The executor's rules over a scripted server: each request answered from a queue of
//! answers per id, every wait and log line recorded.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};

use super::*;
use crate::core::at_once::at_once;
use crate::core::planner::{DecidedBy, Kind};

#[derive(Default)]
struct Scripted {
    /// Answers to creates, per id, in order; none left: created.
    creates: RefCell<BTreeMap<u32, VecDeque<RequestError>>>,
    /// What a read after a 409 finds.
    existing: BTreeMap<u32, Existing>,
    /// Answers to reads, per id, in order, before it finds what `existing` holds.
    reads: RefCell<BTreeMap<u32, VecDeque<RequestError>>>,
    deletes: RefCell<BTreeMap<u32, VecDeque<RequestError>>>,
    sent: RefCell<Vec<String>>,
    slept: RefCell<Vec<Duration>>,
    logged: RefCell<Vec<(String, Outcome)>>,
    stopped: Cell<bool>,
    /// The log refuses lines from now on.
    log_full: bool,
    /// Every line logged, whole.
    lines: RefCell<Vec<Record>>,
    /// What the watchers were told, and the totals they see.
    events: RefCell<Vec<ApplyEvent>>,
    progress: RefCell<Progress>,
    /// The server's 429s this batch, as the binary's client counts them.
    throttles: u64,
    /// The gate shuts during the wait that makes this many sleeps (a lease lost meanwhile).
    shut_at_sleep: Option<usize>,
}

impl IdentityWrites for Scripted {
    async fn create(&self, id: u32, _labels: &SecurityLabels) -> Result<Written, RequestError> {
        self.sent.borrow_mut().push(format!("create {id}"));
        match self.creates.borrow_mut().entry(id).or_default().pop_front() {
            Some(e) => Err(e),
            None => Ok(Written {
                uid: format!("u{id}"),
                resource_version: "1".into(),
            }),
        }
    }
    async fn read(&self, id: u32) -> Result<Option<Existing>, RequestError> {
        self.sent.borrow_mut().push(format!("get {id}"));
        match self.reads.borrow_mut().entry(id).or_default().pop_front() {
            Some(e) => Err(e),
            None => Ok(self.existing.get(&id).cloned()),
        }
    }
    async fn delete(&self, id: u32, _expected: &Written) -> Result<(), RequestError> {
        self.sent.borrow_mut().push(format!("delete {id}"));
        match self.deletes.borrow_mut().entry(id).or_default().pop_front() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    async fn sleep(&self, d: Duration) {
        // A wait with no end fails its test rather than hanging it.
        assert!(self.slept.borrow().len() < 10_000, "slept 10,000 times");
        self.slept.borrow_mut().push(d);
        if self.shut_at_sleep == Some(self.slept.borrow().len()) {
            self.stopped.set(true);
        }
    }
    fn held_back(&self) -> Option<&'static str> {
        self.stopped.get().then_some("stopped")
    }
    fn stop(&self) {
        self.stopped.set(true);
    }
    type LogError = String;

    fn log(&self, line: Record) -> Result<(), String> {
        if self.log_full {
            return Err("log.jsonl: No space left on device".into());
        }
        let outcome = line.outcome.expect("an outcome's line");
        self.logged.borrow_mut().push((line.id.clone(), outcome));
        self.lines.borrow_mut().push(line);
        Ok(())
    }
    async fn emit(&self, event: ApplyEvent) {
        self.events.borrow_mut().push(event);
    }
    fn progress(&self, change: impl FnOnce(&mut Progress)) {
        change(&mut self.progress.borrow_mut());
    }
    fn throttled(&self) -> u64 {
        self.throttles
    }
    fn server(&self) -> String {
        "https://api:6443".into()
    }
}

fn status(code: u16, reason: &str, message: &str) -> RequestError {
    RequestError::status(code, reason, message)
}

const LABELS: &str = "k8s:app=web;k8s:io.kubernetes.pod.namespace=shop;";

fn create(id: u32) -> Op {
    Op {
        id: id.to_string(),
        label_key: LABELS.into(),
        kind: Kind::Create,
        op: OpKind::Create,
        target_id: Some(id),
        decided_by: DecidedBy::Proposal,
        expect: None,
        reason: None,
    }
}

/// A 429 from API Priority and Fairness, with the wait it asks for in milliseconds.
fn too_many(retry_after_ms: Option<u64>) -> RequestError {
    RequestError::Status {
        code: 429,
        plain: false,
        reason: "TooManyRequests".into(),
        message: String::new(),
        retry_after: retry_after_ms.map(Duration::from_millis),
    }
}

/// A rollback's delete of `id`, as this tool created it.
fn delete(id: u32) -> Op {
    Op {
        op: OpKind::Delete,
        expect: Some(("u".into(), "1".into())),
        ..create(id)
    }
}

fn one_at_a_time() -> ApplyOptions {
    ApplyOptions {
        concurrency: 1,
        ..ApplyOptions::default()
    }
}

fn run(io: &Scripted, ops: Vec<Op>) -> Result<ApplyReport, String> {
    at_once(carry_out(io, ops, &one_at_a_time())).expect("answers at once")
}

fn outcomes(r: &ApplyReport) -> Vec<(u32, Outcome)> {
    r.results
        .iter()
        .map(|r| (r.target_id.unwrap(), r.outcome))
        .collect()
}

#[test]
fn a_create_refused_by_rbac_is_refused_and_halts_the_batch() {
    let io = Scripted::default();
    let forbidden = status(
        403,
        "Forbidden",
        "ciliumidentities.cilium.io is forbidden: User \"u\" cannot create resource",
    );
    io.creates.borrow_mut().insert(300, [forbidden].into());
    let r = run(&io, vec![create(300), create(301)]).unwrap();
    assert_eq!(
        outcomes(&r),
        [(300, Outcome::Failed), (301, Outcome::NotAttempted)]
    );
    assert!(r.results[0].refused, "the refusal is carried back");
    assert!(r.results[0].error.as_ref().unwrap().contains("403"));
    let stopped = r.stopped.as_deref().unwrap();
    assert!(
        stopped.contains("refused") && stopped.contains("403"),
        "{stopped}"
    );
    // Never retried: waiting does not grant a permission.
    assert_eq!(*io.sent.borrow(), ["create 300"]);
    assert!(io.slept.borrow().is_empty());
}

#[test]
fn a_webhooks_denial_is_that_objects_outcome_in_its_words_and_the_batch_goes_on() {
    let io = Scripted::default();
    let denied = status(
        400,
        "BadRequest",
        "admission webhook \"ids.example.com\" denied the request: id 300 is held",
    );
    io.creates.borrow_mut().insert(300, [denied].into());
    let r = run(&io, vec![create(300), create(301)]).unwrap();
    assert_eq!(
        outcomes(&r),
        [(300, Outcome::Denied), (301, Outcome::Created)]
    );
    assert!(!r.results[0].refused);
    assert!(r.results[0].problem().unwrap().contains("id 300 is held"));
    assert_eq!(r.stopped, None);
    assert_eq!(*io.sent.borrow(), ["create 300", "create 301"]);
    assert_eq!(
        *io.logged.borrow(),
        [
            ("300".to_string(), Outcome::Denied),
            ("301".to_string(), Outcome::Created)
        ]
    );
}

#[test]
fn a_409_reads_what_is_there_and_recognises_this_runs_own_object() {
    let labels = to_security_labels(&parse_label_key(LABELS).unwrap());
    let exists = status(409, "AlreadyExists", "exists");
    let mut io = Scripted::default();
    for id in [300, 301, 302] {
        io.creates.borrow_mut().insert(id, [exists.clone()].into());
    }
    let found = |this_run, labels: SecurityLabels| Existing {
        written: Written {
            uid: "mine".into(),
            resource_version: "7".into(),
        },
        labels,
        this_run,
    };
    let mut other = labels.clone();
    other.insert("k8s:app".into(), "db".into());
    io.existing.insert(300, found(true, labels.clone()));
    io.existing.insert(301, found(false, labels));
    io.existing.insert(302, found(false, other));
    let r = run(&io, vec![create(300), create(301), create(302)]).unwrap();
    assert_eq!(
        outcomes(&r),
        [
            (300, Outcome::Created),
            (301, Outcome::AlreadyExisted),
            (302, Outcome::Conflict)
        ]
    );
    assert_eq!(r.results[0].uid.as_deref(), Some("mine"));
    assert_eq!(r.results[0].resource_version.as_deref(), Some("7"));
    assert_eq!(r.results[1].uid, None);
    assert!(r.results[2].existing.as_ref().unwrap().contains("app=db"));
}

#[test]
fn a_409_whose_read_keeps_failing_counts_each_read_as_an_attempt_and_gives_up() {
    let labels = to_security_labels(&parse_label_key(LABELS).unwrap());
    let mut io = Scripted::default();
    io.creates
        .borrow_mut()
        .insert(300, [status(409, "AlreadyExists", "exists")].into());
    let down = status(500, "InternalError", "etcdserver: leader changed");
    io.reads
        .borrow_mut()
        .insert(300, std::iter::repeat_n(down, 20).collect());
    io.existing.insert(
        300,
        Existing {
            written: Written {
                uid: "theirs".into(),
                resource_version: "3".into(),
            },
            labels,
            this_run: false,
        },
    );
    let r = run(&io, vec![create(300)]).unwrap();
    // The create and the reads after it share the bound: no read is tried for ever.
    let max = ApplyOptions::default().max_attempts;
    assert_eq!(outcomes(&r), [(300, Outcome::Failed)]);
    assert_eq!(r.results[0].attempts, max);
    let reads = io.sent.borrow().iter().filter(|s| *s == "get 300").count();
    assert_eq!(reads, max as usize - 1);
}

#[test]
fn a_429_is_waited_out_uncounted_and_a_500_retried_then_halts() {
    let io = Scripted::default();
    let busy = too_many(Some(250));
    io.creates
        .borrow_mut()
        .insert(300, [busy.clone(), busy].into());
    let down = status(500, "InternalError", "etcdserver: leader changed");
    io.creates
        .borrow_mut()
        .insert(301, std::iter::repeat_n(down, 20).collect());
    let r = run(&io, vec![create(300), create(301), create(302)]).unwrap();
    assert_eq!(
        outcomes(&r),
        [
            (300, Outcome::Created),
            (301, Outcome::Failed),
            (302, Outcome::NotAttempted)
        ]
    );
    assert_eq!(r.results[0].attempts, 1, "a 429 is not an attempt");
    // What the server answered is kept, for a rollback's delete to name exactly.
    assert_eq!(
        (
            r.results[0].uid.as_deref(),
            r.results[0].resource_version.as_deref()
        ),
        (Some("u300"), Some("1"))
    );
    // 250 ms asked for, slept in steps of at most 100 ms, twice.
    let slept = io.slept.borrow();
    assert_eq!(
        slept[..6].iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        [100, 100, 50, 100, 100, 50]
    );
    let opts = ApplyOptions::default();
    assert_eq!(r.results[1].attempts, opts.max_attempts);
    assert_eq!(r.retries, u64::from(opts.max_attempts - 1));
    // The progress line counts them as they happen, as the report does at the end.
    assert_eq!(io.progress.borrow().retries, r.retries);
    assert!(!r.results[1].refused);
    assert!(r.stopped.as_deref().unwrap().contains("kept failing"));
}

#[test]
fn a_gate_that_shuts_while_a_create_waits_to_try_again_stops_it_being_sent_again() {
    // A 500 to retry, a 429 to wait out: the wait ends with the gate shut (the lease lost),
    // and the create is not sent again; it is left to a writer that holds the lease.
    let busy = too_many(None);
    for first in [
        status(500, "InternalError", "etcdserver: leader changed"),
        busy,
    ] {
        let io = Scripted {
            shut_at_sleep: Some(1),
            ..Scripted::default()
        };
        io.creates.borrow_mut().insert(300, [first].into());
        let r = run(&io, vec![create(300)]).unwrap();
        assert_eq!(outcomes(&r), [(300, Outcome::NotAttempted)]);
        assert_eq!(*io.sent.borrow(), ["create 300"], "sent once, not again");
    }
}

#[test]
fn a_delete_refused_or_changed_is_said_so_and_a_log_that_refuses_ends_the_batch() {
    let io = Scripted::default();
    io.deletes
        .borrow_mut()
        .insert(300, [status(409, "Conflict", "precondition failed")].into());
    io.deletes
        .borrow_mut()
        .insert(301, [status(403, "Forbidden", "cannot delete")].into());
    let r = run(&io, vec![delete(300), delete(301), delete(302)]).unwrap();
    assert_eq!(
        outcomes(&r),
        [
            (300, Outcome::Kept),
            (301, Outcome::Failed),
            (302, Outcome::NotAttempted)
        ]
    );
    assert!(r.results[1].refused);
    let full = Scripted {
        log_full: true,
        ..Scripted::default()
    };
    let e = run(&full, vec![create(300), create(301)]).unwrap_err();
    assert!(e.to_string().contains("No space left"), "{e}");
    assert_eq!(
        *full.sent.borrow(),
        ["create 300"],
        "no write after the log refused"
    );
}

#[test]
fn a_delete_waits_out_a_429_retries_a_500_to_its_bound_and_takes_a_404_as_gone() {
    let io = Scripted::default();
    let busy = too_many(Some(150));
    io.deletes.borrow_mut().insert(300, [busy].into());
    io.deletes
        .borrow_mut()
        .insert(301, [status(404, "NotFound", "not found")].into());
    // Any 409 is a precondition that did not hold, whatever reason the server words it with.
    io.deletes
        .borrow_mut()
        .insert(302, [status(409, "AlreadyExists", "exists")].into());
    let down = status(500, "InternalError", "etcdserver: leader changed");
    io.deletes
        .borrow_mut()
        .insert(303, std::iter::repeat_n(down, 20).collect());
    let ids = [300, 301, 302, 303, 304];
    let r = run(&io, ids.into_iter().map(delete).collect()).unwrap();
    assert_eq!(
        outcomes(&r),
        [
            (300, Outcome::Deleted),
            (301, Outcome::AlreadyGone),
            (302, Outcome::Kept),
            (303, Outcome::Failed),
            (304, Outcome::NotAttempted)
        ]
    );
    let max = ApplyOptions::default().max_attempts;
    assert_eq!(r.results[0].attempts, 1, "a 429 is not an attempt");
    assert_eq!(r.results[1].attempts, 1);
    assert_eq!(r.results[3].attempts, max);
    assert_eq!(r.retries, u64::from(max - 1));
    let sent = io.sent.borrow();
    let deletes = sent.iter().filter(|s| *s == "delete 303").count();
    assert_eq!(deletes, max as usize);
    assert!(r.stopped.as_deref().unwrap().contains("kept failing"));
    // The 429's wait, in steps of at most 100 ms, before any retry's.
    assert_eq!(
        io.slept.borrow()[..2],
        [Duration::from_millis(100), Duration::from_millis(50)]
    );
}

#[test]
fn a_stop_during_a_deletes_wait_to_try_again_sends_it_no_more() {
    let io = Scripted {
        shut_at_sleep: Some(1),
        ..Scripted::default()
    };
    let down = status(500, "InternalError", "etcdserver: leader changed");
    io.deletes.borrow_mut().insert(300, [down].into());
    let r = run(&io, vec![delete(300), delete(301)]).unwrap();
    assert_eq!(
        outcomes(&r),
        [(300, Outcome::NotAttempted), (301, Outcome::NotAttempted)]
    );
    assert_eq!(*io.sent.borrow(), ["delete 300"]);
}

#[test]
fn a_stop_during_a_deletes_wait_for_a_429_sends_it_no_more() {
    let io = Scripted {
        shut_at_sleep: Some(1),
        ..Scripted::default()
    };
    let busy = too_many(Some(500));
    io.deletes.borrow_mut().insert(300, [busy].into());
    let r = run(&io, vec![delete(300)]).unwrap();
    assert_eq!(outcomes(&r), [(300, Outcome::NotAttempted)]);
    assert_eq!(*io.sent.borrow(), ["delete 300"]);
    // The wait ends at the stop, not after the 500 ms asked for.
    assert_eq!(*io.slept.borrow(), [Duration::from_millis(100)]);
}

#[test]
fn a_refusal_heard_is_said_even_when_the_log_cannot_keep_its_line() {
    let full = Scripted {
        log_full: true,
        ..Scripted::default()
    };
    full.creates
        .borrow_mut()
        .insert(300, [status(403, "Forbidden", "cannot create")].into());
    let r = run(&full, vec![create(300), create(301)]).expect("the refusal, not the log");
    assert!(r.results[0].refused);
    assert_eq!(*full.sent.borrow(), ["create 300"]);
}

#[test]
fn the_watchers_see_what_was_done_and_the_log_names_each_decision() {
    let io = Scripted {
        throttles: 3,
        ..Scripted::default()
    };
    io.creates.borrow_mut().insert(
        301,
        [status(
            400,
            "BadRequest",
            "admission webhook \"w\" denied the request: no",
        )]
        .into(),
    );
    let with = |id: u32, op: OpKind, expect: Option<(&str, &str)>| Op {
        op,
        expect: expect.map(|(u, rv)| (u.to_string(), rv.to_string())),
        decided_by: DecidedBy::Operator,
        ..create(id)
    };
    let ops = vec![
        create(300),
        create(301),
        with(302, OpKind::Map, None),
        with(303, OpKind::Skip, None),
        with(304, OpKind::AlreadyDone, None),
        with(305, OpKind::Delete, Some(("u305", "4"))),
        with(306, OpKind::Delete, Some(("u306", ""))),
        with(307, OpKind::Keep, None),
    ];
    let r = run(&io, ops).unwrap();
    let started: Vec<_> = io
        .events
        .borrow()
        .iter()
        .filter_map(|e| match e {
            ApplyEvent::Started {
                writes,
                deletes,
                already_gone,
                total,
            } => Some((*writes, *deletes, *already_gone, *total)),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        [(4, 2, 1, 8)],
        "writes, deletes, already gone, total"
    );
    let problems: Vec<String> = io
        .events
        .borrow()
        .iter()
        .filter_map(|e| match e {
            ApplyEvent::Problem(p) => Some(p.id.clone()),
            _ => None,
        })
        .collect();
    // The denial, and the object a rollback keeps: each said as it happens.
    assert_eq!(problems, ["301", "307"]);
    assert_eq!(
        *io.progress.borrow(),
        Progress {
            total: 8,
            writes: 4,
            done: 8,
            created: 1,
            deleted: 2,
            failed: 2,
            retries: 0,
            throttled: 3,
        }
    );
    assert_eq!(r.throttled, 3);
    assert_eq!(r.count(Outcome::Created), 1);
    assert_eq!(r.count(Outcome::Denied), 1);
    assert!(!r.succeeded(), "a denial is a problem");
    // Each line names the decision carried out and who took it: what a resume and an
    // auditor read.
    let named: Vec<(String, Option<String>, Option<String>)> = io
        .lines
        .borrow()
        .iter()
        .map(|l| (l.id.clone(), l.action.clone(), l.decided_by.clone()))
        .collect();
    let want = |id: &str, action: &str, by: &str| {
        (
            id.to_string(),
            Some(action.to_string()),
            Some(by.to_string()),
        )
    };
    assert_eq!(
        named,
        [
            want("300", "create", "proposal"),
            want("301", "create", "proposal"),
            want("302", "map", "operator"),
            want("303", "skip", "operator"),
            want("304", "none", "operator"),
            want("305", "delete", "operator"),
            want("306", "delete", "operator"),
            want("307", "keep", "operator"),
        ]
    );
    let fine = run(&Scripted::default(), vec![create(310)]).unwrap();
    assert!(fine.succeeded() && fine.count(Outcome::Created) == 1);
}
