//! How much of a GPU is in use and by which processes, as NVML tells it: read on an interval
//! for the per-claim use metrics, never on the prepare path.
use serde::{Deserialize, Serialize};

/// One GPU's use at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuUsage {
    /// Device memory in use, all processes (and the driver's reservations) together.
    pub memory_used_bytes: u64,
    /// Percent of time a kernel ran over NVML's last sample period; `None` where NVML does not
    /// say (a GPU in MIG mode).
    pub utilization_percent: Option<u32>,
    /// The compute processes, with the MIG device each runs on.
    pub processes: Vec<ProcessUsage>,
}

/// A compute process on a GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessUsage {
    pub pid: u32,
    /// `None` where NVML does not tell (not permitted, or not available in this mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    /// The GPU and compute instance it runs in (MIG mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
}

impl GpuUsage {
    /// The memory the processes in GPU instance `gpu_instance_id` use (NVML gives no memory
    /// figure per MIG device on the parent's handle; the processes' sum is what it tells).
    pub fn gpu_instance_memory(&self, gpu_instance_id: u32) -> u64 {
        self.processes
            .iter()
            .filter(|p| p.gpu_instance_id == Some(gpu_instance_id))
            .filter_map(|p| p.memory_used_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_instances_memory_is_its_processes() {
        let usage = GpuUsage {
            memory_used_bytes: 10 << 30,
            utilization_percent: None,
            processes: vec![
                ProcessUsage {
                    pid: 1,
                    memory_used_bytes: Some(1 << 30),
                    gpu_instance_id: Some(7),
                    compute_instance_id: Some(0),
                },
                ProcessUsage {
                    pid: 2,
                    memory_used_bytes: Some(2 << 30),
                    gpu_instance_id: Some(7),
                    compute_instance_id: Some(0),
                },
                ProcessUsage {
                    pid: 3,
                    memory_used_bytes: Some(4 << 30),
                    gpu_instance_id: Some(8),
                    compute_instance_id: Some(0),
                },
            ],
        };
        assert_eq!(usage.gpu_instance_memory(7), 3 << 30);
        assert_eq!(usage.gpu_instance_memory(9), 0);
    }
}
