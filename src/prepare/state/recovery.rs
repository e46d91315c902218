//! Recovery at start ([`DeviceState::open`]): the checkpoint loaded, claims NVIDIA's driver
//! prepared taken over, unfinished claims rolled back, what the hardware holds adopted, specs
//! rewritten or removed; and the [`RecoveryReport`] of what it did.
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{Book, DeviceState, DriverConfig, describe, holds_foreign_mig, remove_nvidia_spec};
use crate::gpu::GpuControl;
use crate::gpu::mig::{MigPolicy, choose_modes};
use crate::prepare::busy::BusySet;
use crate::prepare::cdi::CdiStore;
use crate::prepare::checkpoint::{CheckpointError, CheckpointStore, LoadOutcome};
use crate::prepare::effects::{mig_carve, mps_daemon};
use crate::prepare::error::PrepareError;
use crate::prepare::memory_limits::MemoryLimits;
use crate::prepare::metadata::MetadataStore;
use crate::prepare::mps::MpsDaemons;
use crate::prepare::takeover;

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
    /// Claims NVIDIA's driver prepared, now recorded as this driver's (labels).
    pub taken_over: Vec<String>,
    /// Claims NVIDIA's driver prepared that this driver cannot undo (or did not record), with
    /// why: recorded and held, or left for the kubelet to prepare anew.
    pub takeover_refused: Vec<(String, String)>,
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
        let mut inventory = gpus.inventory()?;
        let vfio_names = config
            .passthrough
            .then(|| crate::prepare::vfio_names::VfioNames::new(&config.state_dir));
        if let Some(names) = &vfio_names {
            names.settle(&mut inventory.pci)?;
        }
        // Once, for the driver version NVML reports: no claim waits for it.
        let mut mps = None;
        let mut mps_unusable = None;
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
                mps = tools
                    .find(crate::prepare::mps::CONTROL_PATHS)
                    .map(|control| {
                        MpsDaemons::new(tools.clone(), control, config.state_dir.join("mps"))
                            .on_simulated_gpus(gpus.sim_state_file())
                    });
                // A control binary that cannot run (a loader or library the driver root lacks,
                // no view of the host) serves no claim: MPS claims are refused with the reason,
                // everything else is served.
                if let Some(Err(error)) = mps.as_ref().map(MpsDaemons::check_tools) {
                    tracing::warn!(%error, "MPS claims are refused: its control daemon cannot run here; everything else is served");
                    mps_unusable = Some(error.to_string());
                    mps = None;
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
        let metadata = MetadataStore::new(&config.state_dir, &config.driver_name);
        let timeslice_unavailable = gpus.timeslice_unavailable();
        let state = Self {
            config,
            gpus,
            modes: Default::default(),
            store,
            cdi,
            metadata,
            vfio_names,
            mps,
            mps_unusable,
            timeslice_unavailable,
            book: Mutex::new(Book {
                checkpoint,
                inventory,
            }),
            busy_claims: BusySet::default(),
            busy_gpus: BusySet::default(),
            mps_across_namespaces: false,
            memory_limits,
        };
        if matches!(
            outcome,
            LoadOutcome::Fresh | LoadOutcome::ReplacedNvidia { .. }
        ) {
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
        if let LoadOutcome::NvidiaClaims { nvidia, .. } = &outcome {
            state.take_over(nvidia, &mut report)?;
        }
        state.recover(&mut report)?;
        state.refresh_all()?;
        // MIG devices no prepared claim owns are someone else's, unless we were told to take over.
        let owned = mig_carve::owned(&state.checkpoint());
        let inventory = state.inventory();
        let modes = choose_modes(&inventory.gpus, state.config.mig_policy, |minor| {
            holds_foreign_mig(&inventory.gpus, &owned, minor)
        });
        let minors: Vec<u32> = modes.keys().copied().collect();
        *state.modes_mut() = modes;
        report.instances_destroyed = mig_carve::adopt(&state, minors, &owned)?;
        state.refresh_all()?;
        Ok((state, report))
    }

    /// Records the claims NVIDIA's driver prepared as this driver's (see [`takeover`]); what
    /// cannot be taken over is recorded with its reason, never dropped silently.
    fn take_over(
        &self,
        nvidia: &takeover::NvidiaCheckpoint,
        report: &mut RecoveryReport,
    ) -> Result<(), PrepareError> {
        let settings = takeover::TakeoverSettings {
            cdi_root: &self.config.cdi_root,
            dynamic_mig: matches!(self.config.mig_policy, MigPolicy::Auto | MigPolicy::Dynamic),
            passthrough: self.config.passthrough,
        };
        let taken = takeover::take_over(nvidia, &self.book().inventory, &settings);
        for (entry, reason) in taken.refused() {
            tracing::error!(
                claimUID = %entry.uid,
                %reason,
                "a claim NVIDIA's driver prepared is recorded but cannot be undone by gpu-dra: its devices stay held and its unprepare fails with this reason"
            );
            report
                .takeover_refused
                .push((format!("claim {}", entry.uid), reason.to_string()));
        }
        for (label, reason) in &taken.not_taken {
            tracing::warn!(claim = %label, %reason, "a claim NVIDIA's driver was preparing is not taken over");
            report
                .takeover_refused
                .push((label.clone(), reason.clone()));
        }
        report.taken_over = taken
            .claims
            .iter()
            .filter(|c| c.taken_over.as_ref().is_some_and(|t| t.refused.is_none()))
            .map(|c| format!("claim {}", c.uid))
            .collect();
        self.record_change(|checkpoint| {
            for entry in taken.claims {
                checkpoint.claims.insert(entry.uid.clone(), entry);
            }
        })
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
            let checkpoint = self.book().checkpoint.clone();
            let (stopped, restarted) = mps_daemon::adopt(mps, &checkpoint)?;
            report.mps_stopped = stopped;
            report.mps_restarted = restarted;
        }
        for uid in &completed {
            let taken_over = self.book().checkpoint.claims[uid].taken_over.clone();
            // A refused claim keeps NVIDIA's spec: gpu-dra's would not serve its MPS daemon.
            if taken_over.as_ref().is_some_and(|t| t.refused.is_some()) {
                continue;
            }
            if !self.cdi.spec_path(uid).exists() {
                let spec = {
                    let book = self.book();
                    self.claim_spec(&book, &book.checkpoint.claims[uid])
                };
                self.cdi.write(uid, &spec.0, &spec.1)?;
                report.specs_rewritten.push(uid.clone());
            }
            // Only once ours is written: the same CDI devices, so a container started in between
            // finds one or the other.
            if let Some(taken_over) = &taken_over {
                remove_nvidia_spec(&taken_over.nvidia_spec)?;
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
}
