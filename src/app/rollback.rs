//! Rollback: plans the deletion of exactly the objects earlier runs created, from their
//! decision logs. An object is deleted only if it still has the uid the run recorded and the
//! same security labels (and then with uid and resourceVersion preconditions); anything else
//! (there before the run, made by someone else, deleted and created again, labels changed)
//! is kept, with why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use futures::StreamExt;

use crate::core::decision_log::undo::Undoable;
use crate::core::labels::canonical_key;
use crate::core::outcome::Outcome;
use crate::core::planner::{DecidedBy, Op, OpKind};
use crate::error::Result;
use crate::io::decision_log::Record;
use crate::io::k8s::K8sTarget;

/// Reads to check the objects, in flight at once.
const READS_IN_FLIGHT: usize = 32;

/// What the logs leave to undo: per object name, the `created` line of each object this
/// tool created and has not rolled back yet, and the `deleted` line of each identity
/// `switch-prepare` removed.
pub fn undoable_by_runs(paths: &[PathBuf]) -> Result<Undoable> {
    let mut undo = Undoable::default();
    for p in paths {
        for r in super::flows::read_log(p)?.records {
            undo.fold(r);
        }
    }
    Ok(undo)
}

/// What the logs say this tool created and has not rolled back yet: per object name, the
/// `created` record.
pub fn created_by_runs(paths: &[PathBuf]) -> Result<BTreeMap<u32, Record>> {
    Ok(undoable_by_runs(paths)?.created)
}

/// What to roll back: the runs of these decision logs, and the runs with these ids (found
/// by their annotation, for a log that is lost).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollbackSpec {
    pub logs: Vec<PathBuf>,
    pub runs: Vec<String>,
    /// Delete identities live endpoints use too (the operator's explicit choice).
    pub include_in_use: bool,
}

/// The objects runs created: from their logs, and from their annotation for `runs`.
async fn undoable_by(target: &K8sTarget, spec: &RollbackSpec) -> Result<Undoable> {
    let mut undo = undoable_by_runs(&spec.logs)?;
    if spec.runs.is_empty() {
        return Ok(undo);
    }
    let created = &mut undo.created;
    let runs = spec.runs.iter().cloned().collect();
    let found = crate::io::runs::objects_of_runs(target, &runs)
        .await
        .map_err(|e| {
            crate::Error::kube(
                target.server.clone(),
                "listing CiliumIdentities to find the runs' objects",
                e,
            )
        })?;
    // A run no object carries is most likely a mistyped id: said, not a silent success.
    let missing: Vec<&String> = spec
        .runs
        .iter()
        .filter(|run| !found.iter().any(|o| &o.run == *run))
        .collect();
    if !missing.is_empty() {
        return Err(crate::Error::Config(format!(
            "no CiliumIdentity carries the annotation {}={} on {} (a mistyped run id, or its objects are already gone): check the id (a decision log's session line names it) or pass that run's --decision-log",
            crate::core::identity::RUN_ANNOTATION,
            missing
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            target.server
        )));
    }
    for o in found {
        created.entry(o.id).or_insert_with(|| {
            let labels = canonical_key(&o.labels);
            let mut r = Record::decision(
                &o.id.to_string(),
                &labels,
                crate::core::planner::Kind::Create,
                ("create", DecidedBy::Rule.as_str()),
                Some(o.id),
            );
            r.outcome = Some(Outcome::Created);
            r.uid = Some(o.object.uid);
            r.error = Some(format!("found by its annotation: run {}", o.run));
            r
        });
    }
    Ok(undo)
}

/// One operation per object the runs created: delete it if it is still exactly that
/// object (uid, labels) and no live endpoint uses it, keep it otherwise. Reads each object
/// once, now, and the endpoints once. `include_in_use` deletes in-use identities too (the
/// operator's explicit choice), without reading the endpoints.
pub async fn plan(target: &K8sTarget, spec: &RollbackSpec) -> Result<Vec<Op>> {
    let Undoable { created, removed } = undoable_by(target, spec).await?;
    let include_in_use = spec.include_in_use;
    let in_use = if include_in_use || created.is_empty() {
        BTreeMap::new()
    } else {
        crate::io::endpoints::identities_in_use(target)
            .await
            .map_err(|e| {
                if e.is_404() {
                    // Not an outage: the resource is not there to read.
                    return crate::Error::Config(format!(
                        "{} does not serve ciliumendpoints.cilium.io (the CiliumEndpoint CRD is not installed), so rollback cannot check which identities live endpoints use. Where no Cilium agent runs in CRD mode nothing uses them: pass --include-in-use to delete without the check; otherwise install Cilium's CRDs first",
                        target.server
                    ));
                }
                crate::Error::kube(
                    target.server.clone(),
                    "listing CiliumEndpoints to see which identities are in use (pass --include-in-use to delete without this check)",
                    e,
                )
            })?
    };
    // Endpoints kept in slices (enable-cilium-endpoint-slice) use identities too; a cluster
    // without the slice CRD has none.
    let mut in_use = in_use;
    if !include_in_use && !created.is_empty() {
        match crate::io::endpoints::endpoints_in_slices(target).await {
            Ok(entries) => {
                for (endpoint, id) in entries {
                    let users = in_use.entry(id).or_default();
                    if !users.contains(&endpoint) {
                        users.push(endpoint);
                    }
                }
            }
            Err(e) if e.is_404() => {}
            Err(e) => {
                return Err(crate::Error::kube(
                    target.server.clone(),
                    "listing CiliumEndpointSlices to see which identities are in use (pass --include-in-use to delete without this check)",
                    e,
                ));
            }
        }
    }
    let target_ref = &target;
    let mut ops: Vec<Op> = futures::stream::iter(created)
        .map(|(name, rec)| async move {
            let found = target_ref.get_identity_object(name).await.map_err(|e| {
                crate::Error::kube(target_ref.server.clone(), &format!("reading {name}"), e)
            })?;
            Ok::<_, crate::Error>(decide(name, rec, found))
        })
        .buffer_unordered(READS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    // What switch-prepare removed is restored where its id is still free.
    let restores: Vec<Op> = futures::stream::iter(removed)
        .map(|(name, rec)| async move {
            let found = target_ref.get_identity_object(name).await.map_err(|e| {
                crate::Error::kube(target_ref.server.clone(), &format!("reading {name}"), e)
            })?;
            Ok::<_, crate::Error>(restore(name, rec, found.map(|(_, labels)| labels)))
        })
        .buffer_unordered(READS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_>>()?;
    ops.extend(restores);
    for op in &mut ops {
        let Some(users) = op.target_id.and_then(|t| in_use.get(&t)) else {
            continue;
        };
        if op.op == OpKind::Delete {
            *op = keep_in_use(op.clone(), users);
        }
    }
    ops.sort_by_key(|o| o.target_id);
    Ok(ops)
}

/// Kept: live endpoints use it. Deleting it would make their agents create it again (same
/// name and labels, another uid) and leave the endpoints without an identity meanwhile.
fn keep_in_use(mut op: Op, users: &[String]) -> Op {
    const SHOWN: usize = 5;
    let mut names = users
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if users.len() > SHOWN {
        names.push_str(&format!(" and {} more", users.len() - SHOWN));
    }
    let namespaces: std::collections::BTreeSet<&str> = users
        .iter()
        .filter_map(|u| u.split_once('/').map(|(ns, _)| ns))
        .collect();
    op.op = OpKind::Keep;
    op.decided_by = DecidedBy::Rule;
    op.expect = None;
    op.reason = Some(format!(
        "in use by {} endpoint(s) in {} (namespaces {}): deleting it would make their agents create it again and leave them without an identity meanwhile; kept (--include-in-use deletes it anyway)",
        users.len(),
        names,
        namespaces.into_iter().collect::<Vec<_>>().join(", ")
    ));
    op
}

/// The rule for one object, given what is there now.
fn decide(
    name: u32,
    rec: Record,
    found: Option<(
        crate::io::k8s::ObjectRef,
        crate::core::labels::SecurityLabels,
    )>,
) -> Op {
    let mut op = Op {
        id: rec.id.clone(),
        label_key: rec.labels.clone(),
        kind: rec.kind,
        op: OpKind::Keep,
        target_id: Some(name),
        decided_by: DecidedBy::Rule,
        expect: None,
        reason: None,
    };
    let keep = |mut op: Op, why: String| {
        op.reason = Some(why);
        op
    };
    let Some(uid) = rec.uid.clone().filter(|u| !u.is_empty()) else {
        return keep(
            op,
            "the run that created it did not record its uid (an older version of this tool): not deleted".into(),
        );
    };
    match found {
        // Gone already: the delete finds a 404 and records it as already gone.
        None => {
            op.op = OpKind::Delete;
            op.decided_by = DecidedBy::Operator;
            op.expect = Some((uid, String::new()));
            op
        }
        Some((meta, _)) if meta.uid != uid => keep(
            op,
            format!(
                "deleted and created again since (uid {} now, the run created {uid}): not this tool's object",
                meta.uid
            ),
        ),
        Some((_, labels)) if canonical_key(&labels) != rec.labels => keep(
            op,
            format!(
                "its security labels changed since the run created it (now {}): not deleted",
                canonical_key(&labels)
            ),
        ),
        Some((meta, _)) => {
            op.op = OpKind::Delete;
            op.decided_by = DecidedBy::Operator;
            op.expect = Some((uid, meta.resource_version));
            op
        }
    }
}

/// The undo of one removal by `switch-prepare`: the identity created again at its id with
/// its labels, unless something holds the id now (a create never overwrites either way).
fn restore(name: u32, rec: Record, found: Option<crate::core::labels::SecurityLabels>) -> Op {
    let mut op = Op {
        id: rec.id.clone(),
        label_key: rec.labels.clone(),
        kind: rec.kind,
        op: OpKind::Create,
        target_id: Some(name),
        decided_by: DecidedBy::Operator,
        expect: None,
        reason: Some("switch-prepare removed it: created again at its id with its labels".into()),
    };
    if let Some(labels) = found {
        op.op = OpKind::Keep;
        op.decided_by = DecidedBy::Rule;
        op.reason = Some(format!(
            "switch-prepare removed it, and id {name} holds an object again ({}): not restored",
            canonical_key(&labels)
        ));
    }
    op
}

/// Counts of a rollback plan, for the review before `--yes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollbackSummary {
    pub delete: usize,
    pub gone: usize,
    pub keep: usize,
    /// Identities `switch-prepare` removed, to create again.
    pub restore: usize,
}

pub fn summarize(ops: &[Op]) -> RollbackSummary {
    let mut s = RollbackSummary::default();
    for op in ops {
        match (op.op, &op.expect) {
            (OpKind::Delete, Some((_, rv))) if rv.is_empty() => s.gone += 1,
            (OpKind::Delete, _) => s.delete += 1,
            (OpKind::Create, _) => s.restore += 1,
            _ => s.keep += 1,
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::planner::Kind;
    use crate::io::k8s::ObjectRef;

    fn created(uid: Option<&str>) -> Record {
        let mut r = Record::new(
            "300",
            "k8s:app=a;",
            Kind::Create,
            "create (proposal)".into(),
            Some(300),
        );
        r.outcome = Some(Outcome::Created);
        r.uid = uid.map(str::to_string);
        r
    }

    fn labels(key: &str) -> crate::core::labels::SecurityLabels {
        crate::core::labels::to_security_labels(&crate::core::labels::parse_label_key(key).unwrap())
    }

    fn obj(uid: &str, rv: &str) -> ObjectRef {
        ObjectRef {
            uid: uid.into(),
            resource_version: rv.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_object_the_run_created_is_deleted() {
        let op = decide(
            300,
            created(Some("u1")),
            Some((obj("u1", "9"), labels("k8s:app=a;"))),
        );
        assert_eq!(op.op, OpKind::Delete);
        assert_eq!(op.expect, Some(("u1".into(), "9".into())));
        let op = decide(
            300,
            created(Some("u1")),
            Some((obj("u2", "9"), labels("k8s:app=a;"))),
        );
        assert_eq!(op.op, OpKind::Keep);
        assert!(op.reason.unwrap().contains("created again"));
        let op = decide(
            300,
            created(Some("u1")),
            Some((obj("u1", "9"), labels("k8s:app=b;"))),
        );
        assert_eq!(op.op, OpKind::Keep);
        assert!(op.reason.unwrap().contains("labels changed"));
        let op = decide(
            300,
            created(None),
            Some((obj("u1", "9"), labels("k8s:app=a;"))),
        );
        assert_eq!(op.op, OpKind::Keep);
        let gone = decide(300, created(Some("u1")), None);
        assert_eq!(gone.op, OpKind::Delete);
        assert_eq!(
            summarize(&[op, gone]),
            RollbackSummary {
                delete: 0,
                gone: 1,
                keep: 1,
                restore: 0
            }
        );
    }
}
