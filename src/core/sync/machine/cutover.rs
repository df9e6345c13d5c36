//! The machine's side of cutover: the status tick that watches for the last kvstore-mode
//! node, when the rollout is over, what cutover still waits for, and the check's verdict.

use super::*;
use crate::core::decision_log::Record;

impl Machine {
    /// The status tick: retries whose wait is over, the status, moot conflicts and, once
    /// the rollout is over and all is quiet, a cutover check.
    pub(super) fn on_status(&mut self, now: Instant, watching: bool, out: &mut Vec<Output>) {
        let state = &mut self.state;
        // A failed write is tried again when its wait is over, even when nothing else
        // happens (at the quiet end of a rollout, nothing else would).
        // So is a deleted object whose wait is over (`SyncState::settling`).
        if state.expire_waits(now) {
            self.dirty = true;
        }
        state.refresh_lag_percentiles();
        state.status.watching = watching;
        state.count_doubles();
        if state.status.kvstore_nodes > 0 {
            state.no_nodes_since = None;
            if self.cutover_announced && self.settings.reserve_in_kvstore {
                // Cutover released the reservations; a node back in kvstore mode needs them
                // again, whole: a fresh read, before which the writer starts anew.
                out.push(Output::Trouble(
                    "a kvstore-mode node is back after cutover: reading both sides again to reserve anew".into(),
                ));
                out.push(Output::Resnapshot);
            }
            // A kvstore-mode node coming back starts the watch for cutover again.
            self.cutover_announced = false;
            self.last_verify_failed = None;
        } else if state.no_nodes_since.is_none() {
            state.no_nodes_since = Some(now);
        }
        let grace = self.settings.cutover_grace;
        let rollout_over = self.rollout_over(now);
        if rollout_over {
            let mut moot = self.state.moot_now();
            // Decided since the last plan (and not refused): carried out at the next settle,
            // not closed as waiting for a decision it has.
            let decisions = &self.decisions;
            moot.retain(|(id, _, _)| decisions.get(id).is_none() || decisions.is_refused(id));
            if !moot.is_empty() {
                // Closed once logged (`MootLogged`); nothing is quiet until then.
                self.dirty = true;
                out.push(Output::CloseMoot(moot));
            }
        }
        self.say_cutover_wait(now, grace);
        out.push(Output::Status(self.state.status.clone()));
        let counts_due = self
            .counts_published
            .is_none_or(|t| now.saturating_duration_since(t) >= COUNTS_EVERY);
        if self.state.counts_changed && counts_due {
            self.state.counts_changed = false;
            self.counts_published = Some(now);
            out.push(Output::NodeCounts(self.state.counts.clone()));
        }
        let due = self
            .last_verify
            .is_none_or(|t| now.saturating_duration_since(t) > VERIFY_EVERY);
        if !(rollout_over && self.quiet() && due && !self.cutover_announced && !self.verifying) {
            return;
        }
        self.last_verify = Some(now);
        self.verifying = true;
        out.push(Output::Verify {
            reused: self.state.reused.clone(),
            nowhere: self.expected_nowhere(),
        });
    }

    /// What the cutover check expects in Kubernetes nowhere: the identities closed as moot,
    /// sync's own reservations, those skipped by a decision, and objects sync made that the
    /// cluster's GC deleted since and that are not made again.
    pub(super) fn expected_nowhere(&self) -> BTreeSet<String> {
        let mut nowhere = self.state.moot.clone();
        // Sync's own reservations are no kvstore identities: verify expects no object there.
        nowhere.extend(self.state.reservations_alone().map(|id| id.to_string()));
        // Skipped by a decision: like moot, a decision, not a problem (the log records the
        // decision, not an outcome, so verify would otherwise expect the object for ever).
        nowhere.extend(
            self.decisions
                .in_force()
                .values()
                .filter(|d| {
                    // Only while the id still holds the labels decided on (the kvstore's GC
                    // may have freed it for others since).
                    d.action == crate::core::planner::Action::Skip
                        && self
                            .state
                            .masters
                            .get(d.id.as_bytes())
                            .is_some_and(|v| v == d.labels.as_bytes())
                })
                .map(|d| d.id.clone()),
        );
        // Made by this sync and deleted since by the cluster's GC (or a person), and not
        // made again (sync makes such an object again only while nodes use it, and once):
        // the deletion is respected, and not waited for.
        let state = &self.state;
        if !state.deleted_after_create.is_empty() {
            nowhere.extend(
                state
                    .planned_items()
                    .into_iter()
                    .filter(|i| {
                        i.target_id.is_some_and(|t| {
                            state.deleted_after_create.get(&t) == Some(&i.labels)
                                && !state.k8s.contains_key(&t)
                        })
                    })
                    .map(|i| i.id),
            );
        }
        nowhere
    }

    /// No kvstore-mode node for the grace, and this sync holds the Lease.
    pub(super) fn rollout_over(&self, now: Instant) -> bool {
        self.state
            .no_nodes_since
            .is_some_and(|t| now.saturating_duration_since(t) >= self.settings.cutover_grace)
            && self.holding()
    }

    /// What cutover waits for, in the status.
    pub(super) fn say_cutover_wait(&mut self, now: Instant, grace: Duration) {
        let state = &self.state;
        let unsettled = state.in_flight.len()
            + state.failed.len()
            + state.settling.len()
            + usize::from(self.batch_running || self.dirty);
        let wait = (!self.cutover_announced)
            .then(|| {
                super::super::cutover_wait(
                    &state.status,
                    state
                        .no_nodes_since
                        .map(|t| now.saturating_duration_since(t)),
                    grace,
                    (
                        unsettled,
                        state.denied_now(),
                        self.holding(),
                        self.verifying,
                    ),
                    self.last_verify_failed.as_ref(),
                )
            })
            .flatten();
        self.state.status.cutover_wait = wait;
    }

    /// Nothing pending, in flight, failing or waiting to be planned.
    pub(super) fn quiet(&self) -> bool {
        self.state.status.pending == 0
            && self.state.denied_now().is_none()
            && self.state.in_flight.is_empty()
            && self.state.failed.is_empty()
            && self.state.settling.is_empty()
            && !self.batch_running
            && !self.dirty
    }

    /// A cutover check's verdict: announced if it passed and the rollout is still over and
    /// quiet (a node may have come back, or something arrived, while it ran).
    pub(super) fn on_verdict(&mut self, verdict: Result<(), CutoverWait>, out: &mut Vec<Output>) {
        self.verifying = false;
        if let Err(failed) = verdict {
            // Said until the next check, so nobody wonders whether sync is stuck.
            out.push(Output::Note(format!("cutover not yet: {failed}")));
            self.last_verify_failed = Some(failed);
            return;
        }
        self.last_verify_failed = None;
        // A node whose `value/` key arrived while the check ran is there now, whether or not
        // a status tick has seen it since.
        let still_over = self.state.status.kvstore_nodes == 0
            && self.state.no_nodes_since.is_some()
            && self.holding();
        if !still_over || !self.quiet() || self.cutover_announced {
            return;
        }
        self.cutover_announced = true;
        let state = &mut self.state;
        out.push(Output::Cutover(CutoverReport {
            mirrored: state.status.mirrored,
            mapped: state.reused.len(),
            skipped: state.skipped,
            moot: state.moot.len(),
        }));
        if self.settings.reserve_in_kvstore {
            out.push(Output::Reserve(Reserve::Release));
            state.status.reservations = 0;
        }
        if self.settings.until_cutover {
            self.ended = true;
            out.push(Output::End(SyncEnd {
                cutover: true,
                status: state.status.clone(),
                unwritten: 0,
            }));
        }
    }
}

/// The cutover check's verdict, the one both the binary and the simulation run: what the
/// decision logs expect (`logged`), with the plan's reuses and the identities it serves
/// nowhere, checked by a verify of both sides as read (`masters`, `k8s`). A failure names
/// its first few problems, each with its id and why: enough to act on, short enough for a
/// line. A pass comes with the lines the logs lack for `verify --decision-log` to expect
/// what the check expected (the plan's reuses and skips no log records): to be logged
/// before cutover is announced, so that sync's log is the whole record of the rollout.
pub fn cutover_verdict(
    logged: Expectations,
    (reused, nowhere): (&BTreeMap<String, u32>, &BTreeSet<String>),
    (masters, k8s): (&[MasterEntry], &BTreeMap<u32, LabelKey>),
    range: IdRange,
) -> Result<Vec<Record>, CutoverWait> {
    let unlogged = unlogged_lines(&logged, (reused, nowhere), masters);
    let expect = cutover_expectations(logged, reused, nowhere);
    let report = crate::core::verify::verify(masters, k8s, &expect, range);
    if report.problems.is_empty() {
        return Ok(unlogged);
    }
    let first: Vec<String> = report
        .problems
        .iter()
        .take(3)
        .map(|p| {
            let at = p
                .expected_at
                .map_or(String::new(), |t| format!(" (at {t})"));
            let found = p
                .found_labels
                .as_deref()
                .map_or(String::new(), |l| format!(", Kubernetes holds {l}"));
            format!("{} {}{at}{found}", p.id, p.problem.as_str())
        })
        .collect();
    Err(CutoverWait::Verify {
        problems: report.problems.len(),
        first: first.join("; "),
    })
}

/// A line for each reuse or skip of the plan that `logged` does not expect already, with
/// the labels the kvstore holds for it: a mapping (`mapped`) or a skip (`skipped`), never
/// read as a decision (decided by the proposal, not a person). One pass over the kvstore's
/// identities: at 65,280 of them the check runs every 30 s near cutover.
fn unlogged_lines(
    logged: &Expectations,
    (reused, nowhere): (&BTreeMap<String, u32>, &BTreeSet<String>),
    masters: &[MasterEntry],
) -> Vec<Record> {
    if reused.is_empty() && nowhere.is_empty() {
        return Vec::new();
    }
    let mut lines = Vec::new();
    for m in masters {
        let Ok(id) = std::str::from_utf8(&m.id) else {
            continue;
        };
        // As `cutover_expectations` folds them: served nowhere wins over a reuse.
        let target = match (nowhere.contains(id), reused.get(id)) {
            (true, _) => None,
            (false, Some(t)) => Some(*t),
            (false, None) => continue,
        };
        let labels = String::from_utf8_lossy(&m.value);
        let already = logged.mappings.get(id) == Some(&target)
            && logged.mapped_labels.get(id).map(String::as_str) == Some(labels.as_ref());
        if already {
            continue;
        }
        let (kind, action, text) = match target {
            Some(t) => (
                Kind::Reuse,
                "map",
                format!("map (proposal): served at {t}, where Kubernetes holds its labels"),
            ),
            None => (Kind::Create, "skip", "skip".to_string()),
        };
        let by = ("proposal", action);
        lines.push(Record::serving(id, &labels, kind, target, text, by));
    }
    lines
}

/// A verdict as the machine takes it, once the lines a pass comes with are in the log
/// (`append`, the binary's file or the simulation's): a line the log refuses turns the pass
/// into a wait, so cutover is never announced on a log that does not hold the whole record.
pub fn logged_verdict<E: std::fmt::Display>(
    verdict: Result<Vec<Record>, CutoverWait>,
    mut append: impl FnMut(Record) -> Result<(), E>,
) -> Result<(), CutoverWait> {
    for line in verdict? {
        append(line).map_err(|e| CutoverWait::Verify {
            problems: 1,
            first: format!("the decision log cannot be written ({e}): its record of the mappings cutover relies on is missing"),
        })?;
    }
    Ok(())
}
