//! Plain-text summaries of a plan, an apply and a verification, as the headless commands
//! print them. Pure formatting: callers decide where the text goes.

use std::fmt::Write;

use crate::apply::outcome::{ApplyReport, Outcome};
use crate::core::planner::{Kind, Op, OpKind};
use crate::core::verify::VerifyReport;
use crate::io::plan_file::PlanFile;

/// What `plan` prints: both ends, the range, the CRD step, and a count per kind.
pub fn plan_summary(plan: &PlanFile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "kvstore: {} (prefix {}, revision {})",
        plan.source.endpoints.join(","),
        plan.source.prefix,
        plan.source.revision
    );
    let _ = writeln!(
        out,
        "kubernetes: {} (context {})",
        plan.target.server,
        plan.target.context.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        out,
        "cluster id {} (max-connected-clusters {}), range {}",
        plan.cluster_id, plan.max_connected_clusters, plan.range
    );
    if plan.crd.create {
        let _ = writeln!(
            out,
            "CRD ciliumidentities.cilium.io is missing: apply creates it first and waits until it is Established"
        );
    }
    for kind in Kind::ALL {
        let n = plan.summary.get(kind.as_str()).copied().unwrap_or(0);
        let note = match kind {
            Kind::AlreadyMigrated => "nothing to do",
            Kind::Create => "create with the same id",
            Kind::Remap => "create at a new id (needs a decision)",
            Kind::Reuse => "map to the id that already has the labels",
            Kind::Duplicate => "create anyway (needs a decision)",
            Kind::Invalid => "never written",
            // switch-prepare's steps are never a plan's kind.
            Kind::SwitchCreate | Kind::SwitchRemoveDuplicate | Kind::SwitchRemoveUnused => "",
        };
        let _ = writeln!(out, "  {:<17} {n:>6}   {note}", kind.as_str());
    }
    let unused = plan
        .items
        .iter()
        .filter(|i| i.kind != Kind::Invalid && i.nodes == 0)
        .count();
    if unused > 0 {
        let _ = writeln!(
            out,
            "  {unused} valid identities are used by no node (no value/ keys): candidates for Cilium's garbage collection"
        );
    }
    out
}

/// What `apply` prints when it is done.
pub fn apply_summary(r: &ApplyReport) -> String {
    let mut out = format!(
        "created {}, already existed {}, already migrated {}, mapped {}, skipped {}, conflicts {}, failed {}, not attempted {}; {} retries; {} ms\n",
        r.count(Outcome::Created),
        r.count(Outcome::AlreadyExisted),
        r.count(Outcome::AlreadyMigrated),
        r.count(Outcome::Mapped),
        r.count(Outcome::Skipped),
        r.count(Outcome::Conflict),
        r.count(Outcome::Failed),
        r.count(Outcome::NotAttempted),
        r.retries,
        r.elapsed_ms
    );
    out.push_str(&pushed_back(r.throttled));
    if r.crd_created {
        out.push_str("created CRD ciliumidentities.cilium.io\n");
    }
    if let Some(s) = &r.stopped {
        let _ = writeln!(out, "stopped: {s}; rerun the same command to finish");
    }
    out
}

/// What `rollback` without `--yes` prints: one line per object, then the totals.
pub fn rollback_plan(ops: &[Op], json: bool) -> serde_json::Result<String> {
    let rows: Vec<(&str, u32, &str, String)> = ops
        .iter()
        .map(|op| {
            let target = op.target_id.unwrap_or(0);
            match (op.op, &op.expect) {
                (OpKind::Delete, Some((_, rv))) if rv.is_empty() => {
                    ("already-gone", target, op.id.as_str(), op.label_key.clone())
                }
                (OpKind::Delete, _) => ("delete", target, op.id.as_str(), op.label_key.clone()),
                (OpKind::Create, _) => ("restore", target, op.id.as_str(), op.label_key.clone()),
                _ => (
                    "keep",
                    target,
                    op.id.as_str(),
                    op.reason.clone().unwrap_or_default(),
                ),
            }
        })
        .collect();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(what, target, id, detail)| {
                serde_json::json!({"action": what, "name": target, "id": id, "detail": detail})
            })
            .collect();
        return serde_json::to_string_pretty(&v).map(|t| t + "\n");
    }
    let mut out = String::new();
    for (what, target, id, detail) in &rows {
        // Only a remap's object stands at another id than the kvstore's; what switch-prepare
        // made serves pods and has no kvstore id at all.
        let of = match *id == target.to_string() {
            true => String::new(),
            false => format!(" (kvstore id {id})"),
        };
        let _ = writeln!(out, "{what:<12} {target:<8}{of}  {detail}");
    }
    let s = crate::app::rollback::summarize(ops);
    let _ = writeln!(
        out,
        "rollback plan: {} to delete, {} already gone, {} kept (changed since this tool created it, or not its object){}",
        s.delete,
        s.gone,
        s.keep,
        match s.restore {
            0 => String::new(),
            n => format!(", {n} to restore (removed by switch-prepare)"),
        }
    );
    Ok(out)
}

/// What `rollback --yes` prints when it is done.
pub fn rollback_summary(r: &ApplyReport) -> String {
    let mut out = String::new();
    for res in r.results.iter().filter(|x| x.outcome == Outcome::Kept) {
        let _ = writeln!(
            out,
            "kept {}: {}",
            res.target_id.map_or("-".into(), |t| t.to_string()),
            res.error.as_deref().unwrap_or("")
        );
    }
    for res in r.results.iter().filter(|x| x.outcome == Outcome::Conflict) {
        let _ = writeln!(
            out,
            "not restored {}: the id holds another object now ({})",
            res.target_id.map_or("-".into(), |t| t.to_string()),
            res.existing.as_deref().unwrap_or("labels unknown")
        );
    }
    let restored = match r.count(Outcome::Created) {
        0 => String::new(),
        n => format!("restored {n}, "),
    };
    let _ = writeln!(
        out,
        "{restored}deleted {}, already gone {}, kept {}, failed {}, not attempted {}; {} retries; {} ms",
        r.count(Outcome::Deleted),
        r.count(Outcome::AlreadyGone),
        r.count(Outcome::Kept),
        r.count(Outcome::Failed),
        r.count(Outcome::NotAttempted),
        r.retries,
        r.elapsed_ms
    );
    if let Some(s) = &r.stopped {
        let _ = writeln!(out, "stopped: {s}; rerun the same command to finish");
    }
    out
}

/// What `verify` prints: one line per problem, then the totals.
pub fn verify_summary(r: &VerifyReport) -> String {
    let mut out = String::new();
    for p in &r.problems {
        let at = p.expected_at.map_or("-".to_string(), |t| t.to_string());
        let what = p.problem.as_str();
        let _ = write!(out, "{what:<11} id {} expected at {at}: {}", p.id, p.labels);
        if let Some(found) = &p.found_labels {
            let _ = write!(out, "  (found {found})");
        }
        out.push('\n');
    }
    for s in &r.skipped {
        let _ = writeln!(
            out,
            "{:<11} id {} by decision: {}",
            "skipped", s.id, s.labels
        );
    }
    for s in &r.removed_before_switch {
        let _ = writeln!(
            out,
            "{:<11} id {} by switch-prepare (no endpoint used it): {}",
            "removed", s.id, s.labels
        );
    }
    let removed = match r.removed_before_switch.len() {
        0 => String::new(),
        n => format!(", {n} removed by switch-prepare"),
    };
    let _ = writeln!(
        out,
        "verified {} identities: {} ok ({} via a recorded mapping), {} skipped by decision{removed}, {}; {} invalid kvstore entries not checked",
        r.checked,
        r.ok,
        r.mapped,
        r.skipped.len(),
        crate::core::words::count(r.problems.len(), "problem"),
        r.invalid_ignored
    );
    out
}

/// How often the API server pushed back, as a line of a summary (empty when it never did).
pub fn pushed_back(throttled: u64) -> String {
    match throttled {
        0 => String::new(),
        n => format!(
            "the API server pushed back {n} times (429, API Priority and Fairness): each waited out as it asked, none a failure\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::verify::{Problem, ProblemKind};

    #[test]
    fn a_rollback_plan_names_a_kvstore_id_only_for_an_object_at_another_id() {
        let op = |id: &str, target: u32| Op {
            id: id.into(),
            label_key: "k8s:app=a;".into(),
            kind: crate::core::planner::Kind::Create,
            op: OpKind::Delete,
            target_id: Some(target),
            decided_by: crate::core::planner::DecidedBy::Operator,
            expect: Some(("uid".into(), "7".into())),
            reason: None,
        };
        // A remap's object, and one switch-prepare made (no kvstore identity behind it).
        let text = rollback_plan(&[op("301", 256), op("65534", 65534)], false).unwrap();
        assert!(
            text.contains("delete       256      (kvstore id 301)"),
            "{text}"
        );
        assert!(text.contains("delete       65534     k8s:app=a;"), "{text}");
        assert!(!text.contains("kvstore id 65534"), "{text}");
    }

    #[test]
    fn summaries_name_what_happened() {
        let r = ApplyReport {
            stopped: Some("the API server kept failing".into()),
            crd_created: true,
            ..Default::default()
        };
        let text = apply_summary(&r);
        assert!(
            text.contains("created 0,")
                && text.contains("created CRD")
                && text.contains("rerun the same command"),
            "{text}"
        );
        let v = VerifyReport {
            checked: 2,
            ok: 1,
            problems: vec![Problem {
                id: 301,
                labels: "k8s:a=b;".into(),
                expected_at: Some(301),
                problem: ProblemKind::Different,
                found_labels: Some("k8s:x=y;".into()),
            }],
            ..Default::default()
        };
        let text = verify_summary(&v);
        assert!(
            text.starts_with("different   id 301 expected at 301: k8s:a=b;  (found k8s:x=y;)"),
            "{text}"
        );
        assert!(text.contains("verified 2 identities: 1 ok"), "{text}");
    }
}
