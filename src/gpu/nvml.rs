//! Discovery through NVML (nvml-wrapper; raw calls in `nvml_raw` where the wrapper stops).
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::NvmlError;

use super::mig::{self, GPU_INSTANCE_PROFILE_COUNT};
use super::model::*;
use super::nvml_raw::{self, RawError};
use super::sim::cuda_version;
use super::{GpuError, catalog};

/// An initialised NVML library.
pub struct NvmlBackend {
    nvml: Nvml,
    sysfs_root: PathBuf,
}

impl NvmlBackend {
    /// Loads `library` (default: `libnvidia-ml.so.1` through the dynamic linker) and initialises it.
    pub fn open(library: Option<&Path>, sysfs_root: PathBuf) -> Result<Self, GpuError> {
        let mut builder = Nvml::builder();
        if let Some(path) = library {
            builder.lib_path(path.as_os_str());
        } else {
            builder.lib_path(OsStr::new("libnvidia-ml.so.1"));
        }
        let nvml = builder.init().map_err(|e| nvml_err("initialise NVML", e))?;
        Ok(Self { nvml, sysfs_root })
    }

    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// Reads every full GPU, its MIG profiles and placements and the MIG devices that exist.
    pub fn inventory(&self) -> Result<NodeInventory, GpuError> {
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
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            gpus.push(self.gpu(index)?);
        }
        gpus.sort_by_key(|g| g.minor);
        Ok(NodeInventory {
            driver_version,
            cuda_driver_version: cuda_version(cuda),
            gpus,
        })
    }

    fn gpu(&self, index: u32) -> Result<Gpu, GpuError> {
        let at = |what: &str| format!("GPU {index}: {what}");
        let device = self
            .nvml
            .device_by_index(index)
            .map_err(|e| nvml_err(&at("handle"), e))?;
        let minor = device
            .minor_number()
            .map_err(|e| nvml_err(&at("minor number"), e))?;
        let memory_bytes = device
            .memory_info()
            .map_err(|e| nvml_err(&at("memory"), e))?
            .total;
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
        let mig = match device.mig_mode() {
            Ok(mode) => {
                // SAFETY: the handle belongs to `self.nvml`, which outlives this call.
                let handle = unsafe { device.handle() };
                Some(self.mig_info(index, handle, &device, mode, memory_bytes)?)
            }
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => None,
            Err(e) => return Err(nvml_err(&at("MIG mode"), e)),
        };
        Ok(Gpu {
            index,
            minor,
            uuid: device.uuid().map_err(|e| nvml_err(&at("UUID"), e))?,
            product_name: device.name().map_err(|e| nvml_err(&at("name"), e))?,
            brand: brand_name(device.brand().map_err(|e| nvml_err(&at("brand"), e))?).to_string(),
            architecture: architecture(
                device
                    .architecture()
                    .map_err(|e| nvml_err(&at("architecture"), e))?,
            ),
            cuda_compute_capability: Version2::new(cc.major.max(0) as u32, cc.minor.max(0) as u32),
            memory_bytes,
            pcie_root: pcie_root(&self.sysfs_root, &pci_bus_id),
            pci_bus_id,
            numa_node,
            mig,
        })
    }

    fn mig_info(
        &self,
        index: u32,
        handle: nvml_wrapper_sys::bindings::nvmlDevice_t,
        device: &nvml_wrapper::Device<'_>,
        mode: nvml_wrapper::structs::device::MigMode,
        memory_bytes: u64,
    ) -> Result<MigInfo, GpuError> {
        let at = |what: &str| format!("GPU {index}: {what}");
        let mut profiles = Vec::new();
        for profile_enum in 0..GPU_INSTANCE_PROFILE_COUNT {
            let info = match device.profile_info(profile_enum) {
                Ok(info) => info,
                // NVML's documented way of saying "this GPU has no such profile".
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
                Err(e) => {
                    return Err(nvml_err(
                        &at(&format!("GPU instance profile {profile_enum}")),
                        e,
                    ));
                }
            };
            let Some(name) = mig::profile_name(profile_enum, info.memory_size_mb, memory_bytes)
            else {
                continue;
            };
            // SAFETY: `handle` is a live full-GPU handle of `self.nvml`.
            let placements = unsafe { nvml_raw::possible_placements(&self.nvml, handle, info.id) }
                .map_err(|e| raw_err(&at("placements"), e))?;
            profiles.push(GiProfile {
                name,
                profile_enum,
                id: info.id,
                slice_count: info.slice_count,
                instance_count: info.instance_count,
                memory_mib: info.memory_size_mb,
                multiprocessors: info.multiprocessor_count,
                copy_engines: info.copy_engine_count,
                decoders: info.decoder_count,
                encoders: info.encoder_count,
                jpeg_engines: info.jpeg_count,
                ofa_engines: info.ofa_count,
                p2p_supported: info.is_p2p_supported,
                placements,
            });
        }
        let memory_slices = profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.end()))
            .max()
            .unwrap_or(0);
        let instances = if mode.current == 1 {
            self.mig_instances(index, handle, device)?
        } else {
            vec![]
        };
        Ok(MigInfo {
            mode: MigMode {
                current: mode.current == 1,
                pending: mode.pending == 1,
            },
            memory_slices,
            profiles,
            instances,
        })
    }

    /// Walks the MIG device handles; each is one (GI, CI) pair.
    fn mig_instances(
        &self,
        index: u32,
        handle: nvml_wrapper_sys::bindings::nvmlDevice_t,
        device: &nvml_wrapper::Device<'_>,
    ) -> Result<Vec<MigInstance>, GpuError> {
        let at = |what: &str| format!("GPU {index}: {what}");
        let max = device
            .mig_device_count()
            .map_err(|e| nvml_err(&at("max MIG devices"), e))?;
        let mut instances = Vec::new();
        for slot in 0..max {
            let mig_device = match device.mig_device_by_index(slot) {
                Ok(d) => d,
                // Empty slots answer NOT_FOUND (some drivers INVALID_ARGUMENT).
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(nvml_err(&at(&format!("MIG device {slot}")), e)),
            };
            // SAFETY: handles from `self.nvml`, alive for this call.
            let (gi, ci) = unsafe { nvml_raw::mig_instance_ids(&self.nvml, mig_device.handle()) }
                .map_err(|e| raw_err(&at("MIG instance ids"), e))?;
            let (profile_id, placement) =
                unsafe { nvml_raw::gpu_instance_info(&self.nvml, handle, gi) }
                    .map_err(|e| raw_err(&at(&format!("GPU instance {gi}")), e))?;
            instances.push(MigInstance {
                gpu_instance_id: gi,
                compute_instance_id: ci,
                profile_id,
                placement,
                uuid: mig_device
                    .uuid()
                    .map_err(|e| nvml_err(&at("MIG UUID"), e))?,
            });
        }
        instances.sort_by_key(|i| (i.gpu_instance_id, i.compute_instance_id));
        Ok(instances)
    }
}

fn nvml_err(operation: &str, e: NvmlError) -> GpuError {
    GpuError::Nvml {
        operation: operation.to_string(),
        reason: e.to_string(),
    }
}

fn raw_err(operation: &str, e: RawError) -> GpuError {
    let reason = match e.code {
        nvml_raw::MISSING_SYMBOL => format!("the NVML library lacks {}", e.function),
        code => format!("{} returned NVML error {code}", e.function),
    };
    GpuError::Nvml {
        operation: operation.to_string(),
        reason,
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

/// The `pci<domain>:<bus>` root complex of a PCI device, from its sysfs path
/// (`/sys/bus/pci/devices/<bdf>` → `../../../devices/pci0000:15/0000:15:01.0/<bdf>`).
pub fn pcie_root(sysfs_root: &Path, bus_id: &str) -> Option<String> {
    let link = sysfs_root.join("bus/pci/devices").join(bus_id);
    let target = std::fs::read_link(&link).ok()?;
    target
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| c.starts_with("pci") && c.contains(':'))
        .map(str::to_string)
}

fn brand_name(brand: Brand) -> &'static str {
    let code = match brand {
        Brand::Quadro => 1,
        Brand::Tesla => catalog::BRAND_TESLA,
        Brand::NVS => 3,
        Brand::GRID => 4,
        Brand::GeForce => 5,
        Brand::Titan => 6,
        Brand::Nvidia => catalog::BRAND_NVIDIA,
        _ => 0,
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

    #[test]
    fn pcie_root_comes_from_the_sysfs_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let devices = dir.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices).expect("mkdir");
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0",
            devices.join("0000:18:00.0"),
        )
        .expect("symlink");
        assert_eq!(
            pcie_root(dir.path(), "0000:18:00.0").as_deref(),
            Some("pci0000:15")
        );
        assert_eq!(pcie_root(dir.path(), "0000:99:00.0"), None);
    }
}

impl NvmlBackend {
    /// The handle of the GPU with `minor`.
    fn handle_of(
        &self,
        minor: u32,
        operation: &'static str,
    ) -> Result<nvml_wrapper_sys::bindings::nvmlDevice_t, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| nvml_err("handle", e))?;
            if device.minor_number().ok() == Some(minor) {
                // SAFETY: the handle stays valid while `self.nvml` lives.
                return Ok(unsafe { device.handle() });
            }
        }
        Err(GpuError::Mig {
            minor,
            operation,
            failure: super::MigFailure::NotFound,
            detail: "no such GPU".into(),
        })
    }

    fn profiles_of(&self, minor: u32) -> Result<Vec<GiProfile>, GpuError> {
        let inventory = self.inventory()?;
        Ok(inventory
            .gpus
            .into_iter()
            .find(|g| g.minor == minor)
            .and_then(|g| g.mig)
            .map(|m| m.profiles)
            .unwrap_or_default())
    }
}

/// An NVML MIG call's failure, in the terms the simulator uses.
fn mig_failure(minor: u32, operation: &'static str, e: RawError) -> GpuError {
    let failure = match e.code {
        2 => super::MigFailure::InvalidArgument,
        3 => super::MigFailure::NotSupported,
        6 => super::MigFailure::NotFound,
        19 => super::MigFailure::InUse,
        23 => super::MigFailure::InsufficientResources,
        _ => return raw_err(&format!("GPU {minor}: {operation}"), e),
    };
    GpuError::Mig {
        minor,
        operation,
        failure,
        detail: e.to_string(),
    }
}

impl super::GpuControl for NvmlBackend {
    fn inventory(&self) -> Result<NodeInventory, GpuError> {
        NvmlBackend::inventory(self)
    }

    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        const OP: &str = "set MIG mode";
        let handle = self.handle_of(minor, OP)?;
        // SAFETY: `handle` belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(handle, &self.nvml) };
        let status = device
            .set_mig_mode(enabled)
            .map_err(|e| nvml_err(&format!("GPU {minor}: {OP}"), e))?;
        if status != 0 {
            // The call returned, but the mode did not change (e.g. the GPU is in use).
            return Err(mig_failure(
                minor,
                OP,
                RawError {
                    function: "nvmlDeviceSetMigMode",
                    code: status,
                },
            ));
        }
        let mode = device
            .mig_mode()
            .map_err(|e| nvml_err(&format!("GPU {minor}: MIG mode"), e))?;
        Ok(MigMode {
            current: mode.current == 1,
            pending: mode.pending == 1,
        })
    }

    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        const OP: &str = "create GPU instance";
        let handle = self.handle_of(minor, OP)?;
        // SAFETY: `handle` belongs to `self.nvml`.
        unsafe { nvml_raw::create_gpu_instance(&self.nvml, handle, profile_id, placement) }
            .map_err(|e| mig_failure(minor, OP, e))
    }

    fn create_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
    ) -> Result<(u32, String), GpuError> {
        const OP: &str = "create compute instance";
        let profiles = self.profiles_of(minor)?;
        let slices = self
            .gpu_instances(minor)?
            .into_iter()
            .find(|gi| gi.id == gpu_instance_id)
            .and_then(|gi| profiles.iter().find(|p| p.id == gi.profile_id))
            .map(|p| p.slice_count)
            .ok_or_else(|| GpuError::Mig {
                minor,
                operation: OP,
                failure: super::MigFailure::NotFound,
                detail: format!("no GPU instance {gpu_instance_id}"),
            })?;
        let handle = self.handle_of(minor, OP)?;
        let profile_enum = super::sim::full_compute_profile(slices);
        // SAFETY: `handle` belongs to `self.nvml`.
        unsafe {
            nvml_raw::create_compute_instance(&self.nvml, handle, gpu_instance_id, profile_enum)
        }
        .map_err(|e| mig_failure(minor, OP, e))
    }

    fn destroy_compute_instance(&self, minor: u32, gi: u32, ci: u32) -> Result<(), GpuError> {
        const OP: &str = "destroy compute instance";
        let handle = self.handle_of(minor, OP)?;
        // SAFETY: `handle` belongs to `self.nvml`.
        unsafe { nvml_raw::destroy_compute_instance(&self.nvml, handle, gi, ci) }
            .map_err(|e| mig_failure(minor, OP, e))
    }

    fn destroy_gpu_instance(&self, minor: u32, gi: u32) -> Result<(), GpuError> {
        const OP: &str = "destroy GPU instance";
        let handle = self.handle_of(minor, OP)?;
        // SAFETY: `handle` belongs to `self.nvml`.
        unsafe { nvml_raw::destroy_gpu_instance(&self.nvml, handle, gi) }
            .map_err(|e| mig_failure(minor, OP, e))
    }

    fn gpu_instances(&self, minor: u32) -> Result<Vec<super::GpuInstanceInfo>, GpuError> {
        const OP: &str = "list GPU instances";
        let profiles: Vec<(u32, u32)> = self
            .profiles_of(minor)?
            .iter()
            .map(|p| (p.id, p.instance_count))
            .collect();
        let handle = self.handle_of(minor, OP)?;
        // SAFETY: `handle` belongs to `self.nvml`.
        match unsafe { nvml_raw::gpu_instances(&self.nvml, handle, &profiles) } {
            Ok(found) => Ok(found
                .into_iter()
                .map(
                    |(id, profile_id, placement, compute_instances)| super::GpuInstanceInfo {
                        id,
                        profile_id,
                        placement,
                        compute_instances,
                    },
                )
                .collect()),
            // MIG mode off: there are none.
            Err(RawError { code: 3, .. }) => Ok(vec![]),
            Err(e) => Err(mig_failure(minor, OP, e)),
        }
    }
}
