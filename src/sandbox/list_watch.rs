//! List and watch of `ciliumidentities` in the sandbox: `limit`/`continue` with opaque
//! tokens and `remainingItemCount`, `labelSelector`, watches replayed from a resourceVersion
//! (410 Expired when it is older than the kept history), and the two costs of a list as the
//! kube-apiserver has them (`ReadModel`): paged quorum reads, and `resourceVersion=0` from
//! the watch cache in one streamed response; streaming lists (`sendInitialEvents=true`) when
//! the model enables them.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};

use super::http::{Body, json_response, status};
use super::selector::Selector;
use super::state::Shared;
use super::store::{Store, WatchEvent};
use crate::core::identity::{GROUP, KIND, VERSION};

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn selector(params: &[(String, String)]) -> Result<Selector, Box<Response<Body>>> {
    Selector::parse(param(params, "labelSelector").unwrap_or("")).map_err(|e| {
        Box::new(status(
            400,
            "BadRequest",
            &format!("unable to parse requirement: {e}"),
            None,
        ))
    })
}

fn obj_labels(o: &Value) -> std::collections::BTreeMap<String, String> {
    o.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Continue tokens are opaque to clients: hex of `<rv>/<last name>`.
fn encode_continue(rv: u64, last: &str) -> String {
    format!("{rv}/{last}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&token[i..i + 2], 16).ok())
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let (rv, last) = s.split_once('/')?;
    Some((rv.parse().ok()?, last.to_string()))
}

/// How 1.19, which knows no streaming list, refuses one: it reads the request as a watch
/// with `resourceVersionMatch` and no `resourceVersion`, twice forbidden.
fn refused_as_1_19() -> Response<Body> {
    let forbidden = [
        "Forbidden: resourceVersionMatch is forbidden for watch",
        "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
    ];
    let causes: Vec<Value> = forbidden
        .iter()
        .map(|m| json!({"reason": "FieldValueForbidden", "message": m, "field": "resourceVersionMatch"}))
        .collect();
    status(
        422,
        "Invalid",
        &format!(
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: {}, resourceVersionMatch: {}]",
            forbidden[0], forbidden[1]
        ),
        Some(json!({"kind": "ListOptions", "causes": causes})),
    )
}

/// Objects per streamed chunk of a cache list or of a streaming list's initial events.
const CHUNK: usize = 500;

pub(super) async fn list(
    shared: &Shared,
    params: &[(String, String)],
    as_table: bool,
) -> Response<Body> {
    let sel = match selector(params) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if param(params, "resourceVersion") == Some("0") && !as_table {
        shared.count("LIST from cache");
        return cache_list(shared, &sel);
    }
    shared.count("LIST quorum");
    let (res, sent) = quorum_list(shared, &sel, params, as_table);
    let cost = shared.config.reads.quorum_per_object * sent as u32;
    if !cost.is_zero() {
        tokio::time::sleep(cost).await;
    }
    res
}

/// One page of a consistent (quorum) list; also the number of objects in it.
fn quorum_list(
    shared: &Shared,
    sel: &Selector,
    params: &[(String, String)],
    as_table: bool,
) -> (Response<Body>, usize) {
    let limit = param(params, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let store = shared.store();
    let (rv, after) = match param(params, "continue").filter(|c| !c.is_empty()) {
        Some(c) => match decode_continue(c) {
            Some((rv, last)) if rv >= store.history_floor => (rv, Some(last)),
            Some(_) => {
                let res = status(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    None,
                );
                return (res, 0);
            }
            None => return (status(400, "BadRequest", "invalid continue token", None), 0),
        },
        None => (store.rv, None),
    };
    let range = match &after {
        Some(last) => store.objects.range::<String, _>((
            std::ops::Bound::Excluded(last.clone()),
            std::ops::Bound::Unbounded,
        )),
        None => store.objects.range::<String, _>(..),
    };
    let mut items = Vec::new();
    let mut remaining = 0usize;
    let mut last_name = None;
    let everything = *sel == Selector::default();
    for (name, o) in range {
        // Without a selector no object's labels need reading: counting what remains is cheap.
        if !everything && !sel.matches(&obj_labels(o)) {
            continue;
        }
        if limit.is_some_and(|l| items.len() >= l) {
            remaining += 1;
            continue;
        }
        items.push(o.clone());
        last_name = Some(name.clone());
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if remaining > 0
        && let Some(last) = last_name
    {
        meta["continue"] = json!(encode_continue(rv, &last));
        meta["remainingItemCount"] = json!(remaining);
    }
    let sent = items.len();
    let body = if as_table {
        // kubectl's `get`: the same page, printed by the server.
        let objects: Vec<&Value> = items.iter().collect();
        let mut t = super::discovery::table(&objects, &rv.to_string(), jiff::Timestamp::now());
        t["metadata"] = meta;
        t
    } else {
        json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": format!("{KIND}List"), "metadata": meta, "items": items})
    };
    (json_response(StatusCode::OK, &body), sent)
}

/// `resourceVersion=0`: everything from the watch cache in one response (no `limit`, no
/// `continue`), streamed out in chunks at the cache's pace.
fn cache_list(shared: &Shared, sel: &Selector) -> Response<Body> {
    let store = shared.store();
    let rv = store.rv;
    let objects: Vec<Value> = store
        .objects
        .values()
        .filter(|o| *sel == Selector::default() || sel.matches(&obj_labels(o)))
        .cloned()
        .collect();
    drop(store);
    let per_object = shared.config.reads.cache_per_object;
    let head = format!(
        r#"{{"apiVersion":"{GROUP}/{VERSION}","kind":"{KIND}List","metadata":{{"resourceVersion":"{rv}"}},"items":["#
    );
    let (tx, out) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    tokio::spawn(async move {
        if tx.send(Ok(Frame::data(Bytes::from(head)))).await.is_err() {
            return;
        }
        for (n, chunk) in objects.chunks(CHUNK).enumerate() {
            tokio::time::sleep(per_object * chunk.len() as u32).await;
            let mut text = String::new();
            for (i, o) in chunk.iter().enumerate() {
                if n > 0 || i > 0 {
                    text.push(',');
                }
                text.push_str(&o.to_string());
            }
            if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"]}")))).await;
    });
    streamed(out)
}

/// A response whose body is what the channel carries.
fn streamed(out: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>) -> Response<Body> {
    let stream = futures::stream::unfold(out, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut res = Response::new(StreamBody::new(stream).boxed());
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

/// How often a watch that allows bookmarks gets one, and how long before its timeout the
/// last one comes (a real server's `bookmarkFrequency` and its two seconds).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
const BOOKMARK_BEFORE_END: Duration = Duration::from_secs(2);

/// A watch as asked for in its query.
struct WatchRequest {
    sel: Selector,
    timeout: Option<Duration>,
    /// Resume after this version; `None`: from the current state.
    from: Option<u64>,
    /// A streaming list: the current state, then a bookmark that says it is complete.
    initial_events: bool,
    bookmarks: bool,
}

impl WatchRequest {
    /// Reads the query; a 422 for what a real server refuses.
    fn parse(shared: &Shared, params: &[(String, String)]) -> Result<Self, Box<Response<Body>>> {
        let sel = selector(params)?;
        let initial_events = param(params, "sendInitialEvents") == Some("true");
        if initial_events {
            if !shared.config.reads.watch_list {
                // Refused as the release refuses it: 1.19 knows no streaming list at all.
                return Err(Box::new(match shared.config.release {
                    super::state::Release::V1_19 => refused_as_1_19(),
                    super::state::Release::V1_36 => status(
                        422,
                        "Invalid",
                        "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                        None,
                    ),
                }));
            }
            if param(params, "resourceVersionMatch") != Some("NotOlderThan") {
                return Err(Box::new(status(
                    422,
                    "Invalid",
                    "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    None,
                )));
            }
            shared.count("WATCH with initial events");
        }
        Ok(WatchRequest {
            sel,
            timeout: param(params, "timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs),
            from: param(params, "resourceVersion")
                .and_then(|r| r.parse().ok())
                .filter(|r| *r > 0),
            initial_events,
            bookmarks: param(params, "allowWatchBookmarks") == Some("true"),
        })
    }
}

pub(super) fn watch(shared: &Shared, params: &[(String, String)]) -> Response<Body> {
    let req = match WatchRequest::parse(shared, params) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let store = shared.store();
    let initial = first_events(&store, &req);
    let expired = req.from.is_some_and(|rv| rv < store.history_floor);
    let rx = store.events.subscribe();
    let start_rv = store.rv;
    drop(store);
    let (tx, out) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(256);
    let pace = if req.initial_events {
        shared.config.reads.cache_per_object
    } else {
        Duration::ZERO
    };
    tokio::spawn(async move {
        for chunk in initial.chunks(CHUNK) {
            if !pace.is_zero() {
                tokio::time::sleep(pace * chunk.len() as u32).await;
            }
            let mut text = String::new();
            for line in chunk {
                text.push_str(line);
                text.push('\n');
            }
            if tx.send(Ok(Frame::data(Bytes::from(text)))).await.is_err() {
                return;
            }
        }
        if !expired {
            follow(req, rx, start_rv, tx).await;
        }
    });
    streamed(out)
}

/// What a watch sends first: the current state (with its closing bookmark for a streaming
/// list), the events after the version it resumes from, or a 410 when that is too old.
fn first_events(store: &Store, req: &WatchRequest) -> Vec<String> {
    let current = || {
        store
            .objects
            .values()
            .filter(|o| req.sel.matches(&obj_labels(o)))
            .map(|o| json!({"type": "ADDED", "object": o}).to_string())
            .collect::<Vec<String>>()
    };
    match req.from {
        _ if req.initial_events => {
            let mut initial = current();
            initial.push(
                json!({"type": "BOOKMARK", "object": {"kind": KIND, "apiVersion": format!("{GROUP}/{VERSION}"),
                    "metadata": {"resourceVersion": store.rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}})
                .to_string(),
            );
            initial
        }
        Some(rv) if rv < store.history_floor => {
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {rv} ({})", store.history_floor), "reason": "Expired", "code": 410}});
            vec![gone.to_string()]
        }
        Some(rv) => store
            .history
            .iter()
            .filter(|e| e.rv > rv && event_matches(&e.line, &req.sel))
            .map(|e| e.line.clone())
            .collect(),
        None => current(),
    }
}

/// Sends what happens after `start_rv` until the watch's timeout, as a real server does for
/// a client that allows them: a bookmark every minute and one shortly before the timeout,
/// at the newest version this watch has passed, so a quiet watch still hears from its server.
async fn follow(
    req: WatchRequest,
    mut rx: tokio::sync::broadcast::Receiver<WatchEvent>,
    start_rv: u64,
    tx: tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) {
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut passed = start_rv;
    let next_bookmark = |now: tokio::time::Instant| {
        let minute = now + BOOKMARK_EVERY;
        match deadline {
            Some(d) if d > now + BOOKMARK_BEFORE_END => Some(minute.min(d - BOOKMARK_BEFORE_END)),
            Some(_) => None,
            None => Some(minute),
        }
    };
    let mut bookmark_at = req
        .bookmarks
        .then(|| next_bookmark(tokio::time::Instant::now()))
        .flatten();
    loop {
        let wake = match (deadline, bookmark_at) {
            (Some(d), Some(b)) => Some(d.min(b)),
            (d, b) => d.or(b),
        };
        let next = match wake {
            Some(w) => tokio::time::timeout_at(w, rx.recv()).await.ok(),
            None => Some(rx.recv().await),
        };
        let now = tokio::time::Instant::now();
        if next.is_none() && deadline.is_some_and(|d| now >= d) {
            return;
        }
        let line = match next {
            None => {
                bookmark_at = next_bookmark(now);
                json!({"type": "BOOKMARK", "object": {"kind": KIND,
                    "apiVersion": format!("{GROUP}/{VERSION}"),
                    "metadata": {"resourceVersion": passed.to_string()}}})
                .to_string()
            }
            Some(Ok(ev)) if ev.rv > start_rv => {
                passed = passed.max(ev.rv);
                if !event_matches(&ev.line, &req.sel) {
                    continue;
                }
                ev.line
            }
            Some(Ok(_)) | Some(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                continue;
            }
            Some(Err(_)) => return,
        };
        if tx
            .send(Ok(Frame::data(Bytes::from(line + "\n"))))
            .await
            .is_err()
        {
            return;
        }
    }
}

fn event_matches(line: &str, sel: &Selector) -> bool {
    serde_json::from_str::<Value>(line).is_ok_and(|v| sel.matches(&obj_labels(&v["object"])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(1234, "65535");
        assert_eq!(decode_continue(&t), Some((1234, "65535".to_string())));
        assert_eq!(decode_continue("zz"), None);
    }
}
