//! GPU faults as NVML reports them: events (XIDs, double-bit ECC errors), each on one GPU and
//! possibly one MIG device of it, and a per-GPU probe (lost or not, what recovery the driver asks
//! for). Both backends deliver them; `crate::health` decides what they mean for devices.
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::GpuError;

/// XIDs that are the application's fault, ignored by default (NVIDIA's list): 13 graphics engine
/// exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor
/// exception, 109 context switch timeout.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// XIDs after which the GPU needs a reset before it is trusted again (NVIDIA's XID catalog: the
/// recovery action is a GPU reset or a reboot): 48 double-bit ECC, 64 row-remapping failure,
/// 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate, 95 uncontained ECC,
/// 119/120 GSP errors. Other XIDs clear after a quiet period.
pub const RESET_REQUIRED_XIDS: [u64; 8] = [48, 64, 74, 79, 92, 95, 119, 120];

/// What happened, as `nvmlEventData_t` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum GpuEventKind {
    /// `nvmlEventTypeXidCriticalError` with its XID.
    Xid { code: u64 },
    /// `nvmlEventTypeDoubleBitEccError`.
    DoubleBitEcc,
    /// `nvmlEventMigConfigChange`: a GPU or compute instance was made or destroyed, by anyone
    /// (this driver, an admin's `nvidia-smi`, another driver). Not a fault: the GPU's MIG
    /// devices are read again.
    MigConfigChange,
}

impl GpuEventKind {
    /// Whether the event says something may be wrong with the GPU.
    pub fn is_fault(&self) -> bool {
        !matches!(self, Self::MigConfigChange)
    }
}

/// One NVML event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuEvent {
    pub minor: u32,
    pub kind: GpuEventKind,
    /// Set when the event hit one MIG device (`gpuInstanceId`/`computeInstanceId` of the event
    /// data; NVML reports 0xFFFFFFFF for "the whole GPU", read here as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
}

/// `nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)`: what the driver asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecoveryAction {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
}

impl RecoveryAction {
    /// `nvmlDeviceGpuRecoveryAction_t`.
    pub fn from_nvml(value: u32) -> Self {
        match value {
            0 => Self::None,
            1 => Self::GpuReset,
            2 => Self::NodeReboot,
            3 => Self::DrainP2p,
            _ => Self::DrainAndReset,
        }
    }

    pub fn nvml_value(&self) -> u32 {
        match self {
            Self::None => 0,
            Self::GpuReset => 1,
            Self::NodeReboot => 2,
            Self::DrainP2p => 3,
            Self::DrainAndReset => 4,
        }
    }
}

/// A GPU's liveness as a periodic probe sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProbe {
    /// NVML answers `NVML_ERROR_GPU_IS_LOST` (or the GPU cannot be reached at all).
    pub lost: bool,
    /// `None` where the driver does not report a recovery action (older than R550).
    pub recovery_action: Option<RecoveryAction>,
}

impl GpuProbe {
    pub const HEALTHY: Self = Self {
        lost: false,
        recovery_action: Some(RecoveryAction::None),
    };
}

/// A registered NVML event set over every GPU of the node.
pub trait GpuEventSource: Send {
    /// Minors of the GPUs whose events this set receives (a GPU that could not register is
    /// missing: its faults go unseen).
    fn watched(&self) -> Vec<u32>;
    /// Waits up to `timeout` for events; returns the ones that arrived (none on timeout).
    fn wait(&mut self, timeout: Duration) -> Result<Vec<GpuEvent>, GpuError>;
}
