//! Sync's reservations in the kvstore (`--reserve-in-kvstore`, off by default): every
//! `CiliumIdentity` in range whose id the kvstore does not hold (objects CRD-mode agents
//! created, sync's own remap targets) is reserved there, so that a kvstore-mode agent's pool
//! drops the id and an agent allocating the same labels finds and reuses it: split
//! allocations are prevented instead of reported. Each write and delete is a decision-log
//! line and counted; the lease is kept alive, revoked at cutover (or on a clean stop with
//! `--release-reservations`), and then each master key written is deleted if it is unchanged
//! and no node uses it. A killed sync leaves its keys to lapse with the lease, unless it is
//! restarted: the decision log records each reservation's revision, and the restarted sync
//! takes over those still as written (`note_reservations`, `Reservations::adopt`).
//!
//! The reservations live in a task of their own (`ReservationTask`): an etcd write can take
//! up to the client's timeout on a stalled server, and sync's loop must keep following both
//! watches meanwhile. The loop queues what to reserve; the task writes one batch at a time
//! and replies; what arrives meanwhile gathers for the next batch. What to reserve, when,
//! and what each answer changes are `core::sync::reserve`'s rules (`Queue`, `Ledger`); this
//! module carries them out and logs each write before it is made.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::config::ServiceConfig;
use super::metrics::Metrics;
use crate::apply::executor::WriteGate;
use crate::core::labels::LabelKey;
use crate::core::sync::reserve::writer::{KvWrites, Released, Reserved, WriteLine, Writer};
pub use crate::core::sync::reserve::{Earlier, Reply, Said, Unreleased};
use crate::core::sync::reserve::{KeepAlive, Request};
use crate::error::{Error, Result};
use crate::io::kv_source::KvFollower;
use crate::io::reservation::Reserver;

/// What sync holds in the kvstore (core's `Writer`), and the IO it writes through.
pub struct Reservations {
    writer: Writer,
    io: EtcdWrites,
}

/// The writer's IO in the binary: etcd (or the demo's in-memory kvstore), the decision log
/// on disk, the Lease's write gate and the metrics.
struct EtcdWrites {
    reserver: Reserver,
    prefix: String,
    /// Writes only while this is open (sync's lease, valid with margin): two syncs never
    /// both write, here as in Kubernetes.
    gate: Option<WriteGate>,
    cfg: Arc<ServiceConfig>,
    metrics: Arc<Metrics>,
}

impl KvWrites for EtcdWrites {
    fn may_write(&self) -> bool {
        self.gate.as_ref().is_none_or(|g| g.open())
    }

    fn log(&mut self, line: WriteLine) -> std::result::Result<(), String> {
        self.cfg
            .log
            .append(line.record())
            .map_err(|e| e.to_string())
    }

    fn counted(&mut self, n: u64, held: usize) {
        self.metrics.kvstore_writes.inc_by(n);
        self.metrics.kvstore_reservations.set(held as i64);
    }

    async fn grant(&mut self) -> std::result::Result<i64, String> {
        self.reserver.grant_lease().await.map_err(|e| e.to_string())
    }

    async fn keep_alive(&mut self, lease: i64) -> std::result::Result<bool, String> {
        self.reserver
            .keep_alive(lease)
            .await
            .map_err(|e| e.to_string())
    }

    async fn reserve(
        &mut self,
        id: u32,
        labels: &LabelKey,
        lease: i64,
    ) -> std::result::Result<Reserved, String> {
        self.reserver
            .reserve(&self.prefix, id, labels.as_bytes(), lease)
            .await
            .map_err(|e| e.to_string())
    }

    async fn restore(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
        lease: i64,
    ) -> std::result::Result<bool, String> {
        self.reserver
            .restore(&self.prefix, id, labels.as_bytes(), revision, lease)
            .await
            .map_err(|e| e.to_string())
    }

    async fn unreserve(&mut self, labels: &LabelKey) -> std::result::Result<bool, String> {
        self.reserver
            .unreserve(&self.prefix, labels.as_bytes())
            .await
            .map_err(|e| e.to_string())
    }

    async fn master_revision(&mut self, id: u32) -> Option<i64> {
        self.reserver
            .master_revision(&self.prefix, id)
            .await
            .ok()
            .flatten()
    }

    async fn revoke(&mut self, lease: i64) -> std::result::Result<(), String> {
        self.reserver.revoke(lease).await.map_err(|e| e.to_string())
    }

    async fn release(
        &mut self,
        id: u32,
        labels: &LabelKey,
        revision: i64,
    ) -> std::result::Result<Released, String> {
        self.reserver
            .release(&self.prefix, id, labels.as_bytes(), revision)
            .await
            .map_err(|e| e.to_string())
    }
}

impl Reservations {
    /// Checks that these credentials may write under the prefix (a key of the tool's own,
    /// deleted at once) and takes a lease; the task keeps it alive (`ReservationTask`).
    pub async fn start(
        conn: &KvFollower,
        prefix: &str,
        cfg: Arc<ServiceConfig>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let reserver = conn.reserver();
        reserver.probe_write(prefix).await?;
        let lease = reserver.grant_lease().await?;
        Ok(Reservations {
            writer: Writer::new(lease),
            io: EtcdWrites {
                reserver,
                prefix: prefix.to_string(),
                gate: None,
                cfg,
                metrics,
            },
        })
    }

    /// Master keys written (their `value/` key may have gone with the object since).
    pub fn masters_written(&self) -> usize {
        self.writer.masters_written()
    }

    /// Writes only while `gate` is open (sync's lease).
    pub fn gate_writes(&mut self, gate: WriteGate) {
        self.io.gate = Some(gate);
    }

    /// Revokes the lease, then deletes each master key written that is unchanged and
    /// unused (core's `Writer::release`); how many were deleted.
    pub async fn release(mut self) -> Result<usize> {
        self.writer
            .release(&mut self.io)
            .await
            .map_err(Error::Config)
    }
}

pub use crate::core::sync::reserve::note_reservations;

/// Batches the channel to the writer holds: the one in flight (the queue sends the next
/// only once it is answered) and the last one at the release.
const BATCHES_IN_FLIGHT: usize = 2;

/// Answers the writer may have ready before the loop takes them (a batch's and a few
/// keep-alives'); past that the writer waits, never the loop.
const REPLIES_READY: usize = 16;

/// Sync's reservations, written by a task of their own (see the module's comment).
pub struct ReservationTask {
    requests: mpsc::Sender<Vec<Request>>,
    replies: mpsc::Receiver<Reply>,
    task: JoinHandle<Reservations>,
}

/// What the loop hears from the writer.
#[derive(Debug)]
pub enum Heard {
    Reply(Reply),
    /// The writer's task ended on its own (it panicked): nothing more is reserved, and
    /// sync ends with why rather than carry on unprotected.
    Gone(String),
}

impl ReservationTask {
    /// Hands the reservations to a task of their own.
    pub fn spawn(mut r: Reservations) -> Self {
        let (requests, mut rx) = mpsc::channel::<Vec<Request>>(BATCHES_IN_FLIGHT);
        let (reply_tx, replies) = mpsc::channel::<Reply>(REPLIES_READY);
        let task = tokio::spawn(async move {
            // Core's schedule, which the simulation keeps too.
            let mut keep_alive = KeepAlive::from(std::time::Instant::now());
            loop {
                let at = tokio::time::Instant::from_std(keep_alive.next());
                let reply = tokio::select! {
                    batch = rx.recv() => match batch {
                        // The loop is gone (the sync ended): the reservations go back.
                        None => return r,
                        Some(batch) => Some(r.writer.handle(batch, &mut r.io).await),
                    },
                    () = tokio::time::sleep_until(at) => {
                        if keep_alive.due(std::time::Instant::now()) {
                            r.writer.tick(&mut r.io).await
                        } else {
                            None
                        }
                    }
                };
                if let Some(reply) = reply {
                    // The loop takes replies as they come; gone, it asks for nothing more.
                    let _ = reply_tx.send(reply).await;
                }
            }
        });
        ReservationTask {
            requests,
            replies,
            task,
        }
    }

    /// Sends the batch the shell's queue asks for, without waiting: the queue keeps one in
    /// flight, so there is always room. A refusal is never waited on: a closed channel is
    /// the writer gone, which `next_reply` hears and ends sync with; a full one would be a
    /// broken promise of the queue's, logged as such.
    pub fn send(&self, batch: Vec<Request>) {
        if let Err(e) = self.requests.try_send(batch) {
            tracing::error!(
                error = %e,
                "the reservation writer's channel refused a batch (one batch in flight leaves room for it; if the writer is gone, sync ends saying so)"
            );
        }
    }

    /// Stops taking requests and waits (up to `wait`) for the writes in flight; the
    /// reservations come back to be released, or `None` if the kvstore did not answer in time
    /// (they lapse with the lease).
    pub async fn finish(self, wait: Duration) -> Option<Reservations> {
        let ReservationTask { requests, task, .. } = self;
        drop(requests);
        let abort = task.abort_handle();
        match tokio::time::timeout(wait, task).await {
            Ok(Ok(r)) => Some(r),
            Ok(Err(_)) => None,
            Err(_) => {
                abort.abort();
                None
            }
        }
    }
}

/// The writer's next answer; never, without reservations. A writer whose task ended is
/// taken away and heard as `Gone`, with why.
pub async fn next_reply(task: &mut Option<ReservationTask>) -> Heard {
    let Some(t) = task else {
        return std::future::pending().await;
    };
    if let Some(reply) = t.replies.recv().await {
        return Heard::Reply(reply);
    }
    match task.take() {
        Some(t) => Heard::Gone(why_ended(t.task).await),
        None => std::future::pending().await,
    }
}

/// Why a task ended that was to run until asked to stop: its panic's message.
async fn why_ended<T>(task: JoinHandle<T>) -> String {
    let why = match task.await {
        Ok(_) => "it ended unasked".to_string(),
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned());
            format!(
                "it panicked: {}",
                text.unwrap_or_else(|| "no message".into())
            )
        }
        Err(e) => e.to_string(),
    };
    format!(
        "sync stops: the kvstore reservation writer stopped ({why}), so nothing more would be reserved. This is a bug: start sync again (it takes over what was reserved) and report it with the log"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::planner::Kind;
    use crate::io::decision_log::{LogContents, Record};

    #[test]
    fn a_reservation_released_since_is_not_taken_over_again_and_one_made_again_is() {
        let line = |id: &str, action: &str, revision: Option<i64>| {
            let mut r = Record::new(id, "k8s:app=a;", Kind::Create, action.into(), None);
            r.action = Some(action.into());
            r.kvstore_revision = revision;
            r
        };
        let log = LogContents {
            records: vec![
                line("300", "reserve-in-kvstore", Some(7)),
                line("301", "reserve-in-kvstore", Some(8)),
                // Released at a cutover (deleted, or kept for a node that used it).
                line("300", "release-reservation", None),
                line("301", "release-reservation", None),
                // A node came back: 301 reserved again.
                line("301", "reserve-in-kvstore", Some(12)),
                // A line about a reservation that was only announced is no reservation.
                line("302", "reserving", None),
            ],
            ..LogContents::default()
        };
        let mut made = Unreleased::new();
        note_reservations(&mut made, &log);
        assert_eq!(made, Unreleased::from([(301, ("k8s:app=a;".into(), 12))]));
    }

    #[tokio::test]
    async fn a_writer_that_panicked_is_heard_as_gone_with_its_message() {
        let task = tokio::spawn(async { panic!("ledger out of step") });
        let why = why_ended::<()>(task).await;
        assert!(
            why.contains(
                "the kvstore reservation writer stopped (it panicked: ledger out of step)"
            ),
            "{why}"
        );
        assert!(why.contains("start sync again"), "{why}");
    }

    #[tokio::test]
    async fn the_loop_hears_a_dead_writer_once_and_then_no_more() {
        let (requests, _rx) = mpsc::channel(BATCHES_IN_FLIGHT);
        let (reply_tx, replies) = mpsc::channel(REPLIES_READY);
        let task: JoinHandle<Reservations> = tokio::spawn(async move {
            let _replies = reply_tx;
            panic!("ledger out of step")
        });
        let mut task = Some(ReservationTask {
            requests,
            replies,
            task,
        });
        match next_reply(&mut task).await {
            Heard::Gone(why) => assert!(why.contains("ledger out of step"), "{why}"),
            Heard::Reply(r) => panic!("expected the writer gone, got {r:?}"),
        }
        assert!(task.is_none(), "taken away: the loop no longer waits on it");
    }

    fn reservation(id: u32, labels: &str, action: &'static str, revision: Option<i64>) -> Record {
        WriteLine {
            id,
            labels: labels.into(),
            action,
            kvstore: String::new(),
            revision,
        }
        .record()
    }

    #[test]
    fn a_restart_takes_over_what_was_reserved_and_not_released_at_the_revision_last_written() {
        let first = LogContents {
            records: vec![
                reservation(4000, "k8s:app=a;", "reserve-in-kvstore", Some(10)),
                reservation(4001, "k8s:app=b;", "reserve-in-kvstore", Some(11)),
                reservation(4002, "k8s:app=c;", "reserve-in-kvstore", Some(12)),
                // Found held by another: nothing written, no revision.
                reservation(4003, "k8s:app=d;", "reserve-in-kvstore", None),
                // Its object went: the master key is still the tool's.
                reservation(4001, "k8s:app=b;", "unreserve", None),
            ],
            ..Default::default()
        };
        let second = LogContents {
            records: vec![
                reservation(4000, "k8s:app=a;", "release-reservation", None),
                // Taken over by a restart: the same master key, the revision carried on.
                reservation(4002, "k8s:app=c;", "reserve-in-kvstore", Some(12)),
                // Written again after Cilium's GC removed it: the newer revision counts.
                reservation(4000, "k8s:app=a;", "reserve-in-kvstore", Some(20)),
            ],
            ..Default::default()
        };
        let mut made = Unreleased::new();
        note_reservations(&mut made, &first);
        note_reservations(&mut made, &second);
        let got: Vec<(u32, &str, i64)> = made
            .iter()
            .map(|(id, (l, rev))| (*id, l.as_str(), *rev))
            .collect();
        assert_eq!(
            got,
            [
                (4000, "k8s:app=a;", 20),
                (4001, "k8s:app=b;", 11),
                (4002, "k8s:app=c;", 12),
            ]
        );
    }
}
