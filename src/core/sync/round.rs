//! A round of sync: the plan (kept up to date where a change stays local), the writes it
//! selects, what it publishes (conflicts, malformed entries, refusals, once each), and what a
//! batch's outcomes change.

use super::*;
use crate::core::planner::reconcile::Among;

impl SyncState {
    /// One round: the plan (kept up to date, or made in full when a change was not local,
    /// and always with decisions to replay), the creates it makes and what it reports; the
    /// counts published.
    pub(super) fn round(
        &mut self,
        decisions: &mut Decisions,
        range: crate::core::range::IdRange,
        accept_proposals: bool,
        now: Instant,
    ) -> (Vec<Op>, Vec<SyncReport>) {
        // A wait over now lets its item through in this very round (looked at while the
        // plan still says which items would create at the id).
        self.expire_waits(now);
        let (mut cache, rebuilt) = match self.cache.take() {
            Some(c) if c.range() == range => (c, false),
            _ => {
                let items = self.plan(&BTreeMap::new(), range);
                (
                    PlanCache::build(items, &self.masters, &self.k8s, range),
                    true,
                )
            }
        };
        let changed = cache.take_changed();
        #[cfg(test)]
        switches::check_kept_plan(&cache, self.plan(&BTreeMap::new(), range));
        let mut refusals = Vec::new();
        if decisions.is_empty() {
            self.drop_overlay();
        } else if rebuilt || changed.beyond_local || self.overlay.is_none() {
            // A change that moved more than its own plain item may move what a decision
            // stands on: the decisions resumed again onto the part of the plan they touch,
            // kept until a change names what they touch. Each decided item is looked at
            // (one decided, undone or refused now among them), and those the last overlay
            // changed (`drop_overlay`).
            self.drop_overlay();
            let live = cache.touched_by(decisions.in_force());
            let is_kv_id = |n| cache.holds_kv_id(n);
            let among = Among {
                is_kv_id: &is_kv_id,
            };
            let resumed =
                resume::resume_among(&live, among, decisions.in_force(), &self.k8s, range);
            #[cfg(test)]
            switches::check_resume(&cache, &live, decisions.in_force(), &self.k8s, &resumed);
            refusals = self.refusals(&live, resumed.dropped, decisions);
            let decided = decisions.in_force().keys();
            self.look_at.extend(decided.map(|id| key_of(id.as_bytes())));
            self.overlay = Some(Overlay::of(&live, resumed.items, decisions.in_force()));
        }
        let overlay = self.overlay.take();
        let resumed = |i| resumed(overlay.as_ref(), i);
        let items = || cache.items().map(resumed);
        // Every item when the plan is new, else those it changed and those something around
        // them did: a round costs what changed.
        let whole = rebuilt || std::mem::take(&mut self.look_at_all) || switches::every_item();
        let mut look_at = std::mem::take(&mut self.look_at);
        let mut out = if whole {
            self.select_writes(items(), true, accept_proposals, decisions)
        } else {
            look_at.extend(changed.items);
            for gone in look_at.iter().filter(|k| cache.item(k).is_none()) {
                self.waiting.remove(gone);
            }
            let few = look_at.iter().filter_map(|k| cache.item(k)).map(resumed);
            self.select_writes(few, false, accept_proposals, decisions)
        };
        // The refusals before the conflicts they send back to waiting.
        refusals.append(&mut out.1);
        out.1 = refusals;
        if whole {
            self.publish(items());
        } else {
            // The skips are the decisions' (only a decided item skips); the reuses of what
            // this round looked at are found again.
            self.skipped = overlay.as_ref().map_or(0, |o| {
                let skips = o.items.values();
                skips
                    .filter(|i| i.decided && i.action == Action::Skip)
                    .count()
            });
            for key in &look_at {
                let item = cache.item(key).map(resumed);
                self.publish_one(&key.2, item);
            }
            self.status.identities = cache.len();
            self.status.kvstore_nodes = self.counts.nodes().count();
        }
        self.overlay = overlay;
        self.cache = Some(cache);
        out
    }

    /// The decisions resume dropped, as reports: each once (until decided again), and only
    /// for an identity the plan still holds (a decision on one the kvstore no longer holds,
    /// from an older log, has nothing left to carry out).
    fn refusals(
        &mut self,
        live: &[PlanItem],
        dropped: Vec<resume::Dropped>,
        decisions: &mut Decisions,
    ) -> Vec<SyncReport> {
        let mut out = Vec::new();
        if dropped.is_empty() {
            return out;
        }
        let kinds: HashMap<&str, Kind> = live.iter().map(|i| (i.id.as_str(), i.kind)).collect();
        for d in dropped {
            let (Some(decision), Some(&kind)) = (decisions.get(&d.id), kinds.get(d.id.as_str()))
            else {
                continue;
            };
            let reason = format!("{}; it waits for a decision again", d.reason);
            if let Some(r) = refuse(decisions, decision.clone(), kind, reason) {
                // Waiting again: its conflict is said again, with the fresh proposal.
                self.reported.remove(&d.id);
                out.push(r);
            }
        }
        out
    }

    /// The plan as the last round saw it: kept up to date, with the decisions resumed onto it.
    pub fn planned_items(&self) -> Vec<PlanItem> {
        let Some(cache) = &self.cache else {
            return Vec::new();
        };
        cache
            .items()
            .map(|i| {
                self.overlay
                    .as_ref()
                    .and_then(|o| o.items.get(&i.id))
                    .unwrap_or(i)
                    .clone()
            })
            .collect()
    }

    /// The creates this round makes: plain creates and decided (or accepted) remaps and
    /// duplicates whose target is free, not in flight and not failing; conflicts and invalid
    /// entries are reported once each.
    /// `whole`: `items` are every item (else those that may have changed since the last
    /// round: every other one would be selected as it was).
    pub(super) fn select_writes<'a>(
        &mut self,
        items: impl Iterator<Item = &'a PlanItem>,
        whole: bool,
        accept_proposals: bool,
        decisions: &mut Decisions,
    ) -> (Vec<Op>, Vec<SyncReport>) {
        if whole {
            self.waiting.clear();
        }
        self.waiting_taken = false;
        let mut claimed_labels: HashSet<String> = self.in_flight.values().cloned().collect();
        let mut ops = Vec::new();
        let mut reports = Vec::new();
        for item in items {
            let key = key_of(item.id.as_bytes());
            self.waiting.remove(&key);
            if item.kind == Kind::Invalid {
                if self.reported.insert(item.id.clone()) {
                    reports.push(SyncReport::Invalid {
                        id: item.id.clone(),
                        labels: item.labels.clone(),
                        reason: item.reason.to_string(),
                        at_read: whole,
                    });
                }
                continue;
            }
            if self.reservation_alone(item) {
                // Sync's own master key (the object it reserved went, by the operator's GC):
                // nothing to create, nothing to decide; a decision on it is refused, once.
                if item.decided && item.action == Action::Create {
                    let why = "the kvstore holds this id only as this sync's own reservation (the object it reserved was deleted since): nothing to create";
                    reports.extend(refuse_once(
                        decisions,
                        item,
                        item.target_id,
                        why.to_string(),
                    ));
                }
                continue;
            }
            let waiting = item.kind.needs_decision() && !item.decided && !accept_proposals;
            if waiting && self.moot.contains(&item.id) {
                continue;
            }
            if waiting && item.action == Action::Create {
                // Its lag would count the operator's time: measured apart.
                self.waited_for_decision.insert(item.id.clone());
                self.waiting
                    .insert(key, (item.id.clone(), item.labels.clone(), item.kind));
                if self.reported.insert(item.id.clone()) {
                    reports.push(SyncReport::Conflict {
                        id: item.id.clone(),
                        kind: item.kind,
                        reason: item.reason.to_string(),
                    });
                }
                continue;
            }
            let (Action::Create, Some(t)) = (item.action, item.target_id) else {
                continue;
            };
            // One object per label set: not while a create of the same labels (for another
            // kvstore id that the kvstore's GC removed since) is still in flight, nor twice
            // in one round.
            if self.k8s.contains_key(&t)
                || self.in_flight.contains_key(&t)
                || self.failed.contains_key(&t)
                || self.settling.contains_key(&t)
                || self.denied.get(&t).is_some_and(|d| d.labels == item.labels)
                || claimed_labels.contains(item.labels.as_str())
            {
                continue;
            }
            if self.deleted_after_create.get(&t) == Some(&item.labels)
                && !self.make_again(item, t, decisions, &mut reports)
            {
                continue;
            }
            ops.push(create_op(item, t));
            claimed_labels.insert(item.labels.clone());
        }
        self.status.pending = self.waiting.len();
        for op in &ops {
            if let Some(t) = op.target_id {
                self.in_flight.insert(t, op.label_key.clone());
            }
        }
        (ops, reports)
    }

    /// An object this sync made at `t` for `item`'s labels, deleted since: whether it is made
    /// again now (counted), or held back by the make-again-once rule (counted once, and a
    /// decision on it refused once).
    fn make_again(
        &mut self,
        item: &PlanItem,
        t: u32,
        decisions: &mut Decisions,
        reports: &mut Vec<SyncReport>,
    ) -> bool {
        if !self.may_make_again(t, item.labels.as_bytes()) {
            if self.reported.insert(format!("deleted:{t}")) {
                self.status.deleted_not_recreated += 1;
            }
            if item.decided {
                let why = format!(
                    "its object at {t}, made by this sync, was deleted since and no kvstore-mode node uses these labels; made again if one does"
                );
                reports.extend(refuse_once(decisions, item, Some(t), why));
            }
            return false;
        }
        self.recreated.insert(t);
        self.status.recreated += 1;
        true
    }

    /// What the latest plan says beyond the writes: skips, reuses, counts.
    pub(super) fn publish<'a>(&mut self, items: impl Iterator<Item = &'a PlanItem> + Clone) {
        self.skipped = items
            .clone()
            .filter(|i| i.decided && i.action == Action::Skip)
            .count();
        self.reused = items
            .clone()
            .filter_map(|i| Some((i.id.clone(), self.reused_at(i)?)))
            .collect();
        self.status.identities = items.count();
        self.status.kvstore_nodes = self.counts.nodes().count();
    }

    /// The reuse of kvstore id `id` found again (`item`: its item now, if it has one).
    fn publish_one(&mut self, id: &str, item: Option<&PlanItem>) {
        match item.and_then(|i| self.reused_at(i)) {
            Some(t) => self.reused.insert(id.to_string(), t),
            None => self.reused.remove(id),
        };
    }

    /// Where the plan serves `item` at another id that already holds its labels: mapped
    /// there, or a create there made already (by a CRD-mode agent, another sync, or this one
    /// before a crash cut its outcome line off). Not once closed as moot: the cutover check
    /// expects it nowhere.
    fn reused_at(&self, i: &PlanItem) -> Option<u32> {
        let t = i.target_id?;
        let served = i.action == Action::None
            || (i.action == Action::Create
                && self.k8s.get(&t).is_some_and(|l| l.as_str() == i.labels));
        (served && !same_id(&i.id, t) && !self.moot.contains(&i.id)).then_some(t)
    }

    /// Folds a batch's outcomes in. `batch_failed`: the batch as a whole failed (e.g. its
    /// log lines could not be written), so nothing of it was written; `halted`: why the
    /// executor stopped it. Everything not written is tried again after `RETRY_AFTER`.
    pub(super) fn take_results(
        &mut self,
        ops: Vec<Op>,
        outcome: BatchOutcome,
        now: Instant,
    ) -> Taken {
        let labels: HashMap<u32, (String, String)> = ops
            .into_iter()
            .filter_map(|o| o.target_id.map(|t| (t, (o.id, o.label_key))))
            .collect();
        for (t, (id, label_key)) in &labels {
            self.in_flight.remove(t);
            // Its item, what creates at its target now, and any other with its labels that
            // waited for this create to end.
            self.look_at.insert(key_of(id.as_bytes()));
            self.look_at_target(*t);
            self.look_at_labels(label_key.as_bytes());
        }
        let mut taken = Taken::default();
        let results = match outcome {
            // A fault the rules ride out is a failed batch (the shell turns it into one).
            BatchOutcome::Failed(why) | BatchOutcome::Faulted { why, .. } => {
                // No write without its log line: nothing of this batch was written.
                for (t, (id, _)) in &labels {
                    self.failed.insert(*t, now + RETRY_AFTER);
                    self.unwritten.insert(*t, id.clone());
                }
                self.status.failures += labels.len() as u64;
                taken.failures = labels.len() as u64;
                taken.trouble = Some(format!(
                    "{} writes not made: {why}; trying again in {} s",
                    labels.len(),
                    RETRY_AFTER.as_secs()
                ));
                return taken;
            }
            BatchOutcome::Done {
                results,
                halted,
                denied,
            } => {
                taken.trouble =
                    halted.map(|why| format!("{why}; trying again in {} s", RETRY_AFTER.as_secs()));
                for (t, words) in denied {
                    let Some((id, label_key)) = labels.get(&t) else {
                        continue;
                    };
                    let said = format!(
                        "the API server denied the create of {id} at {t}: {words}; not tried again until its labels there change or sync starts again"
                    );
                    taken.trouble = Some(match taken.trouble.take() {
                        Some(before) => format!("{before}; {said}"),
                        None => said,
                    });
                    let denial = Denial {
                        id: id.clone(),
                        labels: label_key.clone(),
                        words,
                    };
                    self.denied.insert(t, denial);
                }
                results
            }
        };
        for (t, outcome) in results {
            let Some((id, label_key)) = labels.get(&t) else {
                continue;
            };
            match outcome {
                Outcome::Created | Outcome::AlreadyExisted => {
                    self.unwritten.remove(&t);
                    self.set_object(t, label_key.clone());
                    // A remap target a kvstore-mode agent took meanwhile is split now: found
                    // at once, not when the watch shows sync its own object.
                    self.check_split(t, now);
                    if outcome == Outcome::Created {
                        self.created.insert(t);
                        self.status.mirrored += 1;
                        taken.mirrored += 1;
                    }
                    let waited = self.waited_for_decision.remove(id.as_str());
                    if let Some(seen) = self.first_seen.remove(id.as_bytes()) {
                        let lag = now.duration_since(seen);
                        if waited {
                            // From arrival to write, most of it a person deciding: not lag.
                            self.status.decision_wait_last = Some(lag);
                        } else {
                            self.record_lag(lag);
                            taken.lags.push(lag);
                        }
                    }
                }
                Outcome::Failed | Outcome::Conflict => {
                    self.status.failures += 1;
                    taken.failures += 1;
                    // Try again later; a conflict resolves itself once the watch shows the
                    // object.
                    self.failed.insert(t, now + RETRY_AFTER);
                    self.unwritten.insert(t, id.clone());
                }
                // Denied by an admission check: its words kept above; never tried in a loop.
                Outcome::Denied => {
                    self.status.failures += 1;
                    taken.failures += 1;
                    self.unwritten.insert(t, id.clone());
                }
                // Not attempted (the batch was halted): tried again with the failed ones.
                Outcome::NotAttempted => {
                    self.failed.insert(t, now + RETRY_AFTER);
                    self.unwritten.insert(t, id.clone());
                }
                _ => {}
            }
        }
        taken
    }
}

/// `item` as the decisions resumed onto the plan have it.
fn resumed<'a>(overlay: Option<&'a Overlay>, item: &'a PlanItem) -> &'a PlanItem {
    overlay.and_then(|o| o.items.get(&item.id)).unwrap_or(item)
}

/// The create of `item` at `t`, and who decided it.
fn create_op(item: &PlanItem, t: u32) -> Op {
    Op {
        id: item.id.clone(),
        label_key: item.labels.clone(),
        kind: item.kind,
        op: OpKind::Create,
        target_id: Some(t),
        decided_by: if item.decided {
            DecidedBy::Operator
        } else if item.kind.needs_decision() {
            DecidedBy::AcceptProposals
        } else {
            DecidedBy::Proposal
        },
        expect: None,
        reason: None,
    }
}

/// A decided item that the rules hold back (`why`): said once per decision, as a refusal,
/// so the decision does not end in silence. It stays in force (carried out if what holds it
/// back goes).
fn refuse_once(
    decisions: &mut Decisions,
    item: &PlanItem,
    target_id: Option<u32>,
    why: String,
) -> Option<SyncReport> {
    let decision = LoggedDecision {
        id: item.id.clone(),
        labels: item.labels.clone(),
        action: item.action,
        target_id,
    };
    refuse(decisions, decision, item.kind, why)
}

/// A refusal of `decision`, once: `None` when this very decision was refused already.
fn refuse(
    decisions: &mut Decisions,
    decision: LoggedDecision,
    kind: Kind,
    reason: String,
) -> Option<SyncReport> {
    decisions.refuse(&decision).then_some(SyncReport::Refused {
        decision,
        kind,
        reason,
    })
}

/// Switches for the simulation's tests: a round that looks at every item (its writes and
/// reports must be those of a round that looks at what changed), and a check, at every
/// round, that the plan kept up to date is the full plan.
pub(crate) mod switches {
    #[cfg(test)]
    use super::*;
    #[cfg(test)]
    use std::cell::Cell;

    #[cfg(test)]
    thread_local! {
        pub static EVERY_ITEM: Cell<bool> = const { Cell::new(false) };
        pub static CHECK_PLAN: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether rounds look at every item (only ever in tests).
    pub fn every_item() -> bool {
        #[cfg(test)]
        {
            EVERY_ITEM.with(Cell::get)
        }
        #[cfg(not(test))]
        {
            false
        }
    }

    /// Panics when the decisions resumed onto the part of the plan they touch (`resumed`)
    /// are not what they are resumed onto the whole plan.
    #[cfg(test)]
    pub fn check_resume(
        cache: &PlanCache,
        part: &[PlanItem],
        decisions: &BTreeMap<String, LoggedDecision>,
        k8s: &BTreeMap<u32, LabelKey>,
        resumed: &resume::Resumed,
    ) {
        if !CHECK_PLAN.with(Cell::get) {
            return;
        }
        let live: Vec<PlanItem> = cache.items().cloned().collect();
        let whole = resume::resume(&live, decisions, k8s, cache.range());
        let changed = |items: &[PlanItem], live: &[PlanItem]| -> Vec<PlanItem> {
            let live: HashMap<&str, &PlanItem> = live.iter().map(|i| (i.id.as_str(), i)).collect();
            items
                .iter()
                .filter(|i| live.get(i.id.as_str()) != Some(i))
                .cloned()
                .collect()
        };
        assert_eq!(
            changed(&resumed.items, part),
            changed(&whole.items, &live),
            "the decisions resumed onto the part of the plan they touch changed other items than resumed onto the whole"
        );
        assert_eq!(resumed.dropped, whole.dropped, "dropped other decisions");
        assert_eq!(resumed.resumed, whole.resumed);
    }

    /// Panics when the kept plan is not `full` (node counts aside), with the first items
    /// that differ.
    #[cfg(test)]
    pub fn check_kept_plan(cache: &PlanCache, full: Vec<PlanItem>) {
        if !CHECK_PLAN.with(Cell::get) {
            return;
        }
        let strip = |i: &PlanItem| PlanItem {
            nodes: 0,
            ..i.clone()
        };
        let kept: Vec<PlanItem> = cache.items().map(strip).collect();
        let full: Vec<PlanItem> = full.iter().map(strip).collect();
        if kept != full {
            let differ: Vec<_> = kept
                .iter()
                .zip(&full)
                .filter(|(a, b)| a != b)
                .take(3)
                .collect();
            panic!(
                "the kept plan ({} items) is not the full plan ({} items): {differ:#?}",
                kept.len(),
                full.len()
            );
        }
    }
}
