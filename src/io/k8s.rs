//! The Kubernetes side: connect like kubectl, list CiliumIdentity objects in pages, get,
//! create (never update), and install the CRD. Raw requests, so that status codes,
//! `Retry-After` and non-Status bodies are seen exactly as the API server sent them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use crate::core::identity::{
    self, CRD_NAME, collection_path, identity_object_of_run, parse_identity,
};
use crate::core::labels::{LabelKey, SecurityLabels, canonical_key};
use crate::error::{Error, Result};
use crate::io::list_stream::{ChunkReader, ListedObject, WatchEvent, parse_list};

/// Deadline of one read during a scan (a list page of 500 objects is well under a second).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of one read before the scan gives up.
const READ_ATTEMPTS: u32 = 8;

/// How to reach the API server, as kubectl would.
#[derive(Debug, Clone, Default)]
pub struct K8sOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// A failed request, classified for retry decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The server answered with an error status.
    Status {
        code: u16,
        /// The body was not a `Status` object (e.g. a plain-text `404 page not found`
        /// for a resource path that is not served).
        plain: bool,
        reason: String,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The connection failed or was dropped before a response.
    Transport(String),
    /// No answer within the per-operation timeout.
    Timeout,
}

impl RequestError {
    /// 429, 5xx, dropped connections and timeouts are worth another try; 4xx are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            RequestError::Status { code, .. } => *code == 429 || *code >= 500,
            RequestError::Transport(_) | RequestError::Timeout => true,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RequestError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// AlreadyExists, recognised by code as well as reason.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, RequestError::Status { code: 409, .. })
            || matches!(self, RequestError::Status { reason, .. } if reason == "AlreadyExists")
    }

    /// NotFound for an object: a 404 Status, by code or by reason. A plain-text 404 means the
    /// resource itself is not served (yet), which is not the same thing.
    /// A 409 Conflict (not AlreadyExists): a precondition (uid, resourceVersion) did not hold.
    /// The HTTP status, when the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            RequestError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, RequestError::Status { code: 409, reason, .. } if reason != "AlreadyExists")
    }

    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            RequestError::Status {
                code: 404,
                plain: false,
                ..
            }
        ) || matches!(self, RequestError::Status { reason, .. } if reason == "NotFound")
    }

    /// Any 404, including a plain-text one for a path that is not served.
    pub fn is_404(&self) -> bool {
        matches!(self, RequestError::Status { code: 404, .. })
    }
}

impl std::error::Error for RequestError {}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Status {
                code,
                reason,
                message,
                ..
            } => {
                write!(f, "HTTP {code}")?;
                if !reason.is_empty() {
                    write!(f, " {reason}")?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            RequestError::Transport(e) => write!(f, "connection failed: {e}"),
            RequestError::Timeout => write!(f, "timed out"),
        }
    }
}

/// Which object: its uid and the resourceVersion it was seen at.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub resource_version: String,
    /// The run of this tool that created it (`RUN_ANNOTATION`), if one did.
    #[serde(default, skip_serializing)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl ObjectRef {
    /// The run of this tool that created the object, from its annotation.
    pub fn created_by_run(&self) -> Option<&str> {
        self.annotations
            .get(crate::core::identity::RUN_ANNOTATION)
            .map(String::as_str)
    }
}

/// The CRD's state in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdState {
    Missing,
    Present { established: bool },
}

/// What Kubernetes holds.
#[derive(Debug, Clone, Default)]
pub struct K8sSnapshot {
    pub crd_present: bool,
    /// Identities whose name is a decimal id, with their labels as a canonical label key.
    pub identities: BTreeMap<u32, LabelKey>,
    /// Names that are not decimal ids (left alone, shown to the operator).
    pub other_names: Vec<String>,
    pub resource_version: String,
}

impl K8sSnapshot {
    /// Takes in one listed object: a decimal name is an identity, anything else is noted.
    fn add(&mut self, obj: ListedObject) {
        let name = obj.metadata.name.clone();
        match crate::core::kvstore::parse_id(name.as_bytes()) {
            Ok(id) => {
                self.identities.insert(id, canonical_key(&obj.labels()));
            }
            Err(_) => self.other_names.push(name),
        }
    }

    fn remove(&mut self, name: &str) {
        if let Ok(id) = crate::core::kvstore::parse_id(name.as_bytes()) {
            self.identities.remove(&id);
        }
        self.other_names.retain(|n| n != name);
    }
}

/// A connected API server.
#[derive(Clone)]
pub struct K8sTarget {
    client: kube::Client,
    pub server: String,
    pub context: Option<String>,
    /// `--consistent-reads`: every list is a quorum read, even where a cache read would do.
    pub consistent_reads: bool,
    /// Whether the server serves streaming lists: learnt on the first try, then remembered.
    watch_list: Arc<AtomicU8>,
}

/// One CiliumIdentity change, as `sync` follows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum K8sChange {
    /// The watch is established: the server answered 200 and streams from here.
    Connected,
    Upsert {
        id: u32,
        labels: LabelKey,
        resource_version: String,
    },
    Deleted {
        id: u32,
        resource_version: String,
    },
    /// Progress without a change (`allowWatchBookmarks`).
    Bookmark {
        resource_version: String,
    },
    /// The watched version is too old (410): list again.
    Expired,
    /// A fresh list after a 410, made by the one follower that then watches on from its
    /// `resource_version`: what sync holds is replaced by it, so no event between the list
    /// and the watch can fall between two lists.
    Relisted {
        identities: BTreeMap<u32, LabelKey>,
        resource_version: String,
    },
}

/// How a list reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// From the API server's watch cache: a streaming list (`sendInitialEvents`) where the
    /// server serves one, else `resourceVersion=0`. About 4x faster on a large cluster; it
    /// may lag etcd by a moment, which no write depends on (a create is guarded by its 409).
    Cache,
    /// Quorum reads from etcd, in pages: for checks that must see the latest state.
    Consistent,
}

const WATCH_LIST_UNKNOWN: u8 = 0;
const WATCH_LIST_YES: u8 = 1;
const WATCH_LIST_NO: u8 = 2;
/// Longest wait for the next bytes of a list being streamed.
const STREAM_IDLE: Duration = Duration::from_secs(60);
/// How long the server keeps one watch of sync's open (`timeoutSeconds`).
pub const WATCH_ROTATE: Duration = Duration::from_secs(45);
/// A watch silent this long is stalled: the server should have ended it by now.
pub const WATCH_IDLE: Duration = Duration::from_secs(55);
/// Longest wait for a watch to be answered.
const WATCH_OPEN: Duration = Duration::from_secs(15);

impl K8sTarget {
    /// Connects with an explicit kubeconfig, `KUBECONFIG`, `~/.kube/config`, or in-cluster config.
    pub async fn connect(opts: &K8sOptions) -> Result<Self> {
        let kopts = KubeConfigOptions {
            context: opts.context.clone(),
            ..Default::default()
        };
        let config = match &opts.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path)
                    .map_err(|e| Error::kubeconfig(Some(&path.display().to_string()), e, ""))?;
                kube::Config::from_custom_kubeconfig(kc, &kopts)
                    .await
                    .map_err(|e| Error::kubeconfig(Some(&path.display().to_string()), e, ""))?
            }
            None if opts.context.is_some() => kube::Config::from_kubeconfig(&kopts)
                .await
                .map_err(|e| Error::kubeconfig(None, e, ""))?,
            None => kube::Config::infer().await.map_err(|e| {
                Error::kubeconfig(None, e, "; pass --kubeconfig FILE or set KUBECONFIG")
            })?,
        };
        let context = opts.context.clone().or_else(|| current_context(opts));
        Self::from_config(config, context)
    }

    /// Connects to a plain-HTTP server such as the sandbox.
    pub fn from_url(url: &str) -> Result<Self> {
        let uri = url
            .parse::<http::Uri>()
            .map_err(|e| Error::Config(format!("server URL {url}: {e}")))?;
        Self::from_config(kube::Config::new(uri), Some("sandbox".into()))
    }

    fn from_config(mut config: kube::Config, context: Option<String>) -> Result<Self> {
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        // Per-operation deadlines are ours (`--op-timeout`); kube's own read timeout would
        // cut long list pages and watches short.
        config.read_timeout = None;
        // Retries are the engine's, counted and reported, honouring Retry-After; a second,
        // hidden retry layer would double them.
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| {
            let cause: crate::error::BoxError = e.into();
            Error::Kube {
                server: server.clone(),
                message: cause.to_string(),
                source: Some(cause),
            }
        })?;
        Ok(K8sTarget {
            client,
            server,
            context,
            consistent_reads: false,
            watch_list: Arc::new(AtomicU8::new(WATCH_LIST_UNKNOWN)),
        })
    }

    /// kube's client (auth, TLS, transport) for kube's typed `Api` (`io::lease`).
    pub(crate) fn kube_client(&self) -> kube::Client {
        self.client.clone()
    }

    fn kube_err(&self, what: &str, e: impl Into<crate::error::BoxError>) -> Error {
        Error::kube(self.server.clone(), what, e)
    }

    /// Sends one request and returns the status and body.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), RequestError> {
        let (status, bytes) = self.send_raw(method, path, body).await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Sends one request; a success body comes back unparsed (a create does not need it).
    async fn send_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, bytes::Bytes), RequestError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::ACCEPT, "application/json");
        let bytes = match body {
            Some(v) => {
                builder = builder.header(http::header::CONTENT_TYPE, "application/json");
                serde_json::to_vec(v).map_err(|e| RequestError::Transport(e.to_string()))?
            }
            None => Vec::new(),
        };
        let req = builder
            .body(Body::from(bytes))
            .map_err(|e| RequestError::Transport(e.to_string()))?;
        let res = self
            .client
            .send(req)
            .await
            .map_err(|e| RequestError::Transport(crate::error::root_cause(&e).0))?;
        let status = res.status();
        let retry_after = res
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = res
            .into_body()
            .collect()
            .await
            .map_err(|e| RequestError::Transport(format!("reading response: {e}")))?
            .to_bytes();
        if status.is_success() {
            return Ok((status, body));
        }
        Err(status_error(status, &body, retry_after))
    }
}

/// A failed list, told apart so the cache path can fall back.
enum ListError {
    /// The server does not serve this kind of list.
    Unsupported,
    Request(RequestError),
}

/// Page size of paged lists.
const LIST_PAGE: u32 = 500;

/// The events of a watch body, one JSON object per line, read as the bytes arrive.
struct EventLines {
    body: Body,
    pending: Vec<u8>,
    start: usize,
    /// Longest wait for the next bytes (`None`: a watch may be quiet for long).
    idle: Option<Duration>,
}

impl EventLines {
    fn new(body: Body, idle: Option<Duration>) -> Self {
        EventLines {
            body,
            pending: Vec::new(),
            start: 0,
            idle,
        }
    }

    /// The next event; `None` when the stream ends.
    async fn next(&mut self) -> Result<Option<WatchEvent>, RequestError> {
        loop {
            if let Some(end) = self.pending[self.start..].iter().position(|b| *b == b'\n') {
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

/// The error an ERROR event carries (a `Status`).
fn status_of(o: crate::io::list_stream::EventObject) -> RequestError {
    RequestError::Status {
        code: o.code.unwrap_or(500),
        plain: false,
        reason: o.reason.unwrap_or_default(),
        message: o.message.unwrap_or_default(),
        retry_after: None,
    }
}

/// Parses a streamed body on a blocking thread while the download continues here.
async fn parse_streamed<T: Send + 'static>(
    mut body: Body,
    parse: impl FnOnce(ChunkReader) -> T + Send + 'static,
) -> Result<T, RequestError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let parser = tokio::task::spawn_blocking(move || parse(ChunkReader::new(rx)));
    let mut failure = None;
    loop {
        match tokio::time::timeout(STREAM_IDLE, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data()
                    && tx.send(data).await.is_err()
                {
                    break; // The parser stopped (a malformed body): its error says why.
                }
            }
            Ok(Some(Err(e))) => {
                failure = Some(RequestError::Transport(e.to_string()));
                break;
            }
            Ok(None) => break,
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

/// The error for a non-success answer: its Status when the body is one, else the plain text.
fn status_error(status: StatusCode, body: &[u8], retry_after: Option<Duration>) -> RequestError {
    {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        // A Status body when there is one; the plain text otherwise (e.g. "404 page not found"
        // while a new CRD is not yet established).
        let plain = value.get("kind").and_then(Value::as_str) != Some("Status");
        let (reason, message) = if !plain {
            (
                value
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                value
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            )
        } else {
            (
                String::new(),
                String::from_utf8_lossy(body)
                    .trim()
                    .chars()
                    .take(200)
                    .collect(),
            )
        };
        RequestError::Status {
            code: status.as_u16(),
            plain,
            reason,
            message,
            retry_after,
        }
    }
}

impl K8sTarget {
    /// A read that is safe to repeat: retried on 429 (honouring Retry-After), 5xx, dropped
    /// connections and timeouts, so a flaky server does not fail a whole scan.
    async fn get_retrying(&self, path: &str) -> Result<Value, RequestError> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let res = tokio::time::timeout(READ_TIMEOUT, self.send(Method::GET, path, None))
                .await
                .unwrap_or(Err(RequestError::Timeout));
            match res {
                Ok((_, v)) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < READ_ATTEMPTS => {
                    let wait = e
                        .retry_after()
                        .unwrap_or(Duration::from_millis(100 << attempt.min(6)))
                        .min(Duration::from_secs(30));
                    tracing::debug!(path, attempt, error = %e, "retrying read");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The server's version string, e.g. `v1.33.0`.
    pub async fn server_version(&self) -> Result<String> {
        let (_, v) = self
            .send(Method::GET, "/version", None)
            .await
            .map_err(|e| self.kube_err("reading /version", e))?;
        Ok(v.get("gitVersion")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    pub async fn crd_state(&self) -> Result<CrdState> {
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}");
        match self.get_retrying(&path).await {
            Ok(v) => {
                let established = v
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    });
                Ok(CrdState::Present { established })
            }
            Err(e) if e.is_404() => Ok(CrdState::Missing),
            Err(e) => Err(self.kube_err(&format!("reading CRD {CRD_NAME}"), e)),
        }
    }

    /// Creates the CRD from `assets/` (an existing one is left as it is).
    pub async fn create_crd(&self) -> Result<()> {
        let crd: Value = serde_yaml::from_str(identity::CRD_YAML)
            .map_err(|e| Error::Config(format!("embedded CRD: {e}")))?;
        match self
            .send(
                Method::POST,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                Some(&crd),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => Err(self.kube_err(&format!("creating CRD {CRD_NAME}"), e)),
        }
    }

    /// Waits until the CRD is Established and its resource answers (right after creation the
    /// resource path is a plain-text 404 for a while).
    pub async fn wait_crd_established(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.crd_state().await? == (CrdState::Present { established: true }) {
                match self
                    .send(Method::GET, &format!("{}?limit=1", collection_path()), None)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(e) if e.is_404() => {}
                    Err(e) => return Err(self.kube_err("probing ciliumidentities", e)),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.kube_err(
                    &format!("CRD {CRD_NAME}"),
                    format!("not Established after {}s", timeout.as_secs()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How lists read by default: from the cache, unless `--consistent-reads`.
    pub fn read_mode(&self) -> ReadMode {
        if self.consistent_reads {
            ReadMode::Consistent
        } else {
            ReadMode::Cache
        }
    }

    /// Lists every CiliumIdentity, parsing objects as they arrive; `listed` counts them for a
    /// progress display. A read cut short is started over (a few times) from scratch.
    pub async fn list_identities(
        &self,
        mode: ReadMode,
        listed: Option<Arc<AtomicUsize>>,
    ) -> Result<K8sSnapshot> {
        let crd_present = self.crd_state().await? != CrdState::Missing;
        if !crd_present {
            return Ok(K8sSnapshot::default());
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            if let Some(n) = &listed {
                n.store(0, Ordering::Relaxed);
            }
            let result = match mode {
                ReadMode::Consistent => {
                    self.list_pages(&format!("limit={LIST_PAGE}"), &listed)
                        .await
                }
                ReadMode::Cache => match self.watch_list(&listed).await {
                    Err(ListError::Unsupported) => {
                        // Served from the watch cache in one response before 1.27 (the
                        // `limit` is ignored); a continue token, if one comes, is followed.
                        self.list_pages(&format!("resourceVersion=0&limit={LIST_PAGE}"), &listed)
                            .await
                    }
                    other => other,
                },
            };
            match result {
                Ok(mut snap) => {
                    snap.crd_present = true;
                    return Ok(snap);
                }
                Err(ListError::Request(e)) if e.is_retryable() && attempt < READ_ATTEMPTS => {
                    let wait = e
                        .retry_after()
                        .unwrap_or(Duration::from_millis(100 << attempt.min(6)))
                        .min(Duration::from_secs(30));
                    tracing::debug!(attempt, error = %e, "listing again");
                    tokio::time::sleep(wait).await;
                }
                Err(ListError::Request(e)) => {
                    return Err(self.kube_err("listing ciliumidentities", e));
                }
                Err(ListError::Unsupported) => {
                    return Err(self.kube_err("listing ciliumidentities", "not served"));
                }
            }
        }
    }

    /// A streaming list (`sendInitialEvents=true`): the current state as ADDED events, ended
    /// by a bookmark. `Unsupported` when the server refuses it (the WatchList gate is off).
    async fn watch_list(
        &self,
        listed: &Option<Arc<AtomicUsize>>,
    ) -> Result<K8sSnapshot, ListError> {
        if self.watch_list.load(Ordering::Relaxed) == WATCH_LIST_NO {
            return Err(ListError::Unsupported);
        }
        let path = format!(
            "{}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            collection_path()
        );
        let body = match self.send_stream(Method::GET, &path, READ_TIMEOUT).await {
            Ok(body) => body,
            Err(RequestError::Status {
                code: 400 | 403 | 422,
                ..
            }) => {
                self.watch_list.store(WATCH_LIST_NO, Ordering::Relaxed);
                return Err(ListError::Unsupported);
            }
            Err(e) => return Err(ListError::Request(e)),
        };
        self.watch_list.store(WATCH_LIST_YES, Ordering::Relaxed);
        let mut snap = K8sSnapshot::default();
        let mut events = EventLines::new(body, Some(STREAM_IDLE));
        while let Some(ev) = events.next().await.map_err(ListError::Request)? {
            match ev.kind.as_str() {
                "ADDED" | "MODIFIED" => {
                    snap.add(ev.object.identity);
                    if let Some(n) = listed {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                }
                "DELETED" => snap.remove(&ev.object.identity.metadata.name),
                "BOOKMARK" => {
                    let meta = ev.object.identity.metadata;
                    if meta
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .is_some_and(|v| v == "true")
                    {
                        snap.resource_version = meta.resource_version;
                        return Ok(snap);
                    }
                }
                _ => return Err(ListError::Request(status_of(ev.object))),
            }
        }
        Err(ListError::Request(RequestError::Transport(
            "the streaming list ended before its last bookmark".into(),
        )))
    }

    /// A list in pages (`query` without `continue`), each page parsed while it streams in;
    /// restarts from the first page if a continue token expires.
    async fn list_pages(
        &self,
        query: &str,
        listed: &Option<Arc<AtomicUsize>>,
    ) -> Result<K8sSnapshot, ListError> {
        let mut snap = K8sSnapshot::default();
        let mut restarts = 0;
        let mut cont: Option<String> = None;
        loop {
            let path = match &cont {
                // A continue token carries the rest of the query's state.
                Some(c) => format!(
                    "{}?limit={LIST_PAGE}&continue={}",
                    collection_path(),
                    urlencode(c)
                ),
                None => format!("{}?{query}", collection_path()),
            };
            let body = match self.send_stream(Method::GET, &path, READ_TIMEOUT).await {
                Ok(b) => b,
                Err(RequestError::Status { code: 410, .. }) if restarts < 3 => {
                    restarts += 1;
                    snap = K8sSnapshot::default();
                    cont = None;
                    continue;
                }
                Err(e) => return Err(ListError::Request(e)),
            };
            let counter = listed.clone();
            let (page, meta) = parse_streamed(body, move |reader| {
                let mut page = K8sSnapshot::default();
                // serde reads byte by byte: a buffer in front keeps that a memory copy.
                let reader = std::io::BufReader::with_capacity(1 << 16, reader);
                let meta = parse_list(reader, |o| {
                    page.add(o);
                    if let Some(n) = &counter {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                });
                (page, meta)
            })
            .await
            .map_err(ListError::Request)?;
            let meta = meta.map_err(|e| ListError::Request(RequestError::Transport(e)))?;
            snap.identities.extend(page.identities);
            snap.other_names.extend(page.other_names);
            snap.resource_version = meta.resource_version;
            cont = meta.continue_token.filter(|c| !c.is_empty());
            if cont.is_none() {
                return Ok(snap);
            }
        }
    }

    /// Follows CiliumIdentity changes after `resource_version` until the receiver goes away:
    /// `Expired` when the server no longer has that version (list again, then watch on).
    pub async fn watch_identities(
        &self,
        resource_version: &str,
        tx: tokio::sync::mpsc::Sender<K8sChange>,
    ) -> Result<(), RequestError> {
        // The server ends the watch after `timeoutSeconds` (and sends a bookmark shortly
        // before, and every minute when it is longer); the caller watches again from the last
        // version. So a healthy watch is never silent longer than that, and one that is
        // silent past `WATCH_IDLE` is a connection that stays open and carries nothing.
        let path = format!(
            "{}?watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}",
            collection_path(),
            WATCH_ROTATE.as_secs(),
            urlencode(resource_version)
        );
        // A server answers a watch at once; one that does not within this time is a
        // connection that carries nothing, and the caller tries a new one.
        let body = self.send_stream(Method::GET, &path, WATCH_OPEN).await?;
        if tx.send(K8sChange::Connected).await.is_err() {
            return Ok(());
        }
        let mut events = EventLines::new(body, Some(WATCH_IDLE));
        let stalled = |e| match e {
            RequestError::Timeout => RequestError::Transport(format!(
                "stalled: nothing heard in {} s",
                WATCH_IDLE.as_secs()
            )),
            e => e,
        };
        while let Some(ev) = events.next().await.map_err(stalled)? {
            let change = match ev.kind.as_str() {
                "ADDED" | "MODIFIED" | "DELETED" => {
                    let obj = ev.object.identity;
                    let rv = obj.metadata.resource_version.clone();
                    let Ok(id) = crate::core::kvstore::parse_id(obj.metadata.name.as_bytes())
                    else {
                        continue;
                    };
                    if ev.kind == "DELETED" {
                        K8sChange::Deleted {
                            id,
                            resource_version: rv,
                        }
                    } else {
                        K8sChange::Upsert {
                            id,
                            labels: canonical_key(&obj.labels()),
                            resource_version: rv,
                        }
                    }
                }
                "BOOKMARK" => K8sChange::Bookmark {
                    resource_version: ev.object.identity.metadata.resource_version,
                },
                _ if ev.object.code == Some(410) => K8sChange::Expired,
                _ => return Err(status_of(ev.object)),
            };
            let expired = change == K8sChange::Expired;
            if tx.send(change).await.is_err() || expired {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Sends a request and hands back the body unread when the status is a success.
    async fn send_stream(
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
        let res = tokio::time::timeout(answer_within, self.client.send(req))
            .await
            .map_err(|_| RequestError::Timeout)?
            .map_err(|e| RequestError::Transport(crate::error::root_cause(&e).0))?;
        if res.status().is_success() {
            return Ok(res.into_body());
        }
        let status = res.status();
        let bytes = tokio::time::timeout(READ_TIMEOUT, res.into_body().collect())
            .await
            .map_err(|_| RequestError::Timeout)?
            .map_err(|e| RequestError::Transport(format!("reading response: {e}")))?
            .to_bytes();
        Err(status_error(status, &bytes, None))
    }

    /// Reads one identity; `Ok(None)` when it does not exist.
    /// Creates one identity and returns the uid and resourceVersion the server gave it. Never
    /// updates: an existing object yields an AlreadyExists error.
    pub async fn create_identity(
        &self,
        id: u32,
        labels: &SecurityLabels,
    ) -> Result<ObjectRef, RequestError> {
        let (_, body) = self
            .send_raw(
                Method::POST,
                &collection_path(),
                Some(&identity_object_of_run(
                    id,
                    labels,
                    crate::io::decision_log::run_id(),
                )),
            )
            .await?;
        // Only the metadata is read: the rest of the answer is what was sent.
        #[derive(serde::Deserialize)]
        struct Created {
            metadata: ObjectRef,
        }
        Ok(serde_json::from_slice::<Created>(&body)
            .map(|c| c.metadata)
            .unwrap_or_default())
    }

    /// Reads one identity with its uid and resourceVersion; `Ok(None)` when it does not exist.
    pub async fn get_identity_object(
        &self,
        id: u32,
    ) -> Result<Option<(ObjectRef, SecurityLabels)>, RequestError> {
        match self
            .send(Method::GET, &format!("{}/{id}", collection_path()), None)
            .await
        {
            Ok((_, v)) => {
                let labels = parse_identity(&v).map_err(RequestError::Transport)?.labels;
                let meta = serde_json::from_value::<ObjectRef>(
                    v.get("metadata").cloned().unwrap_or_default(),
                )
                .unwrap_or_default();
                Ok(Some((meta, labels)))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes one identity only if it is still exactly `expected` (uid and resourceVersion
    /// preconditions): otherwise the server answers 409 Conflict and nothing is deleted.
    pub async fn delete_identity(&self, id: u32, expected: &ObjectRef) -> Result<(), RequestError> {
        let options = json!({
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"uid": expected.uid, "resourceVersion": expected.resource_version},
        });
        self.send_raw(
            Method::DELETE,
            &format!("{}/{id}", collection_path()),
            Some(&options),
        )
        .await
        .map(|_| ())
    }

    /// Asks the API server whether the current user may do `verb` on a resource.
    pub async fn can_i(&self, verb: &str, group: &str, resource: &str) -> Result<bool> {
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}},
        });
        let (_, v) = self
            .send(
                Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                Some(&review),
            )
            .await
            .map_err(|e| self.kube_err("SelfSubjectAccessReview", e))?;
        Ok(v.pointer("/status/allowed")
            .and_then(Value::as_bool)
            .unwrap_or(false))
    }
}

/// Every object `api` lists, in pages of 500, handed to `each`. A continue token that expired
/// between pages (410) starts the list over, as kubectl does, after `restart` (a few times).
pub(crate) async fn for_each_listed<K>(
    api: &kube::Api<K>,
    mut restart: impl FnMut(),
    mut each: impl FnMut(K),
) -> Result<(), RequestError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    const PAGE: u32 = 500;
    const PAGE_TIMEOUT: Duration = Duration::from_secs(60);
    const ATTEMPTS: u32 = 3;
    let mut attempt = 0;
    'list: loop {
        attempt += 1;
        let mut params = kube::api::ListParams::default().limit(PAGE);
        loop {
            let page = match kube_call(PAGE_TIMEOUT, api.list(&params)).await {
                Ok(p) => p,
                Err(e) if e.code() == Some(410) && attempt < ATTEMPTS => {
                    restart();
                    continue 'list;
                }
                Err(e) => return Err(e),
            };
            page.items.into_iter().for_each(&mut each);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(()),
            }
        }
    }
}

/// One call through kube's typed `Api`, with a deadline, its error classified like every
/// other request's (status, reason; a transport failure by its root cause).
pub(crate) async fn kube_call<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, RequestError> {
    match tokio::time::timeout(deadline, call).await {
        Err(_) => Err(RequestError::Timeout),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) => Err(RequestError::Status {
            code: s.code,
            plain: false,
            reason: s.reason.clone(),
            message: s.message.clone(),
            retry_after: None,
        }),
        Ok(Err(e)) => Err(RequestError::Transport(crate::error::root_cause(&e).0)),
    }
}

fn current_context(opts: &K8sOptions) -> Option<String> {
    let kc = match &opts.kubeconfig {
        Some(p) => Kubeconfig::read_from(p).ok(),
        None => Kubeconfig::read().ok(),
    }?;
    kc.current_context
}

/// Percent-encodes a query value (continue tokens are opaque and may hold `=`, `+`, `/`).
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
