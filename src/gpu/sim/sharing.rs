//! GPU sharing on simulated GPUs: compute mode and time-slice (through the driver root's
//! `nvidia-smi` where given), MPS daemons and per-cgroup memory limits.
use std::path::{Path, PathBuf};

use super::{PciDriver, SimMemoryLimit, SimMpsDaemon, SimNode, gpu_even_if_lost};
use crate::gpu::GpuError;
use crate::gpu::memory_limit::{MemoryLimit, MemoryLimitFailure, cgroup_id};
use crate::gpu::model::*;

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

impl SimNode {
    /// Time-slice intervals are set with this `nvidia-smi` (the fake one of a fake driver root).
    pub fn with_nvidia_smi(mut self, smi: Option<crate::gpu::driver_tools::NvidiaSmi>) -> Self {
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
        crate::gpu::memory_limit::check(limit, memory).map_err(fail)?;
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

    /// A full GPU's compute mode and time-slice interval, as NVML reads them.
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
}
