//! A fake `libnvidia-ml.so.1` on gpu-dra's GPU simulator, so the real NVML code path (nvml-wrapper
//! and our raw calls) runs in tests on machines without GPUs.
//!
//! Configuration, read at `nvmlInit`:
//! - `FAKE_NVML_GPUS`: the simulated node, `sim:<N>x<MODEL>,...` (unset: init fails with
//!   `NVML_ERROR_DRIVER_NOT_LOADED`, like a node without the kernel driver);
//! - `FAKE_NVML_NODE`: node name the GPU UUIDs derive from (default `fake-node`);
//! - `FAKE_NVML_STATE`: the simulator's state file, shared with `gpu-dra --sim-state` (default: in
//!   memory);
//! - `FAKE_NVML_CALL_LOG`: a file each call of an initialised library is appended to as
//!   `<function> <GPU minor or ->`, so tests can count what the NVML backend asks;
//! - `FAKE_NVML_NAMELESS_WHEN_LOST` (any value): a lost GPU's handle by index answers
//!   `NVML_ERROR_GPU_IS_LOST` too, as for a GPU the driver knows nothing of, so it cannot be named;
//! - `FAKE_NVML_MIG_GATE`: a directory; each GPU instance create and destroy (real ones take up to
//!   seconds) first leaves a file `entered-<pid>-<n>` there, then waits, before the fake's lock is
//!   taken, until a file `open` exists there. A test holding the gate shut sees how many calls are
//!   inside at once, so a backend that serialises calls on different GPUs shows it whatever the
//!   machine's load, with no clock in the test.
//! - `FAKE_NVML_MIG_DELAY_MS`: each GPU instance create and destroy first sleeps this long (outside
//!   the fake's lock, as the gate), as real ones take up to seconds: benchmarks see whether a
//!   driver overlaps carves on different GPUs.
//!
//! Inside a container (a pod's `nvidia-smi` with the library its CDI spec mounted) none of these
//! is set. There the node comes from the library file itself: a test that installs the fake in a
//! driver root appends a last line `#gpu-dra-fake-nvml-node gpus=<spec> node=<name>` (see
//! [`node_in_library_file`]; ELF loaders ignore bytes past the segments). As real NVML in a
//! container, the session then sees only the GPUs whose device node `/dev/nvidia<minor>` the
//! container was given, numbered from 0, in their simulated initial state (the node's state file
//! is not in the container: MIG devices the driver made are not listed there).
//!
//! Faults come from the simulator too (`gpu-dra sim inject`, `SimNode::inject`): event sets poll
//! the state for the events it records, and a GPU it marks lost answers `NVML_ERROR_GPU_IS_LOST`
//! to the calls that need the GPU to answer (temperature, memory, compute mode, event types and
//! registration, MIG mode, profiles, placements, MIG devices, GPU and compute instances), as real
//! drivers do; what they answer from data cached about the GPU (handle, minor number, index, UUID,
//! name, PCI info, brand, architecture, compute capability, NUMA node, the recovery action) it
//! still answers.
//!
//! Handles are pointers to leaked, interned records, so the same GPU or instance always has the
//! same handle. Every exported function checks its pointers and returns NVML's error codes.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpu_dra::gpu::events::{GpuEvent, GpuEventKind};
use gpu_dra::gpu::sim::{
    SimHolder, SimNode, SimState, StateStamp, full_compute_profile, sim_pci_location,
};
use gpu_dra::gpu::{ComputeMode, GpuError, NodeInventory, Placement, SharingSettings, catalog};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlEventData_t, nvmlEventMigConfigChange,
    nvmlEventSet_t, nvmlEventTypeDoubleBitEccError, nvmlEventTypeSingleBitEccError,
    nvmlEventTypeXidCriticalError, nvmlFieldValue_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlMemory_t, nvmlMemory_v2_t,
    nvmlPciInfo_t, nvmlProcessInfo_t, nvmlReturn_t, nvmlUtilization_t, nvmlValue_t,
};

type Ret = nvmlReturn_t;
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const TIMEOUT: Ret = 10;
const GPU_IS_LOST: Ret = 15;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);
const ADDRESSING_MODE_V1_VERSION: c_uint =
    (std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlDeviceAddressingMode_t>() as c_uint)
        | (1 << 24);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DeviceKey {
    Gpu(u32),
    Mig { minor: u32, gi: u32, ci: u32 },
}

impl DeviceKey {
    fn minor(self) -> u32 {
        match self {
            Self::Gpu(minor) | Self::Mig { minor, .. } => minor,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct GiKey {
    minor: u32,
    gi: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CiKey {
    minor: u32,
    gi: u32,
    ci: u32,
}

struct Fake {
    node: SimNode,
    inventory: NodeInventory,
    state: SimState,
    devices: HashMap<DeviceKey, &'static DeviceKey>,
    gpu_instances: HashMap<GiKey, &'static GiKey>,
    compute_instances: HashMap<CiKey, &'static CiKey>,
    /// Live event sets by handle address (handles are boxes freed by `nvmlEventSetFree`).
    event_sets: HashMap<usize, EventSet>,
    init_count: u32,
    /// `FAKE_NVML_CALL_LOG`: where each call is appended.
    call_log: Option<PathBuf>,
    /// `FAKE_NVML_NAMELESS_WHEN_LOST`: a lost GPU has no handle either.
    nameless_when_lost: bool,
    /// The GPUs NVML saw when the session opened: as real NVML, it enumerates at init, and a GPU
    /// bound back to `nvidia` later is seen by the next session only.
    enumerated: std::collections::BTreeSet<u32>,
    /// The state file `inventory` and `state` were last read from (see `Fake::refresh`).
    refreshed: Option<StateStamp>,
    /// In a container (the library's container mode): GPU indices count the GPUs it was given.
    in_container: bool,
}

/// As NVML in a container: the GPUs it was given are GPU 0, 1, ... in the order of their minors.
fn renumber_visible(inventory: &mut NodeInventory) {
    for (index, gpu) in inventory.gpus.iter_mut().enumerate() {
        gpu.index = index as u32;
    }
}

/// What the session is, to the simulated kernel: this process holding its GPUs open.
const SESSION_HOLDER: &str = "libnvidia-ml (NVML session)";

impl Fake {
    /// Appends `<function> <minor>` (`-` when no GPU is involved) to the call log, if any. The file
    /// is opened per call so a test may truncate it between phases.
    fn log_call(&self, name: &str, minor: Option<u32>) {
        let Some(path) = &self.call_log else { return };
        let gpu = minor.map_or_else(|| "-".to_string(), |m| m.to_string());
        // A test hook: losing a line only makes a count assertion fail, so errors are dropped.
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{name} {gpu}");
        }
    }

    fn refresh(&mut self) -> Result<(), GpuError> {
        // The state file as it is before reading it: an unchanged one (and nothing reading it
        // would change) gives the same inventory, which is not cheap to build at every call.
        let stamp = self.node.state_stamp().filter(StateStamp::settled);
        if stamp.is_some() && stamp == self.refreshed && SimNode::adopted_as_is(&self.state) {
            return Ok(());
        }
        let mut inventory = self.node.inventory()?;
        inventory
            .gpus
            .retain(|g| self.enumerated.contains(&g.minor));
        if self.in_container {
            renumber_visible(&mut inventory);
        }
        self.inventory = inventory;
        self.state = self.node.state()?;
        self.refreshed = stamp;
        Ok(())
    }

    fn device_handle(&mut self, key: DeviceKey) -> nvmlDevice_t {
        let interned = *self
            .devices
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(key)));
        interned as *const DeviceKey as nvmlDevice_t
    }

    fn gi_handle(&mut self, key: GiKey) -> nvmlGpuInstance_t {
        let interned = *self
            .gpu_instances
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(key)));
        interned as *const GiKey as nvmlGpuInstance_t
    }

    fn ci_handle(&mut self, key: CiKey) -> nvmlComputeInstance_t {
        let interned = *self
            .compute_instances
            .entry(key)
            .or_insert_with(|| Box::leak(Box::new(key)));
        interned as *const CiKey as nvmlComputeInstance_t
    }

    fn device_key(&self, handle: nvmlDevice_t) -> Option<DeviceKey> {
        self.devices
            .values()
            .find(|k| std::ptr::eq(**k as *const DeviceKey, handle as *const DeviceKey))
            .map(|k| **k)
    }

    fn gi_key(&self, handle: nvmlGpuInstance_t) -> Option<GiKey> {
        self.gpu_instances
            .values()
            .find(|k| std::ptr::eq(**k as *const GiKey, handle as *const GiKey))
            .map(|k| **k)
    }

    fn ci_key(&self, handle: nvmlComputeInstance_t) -> Option<CiKey> {
        self.compute_instances
            .values()
            .find(|k| std::ptr::eq(**k as *const CiKey, handle as *const CiKey))
            .map(|k| **k)
    }

    /// Applies a change to the simulated hardware and refreshes the cached view; the error is the
    /// NVML return code to answer with.
    fn change<T>(&mut self, op: impl FnOnce(&SimNode) -> Result<T, GpuError>) -> Result<T, Ret> {
        let result = op(&self.node);
        self.refresh().map_err(|_| UNKNOWN)?;
        result.map_err(|e| gpu_error_code(&e))
    }

    fn gpu_instance(&self, key: GiKey) -> Option<&gpu_dra::gpu::sim::SimGpuInstance> {
        self.state
            .gpus
            .iter()
            .find(|g| g.minor == key.minor)
            .and_then(|g| g.gpu_instances.iter().find(|gi| gi.id == key.gi))
    }

    /// The profile of a GPU instance.
    fn gpu_instance_profile(&self, key: GiKey) -> Option<gpu_dra::gpu::GiProfile> {
        let gi = self.gpu_instance(key)?;
        self.gpu(key.minor)?
            .mig
            .as_ref()?
            .profile_by_id(gi.profile_id)
            .cloned()
    }

    fn gpu(&self, minor: u32) -> Option<&gpu_dra::gpu::Gpu> {
        self.inventory.gpus.iter().find(|g| g.minor == minor)
    }

    /// `nvmlDeviceGetSupportedEventTypes`: MIG config changes on MIG-capable GPUs only.
    fn supported_events(&self, minor: u32) -> c_ulonglong {
        match self.gpu(minor).and_then(|g| g.mig.as_ref()) {
            Some(_) => SUPPORTED_EVENTS | MIG_EVENTS,
            None => SUPPORTED_EVENTS,
        }
    }

    /// The GPU's simulated state as it is now: faults arrive from other processes at any time.
    fn current_gpu(&mut self, minor: u32) -> Result<&gpu_dra::gpu::sim::SimGpuState, Ret> {
        self.refresh().map_err(|_| UNKNOWN)?;
        self.state
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .ok_or(NOT_FOUND)
    }

    /// `GPU_IS_LOST` for a GPU off the bus now.
    /// The simulated processes on a GPU (`gpu-dra sim process`), as they are now.
    fn processes(&mut self, minor: u32) -> Vec<gpu_dra::gpu::sim::SimProcess> {
        self.current_gpu(minor)
            .map(|g| g.processes.clone())
            .unwrap_or_default()
    }

    fn processes_memory(&mut self, minor: u32) -> u64 {
        self.processes(minor)
            .iter()
            .filter_map(|p| p.usage.memory_used_bytes)
            .sum()
    }

    fn answering(&mut self, minor: u32) -> Result<(), Ret> {
        if self.current_gpu(minor)?.lost {
            Err(GPU_IS_LOST)
        } else {
            Ok(())
        }
    }
}

static FAKE: Mutex<Option<Fake>> = Mutex::new(None);

/// `FAKE_NVML_MIG_GATE` as read at the first init. Apart from `FAKE`, so the gate is waited at
/// without holding it (waiting inside `Fake::change`, under the fake's lock, would serialise
/// every call).
static MIG_GATE: Mutex<Option<PathBuf>> = Mutex::new(None);
static MIG_GATE_ENTRIES: AtomicU64 = AtomicU64::new(0);
/// `FAKE_NVML_MIG_DELAY_MS` as read at the first init.
static MIG_DELAY: Mutex<Duration> = Mutex::new(Duration::ZERO);

/// Where a GPU instance create or destroy spends its time; called before any lock but the gate's
/// own (released before waiting) is taken.
fn mig_work_takes_time() {
    let delay = *MIG_DELAY.lock().unwrap_or_else(|p| p.into_inner());
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let gate = MIG_GATE.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(gate) = gate else {
        return;
    };
    let entry = MIG_GATE_ENTRIES.fetch_add(1, Ordering::Relaxed);
    // A marker the test cannot see would make it wait in vain; it fails on its own deadline.
    let _ = std::fs::write(
        gate.join(format!("entered-{}-{entry}", std::process::id())),
        b"",
    );
    while !gate.join("open").exists() {
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn lock() -> MutexGuard<'static, Option<Fake>> {
    FAKE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` for NVML function `name` with the initialised fake, or returns `UNINITIALIZED`.
fn with(name: &'static str, f: impl FnOnce(&mut Fake) -> Ret) -> Ret {
    with_gpu(name, |_| None, f)
}

/// `with`, logging the call against the GPU `gpu_of` names (see `FAKE_NVML_CALL_LOG`).
fn with_gpu(
    name: &'static str,
    gpu_of: impl FnOnce(&Fake) -> Option<u32>,
    f: impl FnOnce(&mut Fake) -> Ret,
) -> Ret {
    match lock().as_mut() {
        Some(fake) if fake.init_count > 0 => {
            fake.log_call(name, gpu_of(fake));
            f(fake)
        }
        _ => UNINITIALIZED,
    }
}

/// Runs `f` on the record `key_of` finds for a handle (`INVALID_ARGUMENT` if none), logging the
/// call against its GPU.
fn on_key<K: Copy>(
    name: &'static str,
    key_of: impl Fn(&Fake) -> Option<K>,
    minor_of: impl Fn(K) -> u32,
    f: impl FnOnce(&mut Fake, K) -> Ret,
) -> Ret {
    with_gpu(
        name,
        |fake| key_of(fake).map(&minor_of),
        |fake| match key_of(fake) {
            Some(key) => f(fake, key),
            None => INVALID_ARGUMENT,
        },
    )
}

/// Runs `f` on the device (full GPU or MIG device) behind `device`.
fn on_handle(
    name: &'static str,
    device: nvmlDevice_t,
    f: impl FnOnce(&mut Fake, DeviceKey) -> Ret,
) -> Ret {
    on_key(name, |fake| fake.device_key(device), DeviceKey::minor, f)
}

fn gpu_error_code(e: &GpuError) -> Ret {
    match e {
        GpuError::Mig { failure, .. } => failure.nvml_return(),
        // Compute modes belong to full GPUs: refused in MIG mode, as NVML does.
        GpuError::Sharing { .. } => NOT_SUPPORTED,
        GpuError::MemoryLimit { failure, .. } => failure.nvml_return(),
        _ => UNKNOWN,
    }
}

unsafe fn write_str(text: &str, buffer: *mut c_char, length: c_uint) -> Ret {
    if buffer.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller's buffer holds `length` bytes, checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer as *mut u8, bytes.len());
        *buffer.add(bytes.len()) = 0;
    }
    SUCCESS
}

macro_rules! out {
    ($ptr:expr, $value:expr) => {{
        if $ptr.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: non-null out-pointer supplied by the caller.
        unsafe { *$ptr = $value };
    }};
}

// ---- lifecycle -------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init(0)
}

/// `NVML_INIT_FLAG_NO_GPUS`: do not fail when no GPU is found.
const INIT_FLAG_NO_GPUS: c_uint = 1;

/// As NVML: a node whose GPUs are all bound elsewhere (vfio-pci) fails a first init with
/// `NVML_ERROR_NOT_FOUND` ("No supported GPUs were found") unless the caller passes
/// `NVML_INIT_FLAG_NO_GPUS`.
fn init(flags: c_uint) -> Ret {
    let mut guard = lock();
    if let Some(fake) = guard.as_mut().filter(|f| f.init_count > 0) {
        fake.init_count += 1;
        return match fake.refresh() {
            Ok(()) => SUCCESS,
            Err(_) => UNKNOWN,
        };
    }
    // A first init (or one after a full shutdown) reads the configuration afresh.
    let (spec, node_name, state, in_container) = match std::env::var("FAKE_NVML_GPUS") {
        Ok(spec) => (
            spec,
            std::env::var("FAKE_NVML_NODE").unwrap_or_else(|_| "fake-node".into()),
            std::env::var_os("FAKE_NVML_STATE").map(Into::into),
            false,
        ),
        Err(_) => match node_in_library_file() {
            Some((spec, node_name)) => (spec, node_name, None, true),
            None => return DRIVER_NOT_LOADED,
        },
    };
    let Ok(spec) = spec.parse() else {
        return DRIVER_NOT_LOADED;
    };
    let node = SimNode::new(spec, &node_name, state);
    *MIG_GATE.lock().unwrap_or_else(|p| p.into_inner()) =
        std::env::var_os("FAKE_NVML_MIG_GATE").map(PathBuf::from);
    let delay = match std::env::var("FAKE_NVML_MIG_DELAY_MS") {
        Err(_) => Duration::ZERO,
        Ok(ms) => match ms.parse() {
            Ok(ms) => Duration::from_millis(ms),
            Err(_) => {
                eprintln!(
                    "fake libnvidia-ml: FAKE_NVML_MIG_DELAY_MS={ms:?} is not a number of milliseconds"
                );
                return INVALID_ARGUMENT;
            }
        },
    };
    *MIG_DELAY.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    let (Ok(mut inventory), Ok(state)) = (node.inventory(), node.state()) else {
        return UNKNOWN;
    };
    if in_container {
        inventory
            .gpus
            .retain(|g| device_node_given(&format!("/dev/nvidia{}", g.minor)));
        renumber_visible(&mut inventory);
    }
    if inventory.gpus.is_empty() && flags & INIT_FLAG_NO_GPUS == 0 {
        return NOT_FOUND;
    }
    let enumerated = inventory.gpus.iter().map(|g| g.minor).collect();
    // The session opens every GPU it enumerated (their device files), which holds them on
    // `nvidia` until it ends.
    if node
        .hold(&enumerated, &SimHolder::this_process(SESSION_HOLDER))
        .is_err()
    {
        return UNKNOWN;
    }
    *guard = Some(Fake {
        enumerated,
        node,
        inventory,
        state,
        devices: HashMap::new(),
        gpu_instances: HashMap::new(),
        compute_instances: HashMap::new(),
        event_sets: HashMap::new(),
        init_count: 1,
        call_log: std::env::var_os("FAKE_NVML_CALL_LOG").map(Into::into),
        nameless_when_lost: std::env::var_os("FAKE_NVML_NAMELESS_WHEN_LOST").is_some(),
        refreshed: None,
        in_container,
    });
    SUCCESS
}

/// The last line of a trailer, `#gpu-dra-fake-nvml-node gpus=<spec> node=<name>`.
const NODE_TRAILER: &str = "#gpu-dra-fake-nvml-node ";

/// The node a test wrote at the end of this library's file (see the crate docs): `(spec, node
/// name)`, or `None` when the file has no such last line.
fn node_in_library_file() -> Option<(String, String)> {
    use std::io::{Read, Seek, SeekFrom};
    // dladdr names the file this function was loaded from (the path the loader opened).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = node_in_library_file as *const () as *const libc::c_void;
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(1024))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    parse_node_trailer(&String::from_utf8_lossy(&tail))
}

/// The trailer in the last line of `tail`, if it is one.
fn parse_node_trailer(tail: &str) -> Option<(String, String)> {
    let line = tail.strip_suffix('\n')?.rsplit('\n').next()?;
    let fields = line.strip_prefix(NODE_TRAILER)?;
    let (mut gpus, mut node) = (None, None);
    for field in fields.split_whitespace() {
        match field.split_once('=')? {
            ("gpus", value) => gpus = Some(value.to_string()),
            ("node", value) => node = Some(value.to_string()),
            _ => return None,
        }
    }
    Some((gpus?, node?))
}

/// Whether the container was given this GPU's device node (a character device, as the CDI
/// spec's `deviceNodes` make them).
fn device_node_given(path: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> Ret {
    init(flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Ret {
    with("nvmlShutdown", |fake| {
        fake.init_count -= 1;
        if fake.init_count == 0 {
            // The last reference closes the session and with it the GPUs' device files.
            if fake
                .node
                .release_holds(std::process::id(), SESSION_HOLDER)
                .is_err()
            {
                return UNKNOWN;
            }
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let text: &'static CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        TIMEOUT => c"Timeout",
        GPU_IS_LOST => c"GPU is lost",
        19 => c"In use by another client",
        23 => c"Insufficient Resources",
        ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

// ---- system ----------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    with("nvmlSystemGetDriverVersion", |fake| unsafe {
        write_str(&fake.inventory.driver_version, version, length)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with("nvmlSystemGetNVMLVersion", |fake| unsafe {
        write_str(
            &format!("13.{}", fake.inventory.driver_version),
            version,
            length,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    with("nvmlSystemGetCudaDriverVersion_v2", |_| {
        out!(version, catalog::SIM_CUDA_DRIVER_VERSION);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

// ---- enumeration -----------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    with("nvmlDeviceGetCount_v2", |fake| {
        out!(count, fake.inventory.gpus.len() as c_uint);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> Ret {
    with("nvmlDeviceGetHandleByIndex_v2", |fake| {
        let Some(minor) = fake
            .inventory
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.minor)
        else {
            return INVALID_ARGUMENT;
        };
        if fake.nameless_when_lost
            && let Err(code) = fake.answering(minor)
        {
            return code;
        }
        let handle = fake.device_handle(DeviceKey::Gpu(minor));
        out!(device, handle);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    if uuid.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: caller passes a NUL-terminated string.
    let wanted = unsafe { CStr::from_ptr(uuid) }
        .to_string_lossy()
        .into_owned();
    with("nvmlDeviceGetHandleByUUID", |fake| {
        let key = fake.inventory.gpus.iter().find_map(|g| {
            if g.uuid == wanted {
                return Some(DeviceKey::Gpu(g.minor));
            }
            g.mig
                .as_ref()?
                .instances
                .iter()
                .find(|i| i.uuid == wanted)
                .map(|i| DeviceKey::Mig {
                    minor: g.minor,
                    gi: i.gpu_instance_id,
                    ci: i.compute_instance_id,
                })
        });
        let Some(key) = key else { return NOT_FOUND };
        let handle = fake.device_handle(key);
        out!(device, handle);
        SUCCESS
    })
}

/// A GPU by its PCI address (`domain:bus:device.function`, the domain 4 or 8 hex digits, any
/// case), as NVIDIA's plugin finds a GPU back on nvidia after its VM (persistence mode).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    if pci_bus_id.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: caller passes a NUL-terminated string.
    let wanted = unsafe { CStr::from_ptr(pci_bus_id) }
        .to_string_lossy()
        .to_ascii_lowercase();
    // `0000:2a:00.0` and `00000000:2a:00.0` name the same function.
    let canonical = |id: &str| -> String {
        match id.split_once(':') {
            Some((domain, rest)) => format!("{:0>8}:{rest}", domain.trim_start_matches('0')),
            None => id.to_string(),
        }
    };
    let wanted = canonical(wanted.trim());
    with("nvmlDeviceGetHandleByPciBusId_v2", |fake| {
        let Some(minor) = fake
            .inventory
            .gpus
            .iter()
            .map(|g| g.minor)
            .find(|&m| canonical(&sim_pci_location(m).0.to_ascii_lowercase()) == wanted)
        else {
            return NOT_FOUND;
        };
        let handle = fake.device_handle(DeviceKey::Gpu(minor));
        out!(device, handle);
        SUCCESS
    })
}

/// The first version's name for [`nvmlDeviceGetHandleByPciBusId_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pci_bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    // SAFETY: the same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id, device) }
}

// ---- per-device queries ----------------------------------------------------------------------

/// Runs `f` on the full GPU behind `device` (or a MIG device's parent when `allow_mig`).
fn on_gpu(
    name: &'static str,
    device: nvmlDevice_t,
    allow_mig: bool,
    f: impl FnOnce(&mut Fake, DeviceKey, u32) -> Ret,
) -> Ret {
    on_handle(name, device, |fake, key| match key {
        DeviceKey::Gpu(minor) => f(fake, key, minor),
        DeviceKey::Mig { minor, .. } if allow_mig => f(fake, key, minor),
        DeviceKey::Mig { .. } => NOT_SUPPORTED,
    })
}

/// `on_gpu` for calls that need the GPU itself to answer: `GPU_IS_LOST` while it is off the bus,
/// as real NVML answers. What the driver keeps of a GPU (handles, minor number, index, UUID,
/// name, PCI info, brand, architecture, compute capability, NUMA node, and the recovery-action
/// field, which says what the lost GPU needs) is answered for a lost GPU too.
fn on_live_gpu(
    name: &'static str,
    device: nvmlDevice_t,
    allow_mig: bool,
    f: impl FnOnce(&mut Fake, DeviceKey, u32) -> Ret,
) -> Ret {
    on_gpu(name, device, allow_mig, |fake, key, minor| {
        match fake.answering(minor) {
            Ok(()) => f(fake, key, minor),
            Err(code) => code,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    on_gpu("nvmlDeviceGetName", device, true, |fake, key, minor| {
        let Some(gpu) = fake.gpu(minor) else {
            return NOT_FOUND;
        };
        let text = match key {
            DeviceKey::Gpu(_) => gpu.product_name.clone(),
            DeviceKey::Mig { gi, .. } => {
                let profile = gpu.mig.as_ref().and_then(|m| {
                    let instance = m.instances.iter().find(|i| i.gpu_instance_id == gi)?;
                    m.profile_by_id(instance.profile_id)
                });
                format!(
                    "{} MIG {}",
                    gpu.product_name,
                    profile.map_or("unknown", |p| p.name.as_str())
                )
            }
        };
        unsafe { write_str(&text, name, length) }
    })
}

/// `nvmlDeviceAttributes_t`.
#[repr(C)]
pub struct nvmlDeviceAttributes_t {
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
    gpu_instance_slice_count: c_uint,
    compute_instance_slice_count: c_uint,
    memory_size_mb: c_ulonglong,
}

/// A MIG device's attributes, from its GPU instance's profile (its compute instance is the
/// full-size one); NVML answers only for MIG devices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetAttributes_v2",
        device,
        true,
        |fake, key, minor| {
            let DeviceKey::Mig { gi, .. } = key else {
                return NOT_SUPPORTED;
            };
            let Some(profile) = fake.gpu(minor).and_then(|g| {
                let mig = g.mig.as_ref()?;
                let instance = mig.instances.iter().find(|i| i.gpu_instance_id == gi)?;
                mig.profile_by_id(instance.profile_id)
            }) else {
                return NOT_FOUND;
            };
            out!(
                attributes,
                nvmlDeviceAttributes_t {
                    multiprocessor_count: profile.multiprocessors,
                    shared_copy_engine_count: profile.copy_engines,
                    shared_decoder_count: profile.decoders,
                    shared_encoder_count: profile.encoders,
                    shared_jpeg_count: profile.jpeg_engines,
                    shared_ofa_count: profile.ofa_engines,
                    gpu_instance_slice_count: profile.slice_count,
                    compute_instance_slice_count: profile.slice_count,
                    memory_size_mb: profile.memory_mib,
                }
            );
            SUCCESS
        },
    )
}

/// The unversioned name older clients call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    // SAFETY: the same contract.
    unsafe { nvmlDeviceGetAttributes_v2(device, attributes) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    on_gpu("nvmlDeviceGetUUID", device, true, |fake, key, minor| {
        let Some(gpu) = fake.gpu(minor) else {
            return NOT_FOUND;
        };
        let text = match key {
            DeviceKey::Gpu(_) => gpu.uuid.clone(),
            DeviceKey::Mig { gi, ci, .. } => {
                match gpu.mig.as_ref().and_then(|m| {
                    m.instances
                        .iter()
                        .find(|i| i.gpu_instance_id == gi && i.compute_instance_id == ci)
                }) {
                    Some(instance) => instance.uuid.clone(),
                    None => return NOT_FOUND,
                }
            }
        };
        unsafe { write_str(&text, uuid, length) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    on_gpu("nvmlDeviceGetIndex", device, false, |fake, _, minor| {
        let Some(gpu) = fake.gpu(minor) else {
            return NOT_FOUND;
        };
        out!(index, gpu.index);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor_out: *mut c_uint,
) -> Ret {
    on_gpu("nvmlDeviceGetMinorNumber", device, false, |_, _, minor| {
        out!(minor_out, minor);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetMemoryInfo_v2",
        device,
        false,
        |fake, _, minor| {
            let used = fake.processes_memory(minor);
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            // SAFETY: the caller's struct, valid for the call.
            let info = match unsafe { versioned_out(memory, |m| m.version, MEMORY_V2_VERSION) } {
                Ok(info) => info,
                Err(ret) => return ret,
            };
            let Some(total) = gpu.memory_bytes else {
                return NOT_SUPPORTED;
            };
            let reserved = 512 << 20;
            info.total = total;
            info.reserved = reserved;
            info.used = used;
            info.free = total.saturating_sub(reserved + used);
            SUCCESS
        },
    )
}

/// The compute processes of a GPU (on a MIG device's handle, those in its GPU instance), with
/// NVML's two-call protocol: too small a buffer gets `INSUFFICIENT_SIZE` and the count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    const NO_VALUE: c_uint = 0xFFFF_FFFF;
    on_live_gpu(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        device,
        true,
        |fake, key, minor| {
            if count.is_null() {
                return INVALID_ARGUMENT;
            }
            let processes: Vec<_> = fake
                .processes(minor)
                .into_iter()
                .filter(|p| match key {
                    DeviceKey::Mig { gi, .. } => p.usage.gpu_instance_id == Some(gi),
                    DeviceKey::Gpu(_) => true,
                })
                .collect();
            // SAFETY: non-null, caller-owned.
            let room = unsafe { *count } as usize;
            // SAFETY: as above.
            unsafe { *count = processes.len() as c_uint };
            if processes.is_empty() {
                return SUCCESS;
            }
            if infos.is_null() || room < processes.len() {
                return INSUFFICIENT_SIZE;
            }
            for (i, p) in processes.iter().enumerate() {
                // SAFETY: the caller's buffer holds `room` >= len entries.
                unsafe {
                    *infos.add(i) = nvmlProcessInfo_t {
                        pid: p.usage.pid,
                        usedGpuMemory: p.usage.memory_used_bytes.unwrap_or(u64::MAX),
                        gpuInstanceId: p.usage.gpu_instance_id.unwrap_or(NO_VALUE),
                        computeInstanceId: p.usage.compute_instance_id.unwrap_or(NO_VALUE),
                    };
                }
            }
            SUCCESS
        },
    )
}

/// The graphics processes of a GPU: none (nothing renders on the simulated GPUs); NVML's
/// two-call protocol as for compute processes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        device,
        true,
        |_, _, _| {
            if count.is_null() {
                return INVALID_ARGUMENT;
            }
            // SAFETY: non-null, caller-owned.
            unsafe { *count = 0 };
            SUCCESS
        },
    )
}

/// The GPU's utilization: the simulated processes' SM share, at most 100; not in MIG mode, as
/// NVML answers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetUtilizationRates",
        device,
        false,
        |fake, _, minor| {
            let mig = fake
                .current_gpu(minor)
                .map(|g| g.mig_current)
                .unwrap_or(false);
            if mig {
                return NOT_SUPPORTED;
            }
            let processes = fake.processes(minor);
            let gpu: u32 = processes.iter().map(|p| p.sm_percent).sum::<u32>().min(100);
            out!(
                utilization,
                nvmlUtilization_t {
                    gpu,
                    memory: gpu / 2
                }
            );
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetMemoryInfo",
        device,
        false,
        |fake, _, minor| {
            let used = fake.processes_memory(minor);
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            let Some(total) = gpu.memory_bytes else {
                return NOT_SUPPORTED;
            };
            out!(
                memory,
                nvmlMemory_t {
                    total,
                    free: total.saturating_sub(used),
                    used
                }
            );
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetPciInfo_v3",
        device,
        false,
        |fake, _, minor| {
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            let (bus_id, _, _) = sim_pci_location(gpu.minor);
            let mut parts = bus_id
                .split([':', '.'])
                .map(|p| u32::from_str_radix(p, 16).unwrap_or(0));
            let (domain, bus, dev) = (
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
                parts.next().unwrap_or(0),
            );
            let model = fake.node.spec().models().nth(gpu.minor as usize);
            let mut info = nvmlPciInfo_t {
                busIdLegacy: [0; 16],
                domain,
                bus,
                device: dev,
                pciDeviceId: model.map_or(0, |m| m.pci_device_id),
                pciSubSystemId: 0x1658_10DE,
                busId: [0; 32],
            };
            // NVML prints the 8-digit domain in busId and 4 digits in the legacy field.
            let long = format!("{domain:08X}:{bus:02X}:{dev:02X}.0");
            let legacy = format!("{domain:04X}:{bus:02X}:{dev:02X}.0");
            for (dst, src) in info.busId.iter_mut().zip(long.bytes()) {
                *dst = src as c_char;
            }
            for (dst, src) in info.busIdLegacy.iter_mut().zip(legacy.bytes()) {
                *dst = src as c_char;
            }
            out!(pci, info);
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor_out: *mut c_int,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetCudaComputeCapability",
        device,
        true,
        |fake, _, minor| {
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            let cc = gpu.cuda_compute_capability;
            out!(major, cc.major as c_int);
            out!(minor_out, cc.minor as c_int);
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) -> Ret {
    on_gpu(
        "nvmlDeviceGetArchitecture",
        device,
        true,
        |fake, _, minor| {
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            out!(arch, gpu.architecture.nvml_value());
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut c_uint) -> Ret {
    on_gpu("nvmlDeviceGetBrand", device, true, |fake, _, minor| {
        let Some(model) = fake.node.spec().models().nth(minor as usize) else {
            return NOT_FOUND;
        };
        out!(brand, model.brand);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, node: *mut c_uint) -> Ret {
    on_gpu(
        "nvmlDeviceGetNumaNodeId",
        device,
        false,
        |fake, _, minor| {
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            match gpu.numa_node {
                Some(n) => {
                    out!(node, n as c_uint);
                    SUCCESS
                }
                None => NOT_SUPPORTED,
            }
        },
    )
}

/// The caller's versioned out-struct, or what NVML returns for a null pointer or a version it
/// does not know.
///
/// # Safety
/// `ptr` is null or points to a caller-owned `T` valid for the call's duration.
unsafe fn versioned_out<'a, T>(
    ptr: *mut T,
    version_of: fn(&T) -> c_uint,
    want: c_uint,
) -> Result<&'a mut T, Ret> {
    if ptr.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, caller-owned struct; its version word tells its layout.
    let out = unsafe { &mut *ptr };
    if version_of(out) != want {
        return Err(ARGUMENT_VERSION_MISMATCH);
    }
    Ok(out)
}

/// The simulated model's addressing mode; NOT_SUPPORTED where the platform has none.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAddressingMode(
    device: nvmlDevice_t,
    mode: *mut nvml_wrapper_sys::bindings::nvmlDeviceAddressingMode_t,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetAddressingMode",
        device,
        false,
        |fake, _, minor| {
            let Some(gpu) = fake.gpu(minor) else {
                return NOT_FOUND;
            };
            // SAFETY: the caller's struct, valid for the call.
            let out =
                match unsafe { versioned_out(mode, |m| m.version, ADDRESSING_MODE_V1_VERSION) } {
                    Ok(out) => out,
                    Err(ret) => return ret,
                };
            match gpu.addressing_mode {
                Some(m) => {
                    out.value = m.to_nvml();
                    SUCCESS
                }
                None => NOT_SUPPORTED,
            }
        },
    )
}

// ---- MIG: mode, profiles, placements -----------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    on_live_gpu("nvmlDeviceGetMigMode", device, false, |fake, _, minor| {
        let Some(mig) = fake.gpu(minor).and_then(|g| g.mig.as_ref()) else {
            return NOT_SUPPORTED;
        };
        let mode = mig.mode;
        out!(current, c_uint::from(mode.current));
        out!(pending, c_uint::from(mode.pending));
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    activation_status: *mut Ret,
) -> Ret {
    on_live_gpu("nvmlDeviceSetMigMode", device, false, |fake, _, minor| {
        if mode > 1 {
            return INVALID_ARGUMENT;
        }
        let status = match fake.change(|node| node.set_mig_mode(minor, mode == 1)) {
            Ok(_) => SUCCESS,
            Err(UNKNOWN) => return UNKNOWN,
            Err(code) => code,
        };
        if !activation_status.is_null() {
            // SAFETY: non-null out-pointer.
            unsafe { *activation_status = status };
        }
        status
    })
}

// nvmlComputeMode_t: DEFAULT 0, EXCLUSIVE_THREAD 1 (removed), PROHIBITED 2, EXCLUSIVE_PROCESS 3.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetComputeMode",
        device,
        false,
        |fake, _, minor| {
            let Some(gpu) = fake.state.gpus.iter().find(|g| g.minor == minor) else {
                return NOT_FOUND;
            };
            out!(
                mode,
                match gpu.compute_mode {
                    ComputeMode::Default => 0,
                    ComputeMode::Prohibited => 2,
                    ComputeMode::ExclusiveProcess => 3,
                }
            );
            SUCCESS
        },
    )
}

/// `nvmlDeviceGetVirtualizationMode`: a simulated GPU is bare metal
/// (`NVML_GPU_VIRTUALIZATION_MODE_NONE`), neither a vGPU host nor a guest.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVirtualizationMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetVirtualizationMode",
        device,
        false,
        |_, _, _| {
            out!(mode, 0);
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: nvmlDevice_t,
    mode: *mut c_uint,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetPersistenceMode",
        device,
        false,
        |fake, _, minor| {
            let Some(gpu) = fake.state.gpus.iter().find(|g| g.minor == minor) else {
                return NOT_FOUND;
            };
            out!(mode, c_uint::from(gpu.persistence));
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(device: nvmlDevice_t, mode: c_uint) -> Ret {
    on_live_gpu(
        "nvmlDeviceSetPersistenceMode",
        device,
        false,
        |fake, _, minor| {
            let enabled = match mode {
                0 => false,
                1 => true,
                _ => return INVALID_ARGUMENT,
            };
            match fake.change(|node| node.set_persistence(minor, enabled)) {
                Ok(()) => SUCCESS,
                Err(code) => code,
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetComputeMode(device: nvmlDevice_t, mode: c_uint) -> Ret {
    on_live_gpu(
        "nvmlDeviceSetComputeMode",
        device,
        false,
        |fake, _, minor| {
            let compute_mode = match mode {
                0 => ComputeMode::Default,
                2 => ComputeMode::Prohibited,
                3 => ComputeMode::ExclusiveProcess,
                _ => return INVALID_ARGUMENT,
            };
            let settings = SharingSettings {
                compute_mode,
                timeslice: None,
            };
            match fake.change(|node| node.set_sharing_settings(minor, settings)) {
                Ok(()) => SUCCESS,
                Err(code) => code,
            }
        },
    )
}

/// `nvmlSetMemoryLimits_v1_t` (NVML 13.4).
#[repr(C)]
pub struct nvmlSetMemoryLimits_v1_t {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t` (NVML 13.4).
#[repr(C)]
pub struct nvmlGetMemoryLimits_v1_t {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
    current_used: c_ulonglong,
}

/// The cgroup path a limits struct names, if it names one.
unsafe fn cgroup_path(name_space: *const c_char) -> Option<PathBuf> {
    if name_space.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated path, as NVML's contract says.
    let text = unsafe { CStr::from_ptr(name_space) }.to_str().ok()?;
    Some(PathBuf::from(text))
}

/// Per-cgroup memory limits on a full GPU, recorded in the simulated GPUs' state (keyed by the
/// cgroup, whatever path names it). MIG handles are refused, as NVML refuses them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMemoryLimits_v1(
    device: nvmlDevice_t,
    limits: *mut nvmlSetMemoryLimits_v1_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceSetMemoryLimits_v1",
        device,
        false,
        |fake, _, minor| {
            if limits.is_null() {
                return INVALID_ARGUMENT;
            }
            // SAFETY: checked non-null; the caller owns the struct for the call.
            let limits = unsafe { &*limits };
            let Some(path) = (unsafe { cgroup_path(limits.name_space) }) else {
                return INVALID_ARGUMENT;
            };
            let limit = gpu_dra::gpu::memory_limit::MemoryLimit {
                soft: limits.soft_limit,
                hard: limits.hard_limit,
            };
            match fake.change(|node| node.set_memory_limit(minor, &path, limit)) {
                Ok(()) => SUCCESS,
                Err(code) => code,
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryLimits_v1(
    device: nvmlDevice_t,
    limits: *mut nvmlGetMemoryLimits_v1_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetMemoryLimits_v1",
        device,
        false,
        |fake, _, minor| {
            if limits.is_null() {
                return INVALID_ARGUMENT;
            }
            // SAFETY: checked non-null; the caller owns the struct for the call.
            let limits = unsafe { &mut *limits };
            let Some(path) = (unsafe { cgroup_path(limits.name_space) }) else {
                return INVALID_ARGUMENT;
            };
            match fake.node.memory_limit(minor, &path) {
                Ok(Some(limit)) => {
                    limits.soft_limit = limit.soft;
                    limits.hard_limit = limit.hard;
                    // Simulated processes allocate nothing.
                    limits.current_used = 0;
                    SUCCESS
                }
                Ok(None) => NOT_FOUND,
                Err(e) => gpu_error_code(&e),
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetGpuInstanceProfileInfo",
        device,
        false,
        |fake, _, minor| {
            let Some(mig) = fake.gpu(minor).and_then(|g| g.mig.as_ref()) else {
                return NOT_SUPPORTED;
            };
            if profile >= gpu_dra::gpu::mig::GPU_INSTANCE_PROFILE_COUNT {
                return INVALID_ARGUMENT;
            }
            let Some(p) = mig.profiles.iter().find(|p| p.profile_enum == profile) else {
                return NOT_SUPPORTED;
            };
            out!(
                info,
                nvmlGpuInstanceProfileInfo_t {
                    id: p.id,
                    isP2pSupported: c_uint::from(p.p2p_supported),
                    sliceCount: p.slice_count,
                    instanceCount: p.instance_count,
                    multiprocessorCount: p.multiprocessors,
                    copyEngineCount: p.copy_engines,
                    decoderCount: p.decoders,
                    encoderCount: p.encoders,
                    jpegCount: p.jpeg_engines,
                    ofaCount: p.ofa_engines,
                    memorySizeMB: p.memory_mib as c_ulonglong,
                }
            );
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        device,
        false,
        |fake, _, minor| {
            let Some(mig) = fake.gpu(minor).and_then(|g| g.mig.as_ref()) else {
                return NOT_SUPPORTED;
            };
            let Some(profile) = mig.profile_by_id(profile_id) else {
                return INVALID_ARGUMENT;
            };
            if count.is_null() {
                return INVALID_ARGUMENT;
            }
            let n = profile.placements.len();
            if placements.is_null() {
                // SAFETY: non-null out-pointer.
                unsafe { *count = n as c_uint };
                return SUCCESS;
            }
            // SAFETY: non-null; the caller states the buffer's capacity in *count.
            let capacity = unsafe { *count } as usize;
            unsafe { *count = n as c_uint };
            if capacity < n {
                return INSUFFICIENT_SIZE;
            }
            for (i, p) in profile.placements.iter().enumerate() {
                // SAFETY: i < n <= capacity.
                unsafe {
                    *placements.add(i) = nvmlGpuInstancePlacement_t {
                        start: p.start,
                        size: p.size,
                    }
                };
            }
            SUCCESS
        },
    )
}

// ---- MIG: devices and instances ----------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetMaxMigDeviceCount",
        device,
        false,
        |fake, _, minor| {
            let max = match fake.gpu(minor).and_then(|g| g.mig.as_ref()) {
                // As many as the smallest profile allows (7 on H100, 4 on A30 and RTX PRO).
                Some(mig) if mig.mode.current => mig
                    .profiles
                    .iter()
                    .map(|p| p.instance_count)
                    .max()
                    .unwrap_or(0),
                _ => 0,
            };
            out!(count, max);
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetMigDeviceHandleByIndex",
        device,
        false,
        |fake, _, minor| {
            let Some(mig) = fake.gpu(minor).and_then(|g| g.mig.as_ref()) else {
                return NOT_SUPPORTED;
            };
            if !mig.mode.current {
                return NOT_SUPPORTED;
            }
            let Some(instance) = mig.instances.get(index as usize) else {
                return NOT_FOUND;
            };
            let key = DeviceKey::Mig {
                minor,
                gi: instance.gpu_instance_id,
                ci: instance.compute_instance_id,
            };
            let handle = fake.device_handle(key);
            out!(mig_device, handle);
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> Ret {
    on_handle("nvmlDeviceIsMigDeviceHandle", device, |_, key| {
        out!(is_mig, c_uint::from(matches!(key, DeviceKey::Mig { .. })));
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> Ret {
    on_handle(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        mig_device,
        |fake, key| match key {
            DeviceKey::Mig { minor, .. } => {
                let handle = fake.device_handle(DeviceKey::Gpu(minor));
                out!(device, handle);
                SUCCESS
            }
            DeviceKey::Gpu(_) => NOT_SUPPORTED,
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    on_handle("nvmlDeviceGetGpuInstanceId", device, |_, key| match key {
        DeviceKey::Mig { gi, .. } => {
            out!(id, gi);
            SUCCESS
        }
        DeviceKey::Gpu(_) => NOT_SUPPORTED,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    on_handle(
        "nvmlDeviceGetComputeInstanceId",
        device,
        |_, key| match key {
            DeviceKey::Mig { ci, .. } => {
                out!(id, ci);
                SUCCESS
            }
            DeviceKey::Gpu(_) => NOT_SUPPORTED,
        },
    )
}

fn mig_enabled(fake: &Fake, minor: u32) -> bool {
    fake.gpu(minor)
        .and_then(|g| g.mig.as_ref())
        .is_some_and(|m| m.mode.current)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetGpuInstanceById",
        device,
        false,
        |fake, _, minor| {
            if !mig_enabled(fake, minor) {
                return NOT_SUPPORTED;
            }
            let exists = fake
                .state
                .gpus
                .iter()
                .any(|g| g.minor == minor && g.gpu_instances.iter().any(|gi| gi.id == id));
            if !exists {
                return NOT_FOUND;
            }
            let handle = fake.gi_handle(GiKey { minor, gi: id });
            out!(gpu_instance, handle);
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetGpuInstances",
        device,
        false,
        |fake, _, minor| {
            if !mig_enabled(fake, minor) {
                return NOT_SUPPORTED;
            }
            if gpu_instances.is_null() || count.is_null() {
                return INVALID_ARGUMENT;
            }
            let ids: Vec<u32> = fake
                .state
                .gpus
                .iter()
                .filter(|g| g.minor == minor)
                .flat_map(|g| {
                    g.gpu_instances
                        .iter()
                        .filter(|gi| gi.profile_id == profile_id)
                        .map(|gi| gi.id)
                })
                .collect();
            for (i, id) in ids.iter().enumerate() {
                let handle = fake.gi_handle(GiKey { minor, gi: *id });
                // SAFETY: NVML callers pass a buffer of the profile's instance count; ids never exceed it.
                unsafe { *gpu_instances.add(i) = handle };
            }
            // SAFETY: non-null out-pointer.
            unsafe { *count = ids.len() as c_uint };
            SUCCESS
        },
    )
}

fn on_gi(
    name: &'static str,
    handle: nvmlGpuInstance_t,
    f: impl FnOnce(&mut Fake, GiKey) -> Ret,
) -> Ret {
    // A GPU instance lives on its GPU: nothing about it is answered while the GPU is lost.
    on_key(
        name,
        |fake| fake.gi_key(handle),
        |k| k.minor,
        |fake, key| match fake.answering(key.minor) {
            Ok(()) => f(fake, key),
            Err(code) => code,
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> Ret {
    on_gi("nvmlGpuInstanceGetInfo", gpu_instance, |fake, key| {
        let Some(gi) = fake
            .gpu_instance(GiKey {
                minor: key.minor,
                gi: key.gi,
            })
            .cloned()
        else {
            return NOT_FOUND;
        };
        let device = fake.device_handle(DeviceKey::Gpu(key.minor));
        out!(
            info,
            nvmlGpuInstanceInfo_t {
                device,
                id: gi.id,
                profileId: gi.profile_id,
                placement: nvmlGpuInstancePlacement_t {
                    start: gi.placement.start,
                    size: gi.placement.size
                },
            }
        );
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    if placement.is_null() || gpu_instance.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null, caller-owned.
    let placement = unsafe { *placement };
    mig_work_takes_time();
    on_live_gpu(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        device,
        false,
        |fake, _, minor| {
            let wanted = Placement {
                start: placement.start,
                size: placement.size,
            };
            match fake.change(|node| node.create_gpu_instance(minor, profile_id, wanted)) {
                Ok(id) => {
                    let handle = fake.gi_handle(GiKey { minor, gi: id });
                    out!(gpu_instance, handle);
                    SUCCESS
                }
                Err(code) => code,
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: nvmlGpuInstance_t) -> Ret {
    mig_work_takes_time();
    on_gi(
        "nvmlGpuInstanceDestroy",
        gpu_instance,
        |fake, key| match fake.change(|node| node.destroy_gpu_instance(key.minor, key.gi)) {
            Ok(()) => SUCCESS,
            Err(code) => code,
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    on_gi(
        "nvmlGpuInstanceCreateComputeInstance",
        gpu_instance,
        |fake, key| {
            // Only the full-size compute instance is simulated; anything else is refused like an
            // unsupported profile.
            let slices = fake.gpu_instance_profile(key).map(|p| p.slice_count);
            let Some(slices) = slices else {
                return NOT_FOUND;
            };
            if profile_id != full_compute_profile(slices) {
                return NOT_SUPPORTED;
            }
            match fake.change(|node| node.create_compute_instance(key.minor, key.gi)) {
                Ok((ci, _)) => {
                    let handle = fake.ci_handle(CiKey {
                        minor: key.minor,
                        gi: key.gi,
                        ci,
                    });
                    out!(compute_instance, handle);
                    SUCCESS
                }
                Err(code) => code,
            }
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    on_gi(
        "nvmlGpuInstanceGetComputeInstances",
        gpu_instance,
        |fake, key| {
            if compute_instances.is_null() || count.is_null() {
                return INVALID_ARGUMENT;
            }
            let ids: Vec<u32> = fake
                .state
                .gpus
                .iter()
                .filter(|g| g.minor == key.minor)
                .flat_map(|g| g.gpu_instances.iter().filter(|gi| gi.id == key.gi))
                .flat_map(|gi| {
                    gi.compute_instances
                        .iter()
                        .filter(|ci| ci.profile_id == profile_id)
                        .map(|ci| ci.id)
                })
                .collect();
            for (i, ci) in ids.iter().enumerate() {
                let handle = fake.ci_handle(CiKey {
                    minor: key.minor,
                    gi: key.gi,
                    ci: *ci,
                });
                // SAFETY: callers size the buffer by the CI profile's instance count.
                unsafe { *compute_instances.add(i) = handle };
            }
            // SAFETY: non-null out-pointer.
            unsafe { *count = ids.len() as c_uint };
            SUCCESS
        },
    )
}

fn on_ci(
    name: &'static str,
    handle: nvmlComputeInstance_t,
    f: impl FnOnce(&mut Fake, CiKey) -> Ret,
) -> Ret {
    on_key(
        name,
        |fake| fake.ci_key(handle),
        |k| k.minor,
        |fake, key| match fake.answering(key.minor) {
            Ok(()) => f(fake, key),
            Err(code) => code,
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    on_ci(
        "nvmlComputeInstanceGetInfo_v2",
        compute_instance,
        |fake, key| {
            let Some(ci) = fake
                .gpu_instance(GiKey {
                    minor: key.minor,
                    gi: key.gi,
                })
                .and_then(|gi| gi.compute_instances.iter().find(|ci| ci.id == key.ci))
                .cloned()
            else {
                return NOT_FOUND;
            };
            let device = fake.device_handle(DeviceKey::Mig {
                minor: key.minor,
                gi: key.gi,
                ci: key.ci,
            });
            let gpu_instance = fake.gi_handle(GiKey {
                minor: key.minor,
                gi: key.gi,
            });
            out!(
                info,
                nvmlComputeInstanceInfo_t {
                    device,
                    gpuInstance: gpu_instance,
                    id: ci.id,
                    profileId: ci.profile_id,
                    placement: nvmlComputeInstancePlacement_t { start: 0, size: 0 },
                }
            );
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    compute_instance: nvmlComputeInstance_t,
) -> Ret {
    on_ci(
        "nvmlComputeInstanceDestroy",
        compute_instance,
        |fake, key| match fake
            .change(|node| node.destroy_compute_instance(key.minor, key.gi, key.ci))
        {
            Ok(()) => SUCCESS,
            Err(code) => code,
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    on_gi(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        gpu_instance,
        |fake, key| {
            if eng_profile != 0 {
                return INVALID_ARGUMENT;
            }
            let Some(gi_profile) = fake.gpu_instance_profile(key) else {
                return NOT_FOUND;
            };
            // Only the full-size compute instance is simulated (its id equals its profile constant,
            // as on real GPUs).
            if profile != full_compute_profile(gi_profile.slice_count) {
                return NOT_SUPPORTED;
            }
            out!(
                info,
                nvmlComputeInstanceProfileInfo_t {
                    id: profile,
                    sliceCount: gi_profile.slice_count,
                    instanceCount: 1,
                    multiprocessorCount: gi_profile.multiprocessors,
                    sharedCopyEngineCount: gi_profile.copy_engines,
                    sharedDecoderCount: gi_profile.decoders,
                    sharedEncoderCount: gi_profile.encoders,
                    sharedJpegCount: gi_profile.jpeg_engines,
                    sharedOfaCount: gi_profile.ofa_engines,
                }
            );
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    on_gi(
        "nvmlGpuInstanceGetComputeInstanceById",
        gpu_instance,
        |fake, key| {
            let exists = fake
                .state
                .gpus
                .iter()
                .filter(|g| g.minor == key.minor)
                .flat_map(|g| g.gpu_instances.iter().filter(|gi| gi.id == key.gi))
                .any(|gi| gi.compute_instances.iter().any(|ci| ci.id == id));
            if !exists {
                return NOT_FOUND;
            }
            let handle = fake.ci_handle(CiKey {
                minor: key.minor,
                gi: key.gi,
                ci: id,
            });
            out!(compute_instance, handle);
            SUCCESS
        },
    )
}

// ---- health: events, probes ------------------------------------------------------------------

/// What every simulated GPU supports, as an A100 or H100 reports it.
const SUPPORTED_EVENTS: c_ulonglong = (nvmlEventTypeXidCriticalError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypeSingleBitEccError) as c_ulonglong;

/// What a MIG-capable simulated GPU supports besides.
const MIG_EVENTS: c_ulonglong = nvmlEventMigConfigChange as c_ulonglong;

/// `gpuInstanceId`/`computeInstanceId` of an event on the whole GPU.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// How often a waiting event set looks at the simulated hardware at the latest (it also wakes
/// when the state changes).
const EVENT_POLL: Duration = Duration::from_secs(1);

/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`.
const FIELD_RECOVERY_ACTION: c_uint =
    nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
/// `NVML_VALUE_TYPE_UNSIGNED_INT`.
const VALUE_TYPE_UNSIGNED_INT: c_uint =
    nvml_wrapper_sys::bindings::nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;

/// An event set: the GPUs registered in it with their event types, the last simulator event it
/// looked at, and events taken from the simulator but not delivered yet (NVML hands out one per
/// wait).
#[derive(Default)]
struct EventSet {
    registered: HashMap<u32, c_ulonglong>,
    seen: u64,
    queue: VecDeque<GpuEvent>,
    /// The state file as this set last read it (see `next_event`).
    stamp: Option<StateStamp>,
    /// What a wait on this set watches, made at its first wait and kept: a real set's wait is a
    /// poll on descriptors opened once, not a new watch per call.
    waiter: Option<Arc<Waiter>>,
}

/// The node a waiting set reads, and the watch on its state file's folder (used outside the
/// library lock).
struct Waiter {
    node: SimNode,
    changes: StateChanges,
}

fn event_type(kind: GpuEventKind) -> c_ulonglong {
    c_ulonglong::from(match kind {
        GpuEventKind::Xid { .. } => nvmlEventTypeXidCriticalError,
        GpuEventKind::DoubleBitEcc => nvmlEventTypeDoubleBitEccError,
        GpuEventKind::MigConfigChange => nvmlEventMigConfigChange,
    })
}

impl EventSet {
    /// Queues the simulator's events newer than the last seen, for the GPUs and types registered.
    fn take(&mut self, state: &SimState) {
        let seen = self.seen;
        for raised in state.events.iter().filter(|e| e.serial > seen) {
            let wanted = self
                .registered
                .get(&raised.event.minor)
                .is_some_and(|types| types & event_type(raised.event.kind) != 0);
            if wanted {
                self.queue.push_back(raised.event);
            }
        }
        // As `SimEventSource`: a reboot empties the list and restarts the numbering.
        self.seen = state.event_serial;
    }
}

fn event_set_key(set: nvmlEventSet_t) -> usize {
    set as usize
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    with("nvmlEventSetCreate", |fake| {
        if set.is_null() {
            return INVALID_ARGUMENT;
        }
        // A new set sees only what is raised from now on.
        let Ok(state) = fake.node.state() else {
            return UNKNOWN;
        };
        let handle = Box::into_raw(Box::new(0u8)) as nvmlEventSet_t;
        fake.event_sets.insert(
            event_set_key(handle),
            EventSet {
                seen: state.event_serial,
                ..EventSet::default()
            },
        );
        out!(set, handle);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    with("nvmlEventSetFree", |fake| {
        if fake.event_sets.remove(&event_set_key(set)).is_none() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: the handle was boxed by `nvmlEventSetCreate` and was still registered.
        drop(unsafe { Box::from_raw(set as *mut u8) });
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    event_types: *mut c_ulonglong,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetSupportedEventTypes",
        device,
        false,
        |fake, _, minor| {
            if let Err(code) = fake.answering(minor) {
                return code;
            }
            out!(event_types, fake.supported_events(minor));
            SUCCESS
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    on_gpu(
        "nvmlDeviceRegisterEvents",
        device,
        false,
        |fake, _, minor| {
            if let Err(code) = fake.answering(minor) {
                return code;
            }
            // NVML refuses the whole mask if one type is unsupported.
            if event_types & !fake.supported_events(minor) != 0 {
                return NOT_SUPPORTED;
            }
            let Some(set) = fake.event_sets.get_mut(&event_set_key(set)) else {
                return INVALID_ARGUMENT;
            };
            *set.registered.entry(minor).or_default() |= event_types;
            SUCCESS
        },
    )
}

/// The next event of `set` (and the handle of its GPU), waiting up to `timeout_ms` for one: the
/// simulator's state is polled without holding the library lock, so other calls go on meanwhile.
fn next_event(
    name: &'static str,
    set: nvmlEventSet_t,
    timeout_ms: c_uint,
) -> Result<(nvmlDevice_t, GpuEvent), Ret> {
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    let key = event_set_key(set);
    let mut waiter = None;
    let ret = with(name, |fake| {
        let node = &fake.node;
        let Some(set) = fake.event_sets.get_mut(&key) else {
            return INVALID_ARGUMENT;
        };
        let made = set.waiter.get_or_insert_with(|| {
            Arc::new(Waiter {
                changes: StateChanges::watch(node),
                node: node.clone(),
            })
        });
        waiter = Some(Arc::clone(made));
        SUCCESS
    });
    let Some(waiter) = waiter.filter(|_| ret == SUCCESS) else {
        return Err(ret);
    };
    let node = &waiter.node;
    let pop = |state: Option<(&SimState, Option<StateStamp>)>| -> Result<Option<(nvmlDevice_t, GpuEvent)>, Ret> {
        let mut guard = lock();
        let fake = guard
            .as_mut()
            .filter(|f| f.init_count > 0)
            .ok_or(UNINITIALIZED)?;
        // Freed by another thread meanwhile.
        let set = fake.event_sets.get_mut(&key).ok_or(INVALID_ARGUMENT)?;
        if let Some((state, stamp)) = state {
            set.take(state);
            set.stamp = stamp.filter(StateStamp::settled);
        }
        let Some(event) = set.queue.pop_front() else {
            return Ok(None);
        };
        Ok(Some((
            fake.device_handle(DeviceKey::Gpu(event.minor)),
            event,
        )))
    };
    let last_stamp = || -> Result<Option<StateStamp>, Ret> {
        let guard = lock();
        let fake = guard.as_ref().ok_or(UNINITIALIZED)?;
        Ok(fake.event_sets.get(&key).ok_or(INVALID_ARGUMENT)?.stamp)
    };
    if let Some(queued) = pop(None)? {
        return Ok(queued);
    }
    // Only a changed state file can hold a new event. The real call blocks in the kernel; this
    // one sleeps until the state's folder changes (every write renames a new file into place),
    // so a waiting driver costs no CPU here, as it would on a GPU: idle figures are the driver's.
    // The file is looked at first, then again only once the folder changed (the watch lives as
    // long as the set: no change is missed between waits) or while its last look was too recent
    // to trust.
    let changes = &waiter.changes;
    let mut look = true;
    loop {
        let last = last_stamp()?;
        if look || last.is_none() {
            let stamp = node.state_stamp();
            if stamp.is_none() || stamp != last {
                let state = node.state().map_err(|_| UNKNOWN)?;
                if let Some(found) = pop(Some((&state, stamp)))? {
                    return Ok(found);
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(TIMEOUT);
        }
        look = changes.wait(EVENT_POLL.min(deadline - now));
    }
}

/// The state file's folder watched for files renamed into it (`inotify`: how every state write
/// lands); without a watch (state in memory, no inotify) waits are plain sleeps.
struct StateChanges(Option<rustix::fd::OwnedFd>);

impl StateChanges {
    fn watch(node: &SimNode) -> Self {
        use rustix::fs::inotify;
        let watch = || -> Option<rustix::fd::OwnedFd> {
            let dir = node.state_file()?.parent()?;
            let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
                .ok()?;
            // Not CLOSE_WRITE: every reader opens the lock file beside it for writing.
            inotify::add_watch(&fd, dir, inotify::WatchFlags::MOVED_TO).ok()?;
            Some(fd)
        };
        Self(watch())
    }

    /// Returns after `at_most`, or sooner once the folder changed; whether it may have changed
    /// (always, without a watch).
    fn wait(&self, at_most: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let Some(fd) = &self.0 else {
            std::thread::sleep(at_most);
            return true;
        };
        let timeout = Timespec::try_from(at_most).unwrap_or(Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => false,
            Ok(_) => {
                // Drained: the next wait sleeps until the next change.
                let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
                while rustix::io::read(fd, &mut buf).is_ok_and(|(read, _)| !read.is_empty()) {}
                true
            }
            // Interrupted: look again.
            Err(_) => true,
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    if data.is_null() {
        return INVALID_ARGUMENT;
    }
    match next_event("nvmlEventSetWait_v2", set, timeout_ms) {
        Ok((device, event)) => {
            let instance = |id: Option<u32>| id.unwrap_or(NO_INSTANCE);
            out!(
                data,
                nvmlEventData_t {
                    device,
                    eventType: event_type(event.kind),
                    eventData: match event.kind {
                        GpuEventKind::Xid { code } => code,
                        GpuEventKind::DoubleBitEcc | GpuEventKind::MigConfigChange => 0,
                    },
                    gpuInstanceId: instance(event.gpu_instance_id),
                    computeInstanceId: instance(event.compute_instance_id),
                }
            );
            SUCCESS
        }
        Err(code) => code,
    }
}

/// `nvmlEventData_t` before R450: no instance ids.
#[repr(C)]
pub struct EventDataV1 {
    device: nvmlDevice_t,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut EventDataV1,
    timeout_ms: c_uint,
) -> Ret {
    if data.is_null() {
        return INVALID_ARGUMENT;
    }
    match next_event("nvmlEventSetWait", set, timeout_ms) {
        Ok((device, event)) => {
            out!(
                data,
                EventDataV1 {
                    device,
                    event_type: event_type(event.kind),
                    event_data: match event.kind {
                        GpuEventKind::Xid { code } => code,
                        GpuEventKind::DoubleBitEcc | GpuEventKind::MigConfigChange => 0,
                    },
                }
            );
            SUCCESS
        }
        Err(code) => code,
    }
}

// NVML_TEMPERATURE_GPU is the only sensor. The probe's "does the GPU answer" call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temperature: *mut c_uint,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetTemperature",
        device,
        false,
        |fake, _, minor| {
            if sensor != 0 {
                return INVALID_ARGUMENT;
            }
            if let Err(code) = fake.answering(minor) {
                return code;
            }
            out!(temperature, 35 + minor);
            SUCCESS
        },
    )
}

/// Only `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION` is simulated; other fields answer `NOT_SUPPORTED`
/// in their own `nvmlReturn`, as NVML does for fields a GPU lacks. The action is answered for a
/// lost GPU too, as the simulator's probe does: it says what the lost GPU needs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> Ret {
    on_gpu(
        "nvmlDeviceGetFieldValues",
        device,
        false,
        |fake, _, minor| {
            if count < 0 || (count > 0 && values.is_null()) {
                return INVALID_ARGUMENT;
            }
            let action = match fake.current_gpu(minor) {
                Ok(gpu) => gpu.recovery_action,
                Err(code) => return code,
            };
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
            for i in 0..count as usize {
                // SAFETY: the caller's array holds `count` values, checked non-null above.
                let value = unsafe { &mut *values.add(i) };
                value.timestamp = now;
                value.latencyUsec = 0;
                if value.fieldId == FIELD_RECOVERY_ACTION {
                    value.valueType = VALUE_TYPE_UNSIGNED_INT;
                    value.value = nvmlValue_t { ullVal: 0 };
                    value.value.uiVal = action;
                    value.nvmlReturn = SUCCESS;
                } else {
                    value.nvmlReturn = NOT_SUPPORTED;
                }
            }
            SUCCESS
        },
    )
}

/// `nvmlGpuFabricInfo_t`, NVML's layout.
#[repr(C)]
pub struct GpuFabricInfo {
    pub cluster_uuid: [u8; 16],
    pub status: Ret,
    pub clique_id: c_uint,
    pub state: u8,
}

/// The simulator's fabric for this node: NOT_SUPPORTED on models without multi-node NVLink, as
/// the real library answers on them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: nvmlDevice_t,
    info: *mut GpuFabricInfo,
) -> Ret {
    on_live_gpu(
        "nvmlDeviceGetGpuFabricInfo",
        device,
        false,
        |fake, _, minor| match fake.node.fabric(minor) {
            Ok(None) => NOT_SUPPORTED,
            Ok(Some(fabric)) => {
                let Ok(uuid) = uuid::Uuid::parse_str(&fabric.cluster_uuid) else {
                    return UNKNOWN;
                };
                out!(
                    info,
                    GpuFabricInfo {
                        cluster_uuid: *uuid.as_bytes(),
                        status: SUCCESS,
                        clique_id: fabric.clique_id,
                        state: fabric.state.to_nvml(),
                    }
                );
                SUCCESS
            }
            Err(_) => UNKNOWN,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::parse_node_trailer;

    #[test]
    fn the_node_trailer_is_the_last_line_only() {
        let node =
            parse_node_trailer("\x7fELF...\n#gpu-dra-fake-nvml-node gpus=sim:2xA100 node=n1\n");
        assert_eq!(node, Some(("sim:2xA100".into(), "n1".into())));
        // Not last, not a whole line, an unknown field, a missing field: no trailer.
        assert_eq!(
            parse_node_trailer("#gpu-dra-fake-nvml-node gpus=sim:1xA100 node=n\nmore\n"),
            None
        );
        assert_eq!(
            parse_node_trailer("#gpu-dra-fake-nvml-node gpus=sim:1xA100 node=n"),
            None
        );
        assert_eq!(
            parse_node_trailer("#gpu-dra-fake-nvml-node gpus=sim:1xA100 node=n x=1\n"),
            None
        );
        assert_eq!(
            parse_node_trailer("#gpu-dra-fake-nvml-node gpus=sim:1xA100\n"),
            None
        );
    }
}
