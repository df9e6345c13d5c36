//! A token bucket for the client-side request rate (`--k8s-qps`, `--k8s-burst`).

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// `qps <= 0` disables the limit.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits for one token.
    pub async fn acquire(&self) {
        if self.qps <= 0.0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            let (tokens, last) = *s;
            let tokens =
                (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst) - 1.0;
            *s = (tokens, now);
            // A negative balance is a reservation: this caller waits until it is paid back.
            if tokens < 0.0 {
                Duration::from_secs_f64(-tokens / self.qps)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn limits_to_qps_after_the_burst() {
        let rl = RateLimiter::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..25 {
            rl.acquire().await;
        }
        // 5 from the burst, 20 more at 10/s.
        let took = start.elapsed().as_secs_f64();
        assert!((1.9..2.2).contains(&took), "{took}");
        let unlimited = RateLimiter::new(0.0, 1);
        let start = Instant::now();
        for _ in 0..1000 {
            unlimited.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
