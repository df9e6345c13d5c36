//! Fault injection for the sandbox API server: latency, spikes, 500s, 429 with Retry-After,
//! dropped connections, answers lost after the request was carried out, a queue of exact
//! faults for deterministic tests, and a `Warning` header on every answer.

use std::collections::VecDeque;
use std::time::Duration;

/// What a request should suffer before (or instead of) being served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    Status(u16),
    TooManyRequests {
        retry_after_secs: u64,
    },
    Drop,
    Delay(Duration),
    /// The request is carried out, then the connection is dropped before the answer: the
    /// client cannot tell a create that was applied from one that was not.
    LoseResponse,
}

/// Probabilistic faults, applied to `ciliumidentities` requests only, so the CRD and
/// discovery paths stay healthy.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    /// Added to every identity request.
    pub latency: Duration,
    pub p_500: f64,
    pub p_429: f64,
    pub retry_after_secs: u64,
    pub p_drop: f64,
    /// Probability that a request is carried out and its answer lost (`LoseResponse`).
    pub p_lost_response: f64,
    /// Probability of a latency spike of `spike` (e.g. beyond the client's op timeout).
    pub p_spike: f64,
    pub spike: Duration,
    /// Only faults on writes (POST), leaving reads clean.
    pub writes_only: bool,
    /// Exact faults for the next requests, taken before any probabilistic one.
    pub queue: VecDeque<Fault>,
    /// A `Warning` header on every answer about identities, as a real server sends one for a
    /// CRD version marked deprecated (its `deprecationWarning`): not a fault, but how the
    /// server meets the client.
    pub warning: Option<String>,
}

/// The seeded generator fault runs are replayed by.
pub use crate::core::rng::Rng;

impl FaultConfig {
    /// Picks the faults for one request: an optional delay, then an optional failure.
    pub fn pick(&mut self, rng: &mut Rng, is_write: bool) -> (Duration, Option<Fault>) {
        let mut delay = self.latency;
        if let Some(f) = self.queue.pop_front() {
            return match f {
                Fault::Delay(d) => (delay + d, None),
                other => (delay, Some(other)),
            };
        }
        if self.writes_only && !is_write {
            return (delay, None);
        }
        if self.p_spike > 0.0 && rng.next_f64() < self.p_spike {
            delay += self.spike;
        }
        let r = rng.next_f64();
        let fault = if r < self.p_500 {
            Some(Fault::Status(500))
        } else if r < self.p_500 + self.p_429 {
            Some(Fault::TooManyRequests {
                retry_after_secs: self.retry_after_secs,
            })
        } else if r < self.p_500 + self.p_429 + self.p_drop {
            Some(Fault::Drop)
        } else if r < self.p_500 + self.p_429 + self.p_drop + self.p_lost_response {
            Some(Fault::LoseResponse)
        } else {
            None
        };
        (delay, fault)
    }
}
