//! Discovery through NVML (nvml-wrapper; raw calls in `nvml_raw` where the wrapper stops).
//!
//! Here: [`NvmlBackend`], its opening and its [`GpuControl`](super::GpuControl) implementation,
//! which ties the parts together: `library` (the loaded library and the NVML session's
//! references), `cache` (handles and cached GPU views, inventories), `discovery` (naming and
//! reading a GPU), `mig_state` (MIG profiles and instances as read), `event_set` (fault and MIG
//! events, the health probe) and `errors` (NVML failures as [`GpuError`]).

mod cache;
mod discovery;
mod errors;
mod event_set;
mod library;
mod mig_state;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::error::NvmlError;

use super::GpuError;
use super::events::{GpuEventSource, GpuProbe};
use super::memory_limit::MemoryLimit;
use super::model::*;
use super::nvml_raw::{self, RawError};
use super::session::SessionGate;
// What the parts name as `super::...`, as they did when they were one file.
use super::{MigFailure, pci};

use cache::{Cache, GpuHandles};
pub use discovery::normalize_bus_id;
use errors::{mig_failure, nvml_err, read_err, sharing_err};
pub(crate) use library::{NvmlLibrary, NvmlOpen};

/// An initialised NVML library, and what it said about the GPUs.
pub struct NvmlBackend {
    /// The loaded library; shared with event sources, which outlive the call that registers them.
    nvml: Arc<NvmlLibrary>,
    /// This process's NVML session (see [`super::session`]): every call holds a lease on it, and
    /// it is closed while a GPU leaves `nvidia`.
    session: Arc<SessionGate<NvmlOpen>>,
    /// The session whose handles `cache` and `handles` hold; another one means they are read
    /// again (NVML enumerates at init: a GPU given back to `nvidia` is in the new session only).
    cached_session: Mutex<u64>,
    /// Where processes' open files are listed (`/proc`; the host's, the chart runs the driver in
    /// the host's PID namespace).
    proc_root: PathBuf,
    sysfs_root: PathBuf,
    /// Whether inventories read the GPUs' PCI functions (only `--passthrough` needs them).
    scan_pci: bool,
    /// The kernel's modules, for VFIO variant drivers (`<root>/<release>/modules.alias`).
    modules_root: PathBuf,
    /// Their VFIO aliases, read once when first needed (the running kernel's do not change).
    vfio_aliases: std::sync::OnceLock<crate::gpu::pci::VfioAliases>,
    /// The node as last read; `None` until first needed (or after a panic while it was held).
    /// Guards only the list of GPUs and the node-wide facts: each GPU has its own lock (see
    /// [`GpuSlot`](cache::GpuSlot)), and this one is never held across NVML calls on a GPU (but
    /// for the first read of the whole node), so a slow or sick GPU holds up no operation on
    /// another.
    cache: Mutex<Option<Cache>>,
    /// Every GPU's handle by minor, for probes and events: read apart from `cache` so that a
    /// probe never waits for a MIG operation that holds it. Kept once complete.
    handles: Mutex<Option<Arc<GpuHandles>>>,
    /// The driver's `nvidia-smi`: NVML cannot set the time-slice interval.
    nvidia_smi: Option<super::driver_tools::NvidiaSmi>,
    /// NVML 13.4's per-cgroup memory limit calls, or why the driver's NVML lacks them.
    memory_limits: Result<nvml_raw::MemoryLimitCalls, String>,
}

impl NvmlBackend {
    /// Loads `library` (default: `libnvidia-ml.so.1` through the dynamic linker) and initialises it.
    pub fn open(library: Option<&Path>, sysfs_root: PathBuf) -> Result<Self, GpuError> {
        let mut builder = Nvml::builder();
        let path = library.map_or(OsStr::new("libnvidia-ml.so.1"), Path::as_os_str);
        builder.lib_path(path);
        // A node whose GPUs are all bound to vfio-pci (virtual machines) has none NVML sees:
        // without this flag init fails, the driver crash-loops and the VMs' claims can never be
        // unprepared (NVIDIA's driver passes it too).
        builder.flags(nvml_wrapper::bitmasks::InitFlags::NO_GPUS);
        let nvml = Arc::new(NvmlLibrary(std::mem::ManuallyDrop::new(
            builder.init().map_err(|e| nvml_err("initialise NVML", e))?,
        )));
        Ok(Self {
            session: Arc::new(SessionGate::opened(NvmlOpen::adopt(&nvml))),
            cached_session: Mutex::new(1),
            proc_root: PathBuf::from("/proc"),
            nvml,
            sysfs_root,
            scan_pci: false,
            modules_root: PathBuf::from(super::pci::MODULES_ROOT),
            vfio_aliases: std::sync::OnceLock::new(),
            cache: Mutex::new(None),
            handles: Mutex::new(None),
            nvidia_smi: None,
            memory_limits: nvml_raw::MemoryLimitCalls::load(path),
        })
    }

    /// One of NVML 13.4's memory limit calls on a full GPU, for the cgroup at `cgroup`.
    fn memory_limit_call<T>(
        &self,
        minor: u32,
        cgroup: &Path,
        call: impl FnOnce(
            &nvml_raw::MemoryLimitCalls,
            nvml_wrapper_sys::bindings::nvmlDevice_t,
            &std::ffi::CStr,
        ) -> Result<T, nvml_raw::RawError>,
    ) -> Result<T, GpuError> {
        use super::memory_limit::MemoryLimitFailure as Failure;
        let fail = |failure| GpuError::MemoryLimit {
            minor,
            cgroup: cgroup.to_path_buf(),
            failure,
        };
        let calls = self
            .memory_limits
            .as_ref()
            .map_err(|_| fail(Failure::NotSupported))?;
        let path = std::ffi::CString::new(cgroup.as_os_str().as_encoded_bytes())
            .map_err(|_| fail(Failure::InvalidArgument))?;
        self.with_gpu(minor, "memory limits", |_, gpu| {
            call(calls, gpu.handle.0, &path).map_err(|e| {
                fail(match e.code {
                    2 => Failure::InvalidArgument,
                    15 => Failure::Lost,
                    17 => Failure::OperatingSystem,
                    _ => Failure::NotSupported,
                })
            })
        })
    }

    /// Inventories also read the GPUs' PCI functions from sysfs (for `--passthrough`).
    pub fn with_pci_scan(mut self, scan_pci: bool) -> Self {
        self.scan_pci = scan_pci;
        self
    }

    /// Where the kernel's modules are (default `/lib/modules`), for VFIO variant drivers.
    pub fn with_modules_root(mut self, modules_root: PathBuf) -> Self {
        self.modules_root = modules_root;
        self
    }

    /// The driver's `nvidia-smi` (in the driver root), for time-slicing.
    pub fn with_nvidia_smi(mut self, smi: Option<super::driver_tools::NvidiaSmi>) -> Self {
        self.nvidia_smi = smi;
        self
    }

    /// `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>`, as NVIDIA's driver does.
    fn set_timeslice(&self, minor: u32, uuid: &str, timeslice: u32) -> Result<(), GpuError> {
        const OP: &str = "set the time-slice interval";
        let fail = |reason: String| GpuError::Sharing {
            minor,
            operation: OP,
            reason,
        };
        let smi = self.nvidia_smi.as_ref().ok_or_else(|| {
            fail("no nvidia-smi under the driver root (--nvidia-driver-root), and NVML has no call for it".into())
        })?;
        smi.set_timeslice(uuid, timeslice).map_err(fail)
    }

    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// Where processes' open files are read (default `/proc`), for the GPUs' holders.
    pub fn with_proc_root(mut self, proc_root: PathBuf) -> Self {
        self.proc_root = proc_root;
        self
    }
}

impl super::GpuControl for NvmlBackend {
    fn inventory(&self) -> Result<NodeInventory, GpuError> {
        NvmlBackend::inventory(self)
    }

    fn inventory_of(&self, minors: &BTreeSet<u32>) -> Result<NodeInventory, GpuError> {
        NvmlBackend::inventory_of(self, minors)
    }

    fn probe(&self, minor: u32) -> Result<GpuProbe, GpuError> {
        NvmlBackend::probe(self, minor)
    }

    fn fabric(&self, minor: u32) -> Result<Option<super::model::FabricInfo>, GpuError> {
        let _session = self.lease()?;
        let handles = self.gpu_handles()?;
        let handle = handles.handle(minor).ok_or_else(|| GpuError::Nvml {
            operation: format!("GPU {minor}: fabric info"),
            reason: "no GPU with this minor number".into(),
        })?;
        // SAFETY: the handle belongs to `self.nvml`.
        unsafe { super::nvml_raw::fabric_info(&self.nvml, handle.0) }.map_err(|e| GpuError::Nvml {
            operation: format!("GPU {minor}: fabric info"),
            reason: e.to_string(),
        })
    }

    fn bind_pci(&self, bus_id: &str, driver: super::sim::PciDriver) -> Result<(), GpuError> {
        let name = match driver {
            super::sim::PciDriver::Nvidia => "nvidia".to_string(),
            // The function's own VFIO driver: a variant where the kernel names one.
            super::sim::PciDriver::VfioPci => {
                super::pci::function_vfio_driver(&self.sysfs_root, self.vfio_aliases(), bus_id).0
            }
        };
        let result = super::pci::bind(&self.sysfs_root, bus_id, &name);
        // The GPU left NVML or came back: every cached view of it is stale.
        self.invalidate_all();
        Ok(result?)
    }

    fn close_session(&self, within: Duration) -> Result<super::SessionClosed<'_>, GpuError> {
        let closed = self.session.close(within).map_err(|busy| GpuError::Nvml {
            operation: "close the NVML session".into(),
            reason: format!(
                "{} of this driver's own NVML calls did not end within {}s",
                busy.leases,
                busy.waited.as_secs()
            ),
        })?;
        Ok(super::SessionClosed::holding(closed))
    }

    fn open_holders(&self, minor: u32) -> Result<Vec<super::holders::GpuHolder>, GpuError> {
        super::holders::scan(&self.proc_root, minor).map_err(|e| GpuError::Nvml {
            operation: format!("GPU {minor}: list the processes that hold it open"),
            reason: format!("{}: {e}", self.proc_root.display()),
        })
    }

    fn persistence_mode(&self, minor: u32) -> Result<bool, GpuError> {
        const OP: &str = "read persistence mode";
        self.with_gpu(minor, OP, |_, gpu| {
            // SAFETY: the handle belongs to the session `with_gpu` holds.
            let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            match device.is_in_persistent_mode() {
                Ok(on) => Ok(on),
                // Windows and some platforms have none: nothing holds the GPU for it.
                Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => Ok(false),
                Err(e) => Err(nvml_err(&format!("GPU {minor}: {OP}"), e)),
            }
        })
    }

    fn set_persistence_mode(&self, minor: u32, enabled: bool) -> Result<(), GpuError> {
        const OP: &str = "set persistence mode";
        self.with_gpu(minor, OP, |_, gpu| {
            // SAFETY: the handle belongs to the session `with_gpu` holds.
            let mut device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            device
                .set_persistent(enabled)
                .map_err(|e| nvml_err(&format!("GPU {minor}: {OP}"), e))
        })
    }

    fn usage(&self, minor: u32) -> Result<super::usage::GpuUsage, GpuError> {
        const OP: &str = "read use";
        self.with_gpu(minor, OP, |_, gpu| {
            // SAFETY: the handle belongs to `self.nvml`.
            let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            let fail = |e| nvml_err(&format!("GPU {minor}: {OP}"), e);
            let memory_used_bytes = match device.memory_info() {
                Ok(memory) => Some(memory.used),
                // Unified memory: what the processes hold is what NVML tells.
                Err(NvmlError::NotSupported) => None,
                Err(e) => return Err(fail(e)),
            };
            // Not in MIG mode (NVML has no per-GPU-instance utilization).
            let utilization_percent = match device.utilization_rates() {
                Ok(u) => Some(u.gpu),
                Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => None,
                Err(e) => return Err(fail(e)),
            };
            let processes = match device.running_compute_processes() {
                Ok(list) => list
                    .into_iter()
                    .map(|p| super::usage::ProcessUsage {
                        pid: p.pid,
                        memory_used_bytes: match p.used_gpu_memory {
                            nvml_wrapper::enums::device::UsedGpuMemory::Used(bytes) => Some(bytes),
                            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                        },
                        gpu_instance_id: p.gpu_instance_id,
                        compute_instance_id: p.compute_instance_id,
                    })
                    .collect(),
                Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => vec![],
                Err(e) => return Err(fail(e)),
            };
            Ok(super::usage::GpuUsage {
                memory_used_bytes: memory_used_bytes
                    .unwrap_or_else(|| processes.iter().filter_map(|p| p.memory_used_bytes).sum()),
                utilization_percent,
                processes,
            })
        })
    }

    fn processes(&self, minor: u32) -> Result<Vec<u32>, GpuError> {
        const OP: &str = "list processes";
        self.with_gpu(minor, OP, |_, gpu| {
            // SAFETY: the handle belongs to `self.nvml`.
            let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            let mut pids = Vec::new();
            for list in [
                device.running_compute_processes(),
                device.running_graphics_processes(),
            ] {
                match list {
                    Ok(list) => pids.extend(list.into_iter().map(|p| p.pid)),
                    Err(NvmlError::NotSupported | NvmlError::FunctionNotFound) => {}
                    Err(e) => return Err(nvml_err(&format!("GPU {minor}: {OP}"), e)),
                }
            }
            pids.sort_unstable();
            pids.dedup();
            Ok(pids)
        })
    }

    fn event_source(&self) -> Result<Box<dyn GpuEventSource>, GpuError> {
        NvmlBackend::event_source(self)
    }

    fn sharing_settings(&self, minor: u32) -> Result<SharingSettings, GpuError> {
        const OP: &str = "read compute mode";
        self.with_gpu(minor, OP, |_, gpu| {
            // SAFETY: the handle belongs to `self.nvml`.
            let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            let mode = device
                .compute_mode()
                .map_err(|e| sharing_err(minor, OP, e))?;
            Ok(SharingSettings {
                compute_mode: match mode {
                    NvmlComputeMode::Default | NvmlComputeMode::ExclusiveThread => {
                        ComputeMode::Default
                    }
                    NvmlComputeMode::ExclusiveProcess => ComputeMode::ExclusiveProcess,
                    NvmlComputeMode::Prohibited => ComputeMode::Prohibited,
                },
                timeslice: None,
            })
        })
    }

    fn timeslice_unavailable(&self) -> Option<String> {
        match &self.nvidia_smi {
            None => Some(
                "no nvidia-smi under the driver root (--nvidia-driver-root), and NVML has no call for the time-slice interval".into(),
            ),
            Some(smi) => smi.unusable().map(str::to_string),
        }
    }

    fn set_sharing_settings(&self, minor: u32, settings: SharingSettings) -> Result<(), GpuError> {
        const OP: &str = "set compute mode";
        if settings.timeslice.is_some() && self.nvidia_smi.is_none() {
            // Refused before anything changes, rather than half applied.
            return self.set_timeslice(minor, "", 0);
        }
        let uuid = self.with_gpu(minor, OP, |_, gpu| {
            // SAFETY: the handle belongs to `self.nvml`.
            let mut device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            device
                .set_compute_mode(match settings.compute_mode {
                    ComputeMode::Default => NvmlComputeMode::Default,
                    ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
                    ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
                })
                .map_err(|e| sharing_err(minor, OP, e))?;
            Ok(gpu.gpu.uuid.clone())
        })?;
        match settings.timeslice {
            Some(timeslice) => self.set_timeslice(minor, &uuid, timeslice),
            None => Ok(()),
        }
    }

    fn memory_limits_supported(&self) -> Result<(), String> {
        self.memory_limits
            .as_ref()
            .map(|_| ())
            .map_err(Clone::clone)
    }

    fn memory_limit(&self, minor: u32, cgroup: &Path) -> Result<Option<MemoryLimit>, GpuError> {
        self.memory_limit_call(minor, cgroup, |calls, handle, path| {
            // SAFETY: the handle belongs to the loaded NVML.
            let limits = unsafe { calls.get(handle, path) }?;
            Ok(limits.map(|(soft, hard)| MemoryLimit { soft, hard }))
        })
    }

    fn clear_memory_limit(&self, minor: u32, cgroup: &Path) -> Result<(), GpuError> {
        let none = MemoryLimit::NONE;
        self.memory_limit_call(minor, cgroup, |calls, handle, path| {
            // SAFETY: the handle belongs to the loaded NVML.
            unsafe { calls.set(handle, path, none.soft, none.hard) }
        })
    }

    fn invalidate(&self) {
        NvmlBackend::invalidate(self)
    }

    fn invalidate_gpu(&self, minor: u32) {
        NvmlBackend::invalidate_gpu(self, minor)
    }

    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        const OP: &str = "set MIG mode";
        self.with_gpu(minor, OP, |slot, gpu| {
            // Even a refused call may have changed something; read it again when next needed.
            slot.mark_stale();
            // SAFETY: the handle belongs to `self.nvml`.
            let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            let status = device
                .set_mig_mode(enabled)
                .map_err(|e| read_err(minor, OP, e))?;
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
                .map_err(|e| read_err(minor, "read MIG mode", e))?;
            Ok(MigMode {
                current: mode.current == 1,
                pending: mode.pending == 1,
            })
        })
    }

    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        const OP: &str = "create GPU instance";
        self.with_gpu(minor, OP, |slot, gpu| {
            slot.mark_stale();
            // SAFETY: the handle belongs to `self.nvml`.
            unsafe {
                nvml_raw::create_gpu_instance(&self.nvml, gpu.handle.0, profile_id, placement)
            }
            .map_err(|e| mig_failure(minor, OP, e))
        })
    }

    fn create_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
    ) -> Result<(u32, String), GpuError> {
        const OP: &str = "create compute instance";
        let not_found = || GpuError::Mig {
            minor,
            operation: OP,
            failure: super::MigFailure::NotFound,
            detail: format!("no GPU instance {gpu_instance_id}"),
        };
        self.with_gpu(minor, OP, |slot, gpu| {
            let handle = gpu.handle.0;
            // Only this GPU instance's profile is asked, not every instance of the GPU.
            // SAFETY: the handle belongs to `self.nvml`.
            let profile_id =
                match unsafe { nvml_raw::gpu_instance_info(&self.nvml, handle, gpu_instance_id) } {
                    Ok((profile_id, _)) => profile_id,
                    // No such instance, or MIG mode off (then there is none).
                    Err(RawError { code: 3 | 6, .. }) => return Err(not_found()),
                    Err(e) => return Err(mig_failure(minor, OP, e)),
                };
            let slices = self
                .gi_profiles(slot, gpu)?
                .iter()
                .find(|p| p.id == profile_id)
                .map(|p| p.slice_count)
                .ok_or_else(not_found)?;
            slot.mark_stale();
            let profile_enum = super::sim::full_compute_profile(slices);
            // SAFETY: the handle belongs to `self.nvml`.
            unsafe {
                nvml_raw::create_compute_instance(&self.nvml, handle, gpu_instance_id, profile_enum)
            }
            .map_err(|e| mig_failure(minor, OP, e))
        })
    }

    fn destroy_compute_instance(&self, minor: u32, gi: u32, ci: u32) -> Result<(), GpuError> {
        const OP: &str = "destroy compute instance";
        self.with_gpu(minor, OP, |slot, gpu| {
            slot.mark_stale();
            // SAFETY: the handle belongs to `self.nvml`.
            unsafe { nvml_raw::destroy_compute_instance(&self.nvml, gpu.handle.0, gi, ci) }
                .map_err(|e| mig_failure(minor, OP, e))
        })
    }

    fn destroy_gpu_instance(&self, minor: u32, gi: u32) -> Result<(), GpuError> {
        const OP: &str = "destroy GPU instance";
        self.with_gpu(minor, OP, |slot, gpu| {
            slot.mark_stale();
            // SAFETY: the handle belongs to `self.nvml`.
            unsafe { nvml_raw::destroy_gpu_instance(&self.nvml, gpu.handle.0, gi) }
                .map_err(|e| mig_failure(minor, OP, e))
        })
    }

    fn gpu_instances(&self, minor: u32) -> Result<Vec<super::GpuInstanceInfo>, GpuError> {
        const OP: &str = "list GPU instances";
        self.with_gpu(minor, OP, |slot, gpu| {
            let handle = gpu.handle.0;
            let profiles: Vec<(u32, u32)> = self
                .gi_profiles(slot, gpu)?
                .iter()
                .map(|p| (p.id, p.instance_count))
                .collect();
            // SAFETY: the handle belongs to `self.nvml`.
            match unsafe { nvml_raw::gpu_instances(&self.nvml, handle, &profiles) } {
                Ok(found) => Ok(found),
                // MIG mode off: there are none.
                Err(RawError { code: 3, .. }) => Ok(vec![]),
                Err(e) => Err(mig_failure(minor, OP, e)),
            }
        })
    }
}
