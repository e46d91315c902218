//! Simulated GPUs with the real MIG rules.
//!
//! The "hardware" state (MIG mode, GPU and compute instances) lives in a JSON state file guarded by
//! an advisory lock, so it survives driver restarts as real hardware does and several processes
//! (the driver, the fake `libnvidia-ml`, tests) see one truth. GPU and compute instances vanish on
//! reboot (a changed [`boot_id`](super::boot_id)); MIG mode persists.
use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::catalog::{self, SimModel};
use super::events::{
    GpuEvent, GpuEventKind, GpuEventSource, GpuProbe, RESET_REQUIRED_XIDS, RecoveryAction,
};
use super::memory_limit::{MemoryLimit, MemoryLimitFailure, cgroup_id};
use super::mig::profile_name;
use super::model::*;
use super::session::{Lease, SessionGate};
use super::{GpuError, MigFailure};

/// Most GPUs a spec may describe; far above any real node, low enough to catch typos like `8000x`.
const MAX_GPUS: u32 = 1024;

/// `<N>x<MODEL>[,<N>x<MODEL>...]`, optionally prefixed with `sim:`.
#[derive(Debug, Clone)]
pub struct SimSpec {
    groups: Vec<(u32, &'static SimModel)>,
}

impl PartialEq for SimSpec {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}
impl Eq for SimSpec {}

impl SimSpec {
    /// Models in minor order.
    pub fn models(&self) -> impl Iterator<Item = &'static SimModel> + '_ {
        self.groups
            .iter()
            .flat_map(|(n, m)| std::iter::repeat_n(*m, *n as usize))
    }

    pub fn gpu_count(&self) -> u32 {
        self.groups.iter().map(|(n, _)| n).sum()
    }
}

impl FromStr for SimSpec {
    type Err = GpuError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| GpuError::Spec {
            spec: input.to_string(),
            reason,
        };
        let body = input.strip_prefix("sim:").unwrap_or(input);
        if body.trim().is_empty() {
            return Err(err(
                "no GPUs given; expected <N>x<MODEL>, e.g. sim:8xH100-SXM5-80GB".into(),
            ));
        }
        let mut groups = Vec::new();
        let mut total = 0u32;
        for part in body.split(',') {
            let part = part.trim();
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            let (count, rest) = part.split_at(digits);
            let model_key = rest
                .strip_prefix(['x', 'X'])
                .filter(|_| !count.is_empty())
                .ok_or_else(|| err(format!("{part:?} is not <N>x<MODEL>")))?;
            let count: u32 = count
                .parse()
                .map_err(|_| err(format!("{count:?} in {part:?} is not a GPU count")))?;
            if count == 0 {
                return Err(err(format!("{part:?} asks for zero GPUs")));
            }
            let model = catalog::model(model_key).ok_or_else(|| {
                let known: Vec<_> = catalog::MODELS.iter().map(|m| m.key).collect();
                err(format!(
                    "unknown model {model_key:?} (known: {})",
                    known.join(", ")
                ))
            })?;
            total = total.saturating_add(count);
            if total > MAX_GPUS {
                return Err(err(format!("more than {MAX_GPUS} GPUs")));
            }
            groups.push((count, model));
        }
        Ok(Self { groups })
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .groups
            .iter()
            .map(|(n, m)| format!("{n}x{}", m.key))
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// Models whose GPUs sit in a multi-node NVLink fabric (NVL72 racks).
pub fn multi_node_nvlink(model: &SimModel) -> bool {
    model.key.starts_with("GB")
}

/// A simulated rack's fabric unless told otherwise: one cluster, clique 1, registered.
pub fn default_fabric() -> FabricInfo {
    FabricInfo {
        cluster_uuid: "7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201".into(),
        clique_id: 1,
        state: FabricState::Completed,
    }
}

/// Persistent hardware state of a simulated node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimState {
    pub schema: u32,
    pub node_name: String,
    pub spec: String,
    /// Boot the instances below were created in.
    pub boot_id: String,
    /// Serial for MIG UUIDs, so a re-created instance gets a new UUID as on real hardware.
    pub uuid_serial: u64,
    pub gpus: Vec<SimGpuState>,
    /// MPS control daemons running on this node's GPUs (the fake `nvidia-cuda-mps-control`
    /// records itself here), with what they were told.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mps_daemons: Vec<SimMpsDaemon>,
    /// NVML events raised on this node's GPUs (the last [`EVENTS_KEPT`]), numbered by
    /// `event_serial` so that every reader sees each event once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<SimEvent>,
    #[serde(default)]
    pub event_serial: u64,
    /// The node's place in a multi-node NVLink fabric, set by `gpu-dra sim fabric`; `None` is
    /// the model's default (GB200: the first clique of one rack; others: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricInfo>,
    /// Each `unbind` that found the GPU held open: on a real node the writing thread sleeps in
    /// the kernel until every holder closes it (`nv_pci_remove`), and no restart recovers it. A
    /// driver that lets this happen has wedged the node; tests assert there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck_unbinds: Vec<String>,
}

/// An event as the simulated hardware raised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimEvent {
    pub serial: u64,
    pub event: GpuEvent,
}

/// How many raised events the state keeps for readers that poll.
pub const EVENTS_KEPT: usize = 256;

/// Numbers `event` and keeps it for every reader (the oldest beyond [`EVENTS_KEPT`] go).
fn raise(state: &mut SimState, event: GpuEvent) {
    if event.kind == GpuEventKind::MigConfigChange {
        // A reader that missed one still learns "this GPU's MIG devices changed" from the
        // newest: one per GPU is kept, so carve churn neither grows the state file nor pushes
        // faults out of the list.
        state.events.retain(|e| {
            !(e.event.kind == GpuEventKind::MigConfigChange && e.event.minor == event.minor)
        });
    }
    state.event_serial += 1;
    state.events.push(SimEvent {
        serial: state.event_serial,
        event,
    });
    let excess = state.events.len().saturating_sub(EVENTS_KEPT);
    state.events.drain(..excess);
}

/// `nvmlEventMigConfigChange` on GPU `minor`: raised by every GPU or compute instance made or
/// destroyed, whoever made it.
fn mig_config_change(minor: u32) -> GpuEvent {
    GpuEvent {
        minor,
        kind: GpuEventKind::MigConfigChange,
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

/// A fault to raise on a simulated GPU, or its reset (`gpu-dra sim inject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFault {
    /// An XID event; 79 also takes the GPU off the bus, and the XIDs that need a reset make the
    /// driver ask for one.
    Xid {
        code: u64,
        gpu_instance_id: Option<u32>,
        compute_instance_id: Option<u32>,
    },
    /// A double-bit ECC error: an event, the volatile count up, a reset asked for.
    EccDoubleBit { gpu_instance_id: Option<u32> },
    /// The GPU stops answering (`NVML_ERROR_GPU_IS_LOST`), without an event.
    Lost,
    /// A GPU reset: faults cleared, volatile ECC counts zeroed, MIG instances gone, a pending MIG
    /// mode applied.
    Reset,
}

/// An MPS control daemon, as the simulated hardware knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimMpsDaemon {
    pub pid: u32,
    /// Its `CUDA_MPS_PIPE_DIRECTORY`: how it is found.
    pub pipe_directory: String,
    /// GPU or MIG UUIDs it serves (`CUDA_VISIBLE_DEVICES`).
    pub devices: Vec<String>,
    pub multi_user: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<String>,
    /// Device → `<N>M`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pinned_device_memory_limits: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpuState {
    pub minor: u32,
    pub mig_current: bool,
    pub mig_pending: bool,
    pub gpu_instances: Vec<SimGpuInstance>,
    /// Like a real GPU's, back to `Default` and 0 at every boot.
    #[serde(default)]
    pub compute_mode: ComputeMode,
    #[serde(default)]
    pub timeslice: u32,
    /// Off the bus: NVML calls on it fail with `GPU_IS_LOST` until a reset.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    /// Volatile uncorrected ECC count (cleared at reset and boot).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub volatile_dbe: u64,
    /// `nvmlDeviceGpuRecoveryAction_t` the driver reports (0: none).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub recovery_action: u32,
    /// Memory limits per cgroup (`nvmlDeviceSetMemoryLimits_v1`); gone at boot, as cgroups are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_limits: Vec<SimMemoryLimit>,
    /// The kernel driver the GPU's PCI function is bound to (sysfs `driver`). Bound to
    /// `vfio-pci` it is invisible to NVML; a runtime binding does not survive a reboot.
    #[serde(default, skip_serializing_if = "PciDriver::is_nvidia")]
    pub driver: PciDriver,
    /// Compute processes running on it (`gpu-dra sim process`), for the use NVML reports; gone
    /// at reset and boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<SimProcess>,
    /// Processes with the GPU's device file open (an NVML session: the fake `libnvidia-ml`'s,
    /// the simulated driver's; `gpu-dra sim hold`): the kernel does not let the GPU leave
    /// `nvidia` while any lives. Gone with their process, and at boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<SimHolder>,
    /// Persistence mode: the kernel module keeps the GPU initialised and open. Off at boot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persistence: bool,
    /// A sick GPU whose MIG calls (GPU instance create and destroy) do not return until it is
    /// no longer stalled (`gpu-dra sim stall`), as NVML calls on a hung GPU do. Gone at boot.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stalled: bool,
}

/// A process holding a simulated GPU open, told apart from a later process with the same PID by
/// its start time (`/proc/<pid>/stat`). PIDs are those of the host's namespace (the chart runs
/// the driver with the host's PIDs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimHolder {
    pub pid: u32,
    pub start_time: u64,
    pub name: String,
}

impl SimHolder {
    /// This process, holding the GPU as `name`.
    pub fn this_process(name: &str) -> Self {
        Self::of_process(std::process::id(), name)
    }

    /// The running process `pid`, holding the GPU as `name`.
    pub fn of_process(pid: u32, name: &str) -> Self {
        Self {
            pid,
            start_time: process_start_time(pid).unwrap_or_default(),
            name: name.to_string(),
        }
    }

    /// Whether the process still runs (a killed one's files are closed by the kernel).
    pub fn alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot.
fn process_start_time(pid: u32) -> Option<u64> {
    // This process's own, read once: the fake libnvidia-ml checks at every call that the
    // session's holder (the process it is loaded in) still runs. Keyed by pid, as a forked child
    // is another process.
    static OWN: std::sync::Mutex<Option<(u32, u64)>> = std::sync::Mutex::new(None);
    let own = pid == std::process::id();
    if own
        && let Some((cached_pid, start)) = *OWN.lock().unwrap_or_else(|p| p.into_inner())
        && cached_pid == pid
    {
        return Some(start);
    }
    let start = read_process_start_time(pid)?;
    if own {
        *OWN.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, start));
    }
    Some(start)
}

fn read_process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// A compute process on a simulated GPU (or on one of its MIG devices).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimProcess {
    #[serde(flatten)]
    pub usage: super::usage::ProcessUsage,
    /// Percent of the GPU's time it keeps a kernel running (the GPU's utilization is the sum,
    /// at most 100).
    #[serde(default)]
    pub sm_percent: u32,
}

/// The kernel driver a simulated GPU is bound to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PciDriver {
    /// NVIDIA's kernel module: NVML, CUDA and the device nodes `/dev/nvidia*`.
    #[default]
    Nvidia,
    /// For passthrough to a virtual machine: the function's VFIO driver (`vfio-pci`, or the
    /// variant the kernel's aliases name for it, `nvgrace_gpu_vfio_pci` on Grace-attached GPUs):
    /// `/dev/vfio/<IOMMU group>`, no NVML.
    VfioPci,
}

/// The simulated kernel's `modules.alias` (its VFIO lines and one other): Linux's nvgrace-gpu
/// variant for every Grace-attached GPU, and another vendor's variant, so that a match must be
/// exact.
pub fn sim_modules_alias() -> String {
    let mut text: String = crate::gpu::pci::NVGRACE_DEVICE_IDS
        .iter()
        .map(|id| {
            format!("alias vfio_pci:v000010DEd0000{id:04X}sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n")
        })
        .collect();
    text.push_str("alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci\n");
    text.push_str("alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n");
    text
}

/// [`sim_modules_alias`]'s VFIO aliases, parsed once.
pub fn sim_vfio_aliases() -> &'static crate::gpu::pci::VfioAliases {
    static ALIASES: std::sync::LazyLock<crate::gpu::pci::VfioAliases> =
        std::sync::LazyLock::new(|| crate::gpu::pci::VfioAliases::parse(&sim_modules_alias()));
    &ALIASES
}

/// The drivers the simulated kernel has loaded (`bus/pci/drivers/<name>`).
const SIM_PCI_DRIVERS: [&str; 3] = ["nvidia", "vfio-pci", "nvgrace_gpu_vfio_pci"];

/// The modalias the simulated kernel shows for a GPU with `pci_id` (`device << 16 | vendor`):
/// NVIDIA's subsystem, a 3D controller.
pub fn sim_modalias(pci_id: u32) -> String {
    crate::gpu::pci::ModAlias::of(
        (pci_id & 0xFFFF) as u16,
        (pci_id >> 16) as u16,
        (crate::gpu::pci::NVIDIA_VENDOR, 0x1234),
        0x03_02_00,
    )
}

/// The sysfs name of the driver a simulated GPU with `pci_id` is bound to.
fn sim_driver_name(driver: PciDriver, pci_id: u32) -> String {
    match driver {
        PciDriver::Nvidia => "nvidia".into(),
        PciDriver::VfioPci => sim_vfio_aliases()
            .best(&sim_modalias(pci_id))
            .unwrap_or(crate::gpu::pci::VFIO_PCI)
            .to_string(),
    }
}

impl PciDriver {
    fn is_nvidia(&self) -> bool {
        *self == Self::Nvidia
    }

    /// The driver's name in sysfs (`/sys/bus/pci/drivers/<name>`).
    pub fn sysfs_name(&self) -> &'static str {
        match self {
            Self::Nvidia => "nvidia",
            Self::VfioPci => "vfio-pci",
        }
    }
}

impl std::str::FromStr for PciDriver {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nvidia" => Ok(Self::Nvidia),
            "vfio-pci" => Ok(Self::VfioPci),
            other => Err(format!("{other:?}: the drivers are nvidia and vfio-pci")),
        }
    }
}

/// One cgroup's memory limits on a simulated GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimMemoryLimit {
    /// The cgroup's id (its directory's inode): the key, whatever path reached it.
    pub cgroup_id: u64,
    /// The path it was set through, for people reading the state.
    pub path: String,
    #[serde(flatten)]
    pub limit: MemoryLimit,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimGpuInstance {
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
    pub compute_instances: Vec<SimComputeInstance>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimComputeInstance {
    pub id: u32,
    /// `NVML_COMPUTE_INSTANCE_PROFILE_*`.
    pub profile_id: u32,
    pub uuid: String,
}

const SCHEMA: u32 = 1;
/// GPU instance ids run 0..=14 (mig-minors lists gi0..gi14).
const MAX_GPU_INSTANCE_ID: u32 = 14;

#[derive(Clone)]
enum Store {
    File(PathBuf),
    Memory(Arc<Mutex<Option<SimState>>>),
}

/// One version of a state file (see [`SimNode::state_stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateStamp {
    inode: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl StateStamp {
    /// Whether the file was written long enough ago that any later version has a later time;
    /// only such a stamp can stand for its contents.
    pub fn settled(&self) -> bool {
        const CLOCK_TICK_MARGIN: Duration = Duration::from_millis(50);
        self.modified
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age >= CLOCK_TICK_MARGIN)
    }
}

/// A simulated node. Clones share the hardware (the same file or memory).
#[derive(Clone)]
pub struct SimNode {
    spec: SimSpec,
    node_name: String,
    store: Store,
    /// How long a GPU instance create or destroy takes, as real ones take up to seconds; spent
    /// outside the state lock, so operations on different GPUs overlap as they do on hardware.
    mig_delay: std::time::Duration,
    /// The driver root's `nvidia-smi`, where given: the time-slice interval is set through it,
    /// as on a real node (it changes this state file).
    nvidia_smi: Option<super::driver_tools::NvidiaSmi>,
    /// This process's stand-in for an NVML session (see [`SimNode::with_session`]).
    session: Option<Arc<SessionGate<SimSession>>>,
    /// The state file as this process last read or wrote it, for reads of an unchanged file.
    read_cache: ReadCache,
}

/// The last state read from (or written to) the file, with the file's stamp then.
type ReadCache = Arc<Mutex<Option<(StateStamp, Arc<SimState>)>>>;

/// What an NVML session is to the kernel, for a process that uses the simulator in its place:
/// while open, this process holds every GPU on `nvidia` (as enumerated when it opened).
pub struct SimSession {
    node: SimNode,
}

impl SimSession {
    const HOLDER: &'static str = "gpu-dra (NVML session)";

    fn open(node: &SimNode) -> Result<Self, GpuError> {
        let node = SimNode {
            session: None,
            ..node.clone()
        };
        let all = (0..node.spec.gpu_count()).collect();
        node.hold(&all, &SimHolder::this_process(Self::HOLDER))?;
        Ok(Self { node })
    }
}

impl Drop for SimSession {
    fn drop(&mut self) {
        if let Err(error) = self.node.release_holds(std::process::id(), Self::HOLDER) {
            tracing::warn!(%error, "cannot record the simulated NVML session's end");
        }
    }
}

impl SimNode {
    /// `state`: the state file; `None` keeps state in memory for this process only.
    pub fn new(spec: SimSpec, node_name: &str, state: Option<PathBuf>) -> Self {
        let store = match state {
            Some(path) => Store::File(path),
            None => Store::Memory(Arc::new(Mutex::new(None))),
        };
        Self {
            spec,
            node_name: node_name.to_string(),
            store,
            mig_delay: std::time::Duration::ZERO,
            nvidia_smi: None,
            session: None,
            read_cache: ReadCache::default(),
        }
    }

    /// This process holds the GPUs open as an NVML session does (opened now; see
    /// [`SimSession`]), so that the simulated kernel holds an unbind until it is closed
    /// ([`GpuControl::close_session`](super::GpuControl::close_session)).
    pub fn with_session(mut self) -> Result<Self, GpuError> {
        let session = SimSession::open(&self)?;
        self.session = Some(Arc::new(SessionGate::opened(session)));
        Ok(self)
    }

    /// A lease on this process's session, opening it again after a close; `None` without one.
    pub fn lease(&self) -> Result<Option<Lease<SimSession>>, GpuError> {
        self.session
            .as_ref()
            .map(|gate| gate.lease(|| SimSession::open(self)))
            .transpose()
    }

    /// Closes this process's session (see [`SessionGate::close`]).
    pub fn close_session(
        &self,
        within: Duration,
    ) -> Result<Option<super::session::Closed<'_, SimSession>>, GpuError> {
        let Some(gate) = &self.session else {
            return Ok(None);
        };
        gate.close(within).map(Some).map_err(|busy| GpuError::Nvml {
            operation: "close the simulated NVML session".into(),
            reason: format!(
                "{} of this driver's own calls did not end within {}s",
                busy.leases,
                busy.waited.as_secs()
            ),
        })
    }

    /// Time-slice intervals are set with this `nvidia-smi` (the fake one of a fake driver root).
    pub fn with_nvidia_smi(mut self, smi: Option<super::driver_tools::NvidiaSmi>) -> Self {
        self.nvidia_smi = smi;
        self
    }

    /// Why time-slice intervals cannot be set: the driver root's `nvidia-smi` cannot run there
    /// (without one the simulator sets them itself).
    pub fn timeslice_unavailable(&self) -> Option<String> {
        self.nvidia_smi
            .as_ref()
            .and_then(|smi| smi.unusable().map(str::to_string))
    }

    /// As a real node's driver does it: the compute mode directly, the time-slice interval with
    /// the driver root's `nvidia-smi` where there is one.
    pub fn set_sharing_settings_through_tools(
        &self,
        minor: u32,
        settings: SharingSettings,
    ) -> Result<(), GpuError> {
        let (Some(smi), Some(timeslice)) = (&self.nvidia_smi, settings.timeslice) else {
            return self.set_sharing_settings(minor, settings);
        };
        const OP: &str = "set the time-slice interval";
        let uuid = self
            .inventory()?
            .gpus
            .into_iter()
            .find(|g| g.minor == minor)
            .map(|g| g.uuid)
            .ok_or_else(|| sharing_err(minor, OP, "no such GPU"))?;
        self.set_sharing_settings(
            minor,
            SharingSettings {
                timeslice: None,
                ..settings
            },
        )?;
        smi.set_timeslice(&uuid, timeslice)
            .map_err(|reason| sharing_err(minor, OP, reason))
    }

    /// `nvmlDeviceSetMemoryLimits_v1` on a full GPU: the limits of the cgroup at `cgroup` (a
    /// cgroup v2 directory); [`MemoryLimit::NONE`] clears them.
    pub fn set_memory_limit(
        &self,
        minor: u32,
        cgroup: &Path,
        limit: MemoryLimit,
    ) -> Result<(), GpuError> {
        let model = self.model(minor, "set memory limits")?;
        let fail = |failure| memory_limit_err(minor, cgroup, failure);
        let id = cgroup_id(cgroup).ok_or_else(|| fail(MemoryLimitFailure::OperatingSystem))?;
        // Unified memory has no framebuffer to limit.
        let memory = model
            .memory_bytes()
            .ok_or_else(|| fail(MemoryLimitFailure::NotSupported))?;
        super::memory_limit::check(limit, memory).map_err(fail)?;
        self.write(|state| {
            let gpu = gpu_even_if_lost(state, minor)
                .ok_or_else(|| fail(MemoryLimitFailure::NotSupported))?;
            if gpu.lost {
                return Err(fail(MemoryLimitFailure::Lost));
            }
            if gpu.mig_current {
                return Err(fail(MemoryLimitFailure::NotSupported));
            }
            gpu.memory_limits.retain(|l| l.cgroup_id != id);
            if limit != MemoryLimit::NONE {
                gpu.memory_limits.push(SimMemoryLimit {
                    cgroup_id: id,
                    path: cgroup.display().to_string(),
                    limit,
                });
            }
            Ok(())
        })
    }

    /// `nvmlDeviceGetMemoryLimits_v1`: the limits of the cgroup at `cgroup`, `None` when it has
    /// none on this GPU.
    pub fn memory_limit(&self, minor: u32, cgroup: &Path) -> Result<Option<MemoryLimit>, GpuError> {
        self.model(minor, "get memory limits")?;
        let fail = |failure| memory_limit_err(minor, cgroup, failure);
        let id = cgroup_id(cgroup).ok_or_else(|| fail(MemoryLimitFailure::OperatingSystem))?;
        self.read(|state| {
            let gpu = state
                .gpus
                .iter()
                .find(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
                .ok_or_else(|| fail(MemoryLimitFailure::NotSupported))?;
            if gpu.lost {
                return Err(fail(MemoryLimitFailure::Lost));
            }
            if gpu.mig_current {
                return Err(fail(MemoryLimitFailure::NotSupported));
            }
            Ok(gpu
                .memory_limits
                .iter()
                .find(|l| l.cgroup_id == id)
                .map(|l| l.limit))
        })
    }

    /// GPU instance creates and destroys take `delay` (`gpu-dra run --sim-mig-delay`).
    pub fn with_mig_delay(mut self, delay: std::time::Duration) -> Self {
        self.mig_delay = delay;
        self
    }

    /// What a GPU instance create or destroy on GPU `minor` waits for: the configured delay, and
    /// a stalled GPU (see [`SimGpuState::stalled`]) for as long as it is stalled.
    fn mig_work_takes_time(&self, minor: u32) {
        if !self.mig_delay.is_zero() {
            std::thread::sleep(self.mig_delay);
        }
        while self
            .read(|state| Ok(state.gpus.iter().any(|g| g.minor == minor && g.stalled)))
            .unwrap_or(false)
        {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Stalls a GPU's MIG calls (`gpu-dra sim stall`), or lets them go on.
    pub fn set_stalled(&self, minor: u32, stalled: bool) -> Result<(), GpuError> {
        self.write(|state| {
            // Lost or not: a test sets it around faults.
            let gpu = state
                .gpus
                .iter_mut()
                .find(|g| g.minor == minor)
                .ok_or_else(|| mig_err(minor, "stall", MigFailure::NotFound, "no such GPU"))?;
            gpu.stalled = stalled;
            Ok(())
        })
    }

    /// The state file, when the state is kept in one.
    pub fn state_file(&self) -> Option<&Path> {
        match &self.store {
            Store::File(path) => Some(path),
            Store::Memory(_) => None,
        }
    }

    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// What discovery sees now.
    pub fn inventory(&self) -> Result<NodeInventory, GpuError> {
        self.read(|state| Ok(self.inventory_of(state)))
    }

    /// Current state, for inspection (tests, `demo`).
    pub fn state(&self) -> Result<SimState, GpuError> {
        self.read(|state| Ok(state.clone()))
    }

    /// `nvmlDeviceSetMigMode`. Hopper and newer switch at once; Ampere only sets the pending mode
    /// until [`reset_gpu`](Self::reset_gpu). Disabling with instances present is refused.
    pub fn sharing_settings(&self, minor: u32) -> Result<SharingSettings, GpuError> {
        self.model(minor, "read compute mode")?;
        self.read(|state| {
            let gpu = state
                .gpus
                .iter()
                .find(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
                .ok_or_else(|| sharing_err(minor, "read compute mode", "no such GPU"))?;
            Ok(SharingSettings {
                compute_mode: gpu.compute_mode,
                timeslice: Some(gpu.timeslice),
            })
        })
    }

    /// As NVML and `nvidia-smi compute-policy` do: refused in MIG mode (compute modes and
    /// time-slices belong to full GPUs) and for an interval outside 0–3.
    pub fn set_sharing_settings(
        &self,
        minor: u32,
        settings: SharingSettings,
    ) -> Result<(), GpuError> {
        const OP: &str = "set compute mode and time-slice";
        self.model(minor, OP)?;
        self.write(|state| {
            let gpu = gpu_even_if_lost(state, minor)
                .ok_or_else(|| sharing_err(minor, OP, "no such GPU"))?;
            if gpu.lost {
                return Err(sharing_err(minor, OP, "GPU is lost"));
            }
            if gpu.mig_current {
                return Err(sharing_err(minor, OP, "not supported in MIG mode"));
            }
            if let Some(timeslice) = settings.timeslice {
                if timeslice > 3 {
                    return Err(sharing_err(
                        minor,
                        OP,
                        format!("time-slice {timeslice} is not one of 0-3"),
                    ));
                }
                gpu.timeslice = timeslice;
            }
            gpu.compute_mode = settings.compute_mode;
            Ok(())
        })
    }

    /// Records a started MPS daemon (one per pipe folder); its devices must be this node's GPUs
    /// or existing MIG devices, as `CUDA_VISIBLE_DEVICES` must name devices that exist.
    pub fn mps_started(&self, daemon: SimMpsDaemon) -> Result<(), GpuError> {
        let inventory = self.inventory()?;
        for device in &daemon.devices {
            let exists = inventory.gpus.iter().any(|g| {
                g.uuid == *device
                    || g.mig
                        .iter()
                        .flat_map(|m| m.instances.iter())
                        .any(|i| i.uuid == *device)
            });
            if !exists {
                return Err(GpuError::State {
                    path: PathBuf::from(&daemon.pipe_directory),
                    reason: format!("MPS daemon for {device}: no such GPU or MIG device"),
                });
            }
        }
        self.write(|state| {
            state
                .mps_daemons
                .retain(|d| d.pipe_directory != daemon.pipe_directory);
            state.mps_daemons.push(daemon);
            Ok(())
        })
    }

    /// Changes what the MPS daemon of `pipe_directory` was told.
    pub fn mps_updated(
        &self,
        pipe_directory: &str,
        change: impl FnOnce(&mut SimMpsDaemon),
    ) -> Result<(), GpuError> {
        self.write(|state| {
            if let Some(daemon) = state
                .mps_daemons
                .iter_mut()
                .find(|d| d.pipe_directory == pipe_directory)
            {
                change(daemon);
            }
            Ok(())
        })
    }

    /// Forgets the MPS daemon of `pipe_directory` (it quit).
    pub fn mps_stopped(&self, pipe_directory: &str) -> Result<(), GpuError> {
        self.write(|state| {
            state
                .mps_daemons
                .retain(|d| d.pipe_directory != pipe_directory);
            Ok(())
        })
    }

    pub fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        let model = self.model(minor, "set MIG mode")?;
        self.write(|state| {
            let gpu = gpu_state(state, minor, "set MIG mode")?;
            if model.mig.is_none() {
                return Err(mig_err(
                    minor,
                    "set MIG mode",
                    MigFailure::NotSupported,
                    "not MIG-capable",
                ));
            }
            if !enabled && !gpu.gpu_instances.is_empty() {
                return Err(mig_err(
                    minor,
                    "set MIG mode",
                    MigFailure::InUse,
                    "GPU instances exist",
                ));
            }
            gpu.mig_pending = enabled;
            if model.architecture.toggles_mig_without_reset() {
                gpu.mig_current = enabled;
            }
            Ok(MigMode {
                current: gpu.mig_current,
                pending: gpu.mig_pending,
            })
        })
    }

    /// A GPU reset: applies a pending MIG mode.
    pub fn reset_gpu(&self, minor: u32) -> Result<(), GpuError> {
        self.write(|state| {
            let gpu = gpu_state(state, minor, "reset")?;
            if !gpu.gpu_instances.is_empty() {
                return Err(mig_err(
                    minor,
                    "reset",
                    MigFailure::InUse,
                    "GPU instances exist",
                ));
            }
            gpu.mig_current = gpu.mig_pending;
            Ok(())
        })
    }

    /// Binds a GPU's PCI function to another kernel driver, as writing `driver_override`,
    /// `unbind` and `drivers_probe` in sysfs does. Leaving `nvidia` needs the GPU idle (no MIG
    /// device, no MPS daemon, not lost: NVIDIA's module refuses to let go of a GPU in use);
    /// coming back to it initializes the GPU as a reset does (instances, compute mode,
    /// time-slice and memory limits gone; a pending MIG mode applied).
    pub fn bind_driver(&self, minor: u32, driver: PciDriver) -> Result<(), GpuError> {
        const OP: &str = "bind the PCI function";
        self.model(minor, OP)?;
        if driver != PciDriver::Nvidia {
            self.unbind_waits_for_holders(minor)?;
        }
        self.write(|state| {
            let uuid = gpu_uuid(&self.node_name, minor);
            let daemons = state.mps_daemons.iter().any(|d| d.devices.contains(&uuid));
            let gpu = state
                .gpus
                .iter_mut()
                .find(|g| g.minor == minor)
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotFound, "no such GPU"))?;
            if gpu.driver == driver {
                return Ok(());
            }
            if gpu.driver == PciDriver::Nvidia {
                let busy = if gpu.lost {
                    Some("the GPU is lost")
                } else if !gpu.gpu_instances.is_empty() {
                    Some("MIG devices exist on it")
                } else if daemons {
                    Some("an MPS daemon uses it")
                } else {
                    None
                };
                if let Some(reason) = busy {
                    return Err(mig_err(minor, OP, MigFailure::InUse, reason));
                }
                // Off `nvidia` there is no device file to hold (the unbind waited for them).
                gpu.holders.clear();
                gpu.persistence = false;
            } else {
                gpu.gpu_instances.clear();
                gpu.mig_current = gpu.mig_pending;
                gpu.compute_mode = ComputeMode::Default;
                gpu.timeslice = 0;
                gpu.volatile_dbe = 0;
                gpu.recovery_action = 0;
                gpu.memory_limits.clear();
                gpu.processes.clear();
            }
            gpu.driver = driver;
            Ok(())
        })
    }

    /// The kernel's `nv_pci_remove`: an unbind from `nvidia` sleeps until nothing holds the GPU
    /// open. It is recorded in [`SimState::stuck_unbinds`] and waited out here for at most
    /// [`UNBIND_STUCK_LIMIT`] (a real kernel waits forever), then fails.
    fn unbind_waits_for_holders(&self, minor: u32) -> Result<(), GpuError> {
        let on_nvidia = |state: &SimState| {
            state
                .gpus
                .iter()
                .any(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
        };
        let (held, leaving) =
            self.read(|state| Ok((self.holders_in(state, minor), on_nvidia(state))))?;
        if held.is_empty() || !leaving {
            return Ok(());
        }
        let what = format!(
            "GPU {minor}: unbind from nvidia while held open by {}",
            super::holders::describe(&held)
        );
        tracing::error!(
            gpu = minor,
            "simulated kernel: {what}; the unbind waits until they close it"
        );
        self.write(|state| {
            state.stuck_unbinds.push(what.clone());
            Ok(())
        })?;
        let started = std::time::Instant::now();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let held = self.read(|state| Ok(self.holders_in(state, minor)))?;
            if held.is_empty() {
                return Ok(());
            }
            if started.elapsed() >= UNBIND_STUCK_LIMIT {
                return Err(mig_err(
                    minor,
                    "bind the PCI function",
                    MigFailure::InUse,
                    &format!(
                        "the simulated kernel's unbind waited {}s for {} to close the GPU (a real kernel waits forever)",
                        UNBIND_STUCK_LIMIT.as_secs(),
                        super::holders::describe(&held)
                    ),
                ));
            }
        }
    }

    /// Who holds the GPU open now: live processes, and persistence mode.
    fn holders_in(&self, state: &SimState, minor: u32) -> Vec<super::holders::GpuHolder> {
        let Some(gpu) = state.gpus.iter().find(|g| g.minor == minor) else {
            return vec![];
        };
        let mut held: Vec<_> = gpu
            .holders
            .iter()
            .filter(|h| h.alive())
            .map(|h| super::holders::GpuHolder {
                pid: Some(h.pid),
                name: h.name.clone(),
            })
            .collect();
        if gpu.persistence {
            held.push(super::holders::GpuHolder {
                pid: None,
                name: "persistence mode".into(),
            });
        }
        held
    }

    /// Who holds the GPU open (see [`SimGpuState::holders`]).
    pub fn holders(&self, minor: u32) -> Result<Vec<super::holders::GpuHolder>, GpuError> {
        self.read(|state| Ok(self.holders_in(state, minor)))
    }

    /// Records `holder` as holding the GPUs in `minors` open (those bound to `nvidia`; a GPU on
    /// another driver has no `nvidia` device file).
    pub fn hold(&self, minors: &BTreeSet<u32>, holder: &SimHolder) -> Result<Vec<u32>, GpuError> {
        self.write(|state| {
            let mut held = vec![];
            for gpu in state
                .gpus
                .iter_mut()
                .filter(|g| minors.contains(&g.minor) && g.driver == PciDriver::Nvidia)
            {
                gpu.holders
                    .retain(|h| (h.pid, &h.name) != (holder.pid, &holder.name));
                gpu.holders.push(holder.clone());
                held.push(gpu.minor);
            }
            Ok(held)
        })
    }

    /// The process `pid` closed every GPU it held as `name`.
    pub fn release_holds(&self, pid: u32, name: &str) -> Result<(), GpuError> {
        self.write(|state| {
            for gpu in &mut state.gpus {
                gpu.holders
                    .retain(|h| (h.pid, h.name.as_str()) != (pid, name));
            }
            Ok(())
        })
    }

    /// Persistence mode of a GPU.
    pub fn persistence(&self, minor: u32) -> Result<bool, GpuError> {
        self.read(|state| Ok(state.gpus.iter().any(|g| g.minor == minor && g.persistence)))
    }

    /// Turns persistence mode on or off (NVML's `nvmlDeviceSetPersistenceMode`).
    pub fn set_persistence(&self, minor: u32, enabled: bool) -> Result<(), GpuError> {
        const OP: &str = "set persistence mode";
        self.write(|state| {
            let gpu = gpu_state(state, minor, OP)?;
            if gpu.driver != PciDriver::Nvidia {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::NotFound,
                    "the GPU is not on nvidia",
                ));
            }
            gpu.persistence = enabled;
            Ok(())
        })
    }

    /// The kernel driver each GPU is bound to, by minor.
    pub fn drivers(&self) -> Result<Vec<(u32, PciDriver)>, GpuError> {
        self.read(|state| Ok(state.gpus.iter().map(|g| (g.minor, g.driver)).collect()))
    }

    /// Lays out this node's sysfs under `root` as the kernel would show it now (the bindings
    /// included); see [`render_sysfs`].
    pub fn write_sysfs(&self, root: &Path) -> Result<(), GpuError> {
        let drivers = self.drivers()?;
        render_sysfs(root, &drivers, |index| {
            self.spec
                .models()
                .nth(index as usize)
                .map(|m| m.pci_device_id)
        })
        .map_err(|e| GpuError::State {
            path: root.to_path_buf(),
            reason: format!("writing the simulated sysfs: {e}"),
        })
    }

    /// Writes the simulated kernel's `modules.alias` ([`sim_modules_alias`]) where
    /// [`crate::gpu::pci::VfioAliases::read`] looks under `modules_root` (the running kernel's
    /// release folder).
    pub fn write_modules(modules_root: &Path) -> Result<(), GpuError> {
        let failed = |reason: String| GpuError::State {
            path: modules_root.to_path_buf(),
            reason,
        };
        let release = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_err(|e| failed(format!("the kernel's release: {e}")))?;
        let dir = modules_root.join(release.trim());
        fs::create_dir_all(&dir)
            .and_then(|()| fs::write(dir.join("modules.alias"), sim_modules_alias()))
            .map_err(|e| failed(format!("writing modules.alias: {e}")))
    }

    /// Raises a fault on a GPU, or resets it (see [`SimFault`]).
    pub fn inject(&self, minor: u32, fault: SimFault) -> Result<(), GpuError> {
        const OP: &str = "inject";
        self.model(minor, OP)?;
        self.write(|state| {
            let gpu = gpu_even_if_lost(state, minor)
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotFound, "no such GPU"))?;
            let event = match fault {
                SimFault::Xid {
                    code,
                    gpu_instance_id,
                    compute_instance_id,
                } => {
                    if RESET_REQUIRED_XIDS.contains(&code) {
                        gpu.recovery_action = RecoveryAction::GpuReset.nvml_value();
                    }
                    if code == 79 {
                        gpu.lost = true;
                    }
                    Some(GpuEvent {
                        minor,
                        kind: GpuEventKind::Xid { code },
                        gpu_instance_id,
                        compute_instance_id,
                    })
                }
                SimFault::EccDoubleBit { gpu_instance_id } => {
                    gpu.volatile_dbe += 1;
                    gpu.recovery_action = RecoveryAction::GpuReset.nvml_value();
                    Some(GpuEvent {
                        minor,
                        kind: GpuEventKind::DoubleBitEcc,
                        gpu_instance_id,
                        compute_instance_id: None,
                    })
                }
                SimFault::Lost => {
                    gpu.lost = true;
                    None
                }
                SimFault::Reset => {
                    gpu.lost = false;
                    gpu.volatile_dbe = 0;
                    gpu.recovery_action = 0;
                    gpu.gpu_instances.clear();
                    gpu.processes.clear();
                    gpu.mig_current = gpu.mig_pending;
                    None
                }
            };
            if let Some(event) = event {
                raise(state, event);
            }
            Ok(())
        })
    }

    /// Starts (`Some`) or ends (`None`) a simulated compute process `pid` on a GPU; a process on
    /// a MIG device names its GPU instance, which must exist.
    pub fn set_process(
        &self,
        minor: u32,
        pid: u32,
        process: Option<SimProcess>,
    ) -> Result<(), GpuError> {
        const OP: &str = "process";
        self.model(minor, OP)?;
        self.write(|state| {
            let gpu = gpu_even_if_lost(state, minor)
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotFound, "no such GPU"))?;
            gpu.processes.retain(|p| p.usage.pid != pid);
            if let Some(mut process) = process {
                process.usage.pid = pid;
                match process.usage.gpu_instance_id {
                    Some(gi) if !gpu.gpu_instances.iter().any(|g| g.id == gi) => {
                        return Err(mig_err(minor, OP, MigFailure::NotFound, &format!("no GPU instance {gi}")));
                    }
                    None if gpu.mig_current => {
                        return Err(mig_err(minor, OP, MigFailure::InvalidArgument, "the GPU is in MIG mode: a process runs on a GPU instance (--gpu-instance)"));
                    }
                    _ => {}
                }
                gpu.processes.push(process);
            }
            Ok(())
        })
    }

    /// The GPU's fabric info as NVML reports it: the node's, on models with multi-node NVLink
    /// (Grace Blackwell); none elsewhere.
    pub fn fabric(&self, minor: u32) -> Result<Option<FabricInfo>, GpuError> {
        let model = self.model(minor, "fabric info")?;
        if !multi_node_nvlink(model) {
            return Ok(None);
        }
        self.read(|state| {
            if state.gpus.iter().any(|g| g.minor == minor && g.lost) {
                return Err(GpuError::Nvml {
                    operation: format!("GPU {minor}: fabric info"),
                    reason: "GPU is lost".into(),
                });
            }
            Ok(Some(state.fabric.clone().unwrap_or_else(default_fabric)))
        })
    }

    /// Puts the node into another NVLink clique or fabric state (`gpu-dra sim fabric`).
    pub fn set_fabric(&self, fabric: FabricInfo) -> Result<(), GpuError> {
        self.write(|state| {
            state.fabric = Some(fabric);
            Ok(())
        })
    }

    /// The GPU's use as NVML reports it: the processes' memory and, outside MIG mode, their
    /// summed utilization.
    pub fn usage(&self, minor: u32) -> Result<super::usage::GpuUsage, GpuError> {
        self.read(|state| {
            let gpu = state
                .gpus
                .iter()
                .find(|g| g.minor == minor && !g.lost && g.driver == PciDriver::Nvidia)
                .ok_or_else(|| mig_err(minor, "usage", MigFailure::NotFound, "no such GPU"))?;
            Ok(super::usage::GpuUsage {
                memory_used_bytes: gpu
                    .processes
                    .iter()
                    .filter_map(|p| p.usage.memory_used_bytes)
                    .sum(),
                utilization_percent: (!gpu.mig_current).then(|| {
                    gpu.processes
                        .iter()
                        .map(|p| p.sm_percent)
                        .sum::<u32>()
                        .min(100)
                }),
                processes: gpu.processes.iter().map(|p| p.usage.clone()).collect(),
            })
        })
    }

    /// The liveness probe: lost or not, and the recovery action the driver asks for.
    pub fn probe(&self, minor: u32) -> Result<GpuProbe, GpuError> {
        self.read(|state| {
            let gpu = state
                .gpus
                .iter()
                .find(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
                .ok_or_else(|| mig_err(minor, "probe", MigFailure::NotFound, "no such GPU"))?;
            Ok(GpuProbe {
                lost: gpu.lost,
                recovery_action: Some(RecoveryAction::from_nvml(gpu.recovery_action)),
            })
        })
    }

    /// Events raised from now on, as an NVML event set delivers them.
    pub fn event_source(&self) -> Result<SimEventSource, GpuError> {
        let seen = self.read(|state| Ok(state.event_serial))?;
        // As NVML: a GPU registers if it answers now (a lost one cannot).
        let watched = self.inventory()?.gpus.iter().map(|g| g.minor).collect();
        Ok(SimEventSource {
            node: self.clone(),
            seen,
            watched,
            lease: self.lease()?,
            stamp: None,
        })
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`; returns the new GPU instance id.
    pub fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        const OP: &str = "create GPU instance";
        self.mig_work_takes_time(minor);
        let model = self.model(minor, OP)?;
        self.write(|state| {
            let gpu = gpu_state(state, minor, OP)?;
            let table = model
                .mig
                .as_ref()
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotSupported, "not MIG-capable"))?;
            if !gpu.mig_current {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::NotSupported,
                    "MIG mode is disabled",
                ));
            }
            let profile = table
                .profiles
                .iter()
                .find(|p| p.id == profile_id)
                .ok_or_else(|| {
                    mig_err(
                        minor,
                        OP,
                        MigFailure::InvalidArgument,
                        &format!("no profile id {profile_id}"),
                    )
                })?;
            if placement.size != profile.placement_size
                || !profile.placement_starts.contains(&placement.start)
            {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::InvalidArgument,
                    &format!(
                        "{}:{} is not a placement of profile {profile_id}",
                        placement.start, placement.size
                    ),
                ));
            }
            if let Some(other) = gpu
                .gpu_instances
                .iter()
                .find(|gi| gi.placement.overlaps(&placement))
            {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::InsufficientResources,
                    &format!("memory slices overlap GPU instance {}", other.id),
                ));
            }
            let same_profile = gpu
                .gpu_instances
                .iter()
                .filter(|gi| gi.profile_id == profile_id)
                .count();
            if same_profile >= profile.instance_count as usize {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::InsufficientResources,
                    &format!(
                        "profile {profile_id} allows {} instances",
                        profile.instance_count
                    ),
                ));
            }
            let id = gpu_instance_id(&gpu.gpu_instances, placement, table.memory_slices)
                .ok_or_else(|| {
                    mig_err(
                        minor,
                        OP,
                        MigFailure::InsufficientResources,
                        "no free GPU instance id",
                    )
                })?;
            gpu.gpu_instances.push(SimGpuInstance {
                id,
                profile_id,
                placement,
                compute_instances: vec![],
            });
            gpu.gpu_instances.sort_by_key(|gi| gi.id);
            raise(state, mig_config_change(minor));
            Ok(id)
        })
    }

    /// `nvmlGpuInstanceCreateComputeInstance` with the GI's full-size compute profile; returns the
    /// compute instance id and the MIG device UUID.
    pub fn create_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
    ) -> Result<(u32, String), GpuError> {
        const OP: &str = "create compute instance";
        let model = self.model(minor, OP)?;
        let gpu_uuid = gpu_uuid(&self.node_name, minor);
        self.write(|state| {
            state.uuid_serial += 1;
            let serial = state.uuid_serial;
            let gpu = gpu_state(state, minor, OP)?;
            let gi = gpu
                .gpu_instances
                .iter_mut()
                .find(|gi| gi.id == gpu_instance_id)
                .ok_or_else(|| {
                    mig_err(
                        minor,
                        OP,
                        MigFailure::NotFound,
                        &format!("no GPU instance {gpu_instance_id}"),
                    )
                })?;
            if !gi.compute_instances.is_empty() {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::InsufficientResources,
                    "the GPU instance is fully used",
                ));
            }
            let slices = model
                .mig
                .as_ref()
                .and_then(|t| t.profiles.iter().find(|p| p.id == gi.profile_id))
                .map(|p| p.slice_count)
                .unwrap_or(1);
            let uuid = mig_uuid(&gpu_uuid, serial);
            gi.compute_instances.push(SimComputeInstance {
                id: 0,
                profile_id: full_compute_profile(slices),
                uuid: uuid.clone(),
            });
            raise(state, mig_config_change(minor));
            Ok((0, uuid))
        })
    }

    /// `nvmlComputeInstanceDestroy`.
    pub fn destroy_compute_instance(
        &self,
        minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), GpuError> {
        const OP: &str = "destroy compute instance";
        self.write(|state| {
            let gpu = gpu_state(state, minor, OP)?;
            // NVML answers IN_USE while processes run in it.
            if gpu.processes.iter().any(|p| {
                p.usage.gpu_instance_id == Some(gpu_instance_id)
                    && p.usage.compute_instance_id == Some(compute_instance_id)
            }) {
                return Err(mig_err(minor, OP, MigFailure::InUse, "compute processes run in it"));
            }
            let gi = gpu
                .gpu_instances
                .iter_mut()
                .find(|gi| gi.id == gpu_instance_id)
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotFound, &format!("no GPU instance {gpu_instance_id}")))?;
            let before = gi.compute_instances.len();
            gi.compute_instances.retain(|ci| ci.id != compute_instance_id);
            if gi.compute_instances.len() == before {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::NotFound,
                    &format!("no compute instance {compute_instance_id} in GPU instance {gpu_instance_id}"),
                ));
            }
            raise(state, mig_config_change(minor));
            Ok(())
        })
    }

    /// `nvmlGpuInstanceDestroy`: refused while compute instances exist, as on real hardware.
    pub fn destroy_gpu_instance(&self, minor: u32, gpu_instance_id: u32) -> Result<(), GpuError> {
        const OP: &str = "destroy GPU instance";
        self.mig_work_takes_time(minor);
        self.write(|state| {
            let gpu = gpu_state(state, minor, OP)?;
            let index = gpu
                .gpu_instances
                .iter()
                .position(|gi| gi.id == gpu_instance_id)
                .ok_or_else(|| {
                    mig_err(
                        minor,
                        OP,
                        MigFailure::NotFound,
                        &format!("no GPU instance {gpu_instance_id}"),
                    )
                })?;
            if !gpu.gpu_instances[index].compute_instances.is_empty() {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::InUse,
                    "compute instances exist",
                ));
            }
            gpu.gpu_instances.remove(index);
            raise(state, mig_config_change(minor));
            Ok(())
        })
    }

    fn model(&self, minor: u32, operation: &'static str) -> Result<&'static SimModel, GpuError> {
        self.spec
            .models()
            .nth(minor as usize)
            .ok_or_else(|| mig_err(minor, operation, MigFailure::NotFound, "no such GPU"))
    }

    fn fresh_state(&self) -> SimState {
        SimState {
            schema: SCHEMA,
            node_name: self.node_name.clone(),
            spec: self.spec.to_string(),
            // Simulated hardware follows the host's boots when it can tell them apart.
            boot_id: super::boot_id().unwrap_or_default(),
            uuid_serial: 0,
            gpus: (0..self.spec.gpu_count())
                .map(|minor| SimGpuState {
                    minor,
                    mig_current: false,
                    mig_pending: false,
                    gpu_instances: vec![],
                    compute_mode: ComputeMode::Default,
                    timeslice: 0,
                    lost: false,
                    volatile_dbe: 0,
                    recovery_action: 0,
                    memory_limits: vec![],
                    driver: PciDriver::Nvidia,
                    processes: vec![],
                    holders: vec![],
                    persistence: false,
                    stalled: false,
                })
                .collect(),
            mps_daemons: vec![],
            events: vec![],
            event_serial: 0,
            fabric: None,
            stuck_unbinds: vec![],
        }
    }

    /// Checks a loaded state belongs to this node and applies a reboot if one happened.
    fn adopt(&self, mut state: SimState, path: &Path) -> Result<SimState, GpuError> {
        let spec = self.spec.to_string();
        if state.spec != spec || state.node_name != self.node_name {
            return Err(GpuError::State {
                path: path.to_path_buf(),
                reason: format!(
                    "it describes node {:?} with sim:{}, not node {:?} with sim:{spec}; use another --sim-state or remove it",
                    state.node_name, state.spec, self.node_name
                ),
            });
        }
        // A daemon that was killed is gone, as its process is.
        state
            .mps_daemons
            .retain(|d| Path::new(&format!("/proc/{}", d.pid)).exists());
        // So are the files a killed process held open.
        for gpu in &mut state.gpus {
            gpu.holders.retain(SimHolder::alive);
        }
        let boot = super::boot_id().unwrap_or_default();
        if state.boot_id != boot {
            // GPU and compute instances do not survive a reboot; MIG mode does.
            for gpu in &mut state.gpus {
                gpu.gpu_instances.clear();
                gpu.mig_current = gpu.mig_pending;
                gpu.compute_mode = ComputeMode::Default;
                gpu.timeslice = 0;
                // A reboot resets every GPU.
                gpu.lost = false;
                gpu.volatile_dbe = 0;
                gpu.recovery_action = 0;
                gpu.memory_limits.clear();
                gpu.processes.clear();
                gpu.holders.clear();
                gpu.persistence = false;
                gpu.stalled = false;
                // A binding made at run time (sysfs) is not made again at boot.
                gpu.driver = PciDriver::Nvidia;
            }
            // Nor do processes.
            state.mps_daemons.clear();
            state.boot_id = boot;
        }
        Ok(state)
    }

    /// Which version of the state file is there now (inode, length, modification time); `None`
    /// for state kept in memory. Every change is written to a new file renamed into place, so an
    /// unchanged stamp means an unchanged state: pollers (event waits) skip the lock and parse.
    pub fn state_stamp(&self) -> Option<StateStamp> {
        let Store::File(path) = &self.store else {
            return None;
        };
        let meta = fs::metadata(path).ok()?;
        use std::os::unix::fs::MetadataExt;
        Some(StateStamp {
            inode: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }

    fn read<R>(&self, f: impl FnOnce(&SimState) -> Result<R, GpuError>) -> Result<R, GpuError> {
        if let Some(state) = self.unchanged_state() {
            return f(&state);
        }
        self.with_state(false, |s| f(s))
    }

    /// Whether reading `state` from its file again would give it unchanged: the same boot, its
    /// MPS daemons and the processes holding GPUs still alive.
    pub fn adopted_as_is(state: &SimState) -> bool {
        state.boot_id == super::boot_id().unwrap_or_default()
            && state
                .mps_daemons
                .iter()
                .all(|d| Path::new(&format!("/proc/{}", d.pid)).exists())
            && {
                // One look per process (a session holds every GPU).
                let processes: BTreeSet<(u32, u64)> = state
                    .gpus
                    .iter()
                    .flat_map(|g| g.holders.iter().map(|h| (h.pid, h.start_time)))
                    .collect();
                processes
                    .into_iter()
                    .all(|(pid, start_time)| process_start_time(pid) == Some(start_time))
            }
    }

    /// The state as last read, where the file is the same one and reading it again would change
    /// nothing (its processes and holders alive, the same boot): the fake libnvidia-ml reads the
    /// state at every call, as often as a driver polls, and a real NVML call costs an ioctl, not
    /// a parse of the whole node.
    fn unchanged_state(&self) -> Option<Arc<SimState>> {
        let stamp = self.state_stamp()?;
        let state = {
            let guard = self.read_cache.lock().ok()?;
            let (cached, state) = guard.as_ref()?;
            (*cached == stamp).then(|| Arc::clone(state))?
        };
        Self::adopted_as_is(&state).then_some(state)
    }

    fn write<R>(
        &self,
        f: impl FnOnce(&mut SimState) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        self.with_state(true, f)
    }

    fn with_state<R>(
        &self,
        persist: bool,
        f: impl FnOnce(&mut SimState) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        match &self.store {
            Store::Memory(cell) => {
                let mut guard = cell.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let state = guard.get_or_insert_with(|| self.fresh_state());
                // Work on a copy so a refused operation changes nothing.
                let mut next = state.clone();
                let result = f(&mut next)?;
                *state = next;
                Ok(result)
            }
            Store::File(path) => {
                let _lock = StateLock::acquire(path)?;
                let mut state = match fs::read(path) {
                    Ok(bytes) => {
                        let loaded: SimState = serde_json::from_slice(&bytes)
                            .map_err(|e| state_err(path, format!("cannot parse: {e}")))?;
                        self.adopt(loaded, path)?
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.fresh_state(),
                    Err(e) => return Err(state_err(path, format!("cannot read: {e}"))),
                };
                let before = state.clone();
                let result = f(&mut state)?;
                if persist || state != before || !path.exists() {
                    write_atomically(path, &state)?;
                }
                // Still under the lock: the stamp is that of the file holding `state`. A file
                // written just now is not kept: a later version could reuse its inode and length
                // within the file system's coarse clock tick and look the same.
                if let (Some(stamp), Ok(mut cache)) = (self.state_stamp(), self.read_cache.lock()) {
                    *cache = stamp.settled().then(|| (stamp, Arc::new(state)));
                }
                Ok(result)
            }
        }
    }

    fn inventory_of(&self, state: &SimState) -> NodeInventory {
        let mut gpus: Vec<Gpu> = self
            .spec
            .models()
            .enumerate()
            .filter_map(|(index, model)| {
                let minor = index as u32;
                let gpu_state = state.gpus.iter().find(|g| g.minor == minor);
                // NVML sees only GPUs bound to NVIDIA's kernel module.
                if gpu_state.is_some_and(|g| g.driver != PciDriver::Nvidia) {
                    return None;
                }
                Some(sim_gpu(model, minor, &self.node_name, gpu_state))
            })
            .collect();
        // NVML's indexes count the GPUs it sees.
        for (index, gpu) in gpus.iter_mut().enumerate() {
            gpu.index = index as u32;
        }
        NodeInventory {
            driver_version: catalog::SIM_DRIVER_VERSION.to_string(),
            cuda_driver_version: cuda_version(catalog::SIM_CUDA_DRIVER_VERSION),
            gpus,
            pci: self.pci_view(state),
        }
    }

    /// What [`crate::gpu::pci::scan`] finds in this node's sysfs ([`render_sysfs`]).
    fn pci_view(&self, state: &SimState) -> crate::gpu::pci::PciView {
        let gpus = self
            .spec
            .models()
            .enumerate()
            .map(|(index, model)| {
                let index = index as u32;
                let (bus_id, pcie_root, numa_node) = sim_pci_location(index);
                let driver = state
                    .gpus
                    .iter()
                    .find(|g| g.minor == index)
                    .map_or(PciDriver::Nvidia, |g| g.driver);
                crate::gpu::pci::PciGpu {
                    index,
                    bus_id,
                    vendor_id: crate::gpu::pci::NVIDIA_VENDOR,
                    device_id: (model.pci_device_id >> 16) as u16,
                    driver: Some(sim_driver_name(driver, model.pci_device_id)),
                    iommu_group: Some(sim_iommu_group(index)),
                    group_peers: vec![],
                    numa_node: Some(numa_node),
                    pcie_root: Some(pcie_root),
                    // render_sysfs's BARs: 128 GiB + 32 MiB.
                    addressable_memory: 256 << 30,
                    vfio_cdev: (driver == PciDriver::VfioPci).then(|| format!("vfio{index}")),
                    vfio_driver: sim_driver_name(PciDriver::VfioPci, model.pci_device_id),
                    vfio_driver_loaded: true,
                }
            })
            .collect();
        crate::gpu::pci::PciView {
            gpus,
            iommu: true,
            iommufd: false,
        }
    }

    /// Binds the GPU at PCI address `bus_id` to `driver` (see [`bind_driver`](Self::bind_driver)).
    pub fn bind_pci(&self, bus_id: &str, driver: PciDriver) -> Result<(), GpuError> {
        let index = (0..self.spec.models().count() as u32)
            .find(|&i| sim_pci_location(i).0 == bus_id)
            .ok_or_else(|| {
                GpuError::Pci(crate::gpu::pci::PciError::Bind {
                    bus_id: bus_id.to_string(),
                    reason: "no such simulated GPU".into(),
                })
            })?;
        self.bind_driver(index, driver)
    }
}

/// How long the simulated kernel lets an unbind of a held GPU wait before failing it (a real one
/// waits forever; the simulation must end).
pub const UNBIND_STUCK_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Polls the hardware state for events newer than the last one seen (the state file is shared
/// with `gpu-dra sim inject` and the fake libnvidia-ml).
pub struct SimEventSource {
    node: SimNode,
    seen: u64,
    watched: Vec<u32>,
    /// Keeps this process's session open while events are awaited (see [`SimSession`]).
    lease: Option<Lease<SimSession>>,
    /// The state file as last read: an unchanged file holds no new event.
    stamp: Option<StateStamp>,
}

/// How often [`SimEventSource`] looks at the state while waiting.
const EVENT_POLL: Duration = Duration::from_millis(100);

impl GpuEventSource for SimEventSource {
    fn watched(&self) -> Vec<u32> {
        self.watched.clone()
    }

    fn wait(&mut self, timeout: Duration) -> Result<Vec<GpuEvent>, GpuError> {
        let deadline = Instant::now() + timeout;
        // As an NVML event set: it keeps the session open, so it is given back while the
        // session closes and taken again after.
        if let Some(gate) = &self.node.session {
            if gate.closing() {
                self.lease = None;
                std::thread::sleep(timeout);
                return Ok(vec![]);
            }
            if self.lease.is_none() {
                self.lease = self.node.lease()?;
            }
        }
        loop {
            let stamp = self.node.state_stamp();
            if stamp.is_some() && stamp == self.stamp {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(vec![]);
                }
                std::thread::sleep(EVENT_POLL.min(deadline - now));
                continue;
            }
            self.stamp = stamp.filter(StateStamp::settled);
            let seen = self.seen;
            let (serial, events) = self.node.read(|state| {
                let events = state
                    .events
                    .iter()
                    .filter(|e| e.serial > seen)
                    .map(|e| e.event)
                    .collect::<Vec<_>>();
                Ok((state.event_serial, events))
            })?;
            // A reboot empties the list and restarts the numbering.
            self.seen = serial;
            if !events.is_empty() {
                return Ok(events);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(vec![]);
            }
            std::thread::sleep(EVENT_POLL.min(deadline - now));
        }
    }
}

/// NVML's CUDA driver version integer (`12040`) as major.minor.
pub fn cuda_version(encoded: i32) -> Version2 {
    let encoded = encoded.max(0) as u32;
    Version2::new(encoded / 1000, (encoded % 1000) / 10)
}

/// PCI buses of an HGX baseboard's eight GPUs, repeated per PCI domain for larger fleets.
const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// Deterministic PCI placement of simulated GPU `index`: (bus id, PCIe root, NUMA node).
pub fn sim_pci_location(index: u32) -> (String, String, i64) {
    let domain = index / 8;
    let bus = HGX_BUSES[(index % 8) as usize];
    (
        format!("{domain:04x}:{bus:02x}:00.0"),
        format!("pci{domain:04x}:{:02x}", bus - 3),
        ((index % 8) / 4) as i64,
    )
}

/// Lays out the sysfs of `spec`'s simulated GPUs under `root`, every one bound to `nvidia`, so
/// NVML-backed discovery finds the same PCIe roots the simulator reports (see [`render_sysfs`]).
pub fn write_fake_sysfs(root: &Path, spec: &SimSpec) -> std::io::Result<()> {
    let gpus: Vec<(u32, PciDriver)> = (0..spec.gpu_count())
        .map(|i| (i, PciDriver::Nvidia))
        .collect();
    render_sysfs(root, &gpus, |index| {
        spec.models().nth(index as usize).map(|m| m.pci_device_id)
    })
}

/// The IOMMU group of a simulated GPU: one group per GPU, as on servers with ACS.
pub fn sim_iommu_group(index: u32) -> u32 {
    40 + index
}

/// Lays out, for GPUs `(index, driver)`, what the kernel shows of them in sysfs: the function's
/// folder under its PCIe root (`vendor`, `device`, `class`, `numa_node`, `driver_override`, the
/// `driver` and `iommu_group` links), `bus/pci/devices/<bdf>`, `bus/pci/drivers/<driver>/<bdf>`
/// with the drivers' `bind`/`unbind` files, and `kernel/iommu_groups/<group>/devices/<bdf>`.
/// `pci_id` gives a GPU's `device << 16 | vendor` (0x10de: NVIDIA's vendor id when unknown).
/// Run again after a binding changes: links are replaced.
pub fn render_sysfs(
    root: &Path,
    gpus: &[(u32, PciDriver)],
    pci_id: impl Fn(u32) -> Option<u32>,
) -> std::io::Result<()> {
    let link = |target: &str, at: &Path| -> std::io::Result<()> {
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent)?;
        }
        let _ = fs::remove_file(at);
        std::os::unix::fs::symlink(target, at)
    };
    for name in SIM_PCI_DRIVERS {
        let dir = root.join("bus/pci/drivers").join(name);
        fs::create_dir_all(&dir)?;
        for file in ["bind", "unbind", "new_id"] {
            if !dir.join(file).exists() {
                fs::write(dir.join(file), "")?;
            }
        }
    }
    if !root.join("bus/pci/drivers_probe").exists() {
        fs::write(root.join("bus/pci/drivers_probe"), "")?;
    }
    for &(index, driver) in gpus {
        let (bus_id, pcie_root, numa_node) = sim_pci_location(index);
        let domain = &bus_id[..4];
        let bridge = format!("{domain}:{}:01.0", &pcie_root[pcie_root.len() - 2..]);
        let function = format!("devices/{pcie_root}/{bridge}/{bus_id}");
        let folder = root.join(&function);
        fs::create_dir_all(&folder)?;
        let id = pci_id(index).unwrap_or(0x10DE);
        let bound = sim_driver_name(driver, id);
        for (file, value) in [
            ("vendor", format!("0x{:04x}", id & 0xFFFF)),
            ("device", format!("0x{:04x}", id >> 16)),
            // A 3D controller: NVIDIA's data-center GPUs.
            ("class", "0x030200".to_string()),
            ("numa_node", numa_node.to_string()),
            ("modalias", sim_modalias(id)),
        ] {
            fs::write(folder.join(file), format!("{value}\n"))?;
        }
        // An H100's BARs: 16 MiB of registers (32-bit), 128 GiB and 32 MiB 64-bit windows.
        let base = 0x2200_0000_0000_u64 + u64::from(index) * 0x40_0000_0000;
        let bars = [
            (0xe200_0000_u64, 16 << 20, 0x0004_0200_u64),
            (base, 128 << 30, 0x0014_220c),
            (0, 0, 0),
            (base + (128 << 30), 32 << 20, 0x0014_220c),
        ];
        let resource: String = bars
            .iter()
            .map(|&(start, size, flags)| {
                let end = if size == 0 { 0 } else { start + size - 1 };
                format!("0x{start:016x} 0x{end:016x} 0x{flags:016x}\n")
            })
            .collect();
        fs::write(folder.join("resource"), resource)?;
        // The iommufd cdev of a function bound to vfio-pci.
        let _ = fs::remove_dir_all(folder.join("vfio-dev"));
        if driver == PciDriver::VfioPci {
            fs::create_dir_all(folder.join(format!("vfio-dev/vfio{index}")))?;
        }
        let override_file = folder.join("driver_override");
        let wanted = match driver {
            PciDriver::Nvidia => "(null)".to_string(),
            PciDriver::VfioPci => bound.clone(),
        };
        fs::write(override_file, format!("{wanted}\n"))?;
        let group = sim_iommu_group(index);
        link(
            &format!("../../../../kernel/iommu_groups/{group}"),
            &folder.join("iommu_group"),
        )?;
        link(
            &format!("../../../../bus/pci/drivers/{bound}"),
            &folder.join("driver"),
        )?;
        link(
            &format!("../../../{function}"),
            &root.join("bus/pci/devices").join(&bus_id),
        )?;
        link(
            &format!("../../../../{function}"),
            &root.join(format!("kernel/iommu_groups/{group}/devices/{bus_id}")),
        )?;
        for name in SIM_PCI_DRIVERS {
            let at = root.join("bus/pci/drivers").join(name).join(&bus_id);
            if name == bound {
                link(&format!("../../../../{function}"), &at)?;
            } else {
                let _ = fs::remove_file(at);
            }
        }
    }
    Ok(())
}

/// `GPU-<uuid>` derived from node name and minor, stable across restarts.
pub fn gpu_uuid(node_name: &str, minor: u32) -> String {
    let id = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("gpu-dra-sim/{node_name}/{minor}").as_bytes(),
    );
    format!("GPU-{id}")
}

fn mig_uuid(gpu_uuid: &str, serial: u64) -> String {
    let id = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{gpu_uuid}/mig/{serial}").as_bytes(),
    );
    format!("MIG-{id}")
}

/// Profile-table rows of `model` as the device model's GI profiles.
pub fn sim_profiles(model: &SimModel) -> Vec<GiProfile> {
    let device_bytes = model.memory_mib << 20;
    let Some(table) = &model.mig else {
        return vec![];
    };
    let mut profiles: Vec<GiProfile> = table
        .profiles
        .iter()
        .filter_map(|row| {
            Some(GiProfile {
                name: profile_name(row.profile_enum, row.memory_mib, device_bytes)?,
                profile_enum: row.profile_enum,
                id: row.id,
                slice_count: row.slice_count,
                instance_count: row.instance_count,
                memory_mib: row.memory_mib,
                multiprocessors: row.multiprocessors,
                copy_engines: row.copy_engines,
                decoders: row.decoders,
                encoders: row.encoders,
                jpeg_engines: row.jpeg_engines,
                ofa_engines: row.ofa_engines,
                p2p_supported: false,
                placements: row
                    .placement_starts
                    .iter()
                    .map(|&start| Placement {
                        start,
                        size: row.placement_size,
                    })
                    .collect(),
            })
        })
        .collect();
    profiles.sort_by_key(|p| p.profile_enum);
    profiles
}

fn sim_gpu(model: &SimModel, index: u32, node_name: &str, state: Option<&SimGpuState>) -> Gpu {
    let minor = index;
    let (pci_bus_id, pcie_root, numa_node) = sim_pci_location(index);
    let mig = model.mig.as_ref().map(|table| {
        let mut instances: Vec<MigInstance> = state
            .map(|s| {
                s.gpu_instances
                    .iter()
                    .flat_map(|gi| {
                        gi.compute_instances.iter().map(move |ci| MigInstance {
                            gpu_instance_id: gi.id,
                            compute_instance_id: ci.id,
                            profile_id: gi.profile_id,
                            placement: gi.placement,
                            uuid: ci.uuid.clone(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        instances.sort_by_key(|i| (i.gpu_instance_id, i.compute_instance_id));
        MigInfo {
            mode: MigMode {
                current: state.is_some_and(|s| s.mig_current),
                pending: state.is_some_and(|s| s.mig_pending),
            },
            memory_slices: table.memory_slices,
            profiles: sim_profiles(model),
            instances,
        }
    });
    Gpu {
        index,
        minor,
        uuid: gpu_uuid(node_name, minor),
        product_name: model.product_name.to_string(),
        brand: catalog::brand_name(model.brand).to_string(),
        architecture: model.architecture,
        cuda_compute_capability: model.compute_capability,
        memory_bytes: model.memory_bytes(),
        pci_bus_id,
        pcie_root: Some(pcie_root),
        numa_node: Some(numa_node),
        addressing_mode: model.addressing_mode(),
        mig,
    }
}

/// The id the driver typically gives a GI at `placement` (7g → 0, halves → 1–2, quarters → 3–6,
/// eighths → 7–14 on 8-slice GPUs), or the lowest free id if that one is taken.
fn gpu_instance_id(
    existing: &[SimGpuInstance],
    placement: Placement,
    memory_slices: u32,
) -> Option<u32> {
    let taken = |id: u32| existing.iter().any(|gi| gi.id == id);
    let size = placement.size.max(1);
    let preferred = (memory_slices / size).saturating_sub(1) + placement.start / size;
    if preferred <= MAX_GPU_INSTANCE_ID && !taken(preferred) {
        return Some(preferred);
    }
    (0..=MAX_GPU_INSTANCE_ID).find(|&id| !taken(id))
}

/// `NVML_COMPUTE_INSTANCE_PROFILE_*` of the compute instance that spans `slices` compute slices.
pub fn full_compute_profile(slices: u32) -> u32 {
    match slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        6 => 6,
        7 => 4,
        8 => 5,
        _ => 0,
    }
}

/// A GPU's state whether or not it answers (faults and resets reach lost GPUs too).
/// A GPU bound to another kernel driver is not NVML's at all.
fn gpu_even_if_lost(state: &mut SimState, minor: u32) -> Option<&mut SimGpuState> {
    state
        .gpus
        .iter_mut()
        .find(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
}

fn gpu_state<'a>(
    state: &'a mut SimState,
    minor: u32,
    operation: &'static str,
) -> Result<&'a mut SimGpuState, GpuError> {
    state
        .gpus
        .iter_mut()
        .find(|g| g.minor == minor)
        .ok_or_else(|| mig_err(minor, operation, MigFailure::NotFound, "no such GPU"))
        .and_then(|gpu| {
            if gpu.driver != PciDriver::Nvidia {
                Err(unbound(minor, operation, gpu.driver))
            } else if gpu.lost {
                Err(mig_err(minor, operation, MigFailure::Lost, ""))
            } else {
                Ok(gpu)
            }
        })
}

/// NVML has no handle for a GPU another kernel driver holds.
fn unbound(minor: u32, operation: &'static str, driver: PciDriver) -> GpuError {
    mig_err(
        minor,
        operation,
        MigFailure::NotFound,
        &format!(
            "the GPU is bound to {}, not nvidia: NVML does not see it",
            driver.sysfs_name()
        ),
    )
}

fn mig_err(minor: u32, operation: &'static str, failure: MigFailure, detail: &str) -> GpuError {
    GpuError::Mig {
        minor,
        operation,
        failure,
        detail: detail.to_string(),
    }
}

fn state_err(path: &Path, reason: String) -> GpuError {
    GpuError::State {
        path: path.to_path_buf(),
        reason,
    }
}

/// An exclusive advisory lock on `<state>.lock`; the state file itself is replaced by rename, so
/// it cannot carry the lock.
struct StateLock(#[allow(dead_code)] File);

impl StateLock {
    fn acquire(state: &Path) -> Result<Self, GpuError> {
        if let Some(dir) = state.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)
                .map_err(|e| state_err(state, format!("cannot create directory: {e}")))?;
        }
        let mut lock_path = state.as_os_str().to_owned();
        lock_path.push(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| state_err(state, format!("cannot open lock file: {e}")))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| state_err(state, format!("cannot lock: {e}")))?;
        Ok(Self(file))
    }
}

/// Writes `value` as JSON to `path` so a crash leaves either the old or the new file: temp file,
/// fsync, rename, fsync of the directory.
pub fn write_atomically<T: Serialize>(path: &Path, value: &T) -> Result<(), GpuError> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| state_err(path, format!("cannot encode: {e}")))?;
    crate::fsutil::write_atomically(path, &bytes)
        .map_err(|e| state_err(path, format!("cannot write: {e}")))
}

impl SimState {
    /// Writes the state as `path` would hold it (tests build states by hand).
    pub fn save(&self, path: &Path) -> Result<(), GpuError> {
        write_atomically(path, self)
    }
}

fn memory_limit_err(minor: u32, cgroup: &Path, failure: MemoryLimitFailure) -> GpuError {
    GpuError::MemoryLimit {
        minor,
        cgroup: cgroup.to_path_buf(),
        failure,
    }
}

fn sharing_err(minor: u32, operation: &'static str, reason: impl Into<String>) -> GpuError {
    GpuError::Sharing {
        minor,
        operation,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100_node(n: u32, state: Option<PathBuf>) -> SimNode {
        SimNode::new(
            format!("sim:{n}xH100-SXM5-80GB").parse().expect("spec"),
            "n1",
            state,
        )
    }

    #[test]
    fn a_gpu_bound_to_vfio_pci_leaves_nvml_until_it_comes_back_initialized() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hw.json");
        let node = h100_node(3, Some(path.clone()));
        let exclusive = SharingSettings {
            compute_mode: ComputeMode::ExclusiveProcess,
            timeslice: None,
        };
        node.set_sharing_settings(1, exclusive).expect("set");
        node.bind_driver(1, PciDriver::VfioPci)
            .expect("to vfio-pci");
        let inventory = node.inventory().expect("inventory");
        let seen: Vec<(u32, u32)> = inventory.gpus.iter().map(|g| (g.minor, g.index)).collect();
        // NVML's indexes count only what it sees; minors stay.
        assert_eq!(seen, vec![(0, 0), (2, 1)]);
        let error = node
            .sharing_settings(1)
            .expect_err("no NVML handle")
            .to_string();
        assert!(error.contains("no such GPU"), "{error}");
        assert!(
            node.inject(1, SimFault::Lost).is_err(),
            "no NVML events from it"
        );
        // Another process sees the binding (the fake libnvidia-ml shares the state).
        let other = h100_node(3, Some(path.clone()));
        assert_eq!(other.inventory().expect("inventory").gpus.len(), 2);

        node.bind_driver(1, PciDriver::Nvidia).expect("back");
        assert_eq!(node.inventory().expect("inventory").gpus.len(), 3);
        assert_eq!(
            node.sharing_settings(1).expect("read").compute_mode,
            ComputeMode::Default,
            "initialized as by a reset"
        );

        // A binding made at run time does not survive a reboot.
        node.bind_driver(2, PciDriver::VfioPci)
            .expect("to vfio-pci");
        let mut state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("state")).expect("json");
        state["boot_id"] = "an earlier boot".into();
        std::fs::write(&path, state.to_string()).expect("write");
        assert_eq!(node.drivers().expect("drivers")[2], (2, PciDriver::Nvidia));
    }

    #[test]
    fn a_gpu_in_use_stays_with_nvidia() {
        let node = h100_node(1, None);
        node.set_mig_mode(0, true).expect("MIG on");
        let profile = node.inventory().expect("inventory").gpus[0]
            .mig
            .as_ref()
            .expect("mig")
            .profiles[0]
            .clone();
        node.create_gpu_instance(0, profile.id, profile.placements[0])
            .expect("carve");
        let error = node
            .bind_driver(0, PciDriver::VfioPci)
            .expect_err("in use")
            .to_string();
        assert!(error.contains("MIG devices exist"), "{error}");
        assert_eq!(
            node.drivers().expect("drivers"),
            vec![(0, PciDriver::Nvidia)]
        );
    }

    #[test]
    fn sysfs_shows_each_binding_as_the_kernel_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = h100_node(2, None);
        node.write_sysfs(dir.path()).expect("sysfs");
        node.bind_driver(1, PciDriver::VfioPci)
            .expect("to vfio-pci");
        node.write_sysfs(dir.path()).expect("sysfs again");
        let function = |index: u32| {
            dir.path()
                .join("bus/pci/devices")
                .join(sim_pci_location(index).0)
        };
        let driver = |index: u32| {
            std::fs::canonicalize(function(index).join("driver"))
                .expect("driver link resolves")
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        };
        assert_eq!(driver(0).as_deref(), Some("nvidia"));
        assert_eq!(driver(1).as_deref(), Some("vfio-pci"));
        let read = |index: u32, file: &str| {
            std::fs::read_to_string(function(index).join(file)).expect("file")
        };
        assert_eq!(read(1, "vendor"), "0x10de\n");
        assert_eq!(read(1, "device"), "0x2330\n");
        assert_eq!(read(1, "class"), "0x030200\n");
        assert_eq!(read(1, "driver_override"), "vfio-pci\n");
        assert_eq!(read(0, "driver_override"), "(null)\n");
        let group = std::fs::read_link(function(1).join("iommu_group")).expect("group link");
        let group = group
            .file_name()
            .expect("group")
            .to_string_lossy()
            .into_owned();
        assert_eq!(group, sim_iommu_group(1).to_string());
        let members: Vec<String> = std::fs::read_dir(
            dir.path()
                .join(format!("kernel/iommu_groups/{group}/devices")),
        )
        .expect("group devices")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
        assert_eq!(members, vec![sim_pci_location(1).0]);
        // The function is listed under its driver only.
        let bus_id = sim_pci_location(1).0;
        assert!(
            dir.path()
                .join("bus/pci/drivers/vfio-pci")
                .join(&bus_id)
                .exists()
        );
        assert!(
            !dir.path()
                .join("bus/pci/drivers/nvidia")
                .join(&bus_id)
                .exists()
        );
    }

    #[test]
    fn compute_mode_and_time_slice_behave_like_a_gpu() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hw.json");
        let node = h100_node(2, Some(path.clone()));
        let exclusive = SharingSettings {
            compute_mode: ComputeMode::ExclusiveProcess,
            timeslice: Some(2),
        };
        node.set_sharing_settings(0, exclusive).expect("set");
        assert_eq!(node.sharing_settings(0).expect("read"), exclusive);
        assert_eq!(
            node.sharing_settings(1).expect("read"),
            SharingSettings {
                compute_mode: ComputeMode::Default,
                timeslice: Some(0)
            }
        );
        let err = node
            .set_sharing_settings(
                0,
                SharingSettings {
                    timeslice: Some(4),
                    ..exclusive
                },
            )
            .expect_err("0-3 only");
        assert!(err.to_string().contains("not one of 0-3"), "{err}");
        node.set_mig_mode(1, true).expect("MIG on");
        let err = node
            .set_sharing_settings(1, exclusive)
            .expect_err("full GPUs only");
        assert!(err.to_string().contains("MIG mode"), "{err}");
        // Another process (a restarted driver) sees the same hardware; a reboot resets it.
        let again = h100_node(2, Some(path.clone()));
        assert_eq!(again.sharing_settings(0).expect("read"), exclusive);
        let mut state: SimState =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("parse");
        state.boot_id = "an earlier boot".into();
        std::fs::write(&path, serde_json::to_vec(&state).expect("json")).expect("write");
        let rebooted = h100_node(2, Some(path));
        assert_eq!(
            rebooted.sharing_settings(0).expect("read"),
            SharingSettings {
                compute_mode: ComputeMode::Default,
                timeslice: Some(0)
            }
        );
    }

    #[test]
    fn spec_parsing_and_errors() {
        let spec: SimSpec = "sim:2xA100-SXM4-40GB,1xT4".parse().expect("valid");
        assert_eq!(spec.gpu_count(), 3);
        assert_eq!(spec.to_string(), "2xA100-SXM4-40GB,1xT4");
        assert_eq!(
            spec.models().map(|m| m.key).collect::<Vec<_>>(),
            ["A100-SXM4-40GB", "A100-SXM4-40GB", "T4"]
        );
        for (bad, needle) in [
            ("sim:", "no GPUs"),
            ("sim:8xH999", "unknown model \"H999\""),
            ("sim:0xT4", "zero GPUs"),
            ("sim:eightxT4", "not <N>x<MODEL>"),
            ("sim:99999999999xT4", "not a GPU count"),
            ("sim:T4", "not <N>x<MODEL>"),
            ("sim:2000xT4", "more than 1024"),
        ] {
            let err = bad.parse::<SimSpec>().expect_err(bad).to_string();
            assert!(err.contains(needle), "{bad}: {err}");
            assert!(
                err.contains(&format!("{bad:?}")),
                "error names the spec: {err}"
            );
        }
    }

    #[test]
    fn placement_rules_per_model() {
        for key in [
            "A100-SXM4-40GB",
            "A100-SXM4-80GB",
            "H100-SXM5-80GB",
            "H200-SXM5-141GB",
        ] {
            let node = SimNode::new(format!("1x{key}").parse().expect("spec"), "n", None);
            node.set_mig_mode(0, true).expect("enable");
            if key.starts_with("A100") {
                // Ampere needs a reset before the mode takes effect.
                let err = node
                    .create_gpu_instance(0, 9, Placement { start: 0, size: 4 })
                    .expect_err(key);
                assert!(
                    matches!(
                        err,
                        GpuError::Mig {
                            failure: MigFailure::NotSupported,
                            ..
                        }
                    ),
                    "{err}"
                );
                node.reset_gpu(0).expect("reset");
            }
            // 3g at 0 and 4; a third 3g has no room; 1g in an occupied slice is refused.
            assert_eq!(
                node.create_gpu_instance(0, 9, Placement { start: 0, size: 4 })
                    .expect("3g@0"),
                1
            );
            assert_eq!(
                node.create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
                    .expect("3g@4"),
                2
            );
            let err = node
                .create_gpu_instance(0, 19, Placement { start: 5, size: 1 })
                .expect_err("occupied");
            assert!(
                matches!(
                    err,
                    GpuError::Mig {
                        failure: MigFailure::InsufficientResources,
                        ..
                    }
                ),
                "{err}"
            );
            // Invalid placements are invalid arguments, not resource errors.
            let err = node
                .create_gpu_instance(0, 9, Placement { start: 2, size: 4 })
                .expect_err("bad start");
            assert!(
                matches!(
                    err,
                    GpuError::Mig {
                        failure: MigFailure::InvalidArgument,
                        ..
                    }
                ),
                "{err}"
            );
            let err = node
                .create_gpu_instance(0, 77, Placement { start: 0, size: 1 })
                .expect_err("bad id");
            assert!(
                matches!(
                    err,
                    GpuError::Mig {
                        failure: MigFailure::InvalidArgument,
                        ..
                    }
                ),
                "{err}"
            );
        }
        // A30: four memory slices; 4g.24gb is the whole GPU.
        let a30 = SimNode::new("1xA30-24GB".parse().expect("spec"), "n", None);
        a30.set_mig_mode(0, true).expect("enable");
        a30.reset_gpu(0).expect("reset");
        assert_eq!(
            a30.create_gpu_instance(0, 5, Placement { start: 2, size: 2 })
                .expect("2g@2"),
            2
        );
        let err = a30
            .create_gpu_instance(0, 0, Placement { start: 0, size: 4 })
            .expect_err("full");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InsufficientResources,
                    ..
                }
            ),
            "{err}"
        );
        // +me profiles are single-instance even with free placements.
        a30.create_gpu_instance(0, 21, Placement { start: 0, size: 1 })
            .expect("1g+me");
        let err = a30
            .create_gpu_instance(0, 21, Placement { start: 1, size: 1 })
            .expect_err("second +me");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InsufficientResources,
                    ..
                }
            ),
            "{err}"
        );
        // Not MIG-capable.
        let t4 = SimNode::new("1xT4".parse().expect("spec"), "n", None);
        let err = t4.set_mig_mode(0, true).expect_err("T4");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::NotSupported,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn destroy_order_and_mode_rules() {
        let node = h100_node(1, None);
        let err = node
            .create_gpu_instance(0, 9, Placement { start: 0, size: 4 })
            .expect_err("MIG off");
        assert!(matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::NotSupported,
                ..
            }
        ));
        node.set_mig_mode(0, true).expect("Hopper toggles at once");
        let gi = node
            .create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
            .expect("gi");
        let (ci, uuid) = node.create_compute_instance(0, gi).expect("ci");
        assert!(uuid.starts_with("MIG-"));
        let err = node.create_compute_instance(0, gi).expect_err("full GI");
        assert!(matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::InsufficientResources,
                ..
            }
        ));
        let err = node
            .destroy_gpu_instance(0, gi)
            .expect_err("CI still there");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InUse,
                    ..
                }
            ),
            "{err}"
        );
        let err = node.set_mig_mode(0, false).expect_err("instances exist");
        assert!(matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::InUse,
                ..
            }
        ));
        node.destroy_compute_instance(0, gi, ci).expect("ci gone");
        node.destroy_gpu_instance(0, gi).expect("gi gone");
        let err = node.destroy_gpu_instance(0, gi).expect_err("twice");
        assert!(matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::NotFound,
                ..
            }
        ));
        node.set_mig_mode(0, false).expect("off");
    }

    #[test]
    fn state_survives_restart_and_instances_show_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let uuid = {
            let node = h100_node(2, Some(path.clone()));
            node.set_mig_mode(1, true).expect("enable");
            let gi = node
                .create_gpu_instance(1, 9, Placement { start: 0, size: 4 })
                .expect("gi");
            node.create_compute_instance(1, gi).expect("ci").1
        };
        // A new "process": same file, same answers.
        let node = h100_node(2, Some(path.clone()));
        let inv = node.inventory().expect("inventory");
        let mig = inv.gpus[1].mig.as_ref().expect("MIG-capable");
        assert!(mig.mode.current);
        assert_eq!(mig.instances.len(), 1);
        assert_eq!(mig.instances[0].uuid, uuid);
        assert_eq!(mig.instances[0].placement, Placement { start: 0, size: 4 });
        assert!(
            inv.gpus[0]
                .mig
                .as_ref()
                .expect("capable")
                .instances
                .is_empty()
        );
        // Another node's state file is refused with a clear error.
        let other = SimNode::new(
            "2xH100-SXM5-80GB".parse().expect("spec"),
            "n2",
            Some(path.clone()),
        );
        let err = other.inventory().expect_err("foreign state").to_string();
        assert!(
            err.contains("state.json") && err.contains("\"n1\""),
            "{err}"
        );
    }

    #[test]
    fn uuids_are_deterministic_and_distinct() {
        let a = h100_node(8, None).inventory().expect("a");
        let b = h100_node(8, None).inventory().expect("b");
        assert_eq!(a, b);
        let mut uuids: Vec<_> = a.gpus.iter().map(|g| g.uuid.clone()).collect();
        uuids.dedup();
        assert_eq!(uuids.len(), 8);
        assert_ne!(gpu_uuid("n1", 0), gpu_uuid("n2", 0));
    }
}
