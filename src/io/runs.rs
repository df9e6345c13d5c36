//! Finding the objects a run created by their annotation (`RUN_ANNOTATION`), for a rollback
//! whose decision log is lost: every CiliumIdentity, read in pages through kube's
//! `Api<DynamicObject>` (a rare, operator-started read, so no streaming parse), filtered
//! here, since the API server cannot select by annotation.

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use std::collections::BTreeSet;

use super::k8s::{K8sTarget, ObjectRef, RequestError, for_each_listed};
use crate::core::identity::{GROUP, KIND, PLURAL, RUN_ANNOTATION, VERSION, parse_identity};
use crate::core::labels::SecurityLabels;

/// One object a run created, as it is now.
#[derive(Debug, Clone)]
pub struct RunObject {
    pub id: u32,
    pub run: String,
    pub object: ObjectRef,
    pub labels: SecurityLabels,
}

/// Every CiliumIdentity whose annotation names one of `runs`.
pub async fn objects_of_runs(
    target: &K8sTarget,
    runs: &BTreeSet<String>,
) -> Result<Vec<RunObject>, RequestError> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    let resource = ApiResource::from_gvk_with_plural(&gvk, PLURAL);
    let api: Api<DynamicObject> = Api::all_with(target.kube_client(), &resource);
    let mut found: Vec<RunObject> = Vec::new();
    let mut restarted = false;
    for_each_listed(
        &api,
        || restarted = true,
        |obj| {
            let Some(run) = obj
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(RUN_ANNOTATION))
                .filter(|r| runs.contains(*r))
                .cloned()
            else {
                return;
            };
            let Ok(value) = serde_json::to_value(&obj) else {
                return;
            };
            let (Ok(observed), Some(Ok(id))) = (
                parse_identity(&value),
                obj.metadata.name.as_deref().map(str::parse::<u32>),
            ) else {
                return;
            };
            found.push(RunObject {
                id,
                run,
                object: ObjectRef {
                    uid: obj.metadata.uid.clone().unwrap_or_default(),
                    resource_version: obj.metadata.resource_version.clone().unwrap_or_default(),
                    ..Default::default()
                },
                labels: observed.labels,
            });
        },
    )
    .await?;
    if restarted {
        // A list started over repeats what the first attempt saw.
        found.sort_by_key(|o| o.id);
        found.dedup_by_key(|o| o.id);
    }
    Ok(found)
}
