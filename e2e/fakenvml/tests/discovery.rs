//! The NVML backend, loaded against the fake libnvidia-ml, must discover exactly what the
//! simulation backend reports, static MIG instances included.
mod common;
use common::fake_library;
use std::path::Path;
use std::sync::Mutex;

use gpu_dra::gpu::nvml::NvmlBackend;
use gpu_dra::gpu::sim::{SimNode, write_fake_sysfs};
use gpu_dra::gpu::{NodeInventory, Placement};

/// The fake reads its configuration from the environment, which is per process.
static ENV: Mutex<()> = Mutex::new(());

fn discover_both(
    spec: &str,
    node: &str,
    state: &Path,
    setup: impl FnOnce(&SimNode),
) -> (NodeInventory, NodeInventory) {
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let sim = SimNode::new(spec.parse().expect("spec"), node, Some(state.to_path_buf()));
    setup(&sim);
    let sysfs = tempfile::tempdir().expect("sysfs");
    sim.write_sysfs(sysfs.path()).expect("sysfs links");
    // The simulated kernel's module aliases: the VFIO variant drivers (nvgrace for GB200).
    let modules = sysfs.path().join("lib-modules");
    SimNode::write_modules(&modules).expect("modules.alias");
    // SAFETY: the ENV lock serialises every reader and writer of these variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", spec);
        std::env::set_var("FAKE_NVML_NODE", node);
        std::env::set_var("FAKE_NVML_STATE", state);
    }
    let backend = NvmlBackend::open(Some(&fake_library()), sysfs.path().to_path_buf())
        .expect("NVML init")
        .with_pci_scan(true)
        .with_modules_root(modules);
    let through_nvml = backend.inventory().expect("NVML discovery");
    drop(backend);
    (sim.inventory().expect("sim discovery"), through_nvml)
}

#[test]
fn h100_node_matches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sim, nvml) = discover_both(
        "sim:8xH100-SXM5-80GB",
        "n1",
        &dir.path().join("s.json"),
        |_| {},
    );
    assert_eq!(nvml.gpus.len(), 8);
    assert_eq!(nvml.gpus[3].pcie_root.as_deref(), Some("pci0000:5a"));
    let mig = nvml.gpus[0].mig.as_ref().expect("H100 is MIG-capable");
    assert_eq!(mig.profiles.len(), 7);
    assert_eq!(
        mig.profiles
            .iter()
            .find(|p| p.id == 9)
            .map(|p| p.placements.clone()),
        Some(vec![
            Placement { start: 0, size: 4 },
            Placement { start: 4, size: 4 }
        ])
    );
    assert_eq!(sim, nvml);
}

#[test]
fn mixed_fleet_with_static_mig_matches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sim, nvml) = discover_both(
        "sim:2xA100-SXM4-40GB,1xA30-24GB,1xT4,1xH200-SXM5-141GB,1xL4",
        "n2",
        &dir.path().join("s.json"),
        |node| {
            node.set_mig_mode(1, true).expect("enable");
            node.reset_gpu(1).expect("reset");
            for (profile, start, size) in [(9, 4, 4), (14, 0, 2), (19, 3, 1)] {
                let gi = node
                    .create_gpu_instance(1, profile, Placement { start, size })
                    .expect("gi");
                node.create_compute_instance(1, gi).expect("ci");
            }
            node.set_mig_mode(4, true).expect("enable H200");
            let gi = node
                .create_gpu_instance(4, 0, Placement { start: 0, size: 8 })
                .expect("7g");
            node.create_compute_instance(4, gi).expect("ci");
            // A GPU instance without a compute instance is no MIG device.
            node.create_gpu_instance(2, 0, Placement { start: 0, size: 4 })
                .expect_err("A30 MIG off");
        },
    );
    assert_eq!(nvml.gpus[1].mig.as_ref().expect("mig").instances.len(), 3);
    assert!(nvml.gpus[3].mig.is_none(), "T4 is not MIG-capable");
    assert_eq!(nvml.gpus[2].mig.as_ref().expect("A30").memory_slices, 4);
    assert_eq!(sim, nvml);
}

/// Today's GPUs: Blackwell (a 12-slice RTX PRO among them), Hopper variants, Ada, Ampere.
#[test]
fn newer_models_match_with_mig_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sim, nvml) = discover_both(
        "sim:1xB200-SXM6-180GB,1xGB200-186GB,1xH100-PCIE-80GB,1xH100-NVL-94GB,1xH20-96GB,1xRTX-PRO-6000-BSE-96GB,1xL40S,1xA10,1xGB10",
        "n3",
        &dir.path().join("s.json"),
        |node| {
            for minor in [0, 5] {
                node.set_mig_mode(minor, true).expect("MIG on");
            }
        },
    );
    assert_eq!(nvml.gpus[5].brand, "NvidiaRTX");
    // nvmlDeviceGetAddressingMode: ATS on the Grace-attached GB200, None elsewhere.
    assert_eq!(
        nvml.gpus[1].addressing_mode,
        Some(gpu_dra::gpu::AddressingMode::Ats)
    );
    assert_eq!(
        nvml.gpus[0].addressing_mode,
        Some(gpu_dra::gpu::AddressingMode::None)
    );
    // Unified memory: no framebuffer through NVML (both memory-info calls NOT_SUPPORTED).
    assert_eq!(nvml.gpus[8].product_name, "NVIDIA GB10");
    assert_eq!(nvml.gpus[8].memory_bytes, None);
    assert_eq!(nvml.gpus[2].memory_bytes, Some(81559 << 20));
    assert_eq!(
        nvml.gpus[0].mig.as_ref().expect("B200").profiles.len(),
        sim.gpus[0].mig.as_ref().expect("B200").profiles.len()
    );
    assert_eq!(sim, nvml);
}

#[test]
fn missing_configuration_looks_like_no_driver() {
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: serialised by ENV.
    unsafe { std::env::remove_var("FAKE_NVML_GPUS") };
    let err = NvmlBackend::open(Some(&fake_library()), "/sys".into())
        .err()
        .expect("init must fail");
    assert!(err.to_string().contains("initialise NVML"), "{err}");
}

/// The MIG lifecycle through NVML (raw calls) changes the simulated hardware exactly as the
/// simulator's own API does, with the same errors.
#[test]
fn mig_lifecycle_through_nvml() {
    use gpu_dra::gpu::{GpuControl, GpuError, MigFailure};
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    // SAFETY: serialised by ENV.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", "sim:2xH100-SXM5-80GB");
        std::env::set_var("FAKE_NVML_NODE", "n3");
        std::env::set_var("FAKE_NVML_STATE", &state);
    }
    let nvml = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into()).expect("NVML init");
    let sim = SimNode::new(
        "sim:2xH100-SXM5-80GB".parse().expect("spec"),
        "n3",
        Some(state.clone()),
    );

    assert!(nvml.set_mig_mode(1, true).expect("enable").current);
    let gi = nvml
        .create_gpu_instance(1, 9, Placement { start: 4, size: 4 })
        .expect("3g@4");
    let (ci, uuid) = nvml.create_compute_instance(1, gi).expect("ci");
    assert!(uuid.starts_with("MIG-"));
    let hw = sim.inventory().expect("sim");
    let instance = &hw.gpus[1].mig.as_ref().expect("mig").instances[0];
    assert_eq!(
        (
            instance.gpu_instance_id,
            instance.compute_instance_id,
            instance.uuid.as_str()
        ),
        (gi, ci, uuid.as_str())
    );
    let listed = nvml.gpu_instances(1).expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].compute_instances, [ci]);

    let err = nvml
        .create_gpu_instance(1, 19, Placement { start: 5, size: 1 })
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
    let err = nvml
        .destroy_gpu_instance(1, gi)
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

    nvml.destroy_compute_instance(1, gi, ci).expect("ci");
    nvml.destroy_gpu_instance(1, gi).expect("gi");
    assert!(nvml.gpu_instances(1).expect("list").is_empty());
    assert!(!nvml.set_mig_mode(1, false).expect("disable").current);
    assert!(sim.state().expect("state").gpus[1].gpu_instances.is_empty());
}

/// NVML calls that read what never changes on a GPU; after the first inventory they are cached.
const STATIC_CALLS: &[&str] = &[
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetAddressingMode",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
];

/// Once the first inventory has read the node, a dynamic carve (GPU instance + compute instance
/// on one GPU) and the inventory after it ask NVML only about that GPU's MIG state: no
/// enumeration, no static facts, nothing about other GPUs.
///
/// Measured on 8×H100 with MIG mode on GPU 5, carving 3g.40gb@4 and its CI, then one inventory:
/// before the NVML backend cached, 1,134 NVML calls (three full discoveries: two inside
/// `create_compute_instance`, one after; three handle lookups walking every GPU), 897 of them
/// about other GPUs. Now 23, all about GPU 5: GI create 2, CI create 7 (the GI's profile, then
/// create and read the MIG device's UUID), and the inventory re-reads GPU 5's MIG mode and walks
/// its 7 MIG device slots (9) plus 5 per MIG device.
#[test]
fn a_carve_asks_nvml_only_about_the_carved_gpu() {
    use gpu_dra::gpu::GpuControl;
    const SPEC: &str = "sim:8xH100-SXM5-80GB";
    const CARVED: u32 = 5;
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    let log = dir.path().join("calls.log");
    let sim = SimNode::new(SPEC.parse().expect("spec"), "n4", Some(state.clone()));
    sim.set_mig_mode(CARVED, true).expect("enable");
    // SAFETY: serialised by ENV.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", "n4");
        std::env::set_var("FAKE_NVML_STATE", &state);
        std::env::set_var("FAKE_NVML_CALL_LOG", &log);
    }
    let nvml = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into()).expect("NVML init");
    // SAFETY: serialised by ENV; the fake read it at init, and other tests must not log.
    unsafe { std::env::remove_var("FAKE_NVML_CALL_LOG") };
    nvml.inventory().expect("first inventory");

    std::fs::write(&log, "").expect("truncate the call log");
    let gi = nvml
        .create_gpu_instance(CARVED, 9, Placement { start: 4, size: 4 })
        .expect("3g@4");
    nvml.create_compute_instance(CARVED, gi).expect("ci");
    let after = nvml.inventory().expect("inventory after the carve");

    let text = std::fs::read_to_string(&log).expect("call log");
    let calls: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .collect();
    let mut per_function = std::collections::BTreeMap::<&str, usize>::new();
    for (function, _) in &calls {
        *per_function.entry(function).or_default() += 1;
    }
    let other_gpus = calls
        .iter()
        .filter(|(_, gpu)| *gpu != "-" && *gpu != CARVED.to_string())
        .count();
    let fresh = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into())
        .expect("second NVML init")
        .inventory()
        .expect("fresh discovery");
    assert_eq!(
        after, fresh,
        "the cached view is what a full discovery reads"
    );
    let hw = sim.inventory().expect("sim");
    let carved = CARVED as usize;
    assert_eq!(
        after.gpus[carved].mig, hw.gpus[carved].mig,
        "the carve shows"
    );
    assert_eq!(other_gpus, 0, "{per_function:#?}");
    let statics: Vec<_> = per_function
        .keys()
        .filter(|f| STATIC_CALLS.contains(f))
        .collect();
    assert!(statics.is_empty(), "static facts re-read: {statics:?}");
    assert!(
        calls.len() <= 23,
        "{} calls: {per_function:#?}",
        calls.len()
    );

    // A MIG mode change reads that GPU's profiles for the new mode once (real drivers answer
    // placements only in MIG mode); going back and forth later reads none.
    const TOGGLED: u32 = 6;
    let profile_reads = || {
        std::fs::read_to_string(&log)
            .expect("call log")
            .lines()
            .filter(|l| l.starts_with("nvmlDeviceGetGpuInstanceProfileInfo "))
            .map(|l| l.ends_with(&format!(" {TOGGLED}")))
            .collect::<Vec<_>>()
    };
    std::fs::write(&log, "").expect("truncate the call log");
    nvml.set_mig_mode(TOGGLED, true).expect("enable");
    let toggled = nvml.inventory().expect("inventory in MIG mode");
    let reads = profile_reads();
    assert!(
        !reads.is_empty() && reads.iter().all(|&on_gpu| on_gpu),
        "{reads:?}"
    );
    std::fs::write(&log, "").expect("truncate the call log");
    nvml.set_mig_mode(TOGGLED, false).expect("disable");
    nvml.inventory().expect("inventory");
    nvml.set_mig_mode(TOGGLED, true).expect("enable again");
    assert_eq!(nvml.inventory().expect("inventory"), toggled);
    assert_eq!(profile_reads(), Vec::<bool>::new());
}

/// Time-slicing through the NVML backend: compute mode through NVML (the fake keeps it in the
/// simulated hardware), the interval through the driver's `nvidia-smi` chrooted into the driver
/// root, as NVIDIA's driver does.
#[test]
#[ignore = "needs root: nvidia-smi runs chrooted into the driver root (e2e/run-tests runs ignored tests)"]
fn time_slicing_through_nvml_and_nvidia_smi() {
    use gpu_dra::gpu::{ComputeMode, GpuControl, SharingSettings};
    use std::os::unix::fs::PermissionsExt;
    const SPEC: &str = "sim:2xA100-SXM4-40GB";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    let sim = SimNode::new(SPEC.parse().expect("spec"), "n5", Some(state.clone()));
    sim.inventory().expect("create the state");
    // SAFETY: serialised by ENV.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", "n5");
        std::env::set_var("FAKE_NVML_STATE", &state);
    }
    // The fake nvidia-smi (this package's binary) in a fake driver root: it runs only chrooted
    // there, with the driver root's own C library, and acts on the simulated GPUs.
    let root = dir.path().join("driver-root");
    gpu_dra::prepare::driver_files::write_fake_driver_root(&root, "580.95.05")
        .expect("fake driver root");
    std::fs::copy(
        env!("CARGO_BIN_EXE_nvidia-smi"),
        root.join("usr/bin/nvidia-smi"),
    )
    .expect("install the fake nvidia-smi");
    std::fs::set_permissions(
        root.join("usr/bin/nvidia-smi"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    let tools = gpu_dra::gpu::driver_tools::DriverRootTools::new(&root, &root);
    let smi = gpu_dra::gpu::driver_tools::NvidiaSmi::find(&tools)
        .expect("nvidia-smi in the driver root")
        .on_simulated_gpus(Some(&state));
    smi.check()
        .expect("the fake nvidia-smi loads in its driver root");
    let sliced = SharingSettings {
        compute_mode: ComputeMode::Default,
        timeslice: Some(2),
    };

    // Without nvidia-smi an interval is refused before anything changes.
    let without = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into()).expect("NVML");
    without
        .set_sharing_settings(
            1,
            SharingSettings {
                compute_mode: ComputeMode::ExclusiveProcess,
                timeslice: None,
            },
        )
        .expect("compute mode alone needs no nvidia-smi");
    let err = without
        .set_sharing_settings(1, sliced)
        .expect_err("no nvidia-smi");
    assert!(err.to_string().contains("no nvidia-smi"), "{err}");
    assert_eq!(
        sim.sharing_settings(1).expect("sim").compute_mode,
        ComputeMode::ExclusiveProcess,
        "the refused call changed nothing"
    );
    drop(without);

    let nvml = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into())
        .expect("NVML")
        .with_nvidia_smi(Some(smi));
    assert_eq!(
        nvml.sharing_settings(1).expect("read").compute_mode,
        ComputeMode::ExclusiveProcess
    );
    nvml.set_sharing_settings(1, sliced).expect("time-slice");
    assert_eq!(
        sim.sharing_settings(1).expect("sim").compute_mode,
        ComputeMode::Default
    );
    assert_eq!(
        sim.sharing_settings(1).expect("sim").timeslice,
        Some(2),
        "nvidia-smi set the interval on the simulated GPU"
    );
    // NVML has no call that reads the interval back.
    assert_eq!(nvml.sharing_settings(1).expect("read").timeslice, None);
}

/// NVML 13.4's per-cgroup memory limits, as the driver reads and clears them through the NVML
/// backend; set here through the simulated GPUs, as the toolkit's hook sets them through NVML.
#[test]
fn memory_limits_through_nvml() {
    use gpu_dra::gpu::memory_limit::{LIMIT_MAX, MemoryLimit, MemoryLimitFailure};
    use gpu_dra::gpu::{GpuControl, GpuError};
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = "sim:2xH100-SXM5-80GB";
    let state = dir.path().join("s.json");
    let sim = SimNode::new(spec.parse().expect("spec"), "n1", Some(state.clone()));
    // A cgroup as NVML opens one: a folder with `cgroup.procs`.
    let cgroup = dir.path().join("pod/container");
    std::fs::create_dir_all(&cgroup).expect("cgroup dir");
    std::fs::write(cgroup.join("cgroup.procs"), "").expect("cgroup.procs");
    let sysfs = tempfile::tempdir().expect("sysfs");
    write_fake_sysfs(sysfs.path(), &spec.parse().expect("spec")).expect("sysfs links");
    // SAFETY: the ENV lock serialises every reader and writer of these variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", spec);
        std::env::set_var("FAKE_NVML_NODE", "n1");
        std::env::set_var("FAKE_NVML_STATE", &state);
    }
    let nvml = NvmlBackend::open(Some(&fake_library()), sysfs.path().to_path_buf())
        .expect("NVML init")
        .with_pci_scan(true);
    assert_eq!(nvml.memory_limits_supported(), Ok(()));
    assert_eq!(nvml.memory_limit(0, &cgroup).expect("read"), None);

    let limit = MemoryLimit {
        soft: 8 << 30,
        hard: 10 << 30,
    };
    sim.set_memory_limit(0, &cgroup, limit).expect("set");
    assert_eq!(nvml.memory_limit(0, &cgroup).expect("read"), Some(limit));
    assert_eq!(
        nvml.memory_limit(1, &cgroup).expect("read"),
        None,
        "per GPU"
    );
    // The same cgroup through another path is the same cgroup.
    let again = dir.path().join("again");
    std::os::unix::fs::symlink(dir.path().join("pod"), &again).expect("symlink");
    assert_eq!(
        nvml.memory_limit(0, &again.join("container"))
            .expect("read"),
        Some(limit)
    );
    nvml.clear_memory_limit(0, &cgroup).expect("clear");
    assert_eq!(nvml.memory_limit(0, &cgroup).expect("read"), None);

    // NVML's refusals: soft above hard, beyond the GPU's memory, no such cgroup, a GPU in MIG
    // mode; the state is unchanged by each.
    let failure = |result: Result<(), GpuError>| match result {
        Err(GpuError::MemoryLimit { failure, .. }) => failure,
        other => panic!("{other:?}"),
    };
    let set = |minor, path: &Path, soft, hard| {
        sim.set_memory_limit(minor, path, MemoryLimit { soft, hard })
    };
    assert_eq!(
        failure(set(0, &cgroup, 2 << 30, 1 << 30)),
        MemoryLimitFailure::InvalidArgument
    );
    assert_eq!(
        failure(set(0, &cgroup, 0, 200 << 30)),
        MemoryLimitFailure::InvalidArgument
    );
    set(0, &cgroup, 0, LIMIT_MAX).expect("no hard limit: clears");
    assert_eq!(
        failure(set(0, &dir.path().join("gone"), 0, 1 << 30)),
        MemoryLimitFailure::OperatingSystem
    );
    match nvml.memory_limit(0, &dir.path().join("gone")) {
        Err(GpuError::MemoryLimit { failure, .. }) => {
            assert_eq!(failure, MemoryLimitFailure::OperatingSystem)
        }
        other => panic!("{other:?}"),
    }
    nvml.set_mig_mode(1, true).expect("MIG on");
    assert_eq!(
        failure(set(1, &cgroup, 0, 1 << 30)),
        MemoryLimitFailure::NotSupported
    );
    match nvml.memory_limit(1, &cgroup) {
        Err(GpuError::MemoryLimit { failure, .. }) => {
            assert_eq!(failure, MemoryLimitFailure::NotSupported)
        }
        other => panic!("{other:?}"),
    }
    assert!(
        sim.state()
            .expect("state")
            .gpus
            .iter()
            .all(|g| g.memory_limits.is_empty())
    );
}

/// A GPU bound to vfio-pci (for a virtual machine) is not NVML's: the real NVML code path sees
/// the others, with NVML's indexes counting only them, and the same PCIe roots as before.
#[test]
fn a_gpu_bound_to_vfio_pci_is_not_discovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sim, nvml) = discover_both(
        "sim:3xH100-SXM5-80GB",
        "n1",
        &dir.path().join("s.json"),
        |sim| {
            sim.bind_driver(1, gpu_dra::gpu::sim::PciDriver::VfioPci)
                .expect("to vfio-pci")
        },
    );
    assert_eq!(nvml, sim);
    let seen: Vec<(u32, u32)> = nvml.gpus.iter().map(|g| (g.minor, g.index)).collect();
    assert_eq!(seen, vec![(0, 0), (2, 1)]);
    assert_eq!(nvml.gpus[1].pcie_root.as_deref(), Some("pci0000:37"));
}

/// A node whose GPUs are all bound to vfio-pci (every one in a virtual machine) has no GPU NVML
/// sees: a plain init fails there as NVML's does, and the backend, which passes
/// `NVML_INIT_FLAG_NO_GPUS`, starts with none, so the driver can still unprepare the VMs' claims.
#[test]
fn a_node_whose_gpus_are_all_in_virtual_machines_still_initialises() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let sim = SimNode::new(
        "sim:2xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(state.clone()),
    );
    for minor in 0..2 {
        sim.bind_driver(minor, gpu_dra::gpu::sim::PciDriver::VfioPci)
            .expect("to vfio-pci");
    }
    let sysfs = tempfile::tempdir().expect("sysfs");
    sim.write_sysfs(sysfs.path()).expect("sysfs links");
    // SAFETY: serialised by ENV.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", "sim:2xH100-SXM5-80GB");
        std::env::set_var("FAKE_NVML_NODE", "n1");
        std::env::set_var("FAKE_NVML_STATE", &state);
    }
    let plain = nvml_wrapper::Nvml::builder()
        .lib_path(fake_library().as_os_str())
        .init();
    assert!(
        plain.is_err(),
        "NVML without NO_GPUS fails on a node with no GPU it sees"
    );
    drop(plain);
    let backend =
        NvmlBackend::open(Some(&fake_library()), sysfs.path().to_path_buf()).expect("NVML init");
    assert!(backend.inventory().expect("discovery").gpus.is_empty());
}

/// A Grace-attached GPU goes to a virtual machine through Linux's nvgrace-gpu variant: the PCI
/// scan on the real code path picks it from the kernel's module aliases and the function's
/// modalias, as the simulator does.
#[test]
fn a_grace_attached_gpu_is_bound_to_its_vfio_variant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sim, nvml) = discover_both(
        "sim:1xH100-SXM5-80GB,1xGB200-186GB",
        "n1",
        &dir.path().join("s.json"),
        |sim| {
            sim.bind_driver(1, gpu_dra::gpu::sim::PciDriver::VfioPci)
                .expect("to its VFIO driver")
        },
    );
    assert_eq!(nvml, sim);
    let drivers: Vec<(Option<&str>, &str)> = nvml
        .pci
        .gpus
        .iter()
        .map(|f| (f.driver.as_deref(), f.vfio_driver.as_str()))
        .collect();
    assert_eq!(
        drivers,
        [
            (Some("nvidia"), "vfio-pci"),
            (Some("nvgrace_gpu_vfio_pci"), "nvgrace_gpu_vfio_pci")
        ]
    );
}

/// The use the per-claim metrics read, through NVML's memory, utilization and process calls on
/// the fake: the simulator's processes, on a whole GPU and on a MIG device, as its own backend
/// reports them.
#[test]
fn gpu_use_through_nvml_is_the_simulators() {
    use gpu_dra::gpu::GpuControl;
    use gpu_dra::gpu::sim::SimProcess;
    use gpu_dra::gpu::usage::ProcessUsage;
    const SPEC: &str = "sim:2xH100-SXM5-80GB,1xGB10";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    let sim = SimNode::new(SPEC.parse().expect("spec"), "u1", Some(state.clone()));
    sim.set_mig_mode(1, true).expect("MIG on");
    let profile = sim.inventory().expect("inventory").gpus[1]
        .mig
        .clone()
        .expect("MIG")
        .profiles[0]
        .clone();
    let gi = sim
        .create_gpu_instance(1, profile.id, profile.placements[0])
        .expect("GPU instance");
    sim.create_compute_instance(1, gi)
        .expect("compute instance");
    let process = |pid, gi: Option<u32>, mib: u64, sm| SimProcess {
        usage: ProcessUsage {
            pid,
            memory_used_bytes: Some(mib << 20),
            gpu_instance_id: gi,
            compute_instance_id: gi.map(|_| 0),
        },
        sm_percent: sm,
    };
    sim.set_process(0, 11, Some(process(11, None, 3000, 35)))
        .expect("process");
    sim.set_process(0, 12, Some(process(12, None, 1000, 80)))
        .expect("process");
    sim.set_process(1, 21, Some(process(21, Some(gi), 500, 50)))
        .expect("process on the MIG device");
    sim.set_process(2, 31, Some(process(31, None, 2000, 10)))
        .expect("process on the unified-memory GPU");
    assert!(
        sim.set_process(1, 22, Some(process(22, None, 1, 1)))
            .is_err(),
        "a GPU in MIG mode runs processes on GPU instances only"
    );
    // SAFETY: the ENV lock serialises every reader and writer of these variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", "u1");
        std::env::set_var("FAKE_NVML_STATE", &state);
    }
    let nvml = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into()).expect("NVML init");
    for minor in [0, 1, 2] {
        assert_eq!(
            GpuControl::usage(&nvml, minor).expect("usage through NVML"),
            GpuControl::usage(&sim, minor).expect("usage in the simulator"),
            "GPU {minor}"
        );
    }
    let whole = GpuControl::usage(&nvml, 0).expect("usage");
    assert_eq!(whole.memory_used_bytes, 4000 << 20);
    assert_eq!(whole.utilization_percent, Some(100), "35 + 80, at most 100");
    let mig = GpuControl::usage(&nvml, 1).expect("usage");
    assert_eq!(mig.utilization_percent, None, "NVML has none in MIG mode");
    assert_eq!(mig.gpu_instance_memory(gi), 500 << 20);
    // Unified memory (GB10): NVML's memory calls are NOT_SUPPORTED; the processes' memory is
    // what it tells.
    assert_eq!(
        GpuControl::usage(&nvml, 2)
            .expect("usage")
            .memory_used_bytes,
        2000 << 20
    );
    // Ended: gone from NVML's list.
    sim.set_process(0, 12, None).expect("end");
    assert_eq!(
        GpuControl::usage(&nvml, 0).expect("usage").processes.len(),
        1
    );
}

/// NVLink fabric info through NVML's `nvmlDeviceGetGpuFabricInfo` is the simulator's: GB200
/// GPUs in the rack's clique (and another once the fabric manager moves the node), none on
/// models without multi-node NVLink; the node's clique reads the same through both backends.
#[test]
fn fabric_info_and_the_nodes_clique_match() {
    use gpu_dra::compute_domain::node::node_clique;
    use gpu_dra::gpu::GpuControl;
    use gpu_dra::gpu::model::{FabricInfo, FabricState};
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    for (spec, node, fabric) in [
        ("sim:4xGB200-186GB", "rack-a", None),
        (
            "sim:4xGB200-186GB",
            "rack-b",
            Some(FabricInfo {
                cluster_uuid: "0b1c5b0e-4c55-4a8a-9f39-8f8e5a3c1d2e".into(),
                clique_id: 7,
                state: FabricState::Completed,
            }),
        ),
        ("sim:2xH100-SXM5-80GB", "hgx", None),
    ] {
        let _ = std::fs::remove_file(&state);
        let sim = SimNode::new(spec.parse().expect("spec"), node, Some(state.clone()));
        if let Some(fabric) = &fabric {
            sim.set_fabric(fabric.clone()).expect("fabric");
        }
        let sysfs = tempfile::tempdir().expect("sysfs");
        sim.write_sysfs(sysfs.path()).expect("sysfs links");
        // SAFETY: the ENV lock serialises every reader and writer of these variables.
        unsafe {
            std::env::set_var("FAKE_NVML_GPUS", spec);
            std::env::set_var("FAKE_NVML_NODE", node);
            std::env::set_var("FAKE_NVML_STATE", &state);
        }
        let backend = NvmlBackend::open(Some(&fake_library()), sysfs.path().to_path_buf())
            .expect("NVML init");
        for minor in 0..sim.inventory().expect("sim").gpus.len() as u32 {
            assert_eq!(
                backend.fabric(minor).expect("NVML fabric"),
                sim.fabric(minor).expect("sim fabric"),
                "{spec} GPU {minor}"
            );
        }
        let through_nvml = node_clique(&backend).expect("clique through NVML");
        assert_eq!(through_nvml, node_clique(&sim).expect("clique"), "{spec}");
        let expected = match (spec, &fabric) {
            (_, Some(f)) => f.clique(),
            ("sim:4xGB200-186GB", None) => gpu_dra::gpu::sim::default_fabric().clique(),
            _ => String::new(),
        };
        assert_eq!(through_nvml, expected, "{spec}");
    }
    // A node whose GPUs are not registered with the fabric yet cannot join a domain.
    let _ = std::fs::remove_file(&state);
    let sim = SimNode::new(
        "sim:1xGB200-186GB".parse().expect("spec"),
        "rack-c",
        Some(state.clone()),
    );
    sim.set_fabric(FabricInfo {
        state: FabricState::InProgress,
        ..gpu_dra::gpu::sim::default_fabric()
    })
    .expect("fabric");
    let error = node_clique(&sim).expect_err("not registered");
    assert!(error.contains("InProgress"), "{error}");
}
