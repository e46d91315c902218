//! The handle cache and cached GPU views: what NVML answered, per GPU behind its own lock, and
//! the inventories, invalidations and refreshes that read and show it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::nvmlDevice_t;

use super::NvmlBackend;
use super::errors::{nvml_err, read_err};
use crate::gpu::GpuError;
use crate::gpu::model::*;

/// Everything NVML answered, so MIG operations and inventories ask again only what can change:
/// each GPU's MIG mode and instances, and those only for a GPU marked stale (a MIG call on it, or
/// [`GpuControl::invalidate`](crate::gpu::GpuControl::invalidate)). Names, UUIDs, memory, PCI
/// and MIG profiles are read once.
///
/// Faults stay with their GPU: one that does not answer (lost, or any NVML error) keeps the view
/// last read and stays stale, so every inventory tries it again while the others are read as usual.
pub(super) struct Cache {
    pub(super) driver_version: String,
    pub(super) cuda_driver_version: Version2,
    /// Ordered by minor number; each behind its own lock.
    pub(super) gpus: Vec<Arc<GpuSlot>>,
    /// GPUs (by index) NVML could not even name (no handle, minor number or UUID): not on the node
    /// until they answer; tried again after each [`NvmlBackend::invalidate`].
    pub(super) unnamed: Vec<u32>,
    /// `unnamed` are to be tried at the next inventory.
    pub(super) retry_unnamed: bool,
}

/// One GPU's cache and lock. MIG and compute-mode operations on the GPU hold `gpu` across their
/// NVML calls; whether the cache is current and what inventories show are kept outside it, so
/// that marking the GPU stale never waits, and an inventory can tell, without waiting, whether a
/// busy GPU's last view may be shown.
pub(super) struct GpuSlot {
    pub(super) minor: u32,
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
    pub(super) fn mark_stale(&self) {
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
pub(super) struct NodeFacts {
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

pub(super) struct CachedGpu {
    pub(super) handle: Handle,
    /// The GPU as last read; only `mig.mode` and `mig.instances` change afterwards (and memory and
    /// MIG once, for a GPU first read `partial`).
    pub(super) gpu: Gpu,
    /// MIG profiles (with placements) and memory slices as read with MIG mode off (`[0]`) and on
    /// (`[1]`): real drivers answer placement queries only in MIG mode, so each mode keeps its own
    /// answer and a mode change re-reads them once, exactly as a full discovery would.
    pub(super) profiles: [Option<(Vec<GiProfile>, u32)>; 2],
    /// Named only: the GPU did not answer its first full read, so its memory (0 here) and MIG
    /// state (none here) are unknown until a refresh reads them.
    pub(super) partial: bool,
    /// Why the last read of the GPU failed; `None` once it answered. Kept so that a failing GPU is
    /// logged when it starts or stops failing, not at every inventory.
    pub(super) failure: Option<ReadFailure>,
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
pub(super) enum ReadFailure {
    /// `NVML_ERROR_GPU_IS_LOST`: off the bus.
    Lost,
    /// Any other NVML error.
    Error,
}

/// An NVML device handle.
#[derive(Clone, Copy)]
pub(super) struct Handle(pub(super) nvmlDevice_t);

// SAFETY: an NVML device handle is an opaque token that stays valid while the library is
// initialised (as long as the `Nvml` it came from), and NVML is thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as for `Send`; the token itself is never written through.
unsafe impl Sync for Handle {}

/// The GPUs' handles and minor numbers, all NVML tells without touching MIG state.
pub(super) struct GpuHandles {
    /// `(minor, handle)`, ordered by minor.
    pub(super) gpus: Vec<(u32, Handle)>,
    /// GPUs (by index) whose handle or minor number could not be read, and why.
    pub(super) unreachable: Vec<(u32, NvmlError)>,
}

impl GpuHandles {
    /// Every GPU the session enumerated, by minor (the caller holds a lease on the session).
    pub(super) fn enumerate(nvml: &Nvml) -> Result<Self, GpuError> {
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

    pub(super) fn handle(&self, minor: u32) -> Option<Handle> {
        self.gpus.iter().find(|(m, _)| *m == minor).map(|(_, h)| *h)
    }
}

impl NvmlBackend {
    /// Every GPU's handle and minor: from the first complete read on, without asking NVML. The
    /// caller holds a lease on the session.
    pub(super) fn gpu_handles(&self) -> Result<Arc<GpuHandles>, GpuError> {
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
    pub(super) fn vfio_aliases(&self) -> &crate::gpu::pci::VfioAliases {
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
    pub(super) fn with_gpu<T>(
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

    /// A GPU just named, read as far as it answers.
    pub(super) fn first_read(&self, gpu: CachedGpu) -> Arc<GpuSlot> {
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

    /// Re-reads a stale GPU's MIG mode and instances (profiles only on a mode not seen before), or
    /// all a `partial` one lacks. A GPU without MIG stays without it. On an error the GPU keeps
    /// its last view and stays stale. The caller holds `slot`'s lock (`gpu`).
    pub(super) fn refresh(&self, slot: &GpuSlot, gpu: &mut CachedGpu) -> Result<(), GpuError> {
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
}
