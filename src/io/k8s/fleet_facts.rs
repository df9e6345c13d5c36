//! The few reads `fleet` makes of each cluster besides the switch report and sync's
//! standing: Cilium's version from its DaemonSet's image, and how many `CiliumIdentity`
//! objects there are (one page of one item: the server counts the rest).

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;

use super::errors::{RequestError, kube_call};
use super::target::K8sTarget;

const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl K8sTarget {
    /// The tag of the `cilium-agent` image of DaemonSet `namespace/cilium` (`None`: no such
    /// DaemonSet, no leave to read DaemonSets, or an image without a tag: the version is
    /// worth a column, not the cluster's row).
    pub async fn cilium_version(&self, namespace: &str) -> Result<Option<String>, RequestError> {
        let api: Api<DaemonSet> = Api::namespaced(self.kube_client(), namespace);
        let ds = match kube_call(READ_TIMEOUT, api.get_opt("cilium")).await {
            Ok(Some(ds)) => ds,
            Ok(None) => return Ok(None),
            Err(RequestError::Status {
                code: 403 | 404, ..
            }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let containers = ds
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.containers)
            .unwrap_or_default();
        let image = containers
            .iter()
            .find(|c| c.name == "cilium-agent")
            .or(containers.first())
            .and_then(|c| c.image.clone());
        Ok(image.and_then(|i| image_tag(&i)))
    }

    /// How many `CiliumIdentity` objects there are (`None`: the CRD is not served).
    pub async fn identity_count(&self) -> Result<Option<usize>, RequestError> {
        let gvk = GroupVersionKind::gvk("cilium.io", "v2", "CiliumIdentity");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "ciliumidentities");
        let api: Api<DynamicObject> = Api::all_with(self.kube_client(), &resource);
        let page = match kube_call(
            READ_TIMEOUT,
            api.list_metadata(&ListParams::default().limit(1)),
        )
        .await
        {
            Ok(p) => p,
            Err(e) if e.is_404() => return Ok(None),
            Err(e) => return Err(e),
        };
        let rest = page.metadata.remaining_item_count.unwrap_or(0);
        if rest > 0
            || page
                .metadata
                .continue_
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        {
            return Ok(Some(page.items.len() + rest as usize));
        }
        // A server that does not count what is left: every page, names only.
        let mut total = page.items.len();
        let mut next = page.metadata.continue_;
        while let Some(token) = next.filter(|t| !t.is_empty()) {
            let lp = ListParams::default().limit(500).continue_token(&token);
            let page = kube_call(READ_TIMEOUT, api.list_metadata(&lp)).await?;
            total += page.items.len();
            next = page.metadata.continue_;
        }
        Ok(Some(total))
    }
}

/// The tag of an image reference (`quay.io/cilium/cilium:v1.14.5@sha256:...` is `v1.14.5`).
fn image_tag(image: &str) -> Option<String> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, tag)| tag.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tag_is_read_past_registry_ports_and_digests() {
        use super::image_tag;
        assert_eq!(
            image_tag("quay.io/cilium/cilium:v1.14.5@sha256:abc").as_deref(),
            Some("v1.14.5")
        );
        assert_eq!(
            image_tag("registry:5000/cilium/cilium:v1.9.18").as_deref(),
            Some("v1.9.18")
        );
        assert_eq!(image_tag("registry:5000/cilium/cilium"), None);
    }
}
