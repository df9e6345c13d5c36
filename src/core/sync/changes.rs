//! What a change of either side does to what sync knows: a kvstore key put or deleted, an
//! object made, changed or deleted in Kubernetes, a fresh list, what a round carries to the
//! next, and which ids are split allocations (one id, two label sets), found once each.

use super::*;

impl SyncState {
    /// One kvstore change (`now`: when sync saw it, for the lag).
    pub(super) fn apply_kv_change(&mut self, change: KvChange, now: Instant) {
        match change {
            KvChange::Master {
                id, value: Some(v), ..
            } => {
                self.overlay_sees(parse_id(&id).ok(), Some(&v));
                self.look_at(&id);
                let before = self.masters.insert(id.clone(), v);
                if let Some(c) = &mut self.cache {
                    c.master_changed(
                        &id,
                        before.as_deref(),
                        (&self.masters, &self.k8s, &self.counts),
                    );
                }
                if before.is_none() {
                    self.first_seen.insert(id.clone(), now);
                }
                // A conflict closed as moot was about these labels at this id: an id the
                // kvstore now holds for others (its GC freed it, an agent took it again) is
                // a new identity, reported and decided like any other.
                if before.as_ref() != self.masters.get(&id) {
                    self.moot.remove(String::from_utf8_lossy(&id).as_ref());
                }
                if let Ok(n) = parse_id(&id) {
                    self.check_split(n, now);
                }
            }
            KvChange::Master {
                id, value: None, ..
            } => {
                let old = self.masters.get(&id).cloned();
                self.overlay_sees(parse_id(&id).ok(), old.as_deref());
                // The kvstore's GC: counted, never deleted from Kubernetes. What sync
                // remembers about the identity goes with it, so memory follows the live
                // identities over days, not every identity ever seen.
                self.look_at(&id);
                let old = self.masters.remove(&id);
                if old.is_some() {
                    self.status.removed_from_kvstore += 1;
                }
                if let Some(c) = &mut self.cache {
                    c.master_changed(
                        &id,
                        old.as_deref(),
                        (&self.masters, &self.k8s, &self.counts),
                    );
                }
                self.first_seen.remove(&id);
                let text = String::from_utf8_lossy(&id).into_owned();
                if let Ok(n) = parse_id(&id) {
                    self.settling.remove(&n);
                }
                self.reported.remove(&text);
                self.waited_for_decision.remove(&text);
                self.moot.remove(&text);
                if let Ok(n) = parse_id(&id) {
                    self.created.remove(&n);
                    self.deleted_after_create.remove(&n);
                    self.recreated.remove(&n);
                    self.reported.remove(&format!("deleted:{n}"));
                    self.check_split(n, now);
                }
            }
            KvChange::Slave {
                label_key,
                node,
                present: true,
                id,
            } => {
                self.counts
                    .add_key(&label_key, &node, id.as_deref().unwrap_or_default());
                self.counts_changed = true;
                self.look_at_labels(&label_key);
            }
            KvChange::Slave {
                label_key,
                node,
                present: false,
                id,
            } => {
                self.counts.remove_key(&label_key, &node, id.as_deref());
                self.counts_changed = true;
                self.look_at_labels(&label_key);
            }
        }
    }

    /// An object created or changed in Kubernetes.
    pub(super) fn k8s_upsert(
        &mut self,
        id: u32,
        labels: LabelKey,
        resource_version: String,
        now: Instant,
    ) {
        self.k8s_version = resource_version;
        self.set_object(id, labels);
        self.check_split(id, now);
    }

    /// Kubernetes holds `labels` at `id` now (seen by the watch, or created by sync).
    pub(super) fn set_object(&mut self, id: u32, labels: LabelKey) {
        self.overlay_sees(Some(id), Some(labels.as_bytes()));
        if let Some(l) = self.k8s.get(&id).cloned() {
            self.overlay_sees(None, Some(l.as_bytes()));
        }
        let old = self.k8s.insert(id, labels);
        if let Some(c) = &mut self.cache {
            c.object_changed(id, old.as_ref(), (&self.masters, &self.k8s, &self.counts));
        }
    }

    /// An object deleted in Kubernetes.
    pub(super) fn k8s_delete(&mut self, id: u32, resource_version: String, now: Instant) {
        self.k8s_version = resource_version;
        let old = self.k8s.get(&id).cloned();
        self.overlay_sees(Some(id), old.as_deref().map(str::as_bytes));
        self.k8s.remove(&id);
        // Made again, or held back as made once: looked at whatever the plan says.
        self.look_at(IdDigits::of(id).as_bytes());
        if let Some(c) = &mut self.cache {
            c.object_changed(id, old.as_ref(), (&self.masters, &self.k8s, &self.counts));
        }
        if self.created.contains(&id)
            && let Some(old) = old
        {
            self.deleted_after_create.insert(id, old);
        }
        self.settle_if_held(id, now);
        self.end_split_if_over(id);
    }

    /// An object at `id` went while the kvstore (as sync last saw it) holds the identity:
    /// not made again before `RECREATE_SETTLE` has passed (`settling`).
    fn settle_if_held(&mut self, id: u32, now: Instant) {
        // Even one this sync made and would not make again now waits: whether nodes use its
        // labels is read from the same trailing view (a node's `value/` key may arrive just
        // before the kvstore's deletes).
        if self.masters.contains_key(IdDigits::of(id).as_bytes()) {
            self.settling.insert(id, now + RECREATE_SETTLE);
        }
    }

    /// Whether the object at `t`, which this sync made and something deleted since (the
    /// cluster's GC, a person), may be made again: only while kvstore-mode nodes use its
    /// labels, and only once.
    pub(super) fn may_make_again(&self, t: u32, labels: &[u8]) -> bool {
        self.counts.get(labels) > 0 && !self.recreated.contains(&t)
    }

    /// A fresh list after a 410: it replaces what sync holds, and what arrived while the
    /// watch was gone is checked for splits as if watched.
    pub(super) fn k8s_relisted(
        &mut self,
        identities: BTreeMap<u32, LabelKey>,
        resource_version: String,
        now: Instant,
    ) {
        let mut changed: Vec<u32> = identities
            .iter()
            .filter(|(id, labels)| self.k8s.get(id) != Some(labels))
            .map(|(id, _)| *id)
            .collect();
        // Objects gone meanwhile may have ended a split.
        let gone: Vec<u32> = self
            .k8s
            .keys()
            .filter(|id| !identities.contains_key(id))
            .copied()
            .collect();
        changed.extend(gone);
        // Every identity without an object in the list waits like a deleted object, seen
        // before or not: one made and deleted while the watch was gone was never seen, and
        // the view of the kvstore may still hold an identity both GCs took in that gap.
        // (Read straight off the master keys, which hold each: no lookup per identity.)
        let until = now + RECREATE_SETTLE;
        let missing = self
            .masters
            .keys()
            .filter_map(|id| parse_id(id).ok())
            .filter(|id| !identities.contains_key(id));
        self.settling.extend(missing.map(|id| (id, until)));
        self.k8s = identities;
        self.k8s_version = resource_version;
        self.cache = None;
        self.overlay = None;
        for id in changed {
            self.check_split(id, now);
        }
    }

    /// A fresh snapshot (after a compaction) keeps what sync knew and did: what was
    /// reported (conflicts, invalid entries, splits, moot closures), made (objects created,
    /// deleted since, created again), failing, counted and measured. Splits that still hold
    /// are not found again; one that began in the gap is found now; a fresh plan follows.
    pub(super) fn carry_over(&mut self, old: SyncState, now: Instant) {
        let fresh = std::mem::take(&mut self.status);
        // The world's sizes are the fresh read's; the counters go on. (The count of splits
        // now is set below, from the splits that still hold.)
        self.status = SyncStatus {
            identities: fresh.identities,
            kvstore_nodes: fresh.kvstore_nodes,
            ..old.status
        };
        self.created = old.created;
        self.deleted_after_create = old.deleted_after_create;
        self.recreated = old.recreated;
        self.in_flight = old.in_flight;
        self.failed = old.failed;
        self.settling = old.settling;
        self.unwritten = old.unwritten;
        self.denied = old.denied;
        self.reported = old.reported;
        self.waited_for_decision = old.waited_for_decision;
        self.moot = old.moot;
        self.lags = old.lags;
        self.own_masters = old.own_masters;
        self.reused = old.reused;
        self.skipped = old.skipped;
        self.first_seen = old
            .first_seen
            .into_iter()
            .filter(|(id, _)| self.masters.contains_key(id))
            .collect();
        self.splits = old
            .splits
            .into_iter()
            .filter(|id| self.is_split(*id))
            .collect();
        self.status.splits = self.splits.len();
        self.splits_to_report = old.splits_to_report;
        self.find_splits(now);
        self.cache = None;
    }

    /// Every split of a fresh read: each id both sides hold looked at once.
    pub(in crate::core::sync) fn find_splits(&mut self, now: Instant) {
        let both: Vec<u32> = self.k8s.keys().copied().collect();
        for id in both {
            self.check_split(id, now);
        }
    }

    /// Whether `id` is split now: Kubernetes holds it for other labels than the kvstore.
    pub(super) fn is_split(&self, id: u32) -> bool {
        let Some(k8s_labels) = self.k8s.get(&id) else {
            return false;
        };
        let Some(kv_value) = self.masters.get(IdDigits::of(id).as_bytes()) else {
            return false;
        };
        // Sync's own objects are no exception: a kvstore-mode agent can hand out an id that
        // sync used as a remap target (the kvstore did not hold it), and that is a split too.
        // The same bytes are no split, and need no reading (most ids, most of the time).
        kv_value.as_slice() != k8s_labels.as_bytes() && valid_label_key(kv_value).is_ok()
    }

    /// A split allocation: Kubernetes holds `id` for other labels than the kvstore. Found
    /// once per occurrence (a split that ends, by the kvstore's GC or the object's deletion,
    /// and comes back is found again); reported once the nodes that use the kvstore's
    /// labels can be named (an agent writes its `value/` key just after the master key).
    pub(super) fn check_split(&mut self, id: u32, now: Instant) {
        if !self.is_split(id) {
            self.forget_split(id);
            return;
        }
        if !self.splits.insert(id) {
            return;
        }
        self.status.splits = self.splits.len();
        self.status.splits_found += 1;
        self.splits_to_report.push((id, now));
    }

    /// A split that no longer holds leaves the count of splits now.
    fn end_split_if_over(&mut self, id: u32) {
        if !self.is_split(id) {
            self.forget_split(id);
        }
    }

    /// `id` is no split (any more): out of the splits and their count.
    fn forget_split(&mut self, id: u32) {
        if self.splits.remove(&id) {
            self.status.splits = self.splits.len();
        }
    }
}
