//! An in-memory kvstore that behaves like etcd in what sync and Cilium's agents use:
//! one revision counter for every write, prefix ranges at the current revision, create-only
//! writes (a transaction on `create_revision == 0`), leases whose keys go when they are
//! revoked, watches from a revision (history replayed, then live), and compaction (a watch
//! from before it is told so, as etcd does). The demo's rollout runs on it, and sync follows
//! it unchanged.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::{broadcast, mpsc, watch};

use crate::core::kvstore::{
    DEFAULT_PREFIX, KeyKind, KvSnapshot, MasterEntry, NodeCounts, RESERVATION_NODE, SourceInfo,
    classify_key, normalize_prefix,
};
use crate::io::etcd::{KvWatchEvent, kv_change};

/// What the demo's kvstore calls itself where an etcd endpoint would be named.
pub const ENDPOINT: &str = "in-memory demo kvstore";

/// Keys with their values, in key order.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Events kept for watches that start from an older revision.
const HISTORY: usize = 50_000;

/// One key's write or delete at a revision.
#[derive(Debug, Clone)]
struct KeyEvent {
    rev: i64,
    key: Vec<u8>,
    /// `None` for a delete.
    value: Option<Vec<u8>>,
    /// For a delete, what the key held (as an etcd watch with `prev_kv` says).
    prev: Option<Vec<u8>>,
    created: bool,
}

#[derive(Debug, Clone)]
struct Entry {
    value: Vec<u8>,
    create_rev: i64,
    mod_rev: i64,
    lease: Option<i64>,
}

#[derive(Default)]
struct Inner {
    rev: i64,
    keys: BTreeMap<Vec<u8>, Entry>,
    history: VecDeque<KeyEvent>,
    /// Revisions at or below this are compacted: a watch from there is refused.
    compacted: i64,
    leases: HashMap<i64, BTreeSet<Vec<u8>>>,
    next_lease: i64,
}

/// The in-memory kvstore.
pub struct MemKv {
    inner: Mutex<Inner>,
    events: broadcast::Sender<KeyEvent>,
    /// How many watches run now.
    watchers: watch::Sender<usize>,
    /// What the decision log records as its endpoint: which demo world it is (its seed),
    /// so a later demo of the same world finds the decisions of this one.
    name: std::sync::OnceLock<String>,
}

impl std::fmt::Debug for MemKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemKv")
            .field("revision", &self.revision())
            .finish()
    }
}

impl Default for MemKv {
    fn default() -> Self {
        let (events, _) = broadcast::channel(8192);
        MemKv {
            inner: Mutex::new(Inner {
                rev: 1,
                next_lease: 0x7000,
                ..Default::default()
            }),
            events,
            watchers: watch::Sender::new(0),
            name: std::sync::OnceLock::new(),
        }
    }
}

impl MemKv {
    /// This kvstore, named for the decision log (see `name`).
    pub fn named(self, name: String) -> Self {
        let _ = self.name.set(name);
        self
    }

    /// Its endpoint as a decision log records it: `ENDPOINT`, and which world it holds.
    pub fn name(&self) -> &str {
        self.name.get().map_or(ENDPOINT, String::as_str)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn revision(&self) -> i64 {
        self.lock().rev
    }

    fn record(&self, inner: &mut Inner, ev: KeyEvent) {
        inner.history.push_back(ev.clone());
        if inner.history.len() > HISTORY
            && let Some(old) = inner.history.pop_front()
        {
            inner.compacted = inner.compacted.max(old.rev);
        }
        let _ = self.events.send(ev);
    }

    fn write(&self, inner: &mut Inner, key: &[u8], value: &[u8], lease: Option<i64>) -> i64 {
        inner.rev += 1;
        let rev = inner.rev;
        let created = !inner.keys.contains_key(key);
        let create_rev = inner.keys.get(key).map_or(rev, |e| e.create_rev);
        if let Some(old) = inner.keys.get(key).and_then(|e| e.lease)
            && let Some(keys) = inner.leases.get_mut(&old)
        {
            keys.remove(key);
        }
        if let Some(l) = lease {
            inner.leases.entry(l).or_default().insert(key.to_vec());
        }
        inner.keys.insert(
            key.to_vec(),
            Entry {
                value: value.to_vec(),
                create_rev,
                mod_rev: rev,
                lease,
            },
        );
        let ev = KeyEvent {
            rev,
            key: key.to_vec(),
            value: Some(value.to_vec()),
            prev: None,
            created,
        };
        self.record(inner, ev);
        rev
    }

    /// Writes `key` (on `lease`, if given); the new revision.
    pub fn put(&self, key: &[u8], value: &[u8], lease: Option<i64>) -> i64 {
        let mut inner = self.lock();
        self.write(&mut inner, key, value, lease)
    }

    /// Writes `key` only if it does not exist (Cilium's `CreateOnly`); `None` when it does.
    pub fn create(&self, key: &[u8], value: &[u8], lease: Option<i64>) -> Option<i64> {
        let mut inner = self.lock();
        if inner.keys.contains_key(key) {
            return None;
        }
        Some(self.write(&mut inner, key, value, lease))
    }

    /// One transaction: if `master` does not exist, writes it and `slave` (on `lease`) and
    /// returns the revision of the master's write; otherwise the master's value.
    pub fn create_pair(
        &self,
        master: &[u8],
        master_value: &[u8],
        slave: &[u8],
        slave_value: &[u8],
        lease: i64,
    ) -> Result<i64, Vec<u8>> {
        let mut inner = self.lock();
        if let Some(e) = inner.keys.get(master) {
            return Err(e.value.clone());
        }
        let rev = self.write(&mut inner, master, master_value, None);
        self.write(&mut inner, slave, slave_value, Some(lease));
        Ok(rev)
    }

    /// Deletes `key` only if it was last written at `revision`.
    pub fn delete_if_unchanged(&self, key: &[u8], revision: i64) -> bool {
        let mut inner = self.lock();
        if inner.keys.get(key).is_none_or(|e| e.mod_rev != revision) {
            return false;
        }
        self.remove(&mut inner, key)
    }

    fn remove(&self, inner: &mut Inner, key: &[u8]) -> bool {
        let Some(entry) = inner.keys.remove(key) else {
            return false;
        };
        if let Some(l) = entry.lease
            && let Some(keys) = inner.leases.get_mut(&l)
        {
            keys.remove(key);
        }
        inner.rev += 1;
        let ev = KeyEvent {
            rev: inner.rev,
            key: key.to_vec(),
            value: None,
            prev: Some(entry.value),
            created: false,
        };
        self.record(inner, ev);
        true
    }

    pub fn delete(&self, key: &[u8]) -> bool {
        let mut inner = self.lock();
        self.remove(&mut inner, key)
    }

    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().keys.get(key).map(|e| e.value.clone())
    }

    /// The revision `key` was last written at, if it exists.
    pub fn mod_revision(&self, key: &[u8]) -> Option<i64> {
        self.lock().keys.get(key).map(|e| e.mod_rev)
    }

    /// Every key under `prefix` with its value, at the current revision.
    pub fn range(&self, prefix: &[u8]) -> (Pairs, i64) {
        let inner = self.lock();
        let items = inner
            .keys
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.value.clone()))
            .collect();
        (items, inner.rev)
    }

    /// A new lease (its keys go when it is revoked: an agent leaving kvstore mode).
    pub fn grant_lease(&self) -> i64 {
        let mut inner = self.lock();
        inner.next_lease += 1;
        let id = inner.next_lease;
        inner.leases.insert(id, BTreeSet::new());
        id
    }

    /// Whether a lease is still granted (not revoked).
    pub fn lease_alive(&self, lease: i64) -> bool {
        self.lock().leases.contains_key(&lease)
    }

    /// Writes `key` on `lease` only if `compare` was last written at `revision`.
    pub fn put_if_unchanged(
        &self,
        compare: &[u8],
        revision: i64,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> bool {
        let mut inner = self.lock();
        if inner
            .keys
            .get(compare)
            .is_none_or(|e| e.mod_rev != revision)
        {
            return false;
        }
        self.write(&mut inner, key, value, Some(lease));
        true
    }

    /// Revokes a lease: each of its keys is deleted, one revision each.
    pub fn revoke_lease(&self, lease: i64) -> usize {
        let mut inner = self.lock();
        let keys = inner.leases.remove(&lease).unwrap_or_default();
        let n = keys.len();
        for k in keys {
            self.remove(&mut inner, &k);
        }
        n
    }

    /// Compacts history up to the current revision: a watch from before it is refused.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.compacted = inner.rev;
        inner.history.clear();
    }

    /// Resolves once something watches this kvstore (the demo's rollout waits for sync).
    pub async fn watched(&self) {
        let _ = self.watchers.subscribe().wait_for(|n| *n > 0).await;
    }

    /// The identities under `prefix` and the nodes using each, at the current revision.
    pub fn snapshot(&self, prefix: &str) -> KvSnapshot {
        let prefix = normalize_prefix(prefix);
        let inner = self.lock();
        let mut masters = Vec::new();
        let mut counts = NodeCounts::default();
        for (k, e) in inner
            .keys
            .range(prefix.as_bytes().to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix.as_bytes()))
        {
            match classify_key(&prefix, k) {
                KeyKind::Master { id } => masters.push(MasterEntry::new(id, e.value.clone())),
                KeyKind::Slave { label_key, node } => counts.add_key(label_key, node, &e.value),
                _ => {}
            }
        }
        KvSnapshot {
            source: SourceInfo {
                endpoints: vec![ENDPOINT.into()],
                revision: inner.rev,
                prefix: prefix.trim_end_matches('/').to_string(),
            },
            masters,
            node_counts: counts,
        }
    }

    /// The nodes whose `value/` keys use `label_key`, now.
    pub fn nodes_using(&self, prefix: &str, label_key: &[u8], id: &[u8]) -> Vec<String> {
        let mut key = format!("{}value/", normalize_prefix(prefix)).into_bytes();
        key.extend_from_slice(label_key);
        key.push(b'/');
        self.range(&key)
            .0
            .into_iter()
            .filter(|(_, v)| v.as_slice() == id)
            .map(|(k, _)| String::from_utf8_lossy(&k[key.len()..]).into_owned())
            .filter(|node| node != RESERVATION_NODE)
            .collect()
    }

    /// Follows every key under `prefix` from `revision + 1`, as the etcd watch does, until the
    /// receiver goes away: `Connected`, then the history after `revision`, then what happens.
    pub async fn watch_identities(
        &self,
        prefix: &str,
        revision: i64,
        tx: mpsc::Sender<KvWatchEvent>,
    ) {
        let prefix = normalize_prefix(prefix);
        self.watchers.send_modify(|n| *n += 1);
        let _count = WatcherCount(&self.watchers);
        // Subscribed under the lock, so nothing falls between the history and the live events.
        let (mut live, backlog, compacted) = {
            let inner = self.lock();
            let backlog: Vec<KeyEvent> = inner
                .history
                .iter()
                .filter(|e| e.rev > revision)
                .cloned()
                .collect();
            (self.events.subscribe(), backlog, inner.compacted)
        };
        if tx.send(KvWatchEvent::Connected).await.is_err() {
            return;
        }
        if revision < compacted {
            let _ = tx
                .send(KvWatchEvent::Compacted {
                    compact_revision: compacted,
                })
                .await;
            return;
        }
        let mut last = revision;
        for ev in backlog {
            last = ev.rev;
            if !forward(&prefix, ev, &tx).await {
                return;
            }
        }
        // Progress reports as etcd's answers to sync's progress requests: a quiet watch
        // still tells the follower it is alive.
        let mut progress = tokio::time::interval(crate::io::etcd::WATCH_PROGRESS_EVERY);
        progress.tick().await;
        loop {
            let next = tokio::select! {
                ev = live.recv() => ev,
                _ = progress.tick() => {
                    if tx.send(KvWatchEvent::Progress { revision: last }).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            match next {
                Ok(ev) if ev.rev > last => {
                    last = ev.rev;
                    if !forward(&prefix, ev, &tx).await {
                        return;
                    }
                }
                Ok(_) => {}
                // Too slow a reader: etcd would cancel the watch; the follower starts again.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let _ = tx
                        .send(KvWatchEvent::Compacted {
                            compact_revision: last,
                        })
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// Counts a watch while it runs.
struct WatcherCount<'a>(&'a watch::Sender<usize>);

impl Drop for WatcherCount<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Sends one event as the etcd watch would; false once the receiver is gone.
async fn forward(prefix: &str, ev: KeyEvent, tx: &mpsc::Sender<KvWatchEvent>) -> bool {
    let values = (ev.value.as_deref(), ev.prev.as_deref());
    let Some(change) = kv_change(prefix, &ev.key, values, ev.created) else {
        return true;
    };
    tx.send(KvWatchEvent::Changes {
        changes: vec![change],
        revision: ev.rev,
    })
    .await
    .is_ok()
}

/// A kvstore holding `keys` (as a dump or a generator gives them): each `value/` key on the
/// lease of its node, as its agent would hold it. Returns the leases by node name.
pub fn seeded(keys: Pairs) -> (MemKv, BTreeMap<String, i64>) {
    let kv = MemKv::default();
    let prefix = normalize_prefix(DEFAULT_PREFIX);
    let mut leases: BTreeMap<String, i64> = BTreeMap::new();
    for (key, value) in keys {
        let lease = match classify_key(&prefix, &key) {
            KeyKind::Slave { node, .. } => {
                let node = String::from_utf8_lossy(node).into_owned();
                Some(*leases.entry(node).or_insert_with(|| kv.grant_lease()))
            }
            _ => None,
        };
        kv.put(&key, &value, lease);
    }
    (kv, leases)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "cilium/state/identities/v1/";

    #[tokio::test]
    async fn a_watch_replays_from_its_revision_then_follows() {
        let kv = std::sync::Arc::new(MemKv::default());
        kv.put(format!("{P}id/300").as_bytes(), b"k8s:app=a;", None);
        let from = kv.revision();
        let lease = kv.grant_lease();
        kv.put(format!("{P}id/301").as_bytes(), b"k8s:app=b;", None);
        assert!(
            kv.create(format!("{P}id/301").as_bytes(), b"k8s:app=x;", None)
                .is_none()
        );
        kv.put(
            format!("{P}value/k8s:app=b;/node-1").as_bytes(),
            b"301",
            Some(lease),
        );
        let (tx, mut rx) = mpsc::channel(16);
        let w = tokio::spawn({
            let kv = kv.clone();
            async move { kv.watch_identities(P, from, tx).await }
        });
        assert_eq!(rx.recv().await, Some(KvWatchEvent::Connected));
        let Some(KvWatchEvent::Changes { changes, .. }) = rx.recv().await else {
            panic!()
        };
        assert!(
            matches!(&changes[0], crate::io::etcd::KvChange::Master { id, created: true, .. } if id == b"301")
        );
        assert!(matches!(
            rx.recv().await,
            Some(KvWatchEvent::Changes { .. })
        ));
        // A node uses the id its key names, not every id of the labels.
        assert_eq!(kv.nodes_using(P, b"k8s:app=b;", b"301"), ["node-1"]);
        assert!(kv.nodes_using(P, b"k8s:app=b;", b"300").is_empty());
        // A revoked lease deletes its keys, and the watch sees it, with the id it held.
        assert_eq!(kv.revoke_lease(lease), 1);
        let Some(KvWatchEvent::Changes { changes, .. }) = rx.recv().await else {
            panic!()
        };
        assert!(matches!(
            &changes[0],
            crate::io::etcd::KvChange::Slave { present: false, id: Some(id), .. } if id == b"301"
        ));
        assert!(kv.nodes_using(P, b"k8s:app=b;", b"301").is_empty());
        let snap = kv.snapshot(P);
        assert_eq!(snap.masters.len(), 2);
        assert_eq!(snap.source.revision, kv.revision());
        w.abort();
        // From before a compaction: refused, as etcd refuses it.
        kv.compact();
        let (tx, mut rx) = mpsc::channel(16);
        kv.watch_identities(P, from, tx).await;
        assert_eq!(rx.recv().await, Some(KvWatchEvent::Connected));
        assert!(matches!(
            rx.recv().await,
            Some(KvWatchEvent::Compacted { .. })
        ));
    }
}
