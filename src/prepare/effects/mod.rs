//! What a prepare changes on the node's hardware, one module per effect, all kept by one
//! protocol so that a crash (kill -9) at any point is undone at the next start:
//!
//! 1. **intent**: what the effect will change is in the claim's checkpoint entry before anything
//!    changes (the MIG placement to carve, the compute mode the GPU had, the daemon it needs);
//! 2. **apply**: the change, and what it made (instance ids, UUIDs) recorded as soon as it
//!    exists, through [`Host::record`];
//! 3. **undo**: from the record alone, whatever happened in between (ids never recorded, a
//!    change never made, one made twice);
//! 4. **adopt**: at start, what the hardware holds that no record explains is removed, and what
//!    a prepared claim needs but the hardware lost is restored.
//!
//! [`DeviceEffect`]s act on one device of a claim: [`mig_carve::MigCarve`],
//! [`mig_mode::WholeGpu`], [`compute_mode::ComputeMode`], [`vfio_bind::VfioBind`],
//! [`mps_daemon::SharedMps`]. [`ClaimEffect`]s act on a claim as a whole: its own MPS daemon
//! ([`mps_daemon::ClaimMps`]), the GPU memory limits its containers leave
//! ([`memory_limit::MemoryLimit`]) and its device metadata files
//! ([`device_metadata::DeviceMetadata`]). The orchestration (which effects, in which order, under
//! which locks) is `DeviceState`'s, in `state.rs`; no effect imports it.
use std::collections::BTreeSet;

use super::checkpoint::{Checkpoint, ClaimEntry, DeviceRecord};
use super::error::PrepareError;
use crate::gpu::mig::GpuMode;
use crate::gpu::{GpuControl, GpuError, NodeInventory};

pub mod compute_mode;
pub mod device_metadata;
pub mod memory_limit;
pub mod mig_carve;
pub mod mig_mode;
pub mod mps_daemon;
pub mod vfio_bind;

/// What an effect needs of the node state it changes: the GPUs, the checkpoint, the inventory.
pub trait Host {
    fn gpus(&self) -> &dyn GpuControl;
    /// Changes the checkpoint and writes it out, in one step no other operation can split.
    fn record(&self, change: &mut dyn FnMut(&mut Checkpoint)) -> Result<(), PrepareError>;
    /// Re-reads these GPUs (held by the caller) after a change to them.
    fn refresh(&self, minors: &BTreeSet<u32>) -> Result<(), PrepareError>;
    /// How the GPU is offered (decided at start).
    fn gpu_mode(&self, minor: u32) -> Option<GpuMode>;
    /// Whether MIG mode is on for a GPU, and whether the GPU can switch it without a reset, as
    /// last read.
    fn mig_mode(&self, minor: u32) -> (bool, bool);
    /// Where a device node the kernel creates on the host (e.g. `/dev/vfio/<group>`) is seen
    /// from here, through the host's view (the container has no host `/dev`), to wait for it;
    /// `None` on simulated GPUs without a dev root, whose "kernel" makes no device nodes (a test
    /// node creates them in its dev root in advance, as it does `/dev/nvidia*`).
    fn host_dev_path(&self, path: &str) -> Option<std::path::PathBuf>;
    /// Lets `look` read the inventory as last read, without copying it. The book stays locked
    /// meanwhile: `look` must not call back into the host.
    fn inspect_inventory(&self, look: &mut dyn FnMut(&NodeInventory));
}

/// Device `index` of claim `uid`, as the checkpoint records it now.
#[derive(Clone, Copy)]
pub struct ClaimDevice<'a> {
    pub uid: &'a str,
    pub index: usize,
    pub record: &'a DeviceRecord,
}

/// One effect on one device of a claim. Applied in order, device by device, after the claim's
/// intent is recorded; undone in reverse order, from the record.
pub trait DeviceEffect {
    /// Changes the hardware for the device.
    fn apply(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError>;
    /// Puts back what [`apply`](Self::apply) changed, also when it stopped half way.
    fn undo(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError>;
}

/// One effect on a claim as a whole, from its checkpoint entry: applied after the device effects
/// (it may need what they made, such as MIG devices' UUIDs), undone before them.
pub trait ClaimEffect {
    /// Makes the change for the claim.
    fn apply(&self, host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError>;
    /// Puts back what [`apply`](Self::apply) changed, also when it stopped half way or never ran.
    fn undo(&self, host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError>;
}

/// A MIG object already gone is what an undo wants.
fn ignore_not_found(result: Result<(), GpuError>) -> Result<(), PrepareError> {
    match result {
        Ok(())
        | Err(GpuError::Mig {
            failure: crate::gpu::MigFailure::NotFound,
            ..
        }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
pub(crate) mod test_host {
    //! A [`Host`] over a simulated node and an in-memory checkpoint, for the effects' own tests.
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use super::{ClaimDevice, Host};
    use crate::gpu::mig::GpuMode;
    use crate::gpu::sim::SimNode;
    use crate::gpu::{GpuControl, NodeInventory};
    use crate::prepare::checkpoint::{Checkpoint, DeviceRecord};
    use crate::prepare::error::PrepareError;

    pub struct TestHost {
        pub sim: SimNode,
        pub checkpoint: Mutex<Checkpoint>,
        pub inventory: Mutex<NodeInventory>,
        pub modes: BTreeMap<u32, GpuMode>,
        /// How many checkpoint writes the effects made.
        pub writes: Mutex<usize>,
    }

    impl TestHost {
        pub fn new(spec: &str, mode: GpuMode) -> Self {
            // With a session, as the driver's: the simulated kernel holds an unbind until it ends.
            let sim = SimNode::new(spec.parse().expect("spec"), "n1", None)
                .with_session()
                .expect("session");
            let inventory = sim.inventory().expect("inventory");
            let modes = inventory.gpus.iter().map(|g| (g.minor, mode)).collect();
            Self {
                sim,
                checkpoint: Mutex::new(Checkpoint::new("boot")),
                inventory: Mutex::new(inventory),
                modes,
                writes: Mutex::new(0),
            }
        }

        pub fn checkpoint(&self) -> Checkpoint {
            self.checkpoint.lock().expect("lock").clone()
        }

        /// Carves a GPU instance of the GPU's first profile at its first placement (MIG mode
        /// on); returns its id.
        pub fn carve_first_profile(&self, minor: u32) -> u32 {
            let inventory = self.sim.inventory().expect("inventory");
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| g.minor == minor)
                .expect("gpu");
            let profile = gpu.mig.as_ref().expect("mig").profiles[0].clone();
            self.sim
                .create_gpu_instance(minor, profile.id, profile.placements[0])
                .expect("carve")
        }
    }

    /// Device 0 of claim `uid`.
    pub fn first(record: &DeviceRecord) -> ClaimDevice<'_> {
        ClaimDevice {
            uid: "uid",
            index: 0,
            record,
        }
    }

    /// A device record of claim pool `n1` with nothing applied yet.
    pub fn record(device: &str) -> DeviceRecord {
        DeviceRecord {
            request_names: vec!["gpu".into()],
            pool: "n1".into(),
            device: device.into(),
            cdi_device_ids: vec![],
            share_id: None,
            consumed: Default::default(),
            admin_access: false,
            uuid: String::new(),
            mig: None,
            config: None,
            sharing: None,
            vfio: None,
            unknown: Default::default(),
        }
    }

    impl Host for TestHost {
        fn gpus(&self) -> &dyn GpuControl {
            &self.sim
        }
        fn record(&self, change: &mut dyn FnMut(&mut Checkpoint)) -> Result<(), PrepareError> {
            change(&mut self.checkpoint.lock().expect("lock"));
            *self.writes.lock().expect("lock") += 1;
            Ok(())
        }
        fn refresh(&self, _minors: &BTreeSet<u32>) -> Result<(), PrepareError> {
            *self.inventory.lock().expect("lock") = self.sim.inventory()?;
            Ok(())
        }
        fn gpu_mode(&self, minor: u32) -> Option<GpuMode> {
            self.modes.get(&minor).copied()
        }
        fn host_dev_path(&self, _path: &str) -> Option<std::path::PathBuf> {
            None
        }
        fn inspect_inventory(&self, look: &mut dyn FnMut(&NodeInventory)) {
            look(&self.inventory.lock().expect("lock"));
        }
        fn mig_mode(&self, minor: u32) -> (bool, bool) {
            let inventory = self.inventory.lock().expect("lock");
            let gpu = inventory.gpus.iter().find(|g| g.minor == minor);
            (
                gpu.and_then(|g| g.mig.as_ref())
                    .is_some_and(|m| m.mode.current),
                gpu.is_some_and(|g| g.architecture.toggles_mig_without_reset()),
            )
        }
    }
}
