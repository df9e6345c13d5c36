//! One writer per cluster: sync takes a `coordination.k8s.io/v1` Lease and writes only while
//! it holds it. A second sync (another bastion host, a colleague) follows both sides and
//! waits, saying who holds the lease, and takes over within the lease's duration when the
//! holder dies. The rules (client-go's leader election) are `core::lease::Elector`'s; this
//! keeper only reads and writes the Lease, keeps the clock, and publishes who may write.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::apply::executor::WriteGate;
pub use crate::core::lease::Writer;
use crate::core::lease::keeper::{LeaseError, LeaseStore, LeaseWrite};
use crate::core::lease::{Elector, LeaseRecord, TryOutcome};
use crate::io::k8s::RequestError;
use crate::io::lease::LeaseApi;

/// Which lease, and how long a holder keeps it without renewing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    pub duration: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            namespace: "kube-system".into(),
            name: "cilium-idmig-sync".into(),
            duration: Duration::from_secs(15),
        }
    }
}

/// The running lease keeper.
pub struct LeaseKeeper {
    pub writer: watch::Receiver<Writer>,
    /// Until when this sync may write: the start of its last successful renewal plus two
    /// thirds of the lease's duration, on the monotonic clock, so it stops writing before
    /// any other sync may take over (a whole duration after the record last changed). Read
    /// at the moment of each write; a renewal that hangs never extends it.
    pub gate: WriteGate,
    /// Sent at a release; dropped with the keeper (its sync's task aborted or unwound), it
    /// ends the task the same way: the lease given up at the task's next turn, not left to
    /// lapse.
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Starts taking and renewing the lease as `identity`.
    pub fn start(api: LeaseApi, opts: LeaseOptions, identity: String) -> Self {
        let (tx, writer) = watch::channel(Writer::Unknown);
        let (stop, stopped) = oneshot::channel();
        let gate = WriteGate::default();
        let task = tokio::spawn(keep(api, opts, identity, (tx, gate.clone()), stopped));
        LeaseKeeper {
            writer,
            gate,
            stop: Some(stop),
            task,
        }
    }

    /// This sync holds the lease, valid with margin now.
    pub fn holding(&self) -> bool {
        *self.writer.borrow() == Writer::Us && self.gate.open()
    }

    /// Gives the lease up (a clean stop), so a waiting sync takes over at once.
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
    }
}

async fn keep(
    api: LeaseApi,
    opts: LeaseOptions,
    me: String,
    (tx, gate): (watch::Sender<Writer>, WriteGate),
    mut stopped: oneshot::Receiver<()>,
) {
    let mut elector = Elector::new(me, opts.duration);
    loop {
        // The validity counts from before the request: its answer may come late.
        let started = std::time::Instant::now();
        // A try that hangs (a dead connection) is given up in time to try again before the
        // deadline, instead of holding the loop while the lease runs out.
        let mut store = ApiStore {
            api: &api,
            read: None,
        };
        let renew_every = elector.renew_every();
        let tried = elector.try_take(&mut store, &std::time::Instant::now);
        let outcome = tokio::time::timeout(renew_every, tried)
            .await
            .unwrap_or(TryOutcome::Failed);
        let refused = matches!(outcome, TryOutcome::Refused(_));
        let wait = elector.tried(outcome, started, std::time::Instant::now());
        publish(&elector, &tx, &gate);
        if refused {
            return;
        }
        // Wake at the deadline too, to tell the loop that writes must stop.
        let deadline = elector.gate_until();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = sleep_until_some(deadline) => {}
            _ = &mut stopped => {
                gate.set(None);
                let mut store = ApiStore { api: &api, read: None };
                let renew_every = elector.renew_every();
                let _ = tokio::time::timeout(renew_every, elector.give_up(&mut store)).await;
                return;
            }
        }
        if elector.check_deadline(std::time::Instant::now()) {
            publish(&elector, &tx, &gate);
        }
    }
}

/// Tells the loop and the executor what the elector now says: who writes, and until when.
fn publish(elector: &Elector, tx: &watch::Sender<Writer>, gate: &WriteGate) {
    gate.set(elector.gate_until());
    tx.send_if_modified(|w| {
        let changed = w != elector.writer();
        *w = elector.writer().clone();
        changed
    });
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_some(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The Lease on the API server, as core's keeper reads and writes it: a replace is made
/// on the object read last, at its version.
struct ApiStore<'a> {
    api: &'a LeaseApi,
    read: Option<Lease>,
}

fn lease_error(e: RequestError) -> LeaseError {
    LeaseError {
        code: e.code(),
        reason: match &e {
            RequestError::Status { reason, .. } => reason.clone(),
            _ => String::new(),
        },
        text: e.to_string(),
    }
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

impl LeaseStore for ApiStore<'_> {
    async fn read(&mut self) -> Result<Option<LeaseRecord>, LeaseError> {
        self.read = self.api.get().await.map_err(lease_error)?;
        Ok(self.read.as_ref().map(|l| {
            let spec = l.spec.clone().unwrap_or_default();
            LeaseRecord {
                holder: spec.holder_identity.filter(|h| !h.is_empty()),
                duration: Duration::from_secs(
                    spec.lease_duration_seconds.unwrap_or(15).max(1) as u64
                ),
                version: l.metadata.resource_version.clone().unwrap_or_default(),
            }
        }))
    }

    async fn create(&mut self, holder: &str, duration: Duration) -> Result<String, LeaseError> {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.api.name.clone()),
                namespace: Some(self.api.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_string()),
                lease_duration_seconds: Some(seconds(duration)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        let made = self.api.create(&lease).await.map_err(lease_error)?;
        Ok(made.metadata.resource_version.unwrap_or_default())
    }

    async fn replace(&mut self, write: LeaseWrite) -> Result<String, LeaseError> {
        let Some(mut next) = self.read.take() else {
            return Err(LeaseError::unanswered(
                "the Lease was not read before its replace",
            ));
        };
        let now = MicroTime(Timestamp::now());
        let s = next.spec.get_or_insert_with(LeaseSpec::default);
        match write {
            LeaseWrite::Hold {
                holder,
                duration,
                transition,
            } => {
                if transition {
                    s.acquire_time = Some(now.clone());
                    s.lease_transitions = Some(s.lease_transitions.unwrap_or(0) + 1);
                }
                s.holder_identity = Some(holder);
                s.lease_duration_seconds = Some(seconds(duration));
            }
            LeaseWrite::Clear => {
                s.holder_identity = None;
                s.lease_duration_seconds = Some(1);
            }
        }
        s.renew_time = Some(now);
        let made = self.api.replace(&next).await.map_err(lease_error)?;
        Ok(made.metadata.resource_version.unwrap_or_default())
    }
}
