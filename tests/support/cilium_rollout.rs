//! A rollout played by Cilium's own allocator on a real kube-apiserver and etcd (one
//! `allocsim` process per node, 1.18's or 1.9's): the double-write path Cilium 1.17+
//! documents (kvstore -> doublewrite-readkvstore -> doublewrite-readcrd -> crd, nodes rolled
//! one by one), or nodes going straight from kvstore to crd mode carried by Cilium's one-shot
//! copy (1.6.11's `preflight migrate-identity`, run once before the rolls), by `sync` alone,
//! or by `sync --reserve-in-kvstore`. All start where F6 of the reference starts: kvstore-mode nodes and a CRD-mode node that already
//! allocated some of the same label sets. It measures what the agents disagree on after each
//! roll, and reads the truth of both stores next to what `audit` counts.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Etcd;
use super::control_plane::ControlPlane;

const PREFIX: &str = "cilium/state/identities/v1";

/// How the cluster moves from the kvstore to CRDs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Cilium 1.17+'s double-write modes, as documented (1.18's allocator only).
    DoubleWrite,
    /// Cilium's one-shot copy (`cilium-1.6.11 preflight migrate-identity`) once, after the
    /// first allocations; then nodes go straight from kvstore to crd mode.
    OneShot,
    /// `cilium-idmig sync --accept-proposals --until-cutover`, nodes going straight from
    /// kvstore to crd mode.
    SyncAlone,
    /// The same with `--reserve-in-kvstore`.
    Sync,
}

impl Way {
    pub fn name(self) -> &'static str {
        match self {
            Way::DoubleWrite => "double-write (1.18)",
            Way::OneShot => "one-shot copy (1.6.11 migrate-identity)",
            Way::SyncAlone => "sync",
            Way::Sync => "sync --reserve-in-kvstore",
        }
    }

    /// The mode of each of the three rolls of a node.
    fn modes(self) -> [&'static str; 3] {
        match self {
            Way::DoubleWrite => ["doublewrite-readkvstore", "doublewrite-readcrd", "crd"],
            // A pod restart in kvstore mode (new label sets arrive), twice, then CRD mode: the
            // same workloads as the double-write path, the same number of restarts.
            Way::OneShot | Way::SyncAlone | Way::Sync => ["kvstore", "kvstore", "crd"],
        }
    }
}

/// How fast the nodes roll.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// Every restart allocates as fast as Cilium's allocator answers; the next node rolls
    /// as soon as it has.
    BackToBack,
    /// The demo's rollout clock at this speed (1: the demo's own pace, 2: twice it): a node
    /// rolls every phase of the demo's rollout (`sandbox::rollout::phase_length` of the
    /// demo's 6 nodes), and each restart spreads its allocations evenly over that phase.
    Demo(f64),
}

impl Pace {
    pub fn name(self) -> String {
        match self {
            Pace::BackToBack => "back to back".into(),
            Pace::Demo(speed) => format!(
                "demo x{speed} (a roll every {:.1} s)",
                self.roll_every().unwrap_or_default().as_secs_f64()
            ),
        }
    }

    /// The time from one roll to the next, when paced.
    pub fn roll_every(self) -> Option<Duration> {
        match self {
            Pace::BackToBack => None,
            Pace::Demo(speed) => Some(cilium_idmig::sandbox::rollout::phase_length(6, speed)),
        }
    }
}

/// What one played rollout measured.
#[derive(Debug)]
pub struct Played {
    /// Ids that live agents held for different label sets, summed over the rolls.
    pub agent_splits: usize,
    /// Label sets that live agents held under different ids, summed over the rolls.
    pub agent_doubles: usize,
    /// Of those, the ones that were not there before the rollout began (after the first
    /// allocations): what the rollout itself caused.
    pub new_splits: usize,
    pub new_doubles: usize,
    /// The same two at the end.
    pub end_splits: usize,
    pub end_doubles: usize,
    /// Allocations Cilium's allocator reported failed.
    pub allocation_errors: Vec<String>,
    /// Findings by kind: read from both stores by this module, and counted by `audit`.
    pub truth: BTreeMap<String, u64>,
    pub audit: BTreeMap<String, u64>,
    /// `audit`'s exit code.
    pub audit_code: i32,
    /// With sync: its exit code (0: cutover reached) and its last lines.
    pub sync_exit: Option<i32>,
    pub sync_output: String,
    pub took: Duration,
}

/// The label sets nodes allocate: `k8s:app=svcN`, N from `from` to `to` (inclusive).
fn label_sets(from: usize, to: usize) -> Vec<String> {
    (from..=to)
        .map(|i| format!("k8s:app=svc{i};k8s:io.kubernetes.pod.namespace=shop;"))
        .collect()
}

/// One node: an allocator process and what it got, by label set.
struct Agent {
    child: Child,
    got: Arc<Mutex<BTreeMap<String, u64>>>,
    errors: Arc<Mutex<Vec<String>>>,
    lines: Arc<Mutex<usize>>,
    /// The agent's own log (stderr).
    log: PathBuf,
}

impl Agent {
    /// `rate`: allocations a second (0: back to back).
    #[allow(clippy::too_many_arguments)]
    fn start(
        bin: &Path,
        node: usize,
        mode: &str,
        labels: &[String],
        rate: f64,
        cp: &ControlPlane,
        etcd_config: &Path,
        dir: &Path,
    ) -> Agent {
        let name = format!("node-{node}");
        let wl = dir.join(format!("workload-{name}-{mode}.txt"));
        std::fs::write(&wl, labels.join("\n") + "\n").unwrap();
        let home = dir.join(format!("home-{name}"));
        std::fs::create_dir_all(&home).unwrap();
        let mut child = Command::new(bin)
            .args([
                "-mode",
                mode,
                "-node",
                &format!("10.0.0.{node}"),
                "-rate",
                &rate.to_string(),
            ])
            .args(["-min", "256", "-max", "400", "-lease-ttl", "25s"])
            // A stuck allocation answers with an error after 30 s instead of the agent's 2 min.
            .args(["-alloc-timeout", "30s"])
            .arg("-workload")
            .arg(&wl)
            .arg("-kubeconfig")
            .arg(&cp.kubeconfig)
            .arg("-etcd-config")
            .arg(etcd_config)
            .env("K8S_NODE_NAME", &name)
            .env("HOME", &home)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join(format!("{name}-{mode}.log"))).unwrap())
            .spawn()
            .unwrap();
        let log = dir.join(format!("{name}-{mode}.log"));
        let got = Arc::new(Mutex::new(BTreeMap::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::new(Mutex::new(0));
        let out = child.stdout.take().unwrap();
        let (g, e, n) = (got.clone(), errors.clone(), lines.clone());
        let mode = mode.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let labels = v["labels"].as_str().unwrap_or_default().to_string();
                match v["err"].as_str() {
                    Some("") | None => {
                        g.lock()
                            .unwrap()
                            .insert(labels, v["id"].as_u64().unwrap_or(0));
                    }
                    Some(err) => e.lock().unwrap().push(format!("{mode} {labels}: {err}")),
                }
                *n.lock().unwrap() += 1;
            }
        });
        Agent {
            child,
            got,
            errors,
            lines,
            log,
        }
    }

    /// Waits until every label set of its workload was allocated (or failed), 120 s at most.
    fn wait(&self, n: usize) {
        let start = Instant::now();
        while *self.lines.lock().unwrap() < n {
            if start.elapsed() > Duration::from_secs(120) {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                panic!(
                    "an allocator answered {} of {n} allocations in 120 s; its log ends:\n{}",
                    self.lines.lock().unwrap(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ids live agents hold for different label sets, and label sets they hold under different ids.
fn disagreements(agents: &BTreeMap<usize, Agent>) -> (usize, usize) {
    let (s, d) = disagreeing(agents);
    (s.len(), d.len())
}

/// The ids and label sets behind `disagreements`.
fn disagreeing(agents: &BTreeMap<usize, Agent>) -> (BTreeSet<u64>, BTreeSet<String>) {
    let mut by_id: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut by_labels: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for a in agents.values() {
        for (labels, &id) in a.got.lock().unwrap().iter() {
            by_id.entry(id).or_default().insert(labels.clone());
            by_labels.entry(labels.clone()).or_default().insert(id);
        }
    }
    (
        by_id
            .into_iter()
            .filter(|(_, l)| l.len() > 1)
            .map(|(id, _)| id)
            .collect(),
        by_labels
            .into_iter()
            .filter(|(_, i)| i.len() > 1)
            .map(|(l, _)| l)
            .collect(),
    )
}

/// Both stores as they are: kvstore masters and `value/` keys (label key, node, id), and
/// objects (id -> label key, from `security-labels`).
type Stores = (
    BTreeMap<u32, String>,
    Vec<(String, String, String)>,
    BTreeMap<u32, String>,
);

async fn read_stores(etcd: &Etcd, cp: &ControlPlane) -> Stores {
    let mut client = etcd.client().await.unwrap();
    let resp = client
        .get(
            format!("{PREFIX}/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let (mut masters, mut values) = (BTreeMap::new(), Vec::new());
    for kv in resp.kvs() {
        let key = kv.key_str().unwrap();
        let value = kv.value_str().unwrap().to_string();
        if let Some(id) = key.strip_prefix(&format!("{PREFIX}/id/")) {
            if let Ok(id) = id.parse::<u32>()
                && !value.is_empty()
            {
                masters.insert(id, value);
            }
        } else if let Some(rest) = key.strip_prefix(&format!("{PREFIX}/value/"))
            && let Some((labels, node)) = rest.rsplit_once('/')
        {
            values.push((labels.to_string(), node.to_string(), value));
        }
    }
    let objects = cp
        .identities()
        .into_iter()
        .filter_map(|(name, sl)| {
            let key: String = sl.iter().map(|(k, v)| format!("{k}={v};")).collect();
            Some((name.parse().ok()?, key))
        })
        .collect();
    (masters, values, objects)
}

/// The findings `audit` should count, from the stores read directly: one id with two label
/// sets (split), a label set whose ids on the two sides share none (double), a label set under
/// two ids in one store (duplicate, per store), an id on one side only, a `value/` key whose
/// id holds other labels or none. No GC runs here, so nothing is GC-marked.
pub fn truth(stores: &Stores) -> BTreeMap<String, u64> {
    let (masters, values, objects) = stores;
    let by_labels = |m: &BTreeMap<u32, String>| {
        let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for (&id, l) in m {
            out.entry(l.clone()).or_default().insert(id);
        }
        out
    };
    let (kv_labels, k8s_labels) = (by_labels(masters), by_labels(objects));
    let split = masters
        .iter()
        .filter(|(id, l)| objects.get(id).is_some_and(|o| o != *l))
        .count();
    let one_side = masters
        .keys()
        .filter(|id| !objects.contains_key(id))
        .count()
        + objects
            .keys()
            .filter(|id| !masters.contains_key(id))
            .count();
    let double = kv_labels
        .iter()
        .filter(|(l, ids)| k8s_labels.get(*l).is_some_and(|o| o.is_disjoint(ids)))
        .count();
    let duplicate = kv_labels.values().filter(|i| i.len() > 1).count()
        + k8s_labels.values().filter(|i| i.len() > 1).count();
    let stale = values
        .iter()
        .filter(|(labels, _, id)| match id.parse::<u32>() {
            Ok(id) => masters.get(&id) != Some(labels),
            Err(_) => false,
        })
        .count();
    [
        ("split", split),
        ("double", double),
        ("duplicate", duplicate),
        ("one-side", one_side),
        ("stale-value", stale),
        ("gc-marked", 0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v as u64))
    .collect()
}

/// Runs `audit --output json`; its exit code and counts.
fn audit(bin: &str, cp: &ControlPlane, etcd: &Etcd, dir: &Path) -> (i32, BTreeMap<String, u64>) {
    let out = Command::new(bin)
        .args([
            "audit",
            "--output",
            "json",
            "--etcd-endpoints",
            &etcd.endpoint,
        ])
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .current_dir(dir)
        .env_remove("KUBECONFIG")
        .env("HOME", dir)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "audit printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let counts = serde_json::from_value(json["counts"].clone()).unwrap();
    (out.status.code().unwrap_or(-1), counts)
}

/// Plays the rollout `way` at `pace` with Cilium's allocator `allocsim` (1.18's or 1.9's) and
/// the tool `bin`.
pub async fn play(
    way: Way,
    pace: Pace,
    allocsim: &Path,
    bin: &str,
    cp: &ControlPlane,
    etcd: &Etcd,
) -> Played {
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let etcd_config: PathBuf = etcd.config_file();
    for n in 1..=3 {
        cp.apply(&format!(
            r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"node-{n}"}}}}"#
        ));
    }
    let _ = cp.kubectl_as(
        &cp.kubeconfig,
        &["create", "namespace", "kube-system"],
        None,
    );
    // Where F6 starts: two kvstore-mode nodes and a CRD-mode node, sharing label sets.
    let mut agents = BTreeMap::new();
    for (node, mode, from, to) in [
        (1, "kvstore", 0, 19),
        (2, "kvstore", 5, 24),
        (3, "crd", 10, 29),
    ] {
        let labels = label_sets(from, to);
        let a = Agent::start(
            allocsim,
            node,
            mode,
            &labels,
            0.0,
            cp,
            &etcd_config,
            dir.path(),
        );
        a.wait(labels.len());
        agents.insert(node, a);
    }
    if way == Way::OneShot {
        let migrator = super::control_plane::cilium_bin("cilium-1.6.11")
            .unwrap_or_else(|why| panic!("Cilium's one-shot copy: {why}"));
        let out = Command::new(migrator)
            .args(["preflight", "migrate-identity", "--kvstore", "etcd"])
            .arg("--kvstore-opt")
            .arg(format!("etcd.config={}", etcd_config.display()))
            .arg("--k8s-kubeconfig-path")
            .arg(&cp.kubeconfig)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "migrate-identity: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut sync = matches!(way, Way::Sync | Way::SyncAlone).then(|| {
        let log = dir.path().join("sync.out");
        let reserve: &[&str] = if way == Way::Sync {
            &["--reserve-in-kvstore"]
        } else {
            &[]
        };
        let child = tokio::process::Command::new(bin)
            .args(["sync", "--accept-proposals", "--until-cutover"])
            .args(reserve)
            .args(["--cutover-grace", "5s", "--etcd-endpoints", &etcd.endpoint])
            .arg("--kubeconfig")
            .arg(&cp.kubeconfig)
            .arg("--decision-log")
            .arg(dir.path().join("decisions.jsonl"))
            .current_dir(dir.path())
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        (child, log)
    });
    if let Some((_, log)) = &sync {
        let t = Instant::now();
        while !std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("sync started")
        {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "sync did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let (before_splits, before_doubles) = disagreeing(&agents);
    let (mut agent_splits, mut agent_doubles, mut new_splits, mut new_doubles) = (0, 0, 0, 0);
    let mut allocation_errors = Vec::new();
    let mut roll = 0;
    for mode in way.modes() {
        for node in [1, 2] {
            roll += 1;
            let rolled = Instant::now();
            if let Some(mut old) = agents.remove(&node) {
                allocation_errors.extend(old.errors.lock().unwrap().iter().cloned());
                old.stop();
            }
            // Each restart brings the node's label sets back and three new ones.
            let first = (node - 1) * 5;
            let labels = label_sets(first, first + 24 + roll * 3);
            let rate = pace
                .roll_every()
                .map_or(0.0, |every| labels.len() as f64 / every.as_secs_f64());
            let a = Agent::start(
                allocsim,
                node,
                mode,
                &labels,
                rate,
                cp,
                &etcd_config,
                dir.path(),
            );
            a.wait(labels.len());
            if let Some(rest) = pace
                .roll_every()
                .and_then(|every| every.checked_sub(rolled.elapsed()))
            {
                tokio::time::sleep(rest).await;
            }
            agents.insert(node, a);
            let (s, d) = disagreeing(&agents);
            agent_splits += s.len();
            agent_doubles += d.len();
            new_splits += s.difference(&before_splits).count();
            new_doubles += d.difference(&before_doubles).count();
        }
    }
    let (end_splits, end_doubles) = disagreements(&agents);
    let (mut sync_exit, mut sync_output) = (None, String::new());
    if let Some((child, log)) = sync.take() {
        let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output()).await;
        sync_output = std::fs::read_to_string(log).unwrap_or_default();
        sync_exit = Some(match out {
            Ok(o) => o.unwrap().status.code().unwrap_or(-1),
            Err(_) => -1,
        });
    }
    // The truth and the audit at one point: read the stores before and after the audit, and
    // again if a lease lapsed in between.
    let (mut audit_code, mut counts, mut truth_now) = (0, BTreeMap::new(), BTreeMap::new());
    for _ in 0..5 {
        let before = read_stores(etcd, cp).await;
        (audit_code, counts) = audit(bin, cp, etcd, dir.path());
        let after = read_stores(etcd, cp).await;
        truth_now = truth(&after);
        if before == after {
            break;
        }
    }
    for a in agents.values_mut() {
        allocation_errors.extend(a.errors.lock().unwrap().iter().cloned());
        a.stop();
    }
    Played {
        agent_splits,
        agent_doubles,
        new_splits,
        new_doubles,
        end_splits,
        end_doubles,
        allocation_errors,
        truth: truth_now,
        audit: counts,
        audit_code,
        sync_exit,
        sync_output,
        took: start.elapsed(),
    }
}
