//! GPUs for virtual machines (`--passthrough`): each eligible GPU is also published as
//! `gpu-vfio-<index>` with NVIDIA's attributes (`type: vfio`), for class `vfio.gpu.nvidia.com`.
//!
//! NVIDIA's driver publishes both and deletes the sibling after a prepare, so the scheduler can
//! still hand out both before it does. Here they exclude each other through a counter set per
//! PCI function, `pci-<index>-counter-set`, holding [`HOLDERS`]: the VFIO device consumes all of
//! it, the GPU's whole device and each of its MIG placements one. Anything allocated on the GPU
//! keeps the VFIO device out, and the VFIO device keeps everything else out.
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CounterSet, Device, DeviceCounterConsumption};

use super::{capacity, counter, int, string};
use crate::gpu::mig::GpuMode;
use crate::gpu::pci::PciGpu;
use crate::gpu::{Gpu, NodeInventory, catalog};

/// The counter's size: more than any number of allocations one GPU can hold at once.
pub const HOLDERS: u64 = 1024;
const COUNTER: &str = "holders";

/// `gpu-vfio-<index>`, NVIDIA's name.
pub fn vfio_device_name(index: u32) -> String {
    format!("gpu-vfio-{index}")
}

/// The index of a `gpu-vfio-<index>` name.
pub fn parse_vfio_device_name(name: &str) -> Option<u32> {
    let index = name.strip_prefix("gpu-vfio-")?;
    // No sign, no leading zeros: the name round-trips.
    (index == "0" || !index.starts_with(['0', '+'])).then_some(())?;
    index.parse().ok()
}

/// `pci-<index>-counter-set`.
pub fn counter_set_name(index: u32) -> String {
    format!("pci-{index}-counter-set")
}

/// The GPU's PCI function, and why it is not offered to virtual machines if it is not.
pub fn eligibility<'a>(
    inventory: &'a NodeInventory,
    modes: &BTreeMap<u32, GpuMode>,
) -> Vec<(&'a PciGpu, Result<(), String>)> {
    inventory
        .pci
        .gpus
        .iter()
        .map(|function| {
            let verdict = if !inventory.pci.iommu {
                Err("the node has no IOMMU groups (IOMMU off in firmware or kernel)".to_string())
            } else if let Some(reason) = function.group_blocker() {
                Err(reason)
            } else if let Some(product) = grace_attached(inventory, function)
                && function.vfio_driver == crate::gpu::pci::VFIO_PCI
            {
                Err(format!(
                    "{product} is Grace-attached: a virtual machine needs Linux's nvgrace_gpu_vfio_pci variant driver (6.11+), and the kernel's module aliases name none for it (is /lib/modules/<release>/modules.alias there?)"
                ))
            } else {
                let vfio = function.vfio_driver.as_str();
                match function.driver.as_deref() {
                    Some(driver) if driver == vfio => Ok(()),
                    _ if !function.vfio_driver_loaded => Err(format!(
                        "its VFIO driver {vfio} is not loaded (modprobe {})",
                        vfio.replace('-', "_")
                    )),
                    Some("nvidia") => match nvml_gpu(inventory, function) {
                        Some(gpu) => offered_whole(gpu, modes),
                        None => Err("bound to nvidia but NVML does not see it".into()),
                    },
                    Some(other) => Err(format!("bound to {other}, neither nvidia nor {vfio}")),
                    None => Err("bound to no driver".into()),
                }
            };
            (function, verdict)
        })
        .collect()
}

/// Whether a GPU NVML sees can leave for a virtual machine: only one this driver offers whole
/// (MIG instances someone else made stay where they are).
fn offered_whole(gpu: &Gpu, modes: &BTreeMap<u32, GpuMode>) -> Result<(), String> {
    let mig = gpu.mig.as_ref();
    match modes.get(&gpu.minor).copied().unwrap_or(GpuMode::Whole) {
        GpuMode::Dynamic => Ok(()),
        // Static MIG publishes a GPU in MIG mode off whole, as `Whole` does.
        GpuMode::Whole | GpuMode::Static if !mig.is_some_and(|m| m.mode.current) => Ok(()),
        GpuMode::Whole => Err("it is in MIG mode".into()),
        GpuMode::Static => Err("its MIG devices are offered (static MIG)".into()),
        GpuMode::Unusable => Err("it is not offered at all (MIG mode with MIG devices off)".into()),
    }
}

/// The product, if the GPU is tied to a Grace CPU (GH200, GB200, GB300): what NVML calls it,
/// else the PCI device ID.
fn grace_attached(inventory: &NodeInventory, function: &PciGpu) -> Option<String> {
    if let Some(gpu) = nvml_gpu(inventory, function) {
        let name = &gpu.product_name;
        return ["GH200", "GB200", "GB300"]
            .iter()
            .any(|grace| name.contains(grace))
            .then(|| name.clone());
    }
    // A function NVML no longer sees (bound to VFIO): by its PCI device id.
    crate::gpu::pci::NVGRACE_DEVICE_IDS
        .contains(&function.device_id)
        .then(|| format!("PCI device {:#06x}", function.device_id))
}

fn nvml_gpu<'a>(inventory: &'a NodeInventory, function: &PciGpu) -> Option<&'a Gpu> {
    inventory
        .gpus
        .iter()
        .find(|g| g.pci_bus_id == function.bus_id)
}

/// The counter set of an eligible function.
pub fn counter_set(function: &PciGpu) -> CounterSet {
    CounterSet {
        name: counter_set_name(function.index),
        counters: BTreeMap::from([(COUNTER.to_string(), counter(HOLDERS))]),
    }
}

fn consumption(function: &PciGpu, amount: u64) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: counter_set_name(function.index),
        counters: BTreeMap::from([(COUNTER.to_string(), counter(amount))]),
        ..Default::default()
    }
}

/// What one of the GPU's own devices (whole or MIG) takes of the function's counter set.
pub fn sibling_consumption(function: &PciGpu) -> DeviceCounterConsumption {
    consumption(function, 1)
}

/// The product name of a PCI device id: the catalog's name for products it knows, else NVML's
/// while NVML sees the GPU, else the id itself (stable across bindings only for known products).
fn product_name(inventory: &NodeInventory, function: &PciGpu) -> String {
    catalog::MODELS
        .iter()
        .find(|m| (m.pci_device_id >> 16) as u16 == function.device_id)
        .map(|m| m.product_name.to_string())
        .or_else(|| nvml_gpu(inventory, function).map(|g| g.product_name.clone()))
        .unwrap_or_else(|| format!("NVIDIA device 0x{:04x}", function.device_id))
}

/// The VFIO device of an eligible function, with NVIDIA's attributes.
pub fn vfio_device(inventory: &NodeInventory, function: &PciGpu) -> Device {
    let uuid = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_DNS, function.bus_id.as_bytes());
    let mut attributes = BTreeMap::from([
        ("type".to_string(), string("vfio")),
        ("uuid".to_string(), string(uuid.to_string())),
        (
            "deviceID".to_string(),
            string(format!("0x{:04x}", function.device_id)),
        ),
        (
            "vendorID".to_string(),
            string(format!("0x{:04x}", function.vendor_id)),
        ),
        (
            "productName".to_string(),
            string(product_name(inventory, function)),
        ),
        (
            "iommuFDEnabled".to_string(),
            k8s_openapi::api::resource::v1::DeviceAttribute {
                bool: Some(inventory.pci.iommufd),
                ..Default::default()
            },
        ),
        (
            "resource.kubernetes.io/pciBusID".to_string(),
            string(&function.bus_id),
        ),
    ]);
    if let Some(root) = &function.pcie_root {
        attributes.insert("resource.kubernetes.io/pcieRoot".into(), string(root));
    }
    if let Some(node) = function.numa_node {
        attributes.insert(super::NUMA_NODE.into(), int(node));
    }
    Device {
        name: vfio_device_name(function.index),
        attributes: Some(attributes),
        capacity: Some(BTreeMap::from([(
            "addressableMemory".to_string(),
            capacity(function.addressable_memory),
        )])),
        consumes_counters: Some(vec![consumption(function, HOLDERS)]),
        ..Device::default()
    }
}

/// Says which GPUs are offered to virtual machines and why the others are not (the node agent at
/// start, `gpu-dra slices --passthrough`).
pub fn log_offer(inventory: &NodeInventory, modes: &BTreeMap<u32, GpuMode>) {
    if inventory.pci.gpus.is_empty() {
        tracing::warn!(
            "--passthrough: no NVIDIA GPU in sysfs (bus/pci/devices); none is offered to virtual machines"
        );
    }
    for (function, verdict) in eligibility(inventory, modes) {
        let device = vfio_device_name(function.index);
        match verdict {
            Ok(()) => tracing::info!(
                %device,
                pciBusID = %function.bus_id,
                iommuGroup = function.iommu_group.unwrap_or_default(),
                driver = function.driver.as_deref().unwrap_or(""),
                "GPU offered to virtual machines"
            ),
            Err(reason) => tracing::warn!(
                %device,
                pciBusID = %function.bus_id,
                %reason,
                "GPU not offered to virtual machines"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdicts(inventory: &NodeInventory) -> Vec<Result<(), String>> {
        eligibility(inventory, &BTreeMap::new())
            .into_iter()
            .map(|(_, verdict)| verdict)
            .collect()
    }

    #[test]
    fn grace_attached_gpus_go_to_virtual_machines_through_the_nvgrace_variant() {
        use crate::gpu::{DiscoveryConfig, GpuSource};
        let source: GpuSource = "sim:1xH100-SXM5-80GB,1xGB200-186GB".parse().expect("spec");
        let mut inventory = crate::gpu::discover(&DiscoveryConfig {
            sysfs_root: "/nonexistent".into(),
            ..DiscoveryConfig::new(source, "n1")
        })
        .expect("discover");
        let drivers: Vec<&str> = inventory
            .pci
            .gpus
            .iter()
            .map(|f| f.vfio_driver.as_str())
            .collect();
        assert_eq!(drivers, ["vfio-pci", "nvgrace_gpu_vfio_pci"]);
        assert_eq!(verdicts(&inventory), [Ok(()), Ok(())]);
        // Bound to its variant already (a claim holds it): still offered.
        inventory.pci.gpus[1].driver = Some("nvgrace_gpu_vfio_pci".into());
        assert_eq!(verdicts(&inventory)[1], Ok(()));
        // Bound to plain vfio-pci by someone else: not ours to hand out.
        inventory.pci.gpus[1].driver = Some("vfio-pci".into());
        let refused = verdicts(&inventory)[1].clone().expect_err("plain vfio-pci");
        assert!(
            refused.contains("neither nvidia nor nvgrace_gpu_vfio_pci"),
            "{refused}"
        );
        // The variant not loaded: refused, naming the module to load.
        inventory.pci.gpus[1].driver = Some("nvidia".into());
        inventory.pci.gpus[1].vfio_driver_loaded = false;
        let refused = verdicts(&inventory)[1].clone().expect_err("not loaded");
        assert!(
            refused.contains("modprobe nvgrace_gpu_vfio_pci"),
            "{refused}"
        );
        // No module aliases to name a variant: a Grace-attached GPU is not handed out through
        // plain vfio-pci (its memory is not a BAR; the virtual machine would not get it).
        inventory.pci.gpus[1].vfio_driver_loaded = true;
        inventory.pci.gpus[1].vfio_driver = "vfio-pci".into();
        let refused = verdicts(&inventory)[1].clone().expect_err("no variant");
        assert!(
            refused.contains("NVIDIA GB200") && refused.contains("nvgrace_gpu_vfio_pci"),
            "{refused}"
        );
        // vfio-pci itself not loaded, for any GPU.
        inventory.pci.gpus[0].vfio_driver_loaded = false;
        let refused = verdicts(&inventory)[0]
            .clone()
            .expect_err("vfio-pci not loaded");
        assert!(refused.contains("modprobe vfio_pci"), "{refused}");
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(vfio_device_name(3), "gpu-vfio-3");
        assert_eq!(parse_vfio_device_name("gpu-vfio-3"), Some(3));
        assert_eq!(parse_vfio_device_name("gpu-vfio-0"), Some(0));
        assert_eq!(parse_vfio_device_name("gpu-vfio-03"), None);
        assert_eq!(parse_vfio_device_name("gpu-vfio-+3"), None);
        assert_eq!(parse_vfio_device_name("gpu-3"), None);
    }
}
