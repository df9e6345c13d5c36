//! One retry policy for every caller, as rules with no clock: waits that double from a first
//! wait up to a cap, with a little per-item jitter so retries do not march in step, and the
//! server's `Retry-After` honoured (within the cap) when it gives one. The caller owns its
//! budget: `apply` gives up after `--max-attempts`, a scan's read after a few attempts, and
//! sync's watches never (`Backoff`, which starts over after each success). `io::retry`
//! sleeps the waits; the simulation schedules them on its own clock.

use std::time::Duration;

/// How waits grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub first: Duration,
    pub cap: Duration,
}

impl Policy {
    /// A scan's reads: from 200 ms, at most 30 s.
    pub const READ: Policy = Policy {
        first: Duration::from_millis(200),
        cap: Duration::from_secs(30),
    };
    /// Sync following a server: from 200 ms, at most 5 s, so a server that comes back is
    /// followed again within seconds however long it was gone.
    pub const FOLLOW: Policy = Policy {
        first: Duration::from_millis(200),
        cap: Duration::from_secs(5),
    };

    /// The wait after failed attempt `attempt` (counted from 1) of the item named `seed`;
    /// `hint` is the server's Retry-After.
    pub fn wait(&self, attempt: u32, hint: Option<Duration>, seed: &str) -> Duration {
        if let Some(h) = hint {
            return h.min(self.cap);
        }
        let doubled = self
            .first
            .saturating_mul(1u32 << attempt.clamp(1, 16).saturating_sub(1));
        let jitter = seed.bytes().fold(u64::from(attempt), |h, b| {
            h.wrapping_mul(31).wrapping_add(u64::from(b))
        }) % 50;
        (doubled + Duration::from_millis(jitter)).min(self.cap)
    }
}

/// The waits between the tries of a loop that never gives up; `reset` after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: Policy,
    failures: u32,
}

impl Backoff {
    pub fn new(policy: Policy) -> Self {
        Backoff {
            policy,
            failures: 0,
        }
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// One more failure: how long to wait before the next try.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.wait(self.failures, None, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_and_honour_the_server() {
        let p = Policy {
            first: Duration::from_millis(100),
            cap: Duration::from_secs(2),
        };
        let w: Vec<u128> = (1..=7).map(|a| p.wait(a, None, "").as_millis()).collect();
        for pair in w.windows(2) {
            assert!(pair[1] >= pair[0], "{w:?}");
        }
        assert!((100..150).contains(&w[0]), "{w:?}");
        assert_eq!(w[6], 2000, "{w:?}");
        assert_eq!(
            p.wait(1, Some(Duration::from_secs(1)), ""),
            Duration::from_secs(1)
        );
        assert_eq!(
            p.wait(1, Some(Duration::from_secs(60)), ""),
            Duration::from_secs(2)
        );
        // Two items retry at different moments.
        assert_ne!(p.wait(3, None, "300"), p.wait(3, None, "301"));
    }

    #[test]
    fn a_backoff_grows_with_each_failure_and_starts_over_after_a_success() {
        let mut b = Backoff::new(Policy::FOLLOW);
        let first = b.failed();
        let grown: Vec<Duration> = (0..8).map(|_| b.failed()).collect();
        assert!(grown[0] > first, "{first:?} {grown:?}");
        assert_eq!(*grown.last().unwrap(), Policy::FOLLOW.cap);
        b.reset();
        assert_eq!(b.failed(), first);
    }
}
