//! The etcd side: connect (plain, TLS with client certificates, user/password), and read a
//! consistent snapshot of the identities in pages at one pinned revision. Read-only: this
//! module issues range requests and nothing else.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, GetOptions, Identity, TlsOptions};
use serde::Deserialize;

use crate::core::kvstore::{
    KeyKind, KvSnapshot, MasterEntry, NodeCounts, SourceInfo, classify_key, normalize_prefix,
};
use crate::error::{Error, Result};

/// How to reach etcd and what to read.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub config_file: Option<PathBuf>,
    pub prefix: String,
    /// Keys per range request; halved automatically when a page is too large for one response.
    pub page_size: i64,
    pub timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: Vec::new(),
            config_file: None,
            prefix: crate::core::kvstore::DEFAULT_PREFIX.to_string(),
            page_size: 2000,
            timeout: Duration::from_secs(30),
        }
    }
}

impl EtcdOptions {
    /// The endpoints a connection reaches: `--etcd-endpoints`, or else the config file's
    /// (what the decision log's session line and the Preflight screen name). Empty when
    /// neither says (a file that cannot be read is said by the connection itself).
    pub fn endpoints_used(&self) -> Vec<String> {
        if !self.endpoints.is_empty() {
            return self.endpoints.clone();
        }
        self.config_file
            .as_deref()
            .and_then(|p| EtcdConfigFile::load(p).ok())
            .map(|f| f.endpoints)
            .unwrap_or_default()
    }
}

/// Cilium's etcd config file (the one passed as `--kvstore-opt etcd.config=`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct EtcdConfigFile {
    #[serde(default)]
    pub endpoints: Vec<String>,
    pub trusted_ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password: Option<String>,
}

impl EtcdConfigFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::file(
                path,
                "no such etcd config (--etcd-config): pass the file Cilium's agents mount (its etcd.config option), or --etcd-endpoints URL",
            ),
            _ => Error::file_io(path, "cannot read the etcd config (--etcd-config)", e),
        })?;
        serde_yaml_ng::from_str(&text)
            .map_err(|e| Error::file_io(path, "not a valid etcd config", e))
    }
}

/// The resolved connection: endpoints plus the options built from the config file. Cheap to
/// clone (the client is a handle on one channel).
#[derive(Clone)]
pub struct EtcdConnection {
    client: Client,
    endpoints: Vec<String>,
    timeout: Duration,
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::file_io(path, &format!("cannot read {what}"), e))
}

impl EtcdConnection {
    pub async fn connect(opts: &EtcdOptions) -> Result<Self> {
        let file = match &opts.config_file {
            Some(p) => EtcdConfigFile::load(p)?,
            None => EtcdConfigFile::default(),
        };
        let mut endpoints = opts.endpoints.clone();
        if endpoints.is_empty() {
            endpoints = file.endpoints.clone();
        }
        if endpoints.is_empty() {
            return Err(Error::Config(
                "no etcd endpoints: pass --etcd-endpoints URL[,URL] or --etcd-config FILE".into(),
            ));
        }
        // HTTP/2 pings while a stream is open (sync's watch): a connection that stays open
        // but carries nothing is closed within 20 s, and the channel connects again. Not
        // while idle: etcd counts pings without a stream as abuse and sends GOAWAY.
        let mut co = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(opts.timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(10));
        let uses_tls = file.trusted_ca_file.is_some()
            || file.cert_file.is_some()
            || endpoints.iter().any(|e| e.starts_with("https://"));
        if uses_tls {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &file.trusted_ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read_file(ca, "trusted-ca-file")?));
            }
            match (&file.cert_file, &file.key_file) {
                (Some(c), Some(k)) => {
                    tls = tls.identity(Identity::from_pem(
                        read_file(c, "cert-file")?,
                        read_file(k, "key-file")?,
                    ));
                }
                (None, None) => {}
                _ => {
                    return Err(Error::Config(
                        "etcd config: cert-file and key-file must be given together".into(),
                    ));
                }
            }
            co = co.with_tls(tls);
        }
        if let (Some(u), Some(p)) = (&file.username, &file.password) {
            co = co.with_user(u.clone(), p.clone());
        }
        let joined = endpoints.join(",");
        let client = Client::connect(endpoints.clone(), Some(co))
            .await
            .map_err(|e| Error::etcd(joined.clone(), "cannot connect", e))?;
        Ok(EtcdConnection {
            client,
            endpoints,
            timeout: opts.timeout,
        })
    }

    /// The endpoints this connection reaches.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The client itself, for `reservation` (the only writer, opt-in).
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    fn err(&self, what: &str, e: impl Into<crate::error::BoxError>) -> Error {
        let e = e.into();
        // etcd-client hides the status's transport error from `source()`: hand on the status
        // itself, whose chain reaches it; a status from etcd itself reads as its message.
        let e = match e.downcast::<etcd_client::Error>() {
            Ok(boxed) => match *boxed {
                etcd_client::Error::GRpcStatus(s) if std::error::Error::source(&s).is_none() => {
                    format!("{:?}: {}", s.code(), s.message()).into()
                }
                etcd_client::Error::GRpcStatus(s) => Box::new(s) as crate::error::BoxError,
                other => Box::new(other) as crate::error::BoxError,
            },
            Err(e) => e,
        };
        Error::etcd(self.endpoints.join(","), what, e)
    }

    /// Reads `id/` with values and `value/` keys only, both at one revision, in pages.
    pub async fn read_snapshot(&self, prefix: &str, page_size: i64) -> Result<KvSnapshot> {
        let mut snap = self.read_masters(prefix, page_size).await?;
        snap.node_counts = self.count_nodes(&snap, page_size).await?;
        Ok(snap)
    }

    /// How many identities (`id/` keys) the kvstore holds: one count-only request.
    pub async fn count_identities(&self, prefix: &str) -> Result<usize> {
        let prefix = normalize_prefix(prefix);
        let mut kv = self.client.kv_client();
        let id_prefix = format!("{prefix}id/").into_bytes();
        let id_end = prefix_end(&id_prefix);
        let head = self
            .range(
                &mut kv,
                id_prefix,
                GetOptions::new().with_range(id_end).with_count_only(),
            )
            .await?;
        Ok(usize::try_from(head.count()).unwrap_or(0))
    }

    /// Reads the `id/` keys and their label keys at one pinned revision; no node counts yet.
    pub async fn read_masters(&self, prefix: &str, page_size: i64) -> Result<KvSnapshot> {
        let prefix = normalize_prefix(prefix);
        let mut kv = self.client.kv_client().max_decoding_message_size(64 << 20);
        let mut snap = KvSnapshot {
            source: SourceInfo {
                endpoints: self.endpoints.clone(),
                revision: 0,
                prefix: prefix.trim_end_matches('/').to_string(),
            },
            ..Default::default()
        };
        let id_prefix = format!("{prefix}id/").into_bytes();
        let id_end = prefix_end(&id_prefix);
        // A cheap first request pins the revision every page is read at.
        let head = self
            .range(
                &mut kv,
                id_prefix.clone(),
                GetOptions::new()
                    .with_range(id_end.clone())
                    .with_count_only(),
            )
            .await?;
        let revision = head.header().map(|h| h.revision()).unwrap_or(0);
        snap.source.revision = revision;
        self.page_range(
            &mut kv,
            id_prefix,
            &id_end,
            revision,
            false,
            page_size,
            &mut |item| {
                if let KeyKind::Master { id } = classify_key(&prefix, item.key()) {
                    snap.masters.push(MasterEntry::new(id, item.value()));
                }
            },
        )
        .await?;
        tracing::info!(
            revision,
            identities = snap.masters.len(),
            "read kvstore snapshot"
        );
        Ok(snap)
    }

    /// Counts the `value/` keys per label key at the snapshot's revision: how many nodes use
    /// each identity. They number one per identity per node, millions on a large cluster, so
    /// they are only counted: memory does not grow with them. etcd 3.4 walks every key from
    /// a request's start to its range end before applying the limit, so one wide range paged
    /// costs O(n²/page); the snapshot's label keys split the `value/` space into ranges of
    /// about a page each, which keeps the pass linear. The space is read as two halves at
    /// once, each on a task of its own: etcd serves one half's page while the tool decodes
    /// the other's, where one stream left etcd idle between pages.
    pub async fn count_nodes(&self, snap: &KvSnapshot, page_size: i64) -> Result<NodeCounts> {
        let prefix = normalize_prefix(&snap.source.prefix);
        let value_prefix = format!("{prefix}value/").into_bytes();
        let value_end = prefix_end(&value_prefix);
        let mut bounds: Vec<&[u8]> = snap
            .masters
            .iter()
            .map(|m| m.value.as_slice())
            .filter(|v| !v.is_empty())
            .collect();
        bounds.sort_unstable();
        bounds.dedup();
        // Every 8th label key is split point enough (a range spans tens of label keys), and
        // owned copies of those cost an eighth of the label keys.
        let bounds: Vec<Vec<u8>> = bounds
            .iter()
            .step_by(8)
            .map(|b| [value_prefix.as_slice(), b].concat())
            .collect();
        let span = |lo: Vec<u8>, bounds: Vec<Vec<u8>>, end: Vec<u8>| CountSpan {
            conn: self.clone(),
            prefix: prefix.clone(),
            revision: snap.source.revision,
            page_size,
            lo,
            bounds,
            end,
        };
        let counts = if bounds.len() < 4 {
            span(value_prefix, bounds, value_end).count().await?
        } else {
            let mut low = bounds;
            let mut high = low.split_off(low.len() / 2);
            let middle = high.remove(0);
            let upper = span(middle.clone(), high, value_end);
            let upper = tokio::spawn(upper.count());
            let mut counts = span(value_prefix, low, middle).count().await?;
            let upper = upper
                .await
                .map_err(|e| self.err("counting node references", e))??;
            counts.merge(upper);
            counts
        };
        tracing::info!(
            revision = snap.source.revision,
            label_keys = counts.len(),
            "counted node references"
        );
        Ok(counts)
    }

    /// Every `value/` key with the id it holds, at the snapshot's revision (the audit's:
    /// whether a node's key points at an id that holds its labels).
    pub async fn read_value_keys(
        &self,
        snap: &KvSnapshot,
        page_size: i64,
    ) -> Result<Vec<crate::core::audit::ValueKey>> {
        let prefix = normalize_prefix(&snap.source.prefix);
        let mut kv = self.client.kv_client().max_decoding_message_size(64 << 20);
        let lo = format!("{prefix}value/").into_bytes();
        let hi = prefix_end(&lo);
        let mut out = Vec::new();
        let mut visit = |item: &etcd_client::KeyValue| {
            if let KeyKind::Slave { label_key, node } = classify_key(&prefix, item.key()) {
                out.push(crate::core::audit::ValueKey {
                    label_key: String::from_utf8_lossy(label_key).into_owned(),
                    node: String::from_utf8_lossy(node).into_owned(),
                    id: String::from_utf8_lossy(item.value()).into_owned(),
                });
            }
        };
        self.page_range(
            &mut kv,
            lo,
            &hi,
            snap.source.revision,
            false,
            page_size,
            &mut visit,
        )
        .await?;
        Ok(out)
    }

    async fn range(
        &self,
        kv: &mut etcd_client::KvClient,
        key: Vec<u8>,
        opts: GetOptions,
    ) -> Result<etcd_client::GetResponse> {
        match tokio::time::timeout(self.timeout, kv.get(key, Some(opts))).await {
            Err(_) => Err(self.err(
                "range request",
                format!("timed out after {}s", self.timeout.as_secs()),
            )),
            Ok(r) => r.map_err(|e| self.err("range request", e)),
        }
    }

    /// Pages through `[lo, hi)` at `revision`, visiting every key; returns how many there were.
    #[allow(clippy::too_many_arguments)]
    async fn page_range(
        &self,
        kv: &mut etcd_client::KvClient,
        lo: Vec<u8>,
        hi: &[u8],
        revision: i64,
        keys_only: bool,
        page_size: i64,
        visit: &mut impl FnMut(&etcd_client::KeyValue),
    ) -> Result<usize> {
        let mut page = page_size.max(1);
        let mut start = lo;
        let mut seen = 0;
        loop {
            let mut opts = GetOptions::new()
                .with_range(hi.to_vec())
                .with_limit(page)
                .with_revision(revision);
            if keys_only {
                opts = opts.with_keys_only();
            }
            let resp =
                match tokio::time::timeout(self.timeout, kv.get(start.clone(), Some(opts))).await {
                    Err(_) => {
                        return Err(self.err(
                            "range request",
                            format!("timed out after {}s", self.timeout.as_secs()),
                        ));
                    }
                    Ok(Err(e)) if page > 1 && is_too_large(&e) => {
                        page /= 2;
                        continue;
                    }
                    Ok(Err(e)) => return Err(self.err("range request", e)),
                    Ok(Ok(r)) => r,
                };
            let kvs = resp.kvs();
            tracing::trace!(keys = kvs.len(), more = resp.more(), "range page");
            seen += kvs.len();
            kvs.iter().for_each(&mut *visit);
            match kvs.last() {
                Some(last) if resp.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(seen),
            }
        }
    }
}

/// One part of the `value/` space to count, `[lo, end)`, read in ranges that end at the next
/// split point about a page of keys on; owned, so it runs on a task of its own.
struct CountSpan {
    conn: EtcdConnection,
    prefix: String,
    revision: i64,
    page_size: i64,
    lo: Vec<u8>,
    /// Split points inside `(lo, end)`, in order, each a whole `value/` key prefix.
    bounds: Vec<Vec<u8>>,
    end: Vec<u8>,
}

impl CountSpan {
    async fn count(self) -> Result<NodeCounts> {
        let mut kv = self
            .conn
            .client
            .kv_client()
            .max_decoding_message_size(64 << 20);
        let mut counts = NodeCounts::with_capacity(self.bounds.len() * 8);
        let prefix = self.prefix.as_str();
        let mut count_into = |item: &etcd_client::KeyValue| {
            if let KeyKind::Slave { label_key, node } = classify_key(prefix, item.key()) {
                counts.add_key(label_key, node, item.value());
            }
        };
        let (mut lo, mut next, mut group) = (self.lo.clone(), 0usize, 8usize);
        loop {
            next = (next + group).min(self.bounds.len());
            let hi = self.bounds.get(next).unwrap_or(&self.end).clone();
            // With values: a node uses the id its key names (a few bytes a key).
            let keys = self
                .conn
                .page_range(
                    &mut kv,
                    lo,
                    &hi,
                    self.revision,
                    false,
                    self.page_size,
                    &mut count_into,
                )
                .await?;
            if hi == self.end {
                break;
            }
            // Aim the next range at about one page of keys.
            let per_bound = (keys / group.max(1)).max(1);
            group = (self.page_size as usize / per_bound).clamp(1, 1024);
            lo = hi;
        }
        Ok(counts)
    }
}

fn is_too_large(e: &etcd_client::Error) -> bool {
    let s = e.to_string();
    s.contains("larger than max") || s.contains("ResourceExhausted") || s.contains("too large")
}

/// The smallest key greater than every key with this prefix.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Connects and reads in one go.
pub async fn read_snapshot(opts: &EtcdOptions) -> Result<KvSnapshot> {
    EtcdConnection::connect(opts)
        .await?
        .read_snapshot(&opts.prefix, opts.page_size)
        .await
}

/// A change to the identities since the snapshot revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// An `id/` key was created (`added`) or deleted (`removed`) at `revision`.
    Changed {
        added: u64,
        removed: u64,
        revision: i64,
    },
    /// etcd compacted past the watched revision: the snapshot must be taken again.
    Compacted { compact_revision: i64 },
}

pub use crate::core::sync::{KvChange, kv_change};

/// What the identities watch reports (defined beside the machine that takes it in).
pub use crate::core::sync::machine::KvWatchEvent;

/// How often the watch asks etcd for a progress report, so a quiet watch still hears from
/// its server (etcd 3.4 answers at once; its own notifications come every 10 minutes).
pub const WATCH_PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// A watch that hears nothing this long (three unanswered progress requests) is stalled:
/// it fails, and the caller watches again from its last revision.
pub const WATCH_IDLE: Duration = Duration::from_secs(30);
/// Longest wait for etcd to answer a new watch.
const WATCH_OPEN: Duration = Duration::from_secs(15);

impl EtcdConnection {
    /// Follows every key under the identities prefix from `revision + 1` until the receiver
    /// goes away or the watch fails. Read-only, like everything here.
    pub async fn watch_identities(
        &self,
        prefix: &str,
        revision: i64,
        tx: tokio::sync::mpsc::Sender<KvWatchEvent>,
    ) -> Result<()> {
        let prefix = normalize_prefix(prefix);
        let mut client = self.client.clone();
        let opening = client.watch(
            prefix.clone(),
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    // A deleted `value/` key's id: the node counts of that id follow it.
                    .with_prev_key()
                    .with_progress_notify()
                    .with_start_revision(revision + 1),
            ),
        );
        // A server that takes the connection and never answers must not hold the watch.
        let mut stream = tokio::time::timeout(WATCH_OPEN, opening)
            .await
            .map_err(|_| self.err("watch", format!("no answer in {} s", WATCH_OPEN.as_secs())))?
            .map_err(|e| self.err("watch", e))?;
        if tx.send(KvWatchEvent::Connected).await.is_err() {
            return Ok(());
        }
        let mut ask = tokio::time::interval(WATCH_PROGRESS_EVERY);
        ask.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heard = tokio::time::Instant::now();
        loop {
            let resp = tokio::select! {
                m = tokio::time::timeout_at(heard + WATCH_IDLE, stream.message()) => match m {
                    Err(_) => {
                        return Err(self.err(
                            "watch",
                            format!("stalled: nothing heard in {} s", WATCH_IDLE.as_secs()),
                        ));
                    }
                    Ok(m) => match m.map_err(|e| self.err("watch", e))? {
                        Some(resp) => resp,
                        None => return Ok(()),
                    },
                },
                _ = ask.tick() => {
                    stream.request_progress().await.map_err(|e| self.err("watch", e))?;
                    continue;
                }
            };
            heard = tokio::time::Instant::now();
            if resp.compact_revision() > 0 {
                let ev = KvWatchEvent::Compacted {
                    compact_revision: resp.compact_revision(),
                };
                let _ = tx.send(ev).await;
                return Ok(());
            }
            if resp.canceled() {
                return Err(self.err(
                    "watch",
                    format!("cancelled by the server: {}", resp.cancel_reason()),
                ));
            }
            let mut changes = Vec::new();
            let mut rev = revision;
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                rev = rev.max(kv.mod_revision());
                let delete = ev.event_type() == etcd_client::EventType::Delete;
                let value = (!delete).then(|| kv.value());
                let prev = ev.prev_kv().map(|p| p.value());
                let created = kv.create_revision() == kv.mod_revision();
                changes.extend(kv_change(&prefix, kv.key(), (value, prev), created));
            }
            let ev = if changes.is_empty() {
                // A progress notification (no events) vouches for everything up to its
                // header's revision; events that changed nothing, up to the last of them.
                let seen = match resp.events().is_empty() {
                    true => resp.header().map_or(rev, |h| h.revision()),
                    false => rev,
                };
                KvWatchEvent::Progress { revision: seen }
            } else {
                KvWatchEvent::Changes {
                    changes,
                    revision: rev,
                }
            };
            if tx.send(ev).await.is_err() {
                return Ok(());
            }
        }
    }

    /// The nodes whose `value/` keys for `label_key` name `id`, now.
    pub async fn nodes_using(
        &self,
        prefix: &str,
        label_key: &[u8],
        id: &[u8],
    ) -> Result<Vec<String>> {
        let prefix = normalize_prefix(prefix);
        let mut key = format!("{prefix}value/").into_bytes();
        key.extend_from_slice(label_key);
        key.push(b'/');
        let mut kv = self.client.kv_client();
        let resp = kv
            .get(key.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| self.err("range request", e))?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|k| k.value() == id)
            .map(|k| String::from_utf8_lossy(&k.key()[key.len()..]).into_owned())
            .filter(|node| node != crate::core::kvstore::RESERVATION_NODE)
            .collect())
    }

    /// Watches `id/` keys from `revision + 1` and reports drift (identities added, removed)
    /// until the receiver goes away: `watch_identities`, counted.
    pub async fn watch_drift(
        &self,
        prefix: &str,
        revision: i64,
        tx: tokio::sync::mpsc::Sender<Drift>,
    ) -> Result<()> {
        let (inner_tx, mut inner_rx) = tokio::sync::mpsc::channel(64);
        let watch = {
            let (conn, prefix) = (self.clone(), prefix.to_string());
            tokio::spawn(async move { conn.watch_identities(&prefix, revision, inner_tx).await })
        };
        while let Some(ev) = inner_rx.recv().await {
            let drift = match ev {
                KvWatchEvent::Connected | KvWatchEvent::Progress { .. } => continue,
                KvWatchEvent::Compacted { compact_revision } => {
                    Drift::Compacted { compact_revision }
                }
                KvWatchEvent::Changes { changes, revision } => {
                    let (mut added, mut removed) = (0, 0);
                    for c in changes {
                        match c {
                            KvChange::Master { created: true, .. } => added += 1,
                            KvChange::Master { value: None, .. } => removed += 1,
                            _ => {}
                        }
                    }
                    if added == 0 && removed == 0 {
                        continue;
                    }
                    Drift::Changed {
                        added,
                        removed,
                        revision,
                    }
                }
            };
            if tx.send(drift).await.is_err() {
                watch.abort();
                return Ok(());
            }
        }
        watch
            .await
            .map_err(|e| self.err("watch", format!("the watch stopped: {e}")))?
    }
}
