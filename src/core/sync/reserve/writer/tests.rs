//! The reservation writer against an etcd and a decision log kept in memory: what it
//! writes, in what order, what it logs, and what it says.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::core::at_once::at_once;

const A: &str = "k8s:app=a;";
const B: &str = "k8s:app=b;";
const C: &str = "k8s:app=c;";

/// etcd's keys of the tool and the decision log, in memory.
#[derive(Default)]
struct Kv {
    gate_shut: bool,
    /// `id/<id>`: labels and the revision written at.
    masters: BTreeMap<u32, (LabelKey, i64)>,
    /// `value/<labels>/<node>` of the tool's, on a lease.
    values: BTreeMap<LabelKey, i64>,
    leases: BTreeSet<i64>,
    last_lease: i64,
    revision: i64,
    log: Vec<WriteLine>,
    reserve_fails: bool,
    /// Master keys a node's `value/` key uses.
    in_use: BTreeSet<u32>,
    written: u64,
    held: usize,
}

impl Kv {
    fn with_lease() -> (Kv, Writer) {
        let mut kv = Kv::default();
        let lease = at_once(kv.grant()).unwrap().unwrap();
        (kv, Writer::new(lease))
    }

    /// The lease lapses (etcd out of reach longer than its TTL): its `value/` keys go.
    fn lapse(&mut self, lease: i64) {
        self.leases.remove(&lease);
        self.values.retain(|_, l| *l != lease);
    }

    fn actions(&self) -> Vec<(u32, &'static str, Option<i64>)> {
        self.log
            .iter()
            .map(|l| (l.id, l.action, l.revision))
            .collect()
    }
}

impl KvWrites for Kv {
    fn may_write(&self) -> bool {
        !self.gate_shut
    }
    fn log(&mut self, line: WriteLine) -> Result<(), String> {
        self.log.push(line);
        Ok(())
    }
    fn counted(&mut self, n: u64, held: usize) {
        self.written += n;
        self.held = held;
    }
    async fn grant(&mut self) -> Result<i64, String> {
        self.last_lease += 1;
        self.leases.insert(self.last_lease);
        Ok(self.last_lease)
    }
    async fn keep_alive(&mut self, lease: i64) -> Result<bool, String> {
        Ok(self.leases.contains(&lease))
    }
    async fn reserve(
        &mut self,
        id: u32,
        labels: &LabelKey,
        lease: i64,
    ) -> Result<Reserved, String> {
        if self.reserve_fails {
            return Err("etcd: context deadline exceeded".into());
        }
        if let Some((held, _)) = self.masters.get(&id) {
            return Ok(Reserved::Held(held.as_bytes().to_vec()));
        }
        self.revision += 1;
        self.masters.insert(id, (labels.clone(), self.revision));
        self.values.insert(labels.clone(), lease);
        Ok(Reserved::Written {
            revision: self.revision,
        })
    }
    async fn restore(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
        lease: i64,
    ) -> Result<bool, String> {
        let as_written = self.masters.get(&id) == Some(&(labels.clone(), revision));
        if as_written {
            self.values.insert(labels.clone(), lease);
        }
        Ok(as_written)
    }
    async fn unreserve(&mut self, labels: &LabelKey) -> Result<bool, String> {
        Ok(self.values.remove(labels).is_some())
    }
    async fn master_revision(&mut self, id: u32) -> Option<i64> {
        self.masters.get(&id).map(|(_, r)| *r)
    }
    async fn revoke(&mut self, lease: i64) -> Result<(), String> {
        self.lapse(lease);
        Ok(())
    }
    async fn release(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
    ) -> Result<Released, String> {
        let as_written = self.masters.get(&id) == Some(&(labels.clone(), revision));
        if !as_written || self.in_use.contains(&id) {
            return Ok(Released::Kept("changed since, or a node uses it"));
        }
        self.masters.remove(&id);
        Ok(Released::Deleted)
    }
}

fn reserve(w: &mut Writer, kv: &mut Kv, ids: &[(u32, &str)]) -> Option<Reply> {
    let wanted = ids.iter().map(|(id, l)| (*id, l.to_string())).collect();
    handle(w, kv, vec![Request::Reserve(wanted)])
}

/// One batch, answered.
fn handle(w: &mut Writer, kv: &mut Kv, batch: Vec<Request>) -> Option<Reply> {
    Some(at_once(w.handle(batch, kv)).unwrap())
}

fn note(reply: Option<Reply>) -> String {
    match reply.and_then(|r| r.said) {
        Some(Said::Note(n)) => n,
        other => panic!("expected a note, got {other:?}"),
    }
}

#[test]
fn each_reservation_is_announced_then_logged_with_its_revision_and_the_masters_reported() {
    let (mut kv, mut w) = Kv::with_lease();
    let r = reserve(&mut w, &mut kv, &[(300, A), (301, B)]).unwrap();
    assert_eq!((r.batch, r.failed, r.held, r.said), (true, false, 2, None));
    assert_eq!(r.own_masters, Some(BTreeSet::from([300, 301])));
    assert_eq!(
        kv.actions(),
        vec![
            (300, "reserving", None),
            (300, "reserve-in-kvstore", Some(1)),
            (301, "reserving", None),
            (301, "reserve-in-kvstore", Some(2)),
        ]
    );
    assert_eq!((kv.written, kv.held, w.masters_written()), (4, 2, 2));
    assert_eq!(kv.values.get(A), Some(&w.lease()));
    // Reserved once: asked again, nothing is written, and the masters are not told again.
    let again = reserve(&mut w, &mut kv, &[(300, A)]).unwrap();
    assert_eq!((again.own_masters, kv.log.len()), (None, 4));
    // With nothing to say and nothing changed, a keep-alive answers nothing.
    assert_eq!(at_once(w.tick(&mut kv)).unwrap(), None);
}

#[test]
fn a_master_key_held_already_is_logged_and_left_and_a_shut_gate_stops_the_batch() {
    let (mut kv, mut w) = Kv::with_lease();
    kv.masters.insert(300, (C.into(), 7));
    let r = reserve(&mut w, &mut kv, &[(300, A)]).unwrap();
    assert_eq!((r.failed, r.held, r.own_masters), (false, 0, None));
    assert_eq!(kv.actions()[1], (300, "reserve-in-kvstore", None));
    assert!(kv.log[1].kvstore.contains(&format!("already held for {C}")));
    assert_eq!((w.masters_written(), kv.written), (0, 0));
    kv.gate_shut = true;
    let r = reserve(&mut w, &mut kv, &[(301, B)]).unwrap();
    assert_eq!((r.batch, r.failed), (true, true));
    assert_eq!(
        kv.log.len(),
        2,
        "nothing is written or logged with the gate shut"
    );
}

#[test]
fn a_failed_write_is_trouble_unless_the_lease_was_gone_which_a_new_one_replaces() {
    let (mut kv, mut w) = Kv::with_lease();
    reserve(&mut w, &mut kv, &[(300, A)]);
    kv.reserve_fails = true;
    let r = reserve(&mut w, &mut kv, &[(301, B)]).unwrap();
    assert!(r.failed);
    assert_eq!(
        r.said,
        Some(Said::Trouble(
            "reserving in the kvstore: etcd: context deadline exceeded".into()
        ))
    );
    // etcd out of reach longer than the TTL: the write fails and the lease is found gone.
    let old = w.lease();
    kv.lapse(old);
    let r = reserve(&mut w, &mut kv, &[(301, B)]);
    let said = note(r);
    assert!(
        said.contains("a new lease holds 1 reservations again (0 changed since and left alone)"),
        "{said}"
    );
    assert_ne!(w.lease(), old);
    assert_eq!(kv.values.get(A), Some(&w.lease()));
}

#[test]
fn a_keep_alive_that_finds_the_lease_gone_puts_back_what_is_as_written_and_counts_both() {
    let (mut kv, mut w) = Kv::with_lease();
    reserve(&mut w, &mut kv, &[(300, A), (301, B), (302, C)]);
    kv.lapse(w.lease());
    // 301 changed since (the kvstore's GC, then an agent).
    kv.masters.insert(301, ("k8s:app=d;".into(), 40));
    kv.written = 0;
    let said = note(at_once(w.tick(&mut kv)).unwrap());
    assert!(
        said.contains("a new lease holds 2 reservations again (1 changed since and left alone)"),
        "{said}"
    );
    assert_eq!((kv.held, kv.written, w.masters_written()), (2, 2, 2));
    assert!(!kv.values.contains_key(B));
    // Said once: the next keep-alive has nothing to say.
    assert_eq!(at_once(w.tick(&mut kv)).unwrap(), None);
}

fn earlier(id: u32, labels: &str, revision: i64, keep: bool) -> Earlier {
    Earlier {
        id,
        labels: labels.into(),
        revision,
        keep,
    }
}

#[test]
fn adoption_puts_back_what_is_as_written_and_says_how_many_of_each() {
    let (mut kv, mut w) = Kv::with_lease();
    kv.masters.insert(300, (A.into(), 11));
    kv.masters.insert(301, (B.into(), 12));
    let adopt = |e| vec![Request::Adopt(e)];
    let r = handle(
        &mut w,
        &mut kv,
        adopt(vec![earlier(300, A, 11, true), earlier(301, B, 99, true)]),
    );
    let said = note(r);
    assert!(
        said.contains("took over 1 reservations an earlier sync made and did not release (1 changed since and left alone)"),
        "{said}"
    );
    assert_eq!(kv.values.get(A), Some(&w.lease()));
    // One as written alone is said too; one whose object is gone waits for the release.
    kv.masters.insert(302, (C.into(), 13));
    let r = handle(&mut w, &mut kv, adopt(vec![earlier(302, C, 13, true)]));
    assert!(note(r).contains("took over 1 reservations"));
    kv.masters.insert(303, ("k8s:app=d;".into(), 14));
    let r = handle(
        &mut w,
        &mut kv,
        adopt(vec![earlier(303, "k8s:app=d;", 14, false)]),
    );
    assert_eq!(r.and_then(|r| r.said), None);
    assert_eq!(w.masters_written(), 3);
}

#[test]
fn an_earlier_reservation_whose_object_and_master_key_are_gone_is_not_taken_over() {
    let (mut kv, mut w) = Kv::with_lease();
    // 300's object went and Cilium's GC took its master key; 301's object went, its key
    // is as written (waits for the release); 302's key was written again by an agent.
    kv.masters.insert(301, (B.into(), 12));
    kv.masters.insert(302, (C.into(), 40));
    let r = handle(
        &mut w,
        &mut kv,
        vec![Request::Adopt(vec![
            earlier(300, A, 11, false),
            earlier(301, B, 12, false),
            earlier(302, C, 13, false),
        ])],
    )
    .unwrap();
    assert_eq!(r.own_masters, Some(BTreeSet::from([301])));
    assert!(
        matches!(&r.said, Some(Said::Note(n)) if n.contains("(2 changed since and left alone)")),
        "{:?}",
        r.said
    );
    // 300 is free to be reserved again.
    assert!(
        reserve(&mut w, &mut kv, &[(300, "k8s:app=e;")])
            .is_some_and(|r| r.own_masters == Some(BTreeSet::from([300, 301])))
    );
}

#[test]
fn what_adoption_could_not_put_back_with_the_gate_shut_goes_back_at_a_keep_alive() {
    let (mut kv, mut w) = Kv::with_lease();
    kv.masters.insert(300, (A.into(), 11));
    kv.masters.insert(301, (B.into(), 12));
    kv.gate_shut = true;
    let r = handle(
        &mut w,
        &mut kv,
        vec![Request::Adopt(vec![
            earlier(300, A, 11, true),
            earlier(301, B, 12, true),
        ])],
    );
    assert_eq!(r.and_then(|r| r.said), None);
    assert!(kv.values.is_empty());
    // Nothing goes back while the gate is shut.
    assert_eq!(at_once(w.tick(&mut kv)).unwrap().and_then(|r| r.said), None);
    kv.gate_shut = false;
    let said = note(at_once(w.tick(&mut kv)).unwrap());
    assert!(
        said.contains("put 2 reservations on this sync's lease that an earlier failure left undone (0 changed since and left alone)"),
        "{said}"
    );
    assert_eq!(kv.values.len(), 2);
}

#[test]
fn what_the_gate_held_back_goes_with_the_loops_next_batch_and_frees_what_changed_for_it() {
    let (mut kv, mut w) = Kv::with_lease();
    kv.masters.insert(300, (A.into(), 11));
    kv.masters.insert(301, (B.into(), 12));
    kv.gate_shut = true;
    let adopt = vec![Request::Adopt(vec![
        earlier(300, A, 11, true),
        earlier(301, B, 12, true),
    ])];
    let r = handle(&mut w, &mut kv, adopt).unwrap();
    assert!(r.deferred, "what waits for the gate is said: {r:?}");
    // Meanwhile Cilium's GC took 301's master key: the log still records it as reserved.
    kv.masters.remove(&301);
    kv.gate_shut = false;
    // The loop's next batch, not a keep-alive: 300 goes back, 301 is found changed and is
    // no longer held, so the same batch reserves it again.
    let r = handle(
        &mut w,
        &mut kv,
        vec![Request::Deferred, Request::Reserve(vec![(301, B.into())])],
    )
    .unwrap();
    assert!(!r.deferred, "{r:?}");
    assert_eq!(kv.values.len(), 2);
    assert_eq!(kv.masters.get(&300).map(|(_, rev)| *rev), Some(11));
    assert!(kv.masters.get(&301).is_some_and(|(_, rev)| *rev != 12));
    // The same ids held as before the batch (301 at a new revision): nothing to tell.
    assert_eq!((r.own_masters, r.held), (None, 2));
    // Nothing left: the next batch asks nothing of it.
    let r = handle(&mut w, &mut kv, vec![Request::Deferred]).unwrap();
    assert_eq!((r.deferred, r.said), (false, None));
}

#[test]
fn a_deleted_object_takes_its_value_key_along_and_a_forgotten_id_is_reserved_again() {
    let (mut kv, mut w) = Kv::with_lease();
    reserve(&mut w, &mut kv, &[(300, A)]);
    kv.written = 0;
    let r = handle(&mut w, &mut kv, vec![Request::Unreserve(300)]).unwrap();
    assert_eq!((r.batch, r.said, r.own_masters), (true, None, None));
    assert!(!kv.values.contains_key(A));
    assert_eq!((kv.written, kv.held, w.masters_written()), (1, 0, 1));
    let tail: Vec<_> = kv.actions().into_iter().skip(2).collect();
    assert_eq!(
        tail,
        vec![(300, "unreserving", None), (300, "unreserve", None)]
    );
    // The kvstore's GC deleted the master key: forgotten, and reserved again when asked.
    kv.masters.remove(&300);
    let r = handle(&mut w, &mut kv, vec![Request::Forget(300)]);
    assert_eq!(r.and_then(|r| r.own_masters), Some(BTreeSet::new()));
    reserve(&mut w, &mut kv, &[(300, A)]);
    assert_eq!(kv.masters.get(&300).map(|(_, r)| *r), Some(2));
}

#[test]
fn a_batch_goes_on_past_a_failed_reservation_and_says_its_first_trouble() {
    let (mut kv, mut w) = Kv::with_lease();
    reserve(&mut w, &mut kv, &[(300, A)]);
    kv.reserve_fails = true;
    let r = handle(
        &mut w,
        &mut kv,
        vec![
            Request::Reserve(vec![(301, B.into())]),
            Request::Unreserve(300),
        ],
    )
    .unwrap();
    assert_eq!((r.batch, r.failed, r.held), (true, true, 0));
    assert!(
        matches!(&r.said, Some(Said::Trouble(t)) if t.contains("deadline exceeded")),
        "{:?}",
        r.said
    );
    assert!(
        !kv.values.contains_key(A),
        "the delete after the failed write was still made"
    );
}

#[test]
fn the_release_revokes_then_deletes_what_is_unused_and_as_written_and_counts_it() {
    let (mut kv, mut w) = Kv::with_lease();
    reserve(&mut w, &mut kv, &[(300, A), (301, B), (302, C)]);
    kv.in_use.insert(301);
    kv.written = 0;
    assert_eq!(at_once(w.release(&mut kv)).unwrap(), Ok(2));
    assert!(kv.leases.is_empty() && kv.values.is_empty());
    assert_eq!(kv.written, 2);
    assert_eq!(kv.masters.keys().copied().collect::<Vec<_>>(), vec![301]);
    let released: Vec<_> = kv.log.iter().skip(6).map(|l| l.action).collect();
    assert_eq!(
        released,
        vec![
            "releasing",
            "release-reservation",
            "releasing",
            "release-reservation",
            "releasing",
            "release-reservation"
        ]
    );
    assert!(kv.log[9].kvstore.starts_with("kept id/301"));
}

#[test]
fn a_release_with_the_gate_shut_writes_nothing() {
    let (mut kv, mut w) = Kv::with_lease();
    reserve(&mut w, &mut kv, &[(300, A)]);
    kv.gate_shut = true;
    assert_eq!(
        at_once(w.release(&mut kv)).unwrap(),
        Err(NOT_HOLDING.into())
    );
    assert_eq!((kv.leases.len(), kv.masters.len(), kv.log.len()), (1, 1, 2));
}

#[test]
fn the_answer_to_an_adoption_always_says_what_is_held_even_if_nothing_changed() {
    let (mut kv, mut w) = Kv::with_lease();
    // The master key went since (Cilium's GC): nothing is taken over, and the loop, which
    // counted 300 as sync's own until now, is told so.
    let r = handle(
        &mut w,
        &mut kv,
        vec![Request::Adopt(vec![earlier(300, A, 11, false)])],
    )
    .unwrap();
    assert_eq!(r.own_masters, Some(BTreeSet::new()));
    // Not again until something changes.
    let r = handle(&mut w, &mut kv, vec![Request::LookAgain]).unwrap();
    assert_eq!(r.own_masters, None);
}
