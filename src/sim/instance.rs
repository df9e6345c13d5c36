//! One sync instance in the simulated world: the very shell the binary runs
//! (`core::sync::shell`, over the real `Machine`), with the simulated world as its IO
//! (`SimIo`: the log, writes, checks and the reservation writer against the world, with its
//! faults), checking the invariants on every call the shell makes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

pub use super::log::{SimLog, decisions_in_force};
use super::report::{Failure, Trace};
use super::reserver::SimReservations;
use super::world::World;
use crate::core::decision_log::LogContents;
use crate::core::decision_log::file::{Follower, resume};
use crate::core::kvstore::{IdDigits, MasterEntry, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::lease::Elector;
use crate::core::outcome::Outcome;
use crate::core::planner::Op;
use crate::core::retry::{Backoff, Policy};
use crate::core::rng::Rng;
use crate::core::sync::reserve::unreleased_in;

use crate::core::sync::machine::cutover::{cutover_verdict, logged_verdict};
use crate::core::sync::machine::{
    Input, K8sChange, KvWatchEvent, LeaseHolder, Settings, SplitFound,
};
use crate::core::sync::shell::{self, AfterFailure, Failed, Refusal, RoundEnd, Shell, Turn};
use crate::core::sync::split::{self, Named};
use crate::core::sync::{BatchOutcome, CutoverWait};

/// One sync instance: the binary's shell over the real machine, where it has read each side
/// up to, and what the simulation keeps beside it to check it.
pub struct Instance {
    pub idx: usize,
    /// Started with `--resume` naming the log its own replaced (`SimLog::moved`): every
    /// read of the logs this process makes reads that one first, as the binary's does.
    resumes: bool,
    pub shell: Shell,
    pub alive: bool,
    pub kv_pos: i64,
    pub k8s_pos: u64,
    kv_connected: bool,
    k8s_connected: bool,
    k8s_expired: bool,
    pub batch: Option<Vec<Op>>,
    /// The batch's decision lines could not be written (disk full): nothing of it is made,
    /// and it ends failed.
    batch_unlogged: bool,
    pub verify: Option<(BTreeMap<String, u32>, BTreeSet<String>)>,
    /// What the lease keeper last told it.
    pub told: LeaseHolder,
    /// Its lease keeper's rules (core's, as the real keeper runs them), and when it tries
    /// next.
    pub elector: Elector,
    pub next_try: Duration,
    /// Both sides as this instance was told them, change by change: an independent account
    /// of when a split begins (one id, two label sets) and of the view a write is checked
    /// against, to hold the shell's calls against.
    shadow: Shadow,
    /// Per id: splits begun (as the shadow saw them) and splits reported.
    occurrences: BTreeMap<u32, u32>,
    reports: BTreeMap<u32, u32>,
    /// Splits that began while this instance followed (not those already there when it
    /// started, which are conflicts of its first plan): each must be reported while it
    /// lasts.
    pub must_report: BTreeSet<u32>,
    /// Splits handed over to be reported, waiting for their nodes to be named.
    naming: Vec<SplitFound>,
    pub cutover: Option<Duration>,
    pub ended: bool,
    /// It ended on a refusal (exit 2, naming what to grant), with the server's words: the
    /// simulation ends it as the binary does and the operator starts it again.
    pub refused_end: Option<String>,
    /// A fresh read failed (the API server down): no round runs until one succeeds; what
    /// the binary's channels would hold meanwhile (decisions, the Lease, the writer's
    /// replies) waits here, the rest is not delivered.
    unread: bool,
    /// When a read that failed is tried again, and the waits between tries (the binary's
    /// backoff, core's rules).
    read_at: Duration,
    read_backoff: Backoff,
    deferred: Vec<Turn>,
    /// Its reservation writer (`--reserve-in-kvstore`), started before a round as the
    /// shell asks.
    pub reserver: Option<SimReservations>,
    /// When it last said its reservations met trouble (the queue waits after it).
    pub reserve_trouble: Option<Duration>,
    /// Following the decisions file (`sync --decisions`), when the seed has one: core's
    /// follower, the binary's.
    pub follower: Option<Follower>,
}

/// The clock the machine sees: the simulation's time after a fixed start.
pub struct Clock(pub Instant);

impl Clock {
    pub fn at(&self, t: Duration) -> Instant {
        self.0 + t
    }
}

impl Instance {
    /// An instance started (or restarted) on the world, resuming the decisions in `log`
    /// and taking over the reservations it records; `release_on_stop`:
    /// `--release-reservations`.
    pub fn start(
        idx: usize,
        (settings, release_on_stop): (Settings, bool),
        (log, file): (&SimLog, Option<&SimLog>),
        world: &mut World,
        (clock, rng, trace): (&Clock, &mut Rng, &mut Trace),
    ) -> Result<Self, Failure> {
        // Opened as the binary opens its log (a torn last line removed), then read back
        // as its restart reads it.
        if let Some(note) = log.repair() {
            trace.line(world.now, format_args!("i{idx}: {note}"));
        }
        // The binary's merge: its log and the decisions file, what the log lacks logged
        // first. (A start finds room on the disk: one that cannot log ends at once.) The
        // lines are read as the binary's reader read each; the merge's own lines are
        // appended once it is done with them.
        let file_now = file.map(|f| f.bytes());
        let mut lines = Vec::new();
        // A start on a new log is given the one it replaced as `--resume`.
        let resumes = log.to_resume();
        let merged = {
            let file_read = file.map(SimLog::contents).transpose().map_err(read_back)?;
            let resumed = log.resumed(resumes).map_err(read_back)?;
            let resumed: Vec<&LogContents> = resumed.iter().map(|c| &**c).collect();
            let own = log.contents().map_err(read_back)?;
            let mut append = |r| {
                lines.push(r);
                Ok(())
            };
            resume(&resumed, &own, file_read.as_deref(), &mut append)
                .map_err(|why| Failure::new("a start logs what it resumes", why))?
        };
        // The log is the record: what the start acts on is what its log replays to (with
        // nothing logged, its replay already, by construction).
        let logged_any = !lines.is_empty();
        for line in lines {
            log.at(world.now, false)
                .append(line)
                .map_err(|why| Failure::new("a start logs what it resumes", why))?;
        }
        if logged_any {
            let logged = decisions_in_force(&[&*log.contents().map_err(read_back)?]);
            if logged != merged.decisions {
                return Err(Failure::new(
                    "a start acts only on the decisions its log holds",
                    format!(
                        "i{idx} resumed {:?}, its log replays to {logged:?}",
                        merged.decisions
                    ),
                ));
            }
        }
        let follower = file_now.map(|bytes| Follower::new(bytes, merged.file));
        let shell = Shell::new(settings, merged.decisions, release_on_stop);
        let mut i = Instance {
            idx,
            resumes,
            shell,
            alive: true,
            kv_pos: 0,
            k8s_pos: 0,
            kv_connected: false,
            k8s_connected: false,
            k8s_expired: false,
            batch: None,
            batch_unlogged: false,
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
            naming: Vec::new(),
            cutover: None,
            ended: false,
            refused_end: None,
            unread: false,
            read_at: Duration::ZERO,
            read_backoff: Backoff::new(Policy::FOLLOW),
            deferred: Vec::new(),
            reserver: None,
            reserve_trouble: None,
            follower,
        };
        // Checked as every other call the shell makes: a start is no time to look away.
        i.fresh_round(world, log, (clock, rng, trace), true)?;
        Ok(i)
    }

    /// A fresh read of both sides, as `app::sync` reads them: Kubernetes first, then the
    /// kvstore, and the world goes on between the two (not one view); the shell's round
    /// starts on them. `first`: the instance's start (else a round after a compaction).
    fn fresh_round(
        &mut self,
        world: &mut World,
        log: &SimLog,
        (clock, rng, trace): (&Clock, &mut Rng, &mut Trace),
        first: bool,
    ) -> Result<(), Failure> {
        let (k8s, k8s_rv) = world.k8s_list();
        if !world.quiet && rng.chance(0.2) {
            // Between the two reads: an identity both GCs take, or an allocation.
            if let Some(id) = world.both_gcs(rng) {
                trace.line(
                    world.now,
                    format_args!("both GCs take identity {id} between i{}'s reads", self.idx),
                );
            }
        }
        let state = world.kv_read().with_kubernetes(k8s, k8s_rv.to_string());
        let fresh = Shadow::of(&state);
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
        self.kv_pos = state.kv_revision();
        self.k8s_pos = k8s_rv;
        self.kv_connected = false;
        self.k8s_connected = false;
        self.k8s_expired = false;
        self.verify = None;
        if self.shell.wants_writer() {
            self.reserver = Some(SimReservations::start(world, clock.at(world.now)));
            // As the binary reads them: the log it resumed, if any, then its own.
            let own = log.contents().map_err(read_back)?;
            let resumed = log.resumed(self.resumes).map_err(read_back)?;
            let mut logs: Vec<&LogContents> = resumed.iter().map(|c| &**c).collect();
            logs.push(&own);
            self.shell.writer_started(unreleased_in(&logs));
        }
        let now = clock.at(world.now);
        let gate = world.lease_valid(self.idx);
        let ctx = (&mut *rng, Faults::default(), &mut *trace);
        let end = self.with_io(world, log, ctx, |shell, io| {
            shell.start_round(state, now, gate, io)
        })?;
        self.round_ended(end, world, log, (clock, rng, Faults::default(), trace))
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
        // The log is in revision order: what this instance was not told yet starts where
        // its position ends.
        let untold = world.kv_log.partition_point(|(rev, _)| *rev <= self.kv_pos);
        let changes: Vec<_> = world.kv_log[untold..].iter().take(n).collect();
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

    /// Objects this instance was told of, still in Kubernetes as told, in range with a
    /// valid label key, whose id the kvstore holds neither as it was told, nor in the
    /// world's truth, nor in a change it has not been told yet: what a sync that reserves
    /// owes a reservation.
    pub fn unreserved(&self, world: &World) -> Vec<u32> {
        let untold: BTreeSet<&[u8]> = world
            .kv_log
            .iter()
            .rev()
            .take_while(|(rev, _)| *rev > self.kv_pos)
            .filter_map(|(_, c)| match c {
                crate::core::sync::KvChange::Master { id, .. } => Some(id.as_slice()),
                _ => None,
            })
            .collect();
        // Both sides are in id order: the kvstore's ids are walked beside the objects'.
        let mut told_kv = self.shadow.kv.keys().peekable();
        self.shadow
            .k8s
            .iter()
            .filter(|(id, labels)| {
                // The cheap checks first: this runs for every object at every check.
                while told_kv.next_if(|kv| kv < id).is_some() {}
                if !RANGE.contains(**id) || told_kv.peek() == Some(id) {
                    return false;
                }
                // The id spelled as a kvstore key, without a string per object.
                let key = IdDigits::of(**id);
                let key = key.as_str();
                !world.masters.contains_key(key)
                    && !untold.contains(key.as_bytes())
                    && world.objects.get(id).is_some_and(|(l, _)| l == *labels)
                    && valid_label_key(labels.as_bytes()).is_ok()
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether a fresh read is still to succeed.
    pub fn unread(&self) -> bool {
        self.unread
    }

    /// Reads both sides again after a read that failed, unless the API server is still
    /// down; then what waited is handed over in order.
    pub fn read_again(
        &mut self,
        world: &mut World,
        log: &SimLog,
        (clock, rng, faults, trace): (&Clock, &mut Rng, Faults, &mut Trace),
    ) -> Result<(), Failure> {
        if !self.unread || world.now < self.read_at {
            return Ok(());
        }
        if let Some(failed) = faults.on_read() {
            return self.read_failed(world.now, failed, trace);
        }
        self.unread = false;
        self.read_backoff.reset();
        self.fresh_round(world, log, (clock, &mut *rng, &mut *trace), false)?;
        for turn in std::mem::take(&mut self.deferred) {
            self.feed(turn, world, log, (clock, &mut *rng, faults, &mut *trace))?;
        }
        Ok(())
    }

    /// A round's read failed, judged by the shell as the binary's read is
    /// (`Shell::failed`): an outage is tried again after the backoff's wait; a refusal
    /// ends sync.
    fn read_failed(
        &mut self,
        now: Duration,
        failed: Failed,
        trace: &mut Trace,
    ) -> Result<(), Failure> {
        let (i, refused) = (self.idx, failed.fault.refused);
        match self.shell.failed(failed) {
            AfterFailure::Retry { .. } if refused => Err(Failure::new(
                "a refused read ends sync (exit 2, naming what to grant)",
                format!("i{i}: the shell tries a refused read again"),
            )),
            AfterFailure::Retry { .. } => {
                self.read_at = now + self.read_backoff.failed();
                Ok(())
            }
            AfterFailure::End(_) if !refused => Err(Failure::new(
                "an outage is ridden out",
                format!("i{i}: the shell ends sync on a failed read"),
            )),
            AfterFailure::End(refusal) => {
                self.refused(said(refusal), now, trace);
                Ok(())
            }
        }
    }

    /// Whether the batch in flight had its decision lines written.
    pub fn batch_logged(&self) -> bool {
        !self.batch_unlogged
    }

    /// A watch was cut off: the binary's task watches again from where it was, and says
    /// so once it is connected again.
    pub fn watch_cut(&mut self, kvstore: bool) {
        if kvstore {
            self.kv_connected = false;
        } else {
            self.k8s_connected = false;
        }
    }

    /// Whether both of its watches are up (the status tick's `watching`).
    pub fn watching(&self) -> bool {
        self.kv_connected && self.k8s_connected
    }

    /// One turn handed to the shell, its calls carried out against the world and checked.
    pub fn feed(
        &mut self,
        turn: Turn,
        world: &mut World,
        log: &SimLog,
        ctx: (&Clock, &mut Rng, Faults, &mut Trace),
    ) -> Result<(), Failure> {
        let (clock, rng, faults, trace) = ctx;
        let i = self.idx;
        let now = clock.at(world.now);
        if self.ended {
            // An ended sync takes no more turns (one deferred behind a refusal's end).
            return Ok(());
        }
        if self.unread {
            let kept = matches!(
                turn,
                Turn::Reply(_)
                    | Turn::LeaseRefused(_)
                    | Turn::Input(Input::Decided(_) | Input::Undone(_) | Input::Lease(_))
            );
            if kept {
                self.deferred.push(turn);
            }
            return Ok(());
        }
        if let Turn::Input(input) = &turn {
            self.shadow_sees(input);
        }
        let settle = matches!(turn, Turn::Settle { .. });
        let gate = world.lease_valid(i);
        let end = self.with_io(world, log, (&mut *rng, faults, &mut *trace), |shell, io| {
            shell.take(turn, now, gate, io)
        })?;
        self.round_ended(end, world, log, (clock, rng, faults, trace))?;
        if settle {
            self.name_splits(world, now, trace);
        }
        // A split begun is handed over at the next settle (its nodes named later).
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
        let m = self.shell.machine();
        // A refusal ends sync in the shell, not the machine.
        let machine_ended = self.ended && self.refused_end.is_none();
        if m.batch_running() != self.batch.is_some() || m.ended() != machine_ended {
            return Err(Failure::new(
                "the machine knows its batch in flight and its end",
                format!(
                    "i{i}: batch out {} (machine: {}), ended {} (machine: {})",
                    self.batch.is_some(),
                    m.batch_running(),
                    self.ended,
                    m.ended()
                ),
            ));
        }
        Ok(())
    }

    /// What the dispatcher does when the shell ends a round, as `app::sync` does: for a
    /// fresh read the batch in flight is taken in first (here carried out at once), then
    /// both sides are read again; at the end, the instance stops.
    fn round_ended(
        &mut self,
        end: Option<RoundEnd>,
        world: &mut World,
        log: &SimLog,
        (clock, rng, faults, trace): (&Clock, &mut Rng, Faults, &mut Trace),
    ) -> Result<(), Failure> {
        let i = self.idx;
        match end {
            None => Ok(()),
            Some(RoundEnd::Done(end)) => {
                trace.line(world.now, format_args!("i{i} end cutover={}", end.cutover));
                self.ended = true;
                Ok(())
            }
            Some(RoundEnd::Refused(refusal)) => {
                self.refused(said(refusal), world.now, trace);
                Ok(())
            }
            Some(RoundEnd::Resnapshot) => {
                trace.line(world.now, format_args!("i{i} resnapshot"));
                if self.shell.awaits_batch() {
                    let (outcome, _) =
                        self.execute_batch(world, log, (&mut *rng, faults, &mut *trace))?;
                    let ops = self.batch.take().unwrap_or_default();
                    let now = clock.at(world.now);
                    let gate = world.lease_valid(i);
                    let turn = Turn::Input(Input::BatchDone { ops, outcome });
                    let end =
                        self.with_io(world, log, (&mut *rng, faults, &mut *trace), |shell, io| {
                            shell.take(turn, now, gate, io)
                        })?;
                    if let Some(RoundEnd::Refused(refusal)) = end {
                        // The batch taken in before the fresh read was refused: sync ends.
                        self.refused(said(refusal), world.now, trace);
                        return Ok(());
                    }
                }
                self.shell.end_round();
                if let Some(failed) = faults.on_read() {
                    // The read fails; the binary waits and reads again, or ends.
                    trace.line(world.now, format_args!("i{i} cannot read both sides"));
                    self.unread = true;
                    return self.read_failed(world.now, failed, trace);
                }
                self.fresh_round(world, log, (clock, rng, trace), false)
            }
        }
    }

    /// The shell ended sync on a refusal: no more turns; the simulation does the rest of
    /// the binary's end (`Sim::refused_and_started_again`).
    fn refused(&mut self, why: String, now: Duration, trace: &mut Trace) {
        trace.line(now, format_args!("i{} ends on {why}", self.idx));
        self.ended = true;
        self.refused_end = Some(why);
    }

    /// Asked to stop (SIGTERM, an upgrade), as the binary is: the stop is told at the next
    /// settle; a batch out is taken in first (the machine waits for it); then sync ends. A
    /// stop while both sides are still to be read ends it at once.
    pub fn stop(
        &mut self,
        world: &mut World,
        log: &SimLog,
        (clock, rng, faults, trace): (&Clock, &mut Rng, Faults, &mut Trace),
    ) -> Result<(), Failure> {
        if self.unread || self.ended {
            return Ok(());
        }
        let stop = Turn::Settle { stopped: true };
        self.feed(
            stop.clone(),
            world,
            log,
            (clock, &mut *rng, faults, &mut *trace),
        )?;
        if !self.ended && self.batch.is_some() {
            let (outcome, _) = self.execute_batch(world, log, (&mut *rng, faults, &mut *trace))?;
            let ops = self.batch.take().unwrap_or_default();
            let done = Turn::Input(Input::BatchDone { ops, outcome });
            self.feed(done, world, log, (clock, &mut *rng, faults, &mut *trace))?;
            if self.refused_end.is_some() {
                // Its batch was refused: it ended on that, before the stop.
                return Ok(());
            }
            self.feed(stop, world, log, (clock, rng, faults, trace))?;
        }
        if !self.ended {
            return Err(Failure::new(
                "a stop ends sync once its batch is in",
                format!("i{} was told to stop and goes on", self.idx),
            ));
        }
        Ok(())
    }

    /// The splits handed over whose kvstore labels' nodes can be named now, or whose wait
    /// is over, reported by the binary's rule (`split::named`, `World::nodes_using` for etcd's
    /// read); the others wait for the next settle, as the binary's task asks again.
    fn name_splits(&mut self, world: &World, now: Instant, trace: &mut Trace) {
        let i = self.idx;
        for f in std::mem::take(&mut self.naming) {
            let nodes = world.nodes_using(&f.kv_value, f.id);
            match split::named(&f, nodes, now) {
                Named::Report(s) => trace.line(
                    world.now,
                    format_args!("i{i} split {} reported, nodes {:?}", s.id, s.nodes),
                ),
                Named::Wait => self.naming.push(f),
                Named::NotLabels => {}
            }
        }
    }

    /// Runs `f` on the shell with the simulated world as its IO; the first invariant a call
    /// broke, if any.
    fn with_io<T>(
        &mut self,
        world: &mut World,
        log: &SimLog,
        (rng, faults, trace): (&mut Rng, Faults, &mut Trace),
        f: impl FnOnce(&mut Shell, &mut SimIo<'_>) -> T,
    ) -> Result<T, Failure> {
        let reserving = self.shell.machine().settings().reserve_in_kvstore;
        let mut io = SimIo {
            idx: self.idx,
            world,
            log,
            rng,
            faults,
            trace,
            reserving,
            kv_pos: self.kv_pos,
            k8s_pos: self.k8s_pos,
            batch: &mut self.batch,
            batch_unlogged: &mut self.batch_unlogged,
            verify: &mut self.verify,
            reserver: &mut self.reserver,
            shadow: &self.shadow,
            occurrences: &self.occurrences,
            reports: &mut self.reports,
            must_report: &mut self.must_report,
            naming: &mut self.naming,
            cutover: &mut self.cutover,
            reserve_trouble: &mut self.reserve_trouble,
            failure: None,
        };
        let out = f(&mut self.shell, &mut io);
        match io.failure {
            Some(f) => Err(f),
            None => Ok(out),
        }
    }

    /// The batch in flight, carried out by core's executor, the binary's own, over the
    /// simulated API server (`writes::SimWrites`), read back by core's `batch_outcome`.
    pub fn execute_batch(
        &mut self,
        world: &mut World,
        log: &SimLog,
        (rng, faults, trace): (&mut Rng, Faults, &mut Trace),
    ) -> Result<(BatchOutcome, u32), Failure> {
        let Some(ops) = &self.batch else {
            return Ok((BatchOutcome::Failed("no batch".into()), 0));
        };
        if std::mem::take(&mut self.batch_unlogged) {
            // Log before act: no line, no create; the batch fails whole, as the binary's
            // `log_decisions` error does.
            let why = "the decision log: disk full".to_string();
            return Ok((batch_outcome(Err((Default::default(), why))), 0));
        }
        let io = SimWrites::new(self.idx, world, log, (rng, faults, trace));
        let report =
            at_once(carry_out(&io, ops.clone(), &ApplyOptions::default())).ok_or_else(|| {
                Failure::new(
                    "the simulated API server answers at once",
                    format!("i{}: the executor waited", self.idx),
                )
            })?;
        if let Some(broke) = io.broke.take() {
            return Err(broke);
        }
        if let Ok(r) = &report
            && r.throttled != io.throttles.get()
        {
            return Err(Failure::new(
                "a batch counts the server's push-backs as the server made them",
                format!(
                    "i{}: the server answered 429 {} time(s), the report says {}",
                    self.idx,
                    io.throttles.get(),
                    r.throttled
                ),
            ));
        }
        let refusals = io.refusals.get();
        let report = report.map_err(|e| (Default::default(), e.to_string()));
        Ok((batch_outcome(report), refusals))
    }

    /// The cutover check: a verify of the world as it is, with what this instance's log and
    /// the machine expect.
    pub fn run_verify(
        &mut self,
        world: &World,
        log: &SimLog,
        disk_full: bool,
    ) -> Option<Result<(), CutoverWait>> {
        let (reused, nowhere) = self.verify.take()?;
        // Read as the binary reads its decision log: core's one fold of a line.
        let logged = match log.contents() {
            Ok(read) => read.expectations(),
            Err(why) => {
                let first = format!("the decision logs cannot be read: {why}");
                return Some(Err(CutoverWait::Verify { problems: 1, first }));
            }
        };
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
        let sides = (masters.as_slice(), &k8s);
        let verdict = cutover_verdict(logged, (&reused, &nowhere), sides, RANGE);
        let writer = log.at(world.now, disk_full);
        Some(logged_verdict(verdict, |line| writer.append(line)))
    }
}

/// A log the binary's reader refuses: the writer wrote a line it cannot read back.
fn read_back(why: String) -> Failure {
    Failure::new("the decision log reads back as it was written", why)
}

/// What a refusal the shell ended sync on refused, as the trace says it.
fn said(refusal: Refusal) -> String {
    match refusal {
        Refusal::Create(why) => format!("a create refused: {why}"),
        Refusal::Lease(why) => format!("the Lease refused: {why}"),
        Refusal::Read { doing, error, .. } => format!("{doing} refused: {error}"),
    }
}

mod io;
mod shadow;
mod writes;

use crate::core::at_once::at_once;
use crate::core::executor::{ApplyOptions, carry_out};
use crate::core::sync::batch::batch_outcome;
pub use io::{Faults, KV_VIEW_LAG_RIDDEN_OUT, RANGE, SimIo, failed};
use shadow::Shadow;
use writes::SimWrites;
pub use writes::{WEBHOOK, webhook_denies};

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

/// How often, in simulated time, the shell ticks: the binary's own cadences.
pub const SETTLE: Duration = shell::SETTLE_EVERY;
pub const STATUS: Duration = shell::STATUS_EVERY;
