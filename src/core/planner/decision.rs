//! What a decision does to a plan item, who made it, and what the decided plan writes: the
//! one home of these rules for the TUI, `reconcile`, the reports and the decision log.

use serde::{Deserialize, Serialize};

use super::item::{Action, Kind, PlanItem};

/// Who (or what) settled an item's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecidedBy {
    /// The planner's proposal, taken as it is (a plain create, a reuse).
    Proposal,
    /// A remap or duplicate proposal taken because of `--accept-proposals`.
    AcceptProposals,
    /// A person: in the TUI, or by editing a plan file.
    Operator,
    /// The rules alone (an invalid entry is never written).
    Rule,
    /// `switch-prepare`: an identity made or removed before the switch to operator-managed
    /// identities, confirmed by the operator. No kvstore identity's decision: a resume and
    /// verify pass over it; rollback removes what it created.
    SwitchPrepare,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Proposal => "proposal",
            DecidedBy::AcceptProposals => "accept-proposals",
            DecidedBy::Operator => "operator",
            DecidedBy::Rule => "rule",
            DecidedBy::SwitchPrepare => "switch-prepare",
        }
    }

    /// Who decided `decided` (a plan's or the TUI's item) given the live proposal `live`.
    pub fn of(decided: &PlanItem, live: &PlanItem, accept_proposals: bool) -> DecidedBy {
        if live.kind == Kind::Invalid {
            return DecidedBy::Rule;
        }
        let edited = decided.action != live.action || decided.target_id != live.target_id;
        if decided.action == Action::Skip || edited || decided.decided {
            DecidedBy::Operator
        } else if live.kind.needs_decision() && accept_proposals {
            DecidedBy::AcceptProposals
        } else {
            DecidedBy::Proposal
        }
    }
}

impl std::fmt::Display for DecidedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operator's decision on one conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take the proposal as it is.
    Accept,
    /// Create at this id instead (checked first with `validate_new_target`).
    EditTarget(u32),
    /// Write nothing; map to the id that already holds the labels.
    Reuse,
    /// Write nothing, map nothing.
    Skip,
    /// A duplicate: create it at its own id anyway.
    CreateAnyway,
}

impl Decision {
    /// The word the decision log records for it.
    pub fn name(self) -> &'static str {
        match self {
            Decision::Accept => "accept",
            Decision::EditTarget(_) => "edit",
            Decision::Reuse => "reuse",
            Decision::Skip => "skip",
            Decision::CreateAnyway => "create-anyway",
        }
    }

    /// Applies the decision to `item`, or says why it does not fit that item (unchanged then).
    pub fn apply_to(self, item: &mut PlanItem) -> Result<(), String> {
        match self {
            Decision::Accept => {}
            Decision::EditTarget(t) => {
                item.action = Action::Create;
                item.target_id = Some(t);
            }
            Decision::Reuse => {
                let Some(x) = item.labels_present_at else {
                    return Err("no other id holds these labels".into());
                };
                item.action = Action::None;
                item.target_id = Some(x);
            }
            // A skip serves the identity nowhere: no target, so neither the log nor the
            // screen keeps the proposal it did not take.
            Decision::Skip => {
                item.action = Action::Skip;
                item.target_id = None;
            }
            Decision::CreateAnyway => {
                if item.kind != Kind::Duplicate {
                    return Err("create anyway is for duplicates; use e to pick an id".into());
                }
                item.action = Action::Create;
                item.target_id = item.numeric_id();
            }
        }
        item.decided = true;
        Ok(())
    }
}

/// How the decision log words a decision on `item`: `"<name> (<action> <target>)"`.
pub fn describe(name: &str, item: &PlanItem) -> String {
    format!(
        "{name} ({} {})",
        item.action.as_str(),
        item.target_id.map_or("-".into(), |t| t.to_string())
    )
}

/// What a decided plan writes and what it leaves alone: one count for the commit screen, the
/// confirm popup, the reports and the exported summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// Creates at the kvstore id (plain creates, remaps edited back, etc.).
    pub same_id: usize,
    /// Creates at another id (a remap).
    pub remaps: usize,
    /// Duplicates created at their own id.
    pub duplicates: usize,
    pub already_migrated: usize,
    /// Mapped to an id that holds (or will hold) the labels.
    pub mapped: usize,
    pub skipped: usize,
    pub invalid: usize,
}

impl WriteSummary {
    pub fn of(items: &[PlanItem]) -> Self {
        let mut s = WriteSummary::default();
        for i in items {
            let own = i.target_id.is_some() && i.target_id == i.numeric_id();
            match (i.kind, i.action) {
                (Kind::Invalid, _) => s.invalid += 1,
                (_, Action::Skip) => s.skipped += 1,
                (Kind::AlreadyMigrated, _) => s.already_migrated += 1,
                (_, Action::Create) if !own => s.remaps += 1,
                (Kind::Duplicate, Action::Create) => s.duplicates += 1,
                (_, Action::Create) => s.same_id += 1,
                (_, Action::None) if !own => s.mapped += 1,
                (_, Action::None) => s.already_migrated += 1,
            }
        }
        s
    }

    /// `CiliumIdentity` objects the plan creates.
    pub fn creates(&self) -> usize {
        self.same_id + self.remaps + self.duplicates
    }
}

/// What sync writes as soon as it starts from this plan: every create that needs no
/// decision, and every conflict already decided to create. Undecided conflicts wait.
pub fn sync_writes_at_start(items: &[PlanItem]) -> usize {
    items
        .iter()
        .filter(|i| i.action == Action::Create && (!i.kind.is_conflict() || i.decided))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: u32, kind: Kind, action: Action, target: Option<u32>) -> PlanItem {
        PlanItem {
            id: id.to_string(),
            labels: format!("k8s:app=a{id};"),
            kind,
            action,
            target_id: target,
            existing_labels: None,
            labels_present_at: (kind == Kind::Duplicate || kind == Kind::Reuse).then_some(900),
            nodes: 0,
            reason: Default::default(),
            decided: false,
        }
    }

    #[test]
    fn sync_writes_at_start_leave_undecided_conflicts_out() {
        let mut items = vec![
            item(300, Kind::Create, Action::Create, Some(300)),
            item(301, Kind::Remap, Action::Create, Some(400)),
            item(302, Kind::Duplicate, Action::Create, Some(302)),
            item(303, Kind::AlreadyMigrated, Action::None, Some(303)),
            item(304, Kind::Create, Action::Skip, None),
        ];
        assert_eq!(sync_writes_at_start(&items), 1);
        Decision::Accept.apply_to(&mut items[1]).unwrap();
        assert_eq!(sync_writes_at_start(&items), 2);
        Decision::Skip.apply_to(&mut items[2]).unwrap();
        assert_eq!(sync_writes_at_start(&items), 2);
    }

    #[test]
    fn decisions_change_exactly_what_they_name() {
        let remap = item(300, Kind::Remap, Action::Create, Some(400));
        let mut i = remap.clone();
        Decision::Accept.apply_to(&mut i).unwrap();
        assert_eq!(
            (i.action, i.target_id, i.decided),
            (Action::Create, Some(400), true)
        );
        let mut i = remap.clone();
        Decision::EditTarget(500).apply_to(&mut i).unwrap();
        assert_eq!((i.action, i.target_id), (Action::Create, Some(500)));
        let mut i = remap.clone();
        assert!(Decision::Reuse.apply_to(&mut i).is_err());
        assert!(Decision::CreateAnyway.apply_to(&mut i).is_err());
        assert_eq!(i, remap, "a refused decision leaves the item alone");
        Decision::Skip.apply_to(&mut i).unwrap();
        assert_eq!(i.action, Action::Skip);
        let mut d = item(301, Kind::Duplicate, Action::Create, Some(301));
        Decision::Reuse.apply_to(&mut d).unwrap();
        assert_eq!((d.action, d.target_id), (Action::None, Some(900)));
        Decision::CreateAnyway.apply_to(&mut d).unwrap();
        assert_eq!((d.action, d.target_id), (Action::Create, Some(301)));
        assert_eq!(
            describe("edit", &i),
            "edit (skip -)",
            "a skip keeps no target"
        );
    }

    #[test]
    fn who_decided_reads_the_same_in_text_and_in_json() {
        for d in [
            DecidedBy::Proposal,
            DecidedBy::AcceptProposals,
            DecidedBy::Operator,
            DecidedBy::Rule,
        ] {
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{d}\""));
        }
        assert_eq!(DecidedBy::AcceptProposals.to_string(), "accept-proposals");
    }

    #[test]
    fn who_decided() {
        let live = item(300, Kind::Remap, Action::Create, Some(400));
        assert_eq!(DecidedBy::of(&live, &live, false), DecidedBy::Proposal);
        assert_eq!(
            DecidedBy::of(&live, &live, true),
            DecidedBy::AcceptProposals
        );
        let mut d = live.clone();
        d.decided = true;
        assert_eq!(DecidedBy::of(&d, &live, true), DecidedBy::Operator);
        let mut d = live.clone();
        d.target_id = Some(401);
        assert_eq!(DecidedBy::of(&d, &live, false), DecidedBy::Operator);
        let bad = item(1, Kind::Invalid, Action::Skip, None);
        assert_eq!(DecidedBy::of(&bad, &bad, false), DecidedBy::Rule);
    }

    #[test]
    fn write_summary_counts_each_item_once() {
        let items = vec![
            item(300, Kind::Create, Action::Create, Some(300)),
            item(301, Kind::Remap, Action::Create, Some(400)),
            item(302, Kind::Duplicate, Action::Create, Some(302)),
            item(303, Kind::Reuse, Action::None, Some(900)),
            item(304, Kind::AlreadyMigrated, Action::None, Some(304)),
            item(305, Kind::Remap, Action::Skip, Some(401)),
            item(1, Kind::Invalid, Action::Skip, None),
            // Served at its own id already (e.g. a duplicate whose object is there).
            item(306, Kind::Duplicate, Action::None, Some(306)),
        ];
        let s = WriteSummary::of(&items);
        assert_eq!(
            s,
            WriteSummary {
                same_id: 1,
                remaps: 1,
                duplicates: 1,
                already_migrated: 2,
                mapped: 1,
                skipped: 1,
                invalid: 1,
            }
        );
        assert_eq!(s.creates(), 3);
    }
}
