//! A deterministic simulation of whole rollouts, FoundationDB-style: the very shell the
//! binary runs (`core::sync::shell`, over the real machine `core::sync::machine`), the very
//! Lease keeper's tries (`core::lease::keeper`, over `lease`'s simulated API server), the
//! very reservation writer (`core::sync::reserve::writer`, over `reserver`'s simulated etcd)
//! and the same rules for what a failure means (`core::sync::failure`, `core::retry`), with
//! only the IO beneath swapped for a simulated
//! world (`world`: etcd with leases, a kube-apiserver, agents that allocate as Cilium's do,
//! nodes rolling and rolling back, both GCs, the Lease record), with faults (compactions,
//! 410s, failed and lost batches, reads at a round's start that fail or are not one view,
//! renewals that fail, a second instance racing for the Lease, etcd timeouts, crashes
//! mid-write with a torn log line, clean stops, a full disk, malformed entries) and an
//! operator who
//! decides, late, and undoes; no tokio, no clock, no sockets, everything from one seed, at
//! the binary's own cadences. The invariants are checked on every call the shell makes
//! (`instance`), against the world, the log and what each instance was told, never against
//! the machine's own sets; at the end the rollout finishes and cutover must come within the
//! grace plus two checks, with every decision that reached it ended in the log. The same
//! seed always gives the same run and the same trace digest.

mod chaos;
mod decisions_file;
mod end;
mod file_state;
pub mod instance;
pub mod lease;
pub mod log;
pub mod report;
pub mod reserved;
pub mod reserver;
mod restarts;
pub mod world;

pub use crate::core::rng::Rng;
pub use report::{Failure, Trace};

use std::time::{Duration, Instant};

use crate::core::lease::Writer as Elected;
use crate::core::planner::resume::LoggedDecision;
use crate::core::planner::{Action, Kind, PlanItem};
use crate::core::sync::failure::{Fault, Path};
use crate::core::sync::machine::{Input, LeaseHolder, Settings, VERIFY_EVERY};
use crate::core::sync::reserve::{RETRY_AFTER_FAILURE, Reply};
use crate::core::sync::shell::{Failed, Turn};
use instance::{Clock, Faults, Instance, SETTLE, STATUS, SimLog};
use reserver::SimKv;
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
    /// how many a release let go (deleted, or kept for the node that uses it).
    pub reserved: usize,
    pub released: usize,
    /// The seed ran `--reserve-in-kvstore`.
    pub reserves: bool,
    /// Reservation leases that lapsed (a crashed or cut-off writer's).
    pub lapsed: usize,
    /// Clean stops that released their reservations (`--release-reservations`).
    pub releases_at_stop: usize,
    /// Batches whose creates the server refused (403), each of which ended its sync.
    pub refused_batches: usize,
    /// Creates an admission webhook denied.
    pub denied_creates: usize,
}

/// The cutover grace the simulated syncs run with.
pub const GRACE: Duration = Duration::from_secs(10);

struct Sim {
    rng: Rng,
    world: World,
    instances: Vec<Instance>,
    logs: Vec<SimLog>,
    settings: Settings,
    /// `--release-reservations`.
    release_on_stop: bool,
    clock: Clock,
    trace: Trace,
    faults: Faults,
    /// The Lease's renewals fail for this instance (a stalled API server).
    renewals_fail: Vec<bool>,
    /// The rollout is over: no more chaos, faults or allocations in kvstore mode.
    quiet: bool,
    /// Decisions made on a screen and not yet delivered to their instance (an operator
    /// reads a proposal, the world moves on, then the key is pressed).
    mail: Vec<(usize, Decision)>,
    /// What each instance owes in reservations (`reserved`).
    owed: Vec<reserved::Owed>,
    mutant: Mutant,
    /// Instances ended on a refusal so far.
    refusal_ends: usize,
    /// Clean stops that released (`--release-reservations`).
    releases_at_stop: usize,
    refused_batches: usize,
    denied_creates: usize,
    /// The decisions file every instance follows, when the seed has one.
    file: Option<file_state::DecisionsFile>,
}

/// What an operator does on a screen while sync runs.
#[derive(Debug, Clone)]
enum Decision {
    /// The item as decided on the screen.
    Decide(PlanItem),
    /// The item as it is once the decision on it is taken back.
    Undo(PlanItem),
}

/// A defect put in on purpose, to show that the checks catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    None,
    /// The reservation writer never gets what the loop asks: a sync that never reserves.
    NeverReserves,
}

/// Runs one seed: `steps` steps of chaos, then the end of the rollout.
pub fn run_seed(seed: u64, steps: usize) -> SeedRun {
    run_mutant(seed, steps, Mutant::None)
}

/// Runs one seed with `mutant` in it.
pub fn run_mutant(seed: u64, steps: usize, mutant: Mutant) -> SeedRun {
    let mut sim = match Sim::start(seed, mutant) {
        Ok(sim) => sim,
        Err(run) => return *run,
    };
    let mut done = 0;
    let result = (|| {
        for step in 0..steps {
            done = step + 1;
            sim.chaos().map_err(|f| Failure { step, ..f })?;
            sim.excuses();
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
        reserves: sim.settings.reserve_in_kvstore,
        lapsed: sim.world.res_lapsed,
        releases_at_stop: sim.releases_at_stop,
        refused_batches: sim.refused_batches,
        denied_creates: sim.denied_creates,
        reserved: sim.world.sync_master_writes,
        released: sim
            .logs
            .iter()
            .flat_map(|l| l.chain())
            .map(|l| {
                l.records()
                    .iter()
                    .filter(|r| {
                        r.action.as_deref() == Some(crate::core::sync::reserve::RELEASE_RESERVATION)
                    })
                    .count()
            })
            .sum(),
    }
}

impl Sim {
    /// The seed's world and instances, each started; a start that fails is the seed's run.
    fn start(seed: u64, mutant: Mutant) -> Result<Sim, Box<SeedRun>> {
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
        // `--release-reservations`: a clean stop releases, as cutover does.
        let release_on_stop = settings.reserve_in_kvstore && rng.chance(0.5);
        let mut world = World::new(nodes);
        world.gates = vec![None; instances];
        let logs: Vec<SimLog> = (0..instances).map(|_| SimLog::default()).collect();
        let file = file_state::DecisionsFile::of_seed(seed);
        let clock = Clock(Instant::now());
        let mut trace = Trace::default();
        let started: Result<Vec<Instance>, Failure> = (0..instances)
            .map(|i| {
                let ctx = (&clock, &mut rng, &mut trace);
                let how = (settings.clone(), release_on_stop);
                let logs = (&logs[i], file.as_ref().map(|f| &f.log));
                Instance::start(i, how, logs, &mut world, ctx)
            })
            .collect();
        let started = started.map_err(|mut f| {
            f.trace = trace.last_lines();
            Box::new(SeedRun {
                seed,
                steps: 0,
                failure: Some(f),
                digest: trace.digest(),
                cutover: None,
                reserved: world.sync_master_writes,
                released: 0,
                reserves: settings.reserve_in_kvstore,
                lapsed: 0,
                releases_at_stop: 0,
                refused_batches: 0,
                denied_creates: 0,
            })
        })?;
        let mut sim = Sim {
            instances: started,
            rng,
            world,
            logs,
            settings,
            release_on_stop,
            clock,
            trace,
            faults: Faults {
                flaky: true,
                ..Faults::default()
            },
            renewals_fail: vec![false; instances],
            quiet: false,
            mail: Vec::new(),
            owed: (0..instances).map(|_| reserved::Owed::default()).collect(),
            file,
            mutant,
            refusal_ends: 0,
            releases_at_stop: 0,
            refused_batches: 0,
            denied_creates: 0,
        };
        sim.trace.line(
            Duration::ZERO,
            format_args!(
                "seed {seed}: {instances} instance(s), {nodes} nodes, accept proposals {}, reserve in the kvstore {}, release at a stop {}",
                sim.settings.accept_proposals, sim.settings.reserve_in_kvstore, sim.release_on_stop
            ),
        );
        Ok(sim)
    }
}

impl Sim {
    fn feed(&mut self, i: usize, turn: Turn) -> Result<(), Failure> {
        let inst = &mut self.instances[i];
        if !inst.alive || inst.ended {
            return Ok(());
        }
        inst.feed(
            turn,
            &mut self.world,
            &self.logs[i],
            (&self.clock, &mut self.rng, self.faults, &mut self.trace),
        )?;
        match self.instances[i].refused_end.take() {
            Some(why) => self.refused_and_started_again(i, &why),
            None => Ok(()),
        }
    }

    /// Instance `i`'s watch failed: handed to its shell as the binary's watch task hands
    /// it, which ends sync on a refusal and rides anything else out.
    fn watch_failed(&mut self, i: usize, f: Failed) -> Result<(), Failure> {
        if self.instances[i].ended {
            return Ok(());
        }
        let refused = f.fault.refused;
        self.trace.line(
            self.world.now,
            format_args!("i{i} {}: {}", f.doing, f.error),
        );
        if !refused {
            self.instances[i].watch_cut(f.path == Path::KvWatch);
        }
        let ends = self.refusal_ends;
        self.feed(i, Turn::Failed(f))?;
        match (refused, self.refusal_ends > ends) {
            (true, false) => Err(Failure::new(
                "a refused watch ends sync (exit 2, naming what to grant)",
                format!("i{i} goes on after its watch was refused"),
            )),
            (false, true) => Err(Failure::new(
                "an outage is ridden out",
                format!("i{i} ended on a watch cut off"),
            )),
            _ => Ok(()),
        }
    }

    /// Instance `i`'s keeper was refused the Lease: told to its shell as the binary tells
    /// it, which must end sync.
    fn lease_refused(&mut self, i: usize, why: String) -> Result<(), Failure> {
        if self.instances[i].ended {
            return Ok(());
        }
        // While its fresh read waits, what it is told waits too (as in the binary's
        // channels): it ends once the read is made.
        let waits = self.instances[i].unread();
        let ends = self.refusal_ends;
        self.feed(i, Turn::LeaseRefused(why))?;
        if !waits && self.refusal_ends == ends {
            return Err(Failure::new(
                "a refused Lease ends sync (exit 2, naming what to grant)",
                format!("i{i} goes on after its Lease was refused (403)"),
            ));
        }
        Ok(())
    }

    /// Whatever excuses an instance from reserving, at any step, starts its count again.
    fn excuses(&mut self) {
        if !self.settings.reserve_in_kvstore {
            return;
        }
        for (i, inst) in self.instances.iter().enumerate() {
            if reserved::excuse(inst, &self.world, self.faults).is_some() {
                self.owed[i].excused();
            }
        }
    }

    fn random_instance(&mut self) -> usize {
        self.rng.below(self.instances.len() as u64) as usize
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
        if !self.instances[i].alive || self.instances[i].unread() {
            return Ok(());
        }
        if !self.quiet && self.rng.chance(0.02) {
            // The watch is cut off (a leader change, a stalled member): said, watched again
            // from the same revision, never the end of sync.
            let error = "etcdserver: leader changed";
            let f = instance::failed(
                Path::KvWatch,
                Fault::outage(),
                "watching the kvstore",
                error,
            );
            return self.watch_failed(i, f);
        }
        let n = 1 + self.rng.below(4) as usize;
        let ev = self.instances[i].next_kv(&self.world, n);
        self.feed(i, Turn::Input(Input::Kv(ev)))
    }

    fn deliver_k8s(&mut self, i: usize) -> Result<(), Failure> {
        if !self.instances[i].alive || self.instances[i].unread() {
            return Ok(());
        }
        if let Some(f) = self.faults.on_k8s_watch(&mut self.rng) {
            return self.watch_failed(i, f);
        }
        let ch = self.instances[i].next_k8s(&self.world);
        self.feed(i, Turn::Input(Input::K8s(ch)))
    }

    fn settle(&mut self) -> Result<(), Failure> {
        self.world.now += SETTLE;
        self.reads_due()?;
        for i in 0..self.instances.len() {
            self.feed(i, Turn::Settle { stopped: false })?;
            // Only a settle the instance could pump at counts towards what it owes.
            if self.settings.reserve_in_kvstore {
                match reserved::excuse(&self.instances[i], &self.world, self.faults) {
                    None => self.owed[i].settled(),
                    Some(_) => self.owed[i].excused(),
                }
            }
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
        self.reads_due()?;
        for i in 0..self.instances.len() {
            let watching = self.instances[i].watching();
            self.feed(i, Turn::Status { watching })?;
        }
        // The binary's follower reads the file every 5 s, as often as the status.
        self.decisions_file_tick()
    }

    /// Each read that failed is tried again once its wait is over (as the binary does).
    fn reads_due(&mut self) -> Result<(), Failure> {
        for i in 0..self.instances.len() {
            let inst = &mut self.instances[i];
            if inst.alive {
                let ctx = (&self.clock, &mut self.rng, self.faults, &mut self.trace);
                inst.read_again(&mut self.world, &self.logs[i], ctx)?;
            }
            // A refusal that waited for the read (the Lease's) ends it now.
            if let Some(why) = self.instances[i].refused_end.take() {
                self.refused_and_started_again(i, &why)?;
            }
        }
        Ok(())
    }

    /// The lease keepers' tries, core's own (`Elector::try_take`, through `lease::tries`):
    /// each whose wait is over reads the record and decides; then the writes land in the
    /// seed's order, so one can come between another's read and write (a 409). A keeper
    /// whose renewals fail gets no answer. Each is told when who holds the Lease changes.
    fn lease(&mut self) -> Result<(), Failure> {
        let now = self.world.now;
        let at = self.clock.at(now);
        let before = self.world.lease_holder();
        let fails = &self.renewals_fail;
        let keepers: Vec<_> = self
            .instances
            .iter_mut()
            .enumerate()
            .filter(|(_, inst)| inst.alive && inst.next_try <= now)
            .map(|(i, inst)| (i, &mut inst.elector, fails[i]))
            .collect();
        let reversed = keepers.len() > 1 && self.rng.chance(0.5);
        let refused = self.faults.lease_refused;
        for (i, outcome) in lease::tries(&mut self.world, keepers, at, reversed, refused)? {
            let wait = self.instances[i].elector.tried(outcome, at, at);
            self.instances[i].next_try = now + wait;
        }
        if let Some(j) = self.world.lease_holder()
            && before != Some(j)
        {
            self.trace.line(now, format_args!("i{j} takes the lease"));
        }
        for i in 0..self.instances.len() {
            let e = &mut self.instances[i].elector;
            e.check_deadline(at);
            let gate = e
                .gate_until()
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
                Elected::Unknown => LeaseHolder::Unknown,
                Elected::Refused(why) => {
                    let why = why.clone();
                    self.lease_refused(i, why)?;
                    continue;
                }
            };
            self.tell(i, told)?;
        }
        Ok(())
    }

    /// The reservations writer's turn: what the loop sent, carried out; each answer goes
    /// back to the loop's queue and on to the machine.
    fn reservations_done(&mut self, i: usize) -> Result<(), Failure> {
        if self.mutant == Mutant::NeverReserves
            && let Some(res) = self.instances[i].reserver.as_mut()
        {
            res.lose_requests();
        }
        let replies = self
            .with_writer(i, |res, w| res.work(w))
            .transpose()?
            .unwrap_or_default();
        self.answer(i, replies)?;
        if !self.settings.reserve_in_kvstore {
            return Ok(());
        }
        let excuse = reserved::excuse(&self.instances[i], &self.world, self.faults);
        let (inst, world) = (&self.instances[i], &self.world);
        self.owed[i].turn(i, excuse, || inst.unreserved(world))
    }

    /// The keep-alive of instance `i`'s reservation lease (and what it left undone), when
    /// core's schedule says it is due, as in the binary's writer task.
    fn keep_reservations_alive(&mut self, i: usize) -> Result<(), Failure> {
        let now = self.clock.at(self.world.now);
        let due = self.instances[i]
            .reserver
            .as_mut()
            .is_some_and(|r| r.keep_alive_due(now));
        if !due {
            return Ok(());
        }
        let reply = self.with_writer(i, |res, w| res.tick(w)).transpose()?;
        self.answer(i, reply.flatten().into_iter().collect())
    }

    /// Runs `f` with instance `i`'s reservations and the writer's view of the world, if it
    /// is alive and reserves (and has not released).
    fn with_writer<T>(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut reserver::SimReservations, &mut SimKv<'_>) -> T,
    ) -> Option<T> {
        let may_write = self.world.lease_valid(i);
        let inst = &mut self.instances[i];
        let res = inst.reserver.as_mut().filter(|r| !r.released)?;
        if !inst.alive {
            return None;
        }
        let mut w = SimKv {
            world: &mut self.world,
            log: &self.logs[i],
            may_write,
            disk_full: self.faults.disk_full,
            flaky: self.faults.flaky,
            rng: &mut self.rng,
            idx: i,
            violation: None,
            done: Vec::new(),
        };
        Some(f(res, &mut w))
    }

    /// The writer's answers, each handed to the shell (its queue, then the machine).
    fn answer(&mut self, i: usize, replies: Vec<Reply>) -> Result<(), Failure> {
        if let Some(res) = self.instances[i].reserver.as_mut() {
            for done in std::mem::take(&mut res.done) {
                self.trace
                    .line(self.world.now, format_args!("i{i} etcd: {done}"));
            }
        }
        for reply in replies {
            self.feed(i, Turn::Reply(reply))?;
        }
        Ok(())
    }

    fn tell(&mut self, i: usize, holder: LeaseHolder) -> Result<(), Failure> {
        if self.instances[i].told == holder {
            return Ok(());
        }
        self.instances[i].told = holder.clone();
        self.feed(i, Turn::Input(Input::Lease(holder)))
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
        let (outcome, refusals) = inst.execute_batch(
            &mut self.world,
            &self.logs[i],
            (&mut self.rng, faults, &mut self.trace),
        )?;
        let ops = inst.batch.take().unwrap_or_default();
        // Read off what the server answered, not off the outcome: a refusal the executor
        // did not carry back as one must still end sync.
        let refused = refusals > 0;
        self.refused_batches += usize::from(refused);
        if let crate::core::sync::BatchOutcome::Done { denied, .. } = &outcome {
            self.denied_creates += denied.len();
        }
        let ends = self.refusal_ends;
        self.feed(i, Turn::Input(Input::BatchDone { ops, outcome }))?;
        if refused && self.refusal_ends == ends {
            return Err(Failure::new(
                "a refused create ends sync (exit 2, naming what to grant)",
                format!("i{i} goes on after its batch was refused (403)"),
            ));
        }
        Ok(())
    }

    fn verify_done(&mut self, i: usize) -> Result<(), Failure> {
        if !self.instances[i].alive {
            return Ok(());
        }
        let full = self.faults.disk_full;
        let Some(verdict) = self.instances[i].run_verify(&self.world, &self.logs[i], full) else {
            return Ok(());
        };
        self.trace.line(
            self.world.now,
            format_args!(
                "i{i} verify {}",
                if verdict.is_ok() { "passes" } else { "fails" }
            ),
        );
        self.feed(i, Turn::Input(Input::Verdict(verdict)))
    }

    /// The operator's GC (see `World::k8s_gc`).
    fn k8s_gc(&mut self) {
        if let Some(id) = self.world.k8s_gc(&mut self.rng) {
            self.trace
                .line(self.world.now, format_args!("GC deletes object {id}"));
        }
    }

    /// The operator decides a conflict that waits, on the plan as it is now: the proposal,
    /// or a skip; now and then takes back a decision. Half reach the instance at once, the
    /// rest after the world has moved on (`deliver`), as a screen's decisions do.
    fn decide(&mut self, i: usize) -> Result<(), Failure> {
        let inst = &self.instances[i];
        if !inst.alive {
            return Ok(());
        }
        let machine = inst.shell.machine();
        if self.rng.chance(0.1) {
            let decided: Vec<LoggedDecision> =
                machine.decisions().in_force().values().cloned().collect();
            if let Some(d) = self.rng.pick(&decided).cloned() {
                // The screen's row, no longer decided.
                let item = PlanItem {
                    decided: false,
                    ..item_of(&d)
                };
                self.mail.push((i, Decision::Undo(item)));
            }
        } else if let Some(d) = self.decision(i) {
            self.mail.push((i, Decision::Decide(d)));
        }
        if self.rng.chance(0.5) {
            return self.deliver();
        }
        Ok(())
    }

    /// A decision on a conflict instance `i` has waiting, as its plan proposes it now: the
    /// item as the screen shows it once decided.
    fn decision(&mut self, i: usize) -> Option<PlanItem> {
        let state = self.instances[i].shell.machine().state();
        let item = proposal(state, &mut self.rng)?;
        Some(match self.rng.chance(0.7) {
            true => item,
            false => PlanItem {
                action: Action::Skip,
                target_id: None,
                ..item
            },
        })
    }

    /// The oldest decision made on a screen reaches its instance: logged, then handed over.
    fn deliver(&mut self) -> Result<(), Failure> {
        if self.mail.is_empty() {
            return Ok(());
        }
        let (i, d) = self.mail.remove(0);
        let now = self.world.now;
        // Logged through the binary's writer first, as the service logs a screen's
        // decision, and handed to sync only once logged.
        let (name, item) = match &d {
            Decision::Decide(item) if item.action == Action::Skip => ("skip", item),
            Decision::Decide(item) => ("accept", item),
            Decision::Undo(item) => ("undo", item),
        };
        let line = crate::core::decision_log::decision_record(name, item);
        if let Err(why) = self.logs[i].at(now, self.faults.disk_full).append(line) {
            self.trace.line(
                now,
                format_args!("operator's {name} on {} not logged: {why}", item.id),
            );
            return Ok(());
        }
        let id = item.id.clone();
        self.screen_decided(i, &id);
        let input = match d {
            Decision::Decide(item) => {
                let text = format!(
                    "operator decides {}: {:?} {:?}",
                    item.id, item.action, item.target_id
                );
                self.trace.line(now, text);
                Input::Decided(LoggedDecision {
                    id: item.id,
                    labels: item.labels,
                    action: item.action,
                    target_id: item.target_id,
                })
            }
            Decision::Undo(item) => {
                self.trace
                    .line(now, format_args!("operator undoes {}", item.id));
                Input::Undone(item.id)
            }
        };
        self.feed(i, Turn::Input(input))
    }
}

/// A conflict `state` has waiting, drawn by `rng`, as its plan proposes it now: the item as
/// a screen (or the decisions file) shows it once decided.
fn proposal(state: &crate::core::sync::SyncState, rng: &mut Rng) -> Option<PlanItem> {
    let (id, labels, _) = rng.pick(&state.waiting()).cloned()?;
    let item = state.planned_items().into_iter().find(|it| it.id == id)?;
    Some(PlanItem {
        labels: labels.to_string(),
        decided: true,
        ..item
    })
}

/// The row a screen shows for a decision in force.
fn item_of(d: &LoggedDecision) -> PlanItem {
    PlanItem {
        id: d.id.clone(),
        labels: d.labels.clone(),
        kind: Kind::Remap,
        action: d.action,
        target_id: d.target_id,
        existing_labels: None,
        labels_present_at: None,
        nodes: 0,
        reason: std::borrow::Cow::Borrowed(""),
        decided: true,
    }
}

/// Many seeds: each seed's run, in order.
pub fn run_seeds(first: u64, seeds: u64, steps: usize) -> impl Iterator<Item = SeedRun> {
    (first..first + seeds).map(move |s| run_seed(s, steps))
}

#[cfg(test)]
mod tests;
