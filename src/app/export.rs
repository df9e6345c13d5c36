//! Export: a copy of the decision log and a Markdown summary of the session's decisions,
//! written as new private files next to a path the operator chose.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::core::planner::{Kind, PlanItem, WriteSummary};
use crate::core::range::IdRange;
use crate::error::{Error, Result};
use crate::io::decision_log::DecisionLog;
use crate::io::private_file::write_new;

/// Writes `<path>.jsonl` (the decision log so far) and `<path>.md` (the summary).
pub fn export(
    log: &DecisionLog,
    server: &str,
    range: IdRange,
    path: &Path,
    items: &[PlanItem],
) -> Result<Vec<PathBuf>> {
    let log_out = path.with_extension("jsonl");
    let md_out = path.with_extension("md");
    let log_text =
        std::fs::read(log.path()).map_err(|e| Error::file_io(log.path(), "cannot read", e))?;
    write_new(&log_out, &log_text)?;
    let md = summary_markdown(log.operator(), server, range, log.path(), items);
    write_new(&md_out, md.as_bytes())?;
    Ok(vec![log_out, md_out])
}

/// A human-readable summary of the session's decisions.
pub fn summary_markdown(
    operator: &str,
    server: &str,
    range: IdRange,
    log_path: &Path,
    items: &[PlanItem],
) -> String {
    let mut out = String::new();
    out.push_str("# cilium-idmig migration summary\n\n");
    let _ = write!(
        out,
        "- operator: {operator}\n- API server: {server}\n- range: {range}\n- decision log: {}\n\n",
        log_path.display()
    );
    out.push_str("| kind | count |\n|---|---|\n");
    for kind in Kind::ALL {
        let _ = writeln!(
            out,
            "| {kind} | {} |",
            items.iter().filter(|i| i.kind == kind).count()
        );
    }
    let w = WriteSummary::of(items);
    out.push_str("\n## Writes\n\n| | count |\n|---|---|\n");
    for (what, n) in [
        ("create at the same id", w.same_id),
        ("create at a new id (remap)", w.remaps),
        ("create a duplicate at its own id", w.duplicates),
        ("CiliumIdentity objects in all", w.creates()),
        ("already migrated", w.already_migrated),
        ("mapped to an id that holds the labels", w.mapped),
        ("skipped by decision", w.skipped),
        ("invalid kvstore entries", w.invalid),
    ] {
        let _ = writeln!(out, "| {what} | {n} |");
    }
    out.push_str("\n## Conflicts and their decisions\n\n| id | kind | action | target | decided | labels |\n|---|---|---|---|---|---|\n");
    for i in items.iter().filter(|i| i.kind.is_conflict()) {
        let t = i.target_id.map_or("-".to_string(), |t| t.to_string());
        let _ = writeln!(
            out,
            "| {} | {} | {} | {t} | {} | `{}` |",
            i.id,
            i.kind,
            i.action.as_str(),
            if i.decided { "yes" } else { "no" },
            i.labels
        );
    }
    let invalid: Vec<&PlanItem> = items.iter().filter(|i| i.kind == Kind::Invalid).collect();
    if !invalid.is_empty() {
        out.push_str("\n## Invalid kvstore entries (never written)\n\n");
        for i in invalid {
            let _ = writeln!(out, "- `{}`: {}", i.id, i.reason);
        }
    }
    out
}
