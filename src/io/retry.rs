//! Sleeping the waits of core's retry policy (`core::retry`): the rules of how long are
//! core's; only the sleep is here.

use std::time::Duration;

pub use crate::core::retry::Policy;

/// Waits between the tries of a loop that never gives up; `reset` after a success.
#[derive(Debug, Clone)]
pub struct Backoff(crate::core::retry::Backoff);

impl Backoff {
    pub fn new(policy: Policy) -> Self {
        Backoff(crate::core::retry::Backoff::new(policy))
    }

    pub fn reset(&mut self) {
        self.0.reset();
    }

    /// Sleeps the wait one more failure calls for.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0.failed()).await;
    }

    /// The wait one more failure calls for, without sleeping it.
    pub fn failed(&mut self) -> Duration {
        self.0.failed()
    }
}
