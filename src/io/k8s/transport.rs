//! Raw requests to the API server, for what must be seen as it arrives: a body streamed to
//! the list parser while it downloads (a 100 MB list would otherwise sit in memory whole),
//! and watch events line by line, with idle deadlines.

use std::time::Duration;

use http::{Method, Request};
use http_body_util::BodyExt;
use kube::client::Body;

use super::errors::{RequestError, kube_call, status_error};
use super::target::K8sTarget;
use crate::io::list_stream::{ChunkReader, WatchEvent};
use crate::io::retry::Policy;

/// Deadline of one read during a scan (a list page of 500 objects is well under a second).
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of one read before the scan gives up.
pub(super) const READ_ATTEMPTS: u32 = 8;
/// Longest wait for the next bytes of a list being streamed.
pub(super) const STREAM_IDLE: Duration = Duration::from_secs(60);

/// The events of a watch body, one JSON object per line, read as the bytes arrive.
pub(super) struct EventLines {
    body: Body,
    pending: Vec<u8>,
    start: usize,
    /// Longest wait for the next bytes (`None`: a watch may be quiet for long).
    idle: Option<Duration>,
}

impl EventLines {
    pub(super) fn new(body: Body, idle: Option<Duration>) -> Self {
        EventLines {
            body,
            pending: Vec::new(),
            start: 0,
            idle,
        }
    }

    /// The next event; `None` when the stream ends.
    pub(super) async fn next(&mut self) -> Result<Option<WatchEvent>, RequestError> {
        loop {
            if let Some(end) = memchr::memchr(b'\n', &self.pending[self.start..]) {
                let line = &self.pending[self.start..self.start + end];
                self.start += end + 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(line)
                    .map(Some)
                    .map_err(|e| RequestError::Transport(format!("a watch event: {e}")));
            }
            self.pending.drain(..self.start);
            self.start = 0;
            let frame = match self.idle {
                Some(idle) => tokio::time::timeout(idle, self.body.frame())
                    .await
                    .map_err(|_| RequestError::Timeout)?,
                None => self.body.frame().await,
            };
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(RequestError::Transport(e.to_string())),
                None => return Ok(None),
            }
        }
    }
}

/// A read the server pushed back on (429), the `times`th time in a row: waited out as it
/// asks (its Retry-After, else doubling waits), never counted as a failed try. Every read
/// path waits here: typed reads, lists and each page of a list.
pub(super) async fn wait_out_throttled(times: u32, e: &RequestError, what: &str) {
    let wait = Policy::READ.wait(times.min(8), e.retry_after(), what);
    tracing::debug!(what, times, ?wait, "read throttled (429): waiting");
    tokio::time::sleep(wait).await;
}

/// Bytes of a streamed body handed to its parser at a time.
const PARSE_BATCH: usize = 256 << 10;

/// Parses a streamed body on a blocking thread while the download continues here.
pub(super) async fn parse_streamed<T: Send + 'static>(
    mut body: Body,
    parse: impl FnOnce(ChunkReader) -> T + Send + 'static,
) -> Result<T, RequestError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let parser = tokio::task::spawn_blocking(move || parse(ChunkReader::new(rx)));
    let mut failure = None;
    // Frames are handed over in batches: a frame is a few KiB, and each one handed over
    // alone woke the parser's thread, tens of thousands of wake-ups for a 100 MB list.
    let mut batch = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(STREAM_IDLE, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    batch.extend_from_slice(&data);
                }
                if batch.len() >= PARSE_BATCH && tx.send(batch.split().freeze()).await.is_err() {
                    break; // The parser stopped (a malformed body): its error says why.
                }
            }
            Ok(Some(Err(e))) => {
                failure = Some(RequestError::Transport(e.to_string()));
                break;
            }
            Ok(None) => {
                // The rest; a parser that stopped has its own error to give.
                let _ = tx.send(batch.split().freeze()).await;
                break;
            }
            Err(_) => {
                failure = Some(RequestError::Timeout);
                break;
            }
        }
    }
    drop(tx);
    let parsed = parser
        .await
        .map_err(|e| RequestError::Transport(format!("list parser: {e}")))?;
    match failure {
        Some(e) => Err(e),
        None => Ok(parsed),
    }
}

impl K8sTarget {
    /// Sends a request and hands back the body unread when the status is a success.
    pub(super) async fn send_stream(
        &self,
        method: Method,
        path: &str,
        answer_within: Duration,
    ) -> Result<Body, RequestError> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::ACCEPT, "application/json")
            .body(Body::empty())
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        let sent = tokio::time::timeout(answer_within, self.kube_client().send(req))
            .await
            .map_err(|_| RequestError::Timeout)
            .and_then(|r| r.map_err(|e| RequestError::Transport(crate::error::root_cause(&e).0)));
        let res = sent.inspect_err(|e| self.after_error(e))?;
        if res.status().is_success() {
            return Ok(res.into_body());
        }
        let status = res.status();
        let bytes = tokio::time::timeout(READ_TIMEOUT, res.into_body().collect())
            .await
            .map_err(|_| RequestError::Timeout)?
            .map_err(|e| RequestError::Transport(format!("reading response: {e}")))?
            .to_bytes();
        let e = status_error(status, &bytes, None);
        self.after_error(&e);
        Err(e)
    }

    /// A read that is safe to repeat through kube's typed `Api`: retried on 429 (honouring
    /// Retry-After), 5xx, dropped connections and timeouts, so a flaky server does not fail
    /// a whole scan.
    pub(super) async fn read_retrying<T, F, Fut>(
        &self,
        what: &str,
        mut call: F,
    ) -> Result<T, RequestError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = kube::Result<T>>,
    {
        let (mut attempt, mut throttled) = (0u32, 0u32);
        loop {
            attempt += 1;
            let result = kube_call(READ_TIMEOUT, call()).await;
            self.note(&result);
            if let Err(e) = &result {
                self.after_error(e);
            }
            match result {
                Ok(v) => return Ok(v),
                // Pushed back: waited out as the server asks, never a failed try.
                Err(e) if e.is_throttled() => {
                    attempt -= 1;
                    throttled += 1;
                    wait_out_throttled(throttled, &e, what).await;
                }
                Err(e) if self.worth_retrying(&e) && attempt < READ_ATTEMPTS => {
                    let wait = Policy::READ.wait(attempt, e.retry_after(), what);
                    tracing::debug!(what, attempt, error = %e, "retrying read");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
