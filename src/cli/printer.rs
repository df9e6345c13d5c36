//! The headless front end of an apply: sends it to the engine service, prints the service's
//! events on stderr (one line per problem, a progress line every few seconds), and turns the
//! stop signals into the service's stop request, like the TUI does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cilium_idmig::app::flows::{ApplyRun, ApplySpec};
use cilium_idmig::app::service::{Handle, ServiceEvent, ServiceRequest};
use cilium_idmig::app::signals::StopSignals;
use cilium_idmig::apply::outcome::{ApplyEvent, Progress};
use cilium_idmig::error::Error;

/// How often a running apply prints its totals.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Runs one apply through the service and prints it as it goes; returns the finished run.
pub async fn apply(handle: &mut Handle, spec: ApplySpec) -> Result<ApplyRun, Error> {
    let mut signals = StopSignals::new()?;
    handle
        .requests
        .send(ServiceRequest::Apply {
            generation: 1,
            spec: Box::new(spec),
        })
        .await
        .map_err(|_| Error::Config("the engine service stopped".into()))?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    let mut shown = Progress::default();
    let mut stopping = false;
    loop {
        tokio::select! {
            ev = handle.events.recv() => match ev {
                Some(ServiceEvent::Apply(ev)) => print_event(&ev),
                Some(ServiceEvent::Committed { run, .. }) => return Ok(*run),
                Some(ServiceEvent::Failed { error, .. }) => return Err(unshare(error)),
                Some(_) => {}
                None => return Err(Error::Config("the engine service stopped".into())),
            },
            _ = tick.tick() => {
                let p = *handle.progress.borrow();
                if p.writes > 0 && p != shown {
                    eprintln!("{}", progress_line(&p, started.elapsed()));
                    shown = p;
                }
            }
            sig = signals.recv(), if !stopping => {
                eprintln!("{}: no new writes; waiting for those in flight", sig.name());
                stopping = true;
                let _ = handle.requests.send(ServiceRequest::Stop).await;
            }
        }
    }
}

fn print_event(ev: &ApplyEvent) {
    match ev {
        ApplyEvent::CrdCreating => eprintln!("creating CRD ciliumidentities.cilium.io ..."),
        ApplyEvent::CrdEstablished => eprintln!("CRD established"),
        ApplyEvent::Started { writes, total } => {
            eprintln!("applying {total} items ({writes} creates)")
        }
        ApplyEvent::Stopping { reason } => eprintln!("stopping: {reason}"),
        ApplyEvent::Problem(r) => eprintln!(
            "  {} -> {}: {}: {}",
            r.id,
            r.target_id.map_or("-".to_string(), |t| t.to_string()),
            r.outcome,
            r.existing.as_deref().or(r.error.as_deref()).unwrap_or("")
        ),
        ApplyEvent::Retrying { .. } => {}
    }
}

/// `  12000 of 55662 items done · 11890 created · 0 failed · 3 retries · 1500/s · ETA 29s`
pub fn progress_line(p: &Progress, elapsed: Duration) -> String {
    let rate = p.done as f64 / elapsed.as_secs_f64().max(0.001);
    let eta = if rate > 0.0 && p.total > p.done {
        format!(" · ETA {:.0}s", (p.total - p.done) as f64 / rate)
    } else {
        String::new()
    };
    format!(
        "  {} of {} items done · {} created · {} failed · {} retries · {rate:.0}/s{eta}",
        p.done, p.total, p.created, p.failed, p.retries
    )
}

/// The service hands errors out shared; the run is over, so this is the only holder left.
fn unshare(error: Arc<Error>) -> Error {
    Arc::try_unwrap(error).unwrap_or_else(|shared| Error::Refused(shared.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_has_totals_rate_and_eta() {
        let p = Progress {
            total: 100,
            writes: 90,
            done: 50,
            created: 48,
            failed: 2,
            retries: 3,
        };
        let line = progress_line(&p, Duration::from_secs(5));
        assert_eq!(
            line,
            "  50 of 100 items done · 48 created · 2 failed · 3 retries · 10/s · ETA 5s"
        );
    }
}
