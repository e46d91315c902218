//! Prepared-device state: the prepare and unprepare steps, crash recovery and garbage collection.
//!
//! Every change to the node (a carved MIG instance, a CDI spec) is bracketed by checkpoint writes
//! so that a crash at any point is undone at the next start:
//!
//! - prepare: record the claim as `PrepareStarted` with what it will create (only when it creates
//!   hardware state) → carve MIG instances, recording their ids → write the CDI spec → record
//!   `PrepareCompleted`;
//! - unprepare: mark `PrepareStarted` → remove the CDI spec → destroy what was carved → drop the
//!   claim;
//! - start: roll back every claim that is not `PrepareCompleted`, rewrite missing specs of
//!   completed claims, delete specs no claim owns.
//!
//! Concurrency: claims on different GPUs are prepared and unprepared side by side. Each operation
//! first holds its claim (the same claim never interleaves with itself), then every GPU its devices
//! are on (all at once, so two operations never wait on each other), and only then touches the
//! hardware. The in-memory book (checkpoint and inventory) has its own short lock, held to change
//! it and write it out, never across hardware calls. Each operation refreshes only the inventory of
//! the GPUs it holds, so it never overwrites what another operation saw of its own GPU.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, DeviceRequestAllocationResult, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::busy::BusySet;
use super::cdi::{CdiDevice, CdiStore, ContainerEdits};
use super::checkpoint::{
    Checkpoint, CheckpointError, CheckpointStore, ClaimEntry, ClaimState, DeviceRecord,
    LoadOutcome, MigRecord,
};
use super::driver_files::{DriverFilesError, DriverRoot};
use super::failpoint::failpoint;
use super::memory_limits::MemoryLimits;
use super::mps::{MpsDaemons, MpsError};
use super::sharing;
use super::{ClaimRef, PreparedDevice};
use crate::config::{self, DeviceConfig};
use crate::gpu::mig::{
    GpuMode, MigPolicy, choose_modes, gpu_device_name, mig_device_name, parse_mig_device_name,
};
use crate::gpu::{GpuControl, GpuError, NodeInventory, Placement};

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim itself is unusable (not allocated, not ours, bad config...).
    #[error("ResourceClaim {claim}: {reason}")]
    Claim { claim: String, reason: String },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Cdi(#[from] super::cdi::CdiError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    DriverFiles(#[from] DriverFilesError),
    #[error(transparent)]
    Mps(#[from] MpsError),
    /// The operation's own thread failed (a bug); nothing it changed is lost: the checkpoint
    /// says what to undo.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Static settings of the node driver.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub driver_name: String,
    pub mig_policy: MigPolicy,
    /// This node; also the pool name.
    pub node_name: String,
    pub cdi_root: PathBuf,
    pub state_dir: PathBuf,
    /// Where the host's `/dev` is, when not at `/` (CDI `hostPath`s are resolved under it).
    pub dev_root: Option<PathBuf>,
    /// Where the NVIDIA driver's files are: every claim's containers get them. `None` for
    /// simulated GPUs without a driver root (there is no driver to mount).
    pub driver_root: Option<DriverRoot>,
    /// Whether devices are published for several claims at once (`--consumable-shares`): only
    /// then may claims with a `shareID` hold the same device.
    pub consumable: crate::slices::consumable::ConsumableShares,
}

/// What recovery at start did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub checkpoint: Option<String>,
    pub rolled_back: Vec<String>,
    pub specs_rewritten: Vec<String>,
    pub specs_removed: Vec<String>,
    /// MIG instances on dynamic GPUs that no claim owned.
    pub instances_destroyed: Vec<String>,
    /// Prepared claims whose MPS daemon no longer answered, started again.
    pub mps_restarted: Vec<String>,
    /// MPS daemons (and their folders) no prepared claim owned.
    pub mps_stopped: Vec<String>,
}

/// A device of this node a claim result names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Gpu {
        minor: u32,
        uuid: String,
    },
    /// An existing MIG device (static MIG): used as is, never destroyed by us.
    StaticMig {
        parent_minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
        uuid: String,
    },
    /// A free MIG placement: carved at prepare, destroyed at unprepare.
    Placement {
        parent_minor: u32,
        profile_id: u32,
        placement: Placement,
    },
}
/// What the driver knows and has written down: guarded by [`DeviceState::book`].
struct Book {
    checkpoint: Checkpoint,
    inventory: NodeInventory,
}

pub struct DeviceState {
    config: DriverConfig,
    gpus: Arc<dyn GpuControl>,
    /// How each GPU is offered, decided once at start.
    modes: BTreeMap<u32, GpuMode>,
    store: CheckpointStore,
    cdi: CdiStore,
    /// MPS control daemons; `None` where the driver root has no `nvidia-cuda-mps-control`.
    mps: Option<MpsDaemons>,
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
    /// Loads the checkpoint and recovers from whatever a previous run left unfinished.
    pub fn open(
        config: DriverConfig,
        gpus: Arc<dyn GpuControl>,
    ) -> Result<(Self, RecoveryReport), PrepareError> {
        let store = CheckpointStore::new(&config.state_dir);
        let boot_id = crate::gpu::boot_id()?;
        // First of all: an unusable checkpoint stops here, before anything is swept or destroyed.
        let (checkpoint, outcome) = store.load(&boot_id)?;
        for leftover in store.sweep_temp_files()? {
            tracing::info!(path = %leftover.display(), "removed a checkpoint temp file a crash left behind");
        }
        let inventory = gpus.inventory()?;
        // Once, for the driver version NVML reports: no claim waits for it.
        let mut mps = None;
        let mut memory_limits = MemoryLimits::Unavailable(
            "the driver has no driver root (--nvidia-driver-root): the hook needs its NVML".into(),
        );
        let driver_files = match &config.driver_root {
            Some(root) => {
                let files = root.discover(&inventory.driver_version)?;
                tracing::info!(
                    root = %root.here.display(),
                    version = %files.version,
                    libraries = files.libraries.len(),
                    links = files.links.len(),
                    binaries = files.binaries.len(),
                    firmware = files.firmware.len(),
                    sockets = files.sockets.len(),
                    hook = ?files.hook,
                    "driver files found"
                );
                let tools = crate::gpu::driver_tools::DriverRootTools::new(&root.here, &root.host);
                mps = tools.find(super::mps::CONTROL_PATHS).map(|control| {
                    MpsDaemons::new(tools.clone(), control, config.state_dir.join("mps"))
                        .on_simulated_gpus(gpus.sim_state_file())
                });
                if let Some(mps) = &mps {
                    // A control binary that cannot run (a loader or library the driver root
                    // lacks, no view of the host) stops the start: every MPS claim would fail.
                    mps.check_tools()?;
                }
                memory_limits = MemoryLimits::detect(
                    gpus.as_ref(),
                    files.hook.as_deref().map(|h| (h, &files.hook_commands)),
                    &root.host,
                    &tools.host_view().path(Path::new("/sys/fs/cgroup")),
                );
                match &memory_limits {
                    MemoryLimits::Enforced(hook) => {
                        tracing::info!(hook = %hook.hook.display(), "consumed GPU memory is enforced per container (NVML memory limits)")
                    }
                    MemoryLimits::Unavailable(reason) => {
                        tracing::info!(%reason, "consumed GPU memory is not enforced per container")
                    }
                }
                Some(Arc::new(files))
            }
            None => None,
        };
        let cdi = CdiStore::new(&config.cdi_root, &config.driver_name)
            .with_boot_id(&boot_id)
            .with_dev_root(config.dev_root.as_deref())
            .with_driver_files(driver_files);
        let mut state = Self {
            config,
            gpus,
            modes: BTreeMap::new(),
            store,
            cdi,
            mps,
            book: Mutex::new(Book {
                checkpoint,
                inventory,
            }),
            busy_claims: BusySet::default(),
            busy_gpus: BusySet::default(),
            mps_across_namespaces: false,
            memory_limits,
        };
        if outcome == LoadOutcome::Fresh {
            // No checkpoint, yet this driver's work of this boot is on the node: it was lost.
            // Recovery would sweep the specs of running containers (and `--mig dynamic` destroy
            // their MIG devices): refuse instead, exactly as for an unreadable one.
            let found = state.prepared_without_checkpoint(&boot_id)?;
            if !found.is_empty() {
                return Err(CheckpointError::Unusable {
                    path: state.store.path().to_path_buf(),
                    reason: format!(
                        "it is missing, but this driver prepared claims on this node since it booted ({}); restore the checkpoint, or remove these once no pod uses them",
                        found.join("; ")
                    ),
                }
                .into());
            }
        }
        let mut report = RecoveryReport {
            checkpoint: Some(describe(&outcome)),
            ..Default::default()
        };
        state.recover(&mut report)?;
        state.refresh_all()?;
        // MIG devices no prepared claim owns are someone else's, unless we were told to take over.
        let owned = state.owned_gpu_instances();
        let inventory = state.inventory();
        state.modes = choose_modes(&inventory.gpus, state.config.mig_policy, |minor| {
            inventory
                .gpus
                .iter()
                .find(|g| g.minor == minor)
                .and_then(|g| g.mig.as_ref())
                .is_some_and(|m| {
                    m.instances
                        .iter()
                        .any(|i| !owned.contains(&(minor, i.gpu_instance_id)))
                })
        });
        report.instances_destroyed = state.destroy_unowned()?;
        Ok((state, report))
    }

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

    /// A copy of the checkpoint as it is now.
    pub fn checkpoint(&self) -> Checkpoint {
        self.book().checkpoint.clone()
    }

    /// A copy of the inventory as it is now.
    pub fn inventory(&self) -> NodeInventory {
        self.book().inventory.clone()
    }

    pub fn modes(&self) -> &BTreeMap<u32, GpuMode> {
        &self.modes
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

    fn recover(&self, report: &mut RecoveryReport) -> Result<(), PrepareError> {
        let unfinished: Vec<String> = self
            .book()
            .checkpoint
            .claims
            .values()
            .filter(|c| !c.is_completed())
            .map(|c| c.uid.clone())
            .collect();
        for uid in unfinished {
            self.roll_back(&uid)?;
            report.rolled_back.push(uid);
        }
        let completed: BTreeSet<String> = self.book().checkpoint.claims.keys().cloned().collect();
        if let Some(mps) = &self.mps {
            let shared: BTreeMap<String, DeviceRecord> = self
                .book()
                .checkpoint
                .claims
                .values()
                .flat_map(|c| c.devices.iter())
                .filter(|d| sharing::shared_mps(d))
                .map(|d| (sharing::shared_daemon_key(&d.uuid), d.clone()))
                .collect();
            for key in mps.claim_uids()? {
                if !completed.contains(&key) && !shared.contains_key(&key) {
                    mps.stop(&key)?;
                    report.mps_stopped.push(key);
                }
            }
            for (key, record) in &shared {
                if !mps.answers(key) {
                    tracing::warn!(daemon = %key, "the MPS daemon of a shared GPU does not answer: starting it again");
                    mps.start(key, &sharing::shared_daemon_spec(record))?;
                    report.mps_restarted.push(key.clone());
                }
            }
            for uid in &completed {
                let Some(entry) = self.book().checkpoint.claims.get(uid).cloned() else {
                    continue;
                };
                let spec =
                    sharing::daemon_spec(&entry.devices, |d| d.uuid.clone()).map_err(|reason| {
                        PrepareError::Claim {
                            claim: format!("{}/{}", entry.namespace, entry.name),
                            reason,
                        }
                    })?;
                if let Some(spec) = spec
                    && !mps.answers(uid)
                {
                    tracing::warn!(claimUID = %uid, "the MPS daemon of a prepared claim does not answer: starting it again");
                    mps.start(uid, &spec)?;
                    report.mps_restarted.push(uid.clone());
                }
            }
        }
        for uid in &completed {
            if !self.cdi.spec_path(uid).exists() {
                let spec = {
                    let book = self.book();
                    self.claim_spec(&book, &book.checkpoint.claims[uid])
                };
                self.cdi.write(uid, &spec.0, &spec.1)?;
                report.specs_rewritten.push(uid.clone());
            }
        }
        for uid in self.cdi.claim_uids()? {
            if !completed.contains(&uid) {
                self.cdi.remove(&uid)?;
                report.specs_removed.push(uid);
            }
        }
        self.record_change(|_| {})
    }

    /// What this driver leaves on the node for prepared claims, found in boot `boot_id`: its CDI
    /// specs, MPS folders with their shm mounted, and (with `--mig dynamic`, which would destroy
    /// them) MIG devices. One line each.
    fn prepared_without_checkpoint(&self, boot_id: &str) -> Result<Vec<String>, PrepareError> {
        let mut found: Vec<String> = self
            .cdi
            .claim_uids_of_boot(boot_id)?
            .iter()
            .map(|uid| format!("CDI spec {}", self.cdi.spec_path(uid).display()))
            .collect();
        if let Some(mps) = &self.mps {
            found.extend(
                mps.live_claim_uids()?
                    .iter()
                    .map(|uid| format!("MPS folder {}", mps.dir(uid).display())),
            );
        }
        if self.config.mig_policy == MigPolicy::Dynamic {
            found.extend(self.book().inventory.gpus.iter().filter_map(|gpu| {
                let instances = gpu.mig.as_ref().map_or(0, |m| m.instances.len());
                (instances > 0).then(|| format!("{instances} MIG devices on GPU {}", gpu.minor))
            }));
        }
        Ok(found)
    }

    /// The GPUs a claim's devices are on: those its allocation names on this node, and those
    /// recorded for it (a half-done earlier attempt).
    fn gpus_of(&self, uid: &str, claim: Option<&ResourceClaim>) -> BTreeSet<u32> {
        let mut minors: BTreeSet<u32> = claim
            .and_then(|c| c.status.as_ref())
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.driver == self.config.driver_name && r.pool == self.config.node_name)
            .filter_map(|r| device_gpu(&r.device))
            .collect();
        let book = self.book();
        if let Some(entry) = book.checkpoint.claims.get(uid) {
            minors.extend(entry.devices.iter().filter_map(|d| {
                d.mig
                    .as_ref()
                    .map(|m| m.parent_minor)
                    .or_else(|| device_gpu(&d.device))
            }));
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
            if !self.cdi.spec_path(&uid).exists() {
                self.cdi.write(&uid, &cdi_devices, &claim_edits)?;
            }
            return Ok(devices);
        }
        let _gpus_held = self.busy_gpus.acquire(self.gpus_of(&uid, Some(claim)));
        // Still unfinished (an earlier attempt failed or crashed): start over.
        if self.book().checkpoint.claims.contains_key(&uid) {
            self.roll_back(&uid)?;
        }
        let plan = self.plan(&self.book(), claim_ref, claim)?;
        let result = self.apply_plan(claim_ref, plan);
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
        plan: Vec<(DeviceRequestAllocationResult, Target, Option<DeviceConfig>)>,
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
                    sharing::record_before(&*self.gpus, *minor, config.as_ref())?
                }
                _ => None,
            });
        }
        let creates_hardware_state = sharing.iter().any(Option::is_some)
            || plan.iter().any(|(_, t, config)| {
                matches!(t, Target::Placement { .. }) || sharing::wants_mps(config.as_ref())
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
                        self.record(&book, &uid, result, target, config)
                    })
                    .collect(),
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
            self.carve(&uid)?;
            if let Some(carved) = self.book().checkpoint.claims.get(&uid) {
                entry = carved.clone();
            }
        }
        for (_, target, _) in &plan {
            if let Target::Gpu { minor, .. } = target {
                self.ensure_whole(*minor)?;
            }
        }
        for record in &entry.devices {
            sharing::apply(&*self.gpus, record)?;
            if record.sharing.is_some() {
                failpoint("prepare-sharing-applied");
            }
        }
        // After the carve (the daemon needs the MIG devices' UUIDs) and the compute mode.
        let daemon =
            sharing::daemon_spec(&entry.devices, |d| d.uuid.clone()).map_err(|reason| {
                PrepareError::Claim {
                    claim: claim_ref.to_string(),
                    reason,
                }
            })?;
        if let (Some(spec), Some(mps)) = (daemon, &self.mps) {
            mps.start(&uid, &spec)?;
        }
        if let Some(mps) = &self.mps {
            for record in entry.devices.iter().filter(|d| sharing::shared_mps(d)) {
                // Already running when another claim shares the GPU.
                let key = sharing::shared_daemon_key(&record.uuid);
                mps.start(&key, &sharing::shared_daemon_spec(record))?;
            }
        }
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
        // Before the devices it serves are destroyed or given back their compute mode.
        if let Some(mps) = &self.mps {
            mps.stop(uid)?;
        }
        if !self
            .memory_limits
            .for_claim(&entry.devices)
            .0
            .hooks
            .is_empty()
        {
            let minors: Vec<u32> = {
                let book = self.book();
                entry
                    .devices
                    .iter()
                    .filter_map(|d| book.inventory.gpus.iter().find(|g| g.uuid == d.uuid))
                    .map(|g| g.minor)
                    .collect()
            };
            for cgroup in self.memory_limits.clear_left_over(&*self.gpus, &minors) {
                tracing::info!(claimUID = %uid, cgroup = %cgroup.display(), "cleared the GPU memory limit a container left");
            }
        }
        let mut touched = BTreeSet::new();
        for (index, record) in entry.devices.iter().enumerate() {
            // A shared device stays as it is (carved, its MPS daemon running, its compute mode)
            // until its last claim leaves; a carve this claim made passes to a claim still on it.
            let sharer = record
                .share_id
                .as_ref()
                .and_then(|_| self.other_sharer(uid, record));
            if let Some((other_uid, other_index)) = sharer {
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
                continue;
            }
            if sharing::shared_mps(record)
                && let Some(mps) = &self.mps
            {
                mps.stop(&sharing::shared_daemon_key(&record.uuid))?;
            }
            sharing::revert(&*self.gpus, record)?;
            let Some(mig) = record.mig.as_ref().filter(|m| m.created) else {
                continue;
            };
            touched.insert(mig.parent_minor);
            self.destroy_carved(mig)?;
            self.record_change(|checkpoint| {
                if let Some(stored) = checkpoint.claims.get_mut(uid) {
                    stored.devices[index].mig = Some(MigRecord {
                        created: false,
                        ..mig.clone()
                    });
                }
            })?;
            failpoint("rollback-mig-destroyed");
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
            let own =
                sharing::daemon_spec(&entry.devices, |d| d.uuid.clone()).map_err(|reason| {
                    PrepareError::Claim {
                        claim: format!("{}/{}", entry.namespace, entry.name),
                        reason,
                    }
                })?;
            let mut daemons: Vec<(String, super::mps::DaemonSpec)> =
                own.into_iter().map(|spec| (uid.clone(), spec)).collect();
            daemons.extend(
                entry
                    .devices
                    .iter()
                    .filter(|d| sharing::shared_mps(d))
                    .map(|d| {
                        (
                            sharing::shared_daemon_key(&d.uuid),
                            sharing::shared_daemon_spec(d),
                        )
                    }),
            );
            for (key, spec) in daemons {
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

    /// Adopts the checkpoint on disk, and the hardware it describes, when another driver instance
    /// on this node (a rolling update) changed it since this one last wrote it. Call it with the
    /// node lock held and no operation of this instance running.
    pub fn sync_with_disk(&self) -> Result<bool, PrepareError> {
        let boot_id = self.book().checkpoint.node_boot_id.clone();
        let current = self.store.read(&boot_id)?;
        {
            let mut book = self.book();
            if current == book.checkpoint {
                return Ok(false);
            }
            book.checkpoint = current;
        }
        // The other instance changed the hardware behind this one's back.
        self.gpus.invalidate();
        self.refresh_all()?;
        Ok(true)
    }

    /// Discovers the GPUs in `only` (every GPU when `None`) again; returns whether the inventory
    /// changed. Never waits: a GPU an operation holds is skipped (that operation re-reads it
    /// when it is done), so a rescan after a fault on one GPU is not held up by a carve on it or
    /// on any other.
    pub fn rescan(&self, only: Option<&BTreeSet<u32>>) -> Result<bool, PrepareError> {
        let known: BTreeSet<u32> = self.book().inventory.gpus.iter().map(|g| g.minor).collect();
        let wanted = only.cloned().unwrap_or_else(|| known.clone());
        let held = self.busy_gpus.acquire_free(wanted);
        if held.keys().is_empty() && only.is_some() {
            return Ok(false);
        }
        for &minor in held.keys() {
            self.gpus.invalidate_gpu(minor);
        }
        // Only the GPUs held here are read, so a GPU busy with an operation is never waited for.
        // A full rescan also asks every minor the book lacks (device minors are below 256), so
        // GPUs that appeared are still found.
        let mut asked = held.keys().clone();
        if only.is_none() {
            asked.extend((0..256).filter(|m| !known.contains(m)));
        }
        let fresh = self.gpus.inventory_of(&asked)?;
        let mut book = self.book();
        let before = book.inventory.clone();
        let inventory = &mut book.inventory;
        // The GPUs held here are replaced by what they are now (or dropped, if they vanished);
        // a full rescan also adds GPUs that appeared.
        inventory.gpus.retain(|g| !held.keys().contains(&g.minor));
        inventory.gpus.extend(fresh.gpus.into_iter().filter(|g| {
            held.keys().contains(&g.minor) || (only.is_none() && !known.contains(&g.minor))
        }));
        inventory.gpus.sort_by_key(|g| g.minor);
        if only.is_none() {
            inventory.driver_version = fresh.driver_version;
            inventory.cuda_driver_version = fresh.cuda_driver_version;
        }
        Ok(book.inventory != before)
    }

    fn refresh_all(&self) -> Result<(), PrepareError> {
        let inventory = self.gpus.inventory()?;
        self.book().inventory = inventory;
        Ok(())
    }

    /// Re-reads the GPUs in `minors` (held by the caller), leaving every other GPU as the
    /// operation holding it last saw it.
    fn refresh(&self, minors: &BTreeSet<u32>) -> Result<(), PrepareError> {
        if minors.is_empty() {
            return Ok(());
        }
        // Only these: waiting for another GPU's operation in flight would serialise them.
        let fresh = self.gpus.inventory_of(minors)?;
        let mut book = self.book();
        book.inventory.gpus.retain(|g| !minors.contains(&g.minor));
        book.inventory
            .gpus
            .extend(fresh.gpus.into_iter().filter(|g| minors.contains(&g.minor)));
        book.inventory.gpus.sort_by_key(|g| g.minor);
        Ok(())
    }

    fn plan(
        &self,
        book: &Book,
        claim_ref: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Vec<(DeviceRequestAllocationResult, Target, Option<DeviceConfig>)>, PrepareError>
    {
        let name = format!("{}/{}", claim_ref.namespace, claim_ref.name);
        let bad = |reason: String| PrepareError::Claim {
            claim: name.clone(),
            reason,
        };
        let actual_uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if actual_uid != claim_ref.uid {
            return Err(bad(format!(
                "has UID {actual_uid:?}, kubelet asked for {:?}",
                claim_ref.uid
            )));
        }
        let allocation = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .ok_or_else(|| bad("is not allocated".into()))?;
        let configs =
            self.decode_configs(allocation.config.as_deref().unwrap_or_default(), &bad)?;
        let mut plan = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, result) in allocation.results.iter().flatten().enumerate() {
            if result.driver != self.config.driver_name {
                continue;
            }
            let at = format!("status.allocation.devices.results[{i}]");
            if result.pool != self.config.node_name {
                return Err(bad(format!(
                    "{at}: device {:?} is in pool {:?}, not this node's pool {:?}",
                    result.device, result.pool, self.config.node_name
                )));
            }
            let target = self
                .resolve(book, &result.device)
                .map_err(|reason| bad(format!("{at}: device {:?}: {reason}", result.device)))?;
            let admin = result.admin_access == Some(true);
            // A shareID: the scheduler allocated part of a device published for several claims.
            let shared = result.share_id.is_some();
            if shared && !self.config.consumable.is_on() {
                return Err(bad(format!(
                    "{at}.shareID: device {:?} is not published for sharing (--consumable-shares is off)",
                    result.device
                )));
            }
            if !admin
                && let Some(holder) = book.checkpoint.exclusive_holder_of(
                    &result.pool,
                    &result.device,
                    &claim_ref.uid,
                    shared,
                )
            {
                return Err(bad(format!(
                    "{at}: device {:?} is already prepared for ResourceClaim {}/{}",
                    result.device, holder.namespace, holder.name
                )));
            }
            // Stale slices can still offer a placement of a GPU another claim holds whole (or the
            // whole GPU while another claim holds one of its MIG devices): never share a GPU
            // that way, and never switch a GPU that is in use into MIG mode.
            if !admin
                && let Some((holder, device)) =
                    book.checkpoint
                        .holder_on_gpu(&result.pool, &claim_ref.uid, |held| {
                            conflicts_on_gpu(&target, held)
                        })
            {
                return Err(bad(format!(
                    "{at}: device {:?} shares its GPU with {device:?}, which is prepared for ResourceClaim {}/{}",
                    result.device, holder.namespace, holder.name
                )));
            }
            if !admin && result.share_id.is_none() && !seen.insert(result.device.clone()) {
                return Err(bad(format!(
                    "{at}: device {:?} is allocated twice",
                    result.device
                )));
            }
            let config = configs
                .iter()
                .rev()
                .find(|(requests, _, _)| applies_to(requests, &result.request));
            if let Some((_, config, path)) = config {
                let parent = match &target {
                    Target::Gpu { minor, .. } => *minor,
                    Target::StaticMig { parent_minor, .. }
                    | Target::Placement { parent_minor, .. } => *parent_minor,
                };
                let capability = book
                    .inventory
                    .gpus
                    .iter()
                    .find(|g| g.minor == parent)
                    .map_or(0, |g| g.cuda_compute_capability.major);
                sharing::check(config, self.mps.is_some(), capability).map_err(
                    |(field, reason)| {
                        bad(format!(
                            "request {:?}: {path}.{field}: {reason}",
                            result.request
                        ))
                    },
                )?;
                // Sharing settings change the device for everyone on it: never under another
                // claim's processes (an admin-access claim may be prepared beside one). Claims
                // sharing a device through MPS share its one daemon instead.
                let joins_shared_mps = shared && sharing::wants_mps(Some(config));
                if shared && sharing::changes_device(config) && !joins_shared_mps {
                    return Err(bad(format!(
                        "request {:?}: {path}.sharing.strategy: time-slicing changes the GPU for every claim sharing it; claims sharing a GPU (shareID) are time-sliced already, or use MPS",
                        result.request
                    )));
                }
                // Any other claim on the device counts here, admin-access ones included.
                let other_holder = book.checkpoint.claims.values().find(|c| {
                    c.uid != claim_ref.uid
                        && c.devices
                            .iter()
                            .any(|d| d.pool == result.pool && d.device == result.device)
                });
                if sharing::changes_device(config)
                    && !joins_shared_mps
                    && let Some(holder) = other_holder
                {
                    return Err(bad(format!(
                        "request {:?}: {path}.sharing: device {:?} is in use by ResourceClaim {}/{}; its sharing mode cannot change under that claim's processes",
                        result.request, result.device, holder.namespace, holder.name
                    )));
                }
            }
            let config = config.map(|(_, c, _)| c.clone());
            if shared {
                // The claims sharing a GPU all reach it through its one MPS daemon, or none does:
                // a process outside MPS cannot use a GPU in EXCLUSIVE_PROCESS mode.
                let mps = sharing::wants_mps(config.as_ref());
                let other = book.checkpoint.claims.values().find_map(|c| {
                    let d = c.devices.iter().find(|d| {
                        c.uid != claim_ref.uid
                            && d.pool == result.pool
                            && d.device == result.device
                            && d.share_id.is_some()
                    })?;
                    (sharing::wants_mps(d.config.as_ref()) != mps).then_some(c)
                });
                if let Some(other) = other {
                    return Err(bad(format!(
                        "{at}: device {:?} is shared by ResourceClaim {}/{} {} MPS; all claims sharing a GPU must use MPS, or none",
                        result.device,
                        other.namespace,
                        other.name,
                        if mps { "without" } else { "with" }
                    )));
                }
                // One daemon serves every claim on the device: its pipe, shm and control
                // commands are shared, so tenants of different namespaces are kept apart.
                let foreign = book.checkpoint.claims.values().find(|c| {
                    c.uid != claim_ref.uid
                        && c.namespace != claim_ref.namespace
                        && c.devices.iter().any(|d| {
                            d.pool == result.pool
                                && d.device == result.device
                                && sharing::shared_mps(d)
                        })
                });
                if mps
                    && !self.mps_across_namespaces
                    && let Some(other) = foreign
                {
                    return Err(bad(format!(
                        "{at}: device {:?} is shared through one MPS daemon by ResourceClaim {}/{} of namespace {:?}; claims of namespace {:?} and {:?} do not share an MPS daemon (its pipe, shm and control commands are one for all) unless the node allows it (--mps-share-across-namespaces, chart value mpsShareAcrossNamespaces)",
                        result.device,
                        other.namespace,
                        other.name,
                        other.namespace,
                        claim_ref.namespace,
                        other.namespace
                    )));
                }
            }
            match (&target, &config) {
                (Target::Gpu { .. }, Some(DeviceConfig::MigDeviceConfig(_))) => {
                    return Err(bad(format!(
                        "{at}: a MigDeviceConfig cannot apply to full GPU {:?}",
                        result.device
                    )));
                }
                (
                    Target::StaticMig { .. } | Target::Placement { .. },
                    Some(DeviceConfig::GpuConfig(_)),
                ) => {
                    return Err(bad(format!(
                        "{at}: a GpuConfig cannot apply to MIG device {:?}",
                        result.device
                    )));
                }
                _ => {}
            }
            plan.push((result.clone(), target, config));
        }
        // The MPS client limits of a shared GPU address it as the container's device 0.
        if plan.len() > 1
            && let Some((result, _, _)) = plan
                .iter()
                .find(|(r, _, c)| r.share_id.is_some() && sharing::wants_mps(c.as_ref()))
        {
            return Err(bad(format!(
                "request {:?}: device {:?} is a shared GPU with MPS, which must be the claim's only device ({} allocated)",
                result.request,
                result.device,
                plan.len()
            )));
        }
        Ok(plan)
    }

    /// Decodes every opaque config for this driver, strictly; one bad config fails the claim.
    fn decode_configs(
        &self,
        configs: &[k8s_openapi::api::resource::v1::DeviceAllocationConfiguration],
        bad: &dyn Fn(String) -> PrepareError,
    ) -> Result<Vec<(Vec<String>, DeviceConfig, String)>, PrepareError> {
        let mut decoded = Vec::new();
        // Class configs come before claim configs, so a claim's setting wins.
        let ordered = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.source == "FromClass")
            .chain(
                configs
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.source != "FromClass"),
            );
        for (i, c) in ordered {
            let Some(opaque) = c
                .opaque
                .as_ref()
                .filter(|o| o.driver == self.config.driver_name)
            else {
                continue;
            };
            let config = config::decode(&opaque.parameters.0).map_err(|e| {
                bad(format!(
                    "status.allocation.devices.config[{i}].opaque.parameters: {e}"
                ))
            })?;
            decoded.push((
                c.requests.clone().unwrap_or_default(),
                config,
                format!("status.allocation.devices.config[{i}].opaque.parameters"),
            ));
        }
        Ok(decoded)
    }

    fn resolve(&self, book: &Book, device: &str) -> Result<Target, String> {
        for gpu in &book.inventory.gpus {
            if gpu_device_name(gpu.minor) == device {
                if gpu.mig.as_ref().is_some_and(|m| !m.instances.is_empty()) {
                    return Err("its GPU has MIG devices, so it cannot be used whole".into());
                }
                let dynamic = self.modes.get(&gpu.minor) == Some(&GpuMode::Dynamic);
                if gpu.mig.as_ref().is_some_and(|m| m.mode.current)
                    && !(dynamic && gpu.architecture.toggles_mig_without_reset())
                {
                    return Err("its GPU is in MIG mode, so it cannot be used whole".into());
                }
                return Ok(Target::Gpu {
                    minor: gpu.minor,
                    uuid: gpu.uuid.clone(),
                });
            }
        }
        let parsed = parse_mig_device_name(device).ok_or("no such device on this node")?;
        let gpu = book
            .inventory
            .gpus
            .iter()
            .find(|g| g.minor == parsed.parent_minor)
            .ok_or_else(|| format!("no GPU with minor {}", parsed.parent_minor))?;
        let mig = gpu.mig.as_ref().ok_or("its GPU is not MIG-capable")?;
        let profile = mig
            .profile_by_id(parsed.profile_id)
            .ok_or("its GPU has no such MIG profile")?;
        if mig_device_name(gpu.minor, &profile.name, profile.id, parsed.start) != device {
            return Err("the name does not match the GPU's MIG profile".into());
        }
        if let Some(instance) = mig
            .instances
            .iter()
            .find(|i| i.profile_id == parsed.profile_id && i.placement.start == parsed.start)
        {
            return Ok(Target::StaticMig {
                parent_minor: gpu.minor,
                gpu_instance_id: instance.gpu_instance_id,
                compute_instance_id: instance.compute_instance_id,
                uuid: instance.uuid.clone(),
            });
        }
        let placement = profile
            .placements
            .iter()
            .find(|p| p.start == parsed.start)
            .copied()
            .ok_or("no such placement for its profile")?;
        if self.modes.get(&gpu.minor) != Some(&GpuMode::Dynamic) {
            return Err("no such MIG device exists, and its GPU is not in dynamic MIG mode".into());
        }
        Ok(Target::Placement {
            parent_minor: gpu.minor,
            profile_id: profile.id,
            placement,
        })
    }

    fn record(
        &self,
        book: &Book,
        uid: &str,
        result: &DeviceRequestAllocationResult,
        target: &Target,
        config: &Option<DeviceConfig>,
    ) -> DeviceRecord {
        let (uuid, mig) = match target {
            Target::Gpu { uuid, .. } => (uuid.clone(), None),
            Target::StaticMig {
                parent_minor,
                gpu_instance_id,
                compute_instance_id,
                uuid,
            } => {
                let instance = book
                    .inventory
                    .gpus
                    .iter()
                    .find(|g| g.minor == *parent_minor)
                    .and_then(|g| g.mig.as_ref())
                    .and_then(|m| {
                        m.instances
                            .iter()
                            .find(|i| i.gpu_instance_id == *gpu_instance_id)
                    });
                (
                    uuid.clone(),
                    instance.map(|i| MigRecord {
                        parent_minor: *parent_minor,
                        profile_id: i.profile_id,
                        placement: i.placement,
                        created: false,
                        gpu_instance_id: Some(*gpu_instance_id),
                        compute_instance_id: Some(*compute_instance_id),
                    }),
                )
            }
            Target::Placement {
                parent_minor,
                profile_id,
                placement,
            } => (
                String::new(),
                Some(MigRecord {
                    parent_minor: *parent_minor,
                    profile_id: *profile_id,
                    placement: *placement,
                    created: true,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                }),
            ),
        };
        DeviceRecord {
            request_names: vec![result.request.clone()],
            pool: result.pool.clone(),
            device: result.device.clone(),
            cdi_device_ids: vec![self.cdi.device_id(uid, &result.device)],
            share_id: result.share_id.clone(),
            consumed: result
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(name, quantity)| (name.clone(), quantity.0.clone()))
                .collect(),
            admin_access: result.admin_access == Some(true),
            uuid,
            mig,
            config: config.clone(),
            sharing: None,
            unknown: Default::default(),
        }
    }
    /// Creates the MIG instances a started claim planned, recording each id as soon as it exists.
    /// The caller holds the claim's GPUs.
    fn carve(&self, uid: &str) -> Result<(), PrepareError> {
        let planned: Vec<(usize, MigRecord)> = match self.book().checkpoint.claims.get(uid) {
            Some(entry) => entry
                .devices
                .iter()
                .enumerate()
                .filter_map(|(index, d)| Some((index, d.mig.clone()?)))
                .collect(),
            None => return Ok(()),
        };
        let mut touched = BTreeSet::new();
        for (index, mig) in planned {
            if !mig.created || mig.compute_instance_id.is_some() {
                continue;
            }
            touched.insert(mig.parent_minor);
            self.ensure_mig_mode(mig.parent_minor)?;
            let gi =
                self.gpus
                    .create_gpu_instance(mig.parent_minor, mig.profile_id, mig.placement)?;
            // The instance exists; the checkpoint does not know its id yet.
            failpoint("prepare-gi-created-unrecorded");
            self.update_mig(uid, index, |m| m.gpu_instance_id = Some(gi))?;
            failpoint("prepare-gi-created");
            let (ci, mig_uuid) = self.gpus.create_compute_instance(mig.parent_minor, gi)?;
            failpoint("prepare-ci-created-unrecorded");
            self.record_change(|checkpoint| {
                if let Some(device) = checkpoint
                    .claims
                    .get_mut(uid)
                    .map(|e| &mut e.devices[index])
                {
                    if let Some(m) = device.mig.as_mut() {
                        m.compute_instance_id = Some(ci);
                    }
                    device.uuid = mig_uuid;
                }
            })?;
            failpoint("prepare-ci-created");
        }
        self.refresh(&touched)
    }

    fn update_mig(
        &self,
        uid: &str,
        index: usize,
        change: impl FnOnce(&mut MigRecord),
    ) -> Result<(), PrepareError> {
        self.record_change(|checkpoint| {
            if let Some(mig) = checkpoint
                .claims
                .get_mut(uid)
                .and_then(|e| e.devices[index].mig.as_mut())
            {
                change(mig);
            }
        })
    }

    /// Whether MIG mode is on for a GPU, and whether the GPU can switch it without a reset.
    fn mig_mode(&self, minor: u32) -> (bool, bool) {
        let book = self.book();
        let gpu = book.inventory.gpus.iter().find(|g| g.minor == minor);
        (
            gpu.and_then(|g| g.mig.as_ref())
                .is_some_and(|m| m.mode.current),
            gpu.is_some_and(|g| g.architecture.toggles_mig_without_reset()),
        )
    }

    fn ensure_mig_mode(&self, minor: u32) -> Result<(), PrepareError> {
        let (enabled, toggles) = self.mig_mode(minor);
        if !enabled {
            if !toggles {
                return Err(GpuError::Mig {
                    minor,
                    operation: "enable MIG mode",
                    failure: crate::gpu::MigFailure::NotSupported,
                    detail: "this GPU needs a reset to change MIG mode; enable it beforehand"
                        .into(),
                }
                .into());
            }
            self.gpus.set_mig_mode(minor, true)?;
            failpoint("mig-mode-enabled");
            self.refresh(&BTreeSet::from([minor]))?;
        }
        Ok(())
    }

    /// Destroys a carved instance: compute instances, then the GPU instance. Ids that were never
    /// recorded (a crash right after creation) are found by profile and placement, which only this
    /// claim could hold.
    fn destroy_carved(&self, mig: &MigRecord) -> Result<(), PrepareError> {
        let minor = mig.parent_minor;
        let existing = self.gpus.gpu_instances(minor)?;
        let found = existing.iter().find(|gi| match mig.gpu_instance_id {
            Some(id) => gi.id == id,
            None => gi.profile_id == mig.profile_id && gi.placement == mig.placement,
        });
        if let Some(gi) = found {
            for &ci in &gi.compute_instances {
                ignore_not_found(self.gpus.destroy_compute_instance(minor, gi.id, ci))?;
            }
            ignore_not_found(self.gpus.destroy_gpu_instance(minor, gi.id))?;
        }
        self.release_mig_mode(minor)
    }

    /// Turns MIG mode off again on a dynamic GPU that can toggle it once nothing is carved, so the
    /// whole GPU is usable (and behaves) as before.
    fn release_mig_mode(&self, minor: u32) -> Result<(), PrepareError> {
        if self.modes.get(&minor) != Some(&GpuMode::Dynamic) {
            return Ok(());
        }
        let (enabled, toggles) = self.mig_mode(minor);
        if !enabled || !toggles {
            return Ok(());
        }
        if self.gpus.gpu_instances(minor)?.is_empty() {
            self.gpus.set_mig_mode(minor, false)?;
            failpoint("mig-mode-disabled");
        }
        Ok(())
    }

    /// A whole GPU of a dynamic GPU may be left in MIG mode (e.g. a crash after the last instance
    /// was destroyed); switch it off before handing the GPU out whole.
    fn ensure_whole(&self, minor: u32) -> Result<(), PrepareError> {
        let (mig_on, _) = self.mig_mode(minor);
        if mig_on {
            self.release_mig_mode(minor)?;
            self.refresh(&BTreeSet::from([minor]))?;
        }
        Ok(())
    }

    /// (GPU minor, GPU instance id) of every MIG instance a recorded claim holds.
    fn owned_gpu_instances(&self) -> BTreeSet<(u32, u32)> {
        self.book()
            .checkpoint
            .claims
            .values()
            .flat_map(|c| c.devices.iter())
            .filter_map(|d| d.mig.as_ref())
            .filter_map(|m| Some((m.parent_minor, m.gpu_instance_id?)))
            .collect()
    }

    /// Destroys MIG instances on dynamic GPUs that no prepared claim owns (left by a crash, or by
    /// someone else under `--mig dynamic`). Returns "gpu<minor>/gi<id>" of each. Runs at start,
    /// before any other operation.
    fn destroy_unowned(&self) -> Result<Vec<String>, PrepareError> {
        let owned = self.owned_gpu_instances();
        let dynamic: Vec<u32> = self
            .modes
            .iter()
            .filter(|(_, m)| **m == GpuMode::Dynamic)
            .map(|(minor, _)| *minor)
            .collect();
        let mut destroyed = Vec::new();
        for minor in dynamic {
            let instances = match self.gpus.gpu_instances(minor) {
                Ok(instances) => instances,
                // A GPU that fell off the bus holds up nothing else: its leftovers are cleaned
                // at a later start, once it answers.
                Err(GpuError::Mig {
                    failure: crate::gpu::MigFailure::Lost,
                    ..
                }) => {
                    tracing::warn!(
                        gpu = minor,
                        "GPU is lost: its MIG devices no claim owns are left for a later start"
                    );
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            for gi in instances {
                if owned.contains(&(minor, gi.id)) {
                    continue;
                }
                for &ci in &gi.compute_instances {
                    ignore_not_found(self.gpus.destroy_compute_instance(minor, gi.id, ci))?;
                }
                ignore_not_found(self.gpus.destroy_gpu_instance(minor, gi.id))?;
                destroyed.push(format!("gpu{minor}/gi{}", gi.id));
            }
            self.release_mig_mode(minor)?;
        }
        self.refresh_all()?;
        Ok(destroyed)
    }

    /// A claim's spec content: its devices, and what all its containers get (the MPS daemon's
    /// pipe and shm when it has one).
    fn claim_spec(&self, book: &Book, entry: &ClaimEntry) -> (Vec<CdiDevice>, ContainerEdits) {
        let has_daemon = entry
            .devices
            .iter()
            .any(|d| d.share_id.is_none() && sharing::wants_mps(d.config.as_ref()));
        let shared = entry.devices.iter().find(|d| sharing::shared_mps(d));
        let mut edits = match (&self.mps, shared) {
            (Some(mps), _) if has_daemon => mps.container_edits(&entry.uid),
            (Some(mps), Some(record)) => {
                let mut edits = mps.container_edits(&sharing::shared_daemon_key(&record.uuid));
                let shares = match self.config.consumable {
                    crate::slices::consumable::ConsumableShares::Shares(n) => Some(n),
                    _ => None,
                };
                edits.env.extend(sharing::shared_client_env(
                    record,
                    device_memory(book, &record.uuid),
                    shares,
                ));
                edits
            }
            _ => ContainerEdits::default(),
        };
        let (limits, _) = self.memory_limits.for_claim(&entry.devices);
        edits.env.extend(limits.env);
        edits.hooks.extend(limits.hooks);
        (self.cdi_devices(book, entry), edits)
    }

    fn cdi_devices(&self, book: &Book, entry: &ClaimEntry) -> Vec<CdiDevice> {
        entry
            .devices
            .iter()
            .filter_map(|d| match &d.mig {
                Some(mig) => Some(CdiDevice::Mig {
                    name: d.device.clone(),
                    parent_minor: mig.parent_minor,
                    gpu_instance_id: mig.gpu_instance_id?,
                    compute_instance_id: mig.compute_instance_id?,
                    uuid: d.uuid.clone(),
                }),
                None => {
                    let minor = book
                        .inventory
                        .gpus
                        .iter()
                        .find(|g| g.uuid == d.uuid)
                        .map(|g| g.minor)?;
                    Some(CdiDevice::Gpu {
                        name: d.device.clone(),
                        minor,
                        uuid: d.uuid.clone(),
                    })
                }
            })
            .collect()
    }
}

/// Memory of the GPU or MIG device with this UUID.
fn device_memory(book: &Book, uuid: &str) -> u64 {
    book.inventory
        .gpus
        .iter()
        .find_map(|g| {
            if g.uuid == uuid {
                return Some(g.memory_bytes);
            }
            let mig = g.mig.as_ref()?;
            let instance = mig.instances.iter().find(|i| i.uuid == uuid)?;
            Some(mig.profile_by_id(instance.profile_id)?.memory_bytes())
        })
        .unwrap_or_default()
}

/// The minor of the GPU a device name of ours is on (`gpu-<minor>` or a MIG device of it).
fn device_gpu(device: &str) -> Option<u32> {
    if let Some(parsed) = parse_mig_device_name(device) {
        return Some(parsed.parent_minor);
    }
    device.strip_prefix("gpu-")?.parse().ok()
}

fn ignore_not_found(result: Result<(), GpuError>) -> Result<(), PrepareError> {
    match result {
        Ok(())
        | Err(GpuError::Mig {
            failure: crate::gpu::MigFailure::NotFound,
            ..
        }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether a config with these `requests` applies to `request` (`req` or `req/sub`).
fn applies_to(requests: &[String], request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    requests.is_empty() || requests.iter().any(|r| r == request || r == parent)
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

fn describe(outcome: &LoadOutcome) -> String {
    match outcome {
        LoadOutcome::Fresh => "no checkpoint yet".into(),
        LoadOutcome::Loaded => "checkpoint loaded".into(),
        LoadOutcome::PreviousBoot { dropped } => {
            format!(
                "checkpoint from a previous boot: {dropped} claims dropped (they are prepared again on demand)"
            )
        }
    }
}

/// Whether `held` (another claim's device) and `target` cannot both be in use: a whole GPU and any
/// MIG device of that GPU.
fn conflicts_on_gpu(target: &Target, held: &DeviceRecord) -> bool {
    let held_mig_parent = held
        .mig
        .as_ref()
        .map(|m| m.parent_minor)
        .or_else(|| parse_mig_device_name(&held.device).map(|parsed| parsed.parent_minor));
    match target {
        Target::Gpu { minor, .. } => held_mig_parent == Some(*minor),
        Target::StaticMig { parent_minor, .. } | Target::Placement { parent_minor, .. } => {
            held_mig_parent.is_none() && held.device == gpu_device_name(*parent_minor)
        }
    }
}
