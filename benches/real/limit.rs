//! The reads' limit on a real control plane: how fast the two stores themselves hand over
//! what a plan reads, measured in the same run as the commands it bounds. The server's list
//! of every CiliumIdentity three ways (consistent in pages of 500, from the watch cache with
//! `resourceVersion=0`, and streamed with `sendInitialEvents` where the release serves it),
//! each body read to its end and not parsed; and etcd's own client, `etcdctl get --prefix`,
//! reading the kvstore prefix whole. The limit is the slower of the fastest list and etcd's
//! read: no tool that reads both can plan faster. Beside it, both reads at once (the cached
//! list while `etcdctl` runs): what the two servers alone need when they share this
//! machine's cores, the floor under any tool that reads both, before it parses a byte.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use super::support::control_plane::ControlPlane;

/// What each read took; `None` where the release does not serve it.
pub struct Limit {
    pub paged: Duration,
    pub cached: Duration,
    pub streamed: Option<Duration>,
    pub etcd: Duration,
    /// The watch cache's list and etcd's read started together; the time until both ended.
    pub together: Duration,
    pub bytes: usize,
}

impl Limit {
    /// The server's fastest list of the identities.
    pub fn fastest_list(&self) -> Duration {
        [Some(self.paged), Some(self.cached), self.streamed]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_default()
    }

    /// The slower of the fastest list and etcd's read.
    pub fn reads(&self) -> Duration {
        self.fastest_list().max(self.etcd)
    }
}

/// Reads both stores as fast as they go, each way `REPEATS` times; the best of each.
pub async fn measure(cp: &ControlPlane, etcd_endpoint: &str, prefix: &str) -> Limit {
    const REPEATS: usize = 3;
    let client = cp.client().await;
    let path = "/apis/cilium.io/v2/ciliumidentities";
    let best = |v: Vec<Duration>| v.into_iter().min().unwrap_or_default();
    let mut bytes = 0;
    let mut paged = Vec::new();
    let mut cached = Vec::new();
    let mut streamed = Vec::new();
    for _ in 0..REPEATS {
        let (took, n) = pages(&client, path).await;
        paged.push(took);
        bytes = n;
        cached.push(
            get(&client, &format!("{path}?resourceVersion=0"), None)
                .await
                .0,
        );
        let stream = format!(
            "{path}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        );
        if let Some(took) = stream_list(&client, &stream).await {
            streamed.push(took);
        }
    }
    let etcd = best(
        (0..REPEATS)
            .map(|_| etcdctl(etcd_endpoint, prefix))
            .collect(),
    );
    let mut together = Vec::new();
    for _ in 0..REPEATS {
        let start = Instant::now();
        let (endpoint, prefix) = (etcd_endpoint.to_string(), prefix.to_string());
        let etcd = std::thread::spawn(move || etcdctl(&endpoint, &prefix));
        get(&client, &format!("{path}?resourceVersion=0"), None).await;
        etcd.join().expect("etcdctl thread");
        together.push(start.elapsed());
    }
    Limit {
        paged: best(paged),
        cached: best(cached),
        streamed: (!streamed.is_empty()).then(|| best(streamed)),
        etcd,
        together: best(together),
        bytes,
    }
}

/// GETs `path` and reads the body to its end (or until `until` appears in it), unparsed;
/// the time and the bytes, and the body's last 4 KiB (where a list's continue token is).
async fn get(
    client: &kube::Client,
    path: &str,
    until: Option<&[u8]>,
) -> (Duration, usize, Vec<u8>) {
    let start = Instant::now();
    let req = http::Request::get(path)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::empty())
        .expect("request");
    let res = client.send(req).await.expect("list");
    assert!(res.status().is_success(), "{path}: {}", res.status());
    let mut body = res.into_body();
    let (mut n, mut tail) = (0, Vec::new());
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.expect("body").into_data() else {
            continue;
        };
        n += data.len();
        tail.extend_from_slice(&data);
        if let Some(end) = until
            && tail.windows(end.len()).any(|w| w == end)
        {
            break;
        }
        let keep = tail.len().saturating_sub(4096);
        tail.drain(..keep);
    }
    (start.elapsed(), n, tail)
}

/// A consistent list in pages of 500, each page's continue token taken from its tail.
async fn pages(client: &kube::Client, path: &str) -> (Duration, usize) {
    let start = Instant::now();
    let mut total = 0;
    let mut query = "limit=500".to_string();
    loop {
        let (_, n, tail) = get(client, &format!("{path}?{query}"), None).await;
        total += n;
        let tail = String::from_utf8_lossy(&tail);
        let token = tail
            .rsplit_once("\"continue\":\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(t, _)| t.to_string())
            .filter(|t| !t.is_empty());
        match token {
            Some(t) => query = format!("limit=500&continue={}", urlencode(&t)),
            None => return (start.elapsed(), total),
        }
    }
}

/// A streaming list up to the bookmark that ends its initial events; `None` where the
/// release refuses it.
async fn stream_list(client: &kube::Client, path: &str) -> Option<Duration> {
    let req = http::Request::get(path)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::empty())
        .expect("request");
    let start = Instant::now();
    let res = client.send(req).await.ok()?;
    if !res.status().is_success() {
        return None;
    }
    let end: &[u8] = b"\"k8s.io/initial-events-end\":\"true\"";
    let mut body = res.into_body();
    let mut tail = Vec::new();
    while let Some(frame) = body.frame().await {
        let data = frame.ok()?.into_data().ok()?;
        tail.extend_from_slice(&data);
        if tail.windows(end.len()).any(|w| w == end) {
            return Some(start.elapsed());
        }
        if tail
            .windows(b"\"type\":\"ERROR\"".len())
            .any(|w| w == b"\"type\":\"ERROR\"")
        {
            return None;
        }
        let keep = tail.len().saturating_sub(end.len() + 64);
        tail.drain(..keep);
    }
    None
}

/// `etcdctl get --prefix` of the kvstore prefix, keys and values, as etcd's own client reads
/// it (one response), written to /dev/null.
fn etcdctl(endpoint: &str, prefix: &str) -> Duration {
    let start = Instant::now();
    let status = Command::new("etcdctl")
        .args([
            "--endpoints",
            endpoint,
            "get",
            "--prefix",
            &format!("{prefix}/"),
        ])
        .args(["-w", "protobuf"])
        .env("ETCDCTL_API", "3")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .expect("etcdctl (Debian package etcd-client)");
    assert!(status.success(), "etcdctl get --prefix {prefix}");
    start.elapsed()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// One row of the report: a read and its time.
pub fn row(what: &str, took: Option<Duration>) -> String {
    match took {
        Some(t) => format!("| {what} | {:.2} s |", t.as_secs_f64()),
        None => format!("| {what} | not served |"),
    }
}
