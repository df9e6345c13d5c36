//! The lease rules alone, and two candidates racing over one record.

use proptest::prelude::*;

use super::*;

const D: Duration = Duration::from_secs(15);

fn record(holder: Option<&str>, version: &str) -> LeaseRecord {
    LeaseRecord {
        holder: holder.map(str::to_string),
        duration: D,
        version: version.into(),
    }
}

#[test]
fn no_record_is_created_and_ours_is_renewed_without_a_transition() {
    let t0 = Instant::now();
    let mut a = Elector::new("a", D);
    assert_eq!((a.me(), a.renew_every()), ("a", Duration::from_secs(5)));
    assert_eq!(a.claim(None, t0), Claim::Create);
    assert_eq!(
        a.claim(Some(&record(Some("a"), "1")), t0),
        Claim::Replace { take: false }
    );
    assert_eq!(
        a.claim(Some(&record(None, "2")), t0),
        Claim::Replace { take: true }
    );
}

#[test]
fn anothers_lease_expires_only_after_a_whole_duration_unchanged_on_our_clock() {
    let t0 = Instant::now();
    let mut b = Elector::new("b", D);
    let held = record(Some("a"), "7");
    assert_eq!(b.claim(Some(&held), t0), Claim::HeldBy("a".into()));
    let almost = t0 + D - Duration::from_millis(1);
    assert_eq!(b.claim(Some(&held), almost), Claim::HeldBy("a".into()));
    // A renewal (a new version) starts the count again.
    let renewed = record(Some("a"), "8");
    assert_eq!(b.claim(Some(&renewed), almost), Claim::HeldBy("a".into()));
    assert_eq!(
        b.claim(Some(&renewed), almost + D - Duration::from_millis(1)),
        Claim::HeldBy("a".into())
    );
    assert_eq!(
        b.claim(Some(&renewed), almost + D),
        Claim::Replace { take: true }
    );
}

#[test]
fn the_gate_closes_two_thirds_of_a_duration_after_the_try_began() {
    let t0 = Instant::now();
    let mut a = Elector::new("a", D);
    let answered = t0 + Duration::from_secs(3);
    let wait = a.tried(
        TryOutcome::Held {
            version: "1".into(),
        },
        t0,
        answered,
    );
    // The next renewal is due a third of the duration after the try began.
    assert_eq!(wait, D / 3 - Duration::from_secs(3));
    assert!(a.may_write(answered));
    let deadline = t0 + D * 2 / 3;
    assert_eq!(a.gate_until(), Some(deadline));
    assert!(a.may_write(deadline - Duration::from_millis(1)));
    assert!(!a.may_write(deadline));
    // A failed renewal leaves the gate where it was; the deadline then closes it.
    assert_eq!(a.tried(TryOutcome::Failed, t0 + D / 3, t0 + D / 3), RETRY);
    assert!(!a.check_deadline(deadline - Duration::from_millis(1)));
    assert!(a.check_deadline(deadline));
    assert_eq!(a.writer(), &Writer::Unknown);
    assert!(!a.may_write(deadline - Duration::from_millis(1)));
}

#[test]
fn held_by_another_or_refused_closes_the_gate_at_once() {
    let t0 = Instant::now();
    let mut a = Elector::new("a", D);
    a.tried(
        TryOutcome::Held {
            version: "1".into(),
        },
        t0,
        t0,
    );
    assert!(a.may_write(t0));
    a.tried(TryOutcome::HeldBy("b".into()), t0, t0);
    assert!(!a.may_write(t0));
    assert_eq!(a.writer(), &Writer::Other { holder: "b".into() });
    a.tried(
        TryOutcome::Held {
            version: "2".into(),
        },
        t0,
        t0,
    );
    a.tried(TryOutcome::Refused("403".into()), t0, t0);
    assert!(!a.may_write(t0));
    assert!(matches!(a.writer(), Writer::Refused(_)));
    assert!(!a.release(), "nothing to give up");
    a.tried(
        TryOutcome::Held {
            version: "3".into(),
        },
        t0,
        t0,
    );
    assert!(a.release(), "held: the record is to be cleared");
    assert!(!a.may_write(t0));
}

/// One record on a server: a replace holds only at the version read.
#[derive(Default)]
struct Server {
    record: Option<LeaseRecord>,
    next_version: u64,
}

impl Server {
    fn write(&mut self, read: Option<&LeaseRecord>, me: &str) -> TryOutcome {
        if self.record.as_ref().map(|r| &r.version) != read.map(|r| &r.version) {
            let holder = self.record.as_ref().and_then(|r| r.holder.clone());
            return TryOutcome::HeldBy(holder.unwrap_or_else(|| "another".into()));
        }
        self.next_version += 1;
        let version = self.next_version.to_string();
        self.record = Some(LeaseRecord {
            holder: Some(me.into()),
            duration: D,
            version: version.clone(),
        });
        TryOutcome::Held { version }
    }
}

/// What one step of the race does.
#[derive(Debug, Clone)]
enum Act {
    /// Candidate `who` reads the record and decides; its write lands at a later `Land`
    /// (other steps may come between); `fails` loses the write or its answer.
    Try {
        who: usize,
        fails: bool,
    },
    /// Candidate `who` writes what it read earlier (a slow request).
    Land {
        who: usize,
    },
    Advance {
        ms: u64,
    },
    Release {
        who: usize,
    },
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        (0..2usize, prop::bool::weighted(0.2)).prop_map(|(who, fails)| Act::Try { who, fails }),
        (0..2usize).prop_map(|who| Act::Land { who }),
        (1..8_000u64).prop_map(|ms| Act::Advance { ms }),
        (0..2usize).prop_map(|who| Act::Release { who }),
    ]
}

proptest! {
    /// However reads, writes, failures, releases and time interleave, two candidates never
    /// may both write at one instant.
    #[test]
    fn two_candidates_never_both_may_write(acts in prop::collection::vec(act(), 1..200)) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut server = Server::default();
        let mut electors = [Elector::new("a", D), Elector::new("b", D)];
        // A try waiting to land: what was read, what was decided, when it began, whether
        // it fails.
        type Pending = (Option<LeaseRecord>, Claim, Instant, bool);
        let mut pending: [Option<Pending>; 2] = [None, None];
        for a in acts {
            match a {
                Act::Try { who, fails } => {
                    if pending[who].is_none() {
                        let read = server.record.clone();
                        let claim = electors[who].claim(read.as_ref(), now);
                        pending[who] = Some((read, claim, now, fails));
                    }
                }
                Act::Land { who } => {
                    if let Some((read, claim, started, fails)) = pending[who].take() {
                        let e = &mut electors[who];
                        let outcome = match claim {
                            Claim::HeldBy(h) => TryOutcome::HeldBy(h),
                            _ if fails => TryOutcome::Failed,
                            Claim::Create | Claim::Replace { .. } => {
                                server.write(read.as_ref(), e.me())
                            }
                        };
                        e.tried(outcome, started, now);
                    }
                }
                Act::Advance { ms } => now += Duration::from_millis(ms),
                Act::Release { who } => {
                    if electors[who].release()
                        && server.record.as_ref().and_then(|r| r.holder.as_deref())
                            == Some(electors[who].me())
                    {
                        // Cleared as client-go's release on cancel does.
                        server.next_version += 1;
                        server.record = Some(LeaseRecord {
                            holder: None,
                            duration: Duration::from_secs(1),
                            version: server.next_version.to_string(),
                        });
                    }
                }
            }
            for e in &mut electors {
                e.check_deadline(now);
            }
            prop_assert!(
                !(electors[0].may_write(now) && electors[1].may_write(now)),
                "both may write at {:?}",
                now - t0
            );
        }
    }
}

#[test]
fn a_write_is_held_back_by_a_stop_first_then_by_a_shut_gate_and_never_without_a_gate() {
    assert_eq!(write_held_back(false, None), None, "apply: no gate");
    assert_eq!(write_held_back(false, Some(true)), None);
    let shut = write_held_back(false, Some(false)).unwrap();
    assert!(shut.contains("gate shut"), "{shut}");
    for gate in [None, Some(true), Some(false)] {
        assert_eq!(
            write_held_back(true, gate),
            Some("stopped by the operator"),
            "{gate:?}"
        );
    }
}
