//! MIG on simulated GPUs: MIG mode, GPU and compute instances, with the rules real GPUs apply
//! (placements, instance counts, destroy order) and the time their creation takes.
use super::faults::{mig_config_change, raise};
use super::{SimComputeInstance, SimGpuInstance, SimNode, gpu_state, gpu_uuid, mig_err};
use crate::gpu::model::*;
use crate::gpu::{GpuError, MigFailure};

/// GPU instance ids run 0..=14 (mig-minors lists gi0..gi14).
const MAX_GPU_INSTANCE_ID: u32 = 14;

fn mig_uuid(gpu_uuid: &str, serial: u64) -> String {
    let id = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{gpu_uuid}/mig/{serial}").as_bytes(),
    );
    format!("MIG-{id}")
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

impl SimNode {
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

    /// `nvmlDeviceSetMigMode`. Hopper and newer switch at once; Ampere only sets the pending mode
    /// until [`reset_gpu`](Self::reset_gpu). Disabling with instances present is refused.
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
}
