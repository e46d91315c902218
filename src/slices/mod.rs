//! Device model → `resource.k8s.io/v1` ResourceSlices, with NVIDIA's names so existing
//! DeviceClasses and claims match unchanged.
//!
//! One pool per node (pool name = node name). The scheduler sorts a pool's slices by name and
//! takes the first matching device, so slice names carry a zero-padded index and device order is
//! deliberate: whole GPUs and static MIG devices by minor, then dynamic MIG placements in the
//! best-fit order of [`packing`]. Counter sets of dynamic GPUs live in their own slice (the
//! Kubernetes 1.35+ layout). Everything is validated against the API server's limits before it
//! leaves this module.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Counter, CounterSet, Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gpu::mig::{GpuMode, MigPolicy, choose_modes, gpu_device_name, mig_device_name};
use crate::gpu::{Gpu, MigInstance, NodeInventory};

pub mod consumable;
pub mod gates;
pub mod node_allocatable;
pub mod packing;
pub mod partitions;
pub mod passthrough;
pub mod publish;
pub mod template;
pub mod validate;

/// NVIDIA's driver name; users' DeviceClasses select on it.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.nvidia.com";
/// Most devices in one slice (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Most devices in one slice when any uses taints, counters or list attributes.
pub const MAX_DEVICES_PER_SLICE_WITH_COUNTERS: usize = 64;
/// Most counter sets in one slice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error("{object}: {field}: {reason}")]
    Invalid {
        object: String,
        field: String,
        reason: String,
    },
}

/// Device order within the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceOrder {
    /// Best-fit order for dynamic MIG placements (see [`packing`]).
    #[default]
    Packed,
    /// Plain device-name order, as NVIDIA's driver publishes (for comparison).
    Name,
}

/// What the slices are published as.
#[derive(Debug, Clone)]
pub struct SliceOptions {
    pub driver_name: String,
    pub node_name: String,
    /// Pool generation to stamp (publication bumps it when content changes).
    pub generation: i64,
    pub mig_policy: MigPolicy,
    /// Per-GPU modes decided by the driver at start; `None` derives them from `mig_policy`,
    /// taking existing MIG devices as someone else's.
    pub modes: Option<BTreeMap<u32, GpuMode>>,
    pub order: DeviceOrder,
    /// Whether devices may be shared by several claims (`--consumable-shares`).
    pub consumable: consumable::ConsumableShares,
    /// Device taints from GPU faults, by device name (see [`crate::health`]).
    pub taints: std::sync::Arc<BTreeMap<String, Vec<k8s_openapi::api::resource::v1::DeviceTaint>>>,
    /// Whether eligible GPUs are also published for virtual machines (`--passthrough`).
    pub passthrough: bool,
    /// `resource.kubernetes.io/numaNode` as a one-element list (`ints`), as the
    /// `DRAListTypeAttributes` gate (KEP-6072) prefers it.
    pub numa_node_list: bool,
    /// Per-device node-allocatable overhead (`DRANodeAllocatableResources`, KEP-5517).
    pub node_allocatable: std::sync::Arc<node_allocatable::OverheadTable>,
}

impl SliceOptions {
    pub fn new(driver_name: &str, node_name: &str) -> Self {
        Self {
            driver_name: driver_name.to_string(),
            node_name: node_name.to_string(),
            generation: 1,
            mig_policy: MigPolicy::Auto,
            modes: None,
            order: DeviceOrder::Packed,
            consumable: consumable::ConsumableShares::Off,
            taints: Default::default(),
            passthrough: false,
            numa_node_list: false,
            node_allocatable: Default::default(),
        }
    }

    /// Each GPU's mode.
    pub fn modes(&self, inventory: &NodeInventory) -> BTreeMap<u32, GpuMode> {
        match &self.modes {
            Some(modes) => modes.clone(),
            None => choose_modes(&inventory.gpus, self.mig_policy, |minor| {
                inventory
                    .gpus
                    .iter()
                    .find(|g| g.minor == minor)
                    .and_then(|g| g.mig.as_ref())
                    .is_some_and(|m| !m.instances.is_empty())
            }),
        }
    }
}

/// The pool's content: counter sets and devices in publication order.
#[derive(Debug, Clone, Default)]
pub struct PoolContent {
    pub counter_sets: Vec<CounterSet>,
    pub devices: Vec<Device>,
}

/// The devices (and counter sets) of a node in publication order.
pub fn content(inventory: &NodeInventory, options: &SliceOptions) -> PoolContent {
    let modes = options.modes(inventory);
    let mut pool = PoolContent::default();
    let mut candidates = Vec::new();
    // GPUs also offered to virtual machines, by PCI address.
    let passthrough: BTreeMap<&str, &crate::gpu::pci::PciGpu> = if options.passthrough {
        passthrough::eligibility(inventory, &modes)
            .into_iter()
            .filter(|(_, verdict)| verdict.is_ok())
            .map(|(function, _)| (function.bus_id.as_str(), function))
            .collect()
    } else {
        BTreeMap::new()
    };
    let shareable = |mut device: Device, gpu: &Gpu| {
        consumable::apply(&mut device, options.consumable);
        if let Some(function) = passthrough.get(gpu.pci_bus_id.as_str()) {
            device
                .consumes_counters
                .get_or_insert_with(Vec::new)
                .push(passthrough::sibling_consumption(function));
        }
        device
    };
    for gpu in &inventory.gpus {
        let mig_on = gpu.mig.as_ref().is_some_and(|m| m.mode.current);
        match modes.get(&gpu.minor).copied().unwrap_or(GpuMode::Whole) {
            GpuMode::Unusable => {}
            GpuMode::Whole => {
                if !mig_on {
                    let device = full_gpu_device(inventory, gpu);
                    pool.devices.push(shareable(device, gpu));
                }
            }
            GpuMode::Static => {
                // A GPU in MIG mode can only be used through its MIG devices.
                if !mig_on {
                    let device = full_gpu_device(inventory, gpu);
                    pool.devices.push(shareable(device, gpu));
                }
                pool.devices.extend(
                    static_mig_devices(inventory, gpu).map(|device| shareable(device, gpu)),
                );
            }
            GpuMode::Dynamic => {
                pool.counter_sets.push(partitions::counter_set(gpu));
                // Ampere cannot leave MIG mode without a reset: no whole GPU while it is on.
                if !mig_on || gpu.architecture.toggles_mig_without_reset() {
                    let device = partitions::whole_gpu(inventory, gpu);
                    pool.devices.push(shareable(device, gpu));
                }
                candidates.extend(dynamic_candidates(gpu));
            }
        }
    }
    packing::order(&mut candidates, packing::Usage::of);
    pool.devices.extend(candidates.into_iter().map(|c| {
        let device = partitions::placement_device(inventory, c.gpu, c.profile, c.placement);
        shareable(device, c.gpu)
    }));
    for function in passthrough.values() {
        pool.counter_sets.push(passthrough::counter_set(function));
        pool.devices
            .push(passthrough::vfio_device(inventory, function));
    }
    if options.order == DeviceOrder::Name {
        pool.devices.sort_by(|a, b| a.name.cmp(&b.name));
    }
    if options.numa_node_list {
        for attribute in pool
            .devices
            .iter_mut()
            .filter_map(|d| d.attributes.as_mut())
            .filter_map(|a| a.get_mut(NUMA_NODE))
        {
            if let Some(node) = attribute.int.take() {
                attribute.ints = Some(vec![node]);
            }
        }
    }
    options.node_allocatable.apply(&mut pool.devices);
    if !options.taints.is_empty() {
        for device in &mut pool.devices {
            if let Some(taints) = options.taints.get(&device.name) {
                device.taints = Some(taints.clone());
            }
        }
    }
    pool
}

fn dynamic_candidates(gpu: &Gpu) -> impl Iterator<Item = packing::Candidate<'_>> {
    partitions::placements(gpu)
        .into_iter()
        .map(move |(profile, placement)| packing::Candidate {
            gpu,
            profile,
            placement,
        })
}

/// Dynamic GPUs' MIG placements in the order [`content`] publishes them (the order the
/// scheduler's first fit tries them), without building devices: for replaying many republishes.
pub fn placement_order<'a>(
    inventory: &'a NodeInventory,
    options: &SliceOptions,
) -> Vec<packing::Candidate<'a>> {
    let modes = options.modes(inventory);
    let mut candidates: Vec<_> = inventory
        .gpus
        .iter()
        .filter(|gpu| modes.get(&gpu.minor) == Some(&GpuMode::Dynamic))
        .flat_map(dynamic_candidates)
        .collect();
    if options.order == DeviceOrder::Packed {
        packing::order(&mut candidates, packing::Usage::of);
    } else {
        candidates.sort_by_cached_key(|c| {
            crate::gpu::mig::mig_device_name(
                c.gpu.minor,
                &c.profile.name,
                c.profile.id,
                c.placement.start,
            )
        });
    }
    candidates
}

/// The devices of a node in publication order (see [`content`]).
pub fn devices(inventory: &NodeInventory) -> Vec<Device> {
    content(inventory, &SliceOptions::new(DEFAULT_DRIVER_NAME, "")).devices
}

fn static_mig_devices<'a>(
    inventory: &'a NodeInventory,
    gpu: &'a Gpu,
) -> impl Iterator<Item = Device> + 'a {
    let mut instances: Vec<&MigInstance> =
        gpu.mig.iter().flat_map(|m| m.instances.iter()).collect();
    instances.sort_by_key(|i| (i.placement.start, i.placement.size, i.gpu_instance_id));
    instances
        .into_iter()
        .filter_map(move |instance| static_mig_device(inventory, gpu, instance))
}

/// Splits devices into slices: no slice over its limit (64 once a device uses counters), order
/// kept.
fn chunk_devices(devices: Vec<Device>) -> Vec<Vec<Device>> {
    let mut chunks: Vec<Vec<Device>> = Vec::new();
    let mut current: Vec<Device> = Vec::new();
    let mut strict = false;
    for device in devices {
        // The API server's "advanced features": counters, taints, list-valued attributes.
        let uses_counters = device
            .consumes_counters
            .as_ref()
            .is_some_and(|c| !c.is_empty())
            || device.taints.as_ref().is_some_and(|t| !t.is_empty())
            || device
                .attributes
                .iter()
                .flat_map(BTreeMap::values)
                .any(|a| {
                    a.ints.is_some()
                        || a.bools.is_some()
                        || a.strings.is_some()
                        || a.versions.is_some()
                });
        let limit = if strict || uses_counters {
            MAX_DEVICES_PER_SLICE_WITH_COUNTERS
        } else {
            MAX_DEVICES_PER_SLICE
        };
        if current.len() >= limit {
            chunks.push(std::mem::take(&mut current));
            strict = false;
        }
        strict |= uses_counters;
        current.push(device);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// Builds and validates the node's slices.
pub fn build(
    inventory: &NodeInventory,
    options: &SliceOptions,
) -> Result<Vec<ResourceSlice>, SliceError> {
    let pool = content(inventory, options);
    let mut specs: Vec<(Vec<CounterSet>, Vec<Device>)> = pool
        .counter_sets
        .chunks(MAX_COUNTER_SETS_PER_SLICE)
        .map(|sets| (sets.to_vec(), vec![]))
        .collect();
    specs.extend(
        chunk_devices(pool.devices)
            .into_iter()
            .map(|devices| (vec![], devices)),
    );
    if specs.is_empty() {
        // An empty pool is still published so the scheduler knows the node has none.
        specs.push((vec![], vec![]));
    }
    let count = specs.len() as i64;
    let slices: Vec<ResourceSlice> = specs
        .into_iter()
        .enumerate()
        .map(|(index, (counter_sets, devices))| ResourceSlice {
            metadata: ObjectMeta {
                name: Some(slice_name(options, index)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: options.driver_name.clone(),
                node_name: Some(options.node_name.clone()),
                pool: ResourcePool {
                    name: options.node_name.clone(),
                    generation: options.generation,
                    resource_slice_count: count,
                },
                devices: (!devices.is_empty() || counter_sets.is_empty()).then_some(devices),
                shared_counters: (!counter_sets.is_empty()).then_some(counter_sets),
                ..ResourceSliceSpec::default()
            },
        })
        .collect();
    validate::pool(&slices)?;
    Ok(slices)
}

/// `<node>-<driver>-<index>` with a zero-padded index (the scheduler orders slices by name),
/// shortened with a hash when the node name is very long.
pub fn slice_name(options: &SliceOptions, index: usize) -> String {
    let name = format!("{}-{}-{index:04}", options.node_name, options.driver_name);
    if name.len() <= validate::MAX_NAME_LENGTH {
        return name;
    }
    let digest = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes())
        .simple()
        .to_string();
    let keep = validate::MAX_NAME_LENGTH - 10;
    let mut prefix: String = name.chars().take(keep).collect();
    while prefix.ends_with(['.', '-']) {
        prefix.pop();
    }
    format!("{prefix}-{}", &digest[..8])
}

fn string(value: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.into()),
        ..DeviceAttribute::default()
    }
}

fn version(value: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(value.into()),
        ..DeviceAttribute::default()
    }
}

/// The standard NUMA node attribute (an int; a one-element list with `numa_node_list`).
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";

fn int(value: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(value),
        ..DeviceAttribute::default()
    }
}

fn counter(value: u64) -> Counter {
    Counter {
        value: Quantity(binary_si(value)),
    }
}

fn capacity(value: u64) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(binary_si(value)),
        ..DeviceCapacity::default()
    }
}

/// Attributes a MIG device inherits from its parent, plus the full GPU's own.
fn parent_attributes(inventory: &NodeInventory, gpu: &Gpu) -> BTreeMap<String, DeviceAttribute> {
    let mut attributes = BTreeMap::from([
        ("productName".to_string(), string(&gpu.product_name)),
        ("brand".to_string(), string(&gpu.brand)),
        (
            "architecture".to_string(),
            string(gpu.architecture.as_str()),
        ),
        (
            "cudaComputeCapability".to_string(),
            version(gpu.cuda_compute_capability.semver()),
        ),
        (
            "driverVersion".to_string(),
            version(semver_of(&inventory.driver_version)),
        ),
        (
            "cudaDriverVersion".to_string(),
            version(inventory.cuda_driver_version.semver()),
        ),
        (
            "resource.kubernetes.io/pciBusID".to_string(),
            string(&gpu.pci_bus_id),
        ),
    ]);
    if let Some(root) = &gpu.pcie_root {
        attributes.insert("resource.kubernetes.io/pcieRoot".to_string(), string(root));
    }
    if let Some(node) = gpu.numa_node {
        attributes.insert(NUMA_NODE.to_string(), int(node));
    }
    if let Some(mode) = gpu.addressing_mode {
        attributes.insert("addressingMode".to_string(), string(mode.as_str()));
    }
    attributes
}

fn full_gpu_device(inventory: &NodeInventory, gpu: &Gpu) -> Device {
    let mut attributes = parent_attributes(inventory, gpu);
    attributes.insert("type".into(), string("gpu"));
    attributes.insert("uuid".into(), string(&gpu.uuid));
    Device {
        name: gpu_device_name(gpu.minor),
        attributes: Some(attributes),
        capacity: gpu
            .memory_bytes
            .map(|bytes| BTreeMap::from([("memory".to_string(), capacity(bytes))])),
        ..Device::default()
    }
}

fn static_mig_device(
    inventory: &NodeInventory,
    gpu: &Gpu,
    instance: &MigInstance,
) -> Option<Device> {
    let profile = gpu.mig.as_ref()?.profile_by_id(instance.profile_id)?;
    let mut attributes = parent_attributes(inventory, gpu);
    attributes.insert("type".into(), string("mig"));
    attributes.insert("uuid".into(), string(&instance.uuid));
    attributes.insert("parentUUID".into(), string(&gpu.uuid));
    attributes.insert("profile".into(), string(&profile.name));
    let capacities = [
        ("multiprocessors", u64::from(profile.multiprocessors)),
        ("copyEngines", u64::from(profile.copy_engines)),
        ("decoders", u64::from(profile.decoders)),
        ("encoders", u64::from(profile.encoders)),
        ("jpegEngines", u64::from(profile.jpeg_engines)),
        ("ofaEngines", u64::from(profile.ofa_engines)),
        ("memory", profile.memory_bytes()),
    ];
    Some(Device {
        name: mig_device_name(
            gpu.minor,
            &profile.name,
            profile.id,
            instance.placement.start,
        ),
        attributes: Some(attributes),
        capacity: Some(
            capacities
                .into_iter()
                .map(|(k, v)| (k.to_string(), capacity(v)))
                // The memory slices it holds, one each, as NVIDIA's driver announces them.
                .chain(
                    (instance.placement.start..instance.placement.end())
                        .map(|i| (format!("memorySlice{i}"), capacity(1))),
                )
                .collect(),
        ),
        ..Device::default()
    })
}

/// A driver version as semver the way NVIDIA's driver normalises it (`535.104.05` → `535.104.5`);
/// numeric parts lose leading zeros, a missing patch becomes `0`.
pub fn semver_of(raw: &str) -> String {
    let mut parts: Vec<String> = raw
        .trim()
        .split('.')
        .map(|p| match p.parse::<u64>() {
            Ok(n) => n.to_string(),
            Err(_) => p.to_string(),
        })
        .collect();
    while parts.len() < 3 {
        parts.push("0".into());
    }
    parts.join(".")
}

/// A byte or count value as Kubernetes prints a `BinarySI` quantity: plain below 1024, else the
/// largest binary suffix that divides it exactly (`85520809984` → `81559Mi`).
pub fn binary_si(value: u64) -> String {
    if value < 1024 {
        return value.to_string();
    }
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut amount = value;
    let mut suffix = None;
    for s in SUFFIXES {
        if !amount.is_multiple_of(1024) {
            break;
        }
        amount /= 1024;
        suffix = Some(s);
    }
    match suffix {
        Some(s) => format!("{amount}{s}"),
        None => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::SimNode;
    use crate::gpu::{DiscoveryConfig, GpuSource, Placement};

    fn inventory(spec: &str) -> NodeInventory {
        let source: GpuSource = spec.parse().expect("spec");
        crate::gpu::discover(&DiscoveryConfig {
            sysfs_root: "/nonexistent".into(),
            ..DiscoveryConfig::new(source, "n1")
        })
        .expect("discover")
    }

    /// The capacities of a device published for several claims whose `memory` is not taken
    /// unless asked for (`unlimited` and N shares).
    fn shared_capacity(device: &Device) -> &BTreeMap<String, DeviceCapacity> {
        assert_eq!(
            device.allow_multiple_allocations,
            Some(true),
            "{}",
            device.name
        );
        let caps = device.capacity.as_ref().expect("capacity");
        let policy = caps["memory"].request_policy.as_ref().expect("policy");
        assert_eq!(
            policy.default.as_ref().map(|q| q.0.as_str()),
            Some("0"),
            "{}",
            device.name
        );
        caps
    }

    #[test]
    fn consumable_shares_publish_full_gpus_for_several_claims() {
        use consumable::ConsumableShares;
        let inv = inventory("sim:1xH100-SXM5-80GB");
        let publish = |consumable| {
            content(
                &inv,
                &SliceOptions {
                    consumable,
                    ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
                },
            )
            .devices
        };
        let off = publish(ConsumableShares::Off);
        assert!(off.iter().all(|d| d.allow_multiple_allocations.is_none()));

        let memory = publish(ConsumableShares::Memory);
        let gpu = &memory[0];
        assert_eq!(gpu.name, "gpu-0");
        assert_eq!(gpu.allow_multiple_allocations, Some(true));
        let cap = &gpu.capacity.as_ref().expect("capacity")["memory"];
        let policy = cap.request_policy.as_ref().expect("policy");
        assert_eq!(cap.value.0, "81559Mi");
        assert_eq!(
            policy.default.as_ref().map(|q| q.0.as_str()),
            Some("81559Mi")
        );
        let range = policy.valid_range.as_ref().expect("range");
        assert_eq!(
            (
                range.min.0.as_str(),
                range.step.as_ref().map(|q| q.0.as_str())
            ),
            ("1Mi", Some("1Mi"))
        );
        // Placements are shared by memory too (the first claim carves, the last destroys)...
        assert!(memory[1..].iter().all(|d| {
            d.allow_multiple_allocations == Some(true)
                && d.capacity
                    .as_ref()
                    .is_some_and(|c| !c.contains_key("shares"))
        }),);

        // N shares: every device (full GPU and MIG, as NVIDIA's driver does) gets `shares`, and
        // `memory` may be asked for but is not taken by default.
        for device in &publish(ConsumableShares::Shares(4)) {
            let caps = shared_capacity(device);
            assert_eq!(caps["shares"].value.0, "4");
        }
        // `unlimited`: memory by default none, no shares, so any number of claims fit.
        for device in &publish(ConsumableShares::Unlimited) {
            let caps = shared_capacity(device);
            assert!(!caps.contains_key("shares"), "{}", device.name);
            let range = caps["memory"]
                .request_policy
                .as_ref()
                .and_then(|p| p.valid_range.as_ref());
            assert_eq!(range.map(|r| r.min.0.as_str()), Some("0"));
        }
        // What the API server would say about them, before they leave.
        for consumable in [
            ConsumableShares::Memory,
            ConsumableShares::Shares(4),
            ConsumableShares::Unlimited,
        ] {
            let options = SliceOptions {
                consumable,
                ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
            };
            assert!(build(&inv, &options).is_ok(), "{consumable}");
        }
    }

    fn attr<'a>(device: &'a Device, name: &str) -> &'a DeviceAttribute {
        device
            .attributes
            .as_ref()
            .and_then(|a| a.get(name))
            .unwrap_or_else(|| panic!("{} lacks {name}", device.name))
    }

    #[test]
    fn quantities_print_like_kubernetes() {
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(132), "132");
        assert_eq!(binary_si(1024), "1Ki");
        assert_eq!(binary_si(81559 << 20), "81559Mi");
        assert_eq!(binary_si(80 << 30), "80Gi");
        assert_eq!(binary_si(1500), "1500");
    }

    #[test]
    fn driver_versions_become_semver() {
        assert_eq!(semver_of("580.95.05"), "580.95.5");
        assert_eq!(semver_of("550.54.15"), "550.54.15");
        assert_eq!(semver_of("560.28"), "560.28.0");
    }

    #[test]
    fn h100_node_has_eight_full_gpus_with_nvidia_attributes() {
        let options = SliceOptions {
            mig_policy: MigPolicy::Static,
            ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
        };
        let slices = build(&inventory("sim:8xH100-SXM5-80GB"), &options).expect("valid");
        assert_eq!(slices.len(), 1);
        let spec = &slices[0].spec;
        assert_eq!(spec.driver, "gpu.nvidia.com");
        assert_eq!(spec.pool.name, "n1");
        assert_eq!(spec.pool.resource_slice_count, 1);
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let devices = spec.devices.as_ref().expect("devices");
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
            ]
        );
        let d = &devices[0];
        assert_eq!(attr(d, "type").string.as_deref(), Some("gpu"));
        assert_eq!(
            attr(d, "productName").string.as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(attr(d, "architecture").string.as_deref(), Some("Hopper"));
        assert_eq!(attr(d, "brand").string.as_deref(), Some("Nvidia"));
        assert_eq!(
            attr(d, "cudaComputeCapability").version.as_deref(),
            Some("9.0.0")
        );
        assert_eq!(
            attr(d, "driverVersion").version.as_deref(),
            Some("580.95.5")
        );
        assert_eq!(
            attr(d, "cudaDriverVersion").version.as_deref(),
            Some("13.0.0")
        );
        assert_eq!(
            attr(d, "resource.kubernetes.io/pciBusID").string.as_deref(),
            Some("0000:18:00.0")
        );
        assert_eq!(
            attr(d, "resource.kubernetes.io/pcieRoot").string.as_deref(),
            Some("pci0000:15")
        );
        assert_eq!(attr(d, "resource.kubernetes.io/numaNode").int, Some(0));
        assert!(
            attr(d, "uuid")
                .string
                .as_deref()
                .is_some_and(|u| u.starts_with("GPU-"))
        );
        assert_eq!(
            d.capacity
                .as_ref()
                .and_then(|c| c.get("memory"))
                .map(|c| c.value.0.as_str()),
            Some("81559Mi")
        );
        assert_eq!(
            attr(&devices[7], "resource.kubernetes.io/numaNode").int,
            Some(1)
        );
        // No coherent CPU memory on this platform: NVML answers `None` (as a real H200 did),
        // published under go-nvlib's name.
        assert!(
            devices
                .iter()
                .all(|d| attr(d, "addressingMode").string.as_deref() == Some("None"))
        );
    }

    #[test]
    fn unified_memory_gpus_are_published_without_a_memory_capacity() {
        let spark = inventory("sim:1xGB10");
        let devices = content(&spark, &SliceOptions::new(DEFAULT_DRIVER_NAME, "spark")).devices;
        assert_eq!(devices.len(), 1);
        let gpu = &devices[0];
        assert_eq!(gpu.name, "gpu-0");
        assert_eq!(
            attr(gpu, "productName").string.as_deref(),
            Some("NVIDIA GB10")
        );
        assert_eq!(
            attr(gpu, "cudaComputeCapability").version.as_deref(),
            Some("12.1.0")
        );
        assert_eq!(attr(gpu, "addressingMode").string.as_deref(), Some("ATS"));
        assert_eq!(gpu.capacity, None);
        // Consumable shares divide memory; a GPU that reports none stays exclusive.
        for mode in [
            consumable::ConsumableShares::Memory,
            consumable::ConsumableShares::Shares(4),
        ] {
            let options = SliceOptions {
                consumable: mode,
                ..SliceOptions::new(DEFAULT_DRIVER_NAME, "spark")
            };
            let shared = content(&spark, &options).devices;
            assert_eq!(shared[0].allow_multiple_allocations, None, "{mode}");
            assert_eq!(shared[0].capacity, None, "{mode}");
        }
    }

    #[test]
    fn grace_attached_gpus_and_their_mig_devices_publish_their_addressing_mode() {
        let options = SliceOptions::new(DEFAULT_DRIVER_NAME, "n1");
        let slices = build(&inventory("sim:2xGB200-186GB"), &options).expect("valid");
        let devices: Vec<&Device> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        assert!(devices.iter().any(|d| d.name.contains("-mig-")));
        for d in devices {
            assert_eq!(
                attr(d, "addressingMode").string.as_deref(),
                Some("ATS"),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn mixed_fleet_and_static_mig_instances() {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = SimNode::new(
            "2xA100-SXM4-40GB,1xT4".parse().expect("spec"),
            "n1",
            Some(dir.path().join("s.json")),
        );
        node.set_mig_mode(1, true).expect("enable");
        node.reset_gpu(1).expect("reset");
        let gi = node
            .create_gpu_instance(1, 9, Placement { start: 4, size: 4 })
            .expect("3g");
        let (_, uuid) = node.create_compute_instance(1, gi).expect("ci");
        let gi = node
            .create_gpu_instance(1, 19, Placement { start: 0, size: 1 })
            .expect("1g");
        node.create_compute_instance(1, gi).expect("ci");
        let slices = build(
            &node.inventory().expect("inventory"),
            &SliceOptions::new("gpu.nvidia.com", "n1"),
        )
        .expect("valid");
        let devices = slices[0].spec.devices.as_ref().expect("devices");
        let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-0",
                "gpu-1-mig-1g5gb-19-0",
                "gpu-1-mig-3g20gb-9-4",
                "gpu-2"
            ]
        );
        let mig = &devices[2];
        assert_eq!(attr(mig, "type").string.as_deref(), Some("mig"));
        assert_eq!(attr(mig, "profile").string.as_deref(), Some("3g.20gb"));
        assert_eq!(attr(mig, "uuid").string.as_deref(), Some(uuid.as_str()));
        assert_eq!(
            attr(mig, "parentUUID").string,
            Some(crate::gpu::sim::gpu_uuid("n1", 1))
        );
        assert_eq!(
            attr(mig, "productName").string.as_deref(),
            Some("NVIDIA A100-SXM4-40GB")
        );
        let cap = |name: &str| {
            mig.capacity
                .as_ref()
                .and_then(|c| c.get(name))
                .map(|c| c.value.0.clone())
        };
        assert_eq!(cap("multiprocessors").as_deref(), Some("42"));
        assert_eq!(cap("copyEngines").as_deref(), Some("3"));
        assert_eq!(cap("decoders").as_deref(), Some("2"));
        assert_eq!(cap("memory").as_deref(), Some("19968Mi"));
        // 3g.20gb at 4 on an 8-slice A100 holds memory slices 4–7.
        let slices_held: Vec<&str> = mig
            .capacity
            .iter()
            .flat_map(|c| c.keys())
            .filter(|k| k.starts_with("memorySlice"))
            .map(String::as_str)
            .collect();
        assert_eq!(
            slices_held,
            [
                "memorySlice4",
                "memorySlice5",
                "memorySlice6",
                "memorySlice7"
            ]
        );
        assert_eq!(cap("memorySlice4").as_deref(), Some("1"));
        assert_eq!(
            attr(&devices[3], "productName").string.as_deref(),
            Some("Tesla T4")
        );
        assert_eq!(
            attr(&devices[3], "architecture").string.as_deref(),
            Some("Turing")
        );
    }

    #[test]
    fn large_fleets_split_into_counted_slices() {
        let slices = build(
            &inventory("sim:160xL4"),
            &SliceOptions::new("gpu.nvidia.com", "big"),
        )
        .expect("valid");
        assert_eq!(slices.len(), 2);
        let sizes: Vec<_> = slices
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .collect();
        assert_eq!(sizes, [128, 32]);
        for s in &slices {
            assert_eq!(s.spec.pool.resource_slice_count, 2);
            assert_eq!(s.spec.pool.name, "big");
        }
        assert_ne!(slices[0].metadata.name, slices[1].metadata.name);
        assert_eq!(
            slices[1].spec.devices.as_ref().expect("devices")[0].name,
            "gpu-128"
        );
    }

    #[test]
    fn long_node_names_give_valid_slice_names() {
        let node = "n".repeat(250);
        let name = slice_name(&SliceOptions::new("gpu.nvidia.com", &node), 3);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(
            name,
            slice_name(&SliceOptions::new("gpu.nvidia.com", &node), 4)
        );
    }

    fn consumed(device: &Device) -> BTreeMap<String, String> {
        device
            .consumes_counters
            .iter()
            .flatten()
            .flat_map(|c| {
                c.counters
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value.0.clone()))
            })
            .collect()
    }

    #[test]
    fn hopper_gpus_are_dynamic_by_default_with_counters_and_placements() {
        let slices = build(
            &inventory("sim:8xH100-SXM5-80GB"),
            &SliceOptions::new(DEFAULT_DRIVER_NAME, "n1"),
        )
        .expect("valid");
        // One counter slice, then 8 whole GPUs + 8 × 25 placements in slices of at most 64.
        let shapes: Vec<(usize, usize)> = slices
            .iter()
            .map(|s| {
                (
                    s.spec.shared_counters.as_ref().map_or(0, Vec::len),
                    s.spec.devices.as_ref().map_or(0, Vec::len),
                )
            })
            .collect();
        assert_eq!(shapes, [(8, 0), (0, 64), (0, 64), (0, 64), (0, 16)]);
        let names: Vec<_> = slices
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "name order is publication order");
        let set = &slices[0].spec.shared_counters.as_ref().expect("sets")[0];
        assert_eq!(set.name, "gpu-0-counter-set");
        let value = |k: &str| set.counters.get(k).map(|c| c.value.0.clone());
        assert_eq!(value("multiprocessors").as_deref(), Some("132"));
        assert_eq!(value("memory").as_deref(), Some("81152Mi"));
        assert_eq!(value("memory-slice-7").as_deref(), Some("1"));
        assert_eq!(set.counters.len(), 15);
        let devices: Vec<&Device> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .collect();
        assert_eq!(devices.len(), 208);
        assert_eq!(devices[0].name, "gpu-0");
        assert_eq!(
            consumed(devices[0]).len(),
            14,
            "the whole GPU consumes every non-zero counter"
        );
        let p = devices
            .iter()
            .find(|d| d.name == "gpu-3-mig-3g40gb-9-4")
            .expect("placement device");
        assert_eq!(attr(p, "type").string.as_deref(), Some("mig"));
        assert_eq!(attr(p, "profile").string.as_deref(), Some("3g.40gb"));
        assert!(
            p.attributes
                .as_ref()
                .is_some_and(|a| !a.contains_key("uuid")),
            "no UUID before it exists"
        );
        let c = consumed(p);
        assert_eq!(c.get("multiprocessors").map(String::as_str), Some("60"));
        assert_eq!(c.get("memory").map(String::as_str), Some("40448Mi"));
        let slices_used: Vec<_> = c
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .cloned()
            .collect();
        assert_eq!(
            slices_used,
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ]
        );
        assert_eq!(
            p.consumes_counters.as_ref().expect("consumes")[0].counter_set,
            "gpu-3-counter-set"
        );
    }

    #[test]
    fn modes_per_policy_and_architecture() {
        // Ampere with MIG off cannot be partitioned without a reset: whole GPU only.
        let a100 = inventory("sim:1xA100-SXM4-40GB");
        assert_eq!(devices(&a100).len(), 1);
        let off = SliceOptions {
            mig_policy: MigPolicy::Off,
            ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
        };
        let h100 = inventory("sim:1xH100-SXM5-80GB");
        assert_eq!(content(&h100, &off).devices.len(), 1);
        let name_order = SliceOptions {
            order: DeviceOrder::Name,
            ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
        };
        let names: Vec<String> = content(&h100, &name_order)
            .devices
            .into_iter()
            .map(|d| d.name)
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        // Packed order puts a 1g at the top slot before the bottom ones.
        let packed: Vec<String> = devices(&h100).into_iter().map(|d| d.name).collect();
        let pos = |n: &str| packed.iter().position(|d| d == n).expect(n);
        assert!(pos("gpu-0-mig-1g10gb-19-6") < pos("gpu-0-mig-1g10gb-19-0"));
    }

    #[test]
    fn ampere_in_mig_mode_is_dynamic_without_the_whole_gpu() {
        let node = SimNode::new("1xA100-SXM4-80GB".parse().expect("spec"), "n1", None);
        node.set_mig_mode(0, true).expect("mode");
        node.reset_gpu(0).expect("reset");
        let names: Vec<String> = devices(&node.inventory().expect("inv"))
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert!(!names.contains(&"gpu-0".to_string()));
        assert_eq!(names.len(), 25);
    }
}
