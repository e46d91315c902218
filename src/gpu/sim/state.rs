//! The simulated hardware's state ([`SimState`]) and where it is kept: a JSON file replaced by
//! rename under an advisory lock (or memory, for one process), adopted after restarts and reboots
//! as hardware would be, and read from a cache while the file is unchanged.
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SimNode;
use super::faults::SimEvent;
use super::holders::{SimHolder, process_start_time};
use super::pci::PciDriver;
use super::usage::SimProcess;
use crate::gpu::GpuError;
use crate::gpu::memory_limit::MemoryLimit;
use crate::gpu::model::*;

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

#[derive(Clone)]
pub(super) enum Store {
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

/// The last state read from (or written to) the file, with the file's stamp then.
pub(super) type ReadCache = Arc<Mutex<Option<(StateStamp, Arc<SimState>)>>>;

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

impl SimNode {
    /// The state file, when the state is kept in one.
    pub fn state_file(&self) -> Option<&Path> {
        match &self.store {
            Store::File(path) => Some(path),
            Store::Memory(_) => None,
        }
    }

    /// Current state, for inspection (tests, `demo`).
    pub fn state(&self) -> Result<SimState, GpuError> {
        self.read(|state| Ok(state.clone()))
    }

    fn fresh_state(&self) -> SimState {
        SimState {
            schema: SCHEMA,
            node_name: self.node_name.clone(),
            spec: self.spec.to_string(),
            // Simulated hardware follows the host's boots when it can tell them apart.
            boot_id: crate::gpu::boot_id().unwrap_or_default(),
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
        let boot = crate::gpu::boot_id().unwrap_or_default();
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

    pub(super) fn read<R>(
        &self,
        f: impl FnOnce(&SimState) -> Result<R, GpuError>,
    ) -> Result<R, GpuError> {
        if let Some(state) = self.unchanged_state() {
            return f(&state);
        }
        self.with_state(false, |s| f(s))
    }

    /// Whether reading `state` from its file again would give it unchanged: the same boot, its
    /// MPS daemons and the processes holding GPUs still alive.
    pub fn adopted_as_is(state: &SimState) -> bool {
        state.boot_id == crate::gpu::boot_id().unwrap_or_default()
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

    pub(super) fn write<R>(
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
}
