//! Simulated GPUs with the real MIG rules.
//!
//! The "hardware" state (MIG mode, GPU and compute instances) lives in a JSON state file guarded by
//! an advisory lock, so it survives driver restarts as real hardware does and several processes
//! (the driver, the fake `libnvidia-ml`, tests) see one truth. GPU and compute instances vanish on
//! reboot (a changed [`boot_id`](super::boot_id)); MIG mode persists.
//!
//! This module holds [`SimNode`] and the lookups every operation shares; each part of the
//! simulated hardware is a module of its own: `spec` (`sim:<N>x<MODEL>`), `state` (the locked
//! state file), `inventory` (what discovery sees), `mig` (GPU and compute instances and their
//! rules), `sharing` (compute mode, time-slice, MPS, memory limits), `holders` (who holds a GPU
//! open), `pci` (driver bindings and the simulated sysfs), `faults` (injected faults and the
//! events they raise), `usage` (simulated processes) and `fabric` (multi-node NVLink).
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::catalog::SimModel;
use super::session::SessionGate;
use super::{GpuError, MigFailure};

mod fabric;
mod faults;
mod holders;
mod inventory;
mod mig;
mod pci;
mod sharing;
mod spec;
mod state;
#[cfg(test)]
mod tests;
mod usage;

pub use fabric::{default_fabric, multi_node_nvlink};
pub use faults::{EVENTS_KEPT, SimEvent, SimEventSource, SimFault};
pub use holders::{SimHolder, SimSession};
pub use inventory::{cuda_version, gpu_uuid, sim_profiles};
pub use mig::full_compute_profile;
pub use pci::{
    PciDriver, UNBIND_STUCK_LIMIT, render_sysfs, sim_iommu_group, sim_modalias, sim_modules_alias,
    sim_pci_location, sim_vfio_aliases, write_fake_sysfs,
};
pub use spec::SimSpec;
pub use state::{
    SimComputeInstance, SimGpuInstance, SimGpuState, SimMemoryLimit, SimMpsDaemon, SimState,
    StateStamp, write_atomically,
};
pub use usage::SimProcess;

use state::{ReadCache, Store};

/// A simulated node. Clones share the hardware (the same file or memory).
#[derive(Clone)]
pub struct SimNode {
    spec: SimSpec,
    node_name: String,
    store: Store,
    /// How long a GPU instance create or destroy takes, as real ones take up to seconds; spent
    /// outside the state lock, so operations on different GPUs overlap as they do on hardware.
    mig_delay: std::time::Duration,
    /// The driver root's `nvidia-smi`, where given: the time-slice interval is set through it,
    /// as on a real node (it changes this state file).
    nvidia_smi: Option<super::driver_tools::NvidiaSmi>,
    /// This process's stand-in for an NVML session (see [`SimNode::with_session`]).
    session: Option<Arc<SessionGate<SimSession>>>,
    /// The state file as this process last read or wrote it, for reads of an unchanged file.
    read_cache: ReadCache,
}

/// A GPU's state whether or not it answers (faults and resets reach lost GPUs too).
/// A GPU bound to another kernel driver is not NVML's at all.
fn gpu_even_if_lost(state: &mut SimState, minor: u32) -> Option<&mut SimGpuState> {
    state
        .gpus
        .iter_mut()
        .find(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
}

fn gpu_state<'a>(
    state: &'a mut SimState,
    minor: u32,
    operation: &'static str,
) -> Result<&'a mut SimGpuState, GpuError> {
    state
        .gpus
        .iter_mut()
        .find(|g| g.minor == minor)
        .ok_or_else(|| mig_err(minor, operation, MigFailure::NotFound, "no such GPU"))
        .and_then(|gpu| {
            if gpu.driver != PciDriver::Nvidia {
                Err(unbound(minor, operation, gpu.driver))
            } else if gpu.lost {
                Err(mig_err(minor, operation, MigFailure::Lost, ""))
            } else {
                Ok(gpu)
            }
        })
}

/// NVML has no handle for a GPU another kernel driver holds.
fn unbound(minor: u32, operation: &'static str, driver: PciDriver) -> GpuError {
    mig_err(
        minor,
        operation,
        MigFailure::NotFound,
        &format!(
            "the GPU is bound to {}, not nvidia: NVML does not see it",
            driver.sysfs_name()
        ),
    )
}

fn mig_err(minor: u32, operation: &'static str, failure: MigFailure, detail: &str) -> GpuError {
    GpuError::Mig {
        minor,
        operation,
        failure,
        detail: detail.to_string(),
    }
}

impl SimNode {
    /// `state`: the state file; `None` keeps state in memory for this process only.
    pub fn new(spec: SimSpec, node_name: &str, state: Option<PathBuf>) -> Self {
        let store = match state {
            Some(path) => Store::File(path),
            None => Store::Memory(Arc::new(Mutex::new(None))),
        };
        Self {
            spec,
            node_name: node_name.to_string(),
            store,
            mig_delay: std::time::Duration::ZERO,
            nvidia_smi: None,
            session: None,
            read_cache: ReadCache::default(),
        }
    }

    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    fn model(&self, minor: u32, operation: &'static str) -> Result<&'static SimModel, GpuError> {
        self.spec
            .models()
            .nth(minor as usize)
            .ok_or_else(|| mig_err(minor, operation, MigFailure::NotFound, "no such GPU"))
    }
}
