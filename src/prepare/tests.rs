//! Prepare/unprepare against the simulator, in process.
//!
//! One file (over 900 lines): every test drives the one in-process `Fixture` through prepare,
//! crashes and restarts of the orchestrator; kept together so those windows read side by side.
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;

use super::ClaimRef;
use super::cdi::Spec;
use super::state::{DeviceState, DriverConfig};
use crate::gpu::Placement;
use crate::gpu::sim::SimNode;

struct Fixture {
    _dir: tempfile::TempDir,
    config: DriverConfig,
    sim: Arc<SimNode>,
}

impl Fixture {
    fn new(spec: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let sim = Arc::new(SimNode::new(
            spec.parse().expect("spec"),
            "n1",
            Some(dir.path().join("hw.json")),
        ));
        let config = DriverConfig {
            driver_name: "gpu.nvidia.com".into(),
            mig_policy: crate::gpu::mig::MigPolicy::Auto,
            node_name: "n1".into(),
            cdi_root: dir.path().join("cdi"),
            state_dir: dir.path().join("state"),
            dev_root: None,
            consumable: Default::default(),
            passthrough: false,
            driver_root: None,
        };
        Self {
            _dir: dir,
            config,
            sim,
        }
    }

    fn open(&self) -> DeviceState {
        DeviceState::open(self.config.clone(), self.sim.clone())
            .expect("open")
            .0
    }

    fn cdi_files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.config.cdi_root)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    fn spec(&self, uid: &str) -> Spec {
        let path = self
            .config
            .cdi_root
            .join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
        serde_json::from_slice(&std::fs::read(path).expect("spec exists")).expect("spec parses")
    }

    /// Whether GPU `minor` is in MIG mode now.
    fn mig_on(&self, minor: usize) -> bool {
        self.sim.inventory().expect("inv").gpus[minor]
            .mig
            .as_ref()
            .expect("mig")
            .mode
            .current
    }

    fn instances(&self) -> usize {
        self.sim
            .state()
            .expect("state")
            .gpus
            .iter()
            .map(|g| g.gpu_instances.len())
            .sum()
    }
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

fn result(device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: "gpu".into(),
        driver: "gpu.nvidia.com".into(),
        pool: "n1".into(),
        device: device.into(),
        ..Default::default()
    }
}

fn claim(
    uid: &str,
    results: Vec<DeviceRequestAllocationResult>,
    config: Vec<serde_json::Value>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("claim-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: Some(
                        config
                            .into_iter()
                            .map(|parameters| DeviceAllocationConfiguration {
                                source: "FromClaim".into(),
                                requests: None,
                                opaque: Some(OpaqueDeviceConfiguration {
                                    driver: "gpu.nvidia.com".into(),
                                    parameters: RawExtension(parameters),
                                }),
                            })
                            .collect(),
                    ),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn full_gpu_prepare_is_idempotent_and_unprepare_cleans_up() {
    let f = Fixture::new("sim:2xH100-SXM5-80GB");
    let state = f.open();
    let c = claim("u1", vec![result("gpu-1")], vec![]);
    let first = state.prepare(&claim_ref("u1"), &c).expect("prepare");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].device_name, "gpu-1");
    assert_eq!(first[0].pool_name, "n1");
    assert_eq!(first[0].request_names, ["gpu"]);
    assert_eq!(
        first[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1-gpu-1"]
    );
    let spec = f.spec("u1");
    assert_eq!(spec.devices[0].name, "u1-gpu-1");
    assert_eq!(
        spec.devices[0].container_edits.device_nodes[0].path,
        "/dev/nvidia1"
    );
    let uuid = crate::gpu::sim::gpu_uuid("n1", 1);
    assert_eq!(
        spec.devices[0].container_edits.env,
        [format!("NVIDIA_VISIBLE_DEVICES={uuid}")]
    );
    let checkpoint_before =
        std::fs::read(f.config.state_dir.join("checkpoint.json")).expect("checkpoint");
    assert_eq!(state.prepare(&claim_ref("u1"), &c).expect("again"), first);
    let checkpoint_after =
        std::fs::read(f.config.state_dir.join("checkpoint.json")).expect("checkpoint");
    assert_eq!(
        checkpoint_before, checkpoint_after,
        "repeated prepare changes nothing"
    );
    let status = state.device_status("u1");
    assert_eq!(
        status[0].data.as_ref().map(|d| d.0["uuid"].clone()),
        Some(json!(uuid))
    );
    state.unprepare("u1").expect("unprepare");
    assert!(f.cdi_files().is_empty());
    assert!(state.checkpoint().claims.is_empty());
    state.unprepare("u1").expect("unknown claim is success");
}

#[test]
fn bad_claims_fail_alone_and_change_nothing() {
    let f = Fixture::new("sim:2xH100-SXM5-80GB");
    let state = f.open();
    let ok = claim("good", vec![result("gpu-0")], vec![]);
    state.prepare(&claim_ref("good"), &ok).expect("good claim");
    let before = std::fs::read(f.config.state_dir.join("checkpoint.json")).expect("checkpoint");
    let mut other_pool = result("gpu-1");
    other_pool.pool = "n2".into();
    let bad_config = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "bogus": 1}});
    let mig_config =
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"});
    let cases = vec![
        (
            "x1",
            claim("other-uid", vec![result("gpu-1")], vec![]),
            "has UID",
        ),
        (
            "x2",
            ResourceClaim {
                status: None,
                ..claim("x2", vec![], vec![])
            },
            "is not allocated",
        ),
        (
            "x3",
            claim("x3", vec![other_pool], vec![]),
            "not this node's pool",
        ),
        (
            "x4",
            claim("x4", vec![result("gpu-9")], vec![]),
            "no such device",
        ),
        (
            "x5",
            claim("x5", vec![result("gpu-1")], vec![bad_config]),
            "strict decoding error: unknown field \"bogus\"",
        ),
        (
            "x6",
            claim("x6", vec![result("gpu-0")], vec![]),
            "already prepared for ResourceClaim default/claim-good",
        ),
        (
            "x7",
            claim("x7", vec![result("gpu-1")], vec![mig_config]),
            "MigDeviceConfig cannot apply",
        ),
        (
            "x8",
            claim("x8", vec![result("gpu-0-mig-3g40gb-9-2")], vec![]),
            "no such placement",
        ),
    ];
    for (uid, c, needle) in cases {
        let e = state
            .prepare(&claim_ref(uid), &c)
            .expect_err(uid)
            .to_string();
        assert!(e.contains(needle), "{uid}: {e}");
        assert!(
            e.contains(&format!("ResourceClaim default/claim-{uid}")),
            "names the claim: {e}"
        );
    }
    assert_eq!(f.cdi_files(), ["k8s.gpu.nvidia.com-claim_good.json"]);
    let after = std::fs::read(f.config.state_dir.join("checkpoint.json")).expect("checkpoint");
    assert_eq!(before, after);
    // Admin access may share a prepared device.
    let mut admin = result("gpu-0");
    admin.admin_access = Some(true);
    state
        .prepare(&claim_ref("adm"), &claim("adm", vec![admin], vec![]))
        .expect("admin access");
}

#[test]
fn mig_placements_are_carved_and_destroyed() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let state = f.open();
    let c = claim("m1", vec![result("gpu-0-mig-3g40gb-9-4")], vec![]);
    let prepared = state.prepare(&claim_ref("m1"), &c).expect("prepare");
    assert_eq!(prepared[0].device_name, "gpu-0-mig-3g40gb-9-4");
    let hw = f.sim.inventory().expect("inventory");
    let mig = hw.gpus[0].mig.as_ref().expect("mig");
    assert!(mig.mode.current, "MIG mode enabled on demand (Hopper)");
    assert_eq!(mig.instances.len(), 1);
    assert_eq!(mig.instances[0].placement, Placement { start: 4, size: 4 });
    let spec = f.spec("m1");
    let nodes: Vec<_> = spec.devices[0]
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.clone())
        .collect();
    let gi = mig.instances[0].gpu_instance_id;
    assert_eq!(
        nodes,
        [
            "/dev/nvidia0".to_string(),
            format!("/dev/nvidia-caps/nvidia-cap{}", 3 + 9 * gi),
            format!("/dev/nvidia-caps/nvidia-cap{}", 3 + 9 * gi + 1),
        ]
    );
    assert_eq!(
        spec.devices[0].container_edits.env,
        [format!("NVIDIA_VISIBLE_DEVICES={}", mig.instances[0].uuid)]
    );
    // The whole GPU is now unavailable.
    let e = state
        .prepare(&claim_ref("w"), &claim("w", vec![result("gpu-0")], vec![]))
        .expect_err("whole GPU");
    assert!(e.to_string().contains("has MIG devices"), "{e}");
    state.unprepare("m1").expect("unprepare");
    assert_eq!(f.instances(), 0);
    assert!(f.cdi_files().is_empty());
}

#[test]
fn static_mig_devices_are_used_not_destroyed() {
    let f = Fixture::new("sim:1xA100-SXM4-40GB");
    f.sim.set_mig_mode(0, true).expect("mode");
    f.sim.reset_gpu(0).expect("reset");
    let gi = f
        .sim
        .create_gpu_instance(0, 19, Placement { start: 2, size: 1 })
        .expect("gi");
    f.sim.create_compute_instance(0, gi).expect("ci");
    let state = f.open();
    let c = claim(
        "s1",
        vec![result("gpu-0-mig-1g5gb-19-2")],
        vec![
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}),
        ],
    );
    state.prepare(&claim_ref("s1"), &c).expect("prepare");
    state.unprepare("s1").expect("unprepare");
    assert_eq!(
        f.instances(),
        1,
        "a pre-created instance survives unprepare"
    );
}

#[test]
fn restart_rolls_back_unfinished_claims_and_removes_orphan_specs() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    {
        let state = f.open();
        state
            .prepare(
                &claim_ref("done"),
                &claim("done", vec![result("gpu-0-mig-1g10gb-19-0")], vec![]),
            )
            .expect("prepare");
    }
    // Simulate a crash in the middle of a second prepare: recorded as started, instance carved,
    // spec written, never completed. Plus a spec nobody owns, and a lost spec of a completed claim.
    let cp_path = f.config.state_dir.join("checkpoint.json");
    let mut cp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cp_path).expect("read")).expect("json");
    let gi = f
        .sim
        .create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
        .expect("gi");
    f.sim.create_compute_instance(0, gi).expect("ci");
    cp["claims"]["half"] = json!({
        "namespace": "default", "name": "claim-half", "uid": "half", "state": "PrepareStarted",
        "devices": [{"requestNames": ["gpu"], "pool": "n1", "device": "gpu-0-mig-3g40gb-9-4",
                     "mig": {"parentMinor": 0, "profileId": 9, "placement": {"start": 4, "size": 4}, "created": true}}]
    });
    std::fs::write(&cp_path, serde_json::to_vec(&cp).expect("encode")).expect("write");
    std::fs::write(
        f.config.cdi_root.join("k8s.gpu.nvidia.com-claim_half.json"),
        "{}",
    )
    .expect("spec");
    std::fs::write(
        f.config
            .cdi_root
            .join("k8s.gpu.nvidia.com-claim_orphan.json"),
        r#"{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","annotations":{"gpu-dra.io/driver":"gpu.nvidia.com"},"devices":[]}"#,
    )
    .expect("spec");
    std::fs::remove_file(f.config.cdi_root.join("k8s.gpu.nvidia.com-claim_done.json"))
        .expect("lose spec");
    std::fs::write(f.config.cdi_root.join("other-vendor.json"), "{}").expect("foreign spec");

    let (state, report) = DeviceState::open(f.config.clone(), f.sim.clone()).expect("reopen");
    assert_eq!(report.rolled_back, ["half"]);
    assert_eq!(report.specs_rewritten, ["done"]);
    assert_eq!(report.specs_removed, ["orphan"]);
    assert_eq!(
        f.cdi_files(),
        ["k8s.gpu.nvidia.com-claim_done.json", "other-vendor.json"]
    );
    assert_eq!(
        f.instances(),
        1,
        "only the completed claim's instance is left"
    );
    assert_eq!(
        state.checkpoint().claims.keys().collect::<Vec<_>>(),
        ["done"]
    );
}

#[test]
fn dynamic_gpus_leave_mig_mode_when_empty_and_orphans_go_only_when_told() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let state = f.open();
    state
        .prepare(
            &claim_ref("m"),
            &claim("m", vec![result("gpu-0-mig-2g20gb-14-2")], vec![]),
        )
        .expect("prepare");
    state.unprepare("m").expect("unprepare");
    assert!(
        !f.mig_on(0),
        "MIG mode is switched off once nothing is carved (Hopper)"
    );
    drop(state);

    // Someone else's instance: kept (GPU static) under auto, destroyed under dynamic.
    f.sim.set_mig_mode(0, true).expect("mode");
    let gi = f
        .sim
        .create_gpu_instance(0, 5, Placement { start: 0, size: 4 })
        .expect("gi");
    f.sim.create_compute_instance(0, gi).expect("ci");
    let state = f.open();
    assert_eq!(state.modes()[&0], crate::gpu::mig::GpuMode::Static);
    assert_eq!(f.instances(), 1);
    drop(state);
    let config = DriverConfig {
        mig_policy: crate::gpu::mig::MigPolicy::Dynamic,
        ..f.config.clone()
    };
    let (state, report) = DeviceState::open(config, f.sim.clone()).expect("open");
    assert_eq!(state.modes()[&0], crate::gpu::mig::GpuMode::Dynamic);
    assert_eq!(report.instances_destroyed, [format!("gpu0/gi{gi}")]);
    assert_eq!(f.instances(), 0);
    assert!(
        !f.mig_on(0),
        "MIG mode is switched off once the adopted GPU is empty (Hopper)"
    );
}

/// A GPU bound to vfio-pci when the driver starts (a virtual machine had it) is not in the
/// inventory then; when it comes back to the NVIDIA driver, a rescan gives it a mode by the MIG
/// policy (dynamic for an idle H100 under auto), and the slices offer its placements. One that
/// comes back holding someone else's MIG device is offered as it is (static), and nothing of
/// it is destroyed.
#[test]
fn a_gpu_not_seen_at_start_gets_a_mode_when_it_appears() {
    use crate::gpu::mig::{GpuMode, MigPolicy};
    use crate::gpu::sim::PciDriver;
    let f = Fixture::new("sim:2xH100-SXM5-80GB");
    f.sim.bind_driver(1, PciDriver::VfioPci).expect("to vfio");
    let state = f.open();
    assert_eq!(state.modes().get(&1), None, "{:?}", state.modes());
    assert_eq!(state.modes()[&0], GpuMode::Dynamic);
    f.sim.bind_driver(1, PciDriver::Nvidia).expect("back");
    assert!(
        state.rescan(None).expect("rescan"),
        "the GPU and its mode are news"
    );
    assert_eq!(state.modes()[&1], GpuMode::Dynamic);
    let options = crate::slices::SliceOptions {
        modes: Some(state.modes()),
        ..crate::slices::SliceOptions::new("gpu.nvidia.com", "n1")
    };
    let names: Vec<String> = crate::slices::build(&state.inventory(), &options)
        .expect("slices")
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("gpu-1-mig-")),
        "GPU 1's placements are offered: {names:?}"
    );
    assert!(
        !state.rescan(None).expect("rescan"),
        "nothing new the second time"
    );
    drop(state);

    // Back with someone else's MIG device, even under --mig dynamic: static, kept.
    f.sim.bind_driver(1, PciDriver::VfioPci).expect("to vfio");
    let config = DriverConfig {
        mig_policy: MigPolicy::Dynamic,
        ..f.config.clone()
    };
    let (state, _) = DeviceState::open(config, f.sim.clone()).expect("open");
    f.sim.bind_driver(1, PciDriver::Nvidia).expect("back");
    f.sim.set_mig_mode(1, true).expect("mode");
    let gi = f
        .sim
        .create_gpu_instance(1, 5, Placement { start: 0, size: 4 })
        .expect("gi");
    f.sim.create_compute_instance(1, gi).expect("ci");
    assert!(state.rescan(None).expect("rescan"));
    assert_eq!(state.modes()[&1], GpuMode::Static);
    assert_eq!(f.instances(), 1, "someone else's MIG device is kept");
}

/// Rolling update: two driver instances on one node, each with its own in-memory state. What one
/// prepared, the other sees (and can unprepare) once it syncs with the checkpoint on disk.
#[test]
fn a_second_instance_adopts_the_first_ones_claims() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let old = f.open();
    let new = f.open();
    let c = claim("m1", vec![result("gpu-0-mig-3g40gb-9-4")], vec![]);
    old.prepare(&claim_ref("m1"), &c)
        .expect("prepare on the old instance");
    assert_eq!(f.instances(), 1);

    assert!(
        new.sync_with_disk().expect("sync"),
        "the checkpoint changed"
    );
    assert!(
        !new.sync_with_disk().expect("sync"),
        "and now it is current"
    );
    assert_eq!(new.claims(), [claim_ref("m1")]);
    // Its view of the hardware followed: the carved placement is taken.
    let e = new
        .prepare(&claim_ref("w"), &claim("w", vec![result("gpu-0")], vec![]))
        .expect_err("whole GPU");
    assert!(e.to_string().contains("has MIG devices"), "{e}");
    new.unprepare("m1").expect("unprepare on the new instance");
    assert_eq!(f.instances(), 0);
    assert!(f.cdi_files().is_empty());

    assert!(old.sync_with_disk().expect("sync"));
    assert!(old.claims().is_empty());
}

/// Stale slices can offer a MIG placement of a GPU another claim holds whole: refused before any
/// hardware changes (no MIG mode switch under a running workload).
#[test]
fn a_gpu_held_whole_is_never_carved() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let state = f.open();
    state
        .prepare(&claim_ref("w"), &claim("w", vec![result("gpu-0")], vec![]))
        .expect("whole GPU");
    let e = state
        .prepare(
            &claim_ref("m"),
            &claim("m", vec![result("gpu-0-mig-1g10gb-19-0")], vec![]),
        )
        .expect_err("placement on a GPU held whole");
    assert!(
        e.to_string().contains("shares its GPU with \"gpu-0\"")
            && e.to_string().contains("default/claim-w"),
        "{e}"
    );
    assert_eq!(f.instances(), 0);
    let hw = f.sim.inventory().expect("inventory");
    assert!(
        !hw.gpus[0].mig.as_ref().expect("mig").mode.current,
        "MIG mode untouched"
    );
    assert_eq!(state.claims(), [claim_ref("w")]);
}

/// A prepare that fails after carving gives the MIG instance back at once.
#[test]
fn a_failed_prepare_rolls_back_its_carved_instances() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let state = f.open();
    // CDI specs cannot be written: the root is a file.
    std::fs::write(&f.config.cdi_root, b"not a directory").expect("write");
    let e = state
        .prepare(
            &claim_ref("m"),
            &claim("m", vec![result("gpu-0-mig-1g10gb-19-0")], vec![]),
        )
        .expect_err("CDI write fails");
    assert!(e.to_string().contains("cdi"), "{e}");
    assert_eq!(f.instances(), 0, "the carved instance was destroyed");
    assert!(state.claims().is_empty(), "nothing left in the checkpoint");
}

/// Garbage collection unprepares claims that were deleted, deallocated, or allocated elsewhere;
/// a claim still allocated here stays.
#[tokio::test]
async fn garbage_collection_drops_claims_no_longer_allocated_here() {
    use super::NodeDriver;
    use super::claims::MemoryClaims;
    use super::driver::Driver;

    let f = Fixture::new("sim:1xH100-SXM5-80GB,2xT4");
    let claims = Arc::new(MemoryClaims::default());
    let keep = claim("keep", vec![result("gpu-1")], vec![]);
    let deallocated = claim("dealloc", vec![result("gpu-2")], vec![]);
    let moved = claim("moved", vec![result("gpu-0-mig-1g10gb-19-0")], vec![]);
    for c in [&keep, &deallocated, &moved] {
        claims.insert(c.clone());
    }
    let driver = Driver::new(f.open(), claims.clone()).with_gc_grace(std::time::Duration::ZERO);
    let prepared = driver
        .prepare(vec![
            claim_ref("keep"),
            claim_ref("dealloc"),
            claim_ref("moved"),
        ])
        .await;
    assert!(prepared.iter().all(|(_, r)| r.is_ok()), "{prepared:?}");
    assert_eq!(f.instances(), 1);

    let mut now_deallocated = deallocated.clone();
    if let Some(status) = now_deallocated.status.as_mut() {
        status.allocation = None;
    }
    claims.insert(now_deallocated);
    let mut elsewhere = moved.clone();
    if let Some(result) = elsewhere
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .and_then(|r| r.first_mut())
    {
        result.pool = "another-node".into();
    }
    claims.insert(elsewhere);

    let mut collected = driver.collect_garbage().await;
    collected.sort();
    assert_eq!(collected, [claim_ref("dealloc"), claim_ref("moved")]);
    assert_eq!(f.instances(), 0, "the MIG instance went with its claim");
    driver
        .with_state(|state| assert_eq!(state.claims(), [claim_ref("keep")]))
        .await;
}

/// The start-up sweep removes only orphan specs this driver wrote (today's, annotated, or an
/// earlier gpu-dra's), never another writer's spec under the same name pattern; crash leftovers
/// of the checkpoint go too.
#[test]
fn the_startup_sweep_removes_only_our_orphans() {
    let f = Fixture::new("sim:1xT4");
    drop(f.open());
    let cdi = &f.config.cdi_root;
    std::fs::create_dir_all(cdi).expect("mkdir");
    let foreign = cdi.join("k8s.gpu.nvidia.com-claim_foreign.json");
    std::fs::write(
        &foreign,
        r#"{"cdiVersion":"0.6.0","kind":"k8s.gpu.nvidia.com/claim","annotations":{"gpu-dra.io/driver":"someone-else"},"devices":[]}"#,
    )
    .expect("write");
    let earlier = cdi.join("k8s.gpu.nvidia.com-claim_earlier.json");
    std::fs::write(
        &earlier,
        r#"{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[]}"#,
    )
    .expect("write");
    let temp = f.config.state_dir.join(".checkpoint.json.tmp-99999");
    std::fs::write(&temp, b"{").expect("write");

    let (_state, report) = DeviceState::open(f.config.clone(), f.sim.clone()).expect("open");
    assert_eq!(report.specs_removed, ["earlier"]);
    assert!(foreign.exists() && !earlier.exists() && !temp.exists());
}

/// Kubelet unprepares a deleted pod's claims itself, possibly after the claim object is gone:
/// garbage collection waits for the grace period before it steps in.
#[tokio::test]
async fn garbage_collection_waits_for_the_grace_period() {
    use super::NodeDriver;
    use super::claims::MemoryClaims;
    use super::driver::Driver;

    let f = Fixture::new("sim:1xT4");
    let claims = Arc::new(MemoryClaims::default());
    claims.insert(claim("c", vec![result("gpu-0")], vec![]));
    let driver =
        Driver::new(f.open(), claims.clone()).with_gc_grace(std::time::Duration::from_millis(300));
    driver.prepare(vec![claim_ref("c")]).await;
    claims.remove("default", "claim-c");
    assert!(
        driver.collect_garbage().await.is_empty(),
        "just gone: kubelet may still unprepare it"
    );
    tokio::time::sleep(std::time::Duration::from_millis(350)).await;
    assert_eq!(driver.collect_garbage().await, [claim_ref("c")]);
}

/// A hung API server (accepts, never answers) delays a garbage-collection round by one deadline,
/// never for good; the claim is kept until a lookup succeeds.
#[tokio::test]
async fn garbage_collection_completes_while_the_api_server_hangs() {
    use std::time::Duration;

    use crate::kubeapi::{TEST_TIMEOUTS, hung_api_server};
    use crate::prepare::claims::KubeClaims;
    use crate::prepare::driver::Driver;

    let f = Fixture::new("sim:2xH100-SXM5-80GB");
    let state = f.open();
    let c = claim("u1", vec![result("gpu-1")], vec![]);
    state.prepare(&claim_ref("u1"), &c).expect("prepare");
    let (client, server) = hung_api_server().await;
    let claims = KubeClaims::new(client, "gpu.nvidia.com").with_timeout(TEST_TIMEOUTS.request);
    let driver = Driver::new(state, Arc::new(claims));
    let round = tokio::time::timeout(Duration::from_secs(3), driver.collect_garbage())
        .await
        .expect("the round ends");
    assert!(round.is_empty(), "nothing collected on a failed lookup");
    assert_eq!(driver.with_state(|s| s.claims().len()).await, 1);
    server.abort();
}

fn time_sliced(interval: &str) -> serde_json::Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}})
}

#[test]
fn time_slicing_is_applied_and_exactly_undone() {
    use crate::gpu::{ComputeMode, SharingSettings};
    let f = Fixture::new("sim:2xA100-SXM4-40GB");
    // What an admin left on the GPU: unprepare must give back this, not the defaults.
    let before = SharingSettings {
        compute_mode: ComputeMode::ExclusiveProcess,
        timeslice: Some(1),
    };
    f.sim.set_sharing_settings(1, before).expect("set");
    let state = f.open();
    let c = claim("t1", vec![result("gpu-1")], vec![time_sliced("Long")]);
    state.prepare(&claim_ref("t1"), &c).expect("prepare");
    assert_eq!(
        f.sim.sharing_settings(1).expect("read"),
        SharingSettings {
            compute_mode: ComputeMode::Default,
            timeslice: Some(3),
        }
    );
    assert_eq!(
        f.sim.sharing_settings(0).expect("read"),
        SharingSettings {
            compute_mode: ComputeMode::Default,
            timeslice: Some(0),
        },
        "the other GPU is untouched"
    );
    let recorded = &state.checkpoint().claims["t1"].devices[0];
    assert_eq!(recorded.sharing.as_ref().map(|s| s.before), Some(before));
    state.unprepare("t1").expect("unprepare");
    assert_eq!(f.sim.sharing_settings(1).expect("read"), before);

    // No interval given: NVIDIA's default (0).
    let c = claim(
        "t2",
        vec![result("gpu-1")],
        vec![
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}),
        ],
    );
    state.prepare(&claim_ref("t2"), &c).expect("prepare");
    assert_eq!(f.sim.sharing_settings(1).expect("read").timeslice, Some(0));
    // A crash after the change: the restart rolls the unfinished claim back, settings included.
    let mut checkpoint = state.checkpoint();
    checkpoint.claims.get_mut("t2").expect("t2").state =
        super::checkpoint::ClaimState::PrepareStarted;
    drop(state);
    super::checkpoint::CheckpointStore::new(&f.config.state_dir)
        .save(&checkpoint)
        .expect("save");
    let (state, report) = DeviceState::open(f.config.clone(), f.sim.clone()).expect("reopen");
    assert_eq!(report.rolled_back, ["t2"]);
    assert_eq!(f.sim.sharing_settings(1).expect("read"), before);
    assert!(state.checkpoint().claims.is_empty());
}

#[test]
fn mps_without_the_drivers_control_binary_is_refused_and_changes_nothing() {
    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let state = f.open();
    for (device, kind) in [
        ("gpu-0", "GpuConfig"),
        ("gpu-0-mig-1g10gb-19-0", "MigDeviceConfig"),
    ] {
        let c = claim(
            "p1",
            vec![result(device)],
            vec![
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind,
                        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}),
            ],
        );
        let e = state
            .prepare(&claim_ref("p1"), &c)
            .expect_err("MPS is refused without a driver root");
        let message = e.to_string();
        assert!(
            message.contains("ResourceClaim default/claim-p1")
                && message.contains(
                    "status.allocation.devices.config[0].opaque.parameters.sharing.strategy"
                )
                && message.contains("request \"gpu\"")
                && message.contains("nvidia-cuda-mps-control"),
            "{message}"
        );
        assert!(state.checkpoint().claims.is_empty());
        assert!(f.cdi_files().is_empty());
        assert_eq!(f.instances(), 0);
        assert!(!f.sim.state().expect("state").gpus[0].mig_current);
    }
}

/// TimeSlicing on a MIG device is accepted as NVIDIA's driver accepts it, and its owner is told
/// (a Warning Event on the claim) that it changes nothing.
#[tokio::test]
async fn time_slicing_a_mig_device_is_prepared_with_a_warning_event() {
    use super::NodeDriver;
    use super::claims::MemoryClaims;
    use super::driver::Driver;

    let f = Fixture::new("sim:1xH100-SXM5-80GB");
    let claims = Arc::new(MemoryClaims::default());
    let sliced = claim(
        "ts",
        vec![result("gpu-0-mig-1g10gb-19-0")],
        vec![
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}),
        ],
    );
    let plain = claim("plain", vec![result("gpu-0-mig-1g10gb-19-1")], vec![]);
    claims.insert(sliced);
    claims.insert(plain);
    let driver = Driver::new(f.open(), claims.clone());
    let prepared = driver
        .prepare(vec![claim_ref("ts"), claim_ref("plain")])
        .await;
    assert!(prepared.iter().all(|(_, r)| r.is_ok()), "{prepared:?}");
    let warnings = claims.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (uid, reason, note) = &warnings[0];
    assert_eq!(
        (uid.as_str(), reason.as_str()),
        ("ts", "TimeSlicingNotApplied")
    );
    assert!(note.contains("gpu-0-mig-1g10gb-19-0"), "{note}");
}

/// A sharing mode changes the GPU for every process on it: never while another claim (here an
/// admin-access one, which may be prepared beside others) holds the GPU.
#[test]
fn sharing_settings_never_change_under_another_claims_processes() {
    let f = Fixture::new("sim:2xA100-SXM4-40GB");
    let state = f.open();
    let mut watcher = result("gpu-1");
    watcher.admin_access = Some(true);
    state
        .prepare(&claim_ref("watch"), &claim("watch", vec![watcher], vec![]))
        .expect("admin access");
    let before = f.sim.sharing_settings(1).expect("read");
    let c = claim("ts", vec![result("gpu-1")], vec![time_sliced("Short")]);
    let message = state
        .prepare(&claim_ref("ts"), &c)
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("ResourceClaim default/claim-ts")
            && message.contains("request \"gpu\"")
            && message.contains("in use by ResourceClaim default/claim-watch"),
        "{message}"
    );
    assert_eq!(f.sim.sharing_settings(1).expect("read"), before);
    assert_eq!(state.checkpoint().claims.len(), 1);
}

/// A claim deleted and re-created under the same name (a new UID) is another claim: the old one's
/// devices are unprepared, whatever the new one is allocated.
#[tokio::test]
async fn garbage_collection_unprepares_a_claim_recreated_under_a_new_uid() {
    use super::NodeDriver;
    use super::claims::MemoryClaims;
    use super::driver::Driver;

    let f = Fixture::new("sim:2xT4");
    let claims = Arc::new(MemoryClaims::default());
    let old = claim("old", vec![result("gpu-0")], vec![]);
    claims.insert(old.clone());
    let driver = Driver::new(f.open(), claims.clone()).with_gc_grace(std::time::Duration::ZERO);
    let prepared = driver.prepare(vec![claim_ref("old")]).await;
    assert!(prepared.iter().all(|(_, r)| r.is_ok()), "{prepared:?}");
    // Same namespace and name, a new object, allocated the same device.
    let mut recreated = old.clone();
    recreated.metadata.uid = Some("new".into());
    claims.insert(recreated);
    let collected = driver.collect_garbage().await;
    assert_eq!(
        collected.iter().map(|c| c.uid.as_str()).collect::<Vec<_>>(),
        ["old"]
    );
    assert!(f.cdi_files().is_empty());
    assert!(driver.with_state(|s| s.claims().is_empty()).await);
}

/// A claim source that cannot answer (the API server is down) makes garbage collection keep
/// every claim: "cannot look it up" is not "gone".
#[tokio::test]
async fn garbage_collection_keeps_claims_it_cannot_look_up() {
    use super::NodeDriver;
    use super::claims::{ClaimSource, MemoryClaims};
    use super::driver::Driver;
    use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;

    /// Answers once it is told to; before that every lookup fails.
    struct Unreachable {
        claims: MemoryClaims,
        up: std::sync::atomic::AtomicBool,
    }
    #[tonic::async_trait]
    impl ClaimSource for Unreachable {
        async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
            if self.up.load(std::sync::atomic::Ordering::SeqCst) {
                self.claims.get(namespace, name).await
            } else {
                Err("connection refused".into())
            }
        }
        async fn set_device_status(
            &self,
            namespace: &str,
            name: &str,
            devices: Vec<AllocatedDeviceStatus>,
        ) -> Result<(), String> {
            self.claims
                .set_device_status(namespace, name, devices)
                .await
        }
        async fn warn(&self, claim: &ClaimRef, reason: &str, note: &str) -> Result<(), String> {
            self.claims.warn(claim, reason, note).await
        }
    }

    let f = Fixture::new("sim:2xT4");
    let source = Arc::new(Unreachable {
        claims: MemoryClaims::default(),
        up: true.into(),
    });
    source
        .claims
        .insert(claim("kept", vec![result("gpu-1")], vec![]));
    let driver = Driver::new(f.open(), source.clone()).with_gc_grace(std::time::Duration::ZERO);
    let prepared = driver.prepare(vec![claim_ref("kept")]).await;
    assert!(prepared.iter().all(|(_, r)| r.is_ok()), "{prepared:?}");
    // Deleted while the server is unreachable: nothing is collected until it answers.
    source.claims.remove("default", "claim-kept");
    source.up.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(driver.collect_garbage().await.is_empty());
    assert_eq!(f.cdi_files().len(), 1);
    source.up.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(driver.collect_garbage().await.len(), 1);
    assert!(f.cdi_files().is_empty());
}

/// A checkpoint that vanished while claims were prepared (deleted by hand, a state folder
/// wiped) is as untrustworthy as a corrupt one: the start refuses, naming what it found, and
/// touches nothing — not the running containers' CDI specs, not their MIG devices (which
/// `--mig dynamic` would otherwise destroy as nobody's).
#[test]
fn a_missing_checkpoint_with_this_boots_work_on_the_node_fails_closed() {
    let mut f = Fixture::new("sim:1xH100-SXM5-80GB");
    f.config.mig_policy = crate::gpu::mig::MigPolicy::Dynamic;
    {
        let state = f.open();
        state
            .prepare(
                &claim_ref("running"),
                &claim("running", vec![result("gpu-0-mig-1g10gb-19-0")], vec![]),
            )
            .expect("prepare");
    }
    let spec = f
        .config
        .cdi_root
        .join("k8s.gpu.nvidia.com-claim_running.json");
    let written: Spec = serde_json::from_slice(&std::fs::read(&spec).expect("spec")).expect("json");
    assert_eq!(
        written.annotations.get(super::cdi::WRITTEN_IN_BOOT),
        Some(&crate::gpu::boot_id().expect("boot id")),
        "specs record the boot they were written in"
    );
    std::fs::remove_file(f.config.state_dir.join("checkpoint.json")).expect("lose checkpoint");
    let hardware_before = f.sim.state().expect("sim");

    let refused = DeviceState::open(f.config.clone(), f.sim.clone())
        .err()
        .expect("the start is refused");
    let message = refused.to_string();
    assert!(
        matches!(
            refused,
            super::error::PrepareError::Checkpoint(
                super::checkpoint::CheckpointError::Unusable { .. }
            )
        ),
        "{message}"
    );
    assert!(message.contains("missing"), "{message}");
    assert!(
        message.contains(&spec.display().to_string()),
        "names the spec: {message}"
    );
    assert!(
        message.contains("1 MIG devices on GPU 0"),
        "names the MIG devices: {message}"
    );
    assert!(spec.exists(), "the running claim's spec is left alone");
    assert_eq!(
        f.sim.state().expect("sim"),
        hardware_before,
        "the hardware is untouched"
    );
    assert!(
        !f.config.state_dir.join("checkpoint.json").exists(),
        "no empty checkpoint was written in its place"
    );

    // A spec of an earlier boot (a CDI root that outlives reboots) is no sign of running work:
    // without MIG devices either, the start goes on and sweeps it as before.
    let mut old = written;
    old.annotations
        .insert(super::cdi::WRITTEN_IN_BOOT.into(), "an-earlier-boot".into());
    std::fs::write(&spec, serde_json::to_vec(&old).expect("encode")).expect("write");
    f.config.mig_policy = crate::gpu::mig::MigPolicy::Auto;
    let (_state, report) = DeviceState::open(f.config.clone(), f.sim.clone()).expect("open");
    assert_eq!(report.specs_removed, ["running"]);
}

#[test]
fn a_vfio_claim_binds_its_gpu_for_a_vm_and_unprepare_gives_it_back() {
    let mut fixture = Fixture::new("sim:2xH100-SXM5-80GB");
    // Published only with --passthrough: refused without it, naming the setting.
    let vm = claim("vm", vec![result("gpu-vfio-1")], vec![]);
    let error = fixture
        .open()
        .prepare(&claim_ref("vm"), &vm)
        .expect_err("not published");
    assert!(error.to_string().contains("--passthrough"), "{error}");
    fixture.config.passthrough = true;
    let state = fixture.open();
    let config = json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}
    });
    let mut vm = claim("vm", vec![result("gpu-vfio-1")], vec![config]);
    vm.metadata.annotations = Some(std::collections::BTreeMap::from([(
        "resource.kubernetes.io/pod-claim-name".to_string(),
        "gpu".to_string(),
    )]));
    state.prepare(&claim_ref("vm"), &vm).expect("prepare");
    let drivers = fixture.sim.drivers().expect("drivers");
    assert_eq!(drivers[1].1, crate::gpu::sim::PciDriver::VfioPci);
    assert!(
        !state.inventory().gpus.iter().any(|g| g.minor == 1),
        "NVML no longer sees GPU 1"
    );
    let spec = fixture.spec("vm");
    assert_eq!(spec.devices.len(), 1);
    assert_eq!(spec.devices[0].name, "vm-gpu-vfio-1");
    let nodes: Vec<&str> = spec.devices[0]
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    let group = crate::gpu::sim::sim_iommu_group(1);
    assert_eq!(nodes, [format!("/dev/vfio/{group}")]);
    assert_eq!(spec.container_edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    let api: Vec<&str> = spec
        .container_edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(api, ["/dev/vfio/vfio"], "the API device, and no nvidiactl");
    // No driver files; the device metadata KubeVirt reads the PCI address from.
    let mounts = &spec.container_edits.mounts;
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(
        mounts[0].container_path,
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/gpu.nvidia.com-metadata.json"
    );
    let text = std::fs::read(&mounts[0].host_path).expect("metadata file");
    // A stream of one object per API version; the first is v1beta1.
    let metadata: serde_json::Value = serde_json::Deserializer::from_slice(&text)
        .into_iter()
        .next()
        .expect("an object")
        .expect("json");
    assert_eq!(metadata["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    let attributes = &metadata["requests"][0]["devices"][0]["attributes"];
    assert_eq!(
        attributes["resource.kubernetes.io/pciBusID"]["string"],
        crate::gpu::sim::sim_pci_location(1).0
    );
    assert_eq!(attributes["type"]["string"], "vfio");

    // The same GPU whole, or one of its MIG devices, waits while the VM holds it.
    for device in ["gpu-1", "gpu-vfio-1"] {
        let other = claim("other", vec![result(device)], vec![]);
        let error = state
            .prepare(&claim_ref("other"), &other)
            .expect_err("held by the VM");
        assert!(
            error.to_string().contains("claim-vm") || error.to_string().contains("no such"),
            "{device}: {error}"
        );
    }
    // A GPU config on a VM's GPU, and a VM's GPU beside a CUDA GPU, are refused.
    let mixed = claim("mixed", vec![result("gpu-vfio-0"), result("gpu-0")], vec![]);
    let error = state
        .prepare(&claim_ref("mixed"), &mixed)
        .expect_err("mixed");
    assert!(
        error.to_string().contains("one kind or the other"),
        "{error}"
    );
    let timesliced = claim(
        "ts",
        vec![result("gpu-vfio-0")],
        vec![
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing"}}),
        ],
    );
    let error = state
        .prepare(&claim_ref("ts"), &timesliced)
        .expect_err("gpu config");
    assert!(error.to_string().contains("VfioDeviceConfig"), "{error}");

    let metadata_file = mounts[0].host_path.clone();
    state.unprepare("vm").expect("unprepare");
    assert!(!std::path::Path::new(&metadata_file).exists());
    assert_eq!(
        fixture.sim.drivers().expect("drivers")[1].1,
        crate::gpu::sim::PciDriver::Nvidia
    );
    assert!(state.inventory().gpus.iter().any(|g| g.minor == 1));
    assert!(fixture.cdi_files().is_empty());
    // Back on nvidia, the GPU serves a CUDA claim again.
    let cuda = claim("cuda", vec![result("gpu-1")], vec![]);
    state.prepare(&claim_ref("cuda"), &cuda).expect("cuda");
}

#[test]
fn a_crash_with_the_gpu_bound_for_a_vm_is_undone_at_start() {
    let mut fixture = Fixture::new("sim:1xH100-SXM5-80GB");
    fixture.config.passthrough = true;
    let state = fixture.open();
    let vm = claim("vm", vec![result("gpu-vfio-0")], vec![]);
    state.prepare(&claim_ref("vm"), &vm).expect("prepare");
    drop(state);
    // The checkpoint says prepare had started (a crash before completion, as after kill -9).
    let path = fixture.config.state_dir.join("checkpoint.json");
    let text = std::fs::read_to_string(&path).expect("checkpoint");
    std::fs::write(&path, text.replace("PrepareCompleted", "PrepareStarted")).expect("write");
    let (state, report) =
        DeviceState::open(fixture.config.clone(), fixture.sim.clone()).expect("reopen");
    assert_eq!(report.rolled_back, ["vm"]);
    assert_eq!(
        fixture.sim.drivers().expect("drivers")[0].1,
        crate::gpu::sim::PciDriver::Nvidia
    );
    assert_eq!(state.inventory().gpus.len(), 1);
}

/// `VfioDeviceConfig` decides how the container reaches a GPU for a VM: the group node (legacy),
/// or the iommufd cdev when preferred and the node has iommufd; the API device when asked for.
#[test]
fn vfio_configs_choose_the_legacy_group_or_the_iommufd_cdev() {
    use super::cdi::CdiDevice;
    use super::checkpoint::{DeviceRecord, VfioRecord};
    use super::state::vfio_cdi_device;
    let record = |parameters: Option<serde_json::Value>| {
        let mut device: DeviceRecord = serde_json::from_value(json!({
            "requestNames": ["gpu"], "pool": "n1", "device": "gpu-vfio-2",
        }))
        .expect("record");
        device.vfio = Some(VfioRecord {
            bus_id: "0000:3a:00.0".into(),
            minor: Some(2),
            iommu_group: 42,
            cdev: Some("vfio2".into()),
            persistence: false,
        });
        device.config = parameters.map(|p| crate::config::decode(&p).expect("config"));
        device
    };
    let vfio = |kind: &str, api: bool| {
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": kind, "enableAPIDevice": api}})
    };
    let node = |d: Option<CdiDevice>| match d {
        Some(CdiDevice::Vfio {
            node, api_device, ..
        }) => (node, api_device),
        other => panic!("not a VFIO device: {other:?}"),
    };
    assert_eq!(
        node(vfio_cdi_device(true, &record(None))),
        ("/dev/vfio/42".to_string(), None)
    );
    assert_eq!(
        node(vfio_cdi_device(
            true,
            &record(Some(vfio("LegacyOnly", true)))
        )),
        (
            "/dev/vfio/42".to_string(),
            Some("/dev/vfio/vfio".to_string())
        )
    );
    assert_eq!(
        node(vfio_cdi_device(
            true,
            &record(Some(vfio("PreferIommuFD", true)))
        )),
        (
            "/dev/vfio/devices/vfio2".to_string(),
            Some("/dev/iommu".to_string())
        )
    );
    // Preferred, but the node has no iommufd: the legacy group.
    assert_eq!(
        node(vfio_cdi_device(
            false,
            &record(Some(vfio("PreferIommuFD", false)))
        )),
        ("/dev/vfio/42".to_string(), None)
    );
}

/// A node switched from NVIDIA's driver: the claims its checkpoint holds are gpu-dra's from the
/// start, NVIDIA's specs give way to ours, the MIG device NVIDIA's DynamicMIG carved is destroyed
/// at unprepare, and a claim gpu-dra cannot undo (MPS) answers its reason, keeping NVIDIA's spec.
#[test]
fn a_switch_from_nvidias_driver_takes_its_claims_over() {
    let f = Fixture::new("sim:2xH100-SXM5-80GB");
    f.sim.set_mig_mode(1, true).expect("MIG mode");
    let gi = f
        .sim
        .create_gpu_instance(1, 19, crate::gpu::Placement { start: 0, size: 1 })
        .expect("GPU instance");
    let (ci, mig_uuid) = f
        .sim
        .create_compute_instance(1, gi)
        .expect("compute instance");
    let gpu0 = f.sim.inventory().expect("inventory").gpus[0].uuid.clone();
    let device = |uid: &str, name: &str| {
        json!({"Requests": ["gpu"], "PoolName": "n1", "DeviceName": name,
               "CDIDeviceIDs": [format!("k8s.gpu.nvidia.com/claim={uid}-{name}")]})
    };
    let completed = |devices: serde_json::Value, mps: &str| {
        json!({"checkpointState": "PrepareCompleted", "status": {},
               "preparedDevices": [{"devices": devices, "configState": {"mpsControlDaemonID": mps}}]})
    };
    let nvidia = json!({
        "checksum": 1,
        "v1": {"preparedClaims": {}},
        "v2": {"checksum": 2, "nodeBootID": crate::gpu::boot_id().expect("boot id"), "preparedClaims": {
            "carved": completed(json!([{"gpu": null, "mig": {
                "concrete": {"parentMinor": 1, "giId": gi, "ciId": ci, "migUUID": mig_uuid, "parentUUID": "x"},
                "device": device("carved", "gpu-1-mig-1g10gb-19-0")}}]), ""),
            "mps": completed(json!([{"gpu": {"info": {"uuid": gpu0}, "device": device("mps", "gpu-0")}, "mig": null}]), "mps-1"),
        }},
    });
    std::fs::create_dir_all(&f.config.state_dir).expect("state dir");
    std::fs::write(
        f.config.state_dir.join("checkpoint.json"),
        serde_json::to_vec(&nvidia).expect("json"),
    )
    .expect("NVIDIA's checkpoint");
    std::fs::create_dir_all(&f.config.cdi_root).expect("cdi root");
    for uid in ["carved", "mps"] {
        std::fs::write(
            f.config
                .cdi_root
                .join(format!("k8s.gpu.nvidia.com-claim_{uid}.yaml")),
            "cdiVersion: 0.5.0\n",
        )
        .expect("NVIDIA's spec");
    }

    let (state, report) = DeviceState::open(f.config.clone(), f.sim.clone()).expect("open");
    assert_eq!(report.taken_over, ["claim carved"]);
    assert_eq!(report.takeover_refused.len(), 1, "{report:?}");
    assert_eq!(
        f.cdi_files(),
        [
            "k8s.gpu.nvidia.com-claim_carved.json",
            "k8s.gpu.nvidia.com-claim_mps.yaml"
        ],
        "ours replaces NVIDIA's spec; the refused claim keeps NVIDIA's"
    );
    assert!(
        f.config
            .state_dir
            .join("checkpoint.json.dra-driver-nvidia-gpu")
            .exists()
    );
    assert_eq!(state.checkpoint().claims.len(), 2);

    let refused = state.unprepare("mps").expect_err("refused").to_string();
    assert!(refused.contains("MPS control daemon mps-1"), "{refused}");
    state.unprepare("carved").expect("unprepare");
    let hardware = f.sim.state().expect("sim");
    assert!(
        hardware.gpus[1].gpu_instances.is_empty(),
        "the MIG device NVIDIA carved is destroyed"
    );
    assert_eq!(f.cdi_files(), ["k8s.gpu.nvidia.com-claim_mps.yaml"]);
    assert_eq!(
        state.checkpoint().claims.keys().collect::<Vec<_>>(),
        ["mps"]
    );
}
