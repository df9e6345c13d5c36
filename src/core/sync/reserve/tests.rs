//! The reservations' rules: what is asked for and when, and what each answer changes.

use super::*;
use crate::core::sync::KvChange;

pub(super) const A: &str = "k8s:app=a;";
pub(super) const B: &str = "k8s:app=b;";

pub(super) fn range() -> IdRange {
    IdRange::for_cluster(0).unwrap()
}

/// Kubernetes holds 300 = A and 301 = B; the kvstore holds 301.
pub(super) fn state() -> SyncState {
    let mut s = SyncState::default();
    s.k8s.insert(300, A.into());
    s.k8s.insert(301, B.into());
    s.k8s.insert(70_000, B.into());
    s.apply_kv_change(
        KvChange::Master {
            id: b"301".to_vec(),
            value: Some(B.as_bytes().to_vec()),
            created: true,
        },
        Instant::now(),
    );
    s
}

fn reply(batch: bool, failed: bool, said: Option<Said>) -> Reply {
    Reply {
        held: 1,
        own_masters: Some([300].into()),
        batch,
        failed,
        deferred: false,
        said,
    }
}

#[test]
fn the_first_batch_is_the_whole_view_the_kvstore_lacks_in_range() {
    let t0 = Instant::now();
    let mut q = Queue::default();
    q.pump(&state(), range(), t0);
    assert_eq!(q.take_requests(), [Request::Reserve(vec![(300, A.into())])]);
    // One batch at a time: nothing more until it is answered.
    q.want(302, A.into());
    q.pump(&state(), range(), t0);
    assert!(q.take_requests().is_empty());
    assert_eq!((q.held(), q.own_masters().len()), (0, 0));
    assert_eq!(q.on_reply(reply(true, false, None), t0), None);
    assert_eq!((q.held(), q.own_masters()), (1, &[300].into()));
    q.pump(&state(), range(), t0);
    assert_eq!(
        q.take_requests(),
        [Request::Reserve(vec![(302, A.into())])],
        "only what was queued: the view is not due again"
    );
    // A fresh view (a new snapshot, the Lease taken): the whole view again.
    q.on_reply(reply(true, false, None), t0);
    q.view_changed();
    q.pump(&state(), range(), t0);
    assert_eq!(q.take_requests(), [Request::Reserve(vec![(300, A.into())])]);
}

#[test]
fn a_failed_batch_looks_at_the_whole_view_again_and_trouble_waits_first() {
    let t0 = Instant::now();
    let mut q = Queue::default();
    q.pump(&state(), range(), t0);
    q.take_requests();
    // A closed gate: the whole view at once.
    q.on_reply(reply(true, true, None), t0);
    q.pump(&state(), range(), t0);
    assert_eq!(q.take_requests(), [Request::Reserve(vec![(300, A.into())])]);
    // A failed write: the whole view, after the wait.
    let said = q.on_reply(reply(true, true, Some(Said::Trouble("down".into()))), t0);
    assert_eq!(said, Some(Said::Trouble("down".into())));
    q.pump(
        &state(),
        range(),
        t0 + RETRY_AFTER_FAILURE - Duration::from_millis(1),
    );
    assert!(q.take_requests().is_empty());
    q.pump(&state(), range(), t0 + RETRY_AFTER_FAILURE);
    assert_eq!(q.take_requests(), [Request::Reserve(vec![(300, A.into())])]);
}

#[test]
fn deletes_forgets_and_adoptions_go_out_in_order_in_the_next_batch_never_beside_one() {
    let t0 = Instant::now();
    let mut q = Queue::default();
    q.adopt(Vec::new());
    q.want(302, A.into());
    q.deleted(302);
    q.master_gone(303, Some(B.into()));
    q.master_gone(304, None);
    let earlier = Earlier {
        id: 305,
        labels: A.into(),
        revision: 9,
        keep: true,
    };
    q.adopt(vec![earlier.clone()]);
    assert!(q.take_requests().is_empty(), "nothing goes before a pump");
    let mut s = state();
    s.k8s.clear();
    q.pump(&s, range(), t0);
    assert_eq!(
        q.take_requests(),
        [
            Request::Unreserve(302),
            Request::Forget(303),
            Request::Forget(304),
            Request::Adopt(vec![earlier]),
            Request::Reserve(vec![(303, B.into())]),
        ],
        "in the order they came, a deleted id not reserved, nothing to adopt not sent"
    );
    // A delete while that batch is written waits for its answer: one batch in flight.
    q.deleted(303);
    q.pump(&s, range(), t0);
    assert!(q.take_requests().is_empty());
    q.on_reply(reply(true, false, None), t0);
    q.pump(&s, range(), t0);
    assert_eq!(q.take_requests(), [Request::Unreserve(303)]);
    // At the release, what is pending goes at once, answered or not.
    q.master_gone(306, None);
    q.pump(&s, range(), t0);
    assert!(q.take_requests().is_empty());
    q.flush();
    assert_eq!(q.take_requests(), [Request::Forget(306)]);
}

#[test]
fn the_ledger_reserves_once_never_an_invalid_key_and_counts_what_it_holds() {
    let mut l = Ledger::default();
    assert!(l.should_reserve(300, &A.into()));
    assert!(!l.should_reserve(300, &"no label key".into()));
    l.reserved(300, A.into(), 7);
    assert!(!l.should_reserve(300, &A.into()));
    l.found_held(301);
    assert!(!l.should_reserve(301, &B.into()));
    assert_eq!((l.count(), l.masters_written()), (1, 1));
    assert_eq!(l.own_masters(), [300].into());
    // The master key went: both are looked at afresh.
    l.forget(301, None);
    assert!(l.should_reserve(301, &B.into()));
    // Found held again, then a fresh read of the kvstore: tried again when asked (a key
    // that went before a compaction is never seen go); what is reserved stays.
    l.found_held(301);
    l.look_again();
    assert!(l.should_reserve(301, &B.into()));
    assert!(!l.should_reserve(300, &A.into()));
    l.forget(300, Some(6));
    assert_eq!(l.count(), 0);
}

#[test]
fn a_reservation_written_after_the_deletion_the_loop_saw_is_not_forgotten() {
    // Reserve(300) was queued, a key at 300 came and went (an agent's, Cilium's GC), and
    // the writer carried the reservation out before it heard of the deletion.
    let mut l = Ledger::default();
    l.reserved(300, A.into(), 78);
    l.forget(300, Some(78));
    assert_eq!(l.own_masters(), [300].into(), "still the key it wrote");
    // Gone since (or written again by someone else): forgotten.
    l.forget(300, Some(80));
    assert!(l.own_masters().is_empty());
}

#[test]
fn an_object_that_went_is_unreserved_now_or_at_the_keep_alive_and_its_master_kept() {
    let mut l = Ledger::default();
    assert_eq!(l.object_deleted(300, true), Unreserve::Nothing);
    l.reserved(300, A.into(), 7);
    assert_eq!(l.object_deleted(300, false), Unreserve::Later);
    assert_eq!(l.take_to_unreserve(), [300]);
    assert!(l.take_to_unreserve().is_empty());
    assert_eq!(l.object_deleted(300, true), Unreserve::Now(A.into()));
    l.unreserve_failed(300);
    assert_eq!(l.take_to_unreserve(), [300]);
    l.unreserved(300);
    // The value/ key is gone; the master key waits for the release.
    assert_eq!((l.count(), l.masters_written()), (0, 1));
    assert_eq!(l.to_release(), [(300, A.into(), 7)]);
}

#[test]
fn a_lost_lease_puts_back_what_is_still_reserved_until_each_is_answered() {
    let mut l = Ledger::default();
    l.reserved(300, A.into(), 7);
    l.reserved(301, B.into(), 8);
    l.unreserved(301);
    assert!(!l.restore_due());
    l.lease_lost();
    assert!(l.restore_due());
    assert_eq!(l.next_to_restore(), Some((300, A.into(), 7)));
    // Still due until answered (a failed write leaves it for the next keep-alive).
    assert_eq!(l.next_to_restore(), Some((300, A.into(), 7)));
    l.put_back(300, A.into(), 7, false);
    assert_eq!(l.next_to_restore(), None);
    assert_eq!(
        l.own_masters(),
        [301].into(),
        "changed since: no longer held"
    );
}

#[test]
fn adoption_holds_everything_at_once_and_what_fails_midway_stays_due() {
    let mut l = Ledger::default();
    l.reserved(300, A.into(), 1);
    let e = |id, keep| Earlier {
        id,
        labels: B.into(),
        revision: 5,
        keep,
    };
    l.adopt(vec![
        e(300, true),
        e(301, true),
        e(302, false),
        e(303, true),
    ]);
    assert_eq!(
        l.masters_written(),
        4,
        "every master key left is this sync's own now"
    );
    assert_eq!(l.own_masters(), [300, 301, 302, 303].into());
    assert_eq!(
        l.count(),
        3,
        "302's object is gone: its master key waits for the release"
    );
    // 300 was held already: not written again. 301 and 303 go back, in order; a failure
    // after 301 leaves 303 due for the next keep-alive.
    assert_eq!(l.next_to_restore(), Some((301, B.into(), 5)));
    l.put_back(301, B.into(), 5, true);
    assert_eq!(l.next_to_restore(), Some((303, B.into(), 5)));
    assert!(l.restore_due());
    l.put_back(303, B.into(), 5, false);
    assert!(!l.restore_due());
    assert_eq!(l.own_masters(), [300, 301, 302].into());
}

#[test]
fn only_the_holder_takes_over_what_an_earlier_sync_left_and_only_once() {
    let s = state();
    let mut earlier: Unreleased = [(300, (A.into(), 3)), (301, (A.into(), 4))].into();
    assert!(earlier_to_adopt(&mut earlier, &s, false).is_empty());
    assert_eq!(earlier.len(), 2, "kept for when it holds the Lease");
    let taken = earlier_to_adopt(&mut earlier, &s, true);
    assert_eq!(
        taken.iter().map(|e| (e.id, e.keep)).collect::<Vec<_>>(),
        [(300, true), (301, false)],
        "301 holds other labels in Kubernetes now"
    );
    assert!(earlier_to_adopt(&mut earlier, &s, true).is_empty());
}

#[test]
fn what_is_left_unreleased_is_the_last_reservation_of_each_id_not_released_since() {
    let mut made = Unreleased::new();
    made.insert(299, (A.into(), 2));
    note_unreleased(
        &mut made,
        [
            Recorded::Reserved {
                id: 300,
                labels: A.into(),
                revision: 5,
            },
            Recorded::Reserved {
                id: 301,
                labels: B.into(),
                revision: 6,
            },
            Recorded::Released { id: 300 },
            Recorded::Released { id: 299 },
            Recorded::Reserved {
                id: 301,
                labels: B.into(),
                revision: 9,
            },
        ],
    );
    let left: Vec<_> = made.into_iter().collect();
    assert_eq!(left, vec![(301, (B.into(), 9))]);
}

#[test]
fn the_keep_alive_comes_a_period_after_the_start_and_a_late_one_is_not_made_up() {
    let t0 = Instant::now();
    let mut k = KeepAlive::from(t0);
    assert_eq!(k.next(), t0 + KEEP_ALIVE_EVERY);
    assert!(!k.due(t0));
    assert!(!k.due(t0 + KEEP_ALIVE_EVERY - Duration::from_millis(1)));
    assert!(k.due(t0 + KEEP_ALIVE_EVERY));
    assert!(!k.due(t0 + KEEP_ALIVE_EVERY), "once per period");
    // Three periods late (a long batch): one keep-alive now, the next a period after it.
    let late = t0 + KEEP_ALIVE_EVERY * 4;
    assert!(k.due(late));
    assert!(!k.due(late + KEEP_ALIVE_EVERY / 2));
    assert_eq!(k.next(), late + KEEP_ALIVE_EVERY);
    // Well within the lease's TTL: ten in a row may fail before it lapses.
    assert!(KEEP_ALIVE_EVERY * 11 <= Duration::from_secs(super::writer::LEASE_TTL_SECS as u64));
}

#[test]
fn what_the_writer_left_for_the_gate_is_asked_for_first_at_the_next_batch_until_done() {
    let t0 = Instant::now();
    let mut q = Queue::default();
    q.pump(&state(), range(), t0);
    q.take_requests();
    q.want(302, B.into());
    let mut left = reply(true, true, None);
    left.deferred = true;
    q.on_reply(left, t0);
    q.pump(&state(), range(), t0);
    let asked = q.take_requests();
    assert_eq!(asked.first(), Some(&Request::Deferred), "{asked:?}");
    assert!(
        matches!(asked.get(1), Some(Request::Reserve(_))),
        "{asked:?}"
    );
    // Done: asked no more.
    q.on_reply(reply(true, false, None), t0);
    q.want(303, B.into());
    q.pump(&state(), range(), t0);
    assert!(!q.take_requests().contains(&Request::Deferred));
}

#[test]
fn a_queue_started_with_what_the_logs_record_counts_it_as_its_own_until_told_otherwise() {
    let t0 = Instant::now();
    let mut q = Queue::started_with([400].into());
    assert_eq!(q.own_masters(), &BTreeSet::from([400]));
    let mut unchanged = reply(true, false, None);
    unchanged.own_masters = None;
    q.on_reply(unchanged, t0);
    assert_eq!(q.own_masters(), &BTreeSet::from([400]));
    q.on_reply(reply(true, false, None), t0);
    assert_eq!(q.own_masters(), &BTreeSet::from([300]));
}
