//! Compute processes on simulated GPUs (`gpu-dra sim process`) and the use NVML reports of them.
use serde::{Deserialize, Serialize};

use super::{PciDriver, SimNode, gpu_even_if_lost, mig_err};
use crate::gpu::{GpuError, MigFailure};

/// A compute process on a simulated GPU (or on one of its MIG devices).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimProcess {
    #[serde(flatten)]
    pub usage: crate::gpu::usage::ProcessUsage,
    /// Percent of the GPU's time it keeps a kernel running (the GPU's utilization is the sum,
    /// at most 100).
    #[serde(default)]
    pub sm_percent: u32,
}

impl SimNode {
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

    /// The GPU's use as NVML reports it: the processes' memory and, outside MIG mode, their
    /// summed utilization.
    pub fn usage(&self, minor: u32) -> Result<crate::gpu::usage::GpuUsage, GpuError> {
        self.read(|state| {
            let gpu = state
                .gpus
                .iter()
                .find(|g| g.minor == minor && !g.lost && g.driver == PciDriver::Nvidia)
                .ok_or_else(|| mig_err(minor, "usage", MigFailure::NotFound, "no such GPU"))?;
            Ok(crate::gpu::usage::GpuUsage {
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
}
