//! GPUs: the device model and the backends that discover it.
//!
//! - [`model`]: what a node has (our own small types).
//! - [`sim`]: simulated GPUs with the real MIG rules and persistent "hardware" state.
//! - [`nvml`]: real discovery through NVML (nvml-wrapper, raw calls where it stops).
//! - [`mig`]: naming and MIG rules both backends share.
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

pub mod catalog;
pub mod driver_tools;
pub mod events;
pub mod holders;
pub mod memory_limit;
pub mod mig;
pub mod model;
pub mod nvml;
mod nvml_raw;
pub mod pci;
pub mod session;
pub mod sim;
#[cfg(test)]
mod sim_tests;
pub mod usage;

pub use model::*;

/// Why a MIG operation was refused, in NVML's terms (so the fake NVML can return the same code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigFailure {
    /// `NVML_ERROR_INVALID_ARGUMENT`: no such profile or placement.
    InvalidArgument,
    /// `NVML_ERROR_NOT_SUPPORTED`: not MIG-capable, or MIG mode is off.
    NotSupported,
    /// `NVML_ERROR_NOT_FOUND`: no such GPU, GPU instance or compute instance.
    NotFound,
    /// `NVML_ERROR_IN_USE`: the instance still has compute instances (or MIG devices exist).
    InUse,
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`: placement occupied or profile exhausted.
    InsufficientResources,
    /// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus.
    Lost,
}

impl MigFailure {
    /// The `nvmlReturn_t` value.
    pub fn nvml_return(&self) -> u32 {
        match self {
            Self::InvalidArgument => 2,
            Self::NotSupported => 3,
            Self::NotFound => 6,
            Self::InUse => 19,
            Self::InsufficientResources => 23,
            Self::Lost => 15,
        }
    }
}

impl fmt::Display for MigFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InvalidArgument => "invalid argument",
            Self::NotSupported => "not supported",
            Self::NotFound => "not found",
            Self::InUse => "in use",
            Self::InsufficientResources => "insufficient resources",
            Self::Lost => "GPU is lost",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("invalid GPU spec {spec:?}: {reason}")]
    Spec { spec: String, reason: String },
    #[error("simulator state file {path}: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("GPU {minor}: {operation}: {failure}{}", detail_suffix(.detail))]
    Mig {
        minor: u32,
        operation: &'static str,
        failure: MigFailure,
        detail: String,
    },
    #[error("NVML: {operation}: {reason}")]
    Nvml { operation: String, reason: String },
    #[error("node boot ID: {reason}")]
    BootId { reason: String },
    /// Compute mode or time-slice interval could not be read or set.
    #[error("GPU {minor}: {operation}: {reason}")]
    Sharing {
        minor: u32,
        operation: &'static str,
        reason: String,
    },
    /// A GPU's PCI function could not be read or bound.
    #[error(transparent)]
    Pci(#[from] pci::PciError),
    /// A cgroup's GPU memory limits could not be read or set.
    #[error("GPU {minor}: memory limits of cgroup {cgroup}: {failure}")]
    MemoryLimit {
        minor: u32,
        cgroup: PathBuf,
        failure: memory_limit::MemoryLimitFailure,
    },
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

/// Which backend discovers GPUs: `nvml` or `sim:<N>x<MODEL>[,...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSource {
    Nvml,
    Sim(sim::SimSpec),
}

impl FromStr for GpuSource {
    type Err = GpuError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "nvml" {
            return Ok(Self::Nvml);
        }
        match s.strip_prefix("sim:") {
            Some(_) => Ok(Self::Sim(s.parse()?)),
            None => Err(GpuError::Spec {
                spec: s.to_string(),
                reason: "expected `nvml` or `sim:<N>x<MODEL>[,<N>x<MODEL>...]`".into(),
            }),
        }
    }
}

impl fmt::Display for GpuSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Nvml => f.write_str("nvml"),
            Self::Sim(spec) => write!(f, "sim:{spec}"),
        }
    }
}

/// Where discovery runs and how it is configured.
#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    pub source: GpuSource,
    pub node_name: String,
    /// Simulator hardware state; `None` keeps it in memory (fresh GPUs, MIG off).
    pub sim_state: Option<PathBuf>,
    /// NVML library to load (default `libnvidia-ml.so.1` through the dynamic linker).
    pub nvml_library: Option<PathBuf>,
    /// Root of sysfs, for PCIe root lookups.
    pub sysfs_root: PathBuf,
    /// `nvidia-smi` of the driver, for what NVML cannot set (the time-slice interval).
    pub nvidia_smi: Option<driver_tools::NvidiaSmi>,
    /// Simulated GPUs only: how long a GPU instance create or destroy takes.
    pub sim_mig_delay: std::time::Duration,
    /// Read the GPUs' PCI functions from sysfs (for `--passthrough`); off, no GPU is offered to
    /// virtual machines and discovery does not walk `bus/pci/devices`.
    pub scan_pci: bool,
    /// The kernel's modules (`/lib/modules`), whose aliases name VFIO variant drivers.
    pub modules_root: PathBuf,
}

impl DiscoveryConfig {
    /// `source` on `node_name`, with the host's `/sys`, no simulator state, NVML's default library
    /// and no PCI scan.
    pub fn new(source: GpuSource, node_name: &str) -> Self {
        Self {
            source,
            node_name: node_name.to_string(),
            sim_state: None,
            nvml_library: None,
            sysfs_root: PathBuf::from("/sys"),
            nvidia_smi: None,
            sim_mig_delay: std::time::Duration::ZERO,
            scan_pci: false,
            modules_root: PathBuf::from(pci::MODULES_ROOT),
        }
    }
}

/// Discovers the node's GPUs with the configured backend.
pub fn discover(config: &DiscoveryConfig) -> Result<NodeInventory, GpuError> {
    match &config.source {
        GpuSource::Nvml => {
            nvml::NvmlBackend::open(config.nvml_library.as_deref(), config.sysfs_root.clone())?
                .with_pci_scan(config.scan_pci)
                .with_modules_root(config.modules_root.clone())
                .inventory()
        }
        GpuSource::Sim(spec) => {
            sim::SimNode::new(spec.clone(), &config.node_name, config.sim_state.clone()).inventory()
        }
    }
}

/// Overrides the boot ID in test (debug) builds, to simulate reboots.
pub const BOOT_ID_OVERRIDE: &str = "GPU_DRA_BOOT_ID";
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The node's boot ID, the kernel's. State that must not outlive a reboot (prepared claims, MIG
/// instances) is keyed by it, so a boot ID that cannot be read is an error: guessing would either
/// forget running claims or keep a previous boot's.
pub fn boot_id() -> Result<String, GpuError> {
    if let Some(id) = std::env::var_os(BOOT_ID_OVERRIDE) {
        if cfg!(debug_assertions) {
            return Ok(id.to_string_lossy().into_owned());
        }
        return Err(GpuError::BootId {
            reason: format!("{BOOT_ID_OVERRIDE} is for tests only (debug builds); unset it"),
        });
    }
    // Constant while this process lives, and asked at every call of the fake libnvidia-ml (its
    // state is checked against this boot): read once.
    static KERNEL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(id) = KERNEL.get() {
        return Ok(id.clone());
    }
    let id = std::fs::read_to_string(KERNEL_BOOT_ID).map_err(|e| GpuError::BootId {
        reason: format!("cannot read {KERNEL_BOOT_ID}: {e}"),
    })?;
    match id.trim() {
        "" => Err(GpuError::BootId {
            reason: format!("{KERNEL_BOOT_ID} is empty"),
        }),
        id => Ok(KERNEL.get_or_init(|| id.to_string()).clone()),
    }
}

/// What preparing devices needs from the GPUs: a fresh view and the MIG lifecycle. The simulator
/// implements it directly; the NVML backend through NVML's MIG calls.
pub trait GpuControl: Send + Sync {
    fn inventory(&self) -> Result<NodeInventory, GpuError>;
    /// The inventory of the GPUs in `minors` only (minors the node lacks are ignored), refreshed
    /// as [`inventory`](Self::inventory) would. For callers that hold those GPUs: a backend that
    /// locks per GPU reads only these, never waiting for an operation in flight on another GPU.
    fn inventory_of(
        &self,
        minors: &std::collections::BTreeSet<u32>,
    ) -> Result<NodeInventory, GpuError> {
        let mut inventory = self.inventory()?;
        inventory.gpus.retain(|g| minors.contains(&g.minor));
        Ok(inventory)
    }
    /// Someone else (another driver instance on the node) may have changed the GPUs: the next
    /// inventory must read all of their MIG state again. Backends that cache need this.
    fn invalidate(&self) {}
    /// As [`invalidate`](Self::invalidate), for one GPU (a fault on it may have changed it).
    fn invalidate_gpu(&self, _minor: u32) {
        self.invalidate()
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError>;
    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError>;
    /// Creates the GPU instance's full-size compute instance; returns its id and the MIG UUID.
    fn create_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
    ) -> Result<(u32, String), GpuError>;
    fn destroy_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), GpuError>;
    fn destroy_gpu_instance(&self, minor: u32, gpu_instance_id: u32) -> Result<(), GpuError>;
    /// Every GPU instance of a GPU, with or without compute instances (a GPU instance without one
    /// is no MIG device, so the inventory does not show it).
    fn gpu_instances(&self, minor: u32) -> Result<Vec<GpuInstanceInfo>, GpuError>;
    /// A full GPU's compute mode and time-slice interval.
    fn sharing_settings(&self, minor: u32) -> Result<SharingSettings, GpuError>;
    /// Sets a full GPU's compute mode and, when given, its time-slice interval.
    fn set_sharing_settings(&self, minor: u32, settings: SharingSettings) -> Result<(), GpuError>;
    /// Why this node cannot set time-slice intervals (no `nvidia-smi` in the driver root, or one
    /// that cannot run there); `None` where it can.
    fn timeslice_unavailable(&self) -> Option<String> {
        None
    }
    /// Whether this backend can read and clear per-cgroup GPU memory limits (NVML 13.4's
    /// `nvmlDeviceGetMemoryLimits_v1`/`SetMemoryLimits_v1`); the reason when it cannot.
    fn memory_limits_supported(&self) -> Result<(), String> {
        Err("this GPU backend has no per-cgroup memory limits".into())
    }
    /// The GPU memory limits of the cgroup at `cgroup` (a path this process can open) on a full
    /// GPU; `None` when it has none.
    fn memory_limit(
        &self,
        minor: u32,
        cgroup: &std::path::Path,
    ) -> Result<Option<memory_limit::MemoryLimit>, GpuError> {
        Err(GpuError::MemoryLimit {
            minor,
            cgroup: cgroup.to_path_buf(),
            failure: memory_limit::MemoryLimitFailure::NotSupported,
        })
    }
    /// Clears the GPU memory limits of the cgroup at `cgroup` on a full GPU.
    fn clear_memory_limit(&self, minor: u32, cgroup: &std::path::Path) -> Result<(), GpuError> {
        Err(GpuError::MemoryLimit {
            minor,
            cgroup: cgroup.to_path_buf(),
            failure: memory_limit::MemoryLimitFailure::NotSupported,
        })
    }
    /// Where simulated GPUs keep their state, for the processes that run on them (the MPS
    /// daemons record themselves there); `None` for real GPUs.
    fn sim_state_file(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// Whether these GPUs are simulated (no kernel behind them makes device nodes).
    fn simulated(&self) -> bool {
        false
    }
    /// Binds the GPU at PCI address `bus_id` to a kernel driver (its VFIO driver for a virtual
    /// machine, `nvidia` back). Returns once the kernel reports the binding.
    fn bind_pci(&self, bus_id: &str, _driver: sim::PciDriver) -> Result<(), GpuError> {
        Err(GpuError::Pci(pci::PciError::Bind {
            bus_id: bus_id.to_string(),
            reason: "this GPU backend cannot bind PCI functions".into(),
        }))
    }
    /// Closes this process's session with the GPUs (NVML, and its event set) and keeps it closed
    /// while the returned guard lives, so the kernel can let a GPU go; waits up to `within` for
    /// this process's own calls in flight. A backend with no session of its own has nothing to
    /// close.
    fn close_session(&self, within: std::time::Duration) -> Result<SessionClosed<'_>, GpuError> {
        let _ = within;
        Ok(SessionClosed(None))
    }
    /// Who has the GPU's device file open (processes, persistence mode). This process, its
    /// session closed, is not among them.
    fn open_holders(&self, minor: u32) -> Result<Vec<holders::GpuHolder>, GpuError> {
        let _ = minor;
        Ok(vec![])
    }
    /// Whether the GPU is in persistence mode (the driver keeps it initialised, holding it open).
    fn persistence_mode(&self, minor: u32) -> Result<bool, GpuError> {
        let _ = minor;
        Ok(false)
    }
    /// Turns persistence mode on or off.
    fn set_persistence_mode(&self, minor: u32, enabled: bool) -> Result<(), GpuError> {
        let _ = enabled;
        Err(GpuError::Nvml {
            operation: format!("GPU {minor}: set persistence mode"),
            reason: "this GPU backend has no persistence mode".into(),
        })
    }
    /// The processes running on a full GPU (compute and graphics), by PID. The simulator runs
    /// none but MPS daemons, which its binding refuses on its own.
    fn processes(&self, _minor: u32) -> Result<Vec<u32>, GpuError> {
        Ok(vec![])
    }
    /// How much of a GPU is in use and by which compute processes (read on an interval, for
    /// the per-claim use metrics).
    fn usage(&self, minor: u32) -> Result<usage::GpuUsage, GpuError> {
        Err(GpuError::Nvml {
            operation: format!("GPU {minor}: usage"),
            reason: "this GPU backend does not report use".into(),
        })
    }
    /// The GPU's place in a multi-node NVLink fabric; `None` where the GPU has none (NVML says
    /// not supported).
    fn fabric(&self, _minor: u32) -> Result<Option<model::FabricInfo>, GpuError> {
        Ok(None)
    }
    /// The liveness probe of one GPU.
    fn probe(&self, minor: u32) -> Result<events::GpuProbe, GpuError>;
    /// Registers for fault events on every GPU.
    fn event_source(&self) -> Result<Box<dyn events::GpuEventSource>, GpuError>;
}

/// This process's GPU session is closed while this lives (see [`GpuControl::close_session`]).
pub struct SessionClosed<'a>(
    #[allow(dead_code, reason = "held for its drop")] Option<Box<dyn Send + 'a>>,
);

impl<'a> SessionClosed<'a> {
    /// Keeps `closed` (a guard whose drop lets the session open again) until this is dropped.
    pub fn holding(closed: impl Send + 'a) -> Self {
        Self(Some(Box::new(closed)))
    }
}

/// A GPU instance and its compute instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInstanceInfo {
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
    pub compute_instances: Vec<u32>,
}

impl GpuControl for sim::SimNode {
    fn inventory(&self) -> Result<NodeInventory, GpuError> {
        let _session = self.lease()?;
        sim::SimNode::inventory(self)
    }
    fn inventory_of(
        &self,
        minors: &std::collections::BTreeSet<u32>,
    ) -> Result<NodeInventory, GpuError> {
        let mut inventory = GpuControl::inventory(self)?;
        inventory.gpus.retain(|g| minors.contains(&g.minor));
        Ok(inventory)
    }
    fn close_session(&self, within: std::time::Duration) -> Result<SessionClosed<'_>, GpuError> {
        Ok(match sim::SimNode::close_session(self, within)? {
            Some(closed) => SessionClosed::holding(closed),
            None => SessionClosed(None),
        })
    }
    fn open_holders(&self, minor: u32) -> Result<Vec<holders::GpuHolder>, GpuError> {
        self.holders(minor)
    }
    fn persistence_mode(&self, minor: u32) -> Result<bool, GpuError> {
        self.persistence(minor)
    }
    fn set_persistence_mode(&self, minor: u32, enabled: bool) -> Result<(), GpuError> {
        self.set_persistence(minor, enabled)
    }

    fn sim_state_file(&self) -> Option<std::path::PathBuf> {
        self.state_file().map(std::path::Path::to_path_buf)
    }
    fn simulated(&self) -> bool {
        true
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        sim::SimNode::set_mig_mode(self, minor, enabled)
    }
    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        sim::SimNode::create_gpu_instance(self, minor, profile_id, placement)
    }
    fn create_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
    ) -> Result<(u32, String), GpuError> {
        sim::SimNode::create_compute_instance(self, minor, gpu_instance_id)
    }
    fn destroy_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), GpuError> {
        sim::SimNode::destroy_compute_instance(self, minor, gpu_instance_id, compute_instance_id)
    }
    fn destroy_gpu_instance(&self, minor: u32, gpu_instance_id: u32) -> Result<(), GpuError> {
        sim::SimNode::destroy_gpu_instance(self, minor, gpu_instance_id)
    }
    fn gpu_instances(&self, minor: u32) -> Result<Vec<GpuInstanceInfo>, GpuError> {
        let state = self.state()?;
        Ok(state
            .gpus
            .iter()
            .filter(|g| g.minor == minor)
            .flat_map(|g| g.gpu_instances.iter())
            .map(|gi| GpuInstanceInfo {
                id: gi.id,
                profile_id: gi.profile_id,
                placement: gi.placement,
                compute_instances: gi.compute_instances.iter().map(|ci| ci.id).collect(),
            })
            .collect())
    }
    fn sharing_settings(&self, minor: u32) -> Result<SharingSettings, GpuError> {
        sim::SimNode::sharing_settings(self, minor)
    }
    fn memory_limits_supported(&self) -> Result<(), String> {
        Ok(())
    }
    fn memory_limit(
        &self,
        minor: u32,
        cgroup: &std::path::Path,
    ) -> Result<Option<memory_limit::MemoryLimit>, GpuError> {
        sim::SimNode::memory_limit(self, minor, cgroup)
    }
    fn clear_memory_limit(&self, minor: u32, cgroup: &std::path::Path) -> Result<(), GpuError> {
        self.set_memory_limit(minor, cgroup, memory_limit::MemoryLimit::NONE)
    }
    fn set_sharing_settings(&self, minor: u32, settings: SharingSettings) -> Result<(), GpuError> {
        sim::SimNode::set_sharing_settings_through_tools(self, minor, settings)
    }
    fn timeslice_unavailable(&self) -> Option<String> {
        sim::SimNode::timeslice_unavailable(self)
    }
    fn probe(&self, minor: u32) -> Result<events::GpuProbe, GpuError> {
        let _session = self.lease()?;
        sim::SimNode::probe(self, minor)
    }
    fn fabric(&self, minor: u32) -> Result<Option<model::FabricInfo>, GpuError> {
        sim::SimNode::fabric(self, minor)
    }
    fn usage(&self, minor: u32) -> Result<usage::GpuUsage, GpuError> {
        sim::SimNode::usage(self, minor)
    }
    fn bind_pci(&self, bus_id: &str, driver: sim::PciDriver) -> Result<(), GpuError> {
        sim::SimNode::bind_pci(self, bus_id, driver)
    }
    fn event_source(&self) -> Result<Box<dyn events::GpuEventSource>, GpuError> {
        Ok(Box::new(sim::SimNode::event_source(self)?))
    }
}

/// Opens the GPU control for a discovery configuration.
pub fn open_control(config: &DiscoveryConfig) -> Result<std::sync::Arc<dyn GpuControl>, GpuError> {
    match &config.source {
        GpuSource::Sim(spec) => Ok(std::sync::Arc::new(
            sim::SimNode::new(spec.clone(), &config.node_name, config.sim_state.clone())
                .with_mig_delay(config.sim_mig_delay)
                .with_nvidia_smi(config.nvidia_smi.clone())
                // As NVML's: the GPUs are held open while the process uses them.
                .with_session()?,
        )),
        GpuSource::Nvml => Ok(std::sync::Arc::new(
            nvml::NvmlBackend::open(config.nvml_library.as_deref(), config.sysfs_root.clone())?
                .with_pci_scan(config.scan_pci)
                .with_modules_root(config.modules_root.clone())
                .with_nvidia_smi(config.nvidia_smi.clone()),
        )),
    }
}
