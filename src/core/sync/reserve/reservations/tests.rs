//! The reservations across rounds: the queue's life, when what the logs left is taken over,
//! and when a clean stop releases.

use std::collections::BTreeMap;
use std::time::Instant;

use super::*;
use crate::core::sync::reserve::Earlier;
use crate::core::sync::reserve::tests::{A, B, range, state};

/// The logs record 300 = A (its object still there) and 400 = B (its object gone) as
/// reserved and not released.
fn left() -> Unreleased {
    BTreeMap::from([(300, (A.into(), 7)), (400, (B.into(), 9))])
}

fn adopted() -> Request {
    Request::Adopt(vec![
        Earlier {
            id: 300,
            labels: A.into(),
            revision: 7,
            keep: true,
        },
        Earlier {
            id: 400,
            labels: B.into(),
            revision: 9,
            keep: false,
        },
    ])
}

fn reply(held: usize) -> Reply {
    Reply {
        held,
        own_masters: Some([300].into()),
        batch: true,
        failed: false,
        deferred: false,
        said: Some(Said::Note("took over".into())),
    }
}

#[test]
fn without_a_writer_nothing_is_asked_answered_or_released_and_nothing_is_lost() {
    let (t0, s) = (Instant::now(), state());
    let mut r = Reservations::new(true);
    assert!(!r.has_writer());
    assert_eq!(
        r.command(Reserve::Pump, &s, (true, range()), t0),
        Asked::default()
    );
    assert_eq!(r.answered(reply(1), t0), None);
    assert_eq!(r.release_at_stop(&s, true), None);
    // A writer started later still takes over what the logs left.
    r.writer_started(left());
    let asked = r.command(Reserve::Pump, &s, (true, range()), t0);
    assert_eq!(asked.requests.first(), Some(&adopted()));
}

#[test]
fn what_the_logs_left_is_taken_over_once_first_and_only_by_the_holder() {
    let (t0, s) = (Instant::now(), state());
    let mut r = Reservations::new(false);
    r.writer_started(left());
    // Not holding: the whole view is asked for, nothing of the logs' is taken over.
    let asked = r.command(Reserve::Pump, &s, (false, range()), t0);
    assert_eq!(
        asked.requests,
        vec![Request::Reserve(vec![(300, A.into())])]
    );
    r.answered(reply(0), t0);
    // Holding: taken over before anything else, at once.
    let asked = r.command(Reserve::Deleted { id: 300 }, &s, (true, range()), t0);
    assert!(asked.requests.is_empty(), "queued for the next batch");
    let asked = r.command(Reserve::Pump, &s, (true, range()), t0);
    assert_eq!(asked.requests, vec![adopted(), Request::Unreserve(300)]);
    let answered = r.answered(reply(1), t0).unwrap();
    assert_eq!((answered.held, answered.own_masters), (1, [300].into()));
    assert_eq!(answered.said, Some(Said::Note("took over".into())));
    // Once only.
    r.command(Reserve::ViewChanged, &s, (true, range()), t0);
    let asked = r.command(Reserve::Pump, &s, (true, range()), t0);
    assert!(!asked.requests.contains(&adopted()), "{:?}", asked.requests);
}

#[test]
fn the_release_flushes_what_waits_and_ends_the_queue() {
    let (t0, s) = (Instant::now(), state());
    let mut r = Reservations::new(false);
    r.writer_started(Unreleased::new());
    r.command(Reserve::Pump, &s, (true, range()), t0);
    // A batch in flight: the delete waits, then goes with the release, unanswered.
    r.command(Reserve::Deleted { id: 300 }, &s, (true, range()), t0);
    let asked = r.command(Reserve::Release, &s, (true, range()), t0);
    assert_eq!(
        asked,
        Asked {
            requests: vec![Request::Unreserve(300)],
            release: true
        }
    );
    assert!(!r.has_writer());
    assert_eq!(r.answered(reply(0), t0), None, "released: nothing to tell");
    assert_eq!(
        r.command(Reserve::Pump, &s, (true, range()), t0),
        Asked::default()
    );
}

#[test]
fn a_clean_stop_releases_only_when_asked_while_holding_with_what_the_logs_left() {
    let (t0, s) = (Instant::now(), state());
    let mut kept = Reservations::new(false);
    kept.writer_started(left());
    assert_eq!(kept.release_at_stop(&s, true), None, "not asked");
    assert!(kept.has_writer());
    let mut r = Reservations::new(true);
    r.writer_started(left());
    assert_eq!(r.release_at_stop(&s, false), None, "not the holder's");
    assert!(r.has_writer());
    // A batch in flight, a delete waiting: both the logs' and the delete go.
    r.command(Reserve::Pump, &s, (false, range()), t0);
    r.command(Reserve::Deleted { id: 300 }, &s, (false, range()), t0);
    assert_eq!(
        r.release_at_stop(&s, true),
        Some(vec![Request::Unreserve(300), adopted()])
    );
    assert!(!r.has_writer());
}
