//! What the credentials may do: a SelfSubjectAccessReview through kube's typed `Api`.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::errors::kube_call;
use super::target::K8sTarget;
use super::transport::READ_TIMEOUT;
use crate::error::Result;

impl K8sTarget {
    /// Asks the API server whether the current user may do `verb` on a resource.
    pub async fn can_i(&self, verb: &str, group: &str, resource: &str) -> Result<bool> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_string()),
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.kube_client());
        let answered = kube_call(READ_TIMEOUT, api.create(&PostParams::default(), &review))
            .await
            .map_err(|e| self.kube_err("SelfSubjectAccessReview", e))?;
        Ok(answered.status.is_some_and(|s| s.allowed))
    }
}
