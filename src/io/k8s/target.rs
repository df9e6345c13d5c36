//! Reaching the API server as kubectl does: kubeconfig, context, in-cluster config, auth
//! and TLS from kube, with our own deadlines and retries instead of kube's.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;

use kube::config::{KubeConfigOptions, Kubeconfig};

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
    pub(super) client: kube::Client,
    pub server: String,
    pub context: Option<String>,
    /// `--consistent-reads`: every list is a quorum read, even where a cache read would do.
    pub consistent_reads: bool,
    /// Whether the server serves streaming lists: learnt on the first try, then remembered.
    pub(super) watch_list: Arc<AtomicU8>,
}

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

    pub(super) fn kube_err(&self, what: &str, e: impl Into<crate::error::BoxError>) -> Error {
        Error::kube(self.server.clone(), what, e)
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
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
