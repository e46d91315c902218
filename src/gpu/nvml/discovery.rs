//! Reading a GPU: the node's first read, naming a GPU and completing it, and NVML's brands,
//! architectures and bus IDs in the device model's terms.

use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;

use super::NvmlBackend;
use super::cache::{Cache, CachedGpu, Handle};
use super::errors::{nvml_err, raw_err, read_err};
use crate::gpu::model::*;
use crate::gpu::nvml_raw;
use crate::gpu::sim::cuda_version;
use crate::gpu::{GpuError, catalog};

impl NvmlBackend {
    /// Reads the whole node. A GPU that cannot be named is left out, one that cannot be read in
    /// full is kept as far as it was read: neither fails the node.
    pub(super) fn read_node(&self) -> Result<Cache, GpuError> {
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(|e| nvml_err("driver version", e))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(|e| nvml_err("CUDA driver version", e))?;
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        let mut cache = Cache {
            driver_version,
            cuda_driver_version: cuda_version(cuda),
            gpus: Vec::with_capacity(count as usize),
            unnamed: vec![],
            retry_unnamed: false,
        };
        for index in 0..count {
            match self.name_gpu(index) {
                Ok(gpu) => cache.gpus.push(self.first_read(gpu)),
                Err(e) => {
                    tracing::error!(
                        index,
                        error = %e,
                        "cannot name the GPU; left off the node until it answers"
                    );
                    cache.unnamed.push(index);
                }
            }
        }
        cache.gpus.sort_by_key(|g| g.minor);
        Ok(cache)
    }

    /// What NVML tells of a GPU without asking the GPU itself (real drivers answer these from what
    /// they cached, even for a GPU that fell off the bus): a `partial`, stale entry that a refresh
    /// completes.
    pub(super) fn name_gpu(&self, index: u32) -> Result<CachedGpu, GpuError> {
        let at = |what: &str| format!("GPU {index}: {what}");
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|e| nvml_err(&at("handle"), e))?;
        // SAFETY: the handle belongs to `self.nvml`, which outlives the cache holding it.
        let handle = Handle(unsafe { device.handle() });
        let minor = device
            .minor_number()
            .map_err(|e| nvml_err(&at("minor number"), e))?;
        let pci = device
            .pci_info()
            .map_err(|e| nvml_err(&at("PCI info"), e))?;
        let pci_bus_id = normalize_bus_id(&pci.bus_id);
        let cc = device
            .cuda_compute_capability()
            .map_err(|e| nvml_err(&at("compute capability"), e))?;
        let numa_node = match device.numa_node_id() {
            Ok(node) => Some(i64::from(node)),
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => None,
            Err(e) => return Err(nvml_err(&at("NUMA node"), e)),
        };
        // SAFETY: the handle belongs to `self.nvml`.
        let addressing_mode = unsafe { nvml_raw::addressing_mode(&self.nvml, handle.0) }
            .map_err(|e| raw_err(&at("addressing mode"), e))?;
        Ok(CachedGpu {
            handle,
            gpu: Gpu {
                index,
                minor,
                uuid: device.uuid().map_err(|e| nvml_err(&at("UUID"), e))?,
                product_name: device.name().map_err(|e| nvml_err(&at("name"), e))?,
                brand: brand_name(device.brand().map_err(|e| nvml_err(&at("brand"), e))?)
                    .to_string(),
                architecture: architecture(
                    device
                        .architecture()
                        .map_err(|e| nvml_err(&at("architecture"), e))?,
                ),
                cuda_compute_capability: Version2::new(
                    cc.major.max(0) as u32,
                    cc.minor.max(0) as u32,
                ),
                memory_bytes: None,
                pcie_root: super::pci::pcie_root(&self.sysfs_root, &pci_bus_id),
                pci_bus_id,
                numa_node,
                addressing_mode,
                mig: None,
            },
            profiles: [None, None],
            partial: true,
            failure: None,
        })
    }

    /// Reads what naming left out of a `partial` GPU: its memory and MIG state.
    pub(super) fn complete(&self, gpu: &mut CachedGpu) -> Result<(), GpuError> {
        let minor = gpu.gpu.minor;
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
        let memory_bytes = match device.memory_info() {
            Ok(memory) => Some(memory.total),
            // Unified memory (GB10): there is no framebuffer to report.
            Err(NvmlError::NotSupported) => None,
            Err(e) => return Err(read_err(minor, "read memory", e)),
        };
        // MIG profile names derive from the memory size; restored if the MIG read fails, so the
        // view stays the last complete one.
        let unknown = std::mem::replace(&mut gpu.gpu.memory_bytes, memory_bytes);
        let mig = match device.mig_mode() {
            Ok(mode) => self.read_mig(gpu, mode).map(Some),
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => Ok(None),
            Err(e) => Err(read_err(minor, "read MIG mode", e)),
        };
        match mig {
            Ok(mig) => {
                gpu.gpu.mig = mig;
                gpu.partial = false;
                Ok(())
            }
            Err(e) => {
                gpu.gpu.memory_bytes = unknown;
                Err(e)
            }
        }
    }
}

/// `00000000:18:00.0` → `0000:18:00.0`, lower case (go-nvlib `GetPCIBusID`).
pub fn normalize_bus_id(raw: &str) -> String {
    let id = raw.trim_end_matches('\0').to_ascii_lowercase();
    match id.strip_prefix("0000") {
        Some(rest) if rest.len() >= 4 && rest.as_bytes().get(4) == Some(&b':') => rest.to_string(),
        _ => id,
    }
}

fn brand_name(brand: Brand) -> &'static str {
    let code = match brand {
        Brand::Quadro => 1,
        Brand::Tesla => catalog::BRAND_TESLA,
        Brand::NVS => 3,
        Brand::GRID => 4,
        Brand::GeForce => 5,
        Brand::Titan => 6,
        Brand::VApps => 7,
        Brand::VPC => 8,
        Brand::VCS => 9,
        Brand::VWS => 10,
        Brand::CloudGaming | Brand::VGaming => 11,
        Brand::QuadroRTX => 12,
        Brand::NvidiaRTX => catalog::BRAND_NVIDIA_RTX,
        Brand::Nvidia => catalog::BRAND_NVIDIA,
        Brand::GeForceRTX => 15,
        Brand::TitanRTX => 16,
        Brand::Unknown => 0,
    };
    catalog::brand_name(code)
}

fn architecture(arch: DeviceArchitecture) -> Architecture {
    match arch {
        DeviceArchitecture::Kepler => Architecture::Kepler,
        DeviceArchitecture::Maxwell => Architecture::Maxwell,
        DeviceArchitecture::Pascal => Architecture::Pascal,
        DeviceArchitecture::Volta => Architecture::Volta,
        DeviceArchitecture::Turing => Architecture::Turing,
        DeviceArchitecture::Ampere => Architecture::Ampere,
        DeviceArchitecture::Ada => Architecture::Ada,
        DeviceArchitecture::Hopper => Architecture::Hopper,
        DeviceArchitecture::Blackwell => Architecture::Blackwell,
        DeviceArchitecture::Unknown => Architecture::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalised_like_go_nvlib() {
        assert_eq!(normalize_bus_id("00000000:18:00.0"), "0000:18:00.0");
        assert_eq!(normalize_bus_id("00000001:2A:00.0\0\0"), "0001:2a:00.0");
        assert_eq!(normalize_bus_id("0000:18:00.0"), "0000:18:00.0");
    }
}
