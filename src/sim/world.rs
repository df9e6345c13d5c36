//! The simulated world sync runs in: an etcd (revisions, create-only master keys, `value/`
//! keys that go with their node, compaction), a kube-apiserver (resourceVersions, create-only
//! objects, a watch window that expires with 410), nodes whose agents allocate as Cilium's do
//! (kvstore mode: the labels' `value/` key, else an id already holding them, else a random
//! free id from a pool fed only by the master keys; CRD mode: the oldest object with the
//! labels, else a random free name) and roll from kvstore to CRD mode, both GCs, the Lease,
//! and agents that write malformed entries. Deterministic from its `Rng`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::report::Failure;
use crate::core::kvstore::{IdDigits, NodeCounts, RESERVATION_NODE};
use crate::core::labels::LabelKey;
use crate::core::lease::LeaseRecord;
use crate::core::lease::keeper::LeaseError;
use crate::core::rng::Rng;
use crate::core::sync::machine::K8sChange;
use crate::core::sync::reserve::writer::LEASE_TTL_SECS;
use crate::core::sync::{KvChange, SyncState};

/// The ids agents allocate from: narrow, so the two sides collide as they do in a real
/// rollout with many nodes.
pub const POOL: std::ops::Range<u32> = 256..296;
/// Distinct label sets the workloads use.
pub const LABEL_SETS: usize = 28;

pub fn labels(i: usize) -> String {
    format!("k8s:app=w{i};k8s:io.kubernetes.pod.namespace=ns{};", i % 3)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Kvstore,
    Crd,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub mode: Mode,
}

pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// How a reservation's transaction went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResWrite {
    /// Both keys written, the master key at this revision.
    Written(i64),
    /// The master key exists, holding this.
    Held(String),
    /// The lease named was revoked or lapsed (etcd refuses the put).
    LeaseGone,
}

/// How long sync's reservation lease outlives its last keep-alive: the TTL the writer asks
/// etcd for (15 minutes), so the simulation keeps the binary's lease and cadence.
pub const RESERVATION_TTL: Duration = Duration::from_secs(LEASE_TTL_SECS as u64);

/// The name instance `i` holds the Lease under.
pub fn lease_identity(i: usize) -> String {
    format!("i{i}")
}

#[derive(Debug, Default)]
pub struct World {
    pub now: Duration,
    pub kv_rev: i64,
    /// `id/<n>` (the raw id text, so an agent can write one out of range) -> value.
    pub masters: BTreeMap<String, String>,
    /// The revision each master key was written at (what a release compares).
    pub master_revs: BTreeMap<String, i64>,
    /// Master keys sync wrote (`--reserve-in-kvstore`), with their revision: the only
    /// master keys it may ever delete.
    pub sync_masters: BTreeMap<String, i64>,
    /// How many master keys sync wrote in all (one id may be reserved again after a GC).
    pub sync_master_writes: usize,
    /// etcd leases holding sync's reservation `value/` keys: lease -> when it lapses.
    pub res_leases: BTreeMap<i64, Duration>,
    next_res_lease: i64,
    /// Reservation leases that lapsed (not kept alive within their TTL).
    pub res_lapsed: usize,
    /// The rollout's quiet end: no chaos (no GC between an instance's two reads).
    pub quiet: bool,
    /// The lease each reservation `value/` key (by labels) is on.
    pub res_value_lease: BTreeMap<String, i64>,
    /// `value/<labels>/<node>` -> (id, revision it was created at).
    pub values: BTreeMap<(String, String), (u32, i64)>,
    /// Every kvstore change, by revision; a watch from before `compacted` is cancelled.
    pub kv_log: Vec<(i64, KvChange)>,
    /// When each change of `kv_log` happened (same places): how far a view trails.
    pub kv_log_at: Vec<Duration>,
    pub kv_compacted: i64,
    pub k8s_rv: u64,
    /// Objects: id -> labels and the resourceVersion that created them (the oldest wins).
    pub objects: BTreeMap<u32, (LabelKey, u64)>,
    /// Objects sync created, by id.
    pub created_by_sync: BTreeSet<u32>,
    /// Identities both GCs took, the kvstore's first: id -> labels and the resourceVersion
    /// that made the object, until a master key is written at the id again. Their objects
    /// are not to be made again.
    pub both_gcs_took: BTreeMap<u32, (LabelKey, u64)>,
    /// Ids CRD-mode agents hold (their endpoints reference them): the GC leaves them.
    pub crd_used: BTreeSet<u32>,
    pub k8s_log: Vec<(u64, K8sChange)>,
    /// The API server's watch window: a watch from before this expires (410).
    pub k8s_window: u64,
    pub nodes: Vec<Node>,
    /// The one-writer Lease as the API server stores it (replaced only at the version read).
    pub lease: Option<LeaseRecord>,
    lease_version: u64,
    /// Each instance's write gate, as its elector last set it (simulated time; `None`:
    /// closed).
    pub gates: Vec<Option<Duration>>,
}

impl World {
    pub fn new(nodes: usize) -> Self {
        World {
            kv_rev: 1,
            k8s_rv: 1,
            nodes: (0..nodes)
                .map(|i| Node {
                    name: format!("10.0.0.{}", i + 1),
                    mode: Mode::Kvstore,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn kv_put(&mut self, change: KvChange) {
        self.kv_rev += 1;
        self.kv_log.push((self.kv_rev, change));
        self.kv_log_at.push(self.now);
    }

    fn put_master(&mut self, id: String, value: String) {
        if let Ok(n) = id.parse::<u32>() {
            self.both_gcs_took.remove(&n);
        }
        self.masters.insert(id.clone(), value.clone());
        self.kv_put(KvChange::Master {
            id: id.clone().into_bytes(),
            value: Some(value.into_bytes()),
            created: true,
        });
        self.master_revs.insert(id, self.kv_rev);
    }

    fn delete_master(&mut self, id: &str) {
        self.masters.remove(id);
        self.master_revs.remove(id);
        self.kv_put(KvChange::Master {
            id: id.as_bytes().to_vec(),
            value: None,
            created: false,
        });
    }

    fn delete_value(&mut self, labels: &str, node: &str) -> bool {
        let Some((id, _)) = self.values.remove(&(labels.to_string(), node.to_string())) else {
            return false;
        };
        self.kv_put(KvChange::Slave {
            label_key: labels.as_bytes().to_vec(),
            node: node.as_bytes().to_vec(),
            present: false,
            id: Some(id.to_string().into_bytes()),
        });
        true
    }

    fn put_value(&mut self, labels: &str, node: &str, id: u32) {
        self.kv_put(KvChange::Slave {
            label_key: labels.as_bytes().to_vec(),
            node: node.as_bytes().to_vec(),
            present: true,
            id: Some(id.to_string().into_bytes()),
        });
        self.values
            .insert((labels.to_string(), node.to_string()), (id, self.kv_rev));
    }

    /// A kvstore-mode agent allocates `labels` as Cilium's allocator does.
    pub fn kvstore_allocate(&mut self, rng: &mut Rng, node: usize, labels: &str) {
        let name = self.nodes[node].name.clone();
        if self
            .values
            .contains_key(&(labels.to_string(), name.clone()))
        {
            return;
        }
        let held = self
            .masters
            .iter()
            .find(|(_, v)| v.as_str() == labels)
            .and_then(|(id, _)| id.parse::<u32>().ok());
        let id = match held {
            Some(id) => id,
            None => {
                // The pool knows only the master keys: an id Kubernetes holds looks free.
                let free: Vec<u32> = POOL
                    .filter(|&id| !self.masters.contains_key(IdDigits::of(id).as_str()))
                    .collect();
                let Some(&id) = rng.pick(&free) else {
                    return;
                };
                self.put_master(id.to_string(), labels.to_string());
                id
            }
        };
        self.put_value(labels, &name, id);
    }

    /// A CRD-mode agent allocates `labels`: the oldest object with them, else a free name.
    pub fn crd_allocate(&mut self, rng: &mut Rng, labels: &str) {
        let oldest = self
            .objects
            .iter()
            .filter(|(_, (l, _))| l.as_str() == labels)
            .min_by_key(|(_, (_, rv))| *rv)
            .map(|(id, _)| *id);
        if let Some(id) = oldest {
            self.crd_used.insert(id);
            return;
        }
        let free: Vec<u32> = POOL.filter(|id| !self.objects.contains_key(id)).collect();
        if let Some(&id) = rng.pick(&free)
            && self.create_object(id, labels.into())
        {
            self.crd_used.insert(id);
        }
    }

    /// The operator's GC: an object no endpoint references (no CRD-mode agent holds its
    /// id, no kvstore-mode node's `value/` key names it) goes.
    pub fn k8s_gc(&mut self, rng: &mut Rng) -> Option<u32> {
        // Endpoints reference ids: CRD-mode agents' and kvstore-mode nodes' (their `value/`
        // keys), never sync's reservations.
        let in_use: BTreeSet<u32> = self
            .values
            .iter()
            .filter(|((_, node), _)| node != RESERVATION_NODE)
            .map(|(_, (id, _))| *id)
            .collect();
        let unused: Vec<u32> = self
            .objects
            .keys()
            .copied()
            .filter(|id| !self.crd_used.contains(id) && !in_use.contains(id))
            .collect();
        let id = *rng.pick(&unused)?;
        self.delete_object(id);
        Some(id)
    }

    /// A create: refused (false) when the name is taken; an object is never changed.
    pub fn create_object(&mut self, id: u32, labels: LabelKey) -> bool {
        if self.objects.contains_key(&id) {
            return false;
        }
        self.k8s_rv += 1;
        self.objects.insert(id, (labels.clone(), self.k8s_rv));
        self.k8s_log.push((
            self.k8s_rv,
            K8sChange::Upsert {
                id,
                labels,
                resource_version: self.k8s_rv.to_string(),
            },
        ));
        true
    }

    /// The operator's GC deletes an object.
    pub fn delete_object(&mut self, id: u32) {
        if self.objects.remove(&id).is_none() {
            return;
        }
        self.k8s_rv += 1;
        self.k8s_log.push((
            self.k8s_rv,
            K8sChange::Deleted {
                id,
                resource_version: self.k8s_rv.to_string(),
            },
        ));
    }

    /// A new etcd lease for sync's reservations.
    pub fn res_grant(&mut self) -> i64 {
        self.next_res_lease += 1;
        self.res_leases
            .insert(self.next_res_lease, self.now + RESERVATION_TTL);
        self.next_res_lease
    }

    /// Keeps `lease` alive; false when it lapsed already.
    pub fn res_keep_alive(&mut self, lease: i64) -> bool {
        match self.res_leases.get_mut(&lease) {
            Some(until) => {
                *until = self.now + RESERVATION_TTL;
                true
            }
            None => false,
        }
    }

    /// Leases whose time is up lapse, and their `value/` keys with them.
    pub fn expire_res_leases(&mut self) {
        let now = self.now;
        let gone: Vec<i64> = self
            .res_leases
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(l, _)| *l)
            .collect();
        self.res_lapsed += gone.len();
        for lease in gone {
            self.res_revoke(lease);
        }
    }

    /// Revokes `lease`: every reservation `value/` key on it goes.
    pub fn res_revoke(&mut self, lease: i64) {
        self.res_leases.remove(&lease);
        let on_it: Vec<String> = self
            .res_value_lease
            .iter()
            .filter(|(_, l)| **l == lease)
            .map(|(labels, _)| labels.clone())
            .collect();
        for labels in on_it {
            self.res_value_lease.remove(&labels);
            self.delete_value(&labels, RESERVATION_NODE);
        }
    }

    fn put_reservation_value(&mut self, labels: &str, id: u32, lease: i64) {
        self.put_value(labels, RESERVATION_NODE, id);
        self.res_value_lease.insert(labels.to_string(), lease);
    }

    /// Reserves `id` for `labels` as `io::reservation` does, in one transaction: the master
    /// key only if it does not exist, and sync's `value/` key on `lease`.
    pub fn res_reserve(&mut self, id: u32, labels: &str, lease: i64) -> ResWrite {
        let key = id.to_string();
        if !self.res_leases.contains_key(&lease) {
            return ResWrite::LeaseGone;
        }
        if let Some(other) = self.masters.get(&key) {
            return ResWrite::Held(other.clone());
        }
        self.put_master(key.clone(), labels.to_string());
        let revision = self.kv_rev;
        self.sync_masters.insert(key, revision);
        self.sync_master_writes += 1;
        self.put_reservation_value(labels, id, lease);
        ResWrite::Written(revision)
    }

    /// Sync's `value/` key for `labels` goes (its object went).
    pub fn res_unreserve(&mut self, labels: &str) -> bool {
        self.res_value_lease.remove(labels);
        self.delete_value(labels, RESERVATION_NODE)
    }

    /// Puts sync's `value/` key back on `lease` if the master key is still as written.
    pub fn res_restore(&mut self, id: u32, labels: &str, revision: i64, lease: i64) -> bool {
        let key = id.to_string();
        let as_written = self.master_revs.get(&key) == Some(&revision)
            && self.masters.get(&key).map(String::as_str) == Some(labels);
        if !as_written || !self.res_leases.contains_key(&lease) {
            return false;
        }
        self.put_reservation_value(labels, id, lease);
        true
    }

    /// Deletes the master key at `id` if still as written at `revision` and no node uses
    /// its labels; whether it was deleted.
    pub fn res_release(&mut self, id: u32, labels: &str, revision: i64) -> bool {
        let key = id.to_string();
        let used = self.values.keys().any(|(l, _)| l == labels);
        if self.master_revs.get(&key) != Some(&revision) || used {
            return false;
        }
        self.delete_master(&key);
        true
    }

    /// A node leaves kvstore mode: its `value/` keys lapse with its lease.
    pub fn roll(&mut self, node: usize) {
        self.nodes[node].mode = Mode::Crd;
        let name = self.nodes[node].name.clone();
        let gone: Vec<(String, String)> = self
            .values
            .keys()
            .filter(|(_, n)| *n == name)
            .cloned()
            .collect();
        for key in gone {
            let id = self
                .values
                .remove(&key)
                .map(|(id, _)| id.to_string().into_bytes());
            self.kv_put(KvChange::Slave {
                label_key: key.0.into_bytes(),
                node: key.1.into_bytes(),
                present: false,
                id,
            });
        }
    }

    /// An identity's pods are gone everywhere, and both GCs take it moments apart, the
    /// kvstore's first: every node's `value/` key for its labels and its master key, then its
    /// object. One no CRD-mode agent holds and sync has not reserved (its own `value/` key
    /// would keep the master key).
    pub fn both_gcs(&mut self, rng: &mut Rng) -> Option<u32> {
        let reserved: BTreeSet<&str> = self
            .values
            .keys()
            .filter(|(_, node)| node == RESERVATION_NODE)
            .map(|(l, _)| l.as_str())
            .collect();
        // (id, labels, the resourceVersion that made its object)
        let taken: Vec<(u32, String, u64)> = self
            .masters
            .iter()
            .filter_map(|(id, l)| {
                let n = id.parse::<u32>().ok()?;
                let (o, made_at) = self.objects.get(&n)?;
                let eligible = o == l
                    && !self.crd_used.contains(&n)
                    && !self.sync_masters.contains_key(id)
                    && !reserved.contains(l.as_str());
                eligible.then(|| (n, l.clone(), *made_at))
            })
            .collect();
        let (id, labels, made_at) = rng.pick(&taken)?.clone();
        let nodes: Vec<String> = self
            .values
            .keys()
            .filter(|(l, _)| *l == labels)
            .map(|(_, node)| node.clone())
            .collect();
        for node in nodes {
            self.delete_value(&labels, &node);
        }
        self.delete_master(&id.to_string());
        self.delete_object(id);
        self.both_gcs_took.insert(id, (labels, made_at));
        Some(id)
    }

    /// Cilium's kvstore GC: a master key no `value/` key uses goes.
    pub fn kv_gc(&mut self, rng: &mut Rng) {
        let used: BTreeSet<&str> = self.values.keys().map(|(l, _)| l.as_str()).collect();
        let unused: Vec<String> = self
            .masters
            .iter()
            .filter(|(_, v)| !used.contains(v.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        if let Some(id) = rng.pick(&unused).cloned() {
            self.delete_master(&id);
        }
    }

    /// An agent (or a person) writes a malformed master key: bad labels, or an id out of
    /// range. Sync must report it and never write it.
    pub fn malformed(&mut self, rng: &mut Rng) {
        let (id, value) = if rng.chance(0.5) {
            let free: Vec<u32> = POOL
                .filter(|id| !self.masters.contains_key(&id.to_string()))
                .collect();
            let Some(&id) = rng.pick(&free) else {
                return;
            };
            (id.to_string(), "no labels here".to_string())
        } else {
            (
                "70000".to_string(),
                labels(rng.below(LABEL_SETS as u64) as usize),
            )
        };
        if !self.masters.contains_key(&id) {
            self.put_master(id, value);
        }
    }

    /// A list of the objects, as a Kubernetes list gives them: each with the
    /// resourceVersion the list was at.
    /// The nodes whose `value/` keys use `labels`, sync's own left out: the world's answer to
    /// the binary's `nodes_using` (one prefix read, `value/{labels}/`), in the same order.
    pub fn nodes_using(&self, labels: &[u8], id: u32) -> Vec<String> {
        let Ok(labels) = std::str::from_utf8(labels) else {
            return Vec::new();
        };
        self.values
            .range((labels.to_string(), String::new())..)
            .take_while(|((l, _), _)| l.as_str() == labels)
            .filter(|((_, node), (at, _))| node.as_str() != RESERVATION_NODE && *at == id)
            .map(|((_, node), _)| node.clone())
            .collect()
    }

    pub fn k8s_list(&self) -> (BTreeMap<u32, LabelKey>, u64) {
        let objects = self
            .objects
            .iter()
            .map(|(id, (l, _))| (*id, l.clone()))
            .collect();
        (objects, self.k8s_rv)
    }

    /// A read of the kvstore at one revision, as a snapshot: master keys and the nodes
    /// using each label set.
    pub fn kv_read(&self) -> SyncState {
        let masters = self
            .masters
            .iter()
            .map(|(id, v)| (id.clone().into_bytes(), v.clone().into_bytes()))
            .collect();
        let mut counts = NodeCounts::default();
        for ((labels, node), (id, _)) in &self.values {
            counts.add_key(
                labels.as_bytes(),
                node.as_bytes(),
                id.to_string().as_bytes(),
            );
        }
        SyncState::from_kvstore(masters, counts, self.kv_rev)
    }

    /// Instance `i` writes (or announces cutover): its gate is open, the Lease record names
    /// it, and no other instance's gate is open (two instances never both write).
    pub fn check_sole_writer(&self, i: usize, what: &str) -> Result<(), Failure> {
        let world = self;
        let others: Vec<usize> = (0..world.gates.len())
            .filter(|&j| j != i && world.lease_valid(j))
            .collect();
        if !world.lease_valid(i) || world.lease_holder() != Some(i) || !others.is_empty() {
            return Err(Failure::new(
                "writes only while the Lease is valid, by one instance at a time",
                format!(
                    "{what}: its gate open {}, the record {:?}, others whose gate is open {others:?}",
                    world.lease_valid(i),
                    world.lease
                ),
            ));
        }
        Ok(())
    }

    /// Whether instance `i` may write now, as its elector's gate says.
    pub fn lease_valid(&self, i: usize) -> bool {
        self.gates
            .get(i)
            .copied()
            .flatten()
            .is_some_and(|until| self.now < until)
    }

    /// The instance the Lease record names, if any.
    pub fn lease_holder(&self) -> Option<usize> {
        let holder = self.lease.as_ref()?.holder.as_deref()?;
        holder.strip_prefix('i')?.parse().ok()
    }

    /// A create (`read` is `None`: none was read) or a replace of the record read at its
    /// version, as the API server makes them: only if the record is still as read
    /// (otherwise 409, AlreadyExists for a create, Conflict for a replace).
    pub fn lease_write(
        &mut self,
        read: Option<&str>,
        holder: Option<&str>,
        duration: Duration,
    ) -> Result<String, LeaseError> {
        let now = self.lease.as_ref().map(|r| r.version.as_str());
        if now != read {
            let reason = if read.is_none() {
                "AlreadyExists"
            } else {
                "Conflict"
            };
            return Err(LeaseError {
                code: Some(409),
                reason: reason.into(),
                text: format!("409 {reason}"),
            });
        }
        self.lease_version += 1;
        let version = self.lease_version.to_string();
        self.lease = Some(LeaseRecord {
            holder: holder.map(String::from),
            duration,
            version: version.clone(),
        });
        Ok(version)
    }
}
