//! A node model's ResourceSlices as an autoscaler's templates: the devices a node of that model
//! will publish, made by [`super::build`] (the code the driver publishes with), less what only a
//! real node knows: its name, and each GPU's and MIG device's own UUID. An autoscaler decides
//! from them whether a node it could create would satisfy a pending claim; kube-scheduler
//! allocates from the slices the driver then publishes, which equal the templates but for those
//! fields (`e2e/scale.sh` compares them on the live API server).
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CounterSet, Device, ResourceSlice};

/// Attributes that name one physical unit: a new node's values are unknown beforehand.
pub const UNIT_IDENTITY_ATTRIBUTES: [&str; 2] = ["uuid", "parentUUID"];

/// One slice's content, as Karpenter's `cloudprovider.ResourceSliceTemplate` holds it (driver,
/// pool name, devices or counter sets; no node, no generation).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceTemplate {
    pub driver: String,
    pub pool: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

/// Devices whose identity attribute will hold one value on the real node (a GPU's MIG devices
/// share `parentUUID`): Karpenter's `cloudprovider.AttributeBinding`, so that a claim's
/// `matchAttribute` on it is still satisfiable from the templates.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttributeBinding {
    /// Fully qualified: `<driver>/parentUUID`.
    pub attribute: String,
    pub devices: Vec<DeviceId>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// A node model as Karpenter's instance type holds it (`DynamicResources`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DynamicResources {
    pub resource_slice_templates: Vec<SliceTemplate>,
    pub attribute_bindings: Vec<AttributeBinding>,
}

/// The bindings of `slices`: per identity attribute and value, the devices sharing it (two or
/// more).
pub fn attribute_bindings(slices: &[ResourceSlice]) -> Vec<AttributeBinding> {
    let mut shared: BTreeMap<(String, String), Vec<DeviceId>> = BTreeMap::new();
    for slice in slices {
        for device in slice.spec.devices.iter().flatten() {
            for name in UNIT_IDENTITY_ATTRIBUTES {
                let Some(value) = device
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(name))
                    .and_then(|a| a.string.clone())
                else {
                    continue;
                };
                shared
                    .entry((format!("{}/{name}", slice.spec.driver), value))
                    .or_default()
                    .push(DeviceId {
                        driver: slice.spec.driver.clone(),
                        pool: slice.spec.pool.name.clone(),
                        device: device.name.clone(),
                    });
            }
        }
    }
    shared
        .into_iter()
        .filter(|(_, devices)| devices.len() >= 2)
        .map(|((attribute, _), devices)| AttributeBinding { attribute, devices })
        .collect()
}

/// A node's slices in Karpenter's instance-type form.
pub fn dynamic_resources(slices: Vec<ResourceSlice>) -> DynamicResources {
    DynamicResources {
        attribute_bindings: attribute_bindings(&slices),
        resource_slice_templates: templates(slices),
    }
}

/// `slice` without the values only the real node knows (its UUIDs).
pub fn without_unit_identity(mut slice: ResourceSlice) -> ResourceSlice {
    for device in slice.spec.devices.iter_mut().flatten() {
        if let Some(attributes) = device.attributes.as_mut() {
            for name in UNIT_IDENTITY_ATTRIBUTES {
                attributes.remove(name);
            }
        }
    }
    slice
}

/// The templates of a node's slices, in publishing order.
pub fn templates(slices: Vec<ResourceSlice>) -> Vec<SliceTemplate> {
    slices
        .into_iter()
        .map(without_unit_identity)
        .map(|slice| SliceTemplate {
            driver: slice.spec.driver,
            pool: slice.spec.pool.name,
            devices: slice.spec.devices.unwrap_or_default(),
            shared_counters: slice.spec.shared_counters.unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{self, DiscoveryConfig, GpuSource};
    use crate::slices::{SliceOptions, build};

    #[test]
    fn templates_of_two_nodes_of_one_model_are_equal_and_hold_every_device() {
        let of = |node: &str| {
            let source: GpuSource = "sim:2xH100-SXM5-80GB".parse().expect("spec");
            let inventory =
                gpu::discover(&DiscoveryConfig::new(source, node)).expect("simulated node");
            let options = SliceOptions::new("gpu.nvidia.com", "template");
            build(&inventory, &options).expect("slices")
        };
        let (a, b) = (of("node-a"), of("node-b"));
        let devices: usize = a
            .iter()
            .map(|s| s.spec.devices.iter().flatten().count())
            .sum();
        assert_ne!(a, b, "each node's GPUs have UUIDs of their own");
        let (ta, tb) = (templates(a), templates(b));
        assert_eq!(ta, tb);
        assert_eq!(ta.iter().map(|t| t.devices.len()).sum::<usize>(), devices);
        assert!(ta.iter().any(|t| !t.shared_counters.is_empty()));
        let bindings = attribute_bindings(&of("node-a"));
        assert_eq!(
            bindings.len(),
            2,
            "one per GPU: its MIG devices share parentUUID"
        );
        assert!(
            bindings
                .iter()
                .all(|b| b.attribute == "gpu.nvidia.com/parentUUID"
                    && b.devices.len() > 10
                    && b.devices.iter().all(|d| d.device.contains("-mig-")))
        );
        for device in ta.iter().flat_map(|t| &t.devices) {
            let attributes = device.attributes.as_ref().expect("attributes");
            assert!(!attributes.contains_key("uuid") && !attributes.contains_key("parentUUID"));
            assert!(attributes.contains_key("productName"));
        }
    }
}
