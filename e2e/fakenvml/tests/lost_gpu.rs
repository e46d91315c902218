//! One GPU off the bus, through the real NVML code path (the NVML backend loaded against the fake
//! libnvidia-ml): the lost GPU keeps its last view, the others are read and carved as usual, and
//! operations on the lost one fail naming it, as on the simulation backend. A GPU lost before the
//! backend starts is named (so it can be published with its lost taint) and probed lost.
mod common;
use common::{claim, claim_ref, config, fake_library};
use std::path::Path;
use std::sync::{Arc, Mutex};

use gpu_dra::gpu::mig::{GpuMode, mig_device_name};
use gpu_dra::gpu::nvml::NvmlBackend;
use gpu_dra::gpu::sim::{SimFault, SimNode, write_fake_sysfs};
use gpu_dra::gpu::{GpuControl, GpuError, MigFailure, Placement};
use gpu_dra::prepare::state::DeviceState;

/// The fake reads its configuration from the environment, which is per process.
static ENV: Mutex<()> = Mutex::new(());

const SPEC: &str = "sim:3xH100-SXM5-80GB";

/// Points the fake at a simulated node; the caller holds `ENV`.
fn configure(node: &str, state: &Path) -> SimNode {
    // SAFETY: the caller holds the ENV lock, which serialises every reader and writer of these
    // variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", node);
        std::env::set_var("FAKE_NVML_STATE", state);
    }
    let sim = SimNode::new(SPEC.parse().expect("spec"), node, Some(state.to_path_buf()));
    sim.inventory().expect("create the state");
    sim
}

/// The NVML backend on the fake, with the simulated node's sysfs (for PCIe roots) under `dir`.
fn open(dir: &Path) -> Arc<NvmlBackend> {
    let sysfs = dir.join("sys");
    write_fake_sysfs(&sysfs, &SPEC.parse().expect("spec")).expect("sysfs links");
    Arc::new(
        NvmlBackend::open(Some(&fake_library()), sysfs)
            .expect("NVML init")
            .with_pci_scan(true),
    )
}

/// 1g.10gb at placement 0 of an H100.
fn small_slice(minor: u32) -> String {
    mig_device_name(minor, "1g.10gb", 19, 0)
}

#[track_caller]
fn assert_lost_gpu_1(err: GpuError) {
    assert!(
        matches!(
            err,
            GpuError::Mig {
                minor: 1,
                failure: MigFailure::Lost,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_lost_gpu_keeps_its_last_view_while_the_others_are_carved() {
    const NODE: &str = "l1";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(NODE, &dir.path().join("hw.json"));
    let nvml = open(dir.path());
    let (state, _) =
        DeviceState::open(config(dir.path(), NODE), nvml.clone()).expect("open the device state");
    let before = nvml.inventory().expect("inventory");
    assert_eq!(before, sim.inventory().expect("sim"));

    sim.inject(1, SimFault::Lost).expect("GPU 1 off the bus");
    // The rescan after the fault reads the faulted GPU again, then a full one every GPU.
    GpuControl::invalidate_gpu(&*nvml, 1);
    assert_eq!(nvml.inventory().expect("inventory"), before);
    nvml.invalidate();
    let during = nvml.inventory().expect("one lost GPU fails no inventory");
    assert_eq!(
        during, before,
        "GPU 1 keeps its last view, the others are unchanged"
    );
    assert_eq!(
        during,
        sim.inventory().expect("sim"),
        "the simulation backend keeps the lost GPU too"
    );
    assert!(!state.rescan(None).expect("rescan with a lost GPU"));

    // A carve on GPU 0: its refresh re-reads the still stale GPU 1 and must not fail for it.
    state
        .prepare(&claim_ref("a"), &claim("a", NODE, &small_slice(0)))
        .expect("prepare a MIG device on GPU 0 while GPU 1 is lost");
    let carved = nvml.inventory().expect("inventory");
    assert_eq!(
        carved.gpus[0]
            .mig
            .as_ref()
            .expect("H100 MIG")
            .instances
            .len(),
        1
    );
    assert_eq!(carved.gpus[1], before.gpus[1]);
    assert_eq!(carved, sim.inventory().expect("sim"));

    // Operations on the lost GPU fail naming it.
    let err = state
        .prepare(&claim_ref("b"), &claim("b", NODE, &small_slice(1)))
        .expect_err("GPU 1 is lost");
    assert!(
        err.to_string().contains("GPU 1") && err.to_string().contains("lost"),
        "{err}"
    );
    assert_lost_gpu_1(
        nvml.create_gpu_instance(1, 19, Placement { start: 1, size: 1 })
            .expect_err("lost"),
    );
    assert_lost_gpu_1(nvml.set_mig_mode(1, true).expect_err("lost"));
    assert_lost_gpu_1(nvml.gpu_instances(1).expect_err("lost"));
    let err = nvml.sharing_settings(1).expect_err("lost");
    assert!(matches!(err, GpuError::Sharing { minor: 1, .. }), "{err}");
    // The simulation backend answers the same, and carves the others meanwhile.
    assert_lost_gpu_1(
        sim.create_gpu_instance(1, 19, Placement { start: 1, size: 1 })
            .expect_err("lost"),
    );
    assert!(sim.set_mig_mode(2, true).expect("MIG on GPU 2").current);
    let gi = sim
        .create_gpu_instance(2, 19, Placement { start: 6, size: 1 })
        .expect("GI on GPU 2");
    sim.destroy_gpu_instance(2, gi).expect("destroy it");
    sim.set_mig_mode(2, false).expect("MIG off again");

    state.unprepare("a").expect("unprepare on GPU 0");
    assert_eq!(
        nvml.inventory().expect("inventory").gpus[0]
            .mig
            .as_ref()
            .expect("H100 MIG")
            .instances,
        vec![]
    );

    // Back on the bus: read anew at the next rescan.
    sim.inject(1, SimFault::Reset).expect("reset GPU 1");
    nvml.invalidate();
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );
    // kubelet retries the claim that failed on it.
    state
        .prepare(&claim_ref("b"), &claim("b", NODE, &small_slice(1)))
        .expect("GPU 1 carves again");
    state.unprepare("b").expect("unprepare on GPU 1");
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );
}

#[test]
fn a_gpu_lost_at_start_is_named_and_probed_lost() {
    const NODE: &str = "l2";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(NODE, &dir.path().join("hw.json"));
    sim.inject(1, SimFault::Lost).expect("GPU 1 off the bus");
    let nvml = open(dir.path());

    let found = nvml.inventory().expect("discovery with a lost GPU");
    let hw = sim.inventory().expect("sim");
    assert_eq!(found.gpus.len(), 3);
    assert_eq!(found.gpus[0], hw.gpus[0]);
    assert_eq!(found.gpus[2], hw.gpus[2]);
    // What the driver still tells of the lost GPU; memory and MIG state need it to answer.
    let lost = &found.gpus[1];
    assert_eq!(
        (lost.minor, &lost.uuid, &lost.pci_bus_id, &lost.product_name),
        (
            1,
            &hw.gpus[1].uuid,
            &hw.gpus[1].pci_bus_id,
            &hw.gpus[1].product_name
        )
    );
    assert_eq!((lost.memory_bytes, &lost.mig), (None, &None));
    assert!(GpuControl::probe(&*nvml, 1).expect("probe").lost);
    assert!(!GpuControl::probe(&*nvml, 0).expect("probe").lost);

    // The prepare side starts, offers the lost GPU whole only, and carves the others.
    let (state, _) =
        DeviceState::open(config(dir.path(), NODE), nvml.clone()).expect("open the device state");
    assert_eq!(state.modes()[&1], GpuMode::Whole);
    assert_eq!(state.modes()[&2], GpuMode::Dynamic);
    state
        .prepare(&claim_ref("a"), &claim("a", NODE, &small_slice(2)))
        .expect("prepare a MIG device on GPU 2");
    state.unprepare("a").expect("unprepare");
    assert_lost_gpu_1(
        nvml.create_gpu_instance(1, 19, Placement { start: 0, size: 1 })
            .expect_err("lost"),
    );
    drop(state);

    // Back on the bus: read in full at the next rescan.
    sim.inject(1, SimFault::Reset).expect("reset GPU 1");
    nvml.invalidate();
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );
    assert!(!GpuControl::probe(&*nvml, 1).expect("probe").lost);
}

#[test]
fn a_gpu_that_cannot_be_named_is_left_out_until_it_answers() {
    const NODE: &str = "l3";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(NODE, &dir.path().join("hw.json"));
    sim.inject(1, SimFault::Lost).expect("GPU 1 off the bus");
    // SAFETY: serialised by ENV.
    unsafe { std::env::set_var("FAKE_NVML_NAMELESS_WHEN_LOST", "1") };
    let nvml = open(dir.path());
    // SAFETY: serialised by ENV; the fake read it at init, and other tests must not see it.
    unsafe { std::env::remove_var("FAKE_NVML_NAMELESS_WHEN_LOST") };

    let minors = |nvml: &NvmlBackend| {
        nvml.inventory()
            .expect("discovery")
            .gpus
            .iter()
            .map(|g| g.minor)
            .collect::<Vec<_>>()
    };
    assert_eq!(minors(&nvml), [0, 2]);
    assert!(GpuControl::probe(&*nvml, 1).expect("probe").lost);
    nvml.invalidate();
    assert_eq!(minors(&nvml), [0, 2], "still nameless");

    sim.inject(1, SimFault::Reset).expect("reset GPU 1");
    // A rescan of the faulted GPU tries the nameless ones: one of them may be it.
    GpuControl::invalidate_gpu(&*nvml, 1);
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim"),
        "named and read in full once it answers"
    );
}
