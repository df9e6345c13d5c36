//! The final state of one identity after an apply: one name per outcome, spelled in the
//! decision log, the JSON report and the summaries exactly as serde writes it here.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Created,
    /// The object was already there with identical labels (a rerun, or a create whose answer was lost).
    AlreadyExisted,
    AlreadyMigrated,
    Mapped,
    Skipped,
    /// The id turned out to be taken by other labels at apply time; left alone.
    Conflict,
    Failed,
    /// An admission webhook or policy denied this one object; its words are the error.
    /// Tried again by a rerun, never in a loop by sync.
    Denied,
    /// Not tried because the run was stopped.
    NotAttempted,
    /// Rollback: the object this tool created was deleted.
    Deleted,
    /// Rollback: the object was already gone.
    AlreadyGone,
    /// Rollback: the object is not (or no longer) the one this tool created; left alone.
    Kept,
}

impl Outcome {
    /// In the order the reports list them.
    pub const ALL: [Outcome; 12] = [
        Outcome::Created,
        Outcome::AlreadyExisted,
        Outcome::AlreadyMigrated,
        Outcome::Mapped,
        Outcome::Skipped,
        Outcome::Conflict,
        Outcome::Failed,
        Outcome::Denied,
        Outcome::NotAttempted,
        Outcome::Deleted,
        Outcome::AlreadyGone,
        Outcome::Kept,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::AlreadyExisted => "already-existed",
            Outcome::AlreadyMigrated => "already-migrated",
            Outcome::Mapped => "mapped",
            Outcome::Skipped => "skipped",
            Outcome::Conflict => "conflict",
            Outcome::Failed => "failed",
            Outcome::Denied => "denied",
            Outcome::NotAttempted => "not-attempted",
            Outcome::Deleted => "deleted",
            Outcome::AlreadyGone => "already-gone",
            Outcome::Kept => "kept",
        }
    }

    /// Outcomes that still need work on a rerun.
    pub fn is_unfinished(self) -> bool {
        matches!(
            self,
            Outcome::Failed | Outcome::Denied | Outcome::NotAttempted
        )
    }

    /// Outcomes reported as they happen: the item did not reach its intended state.
    pub fn is_problem(self) -> bool {
        matches!(
            self,
            Outcome::Failed | Outcome::Denied | Outcome::Conflict | Outcome::Kept
        )
    }

    /// Outcomes after which the identity is served at its target id.
    pub fn is_serving(self) -> bool {
        matches!(
            self,
            Outcome::Created | Outcome::AlreadyExisted | Outcome::Mapped | Outcome::AlreadyMigrated
        )
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_is_unfinished_a_problem_or_serving_as_documented() {
        use Outcome::*;
        let of = |f: fn(Outcome) -> bool| -> Vec<Outcome> {
            Outcome::ALL.into_iter().filter(|o| f(*o)).collect()
        };
        assert_eq!(of(Outcome::is_unfinished), [Failed, Denied, NotAttempted]);
        assert_eq!(of(Outcome::is_problem), [Conflict, Failed, Denied, Kept]);
        assert_eq!(
            of(Outcome::is_serving),
            [Created, AlreadyExisted, AlreadyMigrated, Mapped]
        );
        for o in Outcome::ALL {
            assert_eq!(o.to_string(), o.as_str());
        }
    }

    #[test]
    fn serde_spelling_is_the_log_spelling() {
        for o in Outcome::ALL {
            let text = serde_json::to_string(&o).unwrap();
            assert_eq!(text, format!("\"{}\"", o.as_str()));
            assert_eq!(serde_json::from_str::<Outcome>(&text).unwrap(), o);
        }
    }
}
