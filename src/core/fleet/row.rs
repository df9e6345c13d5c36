//! One cluster of a fleet as `fleet` shows it: what was read there (or why nothing could
//! be), and whether it needs attention; the fleet's exit rule.

use serde::Serialize;

use super::{Phase, Standing};

/// A standing older than this, on a sync that has not ended, says the sync is gone: it
/// writes once a minute even when nothing changes.
pub const STALE_AFTER_S: i64 = 300;

/// What was read of one cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterRow {
    /// The context's name (or the kubeconfig's path, for its current context).
    pub cluster: String,
    pub server: String,
    /// Why nothing could be read (unreachable, refused, no answer within the timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub facts: Option<ClusterFacts>,
    /// What needs an operator here, if anything (`None`: cutover reached, nothing to do).
    pub attention: Option<String>,
}

/// What one cluster says of itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClusterFacts {
    /// From the image of the `cilium` DaemonSet.
    pub cilium_version: Option<String>,
    /// From `cilium-config` (`None`: not set, or no `cilium-config`).
    pub identity_allocation_mode: Option<String>,
    pub identity_management_mode: Option<String>,
    /// `CiliumIdentity` objects (`None`: the CRD is not served).
    pub identities: Option<usize>,
    /// Sync's published standing and its age in seconds (`None`: none published).
    pub sync: Option<SyncSeen>,
    /// What `switch-report` would say, counts only.
    pub switch: Option<SwitchSeen>,
    /// Its kvstore, where one was named for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvstore: Option<KvstoreSeen>,
}

/// The cluster's kvstore as counted (or why it could not be).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvstoreSeen {
    /// Identities (`id/` keys) it holds.
    pub identities: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyncSeen {
    #[serde(flatten)]
    pub standing: Standing,
    pub age_s: Option<i64>,
}

/// The switch's verdict, counts only (or why it could not be read).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchSeen {
    pub safe: bool,
    /// Label sets the switch would draw a new id for.
    pub draws: usize,
    pub duplicates: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ClusterRow {
    /// A cluster nothing could be read of.
    pub fn unread(cluster: String, server: String, error: String) -> ClusterRow {
        ClusterRow {
            attention: Some(format!("not read: {error}")),
            cluster,
            server,
            error: Some(error),
            facts: None,
        }
    }

    /// A cluster read: what needs attention follows from what was read.
    pub fn read(cluster: String, server: String, facts: ClusterFacts) -> ClusterRow {
        ClusterRow {
            attention: attention(&facts),
            cluster,
            server,
            error: None,
            facts: Some(facts),
        }
    }

    /// Whether its sync reached cutover.
    pub fn reached_cutover(&self) -> bool {
        self.facts
            .as_ref()
            .and_then(|f| f.sync.as_ref())
            .is_some_and(|s| s.standing.phase == Phase::CutoverReached)
    }
}

/// One cluster's row as words, the same in `fleet`'s table and the TUI's Fleet screen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cells {
    pub cilium: String,
    /// Identity allocation and management modes, `crd/operator`.
    pub modes: String,
    pub identities: String,
    /// The kvstore's count, `error` when it could not be read, `-` when none was named.
    pub kvstore: String,
    /// Sync's phase, `none` when no sync published one.
    pub sync: String,
    pub age: String,
    /// What needs attention first, or that nothing does.
    pub next: String,
}

impl Cells {
    /// The columns' names, the cluster's first.
    pub const HEADER: [&'static str; 8] = [
        "CLUSTER",
        "CILIUM",
        "MODES",
        "IDENTITIES",
        "KVSTORE",
        "SYNC",
        "AGE",
        "NEXT",
    ];

    pub fn of(r: &ClusterRow) -> Cells {
        let f = r.facts.clone().unwrap_or_default();
        let modes = match (&r.facts, &f.identity_allocation_mode) {
            (None, _) => "-".to_string(),
            (_, alloc) => format!(
                "{}/{}",
                alloc.as_deref().unwrap_or("?"),
                f.identity_management_mode.as_deref().unwrap_or("agent")
            ),
        };
        let (sync, age) = match &f.sync {
            Some(s) => (
                s.standing.phase.as_str().to_string(),
                s.age_s.map_or("?".into(), |a| format!("{a}s")),
            ),
            None if r.facts.is_some() => ("none".into(), "-".into()),
            None => ("-".into(), "-".into()),
        };
        let kvstore = match &f.kvstore {
            None => "-".into(),
            Some(KvstoreSeen {
                identities: Some(n),
                ..
            }) => n.to_string(),
            Some(_) => "error".into(),
        };
        Cells {
            cilium: f.cilium_version.unwrap_or_else(|| "-".into()),
            modes,
            identities: f.identities.map_or("-".into(), |n| n.to_string()),
            kvstore,
            sync,
            age,
            next: r
                .attention
                .clone()
                .unwrap_or_else(|| "nothing: cutover reached".into()),
        }
    }
}

/// What needs an operator in a cluster read, first things first; `None` once its sync
/// reached cutover and the switch would draw nothing.
fn attention(f: &ClusterFacts) -> Option<String> {
    let Some(sync) = &f.sync else {
        return Some("no sync has published its standing here".into());
    };
    let s = &sync.standing;
    let ended = matches!(s.phase, Phase::CutoverReached | Phase::Stopped);
    if let Some(age) = sync.age_s.filter(|a| *a > STALE_AFTER_S && !ended) {
        return Some(format!(
            "sync's standing is {} min old: is sync still running?",
            age / 60
        ));
    }
    match s.phase {
        Phase::Stopped => return Some(format!("sync stopped: {}", s.error)),
        Phase::WaitingForDecisions => {
            return Some(format!(
                "{} decision(s) wait: decide them in the TUI's Sync screen or the --decisions file",
                s.pending_decisions
            ));
        }
        _ => {}
    }
    if s.splits > 0 {
        return Some(format!(
            "{} id(s) split: roll the nodes sync names to CRD mode next",
            s.splits
        ));
    }
    if let Some(error) = f.kvstore.as_ref().and_then(|k| k.error.as_ref())
        && s.phase != Phase::CutoverReached
    {
        return Some(format!("its kvstore could not be read: {error}"));
    }
    if s.phase != Phase::CutoverReached {
        return Some(match s.waiting.is_empty() {
            true => format!("sync is {}", s.phase.as_str()),
            false => format!("sync {}", s.waiting),
        });
    }
    match &f.switch {
        Some(sw) if sw.error.is_some() => Some(format!(
            "switch-report could not be read: {}",
            sw.error.as_deref().unwrap_or_default()
        )),
        Some(sw) if !sw.safe => Some(format!(
            "the switch to operator-managed identities would draw {} label set(s) and find {} duplicate(s): run switch-prepare",
            sw.draws, sw.duplicates
        )),
        _ => None,
    }
}

/// The fleet's exit: 0 when every cluster reached cutover, else 1.
pub fn all_reached_cutover(rows: &[ClusterRow]) -> bool {
    !rows.is_empty() && rows.iter().all(ClusterRow::reached_cutover)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fleet::About;
    use crate::core::sync::{CutoverWait, SyncStatus};

    fn seen(status: SyncStatus, age_s: i64) -> Option<SyncSeen> {
        Some(SyncSeen {
            standing: Standing::following(&status, &About::default()),
            age_s: Some(age_s),
        })
    }

    #[test]
    fn each_cluster_says_what_needs_doing_first_and_the_exit_counts_cutover() {
        let none = ClusterRow::read("a".into(), "s".into(), ClusterFacts::default());
        assert!(none.attention.unwrap().starts_with("no sync"));
        let waiting = ClusterFacts {
            sync: seen(
                SyncStatus {
                    pending: 2,
                    kvstore_nodes: 1,
                    cutover_wait: Some(CutoverWait::Nodes(1)),
                    ..Default::default()
                },
                10,
            ),
            ..Default::default()
        };
        let row = ClusterRow::read("b".into(), "s".into(), waiting.clone());
        assert!(row.attention.unwrap().starts_with("2 decision(s) wait"));
        let stale = ClusterFacts {
            sync: waiting.sync.map(|s| SyncSeen {
                age_s: Some(STALE_AFTER_S + 60),
                ..s
            }),
            ..Default::default()
        };
        let row = ClusterRow::read("c".into(), "s".into(), stale);
        assert!(row.attention.unwrap().contains("6 min old"));
        let mut done = ClusterFacts {
            sync: seen(SyncStatus::default(), 9000).map(|s| SyncSeen {
                standing: s.standing.ended(true, None),
                ..s
            }),
            switch: Some(SwitchSeen {
                safe: false,
                draws: 3,
                duplicates: 0,
                error: None,
            }),
            ..Default::default()
        };
        let row = ClusterRow::read("d".into(), "s".into(), done.clone());
        assert!(
            row.attention
                .as_deref()
                .unwrap()
                .contains("draw 3 label set(s)")
        );
        assert!(row.reached_cutover(), "an old end is not stale");
        done.switch = None;
        let ok = ClusterRow::read("e".into(), "s".into(), done);
        assert_eq!(ok.attention, None);
        let gone = ClusterRow::unread("f".into(), "s".into(), "no answer within 5s".into());
        assert!(all_reached_cutover(std::slice::from_ref(&ok)));
        assert!(!all_reached_cutover(&[ok, gone]));
        assert!(!all_reached_cutover(&[]));
    }
}
