//! Per-device node-allocatable overhead (KEP-5517, `Device.nodeAllocatableResources`, alpha gate
//! `DRANodeAllocatableResources`): the host memory and CPU a pod using a GPU costs besides the
//! GPU (pinned buffers, the CUDA context, driver threads). Kubelet adds it to the pod's and the
//! referencing containers' cgroups, the scheduler to the pod's node-resource fit. How much
//! depends on the product and the workload, so it comes from a table the admin sets
//! (`--node-allocatable-overhead FILE`, chart `nodeAllocatableOverhead`):
//!
//! ```yaml
//! "NVIDIA H100 80GB HBM3":            # productName; MIG devices of it too
//!   memory: {perPod: 2Gi, perContainer: 512Mi}
//!   cpu: {perPod: 100m}
//! "NVIDIA H100 80GB HBM3/1g.10gb":    # one MIG profile of it (before the product's entry)
//!   memory: {perPod: 512Mi}
//! "*":                                # every other GPU
//!   memory: {perPod: 1Gi}
//! ```
//!
//! GPUs for virtual machines (`gpu-vfio-*`) get none: the VM's memory is the pod's own request.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, NodeAllocatableOverhead, NodeAllocatableResource};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;

/// Matches every product not named.
pub const ANY_PRODUCT: &str = "*";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OverheadEntry {
    per_pod: Option<String>,
    per_container: Option<String>,
}

/// The admin's table: device key (`product`, `product/profile`, `*`) → node resource → overhead.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OverheadTable {
    entries: BTreeMap<String, BTreeMap<String, NodeAllocatableResource>>,
}

/// `cpu`, `memory`, `hugepages-<size>`: the names the API server takes as keys
/// (`IsNodeAllocatableResourceName`).
pub fn is_node_allocatable_name(name: &str) -> bool {
    name == "cpu"
        || name == "memory"
        || name
            .strip_prefix("hugepages-")
            .is_some_and(|s| !s.is_empty())
}

/// A quantity the API server takes, non-negative, as written (the server canonicalizes it).
fn quantity(text: &str) -> Result<Quantity, String> {
    let text = text.trim();
    let parsed = k8s_quantity::Quantity::parse(text).map_err(|e| format!("{text:?}: {e}"))?;
    if parsed.as_approximate_float() < 0.0 {
        return Err(format!("{text:?}: must be non-negative"));
    }
    Ok(Quantity(text.to_string()))
}

impl OverheadTable {
    /// Parses the YAML (or JSON) table; an error names the entry and field.
    pub fn parse(text: &str) -> Result<Self, String> {
        let raw: BTreeMap<String, BTreeMap<String, OverheadEntry>> =
            serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let mut entries = BTreeMap::new();
        for (key, resources) in raw {
            if key.is_empty() {
                return Err(
                    "an entry with an empty name: use a productName, productName/profile or \"*\""
                        .into(),
                );
            }
            let mut mapped = BTreeMap::new();
            for (resource, entry) in resources {
                let at = format!("{key:?}.{resource}");
                if !is_node_allocatable_name(&resource) {
                    return Err(format!(
                        "{at}: not a node-allocatable resource (cpu, memory, hugepages-<size>); extended resources cannot be overhead"
                    ));
                }
                if entry.per_pod.is_none() && entry.per_container.is_none() {
                    return Err(format!("{at}: set perPod, perContainer or both"));
                }
                let per_pod = entry
                    .per_pod
                    .as_deref()
                    .map(quantity)
                    .transpose()
                    .map_err(|e| format!("{at}.perPod: {e}"))?;
                let per_container = entry
                    .per_container
                    .as_deref()
                    .map(quantity)
                    .transpose()
                    .map_err(|e| format!("{at}.perContainer: {e}"))?;
                mapped.insert(
                    resource,
                    NodeAllocatableResource {
                        mapping: None,
                        overhead: Some(NodeAllocatableOverhead {
                            per_pod,
                            per_container,
                        }),
                    },
                );
            }
            if mapped.is_empty() {
                return Err(format!("{key:?}: no resources"));
            }
            entries.insert(key, mapped);
        }
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for a device: its MIG profile's, else its product's, else `*`'s.
    fn lookup(
        &self,
        product: &str,
        profile: Option<&str>,
    ) -> Option<&BTreeMap<String, NodeAllocatableResource>> {
        profile
            .and_then(|p| self.entries.get(&format!("{product}/{p}")))
            .or_else(|| self.entries.get(product))
            .or_else(|| self.entries.get(ANY_PRODUCT))
    }

    /// Sets each GPU and MIG device's `nodeAllocatableResources` from the table.
    pub fn apply(&self, devices: &mut [Device]) {
        for device in devices {
            let attribute = |name: &str| {
                device
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(name))
                    .and_then(|a| a.string.clone())
            };
            let kind = attribute("type");
            let profile = match kind.as_deref() {
                Some("gpu") => None,
                Some("mig") => attribute("profile"),
                _ => continue,
            };
            let product = attribute("productName").unwrap_or_default();
            if let Some(resources) = self.lookup(&product, profile.as_deref()) {
                device.node_allocatable_resources = Some(resources.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = r#"
"NVIDIA H100 80GB HBM3":
  memory: {perPod: 2Gi, perContainer: 512Mi}
  cpu: {perPod: 100m}
"NVIDIA H100 80GB HBM3/1g.10gb":
  memory: {perPod: 512Mi}
"*":
  hugepages-2Mi: {perPod: 4Mi}
"#;

    #[test]
    fn profile_then_product_then_any() {
        let table = OverheadTable::parse(TABLE).expect("table");
        let whole = table
            .lookup("NVIDIA H100 80GB HBM3", None)
            .expect("product");
        assert_eq!(whole.len(), 2);
        let overhead = whole["memory"].overhead.as_ref().expect("overhead");
        assert_eq!(overhead.per_pod, Some(Quantity("2Gi".into())));
        assert_eq!(overhead.per_container, Some(Quantity("512Mi".into())));
        let small = table
            .lookup("NVIDIA H100 80GB HBM3", Some("1g.10gb"))
            .expect("profile");
        assert_eq!(small.keys().collect::<Vec<_>>(), ["memory"]);
        let other_profile = table
            .lookup("NVIDIA H100 80GB HBM3", Some("3g.40gb"))
            .expect("product");
        assert_eq!(other_profile.len(), 2);
        assert!(
            table
                .lookup("Tesla T4", None)
                .expect("any")
                .contains_key("hugepages-2Mi")
        );
    }

    #[test]
    fn bad_entries_are_named() {
        let err = |text: &str| OverheadTable::parse(text).expect_err(text);
        assert!(
            err("x: {nvidia.com/gpu: {perPod: 1}}")
                .contains("\"x\".nvidia.com/gpu: not a node-allocatable resource")
        );
        assert!(err("x: {memory: {}}").contains("\"x\".memory: set perPod, perContainer or both"));
        assert!(
            err("x: {memory: {perPod: -1Gi}}")
                .contains("\"x\".memory.perPod: \"-1Gi\": must be non-negative")
        );
        assert!(err("x: {memory: {perPod: lots}}").contains("\"x\".memory.perPod"));
        assert!(err("x: {memory: {perPods: 1Gi}}").contains("perPods"));
    }
}
