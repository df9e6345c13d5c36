//! A deterministic simulation of whole rollouts, FoundationDB-style: the real sync machine
//! (`core::sync::machine`), lease keeper (`core::lease`) and reservations
//! (`core::sync::reserve`, carried out by `reserver`) in a simulated world (`world`: etcd
//! with leases, a kube-apiserver, agents that allocate as Cilium's do, nodes rolling, both
//! GCs, the Lease record), with faults (compactions, 410s, failed and lost batches, renewals
//! that fail, a second instance racing for the Lease, etcd timeouts, crashes mid-write with a
//! torn log line, a full disk, malformed entries) and an operator who decides at random; no tokio, no clock, no sockets, everything from one seed. The invariants are
//! checked on every command the machine gives (`instance`); at the end the rollout finishes
//! and cutover must come within the grace plus two checks. The same seed always gives the
//! same run and the same trace digest.

pub mod instance;
pub mod log;
pub mod report;
pub mod reserver;
pub mod world;

pub use crate::core::rng::Rng;
pub use report::{Failure, Trace};

use std::time::{Duration, Instant};

use crate::core::lease::{Claim, LeaseRecord, TryOutcome, Writer as Elected};
use crate::core::planner::Action;
use crate::core::planner::resume::LoggedDecision;
use crate::core::sync::machine::{Input, LeaseHolder, Settings, VERIFY_EVERY};
use crate::core::sync::reserve::Reply;
use instance::{Clock, Faults, Instance, LogLine, SETTLE, STATUS};
use reserver::Writer;
use world::{LABEL_SETS, LEASE_DURATION, Mode, World, labels};

/// One seed's run.
#[derive(Debug)]
pub struct SeedRun {
    pub seed: u64,
    pub steps: usize,
    pub failure: Option<Failure>,
    pub digest: u64,
    /// When cutover came, in simulated time.
    pub cutover: Option<Duration>,
    /// Master keys sync wrote as reservations (`--reserve-in-kvstore` runs), and of those,
    /// how many a release deleted.
    pub reserved: usize,
    pub released: usize,
}

/// The cutover grace the simulated syncs run with.
pub const GRACE: Duration = Duration::from_secs(10);

struct Sim {
    rng: Rng,
    world: World,
    instances: Vec<Instance>,
    logs: Vec<Vec<LogLine>>,
    settings: Settings,
    clock: Clock,
    trace: Trace,
    faults: Faults,
    /// The Lease's renewals fail for this instance (a stalled API server).
    renewals_fail: Vec<bool>,
    /// The rollout is over: no more chaos, faults or allocations in kvstore mode.
    quiet: bool,
}

/// Runs one seed: `steps` steps of chaos, then the end of the rollout.
pub fn run_seed(seed: u64, steps: usize) -> SeedRun {
    let mut rng = Rng::new(seed);
    let instances = 1 + usize::from(rng.chance(0.35));
    let nodes = 2 + rng.below(4) as usize;
    let settings = Settings {
        range: instance::RANGE,
        accept_proposals: rng.chance(0.3),
        until_cutover: false,
        reserve_in_kvstore: rng.chance(0.5),
        cutover_grace: GRACE,
        lease: "kube-system/cilium-idmig-sync".into(),
    };
    let mut world = World::new(nodes);
    world.gates = vec![None; instances];
    let logs = vec![Vec::new(); instances];
    let clock = Clock(Instant::now());
    let mut sim = Sim {
        instances: (0..instances)
            .map(|i| Instance::start(i, settings.clone(), &logs[i], &world, &clock))
            .collect(),
        rng,
        world,
        logs,
        settings,
        clock,
        trace: Trace::default(),
        faults: Faults {
            flaky: true,
            ..Faults::default()
        },
        renewals_fail: vec![false; instances],
        quiet: false,
    };
    sim.trace.line(
        Duration::ZERO,
        format!(
            "seed {seed}: {instances} instance(s), {nodes} nodes, accept proposals {}, reserve in the kvstore {}",
            sim.settings.accept_proposals, sim.settings.reserve_in_kvstore
        ),
    );
    let mut done = 0;
    let result = (|| {
        for step in 0..steps {
            done = step + 1;
            sim.chaos().map_err(|f| Failure { step, ..f })?;
        }
        sim.finish().map_err(|f| Failure { step: done, ..f })
    })();
    let failure = result.err().map(|mut f| {
        f.trace = sim.trace.last_lines();
        f
    });
    SeedRun {
        seed,
        steps: done,
        failure,
        digest: sim.trace.digest(),
        cutover: sim.instances.iter().filter_map(|i| i.cutover).min(),
        reserved: sim.world.sync_master_writes,
        released: sim
            .logs
            .iter()
            .flatten()
            .filter(|l| matches!(l, LogLine::Released { .. }))
            .count(),
    }
}

impl Sim {
    fn feed(&mut self, i: usize, input: Input) -> Result<(), Failure> {
        let inst = &mut self.instances[i];
        if !inst.alive || inst.ended {
            return Ok(());
        }
        inst.feed(
            input,
            &mut self.world,
            &mut self.logs[i],
            (&self.clock, &mut self.rng, self.faults, &mut self.trace),
        )
    }

    fn random_instance(&mut self) -> usize {
        self.rng.below(self.instances.len() as u64) as usize
    }

    /// One step of a rollout in progress.
    fn chaos(&mut self) -> Result<(), Failure> {
        let i = self.random_instance();
        match self.rng.below(100) {
            0..=19 => self.allocate(),
            20..=34 => self.deliver_kv(i),
            35..=49 => self.deliver_k8s(i),
            50..=61 => self.settle(),
            62..=66 => self.status(),
            67..=74 => self.batch_done(i),
            75..=78 => self.verify_done(i),
            79..=80 => {
                let kv: Vec<usize> = (0..self.world.nodes.len())
                    .filter(|n| self.world.nodes[*n].mode == Mode::Kvstore)
                    .collect();
                if let Some(&n) = self.rng.pick(&kv) {
                    self.trace
                        .line(self.world.now, format!("node {n} moves to CRD mode"));
                    self.world.roll(n);
                }
                Ok(())
            }
            81 => {
                self.world.kv_gc(&mut self.rng);
                Ok(())
            }
            82 => {
                if let Some(id) = self.world.both_gcs(&mut self.rng) {
                    self.trace
                        .line(self.world.now, format!("both GCs take identity {id}"));
                }
                Ok(())
            }
            83 => {
                self.k8s_gc();
                Ok(())
            }
            84..=87 => self.decide(i),
            88 => {
                self.world.kv_compacted = self.world.kv_rev;
                self.trace.line(self.world.now, "etcd compacted".into());
                Ok(())
            }
            89 => {
                self.world.k8s_window = self.world.k8s_rv;
                self.trace
                    .line(self.world.now, "watch cache window moved (410s)".into());
                Ok(())
            }
            90..=91 => {
                self.renewals_fail[i] = !self.renewals_fail[i];
                self.trace.line(
                    self.world.now,
                    format!(
                        "i{i} lease renewals {}",
                        if self.renewals_fail[i] {
                            "fail"
                        } else {
                            "work"
                        }
                    ),
                );
                Ok(())
            }
            92 => self.crash(i),
            93 => {
                self.world.malformed(&mut self.rng);
                Ok(())
            }
            95..=96 => self.reservations_done(i),
            94 => {
                if self.rng.chance(0.5) {
                    self.faults.server_down = !self.faults.server_down;
                } else {
                    self.faults.disk_full = !self.faults.disk_full;
                }
                self.trace
                    .line(self.world.now, format!("faults {:?}", self.faults));
                Ok(())
            }
            _ => {
                self.world.now += Duration::from_millis(200 + self.rng.below(3000));
                Ok(())
            }
        }
    }

    fn allocate(&mut self) -> Result<(), Failure> {
        let n = self.rng.below(self.world.nodes.len() as u64) as usize;
        let l = labels(self.rng.below(LABEL_SETS as u64) as usize);
        match self.world.nodes[n].mode {
            Mode::Kvstore => self.world.kvstore_allocate(&mut self.rng, n, &l),
            Mode::Crd => self.world.crd_allocate(&mut self.rng, &l),
        }
        Ok(())
    }

    fn deliver_kv(&mut self, i: usize) -> Result<(), Failure> {
        if !self.instances[i].alive {
            return Ok(());
        }
        let n = 1 + self.rng.below(4) as usize;
        let ev = self.instances[i].next_kv(&self.world, n);
        self.feed(i, Input::Kv(ev))
    }

    fn deliver_k8s(&mut self, i: usize) -> Result<(), Failure> {
        if !self.instances[i].alive {
            return Ok(());
        }
        let ch = self.instances[i].next_k8s(&self.world);
        self.feed(i, Input::K8s(ch))
    }

    fn settle(&mut self) -> Result<(), Failure> {
        self.world.now += SETTLE;
        for i in 0..self.instances.len() {
            self.feed(i, Input::Settle)?;
        }
        Ok(())
    }

    /// The status tick: the Lease renewed (or not, or taken over), then each instance's.
    fn status(&mut self) -> Result<(), Failure> {
        self.world.now += STATUS;
        self.lease()?;
        // Reservation leases lapse unless kept alive; each writer keeps its own.
        self.world.expire_res_leases();
        for i in 0..self.instances.len() {
            self.keep_reservations_alive(i)?;
        }
        for i in 0..self.instances.len() {
            self.feed(i, Input::Status { watching: true })?;
        }
        Ok(())
    }

    /// The lease keepers, each with core's rules (`Elector`) as the real keeper runs them:
    /// each whose wait is over reads the record and decides; then the writes land in a random
    /// order, so one can come between another's read and write (a 409). A keeper whose
    /// renewals fail gets no answer. Each is told when who holds the Lease changes for it.
    fn lease(&mut self) -> Result<(), Failure> {
        let now = self.world.now;
        let at = self.clock.at(now);
        let due: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.instances[i].alive && self.instances[i].next_try <= now)
            .collect();
        let mut tries: Vec<(usize, Option<LeaseRecord>, Claim)> = due
            .into_iter()
            .map(|i| {
                let read = self.world.lease.clone();
                let claim = self.instances[i].elector.claim(read.as_ref(), at);
                (i, read, claim)
            })
            .collect();
        if tries.len() > 1 && self.rng.chance(0.5) {
            tries.reverse();
        }
        let before = self.world.lease_holder();
        for (i, read, claim) in tries {
            let outcome = if self.renewals_fail[i] {
                TryOutcome::Failed
            } else {
                match claim {
                    Claim::HeldBy(holder) => TryOutcome::HeldBy(holder),
                    Claim::Create | Claim::Replace { .. } => self
                        .world
                        .lease_write(read.as_ref(), &world::lease_identity(i)),
                }
            };
            let wait = self.instances[i].elector.tried(outcome, at, at);
            self.instances[i].next_try = now + wait;
        }
        if let Some(j) = self.world.lease_holder()
            && before != Some(j)
        {
            self.trace.line(now, format!("i{j} takes the lease"));
        }
        for i in 0..self.instances.len() {
            let e = &mut self.instances[i].elector;
            e.check_deadline(at);
            let gate = e
                .gate_until()
                .filter(|_| *e.writer() == Elected::Us)
                .map(|until| until.saturating_duration_since(self.clock.0));
            self.world.gates[i] = gate.filter(|_| self.instances[i].alive);
        }
        let open: Vec<usize> = (0..self.instances.len())
            .filter(|&i| self.world.lease_valid(i))
            .collect();
        if open.len() > 1 {
            return Err(Failure::new(
                "writes only while the Lease is valid, by one instance at a time",
                format!(
                    "the gates of {open:?} are open at once: {:?}",
                    self.world.lease
                ),
            ));
        }
        for i in 0..self.instances.len() {
            if !self.instances[i].alive {
                continue;
            }
            let told = match self.instances[i].elector.writer() {
                Elected::Us => LeaseHolder::Us,
                Elected::Other { holder } => LeaseHolder::Other(holder.clone()),
                Elected::Unknown | Elected::Refused(_) => LeaseHolder::Unknown,
            };
            self.tell(i, told)?;
        }
        Ok(())
    }

    /// The reservations writer's turn: what the loop sent, carried out; each answer goes
    /// back to the loop's queue and on to the machine.
    fn reservations_done(&mut self, i: usize) -> Result<(), Failure> {
        if self.world.lease_valid(i) && self.instances[i].reserver.is_some() {
            instance::check_sole_writer(i, &self.world, &format!("i{i} reserved"))?;
        }
        let replies = self
            .with_writer(i, |res, w| res.work(w))
            .unwrap_or_default();
        self.answer(i, replies)
    }

    /// The keep-alive of instance `i`'s reservation lease (and what it left undone).
    fn keep_reservations_alive(&mut self, i: usize) -> Result<(), Failure> {
        let reply = self.with_writer(i, |res, w| res.tick(w)).flatten();
        self.answer(i, reply.into_iter().collect())
    }

    /// Runs `f` with instance `i`'s reservations and the writer's view of the world, if it
    /// is alive and reserves (and has not released).
    fn with_writer<T>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut reserver::SimReserver, &mut Writer<'_>) -> T,
    ) -> Option<T> {
        let may_write = self.world.lease_valid(i);
        let inst = &mut self.instances[i];
        let res = inst.reserver.as_mut().filter(|r| !r.released)?;
        if !inst.alive {
            return None;
        }
        let mut w = Writer {
            world: &mut self.world,
            log: &mut self.logs[i],
            may_write,
            disk_full: self.faults.disk_full,
            flaky: self.faults.flaky,
            rng: &mut self.rng,
        };
        Some(f(res, &mut w))
    }

    /// The writer's answers, folded into the loop's queue and told to the machine.
    fn answer(&mut self, i: usize, replies: Vec<Reply>) -> Result<(), Failure> {
        let now = self.clock.at(self.world.now);
        if let Some(res) = self.instances[i].reserver.as_mut() {
            for done in std::mem::take(&mut res.done) {
                self.trace
                    .line(self.world.now, format!("i{i} etcd: {done}"));
            }
        }
        for reply in replies {
            let Some(res) = self.instances[i].reserver.as_mut() else {
                return Ok(());
            };
            if let Some(said) = res.queue.on_reply(reply, now) {
                self.trace
                    .line(self.world.now, format!("i{i} reservations: {said:?}"));
            }
            let (held, own_masters) = (res.queue.held(), res.queue.own_masters().clone());
            self.feed(i, Input::Reservations { held, own_masters })?;
        }
        Ok(())
    }

    fn tell(&mut self, i: usize, holder: LeaseHolder) -> Result<(), Failure> {
        if self.instances[i].told == holder {
            return Ok(());
        }
        self.instances[i].told = holder.clone();
        self.feed(i, Input::Lease(holder))
    }

    fn batch_done(&mut self, i: usize) -> Result<(), Failure> {
        let inst = &mut self.instances[i];
        if !inst.alive || inst.batch.is_none() {
            return Ok(());
        }
        let faults = if self.quiet {
            Faults::default()
        } else {
            self.faults
        };
        let outcome = inst.execute_batch(
            &mut self.world,
            &mut self.logs[i],
            (&mut self.rng, faults, &mut self.trace),
        );
        let ops = inst.batch.take().unwrap_or_default();
        self.feed(i, Input::BatchDone { ops, outcome })
    }

    fn verify_done(&mut self, i: usize) -> Result<(), Failure> {
        if !self.instances[i].alive {
            return Ok(());
        }
        let Some(verdict) = self.instances[i].run_verify(&self.world, &self.logs[i]) else {
            return Ok(());
        };
        self.trace.line(
            self.world.now,
            format!(
                "i{i} verify {}",
                if verdict.is_ok() { "passes" } else { "fails" }
            ),
        );
        self.feed(i, Input::Verdict(verdict))
    }

    /// The operator's GC (see `World::k8s_gc`).
    fn k8s_gc(&mut self) {
        if let Some(id) = self.world.k8s_gc(&mut self.rng) {
            self.trace
                .line(self.world.now, format!("GC deletes object {id}"));
        }
    }

    /// The operator decides a conflict that waits: the proposal, or a skip.
    fn decide(&mut self, i: usize) -> Result<(), Failure> {
        let inst = &self.instances[i];
        if !inst.alive {
            return Ok(());
        }
        let waiting = inst.machine.state.waiting.clone();
        let Some((id, labels, _)) = self.rng.pick(&waiting).cloned() else {
            return Ok(());
        };
        let Some(item) = inst
            .machine
            .state
            .planned_items()
            .into_iter()
            .find(|it| it.id == id)
        else {
            return Ok(());
        };
        let d = if self.rng.chance(0.7) {
            LoggedDecision {
                id: id.clone(),
                labels: labels.to_string(),
                action: item.action,
                target_id: item.target_id,
            }
        } else {
            LoggedDecision {
                id: id.clone(),
                labels: labels.to_string(),
                action: Action::Skip,
                target_id: None,
            }
        };
        self.trace.line(
            self.world.now,
            format!("operator decides {id}: {:?} {:?}", d.action, d.target_id),
        );
        self.logs[i].push(LogLine::Decision(d.clone()));
        self.feed(i, Input::Decided(d))
    }

    /// An instance dies (mid-write, perhaps with a torn last log line) and starts again from
    /// its log and a fresh read.
    fn crash(&mut self, i: usize) -> Result<(), Failure> {
        let batch = self.instances[i].batch.take();
        let mut note = String::new();
        if let Some(ops) = batch {
            // Killed while the batch ran: some creates were made, and never heard of.
            let made = self.rng.below(ops.len() as u64 + 1) as usize;
            for op in ops.iter().take(made) {
                if let Some(t) = op.target_id
                    && self.world.create_object(t, op.label_key.clone())
                {
                    self.world.created_by_sync.insert(t);
                }
            }
            note = format!(" mid-write ({made} of {} made)", ops.len());
            if made == 0 && self.rng.chance(0.5) {
                // Killed while logging: the last line is torn, and the repair drops it.
                self.logs[i].pop();
                note.push_str(", last log line torn");
            }
        }
        self.trace
            .line(self.world.now, format!("i{i} crashes{note} and restarts"));
        // A dead process writes nothing; the restarted one starts its keeper afresh.
        self.world.gates[i] = None;
        self.instances[i] = Instance::start(
            i,
            self.settings.clone(),
            &self.logs[i],
            &self.world,
            &self.clock,
        );
        Ok(())
    }

    /// The end of the rollout: every node moves to CRD mode, the faults end, and events are
    /// delivered as they come; cutover must come within the grace plus two checks (and the
    /// time a Lease takes to pass, and a retry's wait).
    fn finish(&mut self) -> Result<(), Failure> {
        self.quiet = true;
        self.faults = Faults::default();
        self.renewals_fail.iter_mut().for_each(|f| *f = false);
        for n in 0..self.world.nodes.len() {
            self.world.roll(n);
        }
        self.trace
            .line(self.world.now, "the rollout is over".into());
        let start = self.world.now;
        let bound = GRACE + VERIFY_EVERY * 2 + LEASE_DURATION + crate::core::sync::RETRY_AFTER;
        let mut ticks = 0u64;
        while self.world.now < start + bound {
            for i in 0..self.instances.len() {
                // Everything the watches have, delivered.
                for _ in 0..64 {
                    let before = (self.instances[i].kv_pos, self.instances[i].k8s_pos);
                    self.deliver_kv(i)?;
                    self.deliver_k8s(i)?;
                    if (self.instances[i].kv_pos, self.instances[i].k8s_pos) == before {
                        break;
                    }
                }
                self.batch_done(i)?;
                self.verify_done(i)?;
                self.reservations_done(i)?;
            }
            self.settle()?;
            ticks += 1;
            if ticks.is_multiple_of(10) {
                self.status()?;
            }
            if let Some(holder) = self.world.lease_holder()
                && self.instances[holder].cutover.is_some()
            {
                return Ok(());
            }
        }
        Err(Failure::new(
            "cutover comes once the rollout is over",
            format!(
                "no cutover {} s after the last node moved; {}",
                bound.as_secs(),
                self.instances
                    .iter()
                    .map(|i| {
                        let wait = &i.machine.state.status.cutover_wait;
                        // The item behind the first problem, as this instance plans it.
                        let first = match wait {
                            Some(crate::core::sync::CutoverWait::Verify { first, .. }) => {
                                first.split(' ').next().unwrap_or_default().to_string()
                            }
                            _ => String::new(),
                        };
                        let item = i
                            .machine
                            .state
                            .planned_items()
                            .into_iter()
                            .find(|it| it.id == first)
                            .map(|it| {
                                format!(
                                    " ({} {:?} {:?} -> {:?}, decided {}, moot {}, reused {:?})",
                                    it.id,
                                    it.kind,
                                    it.action,
                                    it.target_id,
                                    it.decided,
                                    i.machine.state.moot.contains(&it.id),
                                    i.machine.state.reused.get(&it.id)
                                )
                            })
                            .unwrap_or_default();
                        format!("i{}: {wait:?}{item}", i.idx)
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ))
    }
}

/// Many seeds: each seed's run, in order.
pub fn run_seeds(first: u64, seeds: u64, steps: usize) -> impl Iterator<Item = SeedRun> {
    (first..first + seeds).map(move |s| run_seed(s, steps))
}

#[cfg(test)]
mod tests;
