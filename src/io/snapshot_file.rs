//! Reading a cluster's own identities from dumps an operator makes with read-only commands,
//! to rehearse on exactly that data: the kvstore side from
//! `etcdctl get --prefix cilium/state/identities/v1 -w json` (keys and values in base64, as
//! etcdctl prints them), the Kubernetes side from `kubectl get ciliumidentities -o json`.
//! A dump that is partial, of another prefix, or not what those commands print is refused
//! with what is wrong and how to make a good one.

use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;

use crate::core::identity::{KIND, parse_identity};
use crate::core::kvstore::{KeyKind, classify_key, normalize_prefix, parse_id};
use crate::core::labels::SecurityLabels;
use crate::error::{Error, Result};

/// How to make the kvstore dump, quoted in every refusal.
pub const ETCD_DUMP_COMMAND: &str =
    "etcdctl get --prefix cilium/state/identities/v1 -w json > kvstore.json";
/// How to make the Kubernetes dump.
pub const K8S_DUMP_COMMAND: &str = "kubectl get ciliumidentities -o json > identities.json";

#[derive(Deserialize)]
struct EtcdDump {
    header: Option<EtcdHeader>,
    #[serde(default)]
    kvs: Vec<EtcdKv>,
    #[serde(default)]
    count: Option<i64>,
    /// Set by etcdctl when `--limit` cut the answer short.
    #[serde(default)]
    more: bool,
}

#[derive(Deserialize)]
struct EtcdHeader {
    #[serde(default)]
    revision: i64,
}

#[derive(Deserialize)]
struct EtcdKv {
    key: String,
    #[serde(default)]
    value: String,
}

/// The keys of a kvstore dump, with their values, as they were in etcd.
pub type DumpedKeys = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads a kvstore dump: every key must lie under `prefix` (a dump of another prefix is not
/// this cluster's identities), and the dump must be whole.
pub fn read_etcd_dump(path: &Path, prefix: &str) -> Result<DumpedKeys> {
    let text = std::fs::read(path).map_err(|e| Error::file_cause(path, e))?;
    parse_etcd_dump(&text, prefix).map_err(|why| {
        Error::file(
            path,
            format!("not a usable kvstore dump: {why}; make one with `{ETCD_DUMP_COMMAND}`"),
        )
    })
}

fn parse_etcd_dump(text: &[u8], prefix: &str) -> std::result::Result<DumpedKeys, String> {
    let dump: EtcdDump = serde_json::from_slice(text)
        .map_err(|e| format!("not the JSON etcdctl prints with -w json ({e})"))?;
    let Some(header) = dump.header else {
        return Err("no header: not the output of etcdctl get -w json".into());
    };
    if dump.more {
        return Err("partial: etcdctl says there is more (drop --limit)".into());
    }
    if let Some(count) = dump.count
        && count != dump.kvs.len() as i64
    {
        return Err(format!(
            "partial: etcdctl counted {count} keys but the file holds {}",
            dump.kvs.len()
        ));
    }
    let prefix = normalize_prefix(prefix);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut keys = Vec::with_capacity(dump.kvs.len());
    let mut identities = 0;
    for (n, kv) in dump.kvs.iter().enumerate() {
        let key = b64
            .decode(&kv.key)
            .map_err(|e| format!("key {} is not base64 ({e}); use -w json", n + 1))?;
        let value = b64
            .decode(&kv.value)
            .map_err(|e| format!("the value of key {} is not base64 ({e})", n + 1))?;
        match classify_key(&prefix, &key) {
            KeyKind::Master { .. } => identities += 1,
            KeyKind::Other if !key.starts_with(prefix.as_bytes()) => {
                return Err(format!(
                    "key {:?} is not under {prefix}: this is a dump of another prefix",
                    String::from_utf8_lossy(&key)
                ));
            }
            _ => {}
        }
        keys.push((key, value));
    }
    if identities == 0 {
        return Err(format!("no identity (no {prefix}id/ key) in it"));
    }
    // No value/ key is no reason to refuse: a kvstore no node uses any more (every agent
    // left kvstore mode) has none. A dump of id/ alone reads the same; the demo says so.
    // etcd's revision is not carried over: the rehearsal's kvstore counts its own.
    let _ = header.revision;
    Ok(keys)
}

/// Reads a Kubernetes dump: the identities it holds, by id, with their labels.
pub fn read_k8s_dump(path: &Path) -> Result<Vec<(u32, SecurityLabels)>> {
    let text = std::fs::read(path).map_err(|e| Error::file_cause(path, e))?;
    parse_k8s_dump(&text).map_err(|why| {
        Error::file(
            path,
            format!("not a usable CiliumIdentity dump: {why}; make one with `{K8S_DUMP_COMMAND}`"),
        )
    })
}

fn parse_k8s_dump(text: &[u8]) -> std::result::Result<Vec<(u32, SecurityLabels)>, String> {
    let list: Value = serde_json::from_slice(text)
        .map_err(|e| format!("not the JSON kubectl prints with -o json ({e})"))?;
    let kind = list["kind"].as_str().unwrap_or("");
    if kind != "List" && kind != format!("{KIND}List") {
        return Err(format!("kind {kind:?} is not a list"));
    }
    let items = list["items"].as_array().ok_or("the list has no items")?;
    let mut out = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        if item["kind"].as_str().is_some_and(|k| k != KIND) {
            return Err(format!(
                "item {} is a {}, not a {KIND}",
                n + 1,
                item["kind"]
            ));
        }
        let obj = parse_identity(item).map_err(|e| format!("item {}: {e}", n + 1))?;
        let id = parse_id(obj.name.as_bytes())
            .map_err(|e| format!("item {} ({}): {e}", n + 1, obj.name))?;
        out.push((id, obj.labels));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn dump(keys: &[(&str, &str)], count: Option<usize>) -> String {
        let kvs: Vec<Value> = keys
            .iter()
            .map(|(k, v)| serde_json::json!({"key": b64(k), "create_revision": 5, "mod_revision": 5, "version": 1, "value": b64(v)}))
            .collect();
        serde_json::json!({"header": {"cluster_id": 1, "member_id": 2, "revision": 77, "raft_term": 2},
            "kvs": kvs, "count": count.unwrap_or(keys.len())})
        .to_string()
    }

    const P: &str = "cilium/state/identities/v1";

    #[test]
    fn a_dump_becomes_the_kvstore_it_was_taken_from() {
        let text = dump(
            &[
                ("cilium/state/identities/v1/id/300", "k8s:app=a;"),
                ("cilium/state/identities/v1/value/k8s:app=a;/node-1", "300"),
                ("cilium/state/identities/v1/value/k8s:app=a;/node-2", "300"),
                ("cilium/state/identities/v1/locks/x", ""),
            ],
            None,
        );
        let keys = parse_etcd_dump(text.as_bytes(), P).unwrap();
        assert_eq!(keys.len(), 4);
        let (kv, leases) = crate::io::mem_kv::seeded(keys);
        assert_eq!(leases.len(), 2, "one lease per node");
        let snap = kv.snapshot(P);
        assert_eq!(
            snap.masters,
            vec![crate::core::kvstore::MasterEntry::new("300", "k8s:app=a;")]
        );
        assert_eq!(snap.node_counts.get(b"k8s:app=a;"), 2);
        assert_eq!(snap.node_counts.nodes().count(), 2);
    }

    #[test]
    fn bad_and_partial_dumps_say_what_is_wrong() {
        let other = dump(&[("cilium/state/nodes/v1/node-1", "{}")], None);
        let e = parse_etcd_dump(other.as_bytes(), P).unwrap_err();
        assert!(e.contains("another prefix"), "{e}");
        let short = dump(
            &[("cilium/state/identities/v1/id/300", "k8s:app=a;")],
            Some(5),
        );
        let e = parse_etcd_dump(short.as_bytes(), P).unwrap_err();
        assert!(e.contains("partial"), "{e}");
        let e = parse_etcd_dump(b"{\"kvs\": []}", P).unwrap_err();
        assert!(e.contains("no header"), "{e}");
        let e = parse_etcd_dump(b"cilium/state/identities/v1/id/300\nk8s:app=a;\n", P).unwrap_err();
        assert!(e.contains("-w json"), "{e}");
        let plain = r#"{"header":{"revision":3},"kvs":[{"key":"cilium/state/identities/v1/id/300","value":"x"}],"count":1}"#;
        let e = parse_etcd_dump(plain.as_bytes(), P).unwrap_err();
        assert!(e.contains("base64"), "{e}");
        let empty = dump(&[], None);
        assert!(
            parse_etcd_dump(empty.as_bytes(), P)
                .unwrap_err()
                .contains("no identity")
        );
        // A whole dump of a kvstore no node uses any more has no value/ key: it is read.
        let unused = dump(&[("cilium/state/identities/v1/id/300", "k8s:app=a;")], None);
        assert_eq!(parse_etcd_dump(unused.as_bytes(), P).unwrap().len(), 1);
    }

    #[test]
    fn a_kubectl_list_gives_each_identity_and_its_labels() {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity", "metadata": {"name": "300", "uid": "u"},
             "security-labels": {"k8s:app": "a", "reserved:host": null}}]});
        let ids = parse_k8s_dump(list.to_string().as_bytes()).unwrap();
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[0].0, 300);
        assert_eq!(ids[0].1.get("reserved:host").map(String::as_str), Some(""));
        let pods = serde_json::json!({"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "x"}}]});
        assert!(
            parse_k8s_dump(pods.to_string().as_bytes())
                .unwrap_err()
                .contains("Pod")
        );
        let named = serde_json::json!({"kind": "List", "items": [{"kind": "CiliumIdentity", "metadata": {"name": "web"}, "security-labels": {}}]});
        assert!(
            parse_k8s_dump(named.to_string().as_bytes())
                .unwrap_err()
                .contains("web")
        );
        assert!(parse_k8s_dump(b"{}").unwrap_err().contains("not a list"));
    }
}
