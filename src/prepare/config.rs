//! The node driver's static settings ([`DriverConfig`]), read by the orchestrator
//! ([`super::state`]) and the planner ([`super::plan`]) alike: a leaf of its own, so the planner
//! need not import the orchestrator that imports it.
use std::path::PathBuf;

use super::driver_files::DriverRoot;
use crate::gpu::mig::MigPolicy;

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
    /// Whether VFIO devices are published (`--passthrough`): only then are they prepared.
    pub passthrough: bool,
}
