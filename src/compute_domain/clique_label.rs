//! The `nvidia.com/gpu.clique` node label (NVIDIA's `gpuCliqueLabelEnabled`): the node's NVLink
//! clique on its Node object, for node selectors and affinities written against what
//! gpu-feature-discovery used to set. Set once the clique is known, moved when fabric
//! partitioning moves the node, re-asserted now and then (someone may have removed it), and
//! removed when the plugin stops.
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

pub const GPU_CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
/// How often a label already set is written again (NVIDIA's refresh interval).
pub const REASSERT_INTERVAL: Duration = Duration::from_secs(600);

/// What to write now: the clique when it differs from the label last written or that write is
/// old; nothing for a node without multi-node NVLink (an empty clique), as NVIDIA leaves it.
pub fn label_to_write<'a>(
    written: Option<(&str, Instant)>,
    clique: &'a str,
    now: Instant,
) -> Option<&'a str> {
    if clique.is_empty() {
        return None;
    }
    match written {
        Some((label, at)) if label == clique && now.duration_since(at) < REASSERT_INTERVAL => None,
        _ => Some(clique),
    }
}

/// The merge patch that sets the label (`Some`) or removes it (`None`).
pub fn label_patch(clique: Option<&str>) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {GPU_CLIQUE_LABEL: clique}}})
}

/// Keeps this node's label.
pub struct CliqueLabel {
    nodes: Api<Node>,
    node_name: String,
    timeout: Duration,
    written: Option<(String, Instant)>,
}

impl CliqueLabel {
    pub fn new(client: kube::Client, node_name: String, timeout: Duration) -> Self {
        Self {
            nodes: Api::all(client),
            node_name,
            timeout,
            written: None,
        }
    }

    /// Writes the label when [`label_to_write`] says so; a failed write is retried next time.
    pub async fn follow(&mut self, clique: &str) {
        let written = self.written.as_ref().map(|(l, at)| (l.as_str(), *at));
        let Some(label) = label_to_write(written, clique, Instant::now()) else {
            return;
        };
        match self.patch(Some(label)).await {
            Ok(()) => {
                if written.map(|(l, _)| l) != Some(label) {
                    tracing::info!(label = GPU_CLIQUE_LABEL, clique = label, node = %self.node_name, "node labelled with its NVLink clique");
                }
                self.written = Some((label.to_string(), Instant::now()));
            }
            Err(error) => {
                tracing::warn!(label = GPU_CLIQUE_LABEL, %error, "cannot label the node with its NVLink clique")
            }
        }
    }

    /// Removes the label (the plugin stops: nothing keeps it true any more).
    pub async fn remove(&self) {
        match self.patch(None).await {
            Ok(()) => {
                tracing::info!(label = GPU_CLIQUE_LABEL, node = %self.node_name, "node label removed")
            }
            Err(error) => {
                tracing::warn!(label = GPU_CLIQUE_LABEL, %error, "cannot remove the node's clique label")
            }
        }
    }

    async fn patch(&self, clique: Option<&str>) -> Result<(), String> {
        let patch = Patch::Merge(label_patch(clique));
        let params = PatchParams::default();
        let call = self.nodes.patch(&self.node_name, &params, &patch);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("patching Node {}: {e}", self.node_name)),
            Err(_) => Err(format!(
                "patching Node {}: no answer in {:?}",
                self.node_name, self.timeout
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_is_written_when_it_changes_or_is_old() {
        let now = Instant::now();
        let clique = "7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201.1";
        // Not yet written; a node without multi-node NVLink gets none.
        assert_eq!(label_to_write(None, clique, now), Some(clique));
        assert_eq!(label_to_write(None, "", now), None);
        // Written just now: nothing to do; moved to another clique: the new one.
        assert_eq!(label_to_write(Some((clique, now)), clique, now), None);
        let moved = "7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201.2";
        assert_eq!(label_to_write(Some((clique, now)), moved, now), Some(moved));
        // Written long ago: again, in case someone removed it.
        let later = now + REASSERT_INTERVAL;
        assert_eq!(
            label_to_write(Some((clique, now)), clique, later),
            Some(clique)
        );
        // The fabric can no longer be read (empty): the last label stays.
        assert_eq!(label_to_write(Some((clique, now)), "", later), None);
    }

    #[test]
    fn patches_set_and_remove_the_label() {
        assert_eq!(
            label_patch(Some("c.1")),
            serde_json::json!({"metadata": {"labels": {"nvidia.com/gpu.clique": "c.1"}}})
        );
        assert_eq!(
            label_patch(None),
            serde_json::json!({"metadata": {"labels": {"nvidia.com/gpu.clique": null}}})
        );
    }
}
