//! One sync instance in the simulated world: the real `Machine`, and a shell that does what
//! `app::sync` does with its commands (log, then write; run the cutover check; close moot
//! conflicts once logged; read a fresh snapshot), with the world's faults, checking the
//! invariants on every command the machine gives.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

pub use super::log::{LogLine, unreleased};
use super::report::{Failure, Trace};
use super::reserver::{SimReserver, Writer};
use super::world::World;
use crate::core::kvstore::{MasterEntry, RESERVATION_NODE, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::lease::Elector;
use crate::core::outcome::Outcome;
use crate::core::planner::resume::{self, LogStep};
use crate::core::planner::{DecidedBy, Kind, Op, OpKind};
use crate::core::range::IdRange;
use crate::core::rng::Rng;
use crate::core::sync::machine::{
    Input, K8sChange, KvWatchEvent, LeaseHolder, Machine, Output, Reserve, Settings,
};
use crate::core::sync::reserve::{Unreleased, earlier_to_adopt};
use crate::core::sync::{BatchOutcome, CutoverWait};
use crate::core::verify::{Expectations, ProblemKind, verify};

/// Faults the shell meets while carrying commands out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// The log cannot be written (disk full).
    pub disk_full: bool,
    /// The API server fails every create of a batch (500s past the retry budget).
    pub server_down: bool,
    /// Now and then a batch fails on its own (a rollout in progress, not its quiet end).
    pub flaky: bool,
}

pub struct Instance {
    pub idx: usize,
    pub machine: Machine,
    pub alive: bool,
    pub kv_pos: i64,
    pub k8s_pos: u64,
    kv_connected: bool,
    k8s_connected: bool,
    k8s_expired: bool,
    pub batch: Option<Vec<Op>>,
    pub verify: Option<(BTreeMap<String, u32>, BTreeSet<String>)>,
    /// What the lease keeper last told it.
    pub told: LeaseHolder,
    /// Its lease keeper's rules (core's, as the real keeper runs them), and when it tries
    /// next.
    pub elector: Elector,
    pub next_try: Duration,
    /// Both sides as this instance was told them, change by change: an independent account
    /// of when a split begins (one id, two label sets), to hold the reports against.
    shadow: Shadow,
    /// Per id: splits begun (as the shadow saw them) and splits reported.
    occurrences: BTreeMap<u32, u32>,
    reports: BTreeMap<u32, u32>,
    /// Splits that began while this instance followed (not those already there when it
    /// started, which are conflicts of its first plan): each must be reported while it
    /// lasts.
    pub must_report: BTreeSet<u32>,
    pub cutover: Option<Duration>,
    pub ended: bool,
    /// Its reservations (`--reserve-in-kvstore`), started with the first request.
    pub reserver: Option<SimReserver>,
    /// What its log records as reserved and not released, to take over.
    earlier: Unreleased,
}

/// Instance `i` writes (or announces cutover): its gate is open, the Lease record names
/// it, and no other instance's gate is open (two instances never both write).
pub fn check_sole_writer(i: usize, world: &World, what: &str) -> Result<(), Failure> {
    let others: Vec<usize> = (0..world.gates.len())
        .filter(|&j| j != i && world.lease_valid(j))
        .collect();
    if !world.lease_valid(i) || world.lease_holder() != Some(i) || !others.is_empty() {
        return Err(Failure::new(
            "writes only while the Lease is valid, by one instance at a time",
            format!(
                "{what}: its gate open {}, the record {:?}, others whose gate is open {others:?}",
                world.lease_valid(i),
                world.lease
            ),
        ));
    }
    Ok(())
}

/// The clock the machine sees: the simulation's time after a fixed start.
pub struct Clock(pub Instant);

impl Clock {
    pub fn at(&self, t: Duration) -> Instant {
        self.0 + t
    }
}

/// How far sync's view of the kvstore may trail its view of Kubernetes and it still never
/// makes again an object whose identity both GCs took (the kvstore's first). Stated here,
/// not read from the core, so the invariant holds the core to it.
pub const KV_VIEW_LAG_RIDDEN_OUT: Duration = Duration::from_secs(2);

/// Cluster 0's range, which the machine plans in.
pub const RANGE: IdRange = IdRange {
    min: 256,
    max: 65535,
};

impl Instance {
    /// An instance started (or restarted) on the world, resuming the decisions in `log`.
    pub fn start(
        idx: usize,
        settings: Settings,
        log: &[LogLine],
        world: &World,
        clock: &Clock,
    ) -> Self {
        let steps = log.iter().filter_map(|l| match l {
            LogLine::Decision(d) => Some(LogStep::Decide(d.clone())),
            _ => None,
        });
        let machine = Machine::new(settings, resume::replay(steps));
        let mut i = Instance {
            idx,
            machine,
            alive: true,
            kv_pos: 0,
            k8s_pos: 0,
            kv_connected: false,
            k8s_connected: false,
            k8s_expired: false,
            batch: None,
            verify: None,
            told: LeaseHolder::Unknown,
            elector: Elector::new(
                super::world::lease_identity(idx),
                super::world::LEASE_DURATION,
            ),
            next_try: world.now,
            shadow: Shadow::default(),
            occurrences: BTreeMap::new(),
            reports: BTreeMap::new(),
            must_report: BTreeSet::new(),
            cutover: None,
            ended: false,
            reserver: None,
            earlier: unreleased(log),
        };
        i.fresh_round(world, None, clock.at(world.now));
        i
    }

    /// A fresh read of both sides: the machine's round starts on it, keeping `carried`.
    fn fresh_round(
        &mut self,
        world: &World,
        carried: Option<crate::core::sync::SyncState>,
        now: Instant,
    ) {
        let mut state = world.snapshot();
        let fresh = Shadow::of(&state);
        let first = carried.is_none();
        if let Some(old) = carried {
            state.carry_over(old, now);
        }
        // At a start every split there is one to report at most once; after a fresh
        // snapshot, those that began in the gap.
        for id in fresh.split_ids() {
            if first || !self.shadow.split(id) {
                *self.occurrences.entry(id).or_default() += 1;
                if !first {
                    self.must_report.insert(id);
                }
            }
        }
        self.shadow = fresh;
        let shadow = &self.shadow;
        self.must_report.retain(|id| shadow.split(*id));
        self.kv_pos = world.kv_rev;
        self.k8s_pos = world.k8s_rv;
        self.kv_connected = false;
        self.k8s_connected = false;
        self.k8s_expired = false;
        self.verify = None;
        // Reservation requests are checked like any other output (there are none here).
        let _ = self.machine.start_round(state, world.lease_valid(self.idx));
    }

    /// The next kvstore watch event, as the watch delivers it (at most `n` changes at once).
    pub fn next_kv(&mut self, world: &World, n: usize) -> KvWatchEvent {
        if !self.kv_connected {
            self.kv_connected = true;
            return KvWatchEvent::Connected;
        }
        if self.kv_pos < world.kv_compacted {
            return KvWatchEvent::Compacted {
                compact_revision: world.kv_compacted,
            };
        }
        let changes: Vec<_> = world
            .kv_log
            .iter()
            .filter(|(rev, _)| *rev > self.kv_pos)
            .take(n)
            .collect();
        let Some((last, _)) = changes.last() else {
            return KvWatchEvent::Progress {
                revision: world.kv_rev,
            };
        };
        let revision = *last;
        self.kv_pos = revision;
        KvWatchEvent::Changes {
            changes: changes.into_iter().map(|(_, c)| c.clone()).collect(),
            revision,
        }
    }

    /// The next Kubernetes watch event: a change, a bookmark, a 410 and its relist.
    pub fn next_k8s(&mut self, world: &World) -> K8sChange {
        if !self.k8s_connected {
            self.k8s_connected = true;
            return K8sChange::Connected;
        }
        if self.k8s_expired {
            self.k8s_expired = false;
            self.k8s_pos = world.k8s_rv;
            return K8sChange::Relisted {
                identities: world
                    .objects
                    .iter()
                    .map(|(id, (l, _))| (*id, l.clone()))
                    .collect(),
                resource_version: world.k8s_rv.to_string(),
            };
        }
        if self.k8s_pos < world.k8s_window {
            self.k8s_expired = true;
            return K8sChange::Expired;
        }
        match world.k8s_log.iter().find(|(rv, _)| *rv > self.k8s_pos) {
            Some((rv, ch)) => {
                self.k8s_pos = *rv;
                ch.clone()
            }
            None => K8sChange::Bookmark {
                resource_version: world.k8s_rv.to_string(),
            },
        }
    }

    /// One input to the machine; its commands carried out and checked.
    pub fn feed(
        &mut self,
        input: Input,
        world: &mut World,
        log: &mut Vec<LogLine>,
        ctx: (&Clock, &mut Rng, Faults, &mut Trace),
    ) -> Result<(), Failure> {
        let (clock, rng, faults, trace) = ctx;
        let i = self.idx;
        let now = clock.at(world.now);
        self.shadow_sees(&input);
        let settle = matches!(input, Input::Settle);
        let mut queue: VecDeque<Output> =
            self.machine.step(input, now, world.lease_valid(i)).into();
        while let Some(o) = queue.pop_front() {
            match o {
                Output::Write(mut ops) => {
                    if self.batch.is_some() {
                        return Err(Failure::new(
                            "one batch of writes at a time",
                            format!("i{i} wrote {} more while its batch was out", ops.len()),
                        ));
                    }
                    ops.sort_by_key(|o| o.target_id);
                    self.check_write(&ops, world)?;
                    for op in &ops {
                        trace.line(
                            world.now,
                            format!(
                                "i{i} write {} -> {:?} {} ({:?})",
                                op.id, op.target_id, op.label_key, op.kind
                            ),
                        );
                    }
                    if faults.disk_full {
                        // Log before act: no line, no create; the batch fails whole.
                        self.batch = None;
                        let outcome = BatchOutcome::Failed("the decision log: disk full".into());
                        queue.extend(self.machine.step(
                            Input::BatchDone { ops, outcome },
                            now,
                            world.lease_valid(i),
                        ));
                        continue;
                    }
                    for op in &ops {
                        if let Some(target) = op.target_id {
                            log.push(LogLine::Write {
                                id: op.id.clone(),
                                target,
                            });
                        }
                    }
                    self.batch = Some(ops);
                }
                Output::Reserve(r) => {
                    if !self.machine.settings().reserve_in_kvstore {
                        return Err(Failure::new(
                            "no etcd write without --reserve-in-kvstore",
                            format!("i{i} asked for {r:?}"),
                        ));
                    }
                    let may_write = world.lease_valid(i);
                    let mut writer = Writer {
                        world,
                        log,
                        may_write,
                        disk_full: faults.disk_full,
                        flaky: faults.flaky,
                        rng,
                    };
                    self.reserve(r, now, &mut writer, trace)?;
                }
                Output::ReportSplits(found) => {
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
                        trace.line(world.now, format!("i{i} split {}", f.id));
                        self.must_report.remove(&f.id);
                    }
                }
                Output::CloseMoot(moot) => {
                    let mut logged = Vec::new();
                    for (id, labels, _) in moot {
                        if faults.disk_full || (rng.chance(0.05) && !logged.is_empty()) {
                            break;
                        }
                        log.push(LogLine::Moot { id: id.clone() });
                        logged.push((id, labels));
                    }
                    queue.extend(self.machine.step(
                        Input::MootLogged(logged),
                        now,
                        world.lease_valid(i),
                    ));
                }
                Output::Moot { id, .. } => {
                    if !log
                        .iter()
                        .any(|l| matches!(l, LogLine::Moot { id: m } if *m == id))
                    {
                        return Err(Failure::new(
                            "no act without its log line first",
                            format!("i{i} closed {id} as moot without its line"),
                        ));
                    }
                    trace.line(world.now, format!("i{i} moot {id}"));
                }
                Output::Verify { reused, nowhere } => self.verify = Some((reused, nowhere)),
                Output::Cutover(report) => {
                    self.check_cutover(world)?;
                    trace.line(world.now, format!("i{i} cutover {report}"));
                    self.cutover.get_or_insert(world.now);
                }
                Output::Resnapshot => {
                    trace.line(world.now, format!("i{i} resnapshot"));
                    if self.batch.is_some() {
                        let outcome = self.execute_batch(world, log, (rng, faults, trace));
                        let ops = self.batch.take().unwrap_or_default();
                        let _ = self.machine.step(
                            Input::BatchDone { ops, outcome },
                            now,
                            world.lease_valid(i),
                        );
                    }
                    let carried = std::mem::take(&mut self.machine.state);
                    self.fresh_round(world, Some(carried), now);
                }
                Output::End(end) => {
                    trace.line(world.now, format!("i{i} end cutover={}", end.cutover));
                    self.ended = true;
                }
                Output::Report(r) => {
                    if let crate::core::sync::SyncReport::Invalid { id, labels, .. } = &r {
                        // Logged as skipped, as `app::sync` does.
                        log.push(LogLine::Outcome {
                            id: id.clone(),
                            labels: labels.clone(),
                            target: None,
                        });
                    }
                    trace.line(world.now, format!("i{i} report {r:?}"));
                }
                Output::Trouble(t) => trace.line(world.now, format!("i{i} trouble {t}")),
                Output::Note(n) => trace.line(world.now, format!("i{i} note {n}")),
                Output::Following
                | Output::Status(_)
                | Output::NodeCounts(_)
                | Output::Taken(_) => {}
            }
        }
        // A split begun is reported at the next settle (its nodes named later, by the shell).
        if settle
            && !self.ended
            && let Some(id) = self.must_report.iter().find(|id| self.shadow.split(**id))
        {
            return Err(Failure::new(
                "every split reported exactly once per occurrence",
                format!("i{i}: the split at {id} was not reported at the settle after it began"),
            ));
        }
        // What the machine says of itself matches what it did.
        if self.machine.batch_running() != self.batch.is_some()
            || self.machine.ended() != self.ended
        {
            return Err(Failure::new(
                "the machine knows its batch in flight and its end",
                format!(
                    "i{i}: batch out {} (machine: {}), ended {} (machine: {})",
                    self.batch.is_some(),
                    self.machine.batch_running(),
                    self.ended,
                    self.machine.ended()
                ),
            ));
        }
        Ok(())
    }

    /// A reservation command carried out as `app::sync` carries it out: to the queue (and
    /// on to the writer's inbox), or, at cutover, the release.
    fn reserve(
        &mut self,
        cmd: Reserve,
        now: Instant,
        w: &mut Writer<'_>,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let i = self.idx;
        let res = self
            .reserver
            .get_or_insert_with(|| SimReserver::start(w.world));
        if res.released {
            return Ok(());
        }
        match cmd {
            Reserve::AdoptEarlier => {
                let holding = self.machine.holding();
                let earlier = earlier_to_adopt(&mut self.earlier, &self.machine.state, holding);
                res.queue.adopt(earlier);
            }
            Reserve::MasterGone { id, k8s } => res.queue.master_gone(id, k8s),
            Reserve::Want { id, labels } => res.queue.want(id, labels),
            Reserve::Deleted { id } => res.queue.deleted(id),
            Reserve::ViewChanged => res.queue.view_changed(),
            Reserve::Pump => res.queue.pump(&self.machine.state, RANGE, now),
            Reserve::Release => {
                // The writer finishes what it was sent, then the release.
                res.send();
                if w.may_write {
                    check_sole_writer(i, w.world, &format!("i{i} released its reservations"))?;
                }
                res.work(w);
                trace.line(w.world.now, format!("i{i} releases its reservations"));
                return res.release(i, w);
            }
        }
        res.send();
        Ok(())
    }

    /// The invariants of a batch, as the machine gives it.
    fn check_write(&self, ops: &[Op], world: &World) -> Result<(), Failure> {
        let i = self.idx;
        check_sole_writer(i, world, &format!("i{i} wrote {} ops", ops.len()))?;
        let view = &self.machine.state.k8s;
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
                && self.kv_view_lag(world) < KV_VIEW_LAG_RIDDEN_OUT
            {
                return Err(Failure::new(
                    "never makes again an object whose identity both GCs took",
                    format!(
                        "i{i}: {} at {target} ({:?}, {:?}), its view of the kvstore {:?} behind",
                        op.label_key,
                        op.kind,
                        op.decided_by,
                        self.kv_view_lag(world)
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
    fn kv_view_lag(&self, world: &World) -> Duration {
        world
            .kv_log
            .iter()
            .position(|(rev, _)| *rev > self.kv_pos)
            .and_then(|at| world.kv_log_at.get(at))
            .map_or(Duration::ZERO, |t| world.now.saturating_sub(*t))
    }

    /// Cutover: this instance holds the Lease, and no kvstore-mode node it has seen is left.
    fn check_cutover(&self, world: &World) -> Result<(), Failure> {
        let i = self.idx;
        check_sole_writer(i, world, &format!("i{i} announced cutover"))?;
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

    /// The batch in flight, carried out by the API server: creates, never overwrites.
    pub fn execute_batch(
        &mut self,
        world: &mut World,
        log: &mut Vec<LogLine>,
        (rng, faults, trace): (&mut Rng, Faults, &mut Trace),
    ) -> BatchOutcome {
        let Some(ops) = &self.batch else {
            return BatchOutcome::Failed("no batch".into());
        };
        if faults.server_down || (faults.flaky && rng.chance(0.05)) {
            trace.line(world.now, format!("i{} batch failed", self.idx));
            return BatchOutcome::Failed("the API server answered 500".into());
        }
        let mut results = Vec::new();
        for op in ops {
            let Some(target) = op.target_id else {
                continue;
            };
            let outcome = if world.create_object(target, op.label_key.clone()) {
                world.created_by_sync.insert(target);
                Outcome::Created
            } else if world.objects.get(&target).map(|(l, _)| l) == Some(&op.label_key) {
                Outcome::AlreadyExisted
            } else {
                Outcome::Conflict
            };
            if outcome.is_serving() {
                log.push(LogLine::Outcome {
                    id: op.id.clone(),
                    labels: op.label_key.to_string(),
                    target: Some(target),
                });
            }
            results.push((target, outcome));
        }
        BatchOutcome::Done {
            results,
            halted: None,
        }
    }

    /// The cutover check: a verify of the world as it is, with what this instance's log and
    /// the machine expect.
    pub fn run_verify(
        &mut self,
        world: &World,
        log: &[LogLine],
    ) -> Option<Result<(), CutoverWait>> {
        let (reused, nowhere) = self.verify.take()?;
        let mut expect = Expectations::default();
        // As the decision log's reader does: outcomes count, decisions do not.
        for l in log {
            match l {
                LogLine::Outcome { id, labels, target } => {
                    expect.mappings.insert(id.clone(), *target);
                    expect.mapped_labels.insert(id.clone(), labels.clone());
                }
                LogLine::Moot { id } => {
                    expect.mappings.insert(id.clone(), None);
                }
                _ => {}
            }
        }
        let expect = crate::core::sync::machine::cutover_expectations(expect, &reused, &nowhere);
        let masters: Vec<MasterEntry> = world
            .masters
            .iter()
            .map(|(id, v)| MasterEntry::new(id.clone(), v.clone()))
            .collect();
        let k8s: BTreeMap<u32, LabelKey> = world
            .objects
            .iter()
            .map(|(id, (l, _))| (*id, l.clone()))
            .collect();
        let report = verify(&masters, &k8s, &expect, RANGE);
        let problems: Vec<_> = report
            .problems
            .iter()
            .filter(|p| p.problem != ProblemKind::Skipped)
            .collect();
        Some(match problems.first() {
            None => Ok(()),
            Some(p) => Err(CutoverWait::Verify {
                problems: problems.len(),
                first: format!("{} {}", p.id, p.problem.as_str()),
            }),
        })
    }
}

/// Both sides as an instance was told them.
#[derive(Debug, Default)]
struct Shadow {
    kv: BTreeMap<u32, Vec<u8>>,
    k8s: BTreeMap<u32, LabelKey>,
}

impl Shadow {
    fn of(state: &crate::core::sync::SyncState) -> Self {
        Shadow {
            kv: state
                .masters
                .iter()
                .filter_map(|(id, v)| Some((parse_id(id).ok()?, v.clone())))
                .collect(),
            k8s: state.k8s.clone(),
        }
    }

    fn split(&self, id: u32) -> bool {
        match (self.kv.get(&id), self.k8s.get(&id)) {
            (Some(v), Some(l)) => valid_label_key(v).is_ok_and(|kv| kv != l.as_str()),
            _ => false,
        }
    }

    fn split_ids(&self) -> Vec<u32> {
        self.k8s
            .keys()
            .copied()
            .filter(|id| self.split(*id))
            .collect()
    }
}

impl Instance {
    /// The shadow takes an input in, change by change, counting each split that begins.
    fn shadow_sees(&mut self, input: &Input) {
        let mut touched: Vec<(u32, bool)> = Vec::new();
        let mut apply = |shadow: &mut Shadow, id: u32, f: &mut dyn FnMut(&mut Shadow)| {
            let before = shadow.split(id);
            f(shadow);
            touched.push((id, !before && shadow.split(id)));
        };
        match input {
            Input::Kv(KvWatchEvent::Changes { changes, .. }) => {
                for c in changes {
                    if let crate::core::sync::KvChange::Master { id, value, .. } = c
                        && let Ok(id) = parse_id(id)
                    {
                        apply(&mut self.shadow, id, &mut |s| match value {
                            Some(v) => {
                                s.kv.insert(id, v.clone());
                            }
                            None => {
                                s.kv.remove(&id);
                            }
                        });
                    }
                }
            }
            Input::K8s(K8sChange::Upsert { id, labels, .. }) => {
                apply(&mut self.shadow, *id, &mut |s| {
                    s.k8s.insert(*id, labels.clone());
                });
            }
            Input::K8s(K8sChange::Deleted { id, .. }) => {
                apply(&mut self.shadow, *id, &mut |s| {
                    s.k8s.remove(id);
                });
            }
            Input::K8s(K8sChange::Relisted { identities, .. }) => {
                let ids: BTreeSet<u32> = identities
                    .keys()
                    .chain(self.shadow.k8s.keys())
                    .copied()
                    .collect();
                let before: BTreeSet<u32> = ids
                    .iter()
                    .copied()
                    .filter(|id| self.shadow.split(*id))
                    .collect();
                self.shadow.k8s = identities.clone();
                for id in ids {
                    touched.push((id, !before.contains(&id) && self.shadow.split(id)));
                }
            }
            Input::BatchDone {
                ops,
                outcome: BatchOutcome::Done { results, .. },
            } => {
                // What sync created is in its view at once (before the watch says so).
                for (t, o) in results {
                    if let Some(op) = ops.iter().find(|op| op.target_id == Some(*t))
                        && matches!(o, Outcome::Created | Outcome::AlreadyExisted)
                    {
                        let labels = op.label_key.clone();
                        apply(&mut self.shadow, *t, &mut |s| {
                            s.k8s.insert(*t, labels.clone());
                        });
                    }
                }
            }
            _ => {}
        }
        for (id, began) in touched {
            if began {
                *self.occurrences.entry(id).or_default() += 1;
                self.must_report.insert(id);
            } else if !self.shadow.split(id) {
                self.must_report.remove(&id);
            }
        }
    }
}

/// How often, in simulated time, the shell ticks (as `SyncOptions` does).
pub const SETTLE: Duration = Duration::from_millis(100);
pub const STATUS: Duration = Duration::from_secs(1);
