//! Sync's decisions as one state machine: events in (both watches, the lease, the
//! operator's decisions, the outcomes of writes and checks, the ticks), each with the time it
//! happened; commands out (writes, reports, reservation requests, checks, the end). What to
//! write, when to retry, when the rollout is over, when cutover is checked and reached, what
//! is moot, when a fresh snapshot is due: all decided here, and nothing else. `app::sync`
//! carries the commands out and feeds the results back; the deterministic simulation
//! (`crate::sim`) drives the very same machine through whole rollouts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::decided::Decisions;
use super::{BatchOutcome, CutoverWait, KvChange, SyncReport, SyncState, SyncStatus, Taken};
use crate::core::kvstore::{IdDigits, MasterEntry, NodeCounts, parse_id};
use crate::core::labels::LabelKey;
use crate::core::outcome::Outcome;
use crate::core::planner::resume::LoggedDecision;
use crate::core::planner::{Kind, Op};
use crate::core::range::IdRange;
use crate::core::verify::Expectations;

/// An event of the kvstore's watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvWatchEvent {
    /// The watch is established: etcd accepted it.
    Connected,
    /// Changes of one watch response, all at `revision`.
    Changes {
        changes: Vec<KvChange>,
        revision: i64,
    },
    /// etcd compacted past the watched revision: read a fresh snapshot.
    Compacted { compact_revision: i64 },
    /// The server answered a progress request (or sent changes outside the identities):
    /// the watch is alive, nothing changed, and every change up to `revision` was seen, so
    /// a watch opened again starts there (a compaction bites less often).
    Progress { revision: i64 },
}

/// An event of the Kubernetes watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum K8sChange {
    /// The watch is established: the server answered 200 and streams from here.
    Connected,
    Upsert {
        id: u32,
        labels: LabelKey,
        resource_version: String,
    },
    Deleted {
        id: u32,
        resource_version: String,
    },
    /// Progress without a change (`allowWatchBookmarks`).
    Bookmark {
        resource_version: String,
    },
    /// The watched version is too old (410): list again.
    Expired,
    /// A fresh list after a 410, made by the one follower that then watches on from its
    /// `resource_version`: what sync holds is replaced by it, so no event between the list
    /// and the watch can fall between two lists.
    Relisted {
        identities: BTreeMap<u32, LabelKey>,
        resource_version: String,
    },
}

/// Who holds the one-writer Lease, as the lease keeper last knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseHolder {
    /// Not known (not yet answered, or a renewal failed): no writes.
    Unknown,
    Us,
    Other(String),
}

/// One event, with the time it happened passed beside it.
#[derive(Debug, Clone)]
pub enum Input {
    Kv(KvWatchEvent),
    K8s(K8sChange),
    Lease(LeaseHolder),
    /// The operator decided (the TUI, while sync runs).
    Decided(LoggedDecision),
    /// The operator undid the decision on this kvstore id: it waits for a decision again
    /// (and is reported again), as a resume of the log would have it.
    Undone(String),
    /// A batch of writes ended.
    BatchDone {
        ops: Vec<Op>,
        outcome: BatchOutcome,
    },
    /// The settle tick (100 ms): plan and write what changed.
    Settle,
    /// The status tick (1 s): retries due, the status, moot conflicts, cutover.
    Status {
        watching: bool,
    },
    /// A cutover check's verdict.
    Verdict(Result<(), CutoverWait>),
    /// The moot closures asked for were logged (those that were).
    MootLogged(Vec<(String, LabelKey)>),
    /// The refusal of the decision on this kvstore id could not be logged: it is not
    /// refused yet (a reader of the log would see the decision in force), and is refused
    /// again, logged, at a later round.
    RefusalNotLogged(String),
    /// The skip of this malformed kvstore entry could not be logged: it is not reported
    /// yet, and is reported again, logged, at a later round.
    InvalidNotLogged(String),
    /// The reservations answered: how many are held, and the master keys sync wrote.
    Reservations {
        held: usize,
        own_masters: BTreeSet<u32>,
    },
    /// Stop: no new batch; the end once the batch in flight is in.
    Stop,
}

/// What the reservations (`--reserve-in-kvstore`) are asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// A master key went (the kvstore's GC): reserve it again if Kubernetes holds `k8s`.
    MasterGone { id: u32, k8s: Option<LabelKey> },
    /// Kubernetes holds `id` for `labels`: reserve it.
    Want { id: u32, labels: LabelKey },
    /// The object at `id` went: unreserve.
    Deleted { id: u32 },
    /// A fresh view of Kubernetes: every id in it is looked at again.
    ViewChanged,
    /// A fresh read of the kvstore: what was found held before is looked at again (a key
    /// that went while the watch was not there, before a compaction, was never seen go).
    FreshKvstore,
    /// Write what is due.
    Pump,
    /// Cutover: no kvstore-mode node is left to need them.
    Release,
}

/// A split allocation to report once its nodes can be named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitFound {
    pub id: u32,
    pub k8s_labels: LabelKey,
    pub kv_value: Vec<u8>,
    pub found: Instant,
}

/// What carried each kvstore identity over, when cutover was reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutoverReport {
    /// Objects this sync created.
    pub mirrored: u64,
    /// Identities served at another id that holds their labels.
    pub mapped: usize,
    /// Identities the operator skipped.
    pub skipped: usize,
    /// Conflicts closed as moot.
    pub moot: usize,
}

impl std::fmt::Display for CutoverReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cutover reached: no kvstore-mode node is left, nothing is pending, and verify passes ({} mirrored by sync, {} mapped to an id holding their labels, {} skipped by decision, {} closed as moot)",
            self.mirrored, self.mapped, self.skipped, self.moot
        )
    }
}

/// How sync ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyncEnd {
    pub cutover: bool,
    pub status: SyncStatus,
    /// Writes that failed and had not been made when sync stopped (a failure retried
    /// successfully later is not among them).
    pub unwritten: usize,
}

/// A command for the shell that carries the machine out.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Both watches are established.
    Following,
    Note(String),
    Trouble(String),
    /// A malformed entry or a conflict, once each (an invalid one is logged as skipped).
    Report(SyncReport),
    /// Create these (each decision logged before its write), only while the Lease is held.
    Write(Vec<Op>),
    /// What a batch changed, for the metrics.
    Taken(Taken),
    Reserve(Reserve),
    ReportSplits(Vec<SplitFound>),
    /// Log these as closed without a write, then answer with `Input::MootLogged`.
    CloseMoot(Vec<(String, LabelKey, Kind)>),
    /// A conflict closed as moot (logged).
    Moot {
        id: String,
        labels: LabelKey,
    },
    /// Run the cutover check (a consistent verify) with these expectations beside the logs:
    /// identities served at another id that holds their labels, and those expected nowhere
    /// (closed as moot, skipped by a decision, sync's own reservations).
    Verify {
        reused: BTreeMap<String, u32>,
        nowhere: BTreeSet<String>,
    },
    Status(SyncStatus),
    /// Which nodes use each label set now, as the kvstore watch has it: the one source of
    /// node counts while sync runs (every screen shows these, not an older scan's). Sent
    /// with a status when they moved, at most once per `COUNTS_EVERY`.
    NodeCounts(NodeCounts),
    Cutover(CutoverReport),
    /// The kvstore was compacted past the watch: read a fresh snapshot (the batch in flight
    /// is taken in first), keeping this state's memory.
    Resnapshot,
    End(SyncEnd),
}

/// What a run of sync is set to.
#[derive(Debug, Clone)]
pub struct Settings {
    pub range: IdRange,
    pub accept_proposals: bool,
    pub until_cutover: bool,
    pub reserve_in_kvstore: bool,
    /// How long no kvstore-mode node must be seen before cutover.
    pub cutover_grace: Duration,
    /// The Lease as `namespace/name`, for what is said about it.
    pub lease: String,
}

/// What the cutover check expects: what the decision logs recorded, then the plan's reuses
/// (current: each target holds the labels now, so it wins over a mapping recorded earlier,
/// perhaps for labels the id held before the kvstore's GC freed it), then what is expected
/// nowhere (moot, skipped by a decision, sync's own reservations).
pub fn cutover_expectations(
    mut logged: Expectations,
    reused: &BTreeMap<String, u32>,
    nowhere: &BTreeSet<String>,
) -> Expectations {
    for (id, target) in reused {
        logged.mappings.insert(id.clone(), Some(*target));
        logged.mapped_labels.remove(id);
    }
    for id in nowhere {
        logged.mappings.insert(id.clone(), None);
        logged.mapped_labels.remove(id);
    }
    logged
}

/// The longest a cutover check waits for the next: at most one every 30 s while it may be
/// near (a full consistent verify takes 18 s at 65k on a real server).
pub const VERIFY_EVERY: Duration = Duration::from_secs(30);

/// The most often node counts are published: at 65,280 label sets a copy is about 1 MiB.
pub const COUNTS_EVERY: Duration = Duration::from_secs(5);

/// Sync's decisions (see the module).
pub struct Machine {
    state: SyncState,
    /// The operator's decisions: in force and refused (they outlive a round).
    decisions: Decisions,
    settings: Settings,
    holder: LeaseHolder,
    /// The Lease is valid now (the lease keeper's write gate), told with each input.
    lease_valid: bool,
    dirty: bool,
    batch_running: bool,
    verifying: bool,
    last_verify: Option<Instant>,
    last_verify_failed: Option<CutoverWait>,
    cutover_announced: bool,
    kv_up: bool,
    k8s_up: bool,
    following: bool,
    stopping: bool,
    ended: bool,
    counts_published: Option<Instant>,
    /// The round's first creates were announced (`catch_up_text`).
    catch_up_said: bool,
}

/// How a round's first creates read: what sync wrote as it started (or after a fresh read),
/// before anything arrived through its watches.
pub fn catch_up_text(n: u64) -> String {
    format!(
        "wrote {}: decided, or missing in Kubernetes, when sync read both sides (counted as mirrored)",
        crate::core::words::count(n, "CiliumIdentity object")
    )
}

impl Machine {
    pub fn new(settings: Settings, decisions: BTreeMap<String, LoggedDecision>) -> Self {
        Machine {
            state: SyncState::default(),
            decisions: Decisions::new(decisions),
            settings,
            holder: LeaseHolder::Unknown,
            lease_valid: false,
            dirty: true,
            batch_running: false,
            verifying: false,
            last_verify: None,
            last_verify_failed: None,
            cutover_announced: false,
            kv_up: false,
            k8s_up: false,
            following: false,
            stopping: false,
            ended: false,
            counts_published: None,
            catch_up_said: false,
        }
    }

    /// Who holds the Lease, known without a word (at start, before the keeper's first
    /// change is followed).
    pub fn know_holder(&mut self, holder: LeaseHolder) {
        self.holder = holder;
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// What sync knows of both sides and what it did.
    pub fn state(&self) -> &SyncState {
        &self.state
    }

    /// A round ends for a fresh read: what sync knew, taken to be carried to the next.
    pub fn take_state(&mut self) -> SyncState {
        std::mem::take(&mut self.state)
    }

    /// The operator's decisions as sync holds them.
    pub fn decisions(&self) -> &Decisions {
        &self.decisions
    }

    /// This sync holds the Lease and it is valid: it may write.
    pub fn holding(&self) -> bool {
        self.holder == LeaseHolder::Us && self.lease_valid
    }

    pub fn batch_running(&self) -> bool {
        self.batch_running
    }

    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Cutover was announced and stands (no kvstore-mode node came back since).
    pub fn cutover_announced(&self) -> bool {
        self.cutover_announced
    }

    /// A round starts from a fresh read of both sides (`state`, with what an earlier round
    /// carried folded in): nothing of the old round's watches, batch or checks is left.
    pub fn start_round(&mut self, state: SyncState, lease_valid: bool) -> Vec<Output> {
        self.state = state;
        self.lease_valid = lease_valid;
        self.dirty = true;
        self.batch_running = false;
        self.verifying = false;
        self.last_verify = None;
        self.last_verify_failed = None;
        // A fresh snapshot is no new rollout: cutover, once announced (and the reservations
        // released), stays so until a kvstore-mode node comes back (`on_status`).
        self.kv_up = false;
        self.k8s_up = false;
        self.following = false;
        self.catch_up_said = false;
        let mut out = Vec::new();
        if self.reserving() {
            // A master key of this sync's that the fresh view lacks went while no watch
            // said so (Cilium's GC, before a compaction): the writer forgets it, so that
            // its id is reserved again. Never a write by itself (see `Ledger::forget`).
            let gone: Vec<u32> = self
                .state
                .own_masters
                .iter()
                .copied()
                .filter(|id| {
                    !self
                        .state
                        .masters
                        .contains_key(IdDigits::of(*id).as_bytes())
                })
                .collect();
            out.extend(gone.into_iter().map(|id| self.master_gone(id)));
            out.push(Output::Reserve(Reserve::FreshKvstore));
        }
        if self.reserving() && self.holding() {
            // A fresh view: every id in it is looked at; the first batch goes before the
            // watches deliver anything. (What earlier syncs left is taken over by the shell
            // at the first reservation command that finds this sync holding.)
            out.push(Output::Reserve(Reserve::ViewChanged));
            out.push(Output::Reserve(Reserve::Pump));
        }
        out
    }

    /// One event at `now`; `lease_valid`: the Lease's write gate is open at `now`.
    pub fn step(&mut self, input: Input, now: Instant, lease_valid: bool) -> Vec<Output> {
        self.lease_valid = lease_valid;
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        match input {
            Input::Kv(ev) => self.on_kvstore(ev, now, &mut out),
            Input::K8s(ch) => self.on_kubernetes(ch, now, &mut out),
            Input::Lease(holder) => self.on_lease(holder, &mut out),
            Input::Decided(d) => {
                // The decisions changed: resumed onto the plan again at the next round.
                self.state.decision_changed(&d.id);
                self.decisions.decide(d);
                self.dirty = true;
            }
            Input::Undone(id) => {
                self.state.decision_changed(&id);
                self.decisions.undo(&id);
                self.dirty = true;
            }
            Input::BatchDone { ops, outcome } => {
                self.batch_running = false;
                let made = if self.reserving() {
                    made_objects(&ops, &outcome)
                } else {
                    Vec::new()
                };
                let taken = self.state.take_results(ops, outcome, now);
                if let Some(t) = &taken.trouble {
                    out.push(Output::Trouble(t.clone()));
                }
                // Creates with no lag are no arrival through a watch: the catch-up, said
                // once a round.
                if !self.catch_up_said && taken.mirrored > 0 && taken.lags.is_empty() {
                    self.catch_up_said = true;
                    out.push(Output::Note(catch_up_text(taken.mirrored)));
                }
                out.push(Output::Taken(taken));
                // What sync made (a remap target the kvstore does not hold) is reserved
                // at once, not when the watch shows it.
                let pump = !made.is_empty() && self.holding();
                for (id, labels) in made {
                    out.push(Output::Reserve(Reserve::Want { id, labels }));
                }
                if pump {
                    out.push(Output::Reserve(Reserve::Pump));
                }
                self.dirty = true;
            }
            Input::Settle => self.on_settle(now, &mut out),
            Input::Status { watching } => self.on_status(now, watching, &mut out),
            Input::Verdict(v) => self.on_verdict(v, &mut out),
            Input::MootLogged(closed) => {
                for (id, labels) in closed {
                    self.state.close_moot(&id);
                    self.state.reused.remove(&id);
                    out.push(Output::Moot { id, labels });
                }
                self.dirty = true;
            }
            Input::InvalidNotLogged(id) => {
                self.state.look_at(id.as_bytes());
                self.state.reported.remove(&id);
                self.dirty = true;
            }
            Input::RefusalNotLogged(id) => {
                self.decisions.unrefuse(&id);
                // Resumed again at the next round, which drops it again and says so.
                self.state.look_at(id.as_bytes());
                self.state.drop_overlay();
                self.dirty = true;
            }
            Input::Reservations { held, own_masters } => {
                self.state.status.reservations = held;
                if own_masters != self.state.own_masters {
                    // Sync's own master keys are never a kvstore identity to create for.
                    self.state.own_masters = own_masters;
                    self.state.look_at_all = true;
                    self.dirty = true;
                }
                // A batch answered lets the next go: what waited goes now, not at the
                // next settle.
                if self.reserving() && self.holding() {
                    out.push(Output::Reserve(Reserve::Pump));
                }
            }
            Input::Stop => self.stopping = true,
        }
        if self.kv_up && self.k8s_up && !self.following {
            self.following = true;
            out.push(Output::Following);
        }
        out
    }

    fn on_kvstore(&mut self, ev: KvWatchEvent, now: Instant, out: &mut Vec<Output>) {
        match ev {
            KvWatchEvent::Connected => self.kv_up = true,
            KvWatchEvent::Progress { .. } => {}
            KvWatchEvent::Changes {
                mut changes,
                revision,
            } => {
                self.state.kv_revision = revision;
                let gone: Vec<u32> = changes
                    .iter()
                    .filter_map(|c| match c {
                        KvChange::Master {
                            id, value: None, ..
                        } => parse_id(id).ok(),
                        _ => None,
                    })
                    .collect();
                // Sync's own reservations coming and going are no change to plan for: at
                // the quiet end of a rollout they would keep it from ever being quiet.
                changes.retain(|c| !c.is_own_reservation());
                let planned = !changes.is_empty();
                for c in changes {
                    self.state.apply_kv_change(c, now);
                }
                // Told to the writer whether or not this sync writes now: its ledger must
                // forget a reservation Cilium's GC took while the Lease was another's, or it
                // would never reserve that id again once the Lease is back.
                if self.reserving() && !gone.is_empty() {
                    out.extend(gone.into_iter().map(|id| self.master_gone(id)));
                    if self.holding() {
                        out.push(Output::Reserve(Reserve::Pump));
                    }
                }
                self.dirty |= planned;
            }
            KvWatchEvent::Compacted { compact_revision } => {
                out.push(Output::Trouble(format!(
                    "the kvstore was compacted past the watched revision ({compact_revision}): reading a fresh snapshot, keeping every decision"
                )));
                out.push(Output::Resnapshot);
            }
        }
    }

    fn on_kubernetes(&mut self, ch: K8sChange, now: Instant, out: &mut Vec<Output>) {
        let reserve = self.reserving();
        let holding = self.holding();
        let state = &mut self.state;
        match ch {
            K8sChange::Connected => {
                self.k8s_up = true;
                // The API server is back: what failed while it was gone is tried now, not
                // when its wait is over.
                if !state.failed.is_empty() {
                    state.failed.clear();
                    state.look_at_all = true;
                    self.dirty = true;
                }
            }
            K8sChange::Upsert {
                id,
                labels,
                resource_version,
            } => {
                state.k8s_upsert(id, labels.clone(), resource_version, now);
                // At once, not at the next plan: the window in which a kvstore-mode agent
                // can hand the id out again is as short as the watch's lag. Queued even
                // while the gate is shut a moment (a renewal late): nothing looks at the
                // whole view again when it opens.
                if reserve {
                    out.push(Output::Reserve(Reserve::Want { id, labels }));
                    if holding {
                        out.push(Output::Reserve(Reserve::Pump));
                    }
                }
                self.dirty = true;
            }
            K8sChange::Deleted {
                id,
                resource_version,
            } => {
                state.k8s_delete(id, resource_version, now);
                if reserve {
                    out.push(Output::Reserve(Reserve::Deleted { id }));
                    if holding {
                        out.push(Output::Reserve(Reserve::Pump));
                    }
                }
                self.dirty = true;
            }
            K8sChange::Bookmark { resource_version } => state.k8s_version = resource_version,
            // The follower lists again and sends `Relisted`.
            K8sChange::Expired => {}
            K8sChange::Relisted {
                identities,
                resource_version,
            } => {
                state.k8s_relisted(identities, resource_version, now);
                if reserve {
                    out.push(Output::Reserve(Reserve::ViewChanged));
                }
                self.dirty = true;
            }
        }
    }

    fn on_lease(&mut self, holder: LeaseHolder, out: &mut Vec<Output>) {
        let what = format!("lease {}", self.settings.lease);
        self.state.status.standby = None;
        match &holder {
            LeaseHolder::Us => {
                // Everything seen while another sync wrote is planned (and reserved) again.
                if self.reserving() {
                    out.push(Output::Reserve(Reserve::ViewChanged));
                }
                self.dirty = true;
                out.push(Output::Note(format!("{what} taken: this sync writes")));
            }
            LeaseHolder::Other(who) => {
                self.state.status.standby = Some(who.clone());
                out.push(Output::Note(format!(
                    "{what} is held by {who}: following both sides without writing until it is free"
                )));
            }
            LeaseHolder::Unknown => out.push(Output::Trouble(format!(
                "{what} could not be renewed: no writes until it is held again"
            ))),
        }
        self.holder = holder;
    }

    /// The settle tick: the splits found since the last one, the end on a stop, and (only
    /// the Lease's holder) a plan and the writes of what changed.
    fn on_settle(&mut self, now: Instant, out: &mut Vec<Output>) {
        if !self.state.splits_to_report.is_empty() {
            out.push(Output::ReportSplits(self.splits_to_report()));
        }
        if self.stopping {
            if self.batch_running {
                return;
            }
            self.state.refresh_lag_percentiles();
            self.ended = true;
            out.push(Output::End(SyncEnd {
                cutover: false,
                status: self.state.status.clone(),
                unwritten: self.state.unwritten_now(),
            }));
            return;
        }
        // Only the lease's holder writes (to the API server, the log, the kvstore).
        if !self.holding() {
            // A standby plans and writes nothing, but says what it sees.
            self.state.status.kvstore_nodes = self.state.counts.nodes().count();
            self.state.status.identities = self.state.masters.len();
            return;
        }
        if self.reserving() {
            out.push(Output::Reserve(Reserve::Pump));
        }
        if !self.dirty || self.batch_running {
            return;
        }
        self.dirty = false;
        let s = &self.settings;
        let (ops, reports) =
            self.state
                .round(&mut self.decisions, s.range, s.accept_proposals, now);
        out.extend(reports.into_iter().map(Output::Report));
        if !ops.is_empty() {
            self.batch_running = true;
            out.push(Output::Write(ops));
        }
    }

    /// The splits found and still there (the kvstore's GC or a delete may have ended one).
    fn splits_to_report(&mut self) -> Vec<SplitFound> {
        let state = &mut self.state;
        std::mem::take(&mut state.splits_to_report)
            .into_iter()
            .filter_map(|(id, found)| {
                Some(SplitFound {
                    id,
                    k8s_labels: state.k8s.get(&id)?.clone(),
                    kv_value: state.masters.get(IdDigits::of(id).as_bytes())?.clone(),
                    found,
                })
            })
            .collect()
    }

    /// The writer told that the master key at `id` went, with what Kubernetes holds there
    /// (reserved again if it holds something).
    fn master_gone(&self, id: u32) -> Output {
        let k8s = self.state.k8s.get(&id).cloned();
        Output::Reserve(Reserve::MasterGone { id, k8s })
    }

    /// Whether sync reserves in the kvstore now: with `--reserve-in-kvstore`, until cutover
    /// released the reservations (no kvstore-mode node is left to need them); again once a
    /// node comes back.
    pub fn reserving(&self) -> bool {
        self.settings.reserve_in_kvstore && !self.cutover_announced
    }
}

/// The objects a batch made or found made: their ids and label keys.
fn made_objects(ops: &[Op], outcome: &BatchOutcome) -> Vec<(u32, LabelKey)> {
    let BatchOutcome::Done { results, .. } = outcome else {
        return Vec::new();
    };
    results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Created | Outcome::AlreadyExisted))
        .filter_map(|(t, _)| {
            let op = ops.iter().find(|op| op.target_id == Some(*t))?;
            Some((*t, op.label_key.clone()))
        })
        .collect()
}

pub mod cutover;

#[cfg(test)]
mod tests;
