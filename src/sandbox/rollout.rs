//! The demo's rollout: nodes that allocate identities as Cilium's agents do while they move,
//! one by one, from kvstore mode to CRD mode. A kvstore-mode agent looks the labels up under
//! `value/` (another node's allocation is reused), else takes a free id from its pool, which
//! only the `id/` keys feed, writes the master key create-only and its own `value/` key on
//! its lease. A CRD-mode agent looks the labels up among the `CiliumIdentity` objects, else
//! takes a free id from a pool the objects feed and creates it by name (another id on a
//! 409). Each side is blind to what the other allocated and not yet mirrored, so with a
//! narrow pool the two hand out one id for two label sets (a split allocation), which sync
//! reports. When a node moves, its lease is revoked and its `value/` keys go with it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{AgentHandle, Rng};
use crate::core::kvstore::{DEFAULT_PREFIX, KeyKind, classify_key, normalize_prefix, parse_id};
use crate::core::labels::{canonical_key, parse_label_key, to_security_labels};
use crate::core::range::IdRange;
use crate::io::mem_kv::MemKv;

/// The app label of every label set the rollout's agents allocate.
const ROLLOUT_APP: &str = "k8s:app=rollout-";

/// Time between two agents' allocations within a step.
const AGENT_GAP: Duration = Duration::from_millis(20);

/// How the rollout plays.
#[derive(Debug, Clone)]
pub struct RolloutConfig {
    /// 1.0 plays the whole rollout in about two minutes (the nodes' part of it).
    pub speed: f64,
    pub seed: u64,
    /// An agent takes a random id among the lowest `pool` free ones it knows of. Cilium's
    /// take a random free id in the whole range, so collisions are rare and most new
    /// identities are simply mirrored; the demo's window (256) keeps that picture while a
    /// few split allocations still show within its two minutes. Tests that want collisions
    /// narrow it.
    pub pool: usize,
    pub range: IdRange,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            speed: 1.0,
            seed: 7,
            pool: 256,
            range: IdRange {
                min: 256,
                max: 65535,
            },
        }
    }
}

/// What happened, for the benchmark and the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutCounts {
    /// New identities allocated by kvstore-mode agents (master keys written).
    pub kvstore_allocations: u64,
    /// New identities allocated by CRD-mode agents (objects created).
    pub crd_allocations: u64,
    /// Allocations that found the labels already allocated (on their own backend).
    pub reused: u64,
    pub nodes_moved: usize,
}

/// The two backends at the end: ids held for different labels by the kvstore and Kubernetes
/// (split allocations), and label sets held at different ids by the two (double allocations).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Divergence {
    pub splits: Vec<u32>,
    pub doubles: Vec<String>,
}

/// Plays the rollout once something follows the kvstore (sync), reporting each step on
/// `events`. `leases` are the kvstore-mode nodes, by name, in the order they move.
pub async fn run(
    kv: Arc<MemKv>,
    api: AgentHandle,
    leases: BTreeMap<String, i64>,
    cfg: RolloutConfig,
    events: mpsc::Sender<String>,
) -> RolloutCounts {
    kv.watched().await;
    let speed = cfg.speed.max(0.01);
    let nodes: Vec<(String, i64)> = leases.into_iter().collect();
    let phases = nodes.len() + 1;
    let phase = phase_length(nodes.len(), speed);
    let step = Duration::from_secs_f64(1.5 / speed);
    let mut sim = Sim::new(kv, api, cfg);
    let _ = events
        .send(format!(
            "rollout: {} kvstore-mode nodes move to CRD mode one by one, about every {:.0} s",
            nodes.len(),
            phase.as_secs_f64()
        ))
        .await;
    for moved in 0..phases {
        let end = tokio::time::Instant::now() + phase;
        while tokio::time::Instant::now() < end {
            for (i, (node, lease)) in nodes.iter().enumerate() {
                if sim.rng.next_f64() < 0.5 {
                    continue;
                }
                let labels = sim.next_labels();
                if i >= moved {
                    sim.kvstore_allocate(node, *lease, &labels);
                } else {
                    sim.crd_allocate(node, &labels);
                }
                // Nodes are separate machines: one agent's allocation (a few round trips to
                // the kvstore or the API server) does not start in the same instant as the
                // last one's ended.
                tokio::time::sleep(AGENT_GAP).await;
            }
            tokio::time::sleep(step).await;
        }
        if let Some((node, lease)) = nodes.get(moved) {
            let lapsed = sim.kv.revoke_lease(*lease);
            sim.counts.nodes_moved += 1;
            let _ = events
                .send(format!(
                    "rollout: {node} moved to CRD mode; its {lapsed} value/ keys lapsed"
                ))
                .await;
        }
    }
    let c = &sim.counts;
    let _ = events
        .send(format!(
            "rollout over: every node in CRD mode; {} identities allocated in the kvstore, {} as objects, {} reused",
            c.kvstore_allocations, c.crd_allocations, c.reused
        ))
        .await;
    sim.counts
}

/// How long each phase of the rollout lasts (the time between two nodes moving) with
/// `nodes` kvstore-mode nodes at `speed`: about two minutes in all at speed 1, in which every
/// node allocates every 1.5 s or so. The benchmark paces Cilium's own allocators by it.
pub fn phase_length(nodes: usize, speed: f64) -> Duration {
    Duration::from_secs_f64(110.0 / (nodes + 1) as f64 / speed.max(0.01))
}

struct Sim {
    kv: Arc<MemKv>,
    api: AgentHandle,
    cfg: RolloutConfig,
    rng: Rng,
    prefix: String,
    next_app: u64,
    /// Label sets allocated lately: pods of one deployment land on several nodes.
    recent: VecDeque<String>,
    counts: RolloutCounts,
}

impl Sim {
    fn new(kv: Arc<MemKv>, api: AgentHandle, cfg: RolloutConfig) -> Self {
        Sim {
            kv,
            api,
            rng: Rng::new(cfg.seed),
            cfg,
            prefix: normalize_prefix(DEFAULT_PREFIX),
            next_app: 0,
            recent: VecDeque::new(),
            counts: RolloutCounts::default(),
        }
    }

    /// A label set for a new pod: often one a pod on another node already has.
    fn next_labels(&mut self) -> String {
        if !self.recent.is_empty() && self.rng.next_f64() < 0.35 {
            let i = self.rng.below(self.recent.len() as u64) as usize;
            return self.recent[i].clone();
        }
        self.next_app += 1;
        let ns = ["shop", "payments", "search", "data"][self.rng.below(4) as usize];
        let key = format!(
            "{ROLLOUT_APP}{};k8s:io.kubernetes.pod.namespace={ns};",
            self.next_app
        );
        self.recent.push_back(key.clone());
        if self.recent.len() > 32 {
            self.recent.pop_front();
        }
        key
    }

    /// A random id among the lowest `pool` free ones of `taken`.
    fn pick(&mut self, taken: &BTreeSet<u32>) -> Option<u32> {
        let free: Vec<u32> = (self.cfg.range.min..=self.cfg.range.max)
            .filter(|id| !taken.contains(id))
            .take(self.cfg.pool)
            .collect();
        (!free.is_empty()).then(|| free[self.rng.below(free.len() as u64) as usize])
    }

    fn kvstore_allocate(&mut self, node: &str, lease: i64, labels: &str) {
        let own_key = format!("{}value/{labels}/{node}", self.prefix).into_bytes();
        // Another node's allocation of these labels is reused.
        let users = format!("{}value/{labels}/", self.prefix);
        if let Some((_, id)) = self.kv.range(users.as_bytes()).0.into_iter().next() {
            self.kv.put(&own_key, &id, Some(lease));
            self.counts.reused += 1;
            return;
        }
        for _ in 0..16 {
            let taken: BTreeSet<u32> = self
                .kv
                .range(format!("{}id/", self.prefix).as_bytes())
                .0
                .iter()
                .filter_map(|(k, _)| match classify_key(&self.prefix, k) {
                    KeyKind::Master { id } => parse_id(id).ok(),
                    _ => None,
                })
                .collect();
            let Some(id) = self.pick(&taken) else { return };
            let master = format!("{}id/{id}", self.prefix);
            if self
                .kv
                .create(master.as_bytes(), labels.as_bytes(), None)
                .is_some()
            {
                self.kv
                    .put(&own_key, id.to_string().as_bytes(), Some(lease));
                self.counts.kvstore_allocations += 1;
                return;
            }
        }
    }

    fn crd_allocate(&mut self, node: &str, labels: &str) {
        let Ok(parsed) = parse_label_key(labels) else {
            return;
        };
        let security = to_security_labels(&parsed);
        let want = canonical_key(&security);
        for _ in 0..16 {
            let objects = self.api.identities();
            if objects.values().any(|l| canonical_key(l) == want) {
                self.counts.reused += 1;
                return;
            }
            let taken: BTreeSet<u32> = objects.keys().copied().collect();
            let Some(id) = self.pick(&taken) else { return };
            if self
                .api
                .create(id, &security, &format!("cilium-agent ({node})"))
            {
                self.counts.crd_allocations += 1;
                return;
            }
        }
    }
}

/// Whether a label key is one the rollout's agents allocate.
fn is_rollouts(label_key: &str) -> bool {
    label_key.starts_with(ROLLOUT_APP)
}

/// How far the two backends diverge now over what the rollout allocated (see `Divergence`).
pub fn divergence(kv: &MemKv, api: &AgentHandle) -> Divergence {
    let snap = kv.snapshot(DEFAULT_PREFIX);
    let objects: BTreeMap<u32, String> = api
        .identities()
        .into_iter()
        .map(|(id, l)| (id, canonical_key(&l)))
        .collect();
    let mut by_labels: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for (id, labels) in &objects {
        by_labels.entry(labels.clone()).or_default().insert(*id);
    }
    let kv_held: BTreeMap<u32, String> = snap
        .masters
        .iter()
        .filter_map(|m| {
            let id = parse_id(&m.id).ok()?;
            let parsed = parse_label_key(std::str::from_utf8(&m.value).ok()?).ok()?;
            Some((id, canonical_key(&to_security_labels(&parsed))))
        })
        .collect();
    let mut out = Divergence::default();
    for m in &snap.masters {
        let (Ok(id), Ok(labels)) = (parse_id(&m.id), std::str::from_utf8(&m.value)) else {
            continue;
        };
        let Ok(parsed) = parse_label_key(labels) else {
            continue;
        };
        let key = canonical_key(&to_security_labels(&parsed));
        // Only what the rollout's agents allocated: the generated cluster's own conflicts,
        // and the remaps sync makes for them, are not the rollout's doing.
        match objects.get(&id) {
            Some(k8s) if *k8s != key && (is_rollouts(&key) || is_rollouts(k8s)) => {
                out.splits.push(id)
            }
            _ => {}
        }
        if !is_rollouts(&key) {
            continue;
        }
        // Kubernetes holds these labels at an id the kvstore does not hold for them: agents
        // on the two sides use two ids for one label set.
        if by_labels
            .get(&key)
            .is_some_and(|ids| ids.iter().any(|y| *y != id && kv_held.get(y) != Some(&key)))
        {
            out.doubles.push(key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::{Sandbox, SandboxConfig};

    #[tokio::test(flavor = "multi_thread")]
    async fn agents_follow_their_backends_rules_and_collide_in_a_narrow_pool() {
        let sb = Sandbox::start(SandboxConfig::default()).await.unwrap();
        let kv = Arc::new(MemKv::default());
        let lease = kv.grant_lease();
        let mut sim = Sim::new(kv.clone(), sb.agent(), RolloutConfig::default());
        sim.cfg.pool = 1;
        let a = "k8s:app=rollout-a;";
        sim.kvstore_allocate("node-1", lease, a);
        sim.kvstore_allocate("node-2", lease, a);
        assert_eq!(sim.counts.kvstore_allocations, 1);
        assert_eq!(
            sim.counts.reused, 1,
            "the second node reuses the first's id"
        );
        // Both nodes' keys name the one id the first allocated (the pool's only one, 256).
        assert_eq!(
            kv.nodes_using(DEFAULT_PREFIX, a.as_bytes(), b"256").len(),
            2
        );
        // A CRD-mode agent blind to the kvstore takes an id from the objects' pool: with a
        // pool of one, the same lowest id: one id, two label sets.
        sim.crd_allocate("node-3", "k8s:app=rollout-b;");
        assert_eq!(sim.counts.crd_allocations, 1);
        let d = divergence(&kv, &sb.agent());
        assert_eq!(d.splits, vec![256], "{d:?}");
        // A second CRD agent finds the labels among the objects.
        sim.crd_allocate("node-4", "k8s:app=rollout-b;");
        assert_eq!(sim.counts.reused, 2);
        // The kvstore-mode agent allocating `b` cannot see the object: a double allocation.
        sim.kvstore_allocate("node-1", lease, "k8s:app=rollout-b;");
        let d = divergence(&kv, &sb.agent());
        assert_eq!(d.doubles.len(), 1, "{d:?}");
        assert_eq!(kv.revoke_lease(lease), 3);
    }
}
