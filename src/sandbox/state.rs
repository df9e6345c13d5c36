//! The sandbox's state shared by its routes: how it was started, the object store, the
//! injected faults and the request counters.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::faults::{FaultConfig, Rng};
use super::store::Store;

/// Which Kubernetes release the sandbox answers as, where the releases this tool is tested
/// on differ for it: the version it reports, and whether a streaming list is served or how
/// it is refused. Costs of reads are `ReadModel`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Release {
    /// Kubernetes 1.19 (2020): no streaming lists.
    V1_19,
    /// Kubernetes 1.36 (today's): streaming lists served.
    #[default]
    V1_36,
}

impl Release {
    /// The release a real server reports (`v1.19.0`, `v1.36.2`), if it is one of these.
    pub fn of_version(git_version: &str) -> Option<Release> {
        let v = git_version.trim_start_matches('v');
        if v.starts_with("1.19.") {
            Some(Release::V1_19)
        } else if v.starts_with("1.36.") {
            Some(Release::V1_36)
        } else {
            None
        }
    }

    /// `(minor, gitVersion)` as `/version` says them.
    pub fn version(self) -> (&'static str, &'static str) {
        match self {
            Release::V1_19 => ("19", "v1.19.0-sandbox"),
            Release::V1_36 => ("36", "v1.36.2-sandbox"),
        }
    }

    /// Whether the release serves a streaming list (`sendInitialEvents=true`).
    pub fn serves_streaming_lists(self) -> bool {
        self == Release::V1_36
    }
}

/// How the sandbox starts.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// How long a new CRD stays un-Established (its resource answers a plain 404 meanwhile).
    pub crd_establish_delay: Duration,
    /// Install the CiliumIdentity CRD at start.
    pub with_crd: bool,
    /// Require this bearer token on every request (401 otherwise).
    pub token: Option<String>,
    /// `(verb, resource)` pairs that SelfSubjectAccessReview denies.
    pub denied: Vec<(String, String)>,
    pub seed: u64,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// The release it answers as (`/version`, how a streaming list is refused).
    pub release: Release,
    /// What lists and watches cost, and which kinds the server supports.
    pub reads: ReadModel,
}

/// How the sandbox serves reads, modelled on the kube-apiserver: a list without a
/// resourceVersion is a quorum read from etcd, paged by `limit`; `resourceVersion=0` comes
/// from the watch cache in one response whatever the `limit` (1.19 to 1.26 behaviour); a
/// watch with `sendInitialEvents=true` streams the current state and then a bookmark (the
/// WatchList feature, on only in some releases).
#[derive(Debug, Clone, Default)]
pub struct ReadModel {
    /// Whether streaming lists (`sendInitialEvents=true`) are served; when not, such a watch
    /// is refused as Invalid, as an API server with the feature gate off does.
    pub watch_list: bool,
    /// Time a quorum read spends per object (etcd and decoding): 17 s for 65,280 objects on
    /// a 2-core kube-apiserver 1.19 is about 260 µs.
    pub quorum_per_object: Duration,
    /// Time the watch cache spends per object sent: 4.4 to 6 s for 65,280 is about 70 µs.
    pub cache_per_object: Duration,
}

impl ReadModel {
    /// The costs measured on a real kube-apiserver 1.19 with etcd 3.4 on 2 cores.
    pub fn measured() -> Self {
        ReadModel {
            watch_list: false,
            quorum_per_object: Duration::from_micros(260),
            cache_per_object: Duration::from_micros(70),
        }
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            crd_establish_delay: Duration::from_millis(300),
            with_crd: true,
            token: None,
            denied: Vec::new(),
            seed: 1,
            port: 0,
            release: Release::default(),
            reads: ReadModel {
                watch_list: Release::default().serves_streaming_lists(),
                ..ReadModel::default()
            },
        }
    }
}

impl SandboxConfig {
    /// The default sandbox, answering as `release` does.
    pub fn answering_as(release: Release) -> Self {
        SandboxConfig {
            release,
            reads: ReadModel {
                watch_list: release.serves_streaming_lists(),
                ..ReadModel::default()
            },
            ..SandboxConfig::default()
        }
    }
}

pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub faults: Mutex<(FaultConfig, Rng)>,
    pub counts: Mutex<HashMap<String, u64>>,
    pub config: SandboxConfig,
    /// How long each Lease request waits before it is served: a lease endpoint that hangs
    /// while identities are served (tests of a holder that cannot renew).
    pub lease_delay: Mutex<std::time::Duration>,
}

impl Shared {
    /// Counts a kind of request, for tests and benchmarks to see what a client did.
    pub fn count(&self, key: &str) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_string())
            .or_default() += 1;
    }

    /// The store, even after a panic elsewhere poisoned its lock (the data stays consistent:
    /// every change is made under the lock in one step).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }
}
