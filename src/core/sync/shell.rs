//! The one shell of sync, run unchanged by the binary (`app::sync`) and by the simulation
//! (`crate::sim`): each input goes to the machine, and its commands are carried out through
//! `Io` (the decision log, what is said, writes, cutover checks, split reports, the
//! reservation writer); what the carrying-out answers at once (moot closures logged) goes
//! back in; what lives across rounds is kept here (what a round carries over, and the
//! reservations, whose own rules decide: `reserve::reservations`); and it says when a round
//! ends. It decides nothing itself. Only the IO beneath differs: tasks and channels in the
//! binary, the simulated world in the simulation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::failure::{self, Fault, Path, Then};
use super::machine::{
    CutoverReport, Input, LeaseHolder, Machine, Output, Reserve, Settings, SplitFound, SyncEnd,
};
use super::reserve::reservations::Reservations;
use super::reserve::{Reply, Request, Said, Unreleased};
use super::{BatchOutcome, SyncReport, SyncState, SyncStatus, Taken};
use crate::core::kvstore::NodeCounts;
use crate::core::labels::LabelKey;
use crate::core::planner::resume::LoggedDecision;
use crate::core::planner::{Kind, Op};

/// A decision-log line the shell writes itself (a batch's lines are the batch writer's, the
/// reservations' the reservation writer's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A malformed kvstore entry, skipped.
    Invalid {
        id: String,
        labels: String,
        reason: String,
    },
    /// A conflict closed without a write: no kvstore-mode node uses its labels any more.
    Moot {
        id: String,
        labels: LabelKey,
        kind: Kind,
    },
    /// A decision that cannot be carried out as decided, and why.
    Refused {
        decision: LoggedDecision,
        kind: Kind,
        reason: String,
    },
}

impl Line {
    /// The line as the decision log records it.
    pub fn record(self) -> crate::core::decision_log::Record {
        use crate::core::decision_log::Record;
        use crate::core::outcome::Outcome;
        match self {
            Line::Invalid { id, labels, reason } => {
                let mut r = Record::decision(&id, &labels, Kind::Invalid, ("skip", "rule"), None);
                r.outcome = Some(Outcome::Skipped);
                r.error = Some(reason);
                r
            }
            Line::Moot { id, labels, kind } => {
                let mut r = Record::decision(&id, &labels, kind, ("moot", "rule"), None);
                r.outcome = Some(Outcome::Skipped);
                r.error = Some(
                    "no kvstore-mode node uses these labels any more: closed without a write"
                        .into(),
                );
                r
            }
            // No outcome: the identity waits for a decision again. A rule's line, so a
            // resume does not read it as a decision; the decision it refuses stays in the log.
            Line::Refused {
                decision,
                kind,
                reason,
            } => {
                let text = super::SyncReport::refused_text(&decision, &reason);
                let (id, labels) = (&decision.id, &decision.labels);
                let mut r =
                    Record::decision(id, labels, kind, ("refused", "rule"), decision.target_id);
                r.error = Some(text);
                r
            }
        }
    }
}

/// What the shell tells the operator (and the metrics).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Both watches are established.
    Following,
    Note(String),
    Trouble(String),
    /// A conflict that waits for a decision (once per identity).
    Conflict {
        id: String,
        kind: Kind,
        reason: String,
    },
    /// A malformed kvstore entry, logged as skipped (once per identity); `at_read`: found
    /// in a read of the whole kvstore (said as one count with the others), not arriving.
    Invalid {
        id: String,
        reason: String,
        at_read: bool,
    },
    /// A conflict closed as moot (logged).
    Moot {
        id: String,
        labels: LabelKey,
    },
    Status(SyncStatus),
    NodeCounts(NodeCounts),
    Cutover(CutoverReport),
    /// What a batch changed, for the metrics.
    Taken(Taken),
}

/// The IO beneath the shell. Each call starts or does one thing and returns at once; what
/// takes time answers later as an input (`Input::BatchDone`, `Input::Verdict`, a reservation
/// `Reply`).
pub trait Io {
    /// Appends `lines` to the decision log in order: how many were written (a failure stops
    /// there).
    fn log(&mut self, lines: Vec<Line>) -> usize;
    fn say(&mut self, event: Event);
    /// Starts a batch of creates, each decision logged before its write.
    fn write(&mut self, ops: Vec<Op>);
    /// Starts a cutover check (a consistent verify) with these expectations beside the logs.
    fn verify(&mut self, reused: BTreeMap<String, u32>, nowhere: BTreeSet<String>);
    /// Reports these splits, each once its kvstore labels' nodes can be named (at most
    /// `SPLIT_NODES_WAIT` later), each logged.
    fn report_splits(&mut self, found: Vec<SplitFound>);
    /// Hands these to the reservation writer, in order.
    fn reserve(&mut self, requests: Vec<Request>);
    /// Cutover: the reservation writer finishes what it was sent (waiting at most
    /// `FINISH_WAIT`), then releases what it holds, only while the Lease's gate is open.
    fn release(&mut self);
    /// Where sync stands after each input (for the metrics).
    fn stands(&mut self, _status: &SyncStatus) {}
}

/// How often sync plans and writes what changed (the settle tick): what arrives within it
/// goes in one batch.
pub const SETTLE_EVERY: Duration = Duration::from_millis(100);

/// How often sync says where it stands, retries what waited, closes what is moot and looks
/// at cutover (the status tick).
pub const STATUS_EVERY: Duration = Duration::from_secs(5);

/// The cutover grace a run uses: as asked, except where a node's keys go the moment it
/// moves (the demo's in-memory kvstore revokes an agent's lease at once, none lapses later),
/// where a few seconds do.
pub fn cutover_grace(asked: Duration, keys_go_at_once: bool) -> Duration {
    if keys_go_at_once {
        asked.min(Duration::from_secs(5))
    } else {
        asked
    }
}

/// How long an ending sync waits for the reservation writes in flight (a stalled kvstore
/// answers a request only at the client's timeout).
pub const FINISH_WAIT: Duration = Duration::from_secs(10);

/// How long a split waits for the `value/` keys of the nodes that use it before it is
/// reported without them.
pub const SPLIT_NODES_WAIT: Duration = Duration::from_secs(5);

/// How a round ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RoundEnd {
    /// The kvstore was compacted past the watched revision: read both sides again (the
    /// batch in flight is taken in first, `awaits_batch`).
    Resnapshot,
    Done(Box<SyncEnd>),
    /// A write or the Lease was refused (a 401, a 403: the credentials lack a rule), which
    /// waiting never fixes (`failure`'s rules): sync ends (exit 2) naming what to grant.
    Refused(Refusal),
}

/// What the loop hands the shell: an input of the machine's, or a tick the shell turns
/// into one.
#[derive(Debug, Clone)]
pub enum Turn {
    Input(Input),
    /// The settle tick; `stopped`: sync is asked to stop (told to the machine once).
    Settle {
        stopped: bool,
    },
    /// The status tick; `watching`: both watches are up.
    Status {
        watching: bool,
    },
    /// The reservation writer answered.
    Reply(Reply),
    /// The Lease's keeper was refused (a 403 on the Lease: its Role's rule missing), with
    /// the server's words.
    LeaseRefused(String),
    /// A watch failed, or the list after it expired (410): judged by `failure`'s rules as
    /// a round's read is (`Shell::failed`); the watch tries again unless sync ends.
    Failed(Failed),
}

/// A read or a watch that failed: where, what it met, and how it reads in each case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub path: Path,
    pub fault: Fault,
    /// What was being done ("listing ciliumidentities.cilium.io").
    pub doing: String,
    /// The error, in the server's or the client's words (what a refusal says).
    pub error: String,
    /// What is said when it is ridden out: the error and what is tried next ("watching
    /// again from revision 7").
    pub trouble: String,
}

/// What comes of a failed read or watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterFailure {
    /// Ridden out: said, then tried again after the backoff's wait.
    Retry { trouble: String },
    /// Sync ends (exit 2), naming what was refused.
    End(Refusal),
}

/// What a refusal that ended sync refused, with the server's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A create of a CiliumIdentity.
    Create(String),
    /// The one-writer Lease.
    Lease(String),
    /// A read or a watch, refused or meeting configuration waiting never fixes (`fault`
    /// tells which): what was being done, and the error's words.
    Read {
        fault: Fault,
        doing: String,
        error: String,
    },
}

/// The shell (see the module).
pub struct Shell {
    machine: Machine,
    /// What the last round knew, when it ended for a fresh read: the next round starts from
    /// that read and keeps this memory (what was reported, made, counted). Kept until a round
    /// starts: a read that fails leaves it for the one that succeeds.
    carried: Option<SyncState>,
    /// The stop was handed to the machine (this round).
    stop_told: bool,
    /// The reservations across rounds: their rules decide, the shell hands on.
    reservations: Reservations,
}

impl Shell {
    pub fn new(
        settings: Settings,
        decisions: BTreeMap<String, LoggedDecision>,
        release_on_stop: bool,
    ) -> Self {
        Shell {
            machine: Machine::new(settings, decisions),
            carried: None,
            stop_told: false,
            reservations: Reservations::new(release_on_stop),
        }
    }

    /// The machine, to read (the simulation's operator and invariants read its plan).
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Who holds the Lease, known before the first round.
    pub fn know_holder(&mut self, holder: LeaseHolder) {
        self.machine.know_holder(holder);
    }

    /// Whether a reservation writer is to be started before the next round: sync reserves
    /// now (not since cutover released them, unless a node came back) and none runs.
    pub fn wants_writer(&self) -> bool {
        self.machine.reserving() && !self.reservations.has_writer()
    }

    /// The reservation writer started (its queue lives in `Reservations`); `unreleased` is what the
    /// decision logs record as reserved and not released now, read as the writer starts (at
    /// a start, what an earlier sync left; after a release at cutover that did not finish, a
    /// disk full or the Lease lost midway, what that release left), taken over once by the
    /// Lease's holder, so a writer that starts again never forgets master keys written.
    pub fn writer_started(&mut self, unreleased: Unreleased) {
        self.reservations.writer_started(unreleased);
    }

    /// Whether a writer runs, to be finished when sync ends.
    pub fn has_writer(&self) -> bool {
        self.reservations.has_writer()
    }

    /// A clean stop: the release, as cutover's goes, if `Reservations::release_at_stop`
    /// says so (the requests to send the writer, which then finishes and releases).
    pub fn release_at_stop(&mut self, holding: bool) -> Option<Vec<Request>> {
        let state = self.carried.as_ref().unwrap_or(self.machine.state());
        self.reservations.release_at_stop(state, holding)
    }

    /// A round starts on a fresh read of both sides (`state`), with what the last round
    /// carried folded in; the first reservations are asked for before any watch delivers.
    pub fn start_round(
        &mut self,
        mut state: SyncState,
        now: Instant,
        gate: bool,
        io: &mut impl Io,
    ) -> Option<RoundEnd> {
        match self.carried.take() {
            Some(old) => state.carry_over(old, now),
            // A split already there when sync starts (a restart, or one made before any
            // sync ran) is one now, and reported with its nodes as any other.
            None => state.find_splits(now),
        }
        // The first plan already knows the master keys that are sync's own (at a start,
        // what the logs record, before the writer has taken them over).
        if let Some(own) = self.reservations.own_masters() {
            state.own_masters = own.clone();
        }
        self.stop_told = false;
        let outs = self.machine.start_round(state, gate);
        self.carry_out(outs, now, gate, io)
    }

    /// One turn of the loop: what it is, handed on.
    pub fn take(
        &mut self,
        turn: Turn,
        now: Instant,
        gate: bool,
        io: &mut impl Io,
    ) -> Option<RoundEnd> {
        match turn {
            Turn::Input(Input::BatchDone {
                ops,
                outcome: BatchOutcome::Faulted { fault, why },
            }) => {
                // Nothing of the batch was written: tried again if the rules ride the fault
                // out; if they end sync, folded in all the same (the end counts the writes
                // as owed), with nothing said of a retry that will not come.
                let failed = Input::BatchDone {
                    ops,
                    outcome: BatchOutcome::Failed(why.clone()),
                };
                match failure::then(Path::Create, fault) {
                    Then::End => {
                        let _not_said = self.machine.step(failed, now, gate);
                        Some(RoundEnd::Refused(Refusal::Create(why)))
                    }
                    Then::Retry => self.step(failed, now, gate, io),
                }
            }
            Turn::LeaseRefused(why) => {
                match failure::then(Path::Lease, failure::Fault::forbidden()) {
                    Then::End => Some(RoundEnd::Refused(Refusal::Lease(why))),
                    // Not known to hold it: no writes.
                    Then::Retry => self.step(Input::Lease(LeaseHolder::Unknown), now, gate, io),
                }
            }
            Turn::Failed(f) => match self.failed(f) {
                AfterFailure::Retry { trouble } => {
                    io.say(Event::Trouble(trouble));
                    None
                }
                AfterFailure::End(refusal) => Some(RoundEnd::Refused(refusal)),
            },
            Turn::Input(input) => self.step(input, now, gate, io),
            Turn::Settle { stopped } => self.settle(stopped, now, gate, io),
            Turn::Status { watching } => self.step(Input::Status { watching }, now, gate, io),
            Turn::Reply(reply) => self.reservation_reply(reply, now, gate, io),
        }
    }

    /// A read or a watch failed: by `failure`'s rules, sync ends on a refusal (or on
    /// configuration), and rides an outage out. The binary's reads at a round's start and
    /// its watches, and the simulation's, are judged here alike.
    pub fn failed(&self, f: Failed) -> AfterFailure {
        match failure::then(f.path, f.fault) {
            Then::Retry => AfterFailure::Retry { trouble: f.trouble },
            Then::End => AfterFailure::End(Refusal::Read {
                fault: f.fault,
                doing: f.doing,
                error: f.error,
            }),
        }
    }

    /// One input to the machine, its commands carried out; the round's end if one ends it.
    pub fn step(
        &mut self,
        input: Input,
        now: Instant,
        gate: bool,
        io: &mut impl Io,
    ) -> Option<RoundEnd> {
        let outs = self.machine.step(input, now, gate);
        self.carry_out(outs, now, gate, io)
    }

    /// The settle tick; `stopped`: sync is asked to stop (told to the machine once).
    fn settle(
        &mut self,
        stopped: bool,
        now: Instant,
        gate: bool,
        io: &mut impl Io,
    ) -> Option<RoundEnd> {
        let mut end = None;
        if stopped && !self.stop_told {
            self.stop_told = true;
            end = self.step(Input::Stop, now, gate, io);
        }
        self.step(Input::Settle, now, gate, io).or(end)
    }

    /// The reservation writer answered: folded into the queue, said, told to the machine.
    fn reservation_reply(
        &mut self,
        reply: Reply,
        now: Instant,
        gate: bool,
        io: &mut impl Io,
    ) -> Option<RoundEnd> {
        let answered = self.reservations.answered(reply, now)?;
        match answered.said {
            Some(Said::Trouble(t)) => io.say(Event::Trouble(t)),
            Some(Said::Note(n)) => io.say(Event::Note(n)),
            None => {}
        }
        let (held, own_masters) = (answered.held, answered.own_masters);
        self.step(Input::Reservations { held, own_masters }, now, gate, io)
    }

    /// A round ends for a fresh read: whether the batch in flight is to be taken in first
    /// (its outcome fed with `step`), so the next round never writes beside it and its
    /// outcomes are part of what is carried.
    pub fn awaits_batch(&self) -> bool {
        self.machine.batch_running()
    }

    /// A round ended for a fresh read: what it knew is carried to the next.
    pub fn end_round(&mut self) {
        self.carried = Some(self.machine.take_state());
    }

    /// What sync ends with when a stop comes outside a round's turns (while both sides are
    /// read, or after a fresh snapshot): what it knew last, with the writes it still owes
    /// counted, never an empty end that reads as nothing owed.
    pub fn end_now(&mut self) -> SyncEnd {
        let mut state = match self.carried.take() {
            Some(carried) => carried,
            None => self.machine.take_state(),
        };
        state.refresh_lag_percentiles();
        let end = SyncEnd {
            cutover: false,
            status: state.status().clone(),
            unwritten: state.unwritten_now(),
        };
        self.carried = Some(state);
        end
    }

    fn carry_out(
        &mut self,
        outs: Vec<Output>,
        now: Instant,
        gate: bool,
        io: &mut impl Io,
    ) -> Option<RoundEnd> {
        let mut queue: VecDeque<Output> = outs.into();
        let mut end = None;
        while let Some(o) = queue.pop_front() {
            match o {
                Output::Following => io.say(Event::Following),
                Output::Note(n) => io.say(Event::Note(n)),
                Output::Trouble(t) => io.say(Event::Trouble(t)),
                Output::Report(r) => {
                    if let Some(not_logged) = report(r, io) {
                        queue.extend(self.machine.step(not_logged, now, gate));
                    }
                }
                Output::Write(ops) => io.write(ops),
                Output::Taken(taken) => io.say(Event::Taken(taken)),
                Output::Reserve(cmd) => self.reserve(cmd, now, io),
                Output::ReportSplits(found) => io.report_splits(found),
                Output::CloseMoot(moot) => {
                    let lines = moot
                        .iter()
                        .map(|(id, labels, kind)| Line::Moot {
                            id: id.clone(),
                            labels: labels.clone(),
                            kind: *kind,
                        })
                        .collect();
                    // Closed only once logged; a log that fails stops the closing there.
                    let n = io.log(lines);
                    let logged = moot
                        .into_iter()
                        .take(n)
                        .map(|(id, labels, _)| (id, labels))
                        .collect();
                    queue.extend(self.machine.step(Input::MootLogged(logged), now, gate));
                }
                Output::Moot { id, labels } => io.say(Event::Moot { id, labels }),
                Output::Verify { reused, nowhere } => io.verify(reused, nowhere),
                Output::Status(status) => io.say(Event::Status(status)),
                Output::NodeCounts(counts) => io.say(Event::NodeCounts(counts)),
                Output::Cutover(report) => io.say(Event::Cutover(report)),
                Output::Resnapshot => end = Some(RoundEnd::Resnapshot),
                Output::End(e) => end = Some(RoundEnd::Done(Box::new(e))),
            }
        }
        io.stands(self.machine.state().status());
        end
    }

    /// A reservation command, through the reservations' rules, on to the writer; at
    /// cutover, the release.
    fn reserve(&mut self, cmd: Reserve, now: Instant, io: &mut impl Io) {
        let m = &self.machine;
        let how = (m.holding(), m.settings().range);
        let asked = self.reservations.command(cmd, m.state(), how, now);
        if !asked.requests.is_empty() {
            io.reserve(asked.requests);
        }
        if asked.release {
            io.release();
        }
    }
}

/// A report of the machine's: an invalid entry is logged as skipped, a refused decision as
/// refused; each is said only once logged. One whose line could not be written goes back to
/// the machine (the input returned), to be reported and logged again at a later round.
fn report(report: SyncReport, io: &mut impl Io) -> Option<Input> {
    match report {
        SyncReport::Invalid {
            id,
            labels,
            reason,
            at_read,
        } => {
            let line = Line::Invalid {
                id: id.clone(),
                labels,
                reason: reason.clone(),
            };
            if io.log(vec![line]) == 0 {
                return Some(Input::InvalidNotLogged(id));
            }
            io.say(Event::Invalid {
                id,
                reason,
                at_read,
            });
        }
        SyncReport::Conflict { id, kind, reason } => io.say(Event::Conflict { id, kind, reason }),
        SyncReport::Refused {
            decision,
            kind,
            reason,
        } => {
            let text = SyncReport::refused_text(&decision, &reason);
            let id = decision.id.clone();
            let line = Line::Refused {
                decision,
                kind,
                reason,
            };
            if io.log(vec![line]) == 0 {
                return Some(Input::RefusalNotLogged(id));
            }
            io.say(Event::Trouble(text));
        }
    }
    None
}

#[cfg(test)]
mod tests;
