//! Reaching the API server as kubectl does: kubeconfig, context, in-cluster config, auth
//! and TLS from kube, with our own deadlines and retries instead of kube's.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::notes::ServerNotes;
use crate::error::{Error, Result};

/// Whether the server serves streaming lists (`K8sTarget::watch_list`): not known yet, yes, no.
pub(super) const WATCH_LIST_UNKNOWN: u8 = 0;
pub(super) const WATCH_LIST_YES: u8 = 1;
pub(super) const WATCH_LIST_NO: u8 = 2;

/// How to reach the API server, as kubectl would.
#[derive(Debug, Clone, Default)]
pub struct K8sOptions {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// A connected API server.
#[derive(Clone)]
pub struct K8sTarget {
    /// kube's client and its pool of connections; replaced by a fresh one (a new pool) when
    /// a request stalls, so requests stop landing on connections that went dead without
    /// closing (a half-open proxy or load balancer).
    client: Arc<std::sync::RwLock<kube::Client>>,
    config: Arc<kube::Config>,
    /// When the pool was last replaced: at most once a second, however many requests stall.
    replaced: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Counts the replacements, so a watch on an old connection moves to a new one at once
    /// instead of waiting out its idle deadline.
    pub(super) resets: Arc<tokio::sync::watch::Sender<u64>>,
    pub server: String,
    pub context: Option<String>,
    /// `--consistent-reads`: every list is a quorum read, even where a cache read would do.
    pub consistent_reads: bool,
    /// Whether the server serves streaming lists: learnt on the first try, then remembered.
    pub(super) watch_list: Arc<AtomicU8>,
    /// Whether the server ever answered a request (`RequestError::worth_retrying`).
    pub(super) answered: Arc<std::sync::atomic::AtomicBool>,
    /// Credentials from a token file (a pod's projected ServiceAccount token, which the
    /// kubelet replaces well before it expires): the token the current client was built
    /// with, and when a 401 last made a client with a newer one (`renew_token`).
    token_file: Option<PathBuf>,
    token_seen: Arc<std::sync::Mutex<Option<String>>>,
    renewed: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// What the server said beside its answers (429s, `Warning` headers), on every client
    /// this target makes.
    notes: Arc<ServerNotes>,
}

/// How long after a token was renewed a 401 is still worth another try: requests sent with
/// the old token answer within their deadlines.
const RENEWED_RECENTLY: std::time::Duration = std::time::Duration::from_secs(30);

/// Why no configuration can be inferred, said plainly, when that is plain from the
/// environment: `KUBECONFIG` names files none of which exist, or it is unset, there is no
/// `~/.kube/config` and this is not a pod.
fn no_kubeconfig_to_infer() -> Option<String> {
    const DO: &str = "pass --kubeconfig FILE or set KUBECONFIG";
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let paths: Vec<std::path::PathBuf> = std::env::split_paths(&list).collect();
        if paths.iter().all(|p| !p.exists()) {
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            return Some(format!(
                "kubeconfig: KUBECONFIG names {}, which does not exist; {DO} to an existing file",
                names.join(", ")
            ));
        }
        return None;
    }
    let home = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".kube/config"));
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    match home {
        Some(p) if !p.exists() && !in_cluster => Some(format!(
            "kubeconfig: none found (KUBECONFIG is not set, {} does not exist, and this is not a pod in a cluster); {DO}",
            p.display()
        )),
        _ => None,
    }
}

impl K8sTarget {
    /// Connects with an explicit kubeconfig, `KUBECONFIG`, `~/.kube/config`, or in-cluster config.
    pub async fn connect(opts: &K8sOptions) -> Result<Self> {
        let kopts = KubeConfigOptions {
            context: opts.context.clone(),
            ..Default::default()
        };
        let config = match &opts.kubeconfig {
            Some(path) if !path.exists() => {
                return Err(Error::Config(format!(
                    "kubeconfig {}: no such file; pass --kubeconfig with an existing file, or set KUBECONFIG",
                    path.display()
                )));
            }
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
            None => {
                if let Some(why) = no_kubeconfig_to_infer() {
                    return Err(Error::Config(why));
                }
                kube::Config::infer().await.map_err(|e| {
                    Error::kubeconfig(None, e, "; pass --kubeconfig FILE or set KUBECONFIG")
                })?
            }
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
        let notes = Arc::new(ServerNotes::default());
        let client = client_of(&config, &notes).map_err(|e| {
            let cause: crate::error::BoxError = e.into();
            Error::Kube {
                server: server.clone(),
                message: cause.to_string(),
                source: Some(cause),
            }
        })?;
        let token_file = config.auth_info.token_file.as_ref().map(PathBuf::from);
        Ok(K8sTarget {
            client: Arc::new(std::sync::RwLock::new(client)),
            config: Arc::new(config),
            replaced: Arc::default(),
            resets: Arc::new(tokio::sync::watch::Sender::new(0)),
            server,
            context,
            consistent_reads: false,
            watch_list: Arc::new(AtomicU8::new(WATCH_LIST_UNKNOWN)),
            answered: Arc::default(),
            token_seen: Arc::new(std::sync::Mutex::new(
                token_file
                    .as_ref()
                    .and_then(|f| std::fs::read_to_string(f).ok())
                    .map(|t| t.trim().to_string()),
            )),
            token_file,
            renewed: Arc::default(),
            notes,
        })
    }

    /// What the server said beside its answers so far: how often it pushed back, and its
    /// warnings.
    pub fn notes(&self) -> &Arc<ServerNotes> {
        &self.notes
    }

    /// kube's client (auth, TLS, transport) for kube's typed `Api` (`io::lease`).
    pub(crate) fn kube_client(&self) -> kube::Client {
        self.client
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// After a request stalled or its connection failed: the pooled connections go (a new
    /// client, a new pool), so the next request opens a fresh connection instead of waiting
    /// on another dead one. Requests in flight keep the connections they have.
    pub fn drop_connections(&self) {
        let now = std::time::Instant::now();
        {
            let mut last = self.replaced.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(1)) {
                return;
            }
            *last = Some(now);
        }
        match client_of(&self.config, &self.notes) {
            Ok(fresh) => {
                tracing::debug!(server = %self.server, "a request stalled: new connections from now on");
                *self.client.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                self.resets.send_modify(|n| *n += 1);
            }
            Err(e) => tracing::warn!(server = %self.server, error = %e, "cannot open a new client"),
        }
    }

    /// Drops the pooled connections after an error that suggests they are dead.
    /// Whether the server has answered a request of this client (with any status).
    pub(super) fn has_answered(&self) -> bool {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes how a request ended: any answer shows the server is there.
    pub(super) fn note<T>(&self, result: &std::result::Result<T, super::errors::RequestError>) {
        if !matches!(
            result,
            Err(super::errors::RequestError::Timeout | super::errors::RequestError::Transport(_))
        ) {
            self.answered
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// After a 401 with credentials from a token file: the kubelet may have replaced the
    /// token since kube last read it (kube reads the file again only every minute), so a
    /// file that now holds another token gets a new client, which reads it. A refusal of the
    /// new token is a refusal like any other.
    fn renew_token(&self) {
        let Some(path) = &self.token_file else {
            return;
        };
        let Ok(now) = std::fs::read_to_string(path) else {
            return;
        };
        let now = now.trim().to_string();
        let mut seen = self.token_seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.as_deref() == Some(now.as_str()) {
            return;
        }
        match client_of(&self.config, &self.notes) {
            Ok(fresh) => {
                tracing::info!(file = %path.display(), "a 401: the token file holds a new token; using it");
                *self.client.write().unwrap_or_else(|p| p.into_inner()) = fresh;
                *seen = Some(now);
                *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(std::time::Instant::now());
            }
            Err(e) => tracing::warn!(error = %e, "cannot open a client with the new token"),
        }
    }

    /// Whether a failed request is worth another try: what `RequestError::worth_retrying`
    /// says, or a 401 sent with a token since renewed (`sent_with_old_token`).
    pub(crate) fn worth_retrying(&self, e: &super::errors::RequestError) -> bool {
        e.worth_retrying(self.has_answered()) || self.sent_with_old_token(e)
    }

    /// A 401 just after the token file's new token was taken up: the request carried the old
    /// one, and another try carries the new.
    pub(crate) fn sent_with_old_token(&self, e: &super::errors::RequestError) -> bool {
        e.code() == Some(401)
            && self
                .renewed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|at| at.elapsed() < RENEWED_RECENTLY)
    }

    pub(crate) fn after_error(&self, e: &super::errors::RequestError) {
        if e.code() == Some(401) {
            self.renew_token();
        }
        if matches!(
            e,
            super::errors::RequestError::Timeout | super::errors::RequestError::Transport(_)
        ) {
            self.drop_connections();
        }
    }

    pub(super) fn kube_err(&self, what: &str, e: impl Into<crate::error::BoxError>) -> Error {
        Error::kube(self.server.clone(), what, e)
    }
}

/// kube's client for `config`, with a layer that hears what the server says beside each
/// answer (`ServerNotes`): every request passes it, the typed `Api`'s and the raw lists and
/// watches alike.
fn client_of(
    config: &kube::Config,
    notes: &Arc<ServerNotes>,
) -> std::result::Result<kube::Client, kube::Error> {
    let notes = notes.clone();
    let hear = tower::util::MapResponseLayer::new(
        move |res: http::Response<Box<kube::client::DynBody>>| {
            notes.observe(res.status(), res.headers());
            res
        },
    );
    Ok(kube::client::ClientBuilder::try_from(config.clone())?
        .with_layer(&hear)
        .build())
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
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
