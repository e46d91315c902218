//! Dynamic MIG as partitionable devices (KEP-4815): per GPU a counter set
//! `gpu-<minor>-counter-set`, the whole GPU consuming all of it, and one device per (profile ×
//! placement) consuming its engines, memory and its own memory slices, so the scheduler can never
//! allocate overlapping placements or a whole GPU that is partly in use.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CounterSet, Device, DeviceCounterConsumption};

use super::{capacity, counter, parent_attributes, string};
use crate::gpu::mig::mig_device_name;
use crate::gpu::{GiProfile, Gpu, NodeInventory, Placement};

/// `gpu-<minor>-counter-set`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

/// `memory-slice-<i>`.
pub fn memory_slice_counter(index: u32) -> String {
    format!("memory-slice-{index}")
}

/// The engine dimensions a profile uses, as (capacity name, counter name, value).
fn dimensions(profile: &GiProfile) -> [(&'static str, &'static str, u64); 7] {
    [
        (
            "multiprocessors",
            "multiprocessors",
            u64::from(profile.multiprocessors),
        ),
        (
            "copyEngines",
            "copy-engines",
            u64::from(profile.copy_engines),
        ),
        ("decoders", "decoders", u64::from(profile.decoders)),
        ("encoders", "encoders", u64::from(profile.encoders)),
        (
            "jpegEngines",
            "jpeg-engines",
            u64::from(profile.jpeg_engines),
        ),
        ("ofaEngines", "ofa-engines", u64::from(profile.ofa_engines)),
        ("memory", "memory", profile.memory_bytes()),
    ]
}

/// Per engine dimension the largest amount any profile uses: what the whole GPU holds, as NVIDIA's
/// driver models it. (capacity name, counter name, value)
fn maxima(gpu: &Gpu) -> Vec<(&'static str, &'static str, u64)> {
    let mut maxima: Vec<(&'static str, &'static str, u64)> = vec![];
    for profile in gpu.mig.iter().flat_map(|m| m.profiles.iter()) {
        for (cap, name, value) in dimensions(profile) {
            match maxima.iter_mut().find(|(c, _, _)| *c == cap) {
                Some(entry) => entry.2 = entry.2.max(value),
                None => maxima.push((cap, name, value)),
            }
        }
    }
    maxima
}

/// The GPU's counters: the engine maxima plus one counter per memory slice.
fn gpu_counters(gpu: &Gpu) -> BTreeMap<String, u64> {
    let mut counters: BTreeMap<String, u64> = maxima(gpu)
        .into_iter()
        .map(|(_, name, value)| (name.to_string(), value))
        .collect();
    for i in 0..gpu.mig.as_ref().map_or(0, |m| m.memory_slices) {
        counters.insert(memory_slice_counter(i), 1);
    }
    counters
}

pub fn counter_set(gpu: &Gpu) -> CounterSet {
    CounterSet {
        name: counter_set_name(gpu.minor),
        counters: gpu_counters(gpu)
            .into_iter()
            .map(|(k, v)| (k, counter(v)))
            .collect(),
    }
}

fn consumption(gpu: &Gpu, counters: BTreeMap<String, u64>) -> Vec<DeviceCounterConsumption> {
    vec![DeviceCounterConsumption {
        counter_set: counter_set_name(gpu.minor),
        counters: counters
            .into_iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| (k, counter(v)))
            .collect(),
        ..Default::default()
    }]
}

/// The whole GPU of a dynamic GPU: it consumes every counter, and carries the per-dimension maxima
/// as capacities as NVIDIA's driver does.
pub fn whole_gpu(inventory: &NodeInventory, gpu: &Gpu) -> Device {
    let mut device = super::full_gpu_device(inventory, gpu);
    if let Some(capacities) = device.capacity.as_mut() {
        // The device's own memory stays the GPU's total.
        for (cap, _, value) in maxima(gpu)
            .into_iter()
            .filter(|(cap, _, _)| *cap != "memory")
        {
            capacities.insert(cap.to_string(), capacity(value));
        }
    }
    device.consumes_counters = Some(consumption(gpu, gpu_counters(gpu)));
    device
}

/// One placement of one profile, not yet carved.
pub fn placement_device(
    inventory: &NodeInventory,
    gpu: &Gpu,
    profile: &GiProfile,
    placement: Placement,
) -> Device {
    let mut attributes = parent_attributes(inventory, gpu);
    attributes.insert("type".into(), string("mig"));
    attributes.insert("profile".into(), string(&profile.name));
    attributes.insert("parentUUID".into(), string(&gpu.uuid));
    let mut counters: BTreeMap<String, u64> = dimensions(profile)
        .into_iter()
        .map(|(_, name, value)| (name.to_string(), value))
        .collect();
    for i in placement.slices() {
        counters.insert(memory_slice_counter(i), 1);
    }
    Device {
        name: mig_device_name(gpu.minor, &profile.name, profile.id, placement.start),
        attributes: Some(attributes),
        capacity: Some(
            dimensions(profile)
                .into_iter()
                .map(|(cap, _, value)| (cap.to_string(), capacity(value)))
                .collect(),
        ),
        consumes_counters: Some(consumption(gpu, counters)),
        ..Device::default()
    }
}

/// Every (profile, placement) of a GPU, in profile-table order.
pub fn placements(gpu: &Gpu) -> Vec<(&GiProfile, Placement)> {
    gpu.mig
        .iter()
        .flat_map(|mig| mig.profiles.iter())
        .flat_map(|profile| profile.placements.iter().map(move |p| (profile, *p)))
        .collect()
}
