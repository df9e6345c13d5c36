//! What a sync that resumed other logs carries into its own log, so that its log alone
//! leads `verify` to expect what the cutover check expected from all of them: the ids the
//! resumed logs record as served elsewhere, or skipped, that its own log says nothing of.

use super::{LogContents, Record};
use crate::core::planner::Kind;
use crate::core::verify::Expectations;

/// The action of a carried line: not a decision (a resume never reads one as a decision).
pub const CARRIED: &str = "carried";

/// One line per id that `resumed` (the `--resume` logs, in order) expects somewhere other
/// than its own id, or nowhere, and `own` (this run's log) has no word on; in id order.
pub fn served_lines(resumed: &[&LogContents], own: &LogContents) -> Vec<Record> {
    let mut expect = Expectations::default();
    for log in resumed {
        expect.then(log.expectations());
    }
    let own_expect = own.expectations();
    let kinds = last_kinds(resumed);
    expect
        .mappings
        .iter()
        .filter(|(id, _)| !own_expect.mappings.contains_key(*id))
        .filter(|(id, target)| target.is_none_or(|t| t.to_string() != **id))
        .map(|(id, target)| {
            let labels = expect.mapped_labels.get(id).cloned().unwrap_or_default();
            let kind = kinds.get(id.as_str()).copied().unwrap_or(Kind::Reuse);
            let text = match target {
                Some(t) => format!("served at {t}"),
                None => "skipped".to_string(),
            };
            let text = format!("{text} (carried from a log it resumed)");
            Record::serving(id, &labels, kind, *target, text, ("rule", CARRIED))
        })
        .collect()
}

/// The kind each id's last line in `logs` gave it.
fn last_kinds<'a>(logs: &[&'a LogContents]) -> std::collections::BTreeMap<&'a str, Kind> {
    logs.iter()
        .flat_map(|l| l.records.iter())
        .map(|r| (r.id.as_str(), r.kind))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::outcome::Outcome;

    fn line(id: &str, kind: Kind, target: u32, outcome: Outcome) -> Record {
        let mut r = Record::new(
            id,
            "k8s:app=b;",
            kind,
            "create (operator)".into(),
            Some(target),
        )
        .with_fields("operator", "create");
        r.outcome = Some(outcome);
        r
    }

    fn log(records: Vec<Record>) -> LogContents {
        LogContents {
            records,
            ..Default::default()
        }
    }

    #[test]
    fn a_remap_another_log_served_is_carried_once_and_a_plain_create_is_not() {
        let apply = log(vec![
            line("301", Kind::Remap, 256, Outcome::Created),
            line("300", Kind::Create, 300, Outcome::Created),
        ]);
        let own = log(Vec::new());
        let carried = served_lines(&[&apply], &own);
        assert_eq!(carried.len(), 1, "{carried:?}");
        let c = &carried[0];
        assert_eq!(
            (c.id.as_str(), c.target_id, c.outcome, c.kind),
            ("301", Some(256), Some(Outcome::Mapped), Kind::Remap)
        );
        // Never read as a decision, and what verify reads from it is what it read from apply.
        assert!(c.step().is_none());
        let mut with = own;
        with.records.extend(carried);
        assert_eq!(with.expectations().mappings, {
            let mut m = apply.expectations().mappings;
            m.remove("300");
            m
        });
        // Carried once: the own log now has its word on 301.
        assert!(served_lines(&[&apply], &with).is_empty());
    }

    #[test]
    fn the_own_logs_word_wins_and_a_skip_is_carried_as_one() {
        let mut skip = line("302", Kind::Duplicate, 302, Outcome::Skipped);
        skip.target_id = None;
        let apply = log(vec![line("301", Kind::Remap, 256, Outcome::Created), skip]);
        let own = log(vec![line("301", Kind::Remap, 301, Outcome::Created)]);
        let carried = served_lines(&[&apply], &own);
        assert_eq!(carried.len(), 1, "{carried:?}");
        assert_eq!(
            (
                carried[0].id.as_str(),
                carried[0].outcome,
                carried[0].target_id
            ),
            ("302", Some(Outcome::Skipped), None)
        );
    }
}
