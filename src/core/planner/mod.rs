//! The planner: classifies every kvstore identity against the Kubernetes snapshot
//! (`rules`), applies and re-validates decisions (`decision`, `reconcile`). Pure: no IO; the
//! same input always gives the same plan.

pub mod decision;
mod item;
pub mod reconcile;
pub mod resume;
mod rules;
pub use decision::{DecidedBy, Decision, WriteSummary, describe, sync_writes_at_start};
pub use item::{Action, Kind, PlanItem, Summary, summarize};
pub use reconcile::{
    Op, OpKind, ReconcileError, Reconciled, check_create_target, reconcile, reconcile_taking,
    validate_new_target,
};
pub use rules::{Around, item_of, plan, plan_taking, repropose_taken_targets};

#[cfg(test)]
mod tests;
