//! The headless front end of an apply: sends it to the engine service, prints the service's
//! events on stderr (one line per problem; on a terminal a progress bar, otherwise a progress
//! line every few seconds), and turns the stop signals into the service's stop request, like
//! the TUI does.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use cilium_idmig::app::flows::{ApplyRun, ApplySpec};
use cilium_idmig::app::service::{Handle, ServiceEvent, ServiceRequest};
use cilium_idmig::app::signals::StopSignals;
use cilium_idmig::apply::outcome::{ApplyEvent, Progress};
use cilium_idmig::core::outcome::Outcome;
use cilium_idmig::error::Error;

/// How often a running apply prints its totals.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Where progress goes: a bar on a terminal, plain lines for logs and CI.
enum Progressor {
    Bar(ProgressBar),
    Lines { shown: Progress },
}

impl Progressor {
    fn new() -> Self {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.set_message("reading the kvstore and Kubernetes");
            bar.enable_steady_tick(Duration::from_millis(120));
            Progressor::Bar(bar)
        } else {
            Progressor::Lines {
                shown: Progress::default(),
            }
        }
    }

    /// A line of its own, above the bar when there is one.
    fn println(&self, line: &str) {
        match self {
            Progressor::Bar(bar) => bar.println(line),
            Progressor::Lines { .. } => eprintln!("{line}"),
        }
    }

    fn started(&self, total: usize) {
        if let Progressor::Bar(bar) = self {
            bar.set_length(total as u64);
            bar.set_position(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} items · {per_sec} · ETA {eta} · {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        }
    }

    fn update(&mut self, p: Progress, started: Instant) {
        match self {
            Progressor::Bar(bar) => {
                if p.total > 0 {
                    bar.set_position(p.done as u64);
                    bar.set_message(format!(
                        "{} created · {} failed · {} retries",
                        p.created, p.failed, p.retries
                    ));
                }
            }
            Progressor::Lines { shown } => {
                if p.writes > 0 && p != *shown {
                    eprintln!("{}", progress_line(&p, started.elapsed()));
                    *shown = p;
                } else if p.total == 0 {
                    eprintln!(
                        "  reading the kvstore and Kubernetes ({:.0}s)",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }

    fn finish(&self) {
        if let Progressor::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// Awaits a long read, showing that it runs: a spinner on a terminal, otherwise a line
/// every few seconds (`what` names it, e.g. "reading the kvstore and Kubernetes").
pub async fn reading<T>(what: &str, read: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    tokio::pin!(read);
    let out = loop {
        tokio::select! {
            out = &mut read => break out,
            _ = tick.tick(), if bar.is_none() => {
                eprintln!("  {what} ({:.0}s)", started.elapsed().as_secs_f64());
            }
        }
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    out
}

/// Runs one apply through the service and prints it as it goes; returns the finished run.
pub async fn apply(handle: &mut Handle, spec: ApplySpec) -> Result<ApplyRun, Error> {
    let req = ServiceRequest::Apply {
        generation: 1,
        spec: Box::new(spec),
    };
    run(handle, req).await
}

/// Runs one apply or rollback request through the service, printing its events, until it
/// ends; a stop signal becomes the service's stop request.
pub async fn run(handle: &mut Handle, req: ServiceRequest) -> Result<ApplyRun, Error> {
    let mut signals = StopSignals::new()?;
    handle
        .requests
        .send(req)
        .await
        .map_err(|_| Error::Config("the engine service stopped".into()))?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    let mut out = Progressor::new();
    let mut stopping = false;
    let result = loop {
        tokio::select! {
            ev = handle.events.recv() => match ev {
                Some(ServiceEvent::Apply(ev)) => {
                    if let ApplyEvent::Started { total, .. } = &ev {
                        out.started(*total);
                    }
                    if let Some(line) = event_line(&ev) {
                        out.println(&line);
                    }
                }
                Some(ServiceEvent::Committed { run, .. }) => break Ok(*run),
                Some(ServiceEvent::Failed { error, .. }) => break Err(unshare(error)),
                Some(_) => {}
                None => break Err(Error::Config("the engine service stopped".into())),
            },
            _ = tick.tick() => out.update(*handle.progress.borrow(), started),
            sig = signals.recv(), if !stopping => {
                out.println(&format!("{}: no new writes; waiting for those in flight", sig.name()));
                stopping = true;
                let _ = handle.requests.send(ServiceRequest::Stop).await;
            }
        }
    };
    out.finish();
    result
}

/// The line an event gets, if any (totals go to the progress display).
fn event_line(ev: &ApplyEvent) -> Option<String> {
    Some(match ev {
        ApplyEvent::CrdCreating => "creating CRD ciliumidentities.cilium.io ...".into(),
        ApplyEvent::CrdEstablished => "CRD established".into(),
        ApplyEvent::Started {
            writes,
            deletes,
            already_gone,
            total,
        } => match (writes - deletes, deletes) {
            (_, 0) => format!("applying {total} items ({writes} to create)"),
            // As the rollback's plan counts them.
            (0, d) => format!(
                "rolling back: {} to delete, {already_gone} already gone, {} kept",
                d - already_gone,
                total - d
            ),
            (c, d) => format!("applying {total} items ({c} to create, {d} to delete)"),
        },
        ApplyEvent::Stopping { reason } => format!("stopping: {reason}"),
        // A rollback's kept object was known from its plan: its summary names it, once.
        ApplyEvent::Problem(r) if r.outcome == Outcome::Kept => return None,
        ApplyEvent::Problem(r) => format!(
            "  {} -> {}: {}: {}",
            r.id,
            r.target_id.map_or("-".to_string(), |t| t.to_string()),
            r.outcome,
            r.existing.as_deref().or(r.error.as_deref()).unwrap_or("")
        ),
        ApplyEvent::Retrying { .. } => return None,
    })
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
        "  {} of {} items done · {} created · {} failed · {} retries{} · {rate:.0}/s{eta}",
        p.done,
        p.total,
        p.created,
        p.failed,
        p.retries,
        throttled_text(p.throttled)
    )
}

/// The service hands errors out shared; the run is over, so this is the only holder left.
fn unshare(error: Arc<Error>) -> Error {
    Arc::try_unwrap(error).unwrap_or_else(|shared| Error::Refused(shared.to_string()))
}

/// How often the API server pushed back, when it did: ` · 12 throttled (429, waited out)`.
pub(crate) fn throttled_text(n: u64) -> String {
    match n {
        0 => String::new(),
        n => format!(" · {n} throttled (429, waited out)"),
    }
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
            deleted: 0,
            failed: 2,
            retries: 3,
            throttled: 0,
        };
        let line = progress_line(&p, Duration::from_secs(5));
        assert_eq!(
            line,
            "  50 of 100 items done · 48 created · 2 failed · 3 retries · 10/s · ETA 5s"
        );
        // The server's push-back, when there was some, is said apart from the retries.
        let line = progress_line(&Progress { throttled: 12, ..p }, Duration::from_secs(5));
        assert!(
            line.contains("3 retries · 12 throttled (429, waited out)"),
            "{line}"
        );
    }
}
