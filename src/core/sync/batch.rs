//! What a batch of creates came back as, read the same way by the binary and the
//! simulation: a refusal of these credentials (401, 403 from RBAC) or a fault the rules may
//! end sync on as `Faulted`, for the shell to judge by `core::sync::failure`; a batch that
//! failed whole as `Failed`; else each create's outcome, with an admission check's words for
//! each create it denied.

use super::BatchOutcome;
use super::failure::Fault;
use crate::core::executor::outcome::{ApplyReport, Outcome};

/// `result`: the executor's report, or the fault and words of an error that ended the batch
/// before its end (a decision log that cannot be written).
pub fn batch_outcome(result: Result<ApplyReport, (Fault, String)>) -> BatchOutcome {
    let report = match result {
        Err((fault, why)) if fault.refused || fault.config => {
            return BatchOutcome::Faulted { fault, why };
        }
        Err((_, why)) => return BatchOutcome::Failed(why),
        Ok(report) => report,
    };
    if let Some(r) = report.results.iter().find(|r| r.refused) {
        return BatchOutcome::Faulted {
            fault: Fault::forbidden(),
            why: r
                .error
                .clone()
                .unwrap_or_else(|| "the create was refused".into()),
        };
    }
    let denied = report
        .results
        .iter()
        .filter(|r| r.outcome == Outcome::Denied)
        .filter_map(|r| Some((r.target_id?, r.error.clone().unwrap_or_default())))
        .collect();
    BatchOutcome::Done {
        results: report
            .results
            .iter()
            .filter_map(|r| r.target_id.map(|t| (t, r.outcome)))
            .collect(),
        halted: report.stopped,
        denied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::executor::outcome::OpResult;

    fn report(results: Vec<OpResult>) -> ApplyReport {
        ApplyReport {
            results,
            ..ApplyReport::default()
        }
    }

    #[test]
    fn a_refused_create_is_a_fault_and_a_denied_one_its_own_outcome() {
        let mut refused = OpResult::new("300", Some(300), Outcome::Failed);
        refused.refused = true;
        refused.error = Some("HTTP 403 Forbidden: cannot create".into());
        let created = OpResult::new("301", Some(301), Outcome::Created);
        match batch_outcome(Ok(report(vec![created.clone(), refused]))) {
            BatchOutcome::Faulted { fault, why } => {
                assert!(fault.refused);
                assert!(why.contains("403"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let mut denied = OpResult::new("302", Some(302), Outcome::Denied);
        denied.error = Some("admission webhook \"ids\" denied the request".into());
        let BatchOutcome::Done {
            results, denied, ..
        } = batch_outcome(Ok(report(vec![created, denied])))
        else {
            panic!("a denial is no fault of the batch");
        };
        assert_eq!(results, [(301, Outcome::Created), (302, Outcome::Denied)]);
        assert_eq!(
            denied,
            [(302, "admission webhook \"ids\" denied the request".into())]
        );
    }

    #[test]
    fn a_batch_that_failed_whole_is_failed_unless_its_fault_may_end_sync() {
        let disk = batch_outcome(Err((Fault::default(), "disk full".into())));
        assert_eq!(disk, BatchOutcome::Failed("disk full".into()));
        let refused = batch_outcome(Err((Fault::forbidden(), "403".into())));
        assert!(matches!(refused, BatchOutcome::Faulted { .. }));
    }
}
