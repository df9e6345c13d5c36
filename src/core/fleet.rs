//! Where one cluster's migration stands, as its sync publishes it (a ConfigMap beside its
//! Lease, readable with kubectl) and as `fleet` reads it back: the phase, what cutover waits
//! for, the counts an operator of many clusters looks at first; and when to write it (on a
//! change, at most every few seconds, and once a minute regardless so a reader can tell a
//! quiet sync from a dead one).

pub mod row;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core::sync::{CutoverWait, SyncStatus};

/// Where a sync is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Reading both sides and writing what is missing, before following.
    Copying,
    /// Following while kvstore-mode nodes are left.
    FollowingRollout,
    /// Conflicts wait for an operator's decision.
    WaitingForDecisions,
    /// No node is left on the kvstore; cutover waits for the rest (`waiting` says what).
    CutoverWaiting,
    /// Another sync holds the Lease and writes; this one follows.
    Standby,
    /// Cutover reached: nothing left to mirror.
    CutoverReached,
    /// Ended before cutover: a clean stop or an error (`error` says which).
    Stopped,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Copying => "copying",
            Phase::FollowingRollout => "following-rollout",
            Phase::WaitingForDecisions => "waiting-for-decisions",
            Phase::CutoverWaiting => "cutover-waiting",
            Phase::Standby => "standby",
            Phase::CutoverReached => "cutover-reached",
            Phase::Stopped => "stopped",
        }
    }

    fn parse(s: &str) -> Option<Phase> {
        [
            Phase::Copying,
            Phase::FollowingRollout,
            Phase::WaitingForDecisions,
            Phase::CutoverWaiting,
            Phase::Standby,
            Phase::CutoverReached,
            Phase::Stopped,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
    }

    /// Whether an operator has something to do here (or to look at).
    pub fn needs_attention(self) -> bool {
        matches!(self, Phase::WaitingForDecisions | Phase::Stopped)
    }
}

/// What a sync publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Standing {
    pub phase: Phase,
    /// What cutover waits for, in words (empty when nothing, or not following yet).
    pub waiting: String,
    pub pending_decisions: usize,
    /// Ids split now, and split allocations found since sync started.
    pub splits: usize,
    pub splits_found: u64,
    /// Label sets held under two ids (see `SyncStatus::doubles`).
    pub doubles: usize,
    pub kvstore_nodes: usize,
    pub identities: usize,
    pub lag_p99_ms: Option<u64>,
    /// The tool's version, and where the decision log is (in the pod, for a Job).
    pub version: String,
    pub decision_log: String,
    /// Why it stopped, for `Stopped`.
    pub error: String,
    /// When it was written (RFC 3339, UTC): what a reader tells its age by.
    pub updated: String,
}

/// What every standing carries besides the status.
#[derive(Debug, Clone, Default)]
pub struct About {
    pub version: String,
    pub decision_log: String,
}

impl Standing {
    /// Where a following sync stands, from its status.
    pub fn following(status: &SyncStatus, about: &About) -> Standing {
        let phase = match &status.cutover_wait {
            _ if status.standby.is_some() => Phase::Standby,
            _ if status.pending > 0 => Phase::WaitingForDecisions,
            Some(CutoverWait::Nodes(n)) if *n > 0 => Phase::FollowingRollout,
            _ => Phase::CutoverWaiting,
        };
        Standing {
            phase,
            waiting: status
                .cutover_wait
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            pending_decisions: status.pending,
            splits: status.splits,
            splits_found: status.splits_found,
            doubles: status.doubles,
            kvstore_nodes: status.kvstore_nodes,
            identities: status.identities,
            lag_p99_ms: status.lag_p99.map(|d| d.as_millis() as u64),
            version: about.version.clone(),
            decision_log: about.decision_log.clone(),
            error: String::new(),
            updated: String::new(),
        }
    }

    /// A sync that has not followed yet.
    pub fn copying(about: &About) -> Standing {
        Standing::following(&SyncStatus::default(), about).with_phase(Phase::Copying)
    }

    /// The end: cutover reached, or stopped (`error` says why, empty for a clean stop).
    pub fn ended(mut self, cutover: bool, error: Option<String>) -> Standing {
        self.phase = if cutover {
            Phase::CutoverReached
        } else {
            Phase::Stopped
        };
        self.waiting.clear();
        self.error = error.unwrap_or_else(|| {
            if cutover {
                String::new()
            } else {
                "stopped cleanly before cutover".into()
            }
        });
        self
    }

    fn with_phase(mut self, phase: Phase) -> Standing {
        self.phase = phase;
        self
    }

    /// As the ConfigMap's data.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let mut d = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            d.insert(k.to_string(), v);
        };
        put("phase", self.phase.as_str().into());
        put("waiting", self.waiting.clone());
        put("pending-decisions", self.pending_decisions.to_string());
        put("splits", self.splits.to_string());
        put("splits-found", self.splits_found.to_string());
        put("doubles", self.doubles.to_string());
        put("kvstore-nodes", self.kvstore_nodes.to_string());
        put("identities", self.identities.to_string());
        put(
            "lag-p99-ms",
            self.lag_p99_ms.map(|l| l.to_string()).unwrap_or_default(),
        );
        put("version", self.version.clone());
        put("decision-log", self.decision_log.clone());
        put("error", self.error.clone());
        put("updated", self.updated.clone());
        d
    }

    /// Read back from a ConfigMap's data; why not, when it is not one.
    pub fn from_data(d: &BTreeMap<String, String>) -> Result<Standing, String> {
        let get = |k: &str| d.get(k).map(String::as_str).unwrap_or_default();
        let phase = Phase::parse(get("phase"))
            .ok_or_else(|| format!("phase {:?} is not one sync writes", get("phase")))?;
        let num = |k: &str| get(k).parse::<u64>().unwrap_or(0);
        Ok(Standing {
            phase,
            waiting: get("waiting").into(),
            pending_decisions: num("pending-decisions") as usize,
            splits: num("splits") as usize,
            splits_found: num("splits-found"),
            doubles: num("doubles") as usize,
            kvstore_nodes: num("kvstore-nodes") as usize,
            identities: num("identities") as usize,
            lag_p99_ms: get("lag-p99-ms").parse().ok(),
            version: get("version").into(),
            decision_log: get("decision-log").into(),
            error: get("error").into(),
            updated: get("updated").into(),
        })
    }
}

/// The ConfigMap of a sync whose Lease is `lease`: `<lease>-status`, beside it.
pub fn status_name(lease: &str) -> String {
    format!("{lease}-status")
}

/// Not written more often than this.
pub const AT_MOST_EVERY: Duration = Duration::from_secs(5);
/// Written at least this often, changed or not: a reader tells a quiet sync from one that
/// is gone by the age of `updated`.
pub const AT_LEAST_EVERY: Duration = Duration::from_secs(60);

/// When to write the standing.
#[derive(Debug, Default)]
pub struct Pace {
    last: Option<(Instant, Standing)>,
}

impl Pace {
    /// Whether `standing` is to be written now (`updated` is not compared). An end is
    /// written at once.
    pub fn due(&self, now: Instant, standing: &Standing) -> bool {
        let Some((at, last)) = &self.last else {
            return true;
        };
        let since = now.saturating_duration_since(*at);
        let changed = Standing {
            updated: String::new(),
            ..standing.clone()
        } != Standing {
            updated: String::new(),
            ..last.clone()
        };
        let end = matches!(standing.phase, Phase::CutoverReached | Phase::Stopped);
        (changed && (end || since >= AT_MOST_EVERY)) || since >= AT_LEAST_EVERY
    }

    /// It was written at `now`.
    pub fn written(&mut self, now: Instant, standing: Standing) {
        self.last = Some((now, standing));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about() -> About {
        About {
            version: "1.2.3".into(),
            decision_log: "/var/lib/cilium-idmig/rollout.jsonl".into(),
        }
    }

    #[test]
    fn the_phase_says_first_what_needs_an_operator() {
        let mut s = SyncStatus {
            kvstore_nodes: 3,
            cutover_wait: Some(CutoverWait::Nodes(3)),
            ..Default::default()
        };
        assert_eq!(
            Standing::following(&s, &about()).phase,
            Phase::FollowingRollout
        );
        s.pending = 2;
        let st = Standing::following(&s, &about());
        assert_eq!(st.phase, Phase::WaitingForDecisions);
        assert!(st.phase.needs_attention());
        assert_eq!(st.waiting, "waits for 3 kvstore-mode nodes to move");
        s.pending = 0;
        s.kvstore_nodes = 0;
        s.cutover_wait = Some(CutoverWait::Grace {
            left: Duration::from_secs(30),
        });
        assert_eq!(
            Standing::following(&s, &about()).phase,
            Phase::CutoverWaiting
        );
        s.standby = Some("other".into());
        assert_eq!(Standing::following(&s, &about()).phase, Phase::Standby);
        let end = Standing::copying(&about()).ended(false, Some("etcd refused".into()));
        assert_eq!(
            (end.phase, end.error.as_str()),
            (Phase::Stopped, "etcd refused")
        );
        let done = Standing::copying(&about()).ended(true, None);
        assert_eq!(
            (done.phase, done.error.as_str()),
            (Phase::CutoverReached, "")
        );
    }

    #[test]
    fn the_data_reads_back_as_written_and_a_stranger_is_named() {
        let mut st = Standing::following(
            &SyncStatus {
                pending: 1,
                splits: 2,
                splits_found: 5,
                doubles: 3,
                lag_p99: Some(Duration::from_millis(1500)),
                ..Default::default()
            },
            &about(),
        );
        st.updated = "2026-12-06T12:00:00Z".into();
        assert_eq!(Standing::from_data(&st.to_data()), Ok(st));
        let odd: BTreeMap<String, String> = [("phase".to_string(), "done".to_string())].into();
        assert!(Standing::from_data(&odd).unwrap_err().contains("\"done\""));
    }

    #[test]
    fn written_on_a_change_at_most_every_five_seconds_an_end_at_once_and_once_a_minute() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        let a = Standing::copying(&about());
        assert!(pace.due(t0, &a));
        pace.written(t0, a.clone());
        let stamped = Standing {
            updated: "later".into(),
            ..a.clone()
        };
        assert!(
            !pace.due(t0 + Duration::from_secs(10), &stamped),
            "no change"
        );
        let b = Standing {
            pending_decisions: 1,
            ..a.clone()
        };
        assert!(!pace.due(t0 + Duration::from_secs(1), &b), "too soon");
        assert!(pace.due(t0 + AT_MOST_EVERY, &b));
        assert!(pace.due(t0 + Duration::from_secs(1), &a.clone().ended(true, None)));
        assert!(pace.due(t0 + AT_LEAST_EVERY, &a), "the heartbeat");
    }
}
