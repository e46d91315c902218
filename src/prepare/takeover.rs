//! Taking over the claims NVIDIA's driver (dra-driver-nvidia-gpu) prepared on this node, so a
//! node switches drivers without draining: its pods keep running, and gpu-dra later undoes what
//! NVIDIA's driver did for them, as NVIDIA's unprepare would.
//!
//! NVIDIA's checkpoint lives where ours does (the same driver name, the same plugin folder):
//! `{"checksum", "v1": {...}, "v2": {"preparedClaims": {uid: claim}, "nodeBootID"}}`, v2 read
//! first (v1 is its older copy of the completed claims). Each claim holds device groups, one per
//! opaque config, of devices that are a whole GPU (`gpu.info.uuid`), a MIG device
//! (`mig.concrete`: parent minor, GPU and compute instance ids, its UUID) or a GPU for a virtual
//! machine (`vfio.info.pciBusID`), with `configState` saying whether time-slicing was applied and
//! which MPS control daemon serves the group (read in [`super::nvidia_checkpoint`]). Each becomes
//! a [`DeviceRecord`] of ours that records what to undo:
//!
//! - a whole GPU: nothing, or, where time-slicing was applied, its compute mode and time-slice
//!   set back to the defaults NVIDIA's unprepare sets (`nvidia-smi -c DEFAULT`, time-slice 0);
//! - a MIG device: destroyed at unprepare when NVIDIA's driver carved it (DynamicMIG); left when
//!   it was made by someone else. The checkpoint does not say which, so: carved when gpu-dra
//!   carves MIG devices (`--mig auto`, the default, or `dynamic`) and every MIG device on its GPU
//!   is held by one of NVIDIA's claims (NVIDIA's DynamicMIG destroys every other at its start),
//!   made by someone else otherwise (and its GPU stays static under `auto`);
//! - a GPU for a virtual machine: bound back to `nvidia`, persistence mode on (as NVIDIA's).
//!
//! The claim's CDI spec (NVIDIA's `k8s.gpu.nvidia.com-claim_<uid>.yaml`) names the same CDI
//! devices as ours (`k8s.gpu.nvidia.com/claim=<uid>-<device>`): gpu-dra writes its own for the
//! claim, then removes NVIDIA's, so a container restarted later gets gpu-dra's.
//!
//! What cannot be taken over is refused per claim, with the reason, and never dropped: a claim
//! served by NVIDIA's MPS control daemon (a Deployment NVIDIA's plugin made, with its own shm
//! mount) keeps NVIDIA's spec and is recorded with the reason, so its devices stay held and its
//! unprepare answers the reason; a claim whose prepare had not finished (NVIDIA records nothing of
//! its devices yet) is prepared anew when the kubelet asks again.
use std::collections::BTreeMap;
use std::path::Path;

use super::checkpoint::{
    ClaimEntry, ClaimState, DeviceRecord, MigRecord, SharingRecord, TakenOver, VfioRecord,
};
use super::nvidia_checkpoint::Device;
// Re-exported: the orchestrator names what it takes over here.
pub use super::nvidia_checkpoint::{NvidiaCheckpoint, NvidiaClaim};
use crate::gpu::{ComputeMode, NodeInventory, SharingSettings};

/// NVIDIA's CDI vendor and class: the spec file of claim `<uid>` is
/// `<cdi root>/k8s.gpu.nvidia.com-claim_<uid>.yaml`.
const NVIDIA_SPEC_PREFIX: &str = "k8s.gpu.nvidia.com-claim_";

/// How gpu-dra runs, as far as taking over depends on it.
#[derive(Debug, Clone)]
pub struct TakeoverSettings<'a> {
    pub cdi_root: &'a Path,
    /// gpu-dra carves MIG devices (`--mig auto` or `dynamic`).
    pub dynamic_mig: bool,
    /// VM passthrough is on (`--passthrough`): only then are GPUs for virtual machines handed back.
    pub passthrough: bool,
}

/// What taking over NVIDIA's checkpoint gave.
#[derive(Debug, Default)]
pub struct Takeover {
    /// Claims now recorded as gpu-dra's (refused ones included, with their reason).
    pub claims: Vec<ClaimEntry>,
    /// Claims not recorded, with why (a prepare NVIDIA's driver had not finished).
    pub not_taken: Vec<(String, String)>,
}

impl Takeover {
    /// Claims refused, with their reasons (recorded, held, not undone).
    pub fn refused(&self) -> impl Iterator<Item = (&ClaimEntry, &str)> {
        self.claims.iter().filter_map(|c| {
            c.taken_over
                .as_ref()
                .and_then(|t| t.refused.as_deref())
                .map(|reason| (c, reason))
        })
    }
}

/// NVIDIA's prepared claims as gpu-dra's, given the node as it is now.
pub fn take_over(
    nvidia: &NvidiaCheckpoint,
    inventory: &NodeInventory,
    settings: &TakeoverSettings<'_>,
) -> Takeover {
    let mut takeover = Takeover::default();
    // MIG devices held by NVIDIA's claims, per parent GPU: (GPU instance, compute instance).
    let mut held: BTreeMap<u32, Vec<(u32, u32)>> = BTreeMap::new();
    for claim in nvidia.claims.iter().filter(|c| c.completed) {
        for live in claim
            .groups
            .iter()
            .flat_map(|g| &g.devices)
            .filter_map(|d| d.mig.as_ref()?.concrete.as_ref())
        {
            held.entry(live.parent_minor)
                .or_default()
                .push((live.gi_id, live.ci_id));
        }
    }
    let carved_by_nvidia = |minor: u32| {
        settings.dynamic_mig
            && inventory
                .gpus
                .iter()
                .find(|g| g.minor == minor)
                .and_then(|g| g.mig.as_ref())
                .is_some_and(|mig| {
                    mig.instances.iter().all(|i| {
                        held.get(&minor).is_some_and(|h| {
                            h.contains(&(i.gpu_instance_id, i.compute_instance_id))
                        })
                    })
                })
    };
    for claim in &nvidia.claims {
        if !claim.completed {
            takeover.not_taken.push((
                claim.label(),
                "NVIDIA's driver had not finished preparing it (it records no device before it has): the kubelet's next prepare of it is gpu-dra's".into(),
            ));
            continue;
        }
        let mut refused: Vec<String> = Vec::new();
        let mut devices = Vec::new();
        for group in &claim.groups {
            let mps = &group.config_state.mps_control_daemon_id;
            if !mps.is_empty() {
                refused.push(format!(
                    "its devices are shared through NVIDIA's MPS control daemon {mps} (a Deployment NVIDIA's plugin made, with its own shm mount), which gpu-dra cannot stop: delete the claim's pods while NVIDIA's driver runs, or remove that Deployment and reset the GPUs' compute mode by hand"
                ));
            }
            let time_sliced = group.config_state.time_slice_applied == Some(true);
            for device in &group.devices {
                match record(device, time_sliced, inventory, settings, &carved_by_nvidia) {
                    Ok(record) => devices.push(record),
                    Err(reason) => refused.push(reason),
                }
            }
        }
        takeover.claims.push(ClaimEntry {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            state: ClaimState::PrepareCompleted,
            devices,
            pod_claim_name: None,
            taken_over: Some(TakenOver {
                nvidia_spec: settings.cdi_root.join(format!(
                    "{NVIDIA_SPEC_PREFIX}{}.yaml",
                    claim.uid.replace('/', "_")
                )),
                refused: (!refused.is_empty()).then(|| refused.join("; ")),
            }),
            unknown: serde_json::Map::new(),
        });
    }
    takeover
}

/// One of NVIDIA's prepared devices as a record of ours; `Err` says why it cannot be undone.
fn record(
    device: &Device,
    time_sliced: bool,
    inventory: &NodeInventory,
    settings: &TakeoverSettings<'_>,
    carved_by_nvidia: &dyn Fn(u32) -> bool,
) -> Result<DeviceRecord, String> {
    let kubelet = device
        .gpu
        .as_ref()
        .and_then(|g| g.device.as_ref())
        .or_else(|| device.mig.as_ref().and_then(|m| m.device.as_ref()))
        .or_else(|| device.vfio.as_ref().and_then(|v| v.device.as_ref()))
        .ok_or("a prepared device without its name (no gpu, mig or vfio entry)")?;
    let mut record = DeviceRecord {
        request_names: kubelet.requests.clone(),
        pool: kubelet.pool_name.clone(),
        device: kubelet.device_name.clone(),
        cdi_device_ids: kubelet.cdi_device_ids.clone(),
        share_id: kubelet.share_id.clone(),
        consumed: BTreeMap::new(),
        admin_access: false,
        uuid: String::new(),
        mig: None,
        config: None,
        sharing: None,
        vfio: None,
        unknown: serde_json::Map::new(),
    };
    let name = &kubelet.device_name;
    if let Some(gpu) = &device.gpu {
        record.uuid = gpu
            .info
            .as_ref()
            .map(|i| i.uuid.clone())
            .unwrap_or_default();
        if time_sliced {
            let minor = inventory
                .gpus
                .iter()
                .find(|g| g.uuid == record.uuid)
                .map(|g| g.minor)
                .ok_or_else(|| {
                    format!("device {name}: time-slicing was applied to GPU {} and it is not on the node now, so it cannot be set back", record.uuid)
                })?;
            // What NVIDIA's unprepare sets back: compute mode DEFAULT, time-slice 0.
            record.sharing = Some(SharingRecord {
                minor,
                before: SharingSettings {
                    compute_mode: ComputeMode::Default,
                    timeslice: Some(0),
                },
            });
        }
    } else if let Some(mig) = &device.mig {
        let live = mig.concrete.as_ref().ok_or_else(|| {
            format!("device {name}: NVIDIA's driver recorded no MIG device for it")
        })?;
        record.uuid = live.mig_uuid.clone();
        let instance = inventory
            .gpus
            .iter()
            .find(|g| g.minor == live.parent_minor)
            .and_then(|g| g.mig.as_ref())
            .and_then(|m| {
                m.instances.iter().find(|i| {
                    i.gpu_instance_id == live.gi_id && i.compute_instance_id == live.ci_id
                })
            });
        match instance {
            Some(instance) => {
                record.uuid = instance.uuid.clone();
                record.mig = Some(MigRecord {
                    parent_minor: live.parent_minor,
                    profile_id: instance.profile_id,
                    placement: instance.placement,
                    created: carved_by_nvidia(live.parent_minor),
                    gpu_instance_id: Some(live.gi_id),
                    compute_instance_id: Some(live.ci_id),
                });
            }
            // Gone already (destroyed by hand, a GPU reset): nothing is left to destroy.
            None => tracing::warn!(
                device = %name,
                gpu = live.parent_minor,
                gpu_instance = live.gi_id,
                compute_instance = live.ci_id,
                "NVIDIA's driver prepared a MIG device that no longer exists; taken over with nothing to destroy"
            ),
        }
    } else if let Some(vfio) = &device.vfio {
        if !settings.passthrough {
            return Err(format!(
                "device {name}: a GPU handed to a virtual machine, and gpu-dra runs without --passthrough, so it would not hand it back"
            ));
        }
        let bus_id = vfio
            .info
            .as_ref()
            .map(|i| i.pci_bus_id.to_ascii_lowercase())
            .unwrap_or_default();
        let function = inventory
            .pci
            .gpus
            .iter()
            .find(|f| f.bus_id == bus_id)
            .ok_or_else(|| {
                format!("device {name}: its PCI function {bus_id:?} is not on the node")
            })?;
        let iommu_group = function.iommu_group.ok_or_else(|| {
            format!("device {name}: its PCI function {bus_id} is in no IOMMU group")
        })?;
        record.vfio = Some(VfioRecord {
            bus_id,
            minor: None,
            iommu_group,
            cdev: function.vfio_cdev.clone(),
            // NVIDIA's unprepare turns persistence mode on when the GPU is back on `nvidia`.
            persistence: true,
        });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Placement;
    use crate::gpu::sim::SimNode;

    const BOOT: &str = "boot-1";

    fn settings(root: &Path, dynamic_mig: bool) -> TakeoverSettings<'_> {
        TakeoverSettings {
            cdi_root: root,
            dynamic_mig,
            passthrough: false,
        }
    }

    fn kubelet_device(uid: &str, name: &str, request: &str) -> serde_json::Value {
        serde_json::json!({
            "Requests": [request], "PoolName": "node-a", "DeviceName": name,
            "CDIDeviceIDs": [format!("k8s.gpu.nvidia.com/claim={uid}-{name}")]
        })
    }

    /// A checkpoint as NVIDIA's `MarshalCheckpoint` writes it: v1 beside v2, completed claims
    /// without their names.
    fn nvidia_document(boot: &str, claims: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "checksum": 1446133966u32,
            "v1": {"preparedClaims": {}},
            "v2": {"checksum": 502439073u32, "preparedClaims": claims, "nodeBootID": boot},
        })
    }

    #[test]
    fn ours_and_other_documents_are_not_nvidias() {
        for document in [
            serde_json::json!({"schemaVersion": 1, "claims": {}}),
            serde_json::json!({"checksum": 1}),
            serde_json::json!([1, 2]),
        ] {
            assert!(NvidiaCheckpoint::from_document(&document, BOOT).is_none());
        }
        let broken = serde_json::json!({"checksum": 1, "v2": {"preparedClaims": 7}});
        let error = NvidiaCheckpoint::from_document(&broken, BOOT)
            .expect("NVIDIA's shape")
            .expect_err("unreadable");
        assert!(
            error.contains("NVIDIA's driver's checkpoint cannot be read"),
            "{error}"
        );
    }

    #[test]
    fn another_boots_claims_are_gone_and_v1_counts_as_this_boot() {
        let claim = serde_json::json!({"u-1": {"checkpointState": "PrepareCompleted", "preparedDevices": []}});
        let other = nvidia_document("boot-0", claim.clone());
        let parsed = NvidiaCheckpoint::from_document(&other, BOOT)
            .expect("shape")
            .expect("read");
        assert!(parsed.claims.is_empty());
        let v1_only = serde_json::json!({"checksum": 1, "v1": {"preparedClaims": {"u-2": {"preparedDevices": []}}}});
        let parsed = NvidiaCheckpoint::from_document(&v1_only, BOOT)
            .expect("shape")
            .expect("read");
        assert_eq!(parsed.claims.len(), 1);
        assert!(parsed.claims[0].completed);
        assert_eq!(parsed.claims[0].label(), "claim u-2");
    }

    /// Whole GPU, time-sliced GPU, a MIG device NVIDIA's DynamicMIG carved, an MPS claim and one
    /// still being prepared, on a simulated node whose MIG device exists.
    #[test]
    fn every_kind_of_claim_becomes_ours_or_is_refused_with_its_reason() {
        let node = SimNode::new(
            "sim:2xH100-SXM5-80GB".parse().expect("spec"),
            "node-a",
            None,
        );
        node.set_mig_mode(1, true).expect("MIG mode");
        let gi = node
            .create_gpu_instance(1, 19, Placement { start: 2, size: 1 })
            .expect("GPU instance");
        let (ci, _) = node
            .create_compute_instance(1, gi)
            .expect("compute instance");
        let inventory = node.inventory().expect("inventory");
        let gpu0 = inventory.gpus[0].uuid.clone();
        let mig_uuid = inventory.gpus[1].mig.as_ref().expect("mig").instances[0]
            .uuid
            .clone();
        let group = |devices: serde_json::Value, state: serde_json::Value| serde_json::json!([{"devices": devices, "configState": state}]);
        let no_sharing = serde_json::json!({"mpsControlDaemonID": ""});
        let claims = serde_json::json!({
            "whole": {"checkpointState": "PrepareCompleted", "preparedDevices": group(
                serde_json::json!([{"gpu": {"info": {"uuid": gpu0}, "device": kubelet_device("whole", "gpu-0", "gpu")}, "mig": null}]),
                no_sharing.clone())},
            "sliced": {"checkpointState": "PrepareCompleted", "preparedDevices": group(
                serde_json::json!([{"gpu": {"info": {"uuid": gpu0}, "device": kubelet_device("sliced", "gpu-0", "gpu")}, "mig": null}]),
                serde_json::json!({"mpsControlDaemonID": "", "timeSliceApplied": true}))},
            "carved": {"checkpointState": "PrepareCompleted", "preparedDevices": group(
                serde_json::json!([{"gpu": null, "mig": {"concrete": {"parentMinor": 1, "giId": gi, "ciId": ci, "migUUID": "MIG-stale", "parentUUID": "x"},
                    "device": kubelet_device("carved", "gpu-1-mig-1g10gb-19-2", "mig")}}]),
                no_sharing.clone())},
            "mps": {"checkpointState": "PrepareCompleted", "preparedDevices": group(
                serde_json::json!([{"gpu": {"info": {"uuid": gpu0}, "device": kubelet_device("mps", "gpu-0", "gpu")}, "mig": null}]),
                serde_json::json!({"mpsControlDaemonID": "mps-e5a9c"}))},
            "started": {"checkpointState": "PrepareStarted", "name": "c", "namespace": "ns"},
        });
        let root = Path::new("/var/run/cdi");
        let nvidia = NvidiaCheckpoint::from_document(&nvidia_document(BOOT, claims), BOOT)
            .expect("shape")
            .expect("read");
        let takeover = take_over(&nvidia, &inventory, &settings(root, true));
        let by_uid: BTreeMap<&str, &ClaimEntry> = takeover
            .claims
            .iter()
            .map(|c| (c.uid.as_str(), c))
            .collect();
        assert_eq!(
            by_uid.keys().copied().collect::<Vec<_>>(),
            ["carved", "mps", "sliced", "whole"]
        );
        assert_eq!(takeover.not_taken.len(), 1);
        assert!(takeover.not_taken[0].0.contains("ns/c (started)"));

        let whole = by_uid["whole"];
        assert!(whole.is_completed());
        assert_eq!(whole.devices[0].uuid, gpu0);
        assert_eq!(
            whole.devices[0].cdi_device_ids,
            ["k8s.gpu.nvidia.com/claim=whole-gpu-0"]
        );
        assert!(whole.devices[0].sharing.is_none());
        let taken = whole.taken_over.as_ref().expect("taken over");
        assert_eq!(
            taken.nvidia_spec,
            root.join("k8s.gpu.nvidia.com-claim_whole.yaml")
        );
        assert!(taken.refused.is_none());

        let sharing = by_uid["sliced"].devices[0]
            .sharing
            .as_ref()
            .expect("reset recorded");
        assert_eq!(
            (
                sharing.minor,
                sharing.before.compute_mode,
                sharing.before.timeslice
            ),
            (0, ComputeMode::Default, Some(0))
        );

        let carved = &by_uid["carved"].devices[0];
        let mig = carved.mig.as_ref().expect("MIG record");
        assert_eq!(
            (mig.parent_minor, mig.profile_id, mig.placement),
            (1, 19, Placement { start: 2, size: 1 })
        );
        assert_eq!(
            (mig.gpu_instance_id, mig.compute_instance_id),
            (Some(gi), Some(ci))
        );
        assert!(
            mig.created,
            "every MIG device on GPU 1 is a claim's: NVIDIA's DynamicMIG carved it"
        );
        assert_eq!(
            carved.uuid, mig_uuid,
            "the live UUID, not what the checkpoint says"
        );

        let mps = by_uid["mps"];
        let reason = mps
            .taken_over
            .as_ref()
            .and_then(|t| t.refused.as_deref())
            .expect("refused");
        assert!(reason.contains("MPS control daemon mps-e5a9c"), "{reason}");
        assert_eq!(mps.devices.len(), 1, "a refused claim's devices stay held");
        assert_eq!(takeover.refused().count(), 1);

        // Static MIG (gpu-dra not dynamic), or a GPU with a MIG device no claim holds: someone
        // else's, never destroyed.
        let takeover = take_over(&nvidia, &inventory, &settings(root, false));
        let carved = takeover
            .claims
            .iter()
            .find(|c| c.uid == "carved")
            .expect("carved");
        assert!(!carved.devices[0].mig.as_ref().expect("mig").created);
        let gi2 = node
            .create_gpu_instance(1, 19, Placement { start: 3, size: 1 })
            .expect("GPU instance");
        node.create_compute_instance(1, gi2)
            .expect("compute instance");
        let inventory = node.inventory().expect("inventory");
        let takeover = take_over(&nvidia, &inventory, &settings(root, true));
        let carved = takeover
            .claims
            .iter()
            .find(|c| c.uid == "carved")
            .expect("carved");
        assert!(!carved.devices[0].mig.as_ref().expect("mig").created);
    }

    #[test]
    fn a_vm_claim_needs_passthrough_and_its_pci_function() {
        let node = SimNode::new(
            "sim:1xH100-SXM5-80GB".parse().expect("spec"),
            "node-a",
            None,
        );
        let inventory = node.inventory().expect("inventory");
        let claims = serde_json::json!({"vm": {"checkpointState": "PrepareCompleted", "preparedDevices": [{
            "devices": [{"gpu": null, "mig": null, "vfio": {"info": {"uuid": "c6d6", "pciBusID": "0000:41:00.0"},
                "device": kubelet_device("vm", "gpu-vfio-0", "vm")}}],
            "configState": {"mpsControlDaemonID": ""}}]}});
        let nvidia = NvidiaCheckpoint::from_document(&nvidia_document(BOOT, claims), BOOT)
            .expect("shape")
            .expect("read");
        let root = Path::new("/var/run/cdi");
        let takeover = take_over(&nvidia, &inventory, &settings(root, true));
        let (_, reason) = takeover.refused().next().expect("refused");
        assert!(reason.contains("without --passthrough"), "{reason}");
        let with_passthrough = TakeoverSettings {
            passthrough: true,
            ..settings(root, true)
        };
        let takeover = take_over(&nvidia, &inventory, &with_passthrough);
        let (_, reason) = takeover.refused().next().expect("refused");
        assert!(
            reason.contains("\"0000:41:00.0\" is not on the node"),
            "{reason}"
        );
    }
}
