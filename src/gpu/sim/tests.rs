//! Unit tests of the simulator across its modules: MIG rules per model, bindings, sysfs,
//! sharing settings, the state file across restarts.
use super::*;
use crate::gpu::model::{ComputeMode, Placement, SharingSettings};

fn h100_node(n: u32, state: Option<PathBuf>) -> SimNode {
    SimNode::new(
        format!("sim:{n}xH100-SXM5-80GB").parse().expect("spec"),
        "n1",
        state,
    )
}

#[test]
fn a_gpu_bound_to_vfio_pci_leaves_nvml_until_it_comes_back_initialized() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hw.json");
    let node = h100_node(3, Some(path.clone()));
    let exclusive = SharingSettings {
        compute_mode: ComputeMode::ExclusiveProcess,
        timeslice: None,
    };
    node.set_sharing_settings(1, exclusive).expect("set");
    node.bind_driver(1, PciDriver::VfioPci)
        .expect("to vfio-pci");
    let inventory = node.inventory().expect("inventory");
    let seen: Vec<(u32, u32)> = inventory.gpus.iter().map(|g| (g.minor, g.index)).collect();
    // NVML's indexes count only what it sees; minors stay.
    assert_eq!(seen, vec![(0, 0), (2, 1)]);
    let error = node
        .sharing_settings(1)
        .expect_err("no NVML handle")
        .to_string();
    assert!(error.contains("no such GPU"), "{error}");
    assert!(
        node.inject(1, SimFault::Lost).is_err(),
        "no NVML events from it"
    );
    // Another process sees the binding (the fake libnvidia-ml shares the state).
    let other = h100_node(3, Some(path.clone()));
    assert_eq!(other.inventory().expect("inventory").gpus.len(), 2);

    node.bind_driver(1, PciDriver::Nvidia).expect("back");
    assert_eq!(node.inventory().expect("inventory").gpus.len(), 3);
    assert_eq!(
        node.sharing_settings(1).expect("read").compute_mode,
        ComputeMode::Default,
        "initialized as by a reset"
    );

    // A binding made at run time does not survive a reboot.
    node.bind_driver(2, PciDriver::VfioPci)
        .expect("to vfio-pci");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("state")).expect("json");
    state["boot_id"] = "an earlier boot".into();
    std::fs::write(&path, state.to_string()).expect("write");
    assert_eq!(node.drivers().expect("drivers")[2], (2, PciDriver::Nvidia));
}

#[test]
fn a_gpu_in_use_stays_with_nvidia() {
    let node = h100_node(1, None);
    node.set_mig_mode(0, true).expect("MIG on");
    let profile = node.inventory().expect("inventory").gpus[0]
        .mig
        .as_ref()
        .expect("mig")
        .profiles[0]
        .clone();
    node.create_gpu_instance(0, profile.id, profile.placements[0])
        .expect("carve");
    let error = node
        .bind_driver(0, PciDriver::VfioPci)
        .expect_err("in use")
        .to_string();
    assert!(error.contains("MIG devices exist"), "{error}");
    assert_eq!(
        node.drivers().expect("drivers"),
        vec![(0, PciDriver::Nvidia)]
    );
}

#[test]
fn sysfs_shows_each_binding_as_the_kernel_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = h100_node(2, None);
    node.write_sysfs(dir.path()).expect("sysfs");
    node.bind_driver(1, PciDriver::VfioPci)
        .expect("to vfio-pci");
    node.write_sysfs(dir.path()).expect("sysfs again");
    let function = |index: u32| {
        dir.path()
            .join("bus/pci/devices")
            .join(sim_pci_location(index).0)
    };
    let driver = |index: u32| {
        std::fs::canonicalize(function(index).join("driver"))
            .expect("driver link resolves")
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    };
    assert_eq!(driver(0).as_deref(), Some("nvidia"));
    assert_eq!(driver(1).as_deref(), Some("vfio-pci"));
    let read =
        |index: u32, file: &str| std::fs::read_to_string(function(index).join(file)).expect("file");
    assert_eq!(read(1, "vendor"), "0x10de\n");
    assert_eq!(read(1, "device"), "0x2330\n");
    assert_eq!(read(1, "class"), "0x030200\n");
    assert_eq!(read(1, "driver_override"), "vfio-pci\n");
    assert_eq!(read(0, "driver_override"), "(null)\n");
    let group = std::fs::read_link(function(1).join("iommu_group")).expect("group link");
    let group = group
        .file_name()
        .expect("group")
        .to_string_lossy()
        .into_owned();
    assert_eq!(group, sim_iommu_group(1).to_string());
    let members: Vec<String> = std::fs::read_dir(
        dir.path()
            .join(format!("kernel/iommu_groups/{group}/devices")),
    )
    .expect("group devices")
    .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
    .collect();
    assert_eq!(members, vec![sim_pci_location(1).0]);
    // The function is listed under its driver only.
    let bus_id = sim_pci_location(1).0;
    assert!(
        dir.path()
            .join("bus/pci/drivers/vfio-pci")
            .join(&bus_id)
            .exists()
    );
    assert!(
        !dir.path()
            .join("bus/pci/drivers/nvidia")
            .join(&bus_id)
            .exists()
    );
}

#[test]
fn compute_mode_and_time_slice_behave_like_a_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hw.json");
    let node = h100_node(2, Some(path.clone()));
    let exclusive = SharingSettings {
        compute_mode: ComputeMode::ExclusiveProcess,
        timeslice: Some(2),
    };
    node.set_sharing_settings(0, exclusive).expect("set");
    assert_eq!(node.sharing_settings(0).expect("read"), exclusive);
    assert_eq!(
        node.sharing_settings(1).expect("read"),
        SharingSettings {
            compute_mode: ComputeMode::Default,
            timeslice: Some(0)
        }
    );
    let err = node
        .set_sharing_settings(
            0,
            SharingSettings {
                timeslice: Some(4),
                ..exclusive
            },
        )
        .expect_err("0-3 only");
    assert!(err.to_string().contains("not one of 0-3"), "{err}");
    node.set_mig_mode(1, true).expect("MIG on");
    let err = node
        .set_sharing_settings(1, exclusive)
        .expect_err("full GPUs only");
    assert!(err.to_string().contains("MIG mode"), "{err}");
    // Another process (a restarted driver) sees the same hardware; a reboot resets it.
    let again = h100_node(2, Some(path.clone()));
    assert_eq!(again.sharing_settings(0).expect("read"), exclusive);
    let mut state: SimState =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("parse");
    state.boot_id = "an earlier boot".into();
    std::fs::write(&path, serde_json::to_vec(&state).expect("json")).expect("write");
    let rebooted = h100_node(2, Some(path));
    assert_eq!(
        rebooted.sharing_settings(0).expect("read"),
        SharingSettings {
            compute_mode: ComputeMode::Default,
            timeslice: Some(0)
        }
    );
}

#[test]
fn spec_parsing_and_errors() {
    let spec: SimSpec = "sim:2xA100-SXM4-40GB,1xT4".parse().expect("valid");
    assert_eq!(spec.gpu_count(), 3);
    assert_eq!(spec.to_string(), "2xA100-SXM4-40GB,1xT4");
    assert_eq!(
        spec.models().map(|m| m.key).collect::<Vec<_>>(),
        ["A100-SXM4-40GB", "A100-SXM4-40GB", "T4"]
    );
    for (bad, needle) in [
        ("sim:", "no GPUs"),
        ("sim:8xH999", "unknown model \"H999\""),
        ("sim:0xT4", "zero GPUs"),
        ("sim:eightxT4", "not <N>x<MODEL>"),
        ("sim:99999999999xT4", "not a GPU count"),
        ("sim:T4", "not <N>x<MODEL>"),
        ("sim:2000xT4", "more than 1024"),
    ] {
        let err = bad.parse::<SimSpec>().expect_err(bad).to_string();
        assert!(err.contains(needle), "{bad}: {err}");
        assert!(
            err.contains(&format!("{bad:?}")),
            "error names the spec: {err}"
        );
    }
}

#[test]
fn placement_rules_per_model() {
    for key in [
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "H100-SXM5-80GB",
        "H200-SXM5-141GB",
    ] {
        let node = SimNode::new(format!("1x{key}").parse().expect("spec"), "n", None);
        node.set_mig_mode(0, true).expect("enable");
        if key.starts_with("A100") {
            // Ampere needs a reset before the mode takes effect.
            let err = node
                .create_gpu_instance(0, 9, Placement { start: 0, size: 4 })
                .expect_err(key);
            assert!(
                matches!(
                    err,
                    GpuError::Mig {
                        failure: MigFailure::NotSupported,
                        ..
                    }
                ),
                "{err}"
            );
            node.reset_gpu(0).expect("reset");
        }
        // 3g at 0 and 4; a third 3g has no room; 1g in an occupied slice is refused.
        assert_eq!(
            node.create_gpu_instance(0, 9, Placement { start: 0, size: 4 })
                .expect("3g@0"),
            1
        );
        assert_eq!(
            node.create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
                .expect("3g@4"),
            2
        );
        let err = node
            .create_gpu_instance(0, 19, Placement { start: 5, size: 1 })
            .expect_err("occupied");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InsufficientResources,
                    ..
                }
            ),
            "{err}"
        );
        // Invalid placements are invalid arguments, not resource errors.
        let err = node
            .create_gpu_instance(0, 9, Placement { start: 2, size: 4 })
            .expect_err("bad start");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InvalidArgument,
                    ..
                }
            ),
            "{err}"
        );
        let err = node
            .create_gpu_instance(0, 77, Placement { start: 0, size: 1 })
            .expect_err("bad id");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InvalidArgument,
                    ..
                }
            ),
            "{err}"
        );
    }
    // A30: four memory slices; 4g.24gb is the whole GPU.
    let a30 = SimNode::new("1xA30-24GB".parse().expect("spec"), "n", None);
    a30.set_mig_mode(0, true).expect("enable");
    a30.reset_gpu(0).expect("reset");
    assert_eq!(
        a30.create_gpu_instance(0, 5, Placement { start: 2, size: 2 })
            .expect("2g@2"),
        2
    );
    let err = a30
        .create_gpu_instance(0, 0, Placement { start: 0, size: 4 })
        .expect_err("full");
    assert!(
        matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::InsufficientResources,
                ..
            }
        ),
        "{err}"
    );
    // +me profiles are single-instance even with free placements.
    a30.create_gpu_instance(0, 21, Placement { start: 0, size: 1 })
        .expect("1g+me");
    let err = a30
        .create_gpu_instance(0, 21, Placement { start: 1, size: 1 })
        .expect_err("second +me");
    assert!(
        matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::InsufficientResources,
                ..
            }
        ),
        "{err}"
    );
    // Not MIG-capable.
    let t4 = SimNode::new("1xT4".parse().expect("spec"), "n", None);
    let err = t4.set_mig_mode(0, true).expect_err("T4");
    assert!(
        matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::NotSupported,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn destroy_order_and_mode_rules() {
    let node = h100_node(1, None);
    let err = node
        .create_gpu_instance(0, 9, Placement { start: 0, size: 4 })
        .expect_err("MIG off");
    assert!(matches!(
        err,
        GpuError::Mig {
            failure: MigFailure::NotSupported,
            ..
        }
    ));
    node.set_mig_mode(0, true).expect("Hopper toggles at once");
    let gi = node
        .create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
        .expect("gi");
    let (ci, uuid) = node.create_compute_instance(0, gi).expect("ci");
    assert!(uuid.starts_with("MIG-"));
    let err = node.create_compute_instance(0, gi).expect_err("full GI");
    assert!(matches!(
        err,
        GpuError::Mig {
            failure: MigFailure::InsufficientResources,
            ..
        }
    ));
    let err = node
        .destroy_gpu_instance(0, gi)
        .expect_err("CI still there");
    assert!(
        matches!(
            err,
            GpuError::Mig {
                failure: MigFailure::InUse,
                ..
            }
        ),
        "{err}"
    );
    let err = node.set_mig_mode(0, false).expect_err("instances exist");
    assert!(matches!(
        err,
        GpuError::Mig {
            failure: MigFailure::InUse,
            ..
        }
    ));
    node.destroy_compute_instance(0, gi, ci).expect("ci gone");
    node.destroy_gpu_instance(0, gi).expect("gi gone");
    let err = node.destroy_gpu_instance(0, gi).expect_err("twice");
    assert!(matches!(
        err,
        GpuError::Mig {
            failure: MigFailure::NotFound,
            ..
        }
    ));
    node.set_mig_mode(0, false).expect("off");
}

#[test]
fn state_survives_restart_and_instances_show_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.json");
    let uuid = {
        let node = h100_node(2, Some(path.clone()));
        node.set_mig_mode(1, true).expect("enable");
        let gi = node
            .create_gpu_instance(1, 9, Placement { start: 0, size: 4 })
            .expect("gi");
        node.create_compute_instance(1, gi).expect("ci").1
    };
    // A new "process": same file, same answers.
    let node = h100_node(2, Some(path.clone()));
    let inv = node.inventory().expect("inventory");
    let mig = inv.gpus[1].mig.as_ref().expect("MIG-capable");
    assert!(mig.mode.current);
    assert_eq!(mig.instances.len(), 1);
    assert_eq!(mig.instances[0].uuid, uuid);
    assert_eq!(mig.instances[0].placement, Placement { start: 0, size: 4 });
    assert!(
        inv.gpus[0]
            .mig
            .as_ref()
            .expect("capable")
            .instances
            .is_empty()
    );
    // Another node's state file is refused with a clear error.
    let other = SimNode::new(
        "2xH100-SXM5-80GB".parse().expect("spec"),
        "n2",
        Some(path.clone()),
    );
    let err = other.inventory().expect_err("foreign state").to_string();
    assert!(
        err.contains("state.json") && err.contains("\"n1\""),
        "{err}"
    );
}

#[test]
fn uuids_are_deterministic_and_distinct() {
    let a = h100_node(8, None).inventory().expect("a");
    let b = h100_node(8, None).inventory().expect("b");
    assert_eq!(a, b);
    let mut uuids: Vec<_> = a.gpus.iter().map(|g| g.uuid.clone()).collect();
    uuids.dedup();
    assert_eq!(uuids.len(), 8);
    assert_ne!(gpu_uuid("n1", 0), gpu_uuid("n2", 0));
}
