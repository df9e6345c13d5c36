//! One CiliumIdentity at a time through kube's typed `Api`: read it, create it (never
//! update), delete it only with uid and resourceVersion preconditions; and the CRD, read
//! and installed from `assets/`.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::core::{ClusterResourceScope, TypeMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::errors::{RequestError, kube_call};
use super::target::K8sTarget;
use super::transport::READ_TIMEOUT;
use crate::core::identity::{
    self, CRD_NAME, GROUP, KIND, PLURAL, VERSION, identity_object_of_run, parse_identity,
};
use crate::core::labels::SecurityLabels;
use crate::error::{Error, Result};

/// Which object: its uid and the resourceVersion it was seen at.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub resource_version: String,
    /// The run of this tool that created it (`RUN_ANNOTATION`), if one did.
    #[serde(default, skip_serializing)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

impl ObjectRef {
    /// The run of this tool that created the object, from its annotation.
    pub fn created_by_run(&self) -> Option<&str> {
        self.annotations
            .get(crate::core::identity::RUN_ANNOTATION)
            .map(String::as_str)
    }
}

/// The CRD's state in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdState {
    Missing,
    Present { established: bool },
}

/// A CiliumIdentity as kube's typed `Api` reads and writes it. `security-labels` stays JSON
/// and is read by `parse_identity`, which takes an agent's `null` value as "" (as a Go
/// string would), where a typed map would refuse the object.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct IdentityObject {
    #[serde(flatten)]
    types: TypeMeta,
    metadata: ObjectMeta,
    #[serde(rename = "security-labels", default)]
    security_labels: Value,
}

impl kube::Resource for IdentityObject {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl IdentityObject {
    fn object_ref(&self) -> ObjectRef {
        ObjectRef {
            uid: self.metadata.uid.clone().unwrap_or_default(),
            resource_version: self.metadata.resource_version.clone().unwrap_or_default(),
            annotations: self.metadata.annotations.clone().unwrap_or_default(),
        }
    }
}

impl K8sTarget {
    fn identities(&self) -> Api<IdentityObject> {
        Api::all(self.kube_client())
    }

    fn crds(&self) -> Api<CustomResourceDefinition> {
        Api::all(self.kube_client())
    }

    /// The server's version string, e.g. `v1.33.0`.
    pub async fn server_version(&self) -> Result<String> {
        let client = self.kube_client();
        kube_call(READ_TIMEOUT, client.apiserver_version())
            .await
            .map(|info| info.git_version)
            .map_err(|e| self.kube_err("reading /version", e))
    }

    /// Whether the CRD is installed and Established (a read retried like a scan's).
    pub async fn crd_state(&self) -> Result<CrdState> {
        let api = self.crds();
        match self.read_retrying(CRD_NAME, || api.get(CRD_NAME)).await {
            Ok(crd) => {
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(CrdState::Present { established })
            }
            Err(e) if e.is_404() => Ok(CrdState::Missing),
            Err(e) => Err(self.kube_err(&format!("reading CRD {CRD_NAME}"), e)),
        }
    }

    /// Creates the CRD from `assets/` (an existing one is left as it is).
    pub async fn create_crd(&self) -> Result<()> {
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(identity::CRD_YAML)
            .map_err(|e| Error::Config(format!("embedded CRD: {e}")))?;
        match kube_call(
            READ_TIMEOUT,
            self.crds().create(&PostParams::default(), &crd),
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => Err(self.kube_err(&format!("creating CRD {CRD_NAME}"), e)),
        }
    }

    /// Waits until the CRD is Established and its resource answers (right after creation the
    /// resource path is a plain-text 404 for a while).
    pub async fn wait_crd_established(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let probe = ListParams::default().limit(1);
        loop {
            if self.crd_state().await? == (CrdState::Present { established: true }) {
                match kube_call(READ_TIMEOUT, self.identities().list(&probe)).await {
                    Ok(_) => return Ok(()),
                    Err(e) if e.is_404() => {}
                    Err(e) => return Err(self.kube_err("probing ciliumidentities", e)),
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(self.kube_err(
                    &format!("CRD {CRD_NAME}"),
                    format!("not Established after {}s", timeout.as_secs()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates one identity, annotated with this run, and returns the uid and
    /// resourceVersion the server gave it. Never updates: an existing object yields an
    /// AlreadyExists error.
    pub async fn create_identity(
        &self,
        id: u32,
        labels: &SecurityLabels,
    ) -> Result<ObjectRef, RequestError> {
        let obj = identity_object_of_run(id, labels, crate::io::decision_log::run_id());
        let obj: IdentityObject =
            serde_json::from_value(obj).map_err(|e| RequestError::Transport(e.to_string()))?;
        kube_call(
            READ_TIMEOUT,
            self.identities().create(&PostParams::default(), &obj),
        )
        .await
        .map(|created| created.object_ref())
    }

    /// Reads one identity with its uid, resourceVersion and annotations; `Ok(None)` when it
    /// does not exist.
    pub async fn get_identity_object(
        &self,
        id: u32,
    ) -> Result<Option<(ObjectRef, SecurityLabels)>, RequestError> {
        match kube_call(READ_TIMEOUT, self.identities().get(&id.to_string())).await {
            Ok(obj) => {
                let value = serde_json::to_value(&obj)
                    .map_err(|e| RequestError::Transport(e.to_string()))?;
                let labels = parse_identity(&value)
                    .map_err(RequestError::Transport)?
                    .labels;
                Ok(Some((obj.object_ref(), labels)))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes one identity only if it is still exactly `expected` (uid and resourceVersion
    /// preconditions; an empty one is not sent): otherwise the server answers 409 Conflict
    /// and nothing is deleted.
    pub async fn delete_identity(&self, id: u32, expected: &ObjectRef) -> Result<(), RequestError> {
        let given = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: given(&expected.uid),
                resource_version: given(&expected.resource_version),
            }),
            ..Default::default()
        };
        kube_call(
            READ_TIMEOUT,
            self.identities().delete(&id.to_string(), &params),
        )
        .await
        .map(|_| ())
    }
}
