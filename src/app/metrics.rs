//! Health and Prometheus metrics of a long-running `sync`: `/healthz` (and `/readyz`) answers
//! 200 while both watches are live, `/livez` while sync's loop turns (whatever the servers
//! do), `/metrics` the counters in Prometheus' text format (the `prometheus` crate's registry
//! and encoder).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::error::{Error, Result};

/// A watch that has not heard from its server this long is not healthy, even if its
/// connection is open.
pub const HEARD_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// A loop that has not turned this long is stuck: `/livez` fails, and a liveness probe
/// restarts it. The loop turns at least every status tick (5 s), while it waits out an
/// outage too; the longest wait between turns is one round's start (both sides read, each
/// read retried within its own deadlines), a few minutes at the worst.
pub const TURNED_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// What sync publishes.
pub struct Metrics {
    registry: Registry,
    pub kvstore_nodes: IntGauge,
    pub mirrored: IntCounter,
    pub pending: IntGauge,
    pub splits: IntGauge,
    pub splits_found: IntCounter,
    pub doubles: IntGauge,
    pub lag: Histogram,
    pub write_failures: IntCounter,
    /// `--reserve-in-kvstore`: ids reserved now, and every kvstore write and delete made.
    pub kvstore_reservations: IntGauge,
    pub kvstore_writes: IntCounter,
    /// Fresh lists after the Kubernetes watch expired (410: an API server restarted with an
    /// empty watch cache, or a peer that lags).
    pub relists: IntCounter,
    /// Whether each watch is connected and streaming.
    pub etcd_live: AtomicBool,
    pub k8s_live: AtomicBool,
    /// When each watch last heard from its server (ms since `born`; 0: never).
    etcd_heard: AtomicU64,
    k8s_heard: AtomicU64,
    /// When sync's loop last turned (ms since `born`; 0: not yet, which counts as now).
    turned: AtomicU64,
    born: Instant,
    /// `cilium_idmig_watch_up{source}` and `cilium_idmig_last_event_age_seconds{source}`,
    /// brought up to date at each scrape.
    watch_up: IntGaugeVec,
    last_event_age: GaugeVec,
    /// `cilium_idmig_cutover_waiting{reason}`: 1 for what cutover waits for now.
    cutover_waiting: IntGaugeVec,
    /// What the API server said beside its answers (`hear`): its 429s and distinct
    /// warnings, brought up to date at each scrape.
    server: std::sync::OnceLock<Arc<crate::io::k8s::ServerNotes>>,
    throttled: IntCounter,
    warnings: IntGauge,
}

/// Which watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Etcd,
    Kubernetes,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Etcd => "etcd",
            Source::Kubernetes => "kubernetes",
        }
    }
}

impl Metrics {
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let err = |e: prometheus::Error| Error::Config(format!("metrics: {e}"));
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).map_err(err);
        let counter = |name: &str, help: &str| IntCounter::new(name, help).map_err(err);
        let by = |name: &str, help: &str, label: &str| {
            IntGaugeVec::new(Opts::new(name, help), &[label]).map_err(err)
        };
        let m = Metrics {
            kvstore_nodes: gauge(
                "cilium_idmig_kvstore_nodes",
                "Nodes with value/ keys in the kvstore: agents still in kvstore mode",
            )?,
            mirrored: counter(
                "cilium_idmig_identities_mirrored_total",
                "CiliumIdentity objects sync created for kvstore identities",
            )?,
            pending: gauge(
                "cilium_idmig_pending_decisions",
                "Conflicts waiting for an operator's decision",
            )?,
            splits: gauge(
                "cilium_idmig_split_allocations",
                "Ids the kvstore and Kubernetes hold for different labels now",
            )?,
            splits_found: counter(
                "cilium_idmig_split_allocations_found_total",
                "Split allocations found since sync started, each occurrence once",
            )?,
            doubles: gauge(
                "cilium_idmig_doubles",
                "Label sets held under two ids (the plan's reuses and duplicates)",
            )?,
            lag: Histogram::with_opts(
                HistogramOpts::new(
                    "cilium_idmig_sync_lag_seconds",
                    "From a kvstore identity appearing to its CiliumIdentity created",
                )
                .buckets(vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            )
            .map_err(err)?,
            write_failures: counter(
                "cilium_idmig_write_failures_total",
                "Creates that failed after their retries",
            )?,
            kvstore_reservations: gauge(
                "cilium_idmig_kvstore_reservations",
                "Ids sync holds in the kvstore for CiliumIdentities it does not hold (--reserve-in-kvstore)",
            )?,
            kvstore_writes: counter(
                "cilium_idmig_kvstore_writes_total",
                "Writes and deletes sync made in the kvstore: its reservations and their release",
            )?,
            relists: counter(
                "cilium_idmig_kubernetes_relists_total",
                "Fresh lists of ciliumidentities after the watch expired (410 Gone)",
            )?,
            etcd_live: AtomicBool::new(false),
            k8s_live: AtomicBool::new(false),
            etcd_heard: AtomicU64::new(0),
            k8s_heard: AtomicU64::new(0),
            turned: AtomicU64::new(0),
            born: Instant::now(),
            watch_up: by(
                "cilium_idmig_watch_up",
                "1 while the watch on this source is connected and streaming",
                "source",
            )?,
            last_event_age: GaugeVec::new(
                Opts::new(
                    "cilium_idmig_last_event_age_seconds",
                    "Seconds since the watch on this source last heard from its server (an event, a bookmark, a connect)",
                ),
                &["source"],
            )
            .map_err(err)?,
            cutover_waiting: by(
                "cilium_idmig_cutover_waiting",
                "1 for what cutover waits for now (nodes, grace, decisions, writes, lease, verify, checking); all 0 once reached",
                "reason",
            )?,
            server: std::sync::OnceLock::new(),
            throttled: counter(
                "cilium_idmig_apiserver_throttled_total",
                "Answers of the API server that were 429 (API Priority and Fairness pushing back): each waited out, none a failure",
            )?,
            warnings: gauge(
                "cilium_idmig_apiserver_warnings",
                "Distinct Warning headers the API server sent (each shown once, on stderr or the TUI's status line, and in the decision log)",
            )?,
            registry,
        };
        m.register_all().map_err(err)?;
        Ok(m)
    }

    /// Every metric into the registry `/metrics` serves.
    fn register_all(&self) -> std::result::Result<(), prometheus::Error> {
        let collectors: [Box<dyn prometheus::core::Collector>; 16] = [
            Box::new(self.kvstore_nodes.clone()),
            Box::new(self.mirrored.clone()),
            Box::new(self.pending.clone()),
            Box::new(self.splits.clone()),
            Box::new(self.splits_found.clone()),
            Box::new(self.doubles.clone()),
            Box::new(self.lag.clone()),
            Box::new(self.write_failures.clone()),
            Box::new(self.kvstore_reservations.clone()),
            Box::new(self.kvstore_writes.clone()),
            Box::new(self.relists.clone()),
            Box::new(self.watch_up.clone()),
            Box::new(self.cutover_waiting.clone()),
            Box::new(self.last_event_age.clone()),
            Box::new(self.throttled.clone()),
            Box::new(self.warnings.clone()),
        ];
        collectors
            .into_iter()
            .try_for_each(|c| self.registry.register(c))
    }

    /// Publishes what this client hears from the API server beside its answers.
    pub fn hear(&self, notes: Arc<crate::io::k8s::ServerNotes>) {
        let _ = self.server.set(notes);
    }

    /// Brings the API server's counts up to date (at each scrape).
    fn refresh_server(&self) {
        if let Some(notes) = self.server.get() {
            let more = notes.throttled().saturating_sub(self.throttled.get());
            self.throttled.inc_by(more);
            self.warnings.set(notes.warnings().len() as i64);
        }
    }

    /// The watch on `source` heard from its server now.
    pub fn heard(&self, source: Source) {
        let ms = (self.born.elapsed().as_millis() as u64).max(1);
        match source {
            Source::Etcd => self.etcd_heard.store(ms, Ordering::Relaxed),
            Source::Kubernetes => self.k8s_heard.store(ms, Ordering::Relaxed),
        }
    }

    /// Sync's loop turned now.
    pub fn turned(&self) {
        let ms = (self.born.elapsed().as_millis() as u64).max(1);
        self.turned.store(ms, Ordering::Relaxed);
    }

    /// Whether sync's loop turned within `TURNED_WITHIN` (counted from the start until its
    /// first turn).
    pub fn alive(&self) -> bool {
        let now = self.born.elapsed().as_millis() as u64;
        let at = self.turned.load(Ordering::Relaxed);
        now.saturating_sub(at) <= TURNED_WITHIN.as_millis() as u64
    }

    /// Brings the per-source gauges up to date (at each scrape).
    fn refresh_watches(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        for (source, live, heard) in [
            (Source::Etcd, &self.etcd_live, &self.etcd_heard),
            (Source::Kubernetes, &self.k8s_live, &self.k8s_heard),
        ] {
            let up = i64::from(live.load(Ordering::Relaxed));
            self.watch_up.with_label_values(&[source.label()]).set(up);
            let heard = heard.load(Ordering::Relaxed);
            // Never heard: the age of the process, so an alert on the age fires for it too.
            let age = now.saturating_sub(heard) as f64 / 1000.0;
            self.last_event_age
                .with_label_values(&[source.label()])
                .set(age);
        }
    }

    /// Both watches are connected and have heard from their servers within `HEARD_WITHIN`
    /// (etcd answers a progress request every 10 s, Kubernetes sends a bookmark or ends the
    /// watch every 45 s, so a live watch is never quiet that long).
    /// Marks what cutover waits for now (`None`: nothing, it was reached or is checked).
    pub fn cutover_waiting(&self, reason: Option<&str>) {
        for r in crate::core::sync::CutoverWait::REASONS {
            self.cutover_waiting
                .with_label_values(&[r])
                .set(i64::from(Some(r) == reason));
        }
    }

    pub fn healthy(&self) -> bool {
        let now = self.born.elapsed().as_millis() as u64;
        let recent = |heard: &AtomicU64| {
            let at = heard.load(Ordering::Relaxed);
            at > 0 && now.saturating_sub(at) <= HEARD_WITHIN.as_millis() as u64
        };
        self.etcd_live.load(Ordering::Relaxed)
            && self.k8s_live.load(Ordering::Relaxed)
            && recent(&self.etcd_heard)
            && recent(&self.k8s_heard)
    }

    /// The Prometheus text exposition of every metric.
    pub fn text(&self) -> String {
        self.refresh_watches();
        self.refresh_server();
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// Serves `/healthz` and `/metrics` on `addr` until the task is aborted; returns the bound
/// address (port 0 picks one).
/// What a status endpoint serves: whether all is well (`/healthz`), and the Prometheus text
/// (`/metrics`). Sync's metrics, and the audit's under `audit --watch`.
pub trait Exporter: Send + Sync + 'static {
    fn healthy(&self) -> bool;
    /// Whether the process does its work at all (`/livez`); an outage it rides out is not a
    /// reason to restart it.
    fn alive(&self) -> bool {
        true
    }
    fn text(&self) -> String;
    /// What `/healthz` says when not healthy.
    fn unhealthy_reason(&self) -> &'static str;
}

impl Exporter for Metrics {
    fn healthy(&self) -> bool {
        Metrics::healthy(self)
    }
    fn alive(&self) -> bool {
        Metrics::alive(self)
    }
    fn text(&self) -> String {
        Metrics::text(self)
    }
    fn unhealthy_reason(&self) -> &'static str {
        "a watch is down; sync is catching up\n"
    }
}

pub async fn serve<M: Exporter>(
    addr: SocketAddr,
    metrics: Arc<M>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("--status-addr {addr}: cannot listen: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("--status-addr {addr}: {e}")))?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let metrics = metrics.clone();
                    async move {
                        let (code, body, kind) = match (req.method(), req.uri().path()) {
                            (&Method::GET, "/healthz" | "/readyz") if metrics.healthy() => {
                                (StatusCode::OK, "ok\n".to_string(), "text/plain")
                            }
                            (&Method::GET, "/healthz" | "/readyz") => (
                                StatusCode::SERVICE_UNAVAILABLE,
                                metrics.unhealthy_reason().to_string(),
                                "text/plain",
                            ),
                            (&Method::GET, "/livez") if metrics.alive() => {
                                (StatusCode::OK, "ok\n".to_string(), "text/plain")
                            }
                            (&Method::GET, "/livez") => (
                                StatusCode::SERVICE_UNAVAILABLE,
                                "sync's loop has not turned in 5 minutes: stuck\n".to_string(),
                                "text/plain",
                            ),
                            (&Method::GET, "/metrics") => {
                                (StatusCode::OK, metrics.text(), "text/plain; version=0.0.4")
                            }
                            _ => (StatusCode::NOT_FOUND, "not found\n".into(), "text/plain"),
                        };
                        let mut res = Response::new(Full::new(Bytes::from(body)));
                        *res.status_mut() = code;
                        res.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static(kind),
                        );
                        Ok::<_, Infallible>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_that_stopped_turning_is_not_alive_and_one_that_turns_is() {
        let mut m = Metrics::new().unwrap();
        assert!(m.alive(), "a sync that just started");
        let long_ago = TURNED_WITHIN + std::time::Duration::from_secs(1);
        m.born = Instant::now().checked_sub(long_ago).unwrap();
        assert!(!m.alive(), "never turned in more than TURNED_WITHIN");
        m.turned();
        assert!(m.alive());
        assert!(!m.healthy(), "alive is not ready: no watch is up");
    }

    #[test]
    fn what_the_api_server_said_is_scraped_as_it_grows() {
        let m = Metrics::new().unwrap();
        let notes = Arc::new(crate::io::k8s::ServerNotes::default());
        m.hear(notes.clone());
        let value = |text: &str, name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .map(|v| v.trim().to_string())
        };
        assert_eq!(
            value(&m.text(), "cilium_idmig_apiserver_throttled_total").as_deref(),
            Some("0")
        );
        let mut warned = http::HeaderMap::new();
        warned.insert("warning", r#"299 - "v2 is deprecated""#.parse().unwrap());
        notes.observe(StatusCode::TOO_MANY_REQUESTS, &warned);
        notes.observe(StatusCode::TOO_MANY_REQUESTS, &warned);
        let text = m.text();
        assert_eq!(
            value(&text, "cilium_idmig_apiserver_throttled_total").as_deref(),
            Some("2")
        );
        assert_eq!(
            value(&text, "cilium_idmig_apiserver_warnings").as_deref(),
            Some("1")
        );
        notes.observe(StatusCode::TOO_MANY_REQUESTS, &http::HeaderMap::new());
        assert_eq!(
            value(&m.text(), "cilium_idmig_apiserver_throttled_total").as_deref(),
            Some("3"),
            "a counter that follows the notes, never counting one twice"
        );
    }
}
