//! One writer per cluster: sync takes a `coordination.k8s.io/v1` Lease and writes only while
//! it holds it. A second sync (another bastion host, a colleague) follows both sides and
//! waits, saying who holds the lease, and takes over within the lease's duration when the
//! holder dies. The rules are client-go's leader election: another holder's lease counts
//! as expired only once its record has not changed for a whole lease duration on our own
//! clock (no trust in clock skew), every change is a replace at the version read (two
//! candidates cannot both win), and a holder that cannot renew within two thirds of the
//! duration stops writing before anyone else may start.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::apply::executor::WriteGate;
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

/// Who may write now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    /// Not known yet (the first answer has not come).
    Unknown,
    /// This sync holds the lease: it writes.
    Us,
    /// Another sync holds it: this one follows and waits.
    Other { holder: String },
    /// The API server refuses the lease to these credentials (403): the operator's to fix.
    Refused(String),
}

/// The running lease keeper.
pub struct LeaseKeeper {
    pub writer: watch::Receiver<Writer>,
    /// Until when this sync may write: the start of its last successful renewal plus two
    /// thirds of the lease's duration, on the monotonic clock, so it stops writing before
    /// any other sync may take over (a whole duration after the record last changed). Read
    /// at the moment of each write; a renewal that hangs never extends it.
    pub gate: WriteGate,
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

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

/// What one try found.
enum Try {
    Held,
    HeldBy(String),
}

async fn keep(
    api: LeaseApi,
    opts: LeaseOptions,
    me: String,
    (tx, gate): (watch::Sender<Writer>, WriteGate),
    mut stopped: oneshot::Receiver<()>,
) {
    let retry = Duration::from_secs(2);
    let renew_every = opts.duration / 3;
    let renew_deadline = opts.duration * 2 / 3;
    let mut seen = Observed::default();
    loop {
        // The validity counts from before the request: its answer may come late.
        let started = std::time::Instant::now();
        // A try that hangs (a dead connection) is given up in time to try again before the
        // deadline, instead of holding the loop while the lease runs out.
        let tried = tokio::time::timeout(renew_every, try_take(&api, &opts, &me, &mut seen)).await;
        let wait = match tried {
            Ok(Ok(Try::Held)) => {
                gate.set(Some(started + renew_deadline));
                tx.send_if_modified(|w| set(w, Writer::Us));
                renew_every.saturating_sub(started.elapsed())
            }
            Ok(Ok(Try::HeldBy(holder))) => {
                gate.set(None);
                tx.send_if_modified(|w| set(w, Writer::Other { holder }));
                retry
            }
            Ok(Err(e)) if e.code() == Some(403) => {
                gate.set(None);
                tx.send_if_modified(|w| set(w, Writer::Refused(e.to_string())));
                return;
            }
            // Unreachable, failing or hanging: the gate closes on its own at the deadline.
            Ok(Err(_)) | Err(_) => retry.min(renew_every),
        };
        // Wake at the deadline too, to tell the loop that writes must stop.
        let deadline = gate.until().filter(|_| *tx.borrow() == Writer::Us);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = sleep_until_some(deadline) => {}
            _ = &mut stopped => {
                if gate.until().is_some() {
                    gate.set(None);
                    let _ = tokio::time::timeout(renew_every, give_up(&api, &me)).await;
                }
                return;
            }
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            gate.set(None);
            tx.send_if_modified(|w| set(w, Writer::Unknown));
        }
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_some(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

fn set(w: &mut Writer, new: Writer) -> bool {
    let changed = *w != new;
    *w = new;
    changed
}

/// The last version of another holder's record we saw, and since when (our clock).
#[derive(Default)]
struct Observed {
    version: String,
    since: Option<Instant>,
}

async fn try_take(
    api: &LeaseApi,
    opts: &LeaseOptions,
    me: &str,
    seen: &mut Observed,
) -> Result<Try, crate::io::k8s::RequestError> {
    let now = MicroTime(Timestamp::now());
    let secs = i32::try_from(opts.duration.as_secs()).unwrap_or(i32::MAX);
    let Some(lease) = api.get().await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(api.name.clone()),
                namespace: Some(api.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(me.to_string()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&lease).await {
            Ok(_) => Ok(Try::Held),
            // Another candidate created it first: theirs.
            Err(e) if e.is_already_exists() => Ok(Try::HeldBy("another sync".into())),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let version = lease.metadata.resource_version.clone().unwrap_or_default();
    if seen.version != version || seen.since.is_none() {
        seen.version = version;
        seen.since = Some(Instant::now());
    }
    if let Some(h) = &holder
        && h != me
    {
        let theirs = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        if seen.since.is_some_and(|s| s.elapsed() < theirs) {
            return Ok(Try::HeldBy(h.clone()));
        }
    }
    // Ours already, free, or expired: renew or take it, at the version read.
    let mut next = lease.clone();
    let s = next.spec.get_or_insert_with(LeaseSpec::default);
    if holder.as_deref() != Some(me) {
        s.acquire_time = Some(now.clone());
        s.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    s.holder_identity = Some(me.to_string());
    s.lease_duration_seconds = Some(secs);
    s.renew_time = Some(now);
    match api.replace(&next).await {
        Ok(l) => {
            seen.version = l.metadata.resource_version.unwrap_or_default();
            seen.since = Some(Instant::now());
            Ok(Try::Held)
        }
        // Someone wrote it in between (a renewal, another candidate): not ours this time.
        Err(e) if e.is_conflict() => {
            Ok(Try::HeldBy(holder.unwrap_or_else(|| "another sync".into())))
        }
        Err(e) => Err(e),
    }
}

/// Clears the holder (as client-go's release on cancel does), if it is still us.
async fn give_up(api: &LeaseApi, me: &str) -> Result<(), crate::io::k8s::RequestError> {
    let Some(mut lease) = api.get().await? else {
        return Ok(());
    };
    let s = lease.spec.get_or_insert_with(LeaseSpec::default);
    if s.holder_identity.as_deref() != Some(me) {
        return Ok(());
    }
    s.holder_identity = None;
    s.lease_duration_seconds = Some(1);
    s.renew_time = Some(MicroTime(Timestamp::now()));
    api.replace(&lease).await.map(|_| ())
}
