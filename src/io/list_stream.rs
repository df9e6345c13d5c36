//! Reading CiliumIdentity lists as they stream in. A list body's `items` (or a watch's
//! events) are parsed one object at a time while the bytes arrive, so neither a whole body
//! (100 MB at 65,280 objects) nor every object's JSON tree is ever held.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::core::labels::SecurityLabels;

/// The parts of a `CiliumIdentity` the tool reads.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct ListedObject {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `null` values read as `""`, which is what an agent unmarshalling into a Go string sees.
    #[serde(rename = "security-labels", default)]
    pub security_labels: Option<BTreeMap<String, Option<String>>>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resource_version: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl ListedObject {
    /// The canonical label key of its `security-labels` (as `canonical_key` of `labels`),
    /// read in place: a list of 65,280 objects copies no label twice.
    pub fn label_key(self) -> crate::core::labels::LabelKey {
        let in_place = self
            .security_labels
            .as_ref()
            .map_or(Some(String::new()), |m| {
                crate::core::labels::label_key_from_pairs(
                    m.iter()
                        .map(|(k, v)| (k.as_str(), v.as_deref().unwrap_or_default())),
                )
            });
        in_place.unwrap_or_else(|| crate::core::labels::canonical_key(&self.labels()))
    }

    pub fn labels(self) -> SecurityLabels {
        self.security_labels
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.unwrap_or_default()))
            .collect()
    }
}

/// A list's own metadata.
#[derive(Debug, Clone, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(default)]
    pub resource_version: String,
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
}

/// Parses a list body from `reader`, handing each item to `item` as soon as it is read.
pub fn parse_list(
    reader: impl Read,
    mut item: impl FnMut(ListedObject),
) -> Result<ListMeta, String> {
    let mut de = serde_json::Deserializer::from_reader(reader);
    let meta = ListSeed { item: &mut item }
        .deserialize(&mut de)
        .map_err(|e| format!("not a list: {e}"))?;
    de.end().map_err(|e| format!("after the list: {e}"))?;
    Ok(meta)
}

struct ListSeed<'a, F> {
    item: &'a mut F,
}

impl<'de, F: FnMut(ListedObject)> DeserializeSeed<'de> for ListSeed<'_, F> {
    type Value = ListMeta;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ListMeta, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, F: FnMut(ListedObject)> Visitor<'de> for ListSeed<'_, F> {
    type Value = ListMeta;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes list object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListMeta, A::Error> {
        let mut meta = ListMeta::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "items" => map.next_value_seed(ItemsSeed {
                    item: &mut *self.item,
                })?,
                "metadata" => meta = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

struct ItemsSeed<'a, F> {
    item: &'a mut F,
}

impl<'de, F: FnMut(ListedObject)> DeserializeSeed<'de> for ItemsSeed<'_, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // `any`, so that `null` (an empty list, from some servers) reaches `visit_unit`.
        d.deserialize_any(self)
    }
}

impl<'de, F: FnMut(ListedObject)> Visitor<'de> for ItemsSeed<'_, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of objects")
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(()) // `"items": null`, as an empty list may come.
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(obj) = seq.next_element::<ListedObject>()? {
            (self.item)(obj);
        }
        Ok(())
    }
}

/// One watch event, as a streaming list sends them (one JSON object per line).
#[derive(Debug, Clone, Deserialize)]
pub struct WatchEvent {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub object: EventObject,
}

/// A watch event's object: an identity, a bookmark, or (for ERROR) a Status.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(from = "EventFields")]
pub struct EventObject {
    pub identity: ListedObject,
    pub code: Option<u16>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// An event object's fields as they come, side by side. Not `#[serde(flatten)]`: a flattened
/// struct is read through a buffered tree of every field (an object's `managedFields` too),
/// which made half of a streamed 65,280-object list's parse; here the fields the tool does
/// not read are skipped as they stream past.
#[derive(Deserialize)]
struct EventFields {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(rename = "security-labels", default)]
    security_labels: Option<BTreeMap<String, Option<String>>>,
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl From<EventFields> for EventObject {
    fn from(f: EventFields) -> Self {
        EventObject {
            identity: ListedObject {
                metadata: f.metadata,
                security_labels: f.security_labels,
            },
            code: f.code,
            reason: f.reason,
            message: f.message,
        }
    }
}

/// A synchronous reader over body chunks sent from the async side, so serde can parse a
/// list while it downloads (on a blocking thread) with back-pressure on the download.
pub struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl ChunkReader {
    pub fn new(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        ChunkReader {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.current = b,
                // The sender is gone: the body ended (or the download failed, which the
                // async side reports).
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_arrive_one_by_one_and_metadata_is_kept() {
        let body = r#"{"apiVersion":"cilium.io/v2","kind":"CiliumIdentityList",
            "items":[{"metadata":{"name":"300","resourceVersion":"7","uid":"u"},"security-labels":{"k8s:app":"web","reserved:host":null}},
                     {"metadata":{"name":"nope"},"extra":{"deep":[1,2,3]}}],
            "metadata":{"resourceVersion":"42","continue":"abc"}}"#;
        let mut seen = Vec::new();
        let meta = parse_list(body.as_bytes(), |o| seen.push(o)).unwrap();
        assert_eq!(meta.resource_version, "42");
        assert_eq!(meta.continue_token.as_deref(), Some("abc"));
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].metadata.name, "300");
        let labels = seen[0].clone().labels();
        assert_eq!(labels["reserved:host"], "");
        assert!(seen[1].security_labels.is_none());
        assert!(parse_list(&b"{\"items\":[{\"metadata\":"[..], |_| {}).is_err());
        assert!(parse_list(&b"[]"[..], |_| {}).is_err());
        assert!(parse_list(&br#"{"items":null,"metadata":{}}"#[..], |_| {}).is_ok());
    }

    #[test]
    fn a_label_key_read_in_place_is_the_canonical_key_of_its_labels() {
        for labels in [
            r#"{"k8s:app":"web","reserved:host":null,"k8s:io.kubernetes.pod.namespace":"shop"}"#,
            r#"{"k8s:app":"a","container:app":"b","any:zz":"c"}"#,
            r#"{"nosource":"x","k8s:a":"b"}"#,
            r#"{}"#,
            r#"null"#,
        ] {
            let obj: ListedObject = serde_json::from_str(&format!(
                r#"{{"metadata":{{"name":"300"}},"security-labels":{labels}}}"#
            ))
            .unwrap();
            let canonical = crate::core::labels::canonical_key(&obj.clone().labels());
            assert_eq!(obj.label_key(), canonical, "{labels}");
        }
    }

    #[test]
    fn a_reader_over_chunks_feeds_the_parser() {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let text = r#"{"items":[{"metadata":{"name":"1"}},{"metadata":{"name":"2"}}],"metadata":{"resourceVersion":"9"}}"#;
        let handle = std::thread::spawn(move || {
            let mut n = 0;
            let meta = parse_list(ChunkReader::new(rx), |_| n += 1).unwrap();
            (n, meta.resource_version)
        });
        for chunk in text.as_bytes().chunks(7) {
            tx.blocking_send(Bytes::copy_from_slice(chunk)).unwrap();
        }
        drop(tx);
        assert_eq!(handle.join().unwrap(), (2, "9".to_string()));
    }

    #[test]
    fn watch_events_carry_identities_bookmarks_and_errors() {
        let added: WatchEvent = serde_json::from_str(
            r#"{"type":"ADDED","object":{"metadata":{"name":"300","resourceVersion":"5"},"security-labels":{"k8s:a":"b"}}}"#,
        )
        .unwrap();
        assert_eq!(added.object.identity.metadata.name, "300");
        let bookmark: WatchEvent = serde_json::from_str(
            r#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
        )
        .unwrap();
        assert_eq!(
            bookmark.object.identity.metadata.annotations["k8s.io/initial-events-end"],
            "true"
        );
        let err: WatchEvent = serde_json::from_str(
            r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}"#,
        )
        .unwrap();
        assert_eq!(err.object.code, Some(410));
    }
}
