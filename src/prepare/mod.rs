//! Preparing allocated devices for containers: the node half of DRA.
//!
//! The kubelet plugin layer ([`crate::plugin`]) turns gRPC requests into calls on a
//! [`NodeDriver`]; this module implements it (claim lookup, MIG carving, sharing config, CDI specs,
//! checkpoint).

/// A claim as kubelet names it in NodePrepareResources / NodeUnprepareResources.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[cfg(test)]
impl ClaimRef {
    /// `ns/claim-<uid>`, for unit tests.
    pub(crate) fn for_test(uid: &str) -> Self {
        Self {
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
        }
    }
}

/// `namespace/name`: how logs name a claim (with `claimUID` beside it).
impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One prepared device, as returned to kubelet.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests this device was allocated for.
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    /// Fully qualified CDI device ids, e.g. `k8s.gpu.nvidia.com/claim=<uid>-gpu-0`.
    pub cdi_device_ids: Vec<String>,
    /// Set for devices with `allowMultipleAllocations` (consumable capacity).
    pub share_id: Option<String>,
}

/// A kubelet call's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Prepare,
    Unprepare,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prepare => "prepare",
            Self::Unprepare => "unprepare",
        }
    }
}

/// Result of preparing one claim: its devices, or an error message for kubelet.
pub type PrepareResult = Result<Vec<PreparedDevice>, String>;
/// Result of unpreparing one claim.
pub type UnprepareResult = Result<(), String>;

/// What the kubelet plugin service needs from the driver. Each claim gets its own result: one bad
/// claim never fails the others.
#[tonic::async_trait]
pub trait NodeDriver: Send + Sync + 'static {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)>;
    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)>;

    /// Devices of the claims prepared now, by NVIDIA's device type for this driver (every type
    /// it has, zero too), for `nvidia_dra_prepared_devices`; empty where the driver's own
    /// observer reports them (the GPU driver counts from its checkpoint).
    fn prepared_device_counts(&self) -> Vec<(&'static str, usize)> {
        Vec::new()
    }
}

pub mod busy;
pub mod cdi;
pub mod cgroup;
pub mod checkpoint;
pub mod claims;
pub mod config;
pub mod driver;
pub mod driver_files;
pub mod effects;
pub mod error;
pub mod failpoint;
pub mod in_flight;
pub mod ldcache;
pub mod lock;
pub mod memory_limits;
pub mod metadata;
pub mod mps;
pub mod nvidia_checkpoint;
pub mod plan;
pub mod sharing;
pub mod state;
pub mod takeover;
pub mod vfio_names;

#[cfg(test)]
mod tests;
