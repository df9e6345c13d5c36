//! Sync's standing published in its own cluster: a task that takes each status (the latest
//! replaces one not written yet), writes the ConfigMap beside the Lease when core's `Pace`
//! says so, and writes the end once more before sync returns. A write that fails is said
//! once (a warning) and tried again later: it never stops or slows sync.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::core::fleet::{About, Pace, Standing, status_name};
use crate::core::sync::SyncStatus;
use crate::io::k8s::K8sTarget;

/// How long the end may take to be written before sync returns anyway.
const END_WAIT: Duration = Duration::from_secs(5);
/// How often the task looks at whether a standing is due (the pace's own bounds are 5 s and
/// 60 s).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The publisher: its task, and the end it writes.
pub struct Publisher {
    standing: Standings,
    task: tokio::task::JoinHandle<()>,
}

/// Where sync stands, handed to the publisher's task (the latest replaces one not written).
#[derive(Clone)]
pub struct Standings {
    tx: Arc<watch::Sender<Standing>>,
    about: Arc<About>,
}

impl Standings {
    /// Where sync stands now.
    pub fn status(&self, status: &SyncStatus) {
        self.tx
            .send_replace(Standing::following(status, &self.about));
    }
}

impl Publisher {
    /// Starts publishing to `<lease>-status` in `namespace`.
    pub fn start(target: K8sTarget, namespace: String, lease: &str, about: About) -> Self {
        let (tx, rx) = watch::channel(Standing::copying(&about));
        let name = status_name(lease);
        let task = tokio::spawn(publish(target, namespace, name, rx));
        let standing = Standings {
            tx: Arc::new(tx),
            about: Arc::new(about),
        };
        Publisher { standing, task }
    }

    /// What sync hands its status to.
    pub fn standings(&self) -> Standings {
        self.standing.clone()
    }

    /// The end, written before this returns (or `END_WAIT` has passed). Every other
    /// `Standings` is gone by then (sync has returned).
    pub async fn end(self, cutover: bool, error: Option<String>) {
        let last = self.standing.tx.borrow().clone();
        self.standing.tx.send_replace(last.ended(cutover, error));
        drop(self.standing);
        let _ = tokio::time::timeout(END_WAIT, self.task).await;
    }
}

async fn publish(
    target: K8sTarget,
    namespace: String,
    name: String,
    mut rx: watch::Receiver<Standing>,
) {
    let mut pace = Pace::default();
    let mut warned = false;
    let mut open = true;
    loop {
        let mut standing = rx.borrow_and_update().clone();
        let now = Instant::now();
        if pace.due(now, &standing) {
            standing.updated = jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            match target
                .put_status_map(&namespace, &name, standing.to_data())
                .await
            {
                Ok(()) => {
                    pace.written(now, standing);
                    if warned {
                        tracing::info!(configmap = %format!("{namespace}/{name}"), "sync's standing written again");
                        warned = false;
                    }
                }
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(
                        configmap = %format!("{namespace}/{name}"),
                        error = %e,
                        "sync's standing could not be written (sync goes on; grant configmaps create, get and update in that namespace, as assets/clusterrole.yaml does)"
                    );
                }
                Err(_) => {}
            }
        }
        if !open {
            return;
        }
        // A change, or the next look (the pace's heartbeat and its at-most wait).
        tokio::select! {
            changed = rx.changed() => open = changed.is_ok(),
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}
