//! The simulated world as the shell's IO (`SimIo`): the log, the writes, the checks, the
//! split reports and the reservation writer carried out against the world with its faults,
//! and every write checked against the world's truth as the shell makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::shadow::Shadow;
use crate::core::executor::record;
use crate::core::kvstore::{RESERVATION_NODE, parse_id};
use crate::core::labels::valid_label_key;
use crate::core::planner::resume::LogStep;
use crate::core::planner::{DecidedBy, Kind, Op, OpKind};
use crate::core::range::IdRange;
use crate::core::rng::Rng;
use crate::core::sync::failure::{Fault, Path};
use crate::core::sync::machine::{K8sChange, SplitFound};
use crate::core::sync::reserve::Request;
use crate::core::sync::shell::{self, Event, Failed, Line};
use crate::sim::log::{SimLog, decisions_in_force, from_a_screen};
use crate::sim::report::{Failure, Trace};
use crate::sim::reserver::{SimKv, SimReservations};
use crate::sim::world::World;

/// How far sync's view of the kvstore may trail its view of Kubernetes and it still never
/// makes again an object whose identity both GCs took (the kvstore's first). Stated here,
/// not read from the core, so the invariant holds the core to it.
pub const KV_VIEW_LAG_RIDDEN_OUT: Duration = Duration::from_secs(2);

/// Cluster 0's range, which the machine plans in.
pub const RANGE: IdRange = IdRange {
    min: 256,
    max: 65535,
};

/// Faults the shell meets while carrying commands out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// The log cannot be written (disk full).
    pub disk_full: bool,
    /// The API server fails every create of a batch (500s past the retry budget).
    pub server_down: bool,
    /// Now and then a batch fails on its own (a rollout in progress, not its quiet end).
    pub flaky: bool,
    /// The API server refuses creates (403: a rule of sync's ClusterRole taken away), until
    /// the operator grants it again and starts the sync that ended on it.
    pub creates_refused: bool,
    /// The API server refuses the Lease (403: the rule of sync's Lease Role taken away),
    /// until the operator grants it again and starts the syncs that ended on it.
    pub lease_refused: bool,
    /// The API server refuses the list of CiliumIdentities (403: the ClusterRole's list
    /// rule taken away): a fresh read is refused, until granted again.
    pub lists_refused: bool,
    /// The API server refuses the watch of CiliumIdentities (403: the ClusterRole's watch
    /// rule taken away), until granted again.
    pub watches_refused: bool,
    /// An admission webhook denies the create of some ids (a third of them), in its own
    /// words, until the operator changes its rule and starts sync again.
    pub webhook_denies: bool,
    /// etcd refuses the read of the identities prefix (its role's read permission taken
    /// away): a fresh read's snapshot is refused, until granted again.
    pub kv_reads_refused: bool,
}

impl Faults {
    /// What a fresh read meets now (as the binary reads: Kubernetes' list, then the
    /// kvstore's snapshot), as the binary hands it to the shell: `None` when it succeeds.
    pub fn on_read(&self) -> Option<Failed> {
        let list = "listing ciliumidentities.cilium.io";
        if self.lists_refused {
            let error = "403 Forbidden: ciliumidentities.cilium.io is forbidden: cannot list";
            Some(failed(Path::K8sList, Fault::forbidden(), list, error))
        } else if self.server_down {
            let error = "the API server answered 503";
            Some(failed(Path::K8sList, Fault::outage(), list, error))
        } else if self.kv_reads_refused {
            let refused = Fault {
                refused: true,
                ..Fault::default()
            };
            let error = "etcdserver: permission denied";
            Some(failed(Path::KvRead, refused, "reading the kvstore", error))
        } else {
            None
        }
    }

    /// What the Kubernetes watch meets now, if it fails: refused while its rule is taken
    /// away, cut off (now and then) while the API server is down.
    pub fn on_k8s_watch(&self, rng: &mut Rng) -> Option<Failed> {
        let watch = "watching ciliumidentities.cilium.io";
        if self.watches_refused {
            let error = "403 Forbidden: ciliumidentities.cilium.io is forbidden: cannot watch";
            Some(failed(Path::K8sWatch, Fault::forbidden(), watch, error))
        } else if self.server_down && rng.chance(0.3) {
            let error = "the API server answered 503";
            Some(failed(Path::K8sWatch, Fault::outage(), watch, error))
        } else {
            None
        }
    }
}

/// A failure as the binary's reads and watches hand it to the shell.
pub fn failed(path: Path, fault: Fault, doing: &str, error: &str) -> Failed {
    Failed {
        path,
        fault,
        doing: doing.into(),
        error: error.into(),
        trouble: format!("{error}; {doing} again"),
    }
}

/// The simulated world as the shell's IO, for one call: each call carried out against the
/// world (with its faults) and checked; the first invariant broken is kept in `failure`.
pub struct SimIo<'a> {
    pub(super) idx: usize,
    pub(super) world: &'a mut World,
    pub(super) log: &'a SimLog,
    pub(super) rng: &'a mut Rng,
    pub(super) faults: Faults,
    pub(super) trace: &'a mut Trace,
    pub(super) reserving: bool,
    pub(super) kv_pos: i64,
    pub(super) k8s_pos: u64,
    pub(super) batch: &'a mut Option<Vec<Op>>,
    pub(super) batch_unlogged: &'a mut bool,
    pub(super) verify: &'a mut Option<(BTreeMap<String, u32>, BTreeSet<String>)>,
    pub(super) reserver: &'a mut Option<SimReservations>,
    pub(super) shadow: &'a Shadow,
    pub(super) occurrences: &'a BTreeMap<u32, u32>,
    pub(super) reports: &'a mut BTreeMap<u32, u32>,
    pub(super) must_report: &'a mut BTreeSet<u32>,
    /// Splits handed over, their nodes still to be named (`Instance::name_splits`).
    pub(super) naming: &'a mut Vec<SplitFound>,
    pub(super) cutover: &'a mut Option<Duration>,
    /// When the instance last said the reservations met trouble.
    pub(super) reserve_trouble: &'a mut Option<Duration>,
    pub(super) failure: Option<Failure>,
}

impl SimIo<'_> {
    fn fail(&mut self, r: Result<(), Failure>) {
        if let Err(f) = r {
            self.failure.get_or_insert(f);
        }
    }

    fn line(&mut self, text: impl std::fmt::Display) {
        self.trace.line(self.world.now, text);
    }

    /// A batch handed over: checked, traced, its decisions logged before anything is made
    /// (a full disk fails it whole).
    fn start_batch(&mut self, mut ops: Vec<Op>) -> Result<(), Failure> {
        let i = self.idx;
        if self.batch.is_some() {
            return Err(Failure::new(
                "one batch of writes at a time",
                format!("i{i} wrote {} more while its batch was out", ops.len()),
            ));
        }
        ops.sort_by_key(|o| o.target_id);
        self.check_write(&ops)?;
        for op in &ops {
            let text = format!(
                "i{i} write {} -> {:?} {} ({:?})",
                op.id, op.target_id, op.label_key, op.kind
            );
            self.line(text);
        }
        // The binary's `log_decisions`: each write's decision line before any write starts;
        // the first line the disk refuses fails the batch whole.
        let writer = self.log.at(self.world.now, self.faults.disk_full);
        *self.batch_unlogged = ops
            .iter()
            .filter(|op| op.op.writes())
            .any(|op| writer.append(record(op, None)).is_err());
        *self.batch = Some(ops);
        Ok(())
    }

    /// Splits reported: each at most once per occurrence the shadow saw begin.
    fn splits_reported(&mut self, found: Vec<SplitFound>) -> Result<(), Failure> {
        let i = self.idx;
        for f in found {
            let reports = self.reports.entry(f.id).or_default();
            *reports += 1;
            let began = self.occurrences.get(&f.id).copied().unwrap_or(0);
            if *reports > began {
                return Err(Failure::new(
                    "every split reported exactly once per occurrence",
                    format!(
                        "i{i} reported the split at {} {} times; it began {began} times",
                        f.id, reports
                    ),
                ));
            }
            self.line(format_args!("i{i} split {}", f.id));
            self.must_report.remove(&f.id);
            self.naming.push(f);
        }
        Ok(())
    }

    /// Cutover: the writer finishes what it was sent, then releases (only while the gate is
    /// open), checked.
    fn released(&mut self) -> Result<(), Failure> {
        let i = self.idx;
        let may_write = self.world.lease_valid(i);
        let Some(res) = self.reserver.as_mut() else {
            return Ok(());
        };
        let mut w = SimKv {
            world: &mut *self.world,
            log: self.log,
            may_write,
            disk_full: self.faults.disk_full,
            flaky: self.faults.flaky,
            rng: &mut *self.rng,
            idx: i,
            violation: None,
            done: Vec::new(),
        };
        res.work(&mut w)?;
        self.trace
            .line(w.world.now, format_args!("i{i} releases its reservations"));
        res.release(i, &mut w)
    }

    /// The invariants of a batch, as the shell hands it over, held against the view the
    /// instance was told (the shadow), not the machine's own.
    fn check_write(&self, ops: &[Op]) -> Result<(), Failure> {
        let world = &*self.world;
        let i = self.idx;
        world.check_sole_writer(i, &format!("i{i} wrote {} ops", ops.len()))?;
        let view = &self.shadow.k8s;
        for op in ops {
            if op.op != OpKind::Create {
                return Err(Failure::new(
                    "never updates or deletes a CiliumIdentity",
                    format!("i{i}: {:?} of {}", op.op, op.id),
                ));
            }
            let Some(target) = op.target_id else {
                return Err(Failure::new("every create has a target", format!("{op:?}")));
            };
            if !RANGE.contains(target) || valid_label_key(op.label_key.as_bytes()).is_err() {
                return Err(Failure::new(
                    "never a malformed entry or an id outside the range",
                    format!("i{i}: {} at {target}: {}", op.id, op.label_key),
                ));
            }
            // The kvstore's GC took the identity before the cluster's took its object: made
            // again at its own id, the object would outlive its identity (and later be a
            // split sync made itself). Only a view of the kvstore trailing by more than sync
            // is meant to ride out may make it, or a view of Kubernetes that never reached
            // the object (to sync, a first create). A remap of the labels, allocated again
            // elsewhere, to the freed id is a new mapping, not this.
            if let Some((labels, made_at)) = world.both_gcs_took.get(&target)
                && *labels == op.label_key
                && parse_id(op.id.as_bytes()) == Ok(target)
                && self.k8s_pos >= *made_at
                && self.kv_view_lag() < KV_VIEW_LAG_RIDDEN_OUT
            {
                return Err(Failure::new(
                    "never makes again an object whose identity both GCs took",
                    format!(
                        "i{i}: {} at {target} ({:?}, {:?}), its view of the kvstore {:?} behind",
                        op.label_key,
                        op.kind,
                        op.decided_by,
                        self.kv_view_lag()
                    ),
                ));
            }
            let elsewhere = view
                .iter()
                .find(|(id, l)| **id != target && l.as_str() == op.label_key.as_str());
            let decided = matches!(
                op.decided_by,
                DecidedBy::Operator | DecidedBy::AcceptProposals
            );
            if let Some((at, _)) = elsewhere
                && !(op.kind == Kind::Duplicate && decided)
            {
                return Err(Failure::new(
                    "never a second object for a label set except a decided duplicate",
                    format!(
                        "i{i}: {} at {target} ({:?}, {:?}) while {} holds {}",
                        op.id, op.kind, op.decided_by, at, op.label_key
                    ),
                ));
            }
        }
        Ok(())
    }

    /// How far this instance's view of the kvstore trails the world: from the first change
    /// not yet given to it until now (zero when it has them all).
    fn kv_view_lag(&self) -> Duration {
        let world = &*self.world;
        world
            .kv_log
            .iter()
            .position(|(rev, _)| *rev > self.kv_pos)
            .and_then(|at| world.kv_log_at.get(at))
            .map_or(Duration::ZERO, |t| world.now.saturating_sub(*t))
    }

    /// The kvstore identities this instance has seen that are not carried over, as the world
    /// and its log have it (not the machine's own sets): each well-formed identity in range
    /// is served (an object holds its labels, at its id or another), skipped by a decision
    /// in force, closed as moot, or was served and its object deleted since by a GC (the
    /// cluster's call, not sync's to undo); sync's own reservations are none.
    fn unserved(&self) -> Vec<String> {
        let Ok(log) = self.log.contents() else {
            return vec!["the decision log does not read back".into()];
        };
        let decided = decisions_in_force(&[&*log]);
        let moot: BTreeSet<&str> = log
            .records
            .iter()
            .filter(|r| r.action.as_deref() == Some("moot"))
            .map(|r| r.id.as_str())
            .collect();
        let w = &*self.world;
        let held: BTreeSet<&str> = w.objects.values().map(|(l, _)| l.as_str()).collect();
        let ever_held: BTreeSet<&str> = w
            .k8s_log
            .iter()
            .filter_map(|(_, c)| match c {
                K8sChange::Upsert { labels, .. } => Some(labels.as_str()),
                _ => None,
            })
            .collect();
        w.masters
            .iter()
            .filter(|(id, labels)| {
                let Ok(n) = parse_id(id.as_bytes()) else {
                    return false;
                };
                let seen = w.master_revs.get(*id).is_some_and(|r| *r <= self.kv_pos);
                let well_formed = RANGE.contains(n) && valid_label_key(labels.as_bytes()).is_ok();
                let skipped = decided.get(*id).is_some_and(|d| {
                    d.action == crate::core::planner::Action::Skip && d.labels == **labels
                });
                seen && well_formed
                    && !w.sync_masters.contains_key(*id)
                    && !held.contains(labels.as_str())
                    && !ever_held.contains(labels.as_str())
                    && !skipped
                    && !moot.contains(id.as_str())
            })
            .map(|(id, labels)| format!("{id} ({labels}) not carried over"))
            .collect()
    }

    /// Cutover: this instance holds the Lease, and no kvstore-mode node it has seen is left.
    fn check_cutover(&self) -> Result<(), Failure> {
        let world = &*self.world;
        let i = self.idx;
        world.check_sole_writer(i, &format!("i{i} announced cutover"))?;
        // Sync's own reservations are no node's use.
        if let Some(((labels, node), (_, rev))) = world
            .values
            .iter()
            .find(|((_, node), (_, rev))| *rev <= self.kv_pos && node != RESERVATION_NODE)
        {
            return Err(Failure::new(
                "cutover never before the rollout is over",
                format!(
                    "i{i}: node {node} still uses {labels} (since revision {rev}, seen up to {})",
                    self.kv_pos
                ),
            ));
        }
        Ok(())
    }
}

impl shell::Io for SimIo<'_> {
    fn log(&mut self, lines: Vec<Line>) -> usize {
        let mut written = 0;
        for line in lines {
            // A full disk, or (now and then) a disk that fills midway through the lines.
            let full = self.faults.disk_full || (written > 0 && self.rng.chance(0.05));
            // The binary's line, through its writer.
            if self
                .log
                .at(self.world.now, full)
                .append(line.record())
                .is_err()
            {
                break;
            }
            written += 1;
        }
        written
    }

    fn say(&mut self, event: Event) {
        let i = self.idx;
        match event {
            Event::Moot { id, .. } => {
                let logged = self.log.records().iter().any(|r| {
                    r.id == id && r.action.as_deref() == Some("moot") && r.outcome.is_some()
                });
                if !logged {
                    self.fail(Err(Failure::new(
                        "no act without its log line first",
                        format!("i{i} closed {id} as moot without its line"),
                    )));
                }
                // Closed as waiting for a decision: not while one it was given is in force.
                let decided = self.log.records().iter().rev().find_map(|r| {
                    if r.id != id {
                        return None;
                    }
                    match (r.step(), r.action.as_deref()) {
                        (Some(LogStep::Decide(_)), _) if from_a_screen(r) => Some(true),
                        (Some(LogStep::Undecided { .. }), _) | (_, Some("refused")) => Some(false),
                        _ => None,
                    }
                });
                if decided == Some(true) {
                    self.fail(Err(Failure::new(
                        "a decided identity is never closed as waiting for a decision",
                        format!("i{i} closed {id} as moot with a decision on it in force"),
                    )));
                }
                self.line(format_args!("i{i} moot {id}"));
            }
            Event::Cutover(report) => {
                let checked = self.check_cutover();
                self.fail(checked);
                if let Some(unserved) = self.unserved().first() {
                    self.fail(Err(Failure::new(
                        "cutover only once every kvstore identity is carried over",
                        format!("i{i} announced cutover with {unserved}"),
                    )));
                }
                self.line(format_args!("i{i} cutover {report}"));
                // The latest: a node that comes back starts the rollout's end again.
                *self.cutover = Some(self.world.now);
            }
            Event::Conflict { id, kind, .. } => {
                self.line(format_args!("i{i} conflict {id} {kind:?}"))
            }
            Event::Invalid { id, .. } => self.line(format_args!("i{i} invalid {id}")),
            Event::Trouble(t) => {
                if t.starts_with("reserving in the kvstore") {
                    *self.reserve_trouble = Some(self.world.now);
                }
                self.line(format_args!("i{i} trouble {t}"))
            }
            Event::Note(n) => self.line(format_args!("i{i} note {n}")),
            Event::Following | Event::Status(_) | Event::NodeCounts(_) | Event::Taken(_) => {}
        }
    }

    fn write(&mut self, ops: Vec<Op>) {
        let started = self.start_batch(ops);
        self.fail(started);
    }

    fn verify(&mut self, reused: BTreeMap<String, u32>, nowhere: BTreeSet<String>) {
        *self.verify = Some((reused, nowhere));
    }

    fn report_splits(&mut self, found: Vec<SplitFound>) {
        let reported = self.splits_reported(found);
        self.fail(reported);
    }

    fn reserve(&mut self, requests: Vec<Request>) {
        if !self.reserving {
            let i = self.idx;
            self.fail(Err(Failure::new(
                "no etcd write without --reserve-in-kvstore",
                format!("i{i} asked for {requests:?}"),
            )));
            return;
        }
        if let Some(res) = self.reserver.as_mut() {
            res.send(requests);
        }
    }

    fn release(&mut self) {
        let released = self.released();
        self.fail(released);
    }
}
