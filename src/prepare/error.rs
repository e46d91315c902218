//! The error of preparing and unpreparing a claim, shared by the orchestrator
//! ([`super::state`]), the planner and every effect ([`super::effects`]): it lives apart from the
//! orchestrator so that the effects depend on it without depending on the orchestrator that
//! applies them.

use super::checkpoint::CheckpointError;
use super::driver_files::DriverFilesError;
use super::metadata::MetadataError;
use super::mps::MpsError;
use crate::gpu::GpuError;

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
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    VfioNames(#[from] super::vfio_names::VfioNamesError),
    /// A device's hardware did not get where preparing it needs it (e.g. a GPU that does not
    /// leave the nvidia driver).
    #[error("device {device}: {reason}")]
    Device { device: String, reason: String },
    /// The operation's own thread failed (a bug); nothing it changed is lost: the checkpoint
    /// says what to undo.
    #[error("internal error: {0}")]
    Internal(String),
}
