//! The sandbox's object store: the CRD, the CiliumIdentity objects, resourceVersions and the
//! event history that watches replay.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// One watch event, already serialised as the API server sends it.
#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub rv: u64,
    pub line: String,
}

pub struct Store {
    pub crd: Option<(Value, Instant)>,
    pub crd_establish_delay: Duration,
    pub objects: BTreeMap<String, Value>,
    pub rv: u64,
    uid_counter: u64,
    /// Events after this revision are kept for watches; older ones answer 410 Gone.
    pub history: Vec<WatchEvent>,
    pub history_floor: u64,
    pub events: broadcast::Sender<WatchEvent>,
    /// Leases by namespace and name (sync's one-writer lease).
    pub leases: BTreeMap<(String, String), Value>,
    /// CiliumEndpoints by namespace and name.
    pub endpoints: BTreeMap<(String, String), Value>,
    /// Pods by namespace and name, namespaces by name, ConfigMaps by namespace and name.
    pub pods: BTreeMap<(String, String), Value>,
    pub namespaces: BTreeMap<String, Value>,
    pub config_maps: BTreeMap<(String, String), Value>,
}

impl Store {
    pub fn new(crd_establish_delay: Duration) -> Self {
        let (events, _) = broadcast::channel(4096);
        Store {
            crd: None,
            crd_establish_delay,
            objects: BTreeMap::new(),
            rv: 1000,
            uid_counter: 0,
            history: Vec::new(),
            history_floor: 1000,
            events,
            leases: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            pods: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            config_maps: BTreeMap::new(),
        }
    }

    pub fn crd_established(&self) -> bool {
        self.crd
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= self.crd_establish_delay)
    }

    pub fn crd_object(&self) -> Option<Value> {
        let (crd, _) = self.crd.as_ref()?;
        let mut crd = crd.clone();
        let established = self.crd_established();
        crd["status"] = json!({
            "acceptedNames": crd["spec"]["names"].clone(),
            "storedVersions": ["v2"],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
                {"type": "Established", "status": if established { "True" } else { "False" },
                 "reason": if established { "InitialNamesAccepted" } else { "Installing" }},
            ],
        });
        Some(crd)
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// A new resourceVersion for an update (one counter for every resource, as etcd's).
    pub fn bump_rv(&mut self) -> u64 {
        self.next_rv()
    }

    fn next_uid(&mut self) -> String {
        self.uid_counter += 1;
        format!("5a4d0b1e-0000-4000-8000-{:012x}", self.uid_counter)
    }

    /// Fills in server-owned metadata of a new object.
    pub fn stamp(&mut self, obj: &mut Value) {
        let rv = self.next_rv();
        let uid = self.next_uid();
        let meta = &mut obj["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        meta["uid"] = json!(uid);
        meta["generation"] = json!(1);
        meta["creationTimestamp"] = json!(
            jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        );
    }

    pub fn install_crd(&mut self, mut crd: Value) -> Value {
        self.stamp(&mut crd);
        self.crd = Some((crd, Instant::now()));
        self.crd_object().unwrap_or(Value::Null)
    }

    /// Inserts a new identity written by Cilium's agents (the caller has checked it does not
    /// exist) and records the event.
    pub fn insert(&mut self, name: String, obj: Value) -> Value {
        self.insert_by(name, obj, "cilium-agent")
    }

    /// Inserts a new identity written by `manager` (a client's user agent), with what a
    /// kube-apiserver (1.18+) adds to every object it stores: `managedFields` naming every
    /// field the writer set, and (before 1.20) `selfLink`. They double an object's size in a
    /// list, so reads against the sandbox cost what they cost against a real server.
    pub fn insert_by(&mut self, name: String, mut obj: Value, manager: &str) -> Value {
        self.stamp(&mut obj);
        let fields = |v: &Value| -> Value {
            let mut f = serde_json::Map::new();
            f.insert(".".into(), json!({}));
            for k in v.as_object().into_iter().flat_map(|m| m.keys()) {
                f.insert(format!("f:{k}"), json!({}));
            }
            Value::Object(f)
        };
        let time = obj["metadata"]["creationTimestamp"].clone();
        let managed = json!([{
            "apiVersion": format!("{}/{}", crate::core::identity::GROUP, crate::core::identity::VERSION),
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": fields(&obj["metadata"]["labels"])},
                "f:security-labels": fields(&obj["security-labels"]),
            },
            "manager": manager,
            "operation": "Update",
            "time": time,
        }]);
        let meta = &mut obj["metadata"];
        meta["managedFields"] = managed;
        meta["selfLink"] = json!(format!(
            "{}/{name}",
            crate::core::identity::collection_path()
        ));
        self.objects.insert(name, obj.clone());
        self.record("ADDED", &obj);
        obj
    }

    /// Forgets the history (a watch from before now answers 410) and ends every open watch
    /// (their subscription closes).
    pub fn expire_history(&mut self) {
        self.history.clear();
        // The cluster moved on (other resources spend revisions too): a watch from any
        // revision seen so far is too old; one from the next list's is not.
        self.rv += 1;
        self.history_floor = self.rv;
        let (events, _) = broadcast::channel(4096);
        self.events = events;
    }

    /// Stores a changed object under a new resourceVersion and records the MODIFIED event
    /// (the caller has validated it and kept the server-owned metadata).
    pub fn replace(&mut self, name: &str, mut obj: Value) -> Value {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.insert(name.to_string(), obj.clone());
        self.record("MODIFIED", &obj);
        obj
    }

    pub fn delete(&mut self, name: &str) -> Option<Value> {
        let mut obj = self.objects.remove(name)?;
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record("DELETED", &obj);
        Some(obj)
    }

    fn record(&mut self, kind: &str, obj: &Value) {
        let rv = self.rv;
        let line = json!({"type": kind, "object": obj}).to_string();
        let ev = WatchEvent { rv, line };
        self.history.push(ev.clone());
        // Bounded history, as the API server's watch cache is: older revisions expire.
        if self.history.len() > 100_000 {
            let cut = self.history.len() - 50_000;
            self.history_floor = self.history[cut - 1].rv;
            self.history.drain(..cut);
        }
        let _ = self.events.send(ev);
    }
}
