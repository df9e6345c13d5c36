//! Lists of CiliumIdentity objects: from the watch cache (a streaming list where served,
//! else `resourceVersion=0`) or consistent in pages, each parsed object by object as it
//! streams in (raw, not kube's `Api::list`: at 65,280 identities the list is 100 MB, and
//! parsing it whole would hold it twice), restarted when a read is cut short; and a paged
//! list helper for kube's typed `Api` where the lists are small.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Method;

use super::errors::{RequestError, kube_call, status_of};
use super::objects::CrdState;
use super::target::{K8sTarget, WATCH_LIST_NO, WATCH_LIST_YES, urlencode};
use super::transport::{
    EventLines, READ_ATTEMPTS, READ_TIMEOUT, STREAM_IDLE, parse_streamed, wait_out_throttled,
};
use crate::core::identity::collection_path;
use crate::core::labels::LabelKey;
use crate::error::Result;
use crate::io::list_stream::{ListedObject, parse_list};
use crate::io::retry::Policy;

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
                self.identities.insert(id, obj.label_key());
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

/// A failed list, told apart so the cache path can fall back.
enum ListError {
    /// The server does not serve this kind of list.
    Unsupported,
    Request(RequestError),
}

/// Page size of paged lists.
const LIST_PAGE: u32 = 500;

impl K8sTarget {
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
        let (mut attempt, mut throttled) = (0, 0);
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
                    tracing::info!(
                        identities = snap.identities.len(),
                        ?mode,
                        streamed = self.watch_list.load(Ordering::Relaxed) == WATCH_LIST_YES,
                        "listed ciliumidentities"
                    );
                    return Ok(snap);
                }
                // The server pushed back: a wait as it asks, not a failed try (it counts
                // them in its notes).
                Err(ListError::Request(e)) if e.is_throttled() => {
                    attempt -= 1;
                    throttled += 1;
                    wait_out_throttled(throttled, &e, "list").await;
                }
                Err(ListError::Request(e))
                    if self.worth_retrying(&e) && attempt < READ_ATTEMPTS =>
                {
                    let wait = Policy::READ.wait(attempt, e.retry_after(), "list");
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
            // Throttled or unreachable: the server said nothing about streaming lists.
            Err(e @ RequestError::Status { code: 429, .. }) => return Err(ListError::Request(e)),
            // Refused at the start: a server without the feature (1.19 to 1.31 as set up by
            // default; 1.36 over etcd 3.4), as expected as it is common. Said at info.
            Err(e @ RequestError::Status { .. }) => return Err(self.stop_streaming(&e, true)),
            Err(e) => return Err(ListError::Request(e)),
        };
        match self.read_stream(body, listed).await {
            Ok(snap) => {
                self.watch_list.store(WATCH_LIST_YES, Ordering::Relaxed);
                Ok(snap)
            }
            // Accepted, then cut short: not what a server that serves it does. A warning.
            Err(e) => Err(self.stop_streaming(&e, false)),
        }
    }

    /// A streaming list that failed before its initial-events bookmark (refused at the
    /// start, an ERROR event of any code, the stream ending early): lists are read in pages
    /// for the rest of the process, as client-go's reflector falls back, said once. On 1.36
    /// over etcd 3.4 the server refuses the stream with a 500 (`RequestWatchProgress` is
    /// missing) every time: trying it again would only fail again.
    fn stop_streaming(&self, e: &RequestError, refused: bool) -> ListError {
        if self.watch_list.swap(WATCH_LIST_NO, Ordering::Relaxed) != WATCH_LIST_NO {
            if refused {
                tracing::info!(
                    "{}: no streaming list (sendInitialEvents) here ({e}); reading lists in pages",
                    self.server
                );
            } else {
                tracing::warn!(
                    "{}: the streaming list (sendInitialEvents) failed before its last bookmark ({e}); reading lists in pages from now on",
                    self.server
                );
            }
        }
        ListError::Unsupported
    }

    /// The events of a streaming list, up to the bookmark that ends the initial events.
    async fn read_stream(
        &self,
        body: kube::client::Body,
        listed: &Option<Arc<AtomicUsize>>,
    ) -> Result<K8sSnapshot, RequestError> {
        let mut snap = K8sSnapshot::default();
        let mut events = EventLines::new(body, Some(STREAM_IDLE));
        while let Some(ev) = events.next().await? {
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
                _ => return Err(status_of(ev.object)),
            }
        }
        Err(RequestError::Transport(
            "the streaming list ended before its last bookmark".into(),
        ))
    }

    /// A list in pages (`query` without `continue`), each page parsed while it streams in;
    /// restarts from the first page if a continue token expires.
    async fn list_pages(
        &self,
        query: &str,
        listed: &Option<Arc<AtomicUsize>>,
    ) -> Result<K8sSnapshot, ListError> {
        let mut snap = K8sSnapshot::default();
        let (mut restarts, mut throttled) = (0, 0);
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
                // Pushed back on a page: the same page again after the wait the server
                // asks for, so a storm of 429s never starts a 100 MB list over.
                Err(e) if e.is_throttled() => {
                    throttled += 1;
                    wait_out_throttled(throttled, &e, "page").await;
                    continue;
                }
                Err(e) => return Err(ListError::Request(e)),
            };
            throttled = 0;
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
