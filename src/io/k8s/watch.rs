//! Following CiliumIdentity changes (sync's watch): bookmarks asked for, the watch rotated
//! by the server's `timeoutSeconds`, and an idle deadline past which a silent connection is
//! a stalled one.

use std::time::Duration;

use http::Method;

use super::errors::{RequestError, status_of};
use super::target::{K8sTarget, urlencode};
use super::transport::EventLines;
use crate::core::identity::collection_path;
use crate::core::labels::canonical_key;

/// One CiliumIdentity change, as `sync` follows them (defined beside the machine that takes
/// it in).
pub use crate::core::sync::machine::K8sChange;

/// How long the server keeps one watch of sync's open (`timeoutSeconds`).
pub const WATCH_ROTATE: Duration = Duration::from_secs(45);
/// A watch silent this long is stalled: the server should have ended it by now.
pub const WATCH_IDLE: Duration = Duration::from_secs(55);
/// Longest wait for a watch to be answered.
const WATCH_OPEN: Duration = Duration::from_secs(15);

impl K8sTarget {
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
        let mut resets = self.resets.subscribe();
        resets.borrow_and_update();
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
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                // Another request stalled and the pooled connections were replaced: this
                // one is likely dead too, so it moves now (from the last version seen).
                _ = resets.changed() => {
                    return Err(RequestError::Transport(
                        "connections replaced after a stalled request: watching again on a new one".into(),
                    ))
                }
            };
            let Some(ev) = next.map_err(stalled)? else {
                break;
            };
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
}
