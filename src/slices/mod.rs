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
#[cfg(test)]
mod tests;
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
