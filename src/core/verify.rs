//! Verification: every valid kvstore identity must have a `CiliumIdentity` with identical
//! security labels at its own id, or at the id a recorded decision maps it to. Pure.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::core::kvstore::{MasterEntry, parse_id};
use crate::core::labels::{LabelKey, valid_label_key};
use crate::core::range::IdRange;

pub mod expect;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProblemKind {
    /// No object at the expected id.
    Missing,
    /// An object with other labels at the expected id.
    Different,
    /// A rollback deleted the object this tool had created for it.
    RolledBack,
}

impl ProblemKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ProblemKind::Missing => "missing",
            ProblemKind::Different => "different",
            ProblemKind::RolledBack => "rolled-back",
        }
    }
}

/// What the decision logs say each identity should look like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectations {
    /// kvstore id (text) -> the id it is served at (`None` = skipped); absent: its own id.
    pub mappings: BTreeMap<String, Option<u32>>,
    /// The labels a mapping was recorded for, where known: the kvstore reuses an id its GC
    /// freed for other labels, and a mapping recorded for the old labels says nothing of the
    /// new identity, which is then expected at its own id.
    pub mapped_labels: BTreeMap<String, String>,
    /// kvstore ids whose object a rollback deleted.
    pub rolled_back: BTreeSet<String>,
    /// Duplicates a person decided to create at their own id (create anyway, or
    /// `--accept-proposals`), with their labels: a second object for those labels on
    /// purpose, which the audit shows as decided rather than as a finding.
    pub duplicates_decided: BTreeMap<String, String>,
    /// Ids whose object `switch-prepare` removed (this tool's, used by no endpoint) and
    /// nothing served again since.
    pub removed_before_switch: BTreeSet<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub id: u32,
    pub labels: String,
    pub expected_at: Option<u32>,
    pub problem: ProblemKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found_labels: Option<String>,
}

/// An identity the decision logs record as skipped by decision: not migrated on purpose,
/// so not a problem; listed so the reader sees each one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedByDecision {
    pub id: u32,
    pub labels: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub checked: usize,
    pub ok: usize,
    pub mapped: usize,
    pub invalid_ignored: usize,
    /// Skipped by a recorded decision: checked, and where the record says (nowhere).
    pub skipped: Vec<SkippedByDecision>,
    /// Whose object `switch-prepare` removed as unused before the switch to
    /// operator-managed identities: on purpose, so not a problem; listed.
    pub removed_before_switch: Vec<SkippedByDecision>,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Checks every valid kvstore identity against what Kubernetes holds and what the decision
/// logs expect; an object a rollback deleted is reported as rolled back, not as missing.
pub fn verify(
    masters: &[MasterEntry],
    k8s: &BTreeMap<u32, LabelKey>,
    expect: &Expectations,
    range: IdRange,
) -> VerifyReport {
    let mappings = &expect.mappings;
    let mut report = VerifyReport::default();
    let mut entries: Vec<(u32, &str)> = Vec::with_capacity(masters.len());
    for m in masters {
        match (parse_id(&m.id), valid_label_key(&m.value)) {
            (Ok(id), Ok(labels)) if range.contains(id) => entries.push((id, labels)),
            _ => report.invalid_ignored += 1,
        }
    }
    entries.sort_by_key(|(id, _)| *id);
    for (id, labels) in entries {
        report.checked += 1;
        let key = id.to_string();
        let stale = expect
            .mapped_labels
            .get(&key)
            .is_some_and(|recorded| recorded != labels);
        let expected_at = match mappings.get(&key).filter(|_| !stale) {
            Some(Some(t)) => Some(*t),
            Some(None) => None,
            None => Some(id),
        };
        let Some(target) = expected_at else {
            report.skipped.push(SkippedByDecision {
                id,
                labels: labels.to_string(),
            });
            continue;
        };
        match k8s.get(&target) {
            None if expect.removed_before_switch.contains(&target) => {
                report.removed_before_switch.push(SkippedByDecision {
                    id,
                    labels: labels.to_string(),
                });
            }
            Some(found) if found.as_str() == labels => {
                report.ok += 1;
                if target != id {
                    report.mapped += 1;
                }
            }
            found => report.problems.push(Problem {
                id,
                labels: labels.to_string(),
                expected_at: Some(target),
                problem: if found.is_some() {
                    ProblemKind::Different
                } else if expect.rolled_back.contains(&id.to_string()) {
                    ProblemKind::RolledBack
                } else {
                    ProblemKind::Missing
                },
                found_labels: found.cloned(),
            }),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::labels::parse_label_key;

    fn sl(s: &str) -> String {
        crate::core::labels::canonical_key(&crate::core::labels::to_security_labels(
            &parse_label_key(s).unwrap(),
        ))
    }

    fn masters_of(entries: &[(&str, &str)]) -> Vec<MasterEntry> {
        entries
            .iter()
            .map(|(id, labels)| MasterEntry::new(*id, *labels))
            .collect()
    }

    fn objects_of(objects: &[(u32, &str)]) -> BTreeMap<u32, LabelKey> {
        objects
            .iter()
            .map(|(id, labels)| (*id, sl(labels)))
            .collect()
    }

    #[test]
    fn a_mapping_recorded_for_other_labels_says_nothing_of_the_id_reused_since() {
        // 300 was mapped to 900 for A; the kvstore's GC freed 300 and an agent took it for B.
        let masters = vec![MasterEntry::new("300", "k8s:b=1;")];
        let mut k8s = BTreeMap::new();
        k8s.insert(300, sl("k8s:b=1;"));
        k8s.insert(900, sl("k8s:a=1;"));
        let mut expect = Expectations::default();
        expect.mappings.insert("300".into(), Some(900));
        expect.mapped_labels.insert("300".into(), "k8s:a=1;".into());
        let range = IdRange::for_cluster(0).unwrap();
        assert!(verify(&masters, &k8s, &expect, range).passed());
        // Recorded for these very labels, the mapping holds.
        expect.mapped_labels.insert("300".into(), "k8s:b=1;".into());
        let r = verify(&masters, &k8s, &expect, range);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    }

    #[test]
    fn verify_reads_expectations_without_own_id_mappings_alike() {
        let masters = masters_of(&[
            ("300", "k8s:w=1;"),
            ("301", "k8s:w=2;"),
            ("302", "k8s:w=3;"),
            ("303", "k8s:w=4;"),
            ("304", "k8s:w=5;"),
        ]);
        let k8s = objects_of(&[
            (300, "k8s:w=1;"),
            (900, "k8s:w=2;"),
            (302, "k8s:w=3;"),
            (303, "k8s:other=x;"),
        ]);
        let mut expect = Expectations::default();
        // At its own id, for its labels; at its own id for labels since replaced; remapped;
        // remapped for labels since replaced; skipped.
        for (id, to, labels) in [
            ("300", Some(300), "k8s:w=1;"),
            ("303", Some(303), "k8s:old=1;"),
            ("301", Some(900), "k8s:w=2;"),
            ("302", Some(901), "k8s:old=2;"),
            ("304", None, "k8s:w=5;"),
        ] {
            expect.mappings.insert(id.into(), to);
            expect.mapped_labels.insert(id.into(), labels.into());
        }
        let range = IdRange::for_cluster(0).unwrap();
        let compact = expect.clone().for_verify_only();
        assert_eq!(compact.mappings.len(), 3, "{:?}", compact.mappings);
        assert!(!compact.mapped_labels.contains_key("300"));
        let (full, lean) = (
            verify(&masters, &k8s, &expect, range),
            verify(&masters, &k8s, &compact, range),
        );
        assert_eq!(format!("{full:?}"), format!("{lean:?}"));
        assert_eq!((full.ok, full.mapped, full.problems.len()), (3, 1, 1));
    }

    #[test]
    fn verifies_own_ids_mappings_and_reports_each_problem() {
        let masters = masters_of(&[
            ("300", "k8s:a=1;"),
            ("301", "k8s:a=2;"),
            ("302", "k8s:a=3;"),
            ("303", "k8s:a=4;"),
            ("304", "k8s:a=5;"),
            ("305", "k8s:a=7;"),
            ("bad", "k8s:a=6;"),
        ]);
        let k8s = objects_of(&[
            (300, "k8s:a=1;"),
            (305, "k8s:a=7;"),
            (301, "k8s:other=x;"),
            (900, "k8s:a=2;"),
            (303, "k8s:a=wrong;"),
        ]);
        let mut maps = BTreeMap::new();
        maps.insert("301".to_string(), Some(900));
        maps.insert("304".to_string(), None);
        let mut expect = Expectations {
            mappings: maps,
            ..Default::default()
        };
        let r = verify(&masters, &k8s, &expect, IdRange::for_cluster(0).unwrap());
        // Two at their own id, one mapped.
        assert_eq!((r.checked, r.ok, r.mapped, r.invalid_ignored), (6, 3, 1, 1));
        let kinds: Vec<(u32, ProblemKind)> = r
            .problems
            .iter()
            .map(|p| (p.id, p.problem.clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![(302, ProblemKind::Missing), (303, ProblemKind::Different)]
        );
        // A skip the log records is no problem: listed apart.
        assert_eq!(
            r.skipped,
            [SkippedByDecision {
                id: 304,
                labels: "k8s:a=5;".into()
            }]
        );
        assert!(!r.passed());
        let mut only_skips = expect.clone();
        only_skips.mappings.insert("302".into(), None);
        only_skips.mappings.insert("303".into(), None);
        let r = verify(
            &masters,
            &k8s,
            &only_skips,
            IdRange::for_cluster(0).unwrap(),
        );
        assert!(r.passed(), "{:?}", r.problems);
        assert_eq!(r.skipped.len(), 3);
        // After a rollback, the missing object is reported as rolled back.
        expect.rolled_back.insert("302".into());
        let r = verify(&masters, &k8s, &expect, IdRange::for_cluster(0).unwrap());
        assert_eq!(r.problems[0].problem, ProblemKind::RolledBack);
        assert_eq!(r.problems[1].problem, ProblemKind::Different);
    }

    #[test]
    fn what_switch_prepare_removed_is_said_as_removed_and_is_no_problem_until_served_again() {
        use crate::core::outcome::Outcome;
        use crate::core::planner::Kind;
        use crate::core::verify::expect::Logged;
        let masters = vec![
            MasterEntry::new("300", "k8s:a=1;"),
            MasterEntry::new("301", "k8s:a=2;"),
        ];
        let k8s = BTreeMap::new();
        let line = |outcome| Logged {
            id: "300",
            labels: "k8s:a=1;",
            kind: Kind::Create,
            outcome: Some(outcome),
            target: Some(300),
            step: None,
            by_switch_prepare: true,
        };
        let mut expect = Expectations::default();
        expect.fold(line(Outcome::Deleted));
        let range = IdRange::for_cluster(0).unwrap();
        let r = verify(&masters, &k8s, &expect, range);
        assert_eq!(r.removed_before_switch.len(), 1);
        assert_eq!(r.removed_before_switch[0].id, 300);
        // 301 was not removed: missing, a problem.
        let ids: Vec<u32> = r.problems.iter().map(|p| p.id).collect();
        assert_eq!(ids, [301]);
        // Made again by switch-prepare: expected at its id again.
        expect.fold(line(Outcome::Created));
        let r = verify(&masters, &k8s, &expect, range);
        assert!(r.removed_before_switch.is_empty());
        assert_eq!(r.problems.len(), 2);
    }
}
