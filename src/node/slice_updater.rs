//! The desired ResourceSlices of this node, rebuilt when prepare (or a rescan) changes the
//! inventory or the health monitor changes the devices' taints; the publisher sends them on.
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;

use crate::gpu::NodeInventory;
use crate::gpu::mig::GpuMode;
use crate::prepare::driver::DriverObserver;
use crate::prepare::state::DeviceState;
use crate::slices::{self, SliceOptions};

/// Pushes new desired slices when prepare (or a rescan) changed the inventory, or the health
/// monitor changed the devices' taints.
pub(super) struct SliceUpdater {
    /// One lock for both inputs, so the two kinds of change never wait on each other in
    /// opposite orders, and the slices sent last are built from the latest of both.
    inputs: std::sync::Mutex<SliceInputs>,
    desired: watch::Sender<Arc<Vec<ResourceSlice>>>,
}

/// What the desired slices are built from.
struct SliceInputs {
    options: SliceOptions,
    inventory: NodeInventory,
}

impl SliceUpdater {
    pub(super) fn new(
        options: SliceOptions,
        inventory: NodeInventory,
        desired: watch::Sender<Arc<Vec<ResourceSlice>>>,
    ) -> Self {
        Self {
            inputs: std::sync::Mutex::new(SliceInputs { options, inventory }),
            desired,
        }
    }

    fn inputs(&self) -> std::sync::MutexGuard<'_, SliceInputs> {
        // Each change is a plain assignment: a panicking holder leaves it usable.
        self.inputs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rebuild(&self, inputs: &SliceInputs) {
        match slices::build(&inputs.inventory, &inputs.options) {
            Ok(slices) => {
                self.desired.send_if_modified(|desired| {
                    if **desired == slices {
                        return false;
                    }
                    *desired = Arc::new(slices);
                    true
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "the changed inventory gives invalid slices; keeping the published ones")
            }
        }
    }

    pub(super) fn set_taints(
        &self,
        taints: std::collections::BTreeMap<
            String,
            Vec<k8s_openapi::api::resource::v1::DeviceTaint>,
        >,
    ) {
        let mut inputs = self.inputs();
        inputs.options.taints = Arc::new(taints);
        self.rebuild(&inputs);
    }
}

impl SliceUpdater {
    fn set_inventory(&self, inventory: NodeInventory, modes: BTreeMap<u32, GpuMode>) {
        let mut inputs = self.inputs();
        let modes = Some(modes);
        if inputs.inventory == inventory && inputs.options.modes == modes {
            return;
        }
        inputs.inventory = inventory;
        inputs.options.modes = modes;
        self.rebuild(&inputs);
    }
}

impl DriverObserver for SliceUpdater {
    fn state_changed(&self, state: &DeviceState) {
        // Read before taking our lock: the state has locks of its own. A GPU a rescan found
        // comes with its mode.
        self.set_inventory(state.inventory(), state.modes());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
        ResourceClaimStatus,
    };
    use tokio::sync::watch;

    use super::*;
    use crate::gpu::mig::MigPolicy;
    use crate::gpu::sim::SimNode;
    use crate::prepare::ClaimRef;
    use crate::prepare::state::DriverConfig;
    use std::time::Duration;

    fn mig_claim(uid: &str, device: &str) -> ResourceClaim {
        let mut claim = ResourceClaim::default();
        claim.metadata.name = Some(format!("claim-{uid}"));
        claim.metadata.namespace = Some("default".into());
        claim.metadata.uid = Some(uid.into());
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "mig".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool: "n1".into(),
                        device: device.into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        claim
    }

    /// A carve changes the node's MIG state: the desired slices are rebuilt from the new
    /// inventory (once), and nothing is sent while the inventory stays the same.
    #[test]
    fn slices_are_rebuilt_after_a_carve_and_only_then() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sim = Arc::new(SimNode::new(
            "sim:1xH100-SXM5-80GB".parse().expect("spec"),
            "n1",
            Some(dir.path().join("hw.json")),
        ));
        let (state, _) = DeviceState::open(
            DriverConfig {
                driver_name: "gpu.nvidia.com".into(),
                mig_policy: MigPolicy::Auto,
                node_name: "n1".into(),
                cdi_root: dir.path().join("cdi"),
                state_dir: dir.path().join("state"),
                dev_root: None,
                driver_root: None,
                consumable: Default::default(),
                passthrough: false,
            },
            sim.clone(),
        )
        .expect("open");
        let options = SliceOptions {
            modes: Some(state.modes().clone()),
            ..SliceOptions::new("gpu.nvidia.com", "n1")
        };
        let before = slices::build(&state.inventory(), &options).expect("slices");
        let (desired, mut seen) = watch::channel(Arc::new(before));
        seen.mark_unchanged();
        let updater = SliceUpdater::new(options.clone(), state.inventory(), desired);
        updater.state_changed(&state);
        assert!(!seen.has_changed().expect("open"), "nothing changed yet");

        let claim_ref = ClaimRef {
            namespace: "default".into(),
            name: "claim-c".into(),
            uid: "c".into(),
        };
        state
            .prepare(&claim_ref, &mig_claim("c", "gpu-0-mig-1g10gb-19-3"))
            .expect("carve");
        updater.state_changed(&state);
        assert!(
            seen.has_changed().expect("open"),
            "the carve is republished"
        );
        let now = seen.borrow_and_update().clone();
        assert_eq!(
            *now,
            slices::build(&state.inventory(), &options).expect("slices"),
            "built from the inventory after the carve"
        );
        assert!(
            state.inventory().gpus[0]
                .mig
                .as_ref()
                .is_some_and(|m| m.instances.len() == 1)
        );
        updater.state_changed(&state);
        assert!(!seen.has_changed().expect("open"), "sent once");
    }

    /// The health monitor (taints) and prepares (inventory) change the slices from different
    /// threads at once, in a loop: every change lands and nothing hangs (the two once took two
    /// locks in opposite orders and could deadlock both runtime workers).
    #[test]
    fn taint_and_inventory_changes_at_once_never_hang() {
        use k8s_openapi::api::resource::v1::DeviceTaint;
        let inventory = crate::gpu::discover(&crate::gpu::DiscoveryConfig::new(
            "sim:2xH100-SXM5-80GB".parse().expect("spec"),
            "n1",
        ))
        .expect("inventory");
        let mut second = inventory.clone();
        second.gpus.pop();
        let options = SliceOptions::new("gpu.nvidia.com", "n1");
        let first = slices::build(&inventory, &options).expect("slices");
        let (desired, seen) = watch::channel(Arc::new(first));
        let updater = Arc::new(SliceUpdater::new(options, inventory.clone(), desired));
        const ROUNDS: usize = 300;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let taints = {
            let (updater, done) = (updater.clone(), done_tx.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let taint = DeviceTaint {
                        key: "gpu.nvidia.com/xid".into(),
                        value: Some((round % 2).to_string()),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    };
                    updater.set_taints(std::collections::BTreeMap::from([(
                        "gpu-0".to_string(),
                        vec![taint],
                    )]));
                }
                let _ = done.send("taints");
            })
        };
        let inventories = {
            let updater = updater.clone();
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let next = if round % 2 == 0 {
                        second.clone()
                    } else {
                        inventory.clone()
                    };
                    let modes = SliceOptions::new("gpu.nvidia.com", "n1").modes(&next);
                    updater.set_inventory(next, modes);
                }
                let _ = done_tx.send("inventory");
            })
        };
        for _ in 0..2 {
            done_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("taint and inventory changes hung");
        }
        taints.join().expect("taints thread");
        inventories.join().expect("inventory thread");
        // The last of both is what is published: the second inventory's ends with 2 GPUs
        // (ROUNDS is even: the last inventory round is odd, the full one), and taint value "1".
        let published = seen.borrow().clone();
        let devices: Vec<_> = published
            .iter()
            .filter_map(|s| s.spec.devices.as_ref())
            .flatten()
            .collect();
        assert!(
            devices.iter().any(|d| d.name == "gpu-1"),
            "the full inventory is the last"
        );
        let gpu0 = devices.iter().find(|d| d.name == "gpu-0").expect("gpu-0");
        let value = gpu0
            .taints
            .as_ref()
            .and_then(|t| t.first())
            .and_then(|t| t.value.clone());
        assert_eq!(value.as_deref(), Some("1"), "the last taint is published");
    }
}
