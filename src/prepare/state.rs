//! Prepared-device state: the orchestration of prepare and unprepare, crash recovery and garbage
//! collection. What a claim means on this node is planned in [`super::plan`]; each change to the
//! hardware is an effect of its own in [`super::effects`], kept by one protocol (intent recorded,
//! change, ids recorded, undo from the record, adopt at start). Here:
//!
//! - prepare: plan → record the claim as `PrepareStarted` with what it will create (only when it
//!   creates hardware state) → apply the effects in order (device by device: MIG carve, whole-GPU
//!   MIG mode, compute mode, vfio-pci binding; then the claim's own MPS daemon, shared GPUs' MPS
//!   daemons, device metadata) → write the CDI spec → record `PrepareCompleted`;
//! - unprepare: mark `PrepareStarted` → remove the CDI spec → undo the effects in reverse order
//!   (the claim's device metadata, MPS daemon and left-over memory limits, then device by device;
//!   a device another claim still shares is left to it) → drop the claim;
//! - start: roll back every claim that is not `PrepareCompleted`, let each effect adopt what the
//!   hardware holds, rewrite missing specs of completed claims, delete specs no claim owns.
//!
//! Concurrency: claims on different GPUs are prepared and unprepared side by side. Each operation
//! first holds its claim (the same claim never interleaves with itself), then every GPU its devices
//! are on (all at once, so two operations never wait on each other), and only then touches the
//! hardware. The in-memory book (checkpoint and inventory) has its own short lock, held to change
//! it and write it out, never across hardware calls. Each operation refreshes only the inventory of
//! the GPUs it holds, so it never overwrites what another operation saw of its own GPU.
//!
//! Recovery at start ([`DeviceState::open`]) is in `recovery`; rescans and the checkpoint
//! re-read in `refresh`; what a claim's CDI spec holds, in `spec`.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::busy::BusySet;
use super::cdi::CdiStore;
use super::checkpoint::{
    Checkpoint, CheckpointStore, ClaimEntry, ClaimState, DeviceRecord, LoadOutcome, MigRecord,
};
use super::effects::compute_mode::{self, ComputeMode};
use super::effects::device_metadata::DeviceMetadata;
use super::effects::memory_limit::MemoryLimit;
use super::effects::mig_carve::{self, MigCarve};
use super::effects::mig_mode::WholeGpu;
use super::effects::mps_daemon::{self, ClaimMps, SharedMps};
use super::effects::vfio_bind::VFIO_BIND;
use super::effects::{ClaimDevice, ClaimEffect, DeviceEffect, Host};
use super::error::PrepareError;
use super::failpoint::failpoint;
use super::memory_limits::MemoryLimits;
use super::metadata::MetadataStore;
use super::mps::MpsDaemons;
use super::plan::{PlannedDevice, Planner, Target};
use super::sharing;
use super::sharing::MpsAvailability;
use super::{ClaimRef, PreparedDevice};
use crate::gpu::mig::{GpuMode, choose_modes, parse_mig_device_name};
use crate::gpu::{GpuControl, NodeInventory};

mod recovery;
mod refresh;
mod spec;

pub use recovery::RecoveryReport;
#[cfg(test)]
pub(super) use spec::vfio_cdi_device;

// Re-exported: callers outside (the node binary, tests, benches) name it here, beside
// `DeviceState`; it lives apart so the planner need not import the orchestrator.
pub use super::config::DriverConfig;

/// What the driver knows and has written down: guarded by [`DeviceState::book`].
struct Book {
    checkpoint: Checkpoint,
    inventory: NodeInventory,
}

/// Whether GPU `minor` of `gpus` has a MIG device no claim in `owned` holds (someone else's).
fn holds_foreign_mig(
    gpus: &[crate::gpu::Gpu],
    owned: &BTreeSet<mig_carve::OwnedInstance>,
    minor: u32,
) -> bool {
    gpus.iter()
        .find(|g| g.minor == minor)
        .and_then(|g| g.mig.as_ref())
        .is_some_and(|m| {
            m.instances.iter().any(|i| {
                !owned.contains(&mig_carve::OwnedInstance {
                    minor,
                    gpu_instance_id: i.gpu_instance_id,
                    profile_id: i.profile_id,
                    placement: i.placement,
                })
            })
        })
}

pub struct DeviceState {
    config: DriverConfig,
    gpus: Arc<dyn GpuControl>,
    /// How each GPU is offered: decided at start, and for a GPU that appears later (back from
    /// a virtual machine, or found again) when a rescan first sees it.
    modes: std::sync::RwLock<BTreeMap<u32, GpuMode>>,
    store: CheckpointStore,
    cdi: CdiStore,
    /// Device metadata files (KEP-5304) of claims with GPUs for virtual machines.
    metadata: MetadataStore,
    /// The kept `gpu-vfio-<index>` of each PCI address (`--passthrough` only).
    vfio_names: Option<super::vfio_names::VfioNames>,
    /// MPS control daemons; `None` where the driver root has no `nvidia-cuda-mps-control`.
    mps: Option<MpsDaemons>,
    /// Why MPS claims are refused though the driver root has a control binary: it cannot run.
    mps_unusable: Option<String>,
    /// Why time-slice intervals cannot be set (the GPUs' tools are checked once, at start).
    timeslice_unavailable: Option<String>,
    book: Mutex<Book>,
    /// Claims (by UID) an operation is working on.
    busy_claims: BusySet<String>,
    /// GPUs (by minor) an operation is changing or relying on.
    busy_gpus: BusySet<u32>,
    /// Whether claims of different namespaces may share one MPS daemon
    /// (`--mps-share-across-namespaces`).
    mps_across_namespaces: bool,
    /// How consumed GPU memory is enforced per container on this node.
    memory_limits: MemoryLimits,
}

impl DeviceState {
    /// Lets claims of different namespaces share a GPU's one MPS daemon. Off by default: they
    /// would share its pipe, its shm and its control commands (any of them can stop it for all).
    pub fn with_mps_across_namespaces(mut self, allow: bool) -> Self {
        self.mps_across_namespaces = allow;
        self
    }

    /// How consumed GPU memory is enforced, instead of what [`open`](Self::open) found (a test
    /// that mounts its own cgroup v2 hierarchy).
    pub fn with_memory_limits(mut self, limits: MemoryLimits) -> Self {
        self.memory_limits = limits;
        self
    }

    pub fn memory_limits(&self) -> &MemoryLimits {
        &self.memory_limits
    }

    pub fn config(&self) -> &DriverConfig {
        &self.config
    }

    /// Why MPS claims are refused though the driver root has MPS's control binary (it cannot
    /// run there); `None` where it runs, or where there is none.
    pub fn mps_unusable(&self) -> Option<&str> {
        self.mps_unusable.as_deref()
    }

    /// The devices of `pool` that prepared claims hold (without copying the checkpoint: the
    /// health stream asks every probe round).
    pub fn prepared_devices(&self, pool: &str) -> std::collections::BTreeSet<String> {
        self.book()
            .checkpoint
            .claims
            .values()
            .flat_map(|c| c.devices.iter())
            .filter(|d| d.pool == pool)
            .map(|d| d.device.clone())
            .collect()
    }

    /// A copy of the checkpoint as it is now.
    pub fn checkpoint(&self) -> Checkpoint {
        self.book().checkpoint.clone()
    }

    /// A copy of the inventory as it is now.
    pub fn inventory(&self) -> NodeInventory {
        self.book().inventory.clone()
    }

    /// The minor numbers of the GPUs in the inventory now (without copying the inventory: the
    /// health probe asks every round).
    pub fn gpu_minors(&self) -> std::collections::BTreeSet<u32> {
        self.book().inventory.gpus.iter().map(|g| g.minor).collect()
    }

    /// How each GPU is offered now.
    pub fn modes(&self) -> BTreeMap<u32, GpuMode> {
        self.modes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn modes_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u32, GpuMode>> {
        // Each change is an insert: a panicking holder leaves it usable.
        self.modes.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives GPUs of the inventory that have no mode yet (absent at start: bound to vfio-pci for
    /// a virtual machine, or not answering) one by the MIG policy, as at start; returns whether
    /// any got one. Unlike at start nothing is destroyed: a GPU that arrives holding MIG devices
    /// no claim owns is offered as it is (static) until a restart adopts them.
    fn decide_new_modes(&self) -> bool {
        let book = self.book();
        let known = self.modes();
        let arrived: Vec<crate::gpu::Gpu> = book
            .inventory
            .gpus
            .iter()
            .filter(|g| !known.contains_key(&g.minor))
            .cloned()
            .collect();
        if arrived.is_empty() {
            return false;
        }
        let owned = mig_carve::owned(&book.checkpoint);
        drop(book);
        let foreign = |minor: u32| holds_foreign_mig(&arrived, &owned, minor);
        let chosen = choose_modes(&arrived, self.config.mig_policy, foreign);
        let mut modes = self.modes_mut();
        for (minor, mut mode) in chosen {
            if mode == GpuMode::Dynamic && foreign(minor) {
                mode = GpuMode::Static;
            }
            tracing::info!(gpu = minor, ?mode, "a GPU not seen at start is offered");
            modes.entry(minor).or_insert(mode);
        }
        true
    }

    pub fn cdi(&self) -> &CdiStore {
        &self.cdi
    }

    /// Claims recorded as prepared (any state).
    pub fn claims(&self) -> Vec<ClaimRef> {
        self.book()
            .checkpoint
            .claims
            .values()
            .map(|c| ClaimRef {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
            })
            .collect()
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        // Every change to the book is a plain assignment; a panicking holder leaves it usable.
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes the book and writes the checkpoint, in one step no other operation can split.
    fn record_change(&self, change: impl FnOnce(&mut Checkpoint)) -> Result<(), PrepareError> {
        let mut book = self.book();
        change(&mut book.checkpoint);
        self.store.save(&book.checkpoint)?;
        Ok(())
    }

    /// The GPUs a claim's devices are on: those its allocation names on this node, and those
    /// recorded for it (a half-done earlier attempt). A GPU for a virtual machine is also held
    /// by its PCI index ([`VFIO_LOCK_BASE`] + index): NVML may not see it, so it has no minor.
    fn gpus_of(&self, uid: &str, claim: Option<&ResourceClaim>) -> BTreeSet<u32> {
        let book = self.book();
        let vfio_keys = |index: u32| {
            let minor = book
                .inventory
                .pci
                .gpus
                .iter()
                .find(|f| f.index == index)
                .and_then(|f| {
                    book.inventory
                        .gpus
                        .iter()
                        .find(|g| g.pci_bus_id == f.bus_id)
                })
                .map(|g| g.minor);
            [Some(VFIO_LOCK_BASE + index), minor]
        };
        let keys_of = |device: &str| -> Vec<u32> {
            match crate::slices::passthrough::parse_vfio_device_name(device) {
                Some(index) => vfio_keys(index).into_iter().flatten().collect(),
                None => device_gpu(device).into_iter().collect(),
            }
        };
        let mut minors: BTreeSet<u32> = claim
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.driver == self.config.driver_name && r.pool == self.config.node_name)
            .flat_map(|r| keys_of(&r.device))
            .collect();
        if let Some(entry) = book.checkpoint.claims.get(uid) {
            for d in &entry.devices {
                minors.extend(keys_of(&d.device));
                minors.extend(d.mig.as_ref().map(|m| m.parent_minor));
                minors.extend(d.vfio.as_ref().and_then(|v| v.minor));
            }
        }
        minors
    }

    /// Prepares one claim; repeated calls return the same devices without side effects.
    pub fn prepare(
        &self,
        claim_ref: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let uid = claim_ref.uid.clone();
        let _claim_held = self.busy_claims.acquire(BTreeSet::from([uid.clone()]));
        // A prepared claim only needs its spec checked: no need to wait for its GPUs.
        let completed = {
            let book = self.book();
            let entry = book.checkpoint.claims.get(&uid);
            entry
                .filter(|e| e.is_completed())
                .map(|entry| (prepared_devices(entry), self.claim_spec(&book, entry)))
        };
        if let Some((devices, (cdi_devices, claim_edits))) = completed {
            // Idempotent, but make sure the spec a container needs is really there.
            tracing::debug!(claim = %claim_ref, claimUID = %uid, "claim already prepared");
            let (refused, unnamed) = {
                let book = self.book();
                let entry = &book.checkpoint.claims[&uid];
                (
                    entry
                        .taken_over
                        .as_ref()
                        .is_some_and(|t| t.refused.is_some()),
                    entry.name.is_empty(),
                )
            };
            if !refused && !self.cdi.spec_path(&uid).exists() {
                self.cdi.write(&uid, &cdi_devices, &claim_edits)?;
            }
            // A claim taken over from NVIDIA's driver, which does not record names: now known,
            // garbage collection can look it up.
            if unnamed {
                self.record_change(|checkpoint| {
                    if let Some(entry) = checkpoint.claims.get_mut(&uid) {
                        entry.namespace = claim_ref.namespace.clone();
                        entry.name = claim_ref.name.clone();
                    }
                })?;
            }
            return Ok(devices);
        }
        let _gpus_held = self.busy_gpus.acquire(self.gpus_of(&uid, Some(claim)));
        // Still unfinished (an earlier attempt failed or crashed): start over.
        if self.book().checkpoint.claims.contains_key(&uid) {
            self.roll_back(&uid)?;
        }
        let plan = self.planner(&self.book()).plan(claim_ref, claim)?;
        // A claim made from a pod's template: its containers find device metadata under the
        // pod's name for it.
        let pod_claim_name = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
            .cloned();
        let result = self.apply_plan(claim_ref, plan, pod_claim_name);
        if result.is_err() && self.book().checkpoint.claims.contains_key(&uid) {
            // Undo at once what was carved, rather than leaving it to a retry or a restart.
            if let Err(error) = self.roll_back(&uid) {
                tracing::error!(claim = %claim_ref, claimUID = %uid, %error, "cannot roll back a failed prepare; retried at the next prepare or restart");
            }
        }
        result
    }

    /// Carries out a checked plan: intent on disk, carving, sharing, CDI spec, completion.
    fn apply_plan(
        &self,
        claim_ref: &ClaimRef,
        plan: Vec<PlannedDevice>,
        pod_claim_name: Option<String>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let uid = claim_ref.uid.clone();
        // What time-slicing will change, read before the book is locked (a hardware call).
        let mut sharing = Vec::with_capacity(plan.len());
        for (result, target, config) in &plan {
            // A claim joining a GPU that its sharers put in EXCLUSIVE_PROCESS keeps what the GPU
            // had before the first of them, for whichever leaves last to restore.
            let joined = (result.share_id.is_some() && sharing::wants_mps(config.as_ref()))
                .then(|| {
                    self.book().checkpoint.claims.values().find_map(|c| {
                        c.devices
                            .iter()
                            .filter(|d| c.uid != uid && d.device == result.device)
                            .filter(|d| d.pool == result.pool && sharing::shared_mps(d))
                            .find_map(|d| d.sharing.clone())
                    })
                })
                .flatten();
            sharing.push(match (target, joined) {
                (Target::Gpu { .. }, Some(record)) => Some(record),
                (Target::Gpu { minor, .. }, None) => {
                    compute_mode::record_before(&*self.gpus, *minor, config.as_ref())?
                }
                _ => None,
            });
        }
        let creates_hardware_state = sharing.iter().any(Option::is_some)
            || plan.iter().any(|(_, t, config)| {
                matches!(t, Target::Placement { .. } | Target::Vfio { .. })
                    || sharing::wants_mps(config.as_ref())
            });
        let mut entry = {
            let book = self.book();
            ClaimEntry {
                namespace: claim_ref.namespace.clone(),
                name: claim_ref.name.clone(),
                uid: uid.clone(),
                state: ClaimState::PrepareStarted,
                devices: plan
                    .iter()
                    .map(|(result, target, config)| {
                        self.planner(&book).record(&uid, result, target, config)
                    })
                    .collect(),
                pod_claim_name,
                taken_over: None,
                unknown: Default::default(),
            }
        };
        for (device, sharing) in entry.devices.iter_mut().zip(sharing) {
            device.sharing = sharing;
        }
        // Bad MPS settings are refused before anything changes; a device to be carved has no
        // UUID yet, and no key can name one.
        sharing::daemon_spec(&entry.devices, |d| {
            if d.uuid.is_empty() {
                format!("\0{}", d.device)
            } else {
                d.uuid.clone()
            }
        })
        .map_err(|reason| PrepareError::Claim {
            claim: claim_ref.to_string(),
            reason,
        })?;
        if creates_hardware_state {
            // The intent is on disk before the hardware changes, so a crash can be undone.
            self.record_change(|checkpoint| {
                checkpoint.claims.insert(uid.clone(), entry.clone());
            })?;
            failpoint("prepare-started");
        }
        // Effect by effect, device by device; each records what it made as soon as it exists.
        let effects: [&dyn DeviceEffect; 4] = [&MigCarve, &WholeGpu, &ComputeMode, &VFIO_BIND];
        for effect in effects {
            for index in 0..entry.devices.len() {
                let device = ClaimDevice {
                    uid: &uid,
                    index,
                    record: &entry.devices[index],
                };
                effect.apply(self, &device)?;
                if let Some(recorded) = self.book().checkpoint.claims.get(&uid) {
                    entry.devices[index] = recorded.devices[index].clone();
                }
            }
        }
        // After the carve (the daemon needs the MIG devices' UUIDs) and the compute mode.
        ClaimMps(self.mps.as_ref()).apply(self, &entry)?;
        for (index, record) in entry.devices.iter().enumerate() {
            let device = ClaimDevice {
                uid: &uid,
                index,
                record,
            };
            SharedMps(self.mps.as_ref()).apply(self, &device)?;
        }
        // After the vfio-pci binding (the files name the bound devices), before the CDI spec
        // that mounts them. The memory limits are set by the spec's hook, not here.
        DeviceMetadata(&self.metadata).apply(self, &entry)?;
        MemoryLimit(&self.memory_limits).apply(self, &entry)?;
        let (cdi_devices, claim_edits) = self.claim_spec(&self.book(), &entry);
        self.cdi.write(&uid, &cdi_devices, &claim_edits)?;
        failpoint("prepare-cdi-written");
        entry.state = ClaimState::PrepareCompleted;
        let devices = prepared_devices(&entry);
        let names: Vec<&str> = entry.devices.iter().map(|d| d.device.as_str()).collect();
        tracing::info!(claim = %claim_ref, claimUID = %uid, devices = ?names, "prepared claim");
        self.record_change(|checkpoint| {
            checkpoint.claims.insert(uid.clone(), entry);
        })?;
        failpoint("prepare-completed");
        Ok(devices)
    }

    /// Unprepares one claim; an unknown claim is already unprepared.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let _claim_held = self.busy_claims.acquire(BTreeSet::from([uid.to_string()]));
        let _gpus_held = self.busy_gpus.acquire(self.gpus_of(uid, None));
        let label = {
            let mut book = self.book();
            let Some(entry) = book.checkpoint.claims.get_mut(uid) else {
                return Ok(());
            };
            let label = format!("{}/{}", entry.namespace, entry.name);
            if let Some(reason) = entry.taken_over.as_ref().and_then(|t| t.refused.clone()) {
                return Err(PrepareError::Claim {
                    claim: format!("{label} ({uid})"),
                    reason: format!(
                        "prepared by NVIDIA's driver and not undone by gpu-dra: {reason}; once done, remove the claim from gpu-dra's checkpoint"
                    ),
                });
            }
            if entry.is_completed() {
                entry.state = ClaimState::PrepareStarted;
                self.store.save(&book.checkpoint)?;
                drop(book);
                failpoint("unprepare-started");
            }
            label
        };
        self.roll_back(uid)?;
        tracing::info!(claim = %label, claimUID = %uid, "unprepared claim");
        Ok(())
    }

    /// Undoes whatever is recorded for a claim and forgets it. The caller holds its GPUs.
    fn roll_back(&self, uid: &str) -> Result<(), PrepareError> {
        self.cdi.remove(uid)?;
        failpoint("rollback-cdi-removed");
        let Some(entry) = self.book().checkpoint.claims.get(uid).cloned() else {
            return Ok(());
        };
        // The claim's own effects, in reverse: its metadata files (no CDI spec mounts them now),
        // its MPS daemon before the devices it serves are destroyed or given back their compute
        // mode, and the memory limits its containers left.
        DeviceMetadata(&self.metadata).undo(self, &entry)?;
        ClaimMps(self.mps.as_ref()).undo(self, &entry)?;
        MemoryLimit(&self.memory_limits).undo(self, &entry)?;
        // A shared device stays as it is (carved, its MPS daemon running, its compute mode) until
        // its last claim leaves; a carve this claim made passes to a claim still on it.
        let mut left_to_sharers = BTreeSet::new();
        for (index, record) in entry.devices.iter().enumerate() {
            let sharer = record
                .share_id
                .as_ref()
                .and_then(|_| self.other_sharer(uid, record));
            if let Some((other_uid, other_index)) = sharer {
                left_to_sharers.insert(index);
                if let Some(mig) = record.mig.as_ref().filter(|m| m.created) {
                    self.record_change(|checkpoint| {
                        if let Some(other) = checkpoint
                            .claims
                            .get_mut(&other_uid)
                            .and_then(|c| c.devices.get_mut(other_index))
                        {
                            match other.mig.as_mut() {
                                Some(theirs) => theirs.created = true,
                                None => other.mig = Some(mig.clone()),
                            }
                        }
                        if let Some(stored) = checkpoint.claims.get_mut(uid) {
                            stored.devices[index].mig = Some(MigRecord {
                                created: false,
                                ..mig.clone()
                            });
                        }
                    })?;
                    tracing::info!(device = %record.device, from = %uid, to = %other_uid, "a shared MIG device's carve passes to a claim still using it");
                }
            }
        }
        // The effects in reverse order, from what the checkpoint recorded.
        let shared_mps = SharedMps(self.mps.as_ref());
        let effects: [&dyn DeviceEffect; 5] =
            [&VFIO_BIND, &shared_mps, &ComputeMode, &WholeGpu, &MigCarve];
        for effect in effects {
            for (index, record) in entry.devices.iter().enumerate() {
                if !left_to_sharers.contains(&index) {
                    effect.undo(self, &ClaimDevice { uid, index, record })?;
                }
            }
        }
        let touched: BTreeSet<u32> = entry
            .devices
            .iter()
            .enumerate()
            .filter(|(index, _)| !left_to_sharers.contains(index))
            .filter_map(|(_, d)| d.mig.as_ref().filter(|m| m.created))
            .map(|m| m.parent_minor)
            .collect();
        if let Some(taken_over) = &entry.taken_over {
            remove_nvidia_spec(&taken_over.nvidia_spec)?;
        }
        self.record_change(|checkpoint| {
            checkpoint.claims.remove(uid);
        })?;
        self.refresh(&touched)
    }

    /// Another claim holding `record`'s device shared (a `shareID`): its UID and device index.
    fn other_sharer(&self, uid: &str, record: &DeviceRecord) -> Option<(String, usize)> {
        let book = self.book();
        book.checkpoint
            .claims
            .values()
            .filter(|c| c.uid != uid)
            .find_map(|c| {
                let index = c.devices.iter().position(|d| {
                    d.pool == record.pool && d.device == record.device && d.share_id.is_some()
                })?;
                Some((c.uid.clone(), index))
            })
    }

    /// Starts again the MPS daemons of prepared claims that no longer answer (the driver's
    /// container was restarted and took them with it, or another driver instance of a rolling
    /// update that started them is gone). Returns the daemons started (claim UIDs, or
    /// `shared-<uuid>` for a shared GPU's).
    pub fn repair_mps(&self) -> Result<Vec<String>, PrepareError> {
        let Some(mps) = &self.mps else {
            return Ok(vec![]);
        };
        let candidates: Vec<String> = self
            .book()
            .checkpoint
            .claims
            .values()
            .filter(|c| c.is_completed())
            .filter(|c| {
                c.devices
                    .iter()
                    .any(|d| sharing::wants_mps(d.config.as_ref()))
            })
            .map(|c| c.uid.clone())
            .collect();
        let mut started = Vec::new();
        for uid in candidates {
            let _claim_held = self.busy_claims.acquire(BTreeSet::from([uid.clone()]));
            let _gpus_held = self.busy_gpus.acquire(self.gpus_of(&uid, None));
            // Unprepared meanwhile: nothing to repair.
            let Some(entry) = self
                .book()
                .checkpoint
                .claims
                .get(&uid)
                .filter(|c| c.is_completed())
                .cloned()
            else {
                continue;
            };
            for (key, spec) in mps_daemon::daemons_of(&entry)? {
                if started.contains(&key) || mps.answers(&key) {
                    continue;
                }
                tracing::warn!(claim = %format!("{}/{}", entry.namespace, entry.name), claimUID = %uid, daemon = %key, "an MPS daemon of a prepared claim stopped answering: starting it again");
                mps.start(&key, &spec)?;
                started.push(key);
            }
        }
        Ok(started)
    }

    /// What the owner of a prepared claim should be told (Warning Events): `(reason, note)`.
    pub fn warnings(&self, uid: &str) -> Vec<(&'static str, String)> {
        self.book()
            .checkpoint
            .claims
            .get(uid)
            .map(|entry| {
                let mut warnings = sharing::warnings(&entry.devices);
                warnings.extend(self.memory_limits.for_claim(&entry.devices).1);
                warnings
            })
            .unwrap_or_default()
    }

    /// The AllocatedDeviceStatus entries this driver reports for a prepared claim.
    pub fn device_status(&self, uid: &str) -> Vec<AllocatedDeviceStatus> {
        let book = self.book();
        let Some(entry) = book.checkpoint.claims.get(uid) else {
            return vec![];
        };
        entry
            .devices
            .iter()
            .map(|d| AllocatedDeviceStatus {
                driver: self.config.driver_name.clone(),
                pool: d.pool.clone(),
                device: d.device.clone(),
                share_id: d.share_id.clone(),
                data: Some(RawExtension(serde_json::json!({ "uuid": d.uuid }))),
                ..Default::default()
            })
            .collect()
    }

    /// Plans claims against the book as it is now.
    fn planner<'a>(&'a self, book: &'a Book) -> Planner<'a> {
        Planner {
            config: &self.config,
            modes: self.modes(),
            checkpoint: &book.checkpoint,
            inventory: &book.inventory,
            cdi: &self.cdi,
            mps_available: match (&self.mps, &self.mps_unusable) {
                (Some(_), _) => MpsAvailability::Available,
                (None, Some(reason)) => MpsAvailability::Unusable(reason),
                (None, None) => MpsAvailability::Missing,
            },
            mps_across_namespaces: self.mps_across_namespaces,
            timeslice_unavailable: self.timeslice_unavailable.as_deref(),
        }
    }
}

impl Host for DeviceState {
    fn gpus(&self) -> &dyn GpuControl {
        &*self.gpus
    }

    fn record(&self, change: &mut dyn FnMut(&mut Checkpoint)) -> Result<(), PrepareError> {
        self.record_change(change)
    }

    fn refresh(&self, minors: &BTreeSet<u32>) -> Result<(), PrepareError> {
        DeviceState::refresh(self, minors)
    }

    fn gpu_mode(&self, minor: u32) -> Option<GpuMode> {
        self.modes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&minor)
            .copied()
    }

    fn host_dev_path(&self, path: &str) -> Option<PathBuf> {
        let root = match &self.config.dev_root {
            Some(root) => root.clone(),
            // Simulated GPUs have no kernel making nodes in the host's /dev; a test node's dev
            // root holds the ones its "kernel" made (e2e/cluster), and is looked at as a real one.
            None if self.gpus.simulated() => return None,
            None => PathBuf::from("/"),
        };
        // The kernel makes the node on the host after this container started: the chart mounts
        // neither the host's /dev nor the dev root, so it is looked for through the host's view
        // (the same path where the driver runs on the host).
        Some(
            crate::gpu::driver_tools::HostView::find()
                .path(&root.join(path.trim_start_matches('/'))),
        )
    }

    fn inspect_inventory(&self, look: &mut dyn FnMut(&NodeInventory)) {
        look(&self.book().inventory);
    }

    fn mig_mode(&self, minor: u32) -> (bool, bool) {
        let book = self.book();
        let gpu = book.inventory.gpus.iter().find(|g| g.minor == minor);
        (
            gpu.and_then(|g| g.mig.as_ref())
                .is_some_and(|m| m.mode.current),
            gpu.is_some_and(|g| g.architecture.toggles_mig_without_reset()),
        )
    }
}

/// The claim annotation that names a template's claim in its pod (`resource.kubernetes.io/pod-claim-name`).
const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// Lock keys of GPUs for virtual machines start here (GPU minors are below 256).
const VFIO_LOCK_BASE: u32 = 1 << 16;

fn device_gpu(device: &str) -> Option<u32> {
    if let Some(parsed) = parse_mig_device_name(device) {
        return Some(parsed.parent_minor);
    }
    device.strip_prefix("gpu-")?.parse().ok()
}

fn prepared_devices(entry: &ClaimEntry) -> Vec<PreparedDevice> {
    entry
        .devices
        .iter()
        .map(|d| PreparedDevice {
            request_names: d.request_names.clone(),
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
            share_id: d.share_id.clone(),
        })
        .collect()
}

/// Removes the CDI spec NVIDIA's driver wrote for a claim taken over; a missing one is fine.
fn remove_nvidia_spec(path: &Path) -> Result<(), PrepareError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "removed the CDI spec NVIDIA's driver wrote for a claim taken over");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(super::cdi::CdiError {
            path: path.to_path_buf(),
            reason: format!("cannot remove NVIDIA's driver's spec: {e}"),
        }
        .into()),
    }
}

fn describe(outcome: &LoadOutcome) -> String {
    match outcome {
        LoadOutcome::Fresh => "no checkpoint yet".into(),
        LoadOutcome::Loaded => "checkpoint loaded".into(),
        LoadOutcome::ReplacedNvidia { backup } => format!(
            "NVIDIA's driver's checkpoint, with no claim of this boot (left by its uninstall), replaced; kept at {}",
            backup.display()
        ),
        LoadOutcome::NvidiaClaims { backup, nvidia } => format!(
            "NVIDIA's driver's checkpoint, with {} claim(s) it prepared in this boot, taken over; kept at {}",
            nvidia.claims.len(),
            backup.display()
        ),
        LoadOutcome::PreviousBoot { dropped } => {
            format!(
                "checkpoint from a previous boot: {dropped} claims dropped (they are prepared again on demand)"
            )
        }
    }
}
