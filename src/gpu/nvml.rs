//! Discovery through NVML (nvml-wrapper; raw calls in `nvml_raw` where the wrapper stops).
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Brand, ComputeMode as NvmlComputeMode, TemperatureSensor,
};
use nvml_wrapper::enums::device::{DeviceArchitecture, SampleValue};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::{
    field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, nvmlDevice_t, nvmlEventData_t,
    nvmlEventMigConfigChange, nvmlEventSet_t, nvmlEventTypeDoubleBitEccError,
    nvmlEventTypeXidCriticalError,
};

use super::events::{GpuEvent, GpuEventKind, GpuEventSource, GpuProbe, RecoveryAction};
use super::memory_limit::MemoryLimit;
use super::mig::{self, GPU_INSTANCE_PROFILE_COUNT};
use super::model::*;
use super::nvml_raw::{self, RawError};
use super::session::{Lease, SessionGate};
use super::sim::cuda_version;
use super::{GpuError, catalog};

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
    /// [`GpuSlot`]), and this one is never held across NVML calls on a GPU (but for the first read
    /// of the whole node), so a slow or sick GPU holds up no operation on another.
    cache: Mutex<Option<Cache>>,
    /// Every GPU's handle by minor, for probes and events: read apart from `cache` so that a
    /// probe never waits for a MIG operation that holds it. Kept once complete.
    handles: Mutex<Option<Arc<GpuHandles>>>,
    /// The driver's `nvidia-smi`: NVML cannot set the time-slice interval.
    nvidia_smi: Option<super::driver_tools::NvidiaSmi>,
    /// NVML 13.4's per-cgroup memory limit calls, or why the driver's NVML lacks them.
    memory_limits: Result<nvml_raw::MemoryLimitCalls, String>,
}

/// Everything NVML answered, so MIG operations and inventories ask again only what can change:
/// each GPU's MIG mode and instances, and those only for a GPU marked stale (a MIG call on it, or
/// [`GpuControl::invalidate`](super::GpuControl::invalidate)). Names, UUIDs, memory, PCI and MIG
/// profiles are read once.
///
/// Faults stay with their GPU: one that does not answer (lost, or any NVML error) keeps the view
/// last read and stays stale, so every inventory tries it again while the others are read as usual.
struct Cache {
    driver_version: String,
    cuda_driver_version: Version2,
    /// Ordered by minor number; each behind its own lock.
    gpus: Vec<Arc<GpuSlot>>,
    /// GPUs (by index) NVML could not even name (no handle, minor number or UUID): not on the node
    /// until they answer; tried again after each [`NvmlBackend::invalidate`].
    unnamed: Vec<u32>,
    /// `unnamed` are to be tried at the next inventory.
    retry_unnamed: bool,
}

/// One GPU's cache and lock. MIG and compute-mode operations on the GPU hold `gpu` across their
/// NVML calls; whether the cache is current and what inventories show are kept outside it, so
/// that marking the GPU stale never waits, and an inventory can tell, without waiting, whether a
/// busy GPU's last view may be shown.
struct GpuSlot {
    minor: u32,
    /// Bumped whenever the GPU may have changed (a MIG call on it, an invalidate, a panic while
    /// its lock was held).
    changes: AtomicU64,
    /// `changes` as it was when the last successful read of MIG mode and instances began: the
    /// cache is stale while they differ. A change during a read leaves it stale.
    read_as_of: AtomicU64,
    /// What inventories show of the GPU (`None`: not shown, see [`CachedGpu::shown`]), updated
    /// after each read; its lock is held only to copy it.
    view: Mutex<Option<Gpu>>,
    gpu: Mutex<CachedGpu>,
}

impl GpuSlot {
    /// A GPU just named: stale, shown as [`CachedGpu::shown`] says until it is read.
    fn new(gpu: CachedGpu) -> Self {
        Self {
            minor: gpu.gpu.minor,
            changes: AtomicU64::new(1),
            read_as_of: AtomicU64::new(0),
            view: Mutex::new(gpu.shown().then(|| gpu.gpu.clone())),
            gpu: Mutex::new(gpu),
        }
    }

    /// MIG mode and instances must be re-read before they are used or shown.
    fn mark_stale(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    fn is_stale(&self) -> bool {
        self.read_as_of.load(Ordering::Acquire) != self.changes.load(Ordering::Acquire)
    }

    /// The GPU's cache, waiting for an operation on it. After a panic while it was held, it may
    /// be half-written: it is read again before use.
    fn lock(&self) -> MutexGuard<'_, CachedGpu> {
        self.gpu.lock().unwrap_or_else(|poisoned| {
            self.mark_stale();
            poisoned.into_inner()
        })
    }

    /// The cache if no operation holds it now (`None` then).
    fn try_lock(&self) -> Option<MutexGuard<'_, CachedGpu>> {
        match self.gpu.try_lock() {
            Ok(gpu) => Some(gpu),
            Err(TryLockError::Poisoned(poisoned)) => {
                self.mark_stale();
                Some(poisoned.into_inner())
            }
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn view(&self) -> MutexGuard<'_, Option<Gpu>> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `gpu` (held by the caller) what inventories show.
    fn publish(&self, gpu: &CachedGpu) {
        *self.view() = gpu.shown().then(|| gpu.gpu.clone());
    }
}

/// What an inventory needs of the cache besides the GPUs.
struct NodeFacts {
    driver_version: String,
    cuda_driver_version: Version2,
}

impl NodeFacts {
    fn inventory(self, gpus: Vec<Gpu>, pci: crate::gpu::pci::PciView) -> NodeInventory {
        NodeInventory {
            driver_version: self.driver_version,
            cuda_driver_version: self.cuda_driver_version,
            gpus,
            pci,
        }
    }
}

struct CachedGpu {
    handle: Handle,
    /// The GPU as last read; only `mig.mode` and `mig.instances` change afterwards (and memory and
    /// MIG once, for a GPU first read `partial`).
    gpu: Gpu,
    /// MIG profiles (with placements) and memory slices as read with MIG mode off (`[0]`) and on
    /// (`[1]`): real drivers answer placement queries only in MIG mode, so each mode keeps its own
    /// answer and a mode change re-reads them once, exactly as a full discovery would.
    profiles: [Option<(Vec<GiProfile>, u32)>; 2],
    /// Named only: the GPU did not answer its first full read, so its memory (0 here) and MIG
    /// state (none here) are unknown until a refresh reads them.
    partial: bool,
    /// Why the last read of the GPU failed; `None` once it answered. Kept so that a failing GPU is
    /// logged when it starts or stops failing, not at every inventory.
    failure: Option<ReadFailure>,
}

impl CachedGpu {
    /// Whether the inventory shows the GPU. A lost GPU that could only be named is shown, so that
    /// it is published with its lost taint; one that fails otherwise is not (nothing tells that it
    /// is unusable, and its memory and MIG state are unknown) until it answers.
    fn shown(&self) -> bool {
        !self.partial || self.failure == Some(ReadFailure::Lost)
    }
}

/// How a GPU's read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadFailure {
    /// `NVML_ERROR_GPU_IS_LOST`: off the bus.
    Lost,
    /// Any other NVML error.
    Error,
}

/// An NVML device handle.
#[derive(Clone, Copy)]
struct Handle(nvmlDevice_t);

// SAFETY: an NVML device handle is an opaque token that stays valid while the library is
// initialised (as long as the `Nvml` it came from), and NVML is thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as for `Send`; the token itself is never written through.
unsafe impl Sync for Handle {}

/// The GPUs' handles and minor numbers, all NVML tells without touching MIG state.
struct GpuHandles {
    /// `(minor, handle)`, ordered by minor.
    gpus: Vec<(u32, Handle)>,
    /// GPUs (by index) whose handle or minor number could not be read, and why.
    unreachable: Vec<(u32, NvmlError)>,
}

impl GpuHandles {
    /// Every GPU the session enumerated, by minor (the caller holds a lease on the session).
    fn enumerate(nvml: &Nvml) -> Result<Self, GpuError> {
        let count = nvml
            .device_count()
            .map_err(|e| nvml_err("device count", e))?;
        let mut read = Self {
            gpus: Vec::with_capacity(count as usize),
            unreachable: vec![],
        };
        for index in 0..count {
            let found = nvml.device_by_index(index).and_then(|device| {
                // SAFETY: the handle is valid while the session is, which the caller's lease keeps.
                let handle = Handle(unsafe { device.handle() });
                Ok((device.minor_number()?, handle))
            });
            match found {
                Ok(gpu) => read.gpus.push(gpu),
                Err(e) => read.unreachable.push((index, e)),
            }
        }
        read.gpus.sort_by_key(|(minor, _)| *minor);
        Ok(read)
    }

    fn handle(&self, minor: u32) -> Option<Handle> {
        self.gpus.iter().find(|(m, _)| *m == minor).map(|(_, h)| *h)
    }
}

/// What the event source listens for: the faults that make a device unhealthy. NVIDIA's driver
/// also registers single-bit ECC errors but acts on XIDs only.
const FAULT_EVENTS: u64 =
    nvmlEventTypeXidCriticalError as u64 | nvmlEventTypeDoubleBitEccError as u64;

/// Also listened for where the GPU reports it: MIG devices made or destroyed by anyone, so they
/// are read again at once instead of at the next periodic rescan.
const MIG_EVENTS: u64 = nvmlEventMigConfigChange as u64;

/// Most events one [`GpuEventSource::wait`] returns; the rest wait in NVML for the next call.
const MAX_EVENTS_PER_WAIT: usize = 64;

/// NVML's "no GPU instance / compute instance" in event data.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// The loaded `libnvidia-ml`. nvml-wrapper's `Nvml` ends one `nvmlInit` when dropped; here each
/// reference is an [`NvmlOpen`] of its own, so the library is never dropped (nor unloaded: it
/// lives as long as the process, as one backend does).
pub(crate) struct NvmlLibrary(std::mem::ManuallyDrop<Nvml>);

impl std::ops::Deref for NvmlLibrary {
    type Target = Nvml;
    fn deref(&self) -> &Nvml {
        &self.0
    }
}

/// One `nvmlInit` reference: the session is open while any lives (NVML counts them), and its
/// drop ends one with `nvmlShutdown`.
pub(crate) struct NvmlOpen {
    nvml: Arc<NvmlLibrary>,
}

impl NvmlOpen {
    /// Opens (or joins) NVML's session, enumerating the GPUs afresh when it was closed.
    fn init(nvml: &Arc<NvmlLibrary>) -> Result<Self, GpuError> {
        nvml_raw::init_no_gpus(nvml).map_err(|e| raw_err("initialise NVML", e))?;
        Ok(Self {
            nvml: Arc::clone(nvml),
        })
    }

    /// The reference the library's own first init took.
    fn adopt(nvml: &Arc<NvmlLibrary>) -> Self {
        Self {
            nvml: Arc::clone(nvml),
        }
    }
}

impl Drop for NvmlOpen {
    fn drop(&mut self) {
        if let Err(e) = nvml_raw::shutdown(&self.nvml) {
            tracing::warn!(error = %e, "cannot end the NVML session");
        }
    }
}

/// A registered NVML event set (raw: nvml-wrapper's `EventSet` borrows the `Nvml`, and this one
/// must outlive the call that made it). It keeps the session open, so it is given back whenever
/// the session is to close, and registered again on the next session.
struct NvmlEventSource {
    nvml: Arc<NvmlLibrary>,
    session: Arc<SessionGate<NvmlOpen>>,
    registered: Option<RegisteredSet>,
}

/// An event set registered on the GPUs of one session.
struct RegisteredSet {
    set: nvmlEventSet_t,
    /// The registered GPUs: `(minor, handle)`.
    gpus: Vec<(u32, Handle)>,
    nvml: Arc<NvmlLibrary>,
    /// Keeps the session (and so the set and handles) valid; dropped after `Drop` frees the set.
    _lease: Lease<NvmlOpen>,
}

// SAFETY: the set is an opaque NVML token, valid from any thread while the session is open (which
// the lease guarantees); `wait` takes `&mut self`, so one thread uses it at a time, as NVML requires.
unsafe impl Send for RegisteredSet {}

impl Drop for RegisteredSet {
    fn drop(&mut self) {
        // SAFETY: the set is live and freed only here.
        if let Err(e) = unsafe { nvml_raw::free_event_set(&self.nvml, self.set) } {
            tracing::warn!(error = %e, "cannot free the NVML event set");
        }
    }
}

impl RegisteredSet {
    /// A set with XIDs and double-bit ECC errors registered on every GPU of the session that
    /// supports them. A GPU that cannot register is left out with a warning, not the whole node.
    fn register(nvml: &Arc<NvmlLibrary>, lease: Lease<NvmlOpen>) -> Result<Self, GpuError> {
        let handles = GpuHandles::enumerate(nvml)?;
        for (index, e) in &handles.unreachable {
            tracing::warn!(index, error = %e, "GPU unreachable; no fault events from it");
        }
        let set =
            nvml_raw::create_event_set(nvml).map_err(|e| raw_err("create an NVML event set", e))?;
        // From here on, dropping `registered` frees the set.
        let mut registered = Self {
            set,
            gpus: Vec::with_capacity(handles.gpus.len()),
            nvml: Arc::clone(nvml),
            _lease: lease,
        };
        for &(minor, handle) in &handles.gpus {
            // SAFETY: the handle belongs to the session the lease keeps open.
            let device = unsafe { nvml_wrapper::Device::new(handle.0, nvml) };
            // Registering an unsupported type fails the whole call: ask first.
            let supported = match device.supported_event_types() {
                Ok(types) => types.bits(),
                Err(e) => {
                    tracing::warn!(minor, error = %e, "cannot read the GPU's event types; no fault events from it");
                    continue;
                }
            };
            let faults = supported & FAULT_EVENTS;
            if faults == 0 {
                tracing::warn!(
                    minor,
                    supported,
                    "GPU reports neither XIDs nor ECC errors; no fault events from it"
                );
                continue;
            }
            let types = faults | (supported & MIG_EVENTS);
            // SAFETY: a full-GPU handle and a live set, both of this session.
            match unsafe { nvml_raw::register_events(nvml, handle.0, types, set) } {
                Ok(()) => registered.gpus.push((minor, handle)),
                // NVML leaves the set undefined after this one.
                Err(
                    e @ RawError {
                        code: nvml_raw::NVML_ERROR_UNKNOWN,
                        ..
                    },
                ) => return Err(raw_err(&format!("GPU {minor}: register events"), e)),
                Err(e) => {
                    tracing::warn!(minor, error = %e, "cannot register for the GPU's events; no fault events from it");
                }
            }
        }
        tracing::debug!(
            gpus = ?registered.gpus.iter().map(|(m, _)| m).collect::<Vec<_>>(),
            "NVML events registered"
        );
        Ok(registered)
    }

    /// Our event for NVML's, if it is one we registered for on a GPU we know.
    fn event(&self, data: &nvmlEventData_t) -> Option<GpuEvent> {
        let Some(minor) = self
            .gpus
            .iter()
            .find(|(_, h)| std::ptr::eq(h.0, data.device))
            .map(|(m, _)| *m)
        else {
            tracing::warn!(
                event_type = data.eventType,
                "NVML event on a device that was not registered; ignored"
            );
            return None;
        };
        let kind = if data.eventType & u64::from(nvmlEventTypeXidCriticalError) != 0 {
            GpuEventKind::Xid {
                code: data.eventData,
            }
        } else if data.eventType & u64::from(nvmlEventTypeDoubleBitEccError) != 0 {
            GpuEventKind::DoubleBitEcc
        } else if data.eventType & MIG_EVENTS != 0 {
            GpuEventKind::MigConfigChange
        } else {
            tracing::debug!(minor, event_type = data.eventType, "NVML event ignored");
            return None;
        };
        let instance = |id: u32| (id != NO_INSTANCE).then_some(id);
        Some(GpuEvent {
            minor,
            kind,
            gpu_instance_id: instance(data.gpuInstanceId),
            compute_instance_id: instance(data.computeInstanceId),
        })
    }
}

impl NvmlEventSource {
    /// The set of the open session, registered again if the session changed; `None` while it is
    /// closing (the set is given back then, so that the close does not wait for it).
    fn registered(&mut self) -> Result<Option<&mut RegisteredSet>, GpuError> {
        if self.session.closing() {
            self.registered = None;
            return Ok(None);
        }
        if self.registered.is_none() {
            let nvml = Arc::clone(&self.nvml);
            let lease = self.session.lease(|| NvmlOpen::init(&nvml))?;
            self.registered = Some(RegisteredSet::register(&self.nvml, lease)?);
        }
        Ok(self.registered.as_mut())
    }
}

impl GpuEventSource for NvmlEventSource {
    fn watched(&self) -> Vec<u32> {
        self.registered
            .as_ref()
            .map(|r| r.gpus.iter().map(|(minor, _)| *minor).collect())
            .unwrap_or_default()
    }

    fn wait(&mut self, timeout: Duration) -> Result<Vec<GpuEvent>, GpuError> {
        let deadline = Instant::now() + timeout;
        let Some(registered) = self.registered()? else {
            // The session is closing for a GPU leaving `nvidia`; events resume on the next one.
            std::thread::sleep(timeout);
            return Ok(vec![]);
        };
        let mut events = Vec::new();
        while events.len() < MAX_EVENTS_PER_WAIT {
            // NVML hands out one event per call: after the first, take only what is ready. A
            // close waits for this set: the waits are short.
            let left = if events.is_empty() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            let timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
            // SAFETY: the set is live while `registered` is, and `&mut self` keeps this thread
            // alone on it.
            match unsafe { nvml_raw::wait_event(&registered.nvml, registered.set, timeout_ms) } {
                Ok(data) => events.extend(registered.event(&data)),
                // The timeout, or an interrupt that ended the wait early.
                Err(RawError {
                    code: nvml_raw::NVML_ERROR_TIMEOUT,
                    ..
                }) => {
                    if !events.is_empty() || Instant::now() >= deadline {
                        break;
                    }
                }
                // What was taken from NVML is not lost; the next wait reports the error again.
                Err(e) if !events.is_empty() => {
                    tracing::debug!(error = %e, "NVML event wait failed after events");
                    break;
                }
                Err(e) => return Err(raw_err("wait for GPU events", e)),
            }
        }
        Ok(events)
    }
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

    /// A lease on the NVML session, opening a new one if it was closed; the cached handles of an
    /// older session are dropped first. Never taken while holding the cache (a close may be
    /// waiting for the caller's other lease).
    fn lease(&self) -> Result<Lease<NvmlOpen>, GpuError> {
        let lease = self.session.lease(|| NvmlOpen::init(&self.nvml))?;
        let mut cached = self
            .cached_session
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *cached != lease.generation() {
            self.invalidate_all();
            *cached = lease.generation();
        }
        Ok(lease)
    }

    /// Where processes' open files are read (default `/proc`), for the GPUs' holders.
    pub fn with_proc_root(mut self, proc_root: PathBuf) -> Self {
        self.proc_root = proc_root;
        self
    }

    /// Every GPU's handle and minor: from the first complete read on, without asking NVML. The
    /// caller holds a lease on the session.
    fn gpu_handles(&self) -> Result<Arc<GpuHandles>, GpuError> {
        let known = self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(known) = known {
            return Ok(known);
        }
        let read = Arc::new(GpuHandles::enumerate(&self.nvml)?);
        // An unreachable GPU may come back: only a complete answer is kept.
        if read.unreachable.is_empty() {
            *self.handles.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&read));
        }
        Ok(read)
    }

    /// Lost or not (a temperature read, which needs the GPU to answer), and the recovery action
    /// the driver asks for (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, R550 and newer).
    pub fn probe(&self, minor: u32) -> Result<GpuProbe, GpuError> {
        let at = |what: &str| format!("GPU {minor}: {what}");
        let _session = self.lease()?;
        let handles = self.gpu_handles()?;
        let Some(handle) = handles.handle(minor) else {
            // A GPU lost before its minor was read is known by index only: it may be this one.
            if handles
                .unreachable
                .iter()
                .any(|(_, e)| matches!(e, NvmlError::GpuLost))
            {
                return Ok(GpuProbe {
                    lost: true,
                    recovery_action: None,
                });
            }
            return Err(GpuError::Nvml {
                operation: at("probe"),
                reason: "no GPU with this minor number".into(),
            });
        };
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(handle.0, &self.nvml) };
        let mut lost = match device.temperature(TemperatureSensor::Gpu) {
            Ok(_) => false,
            Err(NvmlError::GpuLost) => true,
            // No sensor: nothing to tell from it.
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => false,
            Err(e) => return Err(nvml_err(&at("temperature"), e)),
        };
        let field = FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION);
        let value = match device.field_values_for(&[field]) {
            Ok(values) => match values.into_iter().next() {
                Some(Ok(sample)) => sample.value,
                Some(Err(e)) => Err(e),
                None => Err(NvmlError::NotSupported),
            },
            Err(e) => Err(e),
        };
        let recovery_action = match value {
            Ok(value) => Some(RecoveryAction::from_nvml(
                recovery_value(&value).ok_or_else(|| GpuError::Nvml {
                    operation: at("recovery action"),
                    reason: format!("unexpected value {value:?}"),
                })?,
            )),
            // Drivers before R550 do not know the field.
            Err(
                NvmlError::NotSupported
                | NvmlError::InvalidArg
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => None,
            Err(NvmlError::GpuLost) => {
                lost = true;
                None
            }
            Err(e) => return Err(nvml_err(&at("recovery action"), e)),
        };
        Ok(GpuProbe {
            lost,
            recovery_action,
        })
    }

    /// An NVML event set with XIDs and double-bit ECC errors registered on every GPU that
    /// supports them (see [`RegisteredSet::register`]); registered again on each new session.
    pub fn event_source(&self) -> Result<Box<dyn GpuEventSource>, GpuError> {
        let lease = self.lease()?;
        let registered = RegisteredSet::register(&self.nvml, lease)?;
        Ok(Box::new(NvmlEventSource {
            nvml: Arc::clone(&self.nvml),
            session: Arc::clone(&self.session),
            registered: Some(registered),
        }))
    }

    /// Every full GPU, its MIG profiles and placements and the MIG devices that exist. The first
    /// call reads everything; later ones re-read the MIG state of stale GPUs only. A GPU that does
    /// not answer never fails the call: it keeps its last view (see `CachedGpu::shown`).
    ///
    /// A GPU an operation holds now is shown as last read if that view is current (the operation
    /// has changed nothing yet, e.g. it only reads, or it has not started its MIG call); if it is
    /// stale (a MIG call on it is in flight or done but unread), this waits for the operation and
    /// reads the GPU: correctness over speed, an inventory never shows a view known to be out of
    /// date. Callers that must not wait ask [`inventory_of`](Self::inventory_of) the GPUs they hold.
    pub fn inventory(&self) -> Result<NodeInventory, GpuError> {
        let _session = self.lease()?;
        let (facts, slots) = self.node()?;
        let mut gpus = Vec::with_capacity(slots.len());
        for slot in &slots {
            let view = match slot.try_lock() {
                Some(mut gpu) => self.read_and_show(slot, &mut gpu),
                None if !slot.is_stale() => slot.view().clone(),
                None => self.read_and_show(slot, &mut slot.lock()),
            };
            gpus.extend(view);
        }
        Ok(facts.inventory(gpus, self.pci_view()))
    }

    /// [`inventory`](Self::inventory) of the GPUs in `minors` only (others, and minors the node
    /// lacks, are left out), locking only those: for callers that hold them, so it waits for no
    /// operation on another GPU.
    pub fn inventory_of(&self, minors: &BTreeSet<u32>) -> Result<NodeInventory, GpuError> {
        let _session = self.lease()?;
        let (facts, slots) = self.node()?;
        let gpus = slots
            .iter()
            .filter(|slot| minors.contains(&slot.minor))
            .filter_map(|slot| self.read_and_show(slot, &mut slot.lock()))
            .collect();
        Ok(facts.inventory(gpus, self.pci_view()))
    }

    /// Refreshes a GPU (held by the caller) if stale; what inventories show of it now.
    fn read_and_show(&self, slot: &GpuSlot, gpu: &mut CachedGpu) -> Option<Gpu> {
        self.refresh_or_keep(slot, gpu);
        slot.view().clone()
    }

    /// Marks every GPU stale: someone else (another driver instance) may have changed them. GPUs
    /// that could not be named are tried again too. Waits for no operation on any GPU.
    pub fn invalidate(&self) {
        let mut guard = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cache) = guard.as_mut() {
            cache.retry_unnamed = true;
            for slot in &cache.gpus {
                slot.mark_stale();
            }
        }
    }

    /// The GPUs' PCI functions; one that cannot be read fails passthrough only, not discovery.
    fn pci_view(&self) -> crate::gpu::pci::PciView {
        if !self.scan_pci {
            return Default::default();
        }
        crate::gpu::pci::scan(&self.sysfs_root, self.vfio_aliases()).unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot read the GPUs' PCI functions; none is offered to virtual machines");
            Default::default()
        })
    }

    /// The running kernel's VFIO variant drivers; none (plain `vfio-pci`) when its module aliases
    /// cannot be read (Grace-attached GPUs are then not offered, see `slices::passthrough`).
    fn vfio_aliases(&self) -> &crate::gpu::pci::VfioAliases {
        self.vfio_aliases.get_or_init(|| {
            crate::gpu::pci::VfioAliases::read(&self.modules_root).unwrap_or_else(|error| {
                tracing::warn!(%error, "no kernel module aliases: VFIO variant drivers unknown");
                Default::default()
            })
        })
    }

    /// Forgets the whole node: a GPU left NVML or came back (a PCI driver binding), so its
    /// handles and the GPUs' indexes are read again at the next inventory.
    pub fn invalidate_all(&self) {
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = None;
        // Handles of a GPU that left NVML are dangling; one that came back has a new one.
        *self.handles.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Marks one GPU stale: a fault on it may have changed it. The others keep their view.
    pub fn invalidate_gpu(&self, minor: u32) {
        let mut guard = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cache) = guard.as_mut() {
            match cache.gpus.iter().find(|g| g.minor == minor) {
                Some(slot) => slot.mark_stale(),
                // Perhaps one that could not be named (its minor number is not known).
                None => cache.retry_unnamed = true,
            }
        }
    }

    /// Runs `f` on the cache (briefly: never across NVML calls on a GPU), reading the node first
    /// if nothing is cached yet.
    fn with_cache<T>(&self, f: impl FnOnce(&mut Cache) -> T) -> Result<T, GpuError> {
        let mut guard = self.cache.lock().unwrap_or_else(|poisoned| {
            // A panic mid-update may have left it half-written: start over from NVML.
            let mut guard = poisoned.into_inner();
            *guard = None;
            guard
        });
        let cache = match &mut *guard {
            Some(cache) => cache,
            empty => empty.insert(self.read_node()?),
        };
        Ok(f(cache))
    }

    /// The node-wide facts and every named GPU, after naming again those that could not be named
    /// if asked to (outside the cache's lock).
    fn node(&self) -> Result<(NodeFacts, Vec<Arc<GpuSlot>>), GpuError> {
        let retry = self.with_cache(|cache| {
            if std::mem::take(&mut cache.retry_unnamed) {
                std::mem::take(&mut cache.unnamed)
            } else {
                vec![]
            }
        })?;
        if !retry.is_empty() {
            self.retry_unnamed(retry)?;
        }
        self.with_cache(|cache| {
            (
                NodeFacts {
                    driver_version: cache.driver_version.clone(),
                    cuda_driver_version: cache.cuda_driver_version,
                },
                cache.gpus.clone(),
            )
        })
    }

    /// Runs `f` on the cached GPU with `minor`, holding that GPU's lock only.
    fn with_gpu<T>(
        &self,
        minor: u32,
        operation: &'static str,
        f: impl FnOnce(&GpuSlot, &mut CachedGpu) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        let _session = self.lease()?;
        let slot = self
            .with_cache(|cache| cache.gpus.iter().find(|g| g.minor == minor).cloned())?
            .ok_or_else(|| GpuError::Mig {
                minor,
                operation,
                failure: super::MigFailure::NotFound,
                detail: "no such GPU".into(),
            })?;
        let mut gpu = slot.lock();
        f(&slot, &mut gpu)
    }

    /// Reads the whole node. A GPU that cannot be named is left out, one that cannot be read in
    /// full is kept as far as it was read: neither fails the node.
    fn read_node(&self) -> Result<Cache, GpuError> {
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

    /// A GPU just named, read as far as it answers.
    fn first_read(&self, gpu: CachedGpu) -> Arc<GpuSlot> {
        let slot = Arc::new(GpuSlot::new(gpu));
        self.refresh_or_keep(&slot, &mut slot.lock());
        slot
    }

    /// Names the GPUs (by index) that could not be named before, outside the cache's lock; those
    /// that answer now join the node, the others are tried again after the next invalidate.
    fn retry_unnamed(&self, indexes: Vec<u32>) -> Result<(), GpuError> {
        let mut named = Vec::new();
        let mut still_unnamed = Vec::new();
        for index in indexes {
            match self.name_gpu(index) {
                Ok(gpu) => {
                    tracing::info!(
                        index,
                        minor = gpu.gpu.minor,
                        "GPU answers again; back on the node"
                    );
                    named.push(self.first_read(gpu));
                }
                Err(e) => {
                    tracing::debug!(index, error = %e, "GPU still cannot be named");
                    still_unnamed.push(index);
                }
            }
        }
        self.with_cache(|cache| {
            for slot in named {
                // Unless the node was read anew meanwhile (after a panic), which found it.
                if cache.gpus.iter().all(|g| g.minor != slot.minor) {
                    cache.gpus.push(slot);
                }
            }
            cache.unnamed.extend(still_unnamed);
            cache.unnamed.sort_unstable();
            cache.unnamed.dedup();
            cache.gpus.sort_by_key(|g| g.minor);
        })
    }

    /// What NVML tells of a GPU without asking the GPU itself (real drivers answer these from what
    /// they cached, even for a GPU that fell off the bus): a `partial`, stale entry that a refresh
    /// completes.
    fn name_gpu(&self, index: u32) -> Result<CachedGpu, GpuError> {
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
    fn complete(&self, gpu: &mut CachedGpu) -> Result<(), GpuError> {
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

    /// Re-reads a stale GPU's MIG mode and instances (profiles only on a mode not seen before), or
    /// all a `partial` one lacks. A GPU without MIG stays without it. On an error the GPU keeps
    /// its last view and stays stale. The caller holds `slot`'s lock (`gpu`).
    fn refresh(&self, slot: &GpuSlot, gpu: &mut CachedGpu) -> Result<(), GpuError> {
        let as_of = slot.changes.load(Ordering::Acquire);
        if slot.read_as_of.load(Ordering::Acquire) == as_of {
            return Ok(());
        }
        if gpu.partial {
            self.complete(gpu)?;
        } else if gpu.gpu.mig.is_some() {
            let minor = gpu.gpu.minor;
            // SAFETY: the handle belongs to `self.nvml`.
            let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
            let mode = device
                .mig_mode()
                .map_err(|e| read_err(minor, "read MIG mode", e))?;
            gpu.gpu.mig = Some(self.read_mig(gpu, mode)?);
        }
        // As of when the read began: a change marked meanwhile leaves the GPU stale.
        slot.read_as_of.store(as_of, Ordering::Release);
        Ok(())
    }

    /// [`refresh`](Self::refresh) for an inventory: a GPU that fails keeps its last view and is
    /// tried again next time, logged when it starts failing (or fails differently) and when it
    /// answers again. What inventories show of it is updated either way.
    fn refresh_or_keep(&self, slot: &GpuSlot, gpu: &mut CachedGpu) {
        self.refresh_or_keep_unshown(slot, gpu);
        slot.publish(gpu);
    }

    fn refresh_or_keep_unshown(&self, slot: &GpuSlot, gpu: &mut CachedGpu) {
        let minor = gpu.gpu.minor;
        match self.refresh(slot, gpu) {
            Ok(()) => {
                if let Some(was) = gpu.failure.take() {
                    tracing::info!(minor, was = ?was, "GPU answers again; read anew");
                }
            }
            Err(e) => {
                // Lost as the health probe tells it, whichever call failed first.
                let failure = if self.answers_lost(gpu.handle) {
                    ReadFailure::Lost
                } else {
                    ReadFailure::Error
                };
                if gpu.failure.replace(failure) == Some(failure) {
                    return;
                }
                if gpu.shown() {
                    tracing::warn!(
                        minor,
                        lost = failure == ReadFailure::Lost,
                        partial = gpu.partial,
                        error = %e,
                        "cannot read the GPU; it keeps its last view and is read again at each inventory"
                    );
                } else {
                    tracing::error!(
                        minor,
                        error = %e,
                        "cannot read the GPU; left off the node until it answers"
                    );
                }
            }
        }
    }

    /// Whether the GPU says it is lost (NVML's `GPU_IS_LOST` for a temperature read, the call the
    /// health probe makes).
    fn answers_lost(&self, handle: Handle) -> bool {
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(handle.0, &self.nvml) };
        matches!(
            device.temperature(TemperatureSensor::Gpu),
            Err(NvmlError::GpuLost)
        )
    }

    /// MIG state in `mode`: the profiles cached for that mode (read on first sight) and the
    /// instances that exist now.
    fn read_mig(
        &self,
        gpu: &mut CachedGpu,
        mode: nvml_wrapper::structs::device::MigMode,
    ) -> Result<MigInfo, GpuError> {
        let current = mode.current == 1;
        let (profiles, memory_slices) = match &gpu.profiles[usize::from(current)] {
            Some(known) => known.clone(),
            None => {
                let read = self.read_profiles(gpu)?;
                gpu.profiles[usize::from(current)] = Some(read.clone());
                read
            }
        };
        let instances = if current {
            self.mig_instances(gpu)?
        } else {
            vec![]
        };
        Ok(MigInfo {
            mode: MigMode {
                current,
                pending: mode.pending == 1,
            },
            memory_slices,
            profiles,
            instances,
        })
    }

    /// The GPU instance profiles NVML offers now, with their placements, and the memory slices
    /// those span.
    fn read_profiles(&self, gpu: &CachedGpu) -> Result<(Vec<GiProfile>, u32), GpuError> {
        let index = gpu.gpu.index;
        let at = |what: &str| format!("GPU {index}: {what}");
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
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
            let Some(name) = mig::profile_name(
                profile_enum,
                info.memory_size_mb,
                gpu.gpu.memory_bytes.unwrap_or_default(),
            ) else {
                continue;
            };
            // SAFETY: a live full-GPU handle of `self.nvml`.
            let placements =
                unsafe { nvml_raw::possible_placements(&self.nvml, gpu.handle.0, info.id) }
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
        Ok((profiles, memory_slices))
    }

    /// Walks the MIG device handles; each is one (GI, CI) pair.
    fn mig_instances(&self, gpu: &CachedGpu) -> Result<Vec<MigInstance>, GpuError> {
        let index = gpu.gpu.index;
        let handle = gpu.handle.0;
        let at = |what: &str| format!("GPU {index}: {what}");
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(handle, &self.nvml) };
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

    /// The profiles to look GPU instances up by: those of MIG mode when known (GPU instances exist
    /// only there), else those of the mode the GPU is in now, as a full discovery would list.
    fn gi_profiles<'a>(
        &self,
        slot: &GpuSlot,
        gpu: &'a mut CachedGpu,
    ) -> Result<&'a [GiProfile], GpuError> {
        if gpu.profiles[1].is_none() {
            self.refresh(slot, gpu)?;
        }
        Ok(match (&gpu.profiles[1], &gpu.gpu.mig) {
            (Some((profiles, _)), _) => profiles,
            (None, Some(mig)) => &mig.profiles,
            (None, None) => &[],
        })
    }
}

fn nvml_err(operation: &str, e: NvmlError) -> GpuError {
    GpuError::Nvml {
        operation: operation.to_string(),
        reason: e.to_string(),
    }
}

/// A failed call on GPU `minor`; a lost GPU's as [`MigFailure::Lost`](super::MigFailure::Lost),
/// as the simulator says it, so callers tell a lost GPU from a refusal.
fn read_err(minor: u32, operation: &'static str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::GpuLost => GpuError::Mig {
            minor,
            operation,
            failure: super::MigFailure::Lost,
            detail: String::new(),
        },
        e => nvml_err(&format!("GPU {minor}: {operation}"), e),
    }
}

/// A failed compute-mode call; a lost GPU's as the simulator says it.
fn sharing_err(minor: u32, operation: &'static str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::GpuLost => GpuError::Sharing {
            minor,
            operation,
            reason: "GPU is lost".into(),
        },
        e => nvml_err(&format!("GPU {minor}: {operation}"), e),
    }
}

/// A field value as `nvmlDeviceGpuRecoveryAction_t` (NVML reports it as an unsigned int).
fn recovery_value(value: &SampleValue) -> Option<u32> {
    match *value {
        SampleValue::U32(v) => Some(v),
        SampleValue::U64(v) => u32::try_from(v).ok(),
        SampleValue::I64(v) => u32::try_from(v).ok(),
        SampleValue::F64(_) => None,
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

/// An NVML MIG call's failure, in the terms the simulator uses.
fn mig_failure(minor: u32, operation: &'static str, e: RawError) -> GpuError {
    let failure = match e.code {
        2 => super::MigFailure::InvalidArgument,
        3 => super::MigFailure::NotSupported,
        6 => super::MigFailure::NotFound,
        15 => super::MigFailure::Lost,
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
