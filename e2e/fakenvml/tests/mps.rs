//! MPS claims, prepared in process on simulated GPUs with the fake `nvidia-cuda-mps-control`
//! (this package's binary) in a fake driver root: the daemon really runs, is told the claim's
//! limits, outlives a driver restart, and leaves nothing behind. Also the GPU memory limits a
//! shared claim's containers get through NVIDIA's own `nvidia-cdi-hook` and the fake NVML.
//!
//! Needs root (the daemon's shm is a tmpfs mount), as the driver does: plain `cargo test` lists
//! the tests as ignored; `cargo test -- --include-ignored` (e2e/run-tests) runs them.
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_dra::gpu::ComputeMode;
use gpu_dra::gpu::mig::MigPolicy;
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::prepare::ClaimRef;
use gpu_dra::prepare::driver_files::{DriverRoot, write_fake_driver_root};
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use gpu_dra::slices::consumable::ConsumableShares;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;

const FAKE_CONTROL: &str = env!("CARGO_BIN_EXE_nvidia-cuda-mps-control");

struct Node {
    dir: tempfile::TempDir,
    config: DriverConfig,
    sim: Arc<SimNode>,
}

impl Node {
    fn new(spec: &str, mig_policy: MigPolicy) -> Self {
        Self::with_shares(spec, mig_policy, ConsumableShares::Off)
    }

    fn with_shares(spec: &str, mig_policy: MigPolicy, consumable: ConsumableShares) -> Self {
        assert!(
            rustix::process::geteuid().is_root(),
            "MPS tests mount the daemon's shm tmpfs: run them as root"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let sim = Arc::new(SimNode::new(
            spec.parse().expect("spec"),
            "n1",
            Some(dir.path().join("hw.json")),
        ));
        let root = dir.path().join("driver-root");
        let version = sim.inventory().expect("inventory").driver_version;
        write_fake_driver_root(&root, &version).expect("fake driver root");
        let control = root.join("usr/bin/nvidia-cuda-mps-control");
        std::fs::copy(FAKE_CONTROL, &control).expect("install the fake control binary");
        let config = DriverConfig {
            driver_name: "gpu.nvidia.com".into(),
            mig_policy,
            node_name: "n1".into(),
            cdi_root: dir.path().join("cdi"),
            state_dir: dir.path().join("state"),
            dev_root: None,
            consumable,
            passthrough: false,
            driver_root: Some(DriverRoot {
                here: root.clone(),
                host: root,
                hook: None,
                firmware: Default::default(),
            }),
        };
        Self { dir, config, sim }
    }

    fn open(&self) -> (DeviceState, gpu_dra::prepare::state::RecoveryReport) {
        DeviceState::open(self.config.clone(), self.sim.clone()).expect("open")
    }

    fn daemon_dir(&self, uid: &str) -> PathBuf {
        self.config.state_dir.join("mps").join(uid)
    }

    fn control_log(&self, uid: &str) -> String {
        std::fs::read_to_string(self.daemon_dir(uid).join("log/control.log")).unwrap_or_default()
    }

    fn spec(&self, uid: &str) -> serde_json::Value {
        let path = self
            .config
            .cdi_root
            .join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"));
        serde_json::from_slice(&std::fs::read(path).expect("spec")).expect("spec json")
    }

    /// Control daemons serving this node's MPS folders (the driver marks their environment
    /// with their folder; their servers, `--fake-server`, are not counted).
    fn daemons(&self) -> Vec<u32> {
        self.mps_processes()
            .into_iter()
            .filter(|pid| {
                !std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(13).any(|w| w == b"--fake-server"))
            })
            .collect()
    }

    /// Every MPS process of this node: control daemons and their servers.
    fn mps_processes(&self) -> Vec<u32> {
        let marker = format!(
            "GPU_DRA_MPS_FOLDER={}",
            self.config.state_dir.join("mps").display()
        );
        std::fs::read_dir("/proc")
            .expect("proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.split(|b| *b == 0)
                        .any(|e| e.starts_with(marker.as_bytes()))
                })
            })
            .collect()
    }

    fn mounts_under_dir(&self) -> Vec<String> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&dir))
            .map(String::from)
            .collect()
    }

    /// Nothing of MPS left: no daemon, no mount, no folder.
    fn assert_clean(&self) {
        assert!(
            self.mps_processes().is_empty(),
            "MPS processes left: {:?}",
            self.mps_processes()
        );
        assert!(
            self.mounts_under_dir().is_empty(),
            "{:?}",
            self.mounts_under_dir()
        );
        let left: Vec<_> = std::fs::read_dir(self.config.state_dir.join("mps"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "MPS folders left: {left:?}");
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A failed test must not leave daemons, their cgroups or mounts on the machine.
        let mut cgroups = std::collections::BTreeSet::new();
        for pid in self.mps_processes() {
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) {
                cgroups.extend(text.lines().filter_map(|l| {
                    let path = l.splitn(3, ':').nth(2)?;
                    path.contains("gpu-dra-mps/").then(|| path.to_string())
                }));
            }
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        for mount in self.mounts_under_dir() {
            let _ = rustix::mount::unmount(mount.as_str(), rustix::mount::UnmountFlags::DETACH);
        }
        // Empty once the killed processes are reaped (a moment later).
        for _ in 0..50 {
            let mut left = false;
            for cgroup in &cgroups {
                for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let dir = hierarchy.path().join(cgroup.trim_start_matches('/'));
                    if dir.exists() && std::fs::remove_dir(&dir).is_err() {
                        left = true;
                    }
                }
            }
            if !left {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

fn result(request: &str, device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.into(),
        driver: "gpu.nvidia.com".into(),
        pool: "n1".into(),
        device: device.into(),
        ..Default::default()
    }
}

fn claim(
    uid: &str,
    results: Vec<DeviceRequestAllocationResult>,
    configs: Vec<(Option<&str>, serde_json::Value)>,
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
                        configs
                            .into_iter()
                            .map(|(request, parameters)| DeviceAllocationConfiguration {
                                source: "FromClaim".into(),
                                requests: request.map(|r| vec![r.to_string()]),
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

fn mps(kind: &str, config: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind,
           "sharing": {"strategy": "MPS", "mpsConfig": config}})
}

fn uuid_of(state: &DeviceState, uid: &str, index: usize) -> String {
    state.checkpoint().claims[uid].devices[index].uuid.clone()
}

fn has_mount(spec: &serde_json::Value, host: &Path, container: &str) -> bool {
    spec["containerEdits"]["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| {
            m["hostPath"] == json!(host.to_string_lossy()) && m["containerPath"] == json!(container)
        })
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn a_full_gpu_gets_a_daemon_with_the_claims_limits_that_outlives_a_restart() {
    let node = Node::new("sim:2xH100-SXM5-80GB", MigPolicy::Static);
    // What an admin left on the GPU comes back at unprepare.
    let before = node.sim.sharing_settings(1).expect("settings");
    let (state, _) = node.open();
    let c = claim(
        "m1",
        vec![result("gpu", "gpu-1")],
        vec![(
            None,
            mps(
                "GpuConfig",
                json!({"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}),
            ),
        )],
    );
    state.prepare(&claim_ref("m1"), &c).expect("prepare");
    let uuid = uuid_of(&state, "m1", 0);
    assert_eq!(
        node.sim.sharing_settings(1).expect("settings").compute_mode,
        ComputeMode::ExclusiveProcess
    );
    assert_eq!(
        node.sim.sharing_settings(0).expect("settings"),
        before,
        "GPU 0 untouched"
    );
    let log = node.control_log("m1");
    assert!(
        log.contains(&format!("CUDA_VISIBLE_DEVICES={uuid} "))
            && log.contains("multiUser=false")
            && log.contains("cmd: set_default_active_thread_percentage 50")
            && log.contains(&format!(
                "cmd: set_default_device_pinned_mem_limit {uuid} 10240M"
            )),
        "{log}"
    );
    let spec = node.spec("m1");
    let env = spec["containerEdits"]["env"].to_string();
    assert!(
        env.contains("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
        "{env}"
    );
    assert!(has_mount(
        &spec,
        &node.daemon_dir("m1").join("pipe"),
        "/tmp/nvidia-mps"
    ));
    assert!(has_mount(
        &spec,
        &node.daemon_dir("m1").join("shm"),
        "/dev/shm"
    ));
    assert_eq!(node.mounts_under_dir().len(), 1, "the shm tmpfs");
    let daemons = node.daemons();
    assert_eq!(daemons.len(), 1, "one daemon per claim");
    // The simulated hardware knows the daemon and what it was told.
    let recorded = node.sim.state().expect("state").mps_daemons;
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].devices, std::slice::from_ref(&uuid));
    assert_eq!(recorded[0].active_thread_percentage.as_deref(), Some("50"));
    assert_eq!(
        recorded[0]
            .pinned_device_memory_limits
            .get(&uuid)
            .map(String::as_str),
        Some("10240M")
    );

    // A driver restart adopts the running daemon: same process, not told anything again.
    drop(state);
    let (state, report) = node.open();
    assert!(report.mps_restarted.is_empty() && report.rolled_back.is_empty());
    assert_eq!(node.daemons(), daemons);
    assert_eq!(
        node.control_log("m1")
            .matches("Control daemon started")
            .count(),
        1
    );

    state.unprepare("m1").expect("unprepare");
    assert_eq!(node.sim.sharing_settings(1).expect("settings"), before);
    assert!(node.sim.state().expect("state").mps_daemons.is_empty());
    node.assert_clean();
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn a_carved_mig_device_gets_its_daemon_after_the_carve_and_loses_it_before_the_destroy() {
    let node = Node::new("sim:1xH100-SXM5-80GB", MigPolicy::Dynamic);
    let (state, _) = node.open();
    let c = claim(
        "g1",
        vec![result("mig", "gpu-0-mig-2g20gb-14-2")],
        vec![(
            None,
            mps(
                "MigDeviceConfig",
                json!({"defaultActiveThreadPercentage": 25, "defaultPerDevicePinnedMemoryLimit": {"0": "4Gi"}}),
            ),
        )],
    );
    state.prepare(&claim_ref("g1"), &c).expect("prepare");
    let uuid = uuid_of(&state, "g1", 0);
    assert!(uuid.starts_with("MIG-"), "{uuid}");
    let log = node.control_log("g1");
    assert!(
        log.contains(&format!("CUDA_VISIBLE_DEVICES={uuid} "))
            && log.contains("cmd: set_default_active_thread_percentage 25")
            && log.contains(&format!(
                "cmd: set_default_device_pinned_mem_limit {uuid} 4096M"
            )),
        "{log}"
    );
    // A MIG device has no compute mode of its own to set.
    assert_eq!(
        node.sim.sharing_settings(0).expect("settings").compute_mode,
        ComputeMode::Default
    );
    state.unprepare("g1").expect("unprepare");
    assert!(
        node.sim.state().expect("state").gpus[0]
            .gpu_instances
            .is_empty()
    );
    node.assert_clean();
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn crashes_and_dead_daemons_are_repaired_at_start() {
    let node = Node::new("sim:2xH100-SXM5-80GB", MigPolicy::Static);
    let before = node.sim.sharing_settings(0).expect("settings");
    let (state, _) = node.open();
    for uid in ["done", "crashed"] {
        let device = if uid == "done" { "gpu-0" } else { "gpu-1" };
        let c = claim(
            uid,
            vec![result("gpu", device)],
            vec![(None, mps("GpuConfig", json!({})))],
        );
        state.prepare(&claim_ref(uid), &c).expect("prepare");
    }
    // "crashed" died before completing; "done"'s daemon died with the machine's processes.
    let mut checkpoint = state.checkpoint();
    checkpoint.claims.get_mut("crashed").expect("crashed").state =
        gpu_dra::prepare::checkpoint::ClaimState::PrepareStarted;
    drop(state);
    gpu_dra::prepare::checkpoint::CheckpointStore::new(&node.config.state_dir)
        .save(&checkpoint)
        .expect("save");
    // The daemon is told to quit through its control socket (the fake control binary runs
    // only chrooted into the driver root).
    {
        use std::io::{Read, Write};
        let mut control =
            std::os::unix::net::UnixStream::connect(node.daemon_dir("done").join("pipe/control"))
                .expect("connect to done's daemon");
        control.write_all(b"quit\n").expect("quit");
        control
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        let _ = control.read_to_end(&mut Vec::new());
    }
    // A folder no claim owns (a crash after the daemon started, before the claim was recorded).
    std::fs::create_dir_all(node.daemon_dir("nobody").join("pipe")).expect("stray folder");

    let (state, report) = node.open();
    assert_eq!(report.rolled_back, ["crashed"]);
    assert_eq!(report.mps_restarted, ["done"]);
    assert_eq!(report.mps_stopped, ["nobody"]);
    assert_eq!(node.daemons().len(), 1, "only done's daemon runs");
    assert_eq!(node.sim.sharing_settings(1).expect("settings"), before);
    state.unprepare("done").expect("unprepare");
    assert_eq!(node.sim.sharing_settings(0).expect("settings"), before);
    node.assert_clean();
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn bad_mps_settings_name_the_request_and_field_and_change_nothing() {
    let node = Node::new("sim:2xH100-SXM5-80GB", MigPolicy::Dynamic);
    let (state, _) = node.open();
    let before = node.sim.state().expect("state");
    let cases = [
        (
            claim(
                "b1",
                vec![result("gpu", "gpu-0")],
                vec![(
                    None,
                    mps(
                        "GpuConfig",
                        json!({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}),
                    ),
                )],
            ),
            "request \"gpu\": sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[\"3\"]",
        ),
        (
            claim(
                "b2",
                vec![result("a", "gpu-0"), result("b", "gpu-1")],
                vec![
                    (
                        Some("a"),
                        mps("GpuConfig", json!({"defaultActiveThreadPercentage": 20})),
                    ),
                    (
                        Some("b"),
                        mps("GpuConfig", json!({"defaultActiveThreadPercentage": 80})),
                    ),
                ],
            ),
            "sharing.mpsConfig.defaultActiveThreadPercentage: differs",
        ),
        (
            claim(
                "b3",
                vec![result("mig", "gpu-0-mig-1g10gb-19-0")],
                vec![(
                    None,
                    mps(
                        "MigDeviceConfig",
                        json!({"defaultPerDevicePinnedMemoryLimit": {"MIG-not-this-one": "1Gi"}}),
                    ),
                )],
            ),
            "defaultPerDevicePinnedMemoryLimit[\"MIG-not-this-one\"]",
        ),
    ];
    for (c, wanted) in cases {
        let uid = c.metadata.uid.clone().expect("uid");
        let message = state
            .prepare(&claim_ref(&uid), &c)
            .expect_err("refused")
            .to_string();
        assert!(
            message.contains(&format!("ResourceClaim default/claim-{uid}"))
                && message.contains(wanted),
            "{message}"
        );
        assert!(state.checkpoint().claims.is_empty());
    }
    assert_eq!(
        node.sim.state().expect("state"),
        before,
        "the hardware is untouched"
    );
    node.assert_clean();
}

fn shared(request: &str, device: &str, share: &str, memory: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        share_id: Some(share.into()),
        consumed_capacity: Some(
            [(
                "memory".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(memory.into()),
            )]
            .into(),
        ),
        ..result(request, device)
    }
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn claims_sharing_a_gpu_by_memory_share_one_daemon_each_held_to_what_it_consumed() {
    let node = Node::with_shares(
        "sim:1xH100-SXM5-80GB",
        MigPolicy::Off,
        ConsumableShares::Memory,
    );
    let before = node.sim.sharing_settings(0).expect("settings");
    let (state, _) = node.open();
    let uids = ["s1", "s2", "s3"];
    for (i, uid) in uids.iter().enumerate() {
        let c = claim(
            uid,
            vec![shared("gpu", "gpu-0", &format!("share-{i}"), "20Gi")],
            vec![(None, mps("GpuConfig", json!({})))],
        );
        state.prepare(&claim_ref(uid), &c).expect("prepare");
        let env = node.spec(uid)["containerEdits"]["env"].to_string();
        // 20Gi of the H100's 81559Mi: 25.1% of its threads, rounded up.
        assert!(
            env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M")
                && env.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=26")
                && env.contains("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
            "{uid}: {env}"
        );
    }
    let key = format!("shared-{}", uuid_of(&state, "s1", 0));
    assert!(has_mount(
        &node.spec("s3"),
        &node.daemon_dir(&key).join("pipe"),
        "/tmp/nvidia-mps"
    ));
    assert_eq!(node.daemons().len(), 1, "one daemon for the shared GPU");
    assert_eq!(
        node.control_log(&key)
            .matches("Control daemon started")
            .count(),
        1
    );
    assert_eq!(
        node.sim.sharing_settings(0).expect("settings").compute_mode,
        ComputeMode::ExclusiveProcess
    );
    // A claim on the same GPU without MPS could not use it: refused, nothing changes.
    let plain = claim(
        "plain",
        vec![shared("gpu", "gpu-0", "share-9", "1Gi")],
        vec![],
    );
    let message = state
        .prepare(&claim_ref("plain"), &plain)
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("all claims sharing a GPU must use MPS"),
        "{message}"
    );

    // The daemon and the GPU's mode stay while any sharer is left; the last one restores both.
    state.unprepare("s1").expect("unprepare");
    drop(state);
    let (state, report) = node.open();
    assert!(
        report.mps_restarted.is_empty() && report.mps_stopped.is_empty(),
        "{report:?}"
    );
    state.unprepare("s2").expect("unprepare");
    assert_eq!(node.daemons().len(), 1);
    assert_eq!(
        node.sim.sharing_settings(0).expect("settings").compute_mode,
        ComputeMode::ExclusiveProcess
    );
    state.unprepare("s3").expect("unprepare");
    assert_eq!(node.sim.sharing_settings(0).expect("settings"), before);
    node.assert_clean();
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn a_share_id_is_refused_unless_devices_are_published_for_sharing() {
    let node = Node::new("sim:1xH100-SXM5-80GB", MigPolicy::Off);
    let (state, _) = node.open();
    let c = claim("x", vec![shared("gpu", "gpu-0", "share-0", "1Gi")], vec![]);
    let message = state
        .prepare(&claim_ref("x"), &c)
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("status.allocation.devices.results[0].shareID")
            && message.contains("--consumable-shares is off"),
        "{message}"
    );
    assert!(state.checkpoint().claims.is_empty());
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn a_carved_mig_device_shared_by_memory_lives_until_its_last_claim_leaves() {
    let node = Node::with_shares(
        "sim:1xH100-SXM5-80GB",
        MigPolicy::Dynamic,
        ConsumableShares::Memory,
    );
    let (state, _) = node.open();
    let device = "gpu-0-mig-2g20gb-14-2";
    for (uid, share) in [("first", "share-1"), ("second", "share-2")] {
        let c = claim(
            uid,
            vec![shared("mig", device, share, "8Gi")],
            vec![(None, mps("MigDeviceConfig", json!({})))],
        );
        state.prepare(&claim_ref(uid), &c).expect("prepare");
    }
    let hw = node.sim.state().expect("state");
    assert_eq!(hw.gpus[0].gpu_instances.len(), 1, "carved once: {hw:?}");
    let uuid = uuid_of(&state, "first", 0);
    assert_eq!(
        uuid_of(&state, "second", 0),
        uuid,
        "both claims on the one MIG device"
    );
    assert_eq!(
        node.daemons().len(),
        1,
        "one daemon for the shared MIG device"
    );
    let env = node.spec("second")["containerEdits"]["env"].to_string();
    assert!(
        env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"),
        "{env}"
    );

    // The claim that carved it leaves first: the carve passes to the other claim.
    state.unprepare("first").expect("unprepare");
    assert_eq!(
        node.sim.state().expect("state").gpus[0].gpu_instances.len(),
        1
    );
    assert_eq!(node.daemons().len(), 1);
    let owner = &state.checkpoint().claims["second"].devices[0];
    assert!(owner.mig.as_ref().is_some_and(|m| m.created), "{owner:?}");
    // ...and survives a restart as the owner.
    drop(state);
    let (state, report) = node.open();
    assert!(report.instances_destroyed.is_empty(), "{report:?}");
    state.unprepare("second").expect("unprepare");
    let hw = node.sim.state().expect("state");
    assert!(
        hw.gpus[0].gpu_instances.is_empty() && !hw.gpus[0].mig_current,
        "{hw:?}"
    );
    node.assert_clean();
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn a_daemon_that_stops_while_its_claim_is_prepared_is_started_again() {
    let node = Node::new("sim:1xH100-SXM5-80GB", MigPolicy::Static);
    let (state, _) = node.open();
    let c = claim(
        "r1",
        vec![result("gpu", "gpu-0")],
        vec![(
            None,
            mps("GpuConfig", json!({"defaultActiveThreadPercentage": 40})),
        )],
    );
    state.prepare(&claim_ref("r1"), &c).expect("prepare");
    assert!(state.repair_mps().expect("repair").is_empty(), "it answers");
    // Gone as it would be with the container that started it.
    for pid in node.daemons() {
        let pid = rustix::process::Pid::from_raw(pid as i32).expect("pid");
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !node.daemons().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(state.repair_mps().expect("repair"), ["r1"]);
    assert_eq!(node.daemons().len(), 1);
    let log = node.control_log("r1");
    assert_eq!(log.matches("Control daemon started").count(), 2, "{log}");
    assert_eq!(
        log.matches("cmd: set_default_active_thread_percentage 40")
            .count(),
        2,
        "told its settings again: {log}"
    );
    state.unprepare("r1").expect("unprepare");
    node.assert_clean();
}

/// Claims of different namespaces would share a GPU's one MPS daemon (its pipe, its shm, its
/// control commands: any of them could `quit` it for all): refused by default, naming both
/// claims and namespaces, before anything changes; allowed when the node says so.
#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn claims_of_different_namespaces_share_no_mps_daemon_unless_allowed() {
    let node = Node::with_shares(
        "sim:1xH100-SXM5-80GB",
        MigPolicy::Off,
        ConsumableShares::Memory,
    );
    let in_namespace = |uid: &str, namespace: &str| {
        let mut c = claim(
            uid,
            vec![shared("gpu", "gpu-0", &format!("share-{uid}"), "10Gi")],
            vec![(None, mps("GpuConfig", json!({})))],
        );
        c.metadata.namespace = Some(namespace.into());
        let reference = ClaimRef {
            namespace: namespace.into(),
            ..claim_ref(uid)
        };
        (reference, c)
    };
    let (state, _) = node.open();
    let (first, first_claim) = in_namespace("team-a-1", "team-a");
    state.prepare(&first, &first_claim).expect("first sharer");
    let (same, same_claim) = in_namespace("team-a-2", "team-a");
    state
        .prepare(&same, &same_claim)
        .expect("a claim of the same namespace joins the daemon");
    let before = (state.checkpoint(), node.sim.state().expect("sim"));
    let (other, other_claim) = in_namespace("team-b-1", "team-b");
    let message = state
        .prepare(&other, &other_claim)
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("team-b/claim-team-b-1")
            && message.contains("ResourceClaim team-a/claim-team-a-")
            && message.contains("--mps-share-across-namespaces"),
        "{message}"
    );
    assert_eq!(
        (state.checkpoint(), node.sim.state().expect("sim")),
        before,
        "the refusal changed nothing"
    );
    drop(state);

    let (state, _) = node.open();
    let state = state.with_mps_across_namespaces(true);
    state
        .prepare(&other, &other_claim)
        .expect("allowed by the node");
    assert_eq!(node.daemons().len(), 1, "one daemon for the GPU");
    for uid in ["team-a-1", "team-a-2", "team-b-1"] {
        state.unprepare(uid).expect("unprepare");
    }
    node.assert_clean();
}

/// A kubelet folder longer than microk8s' (`/var/snap/microk8s/common/var/lib/kubelet`): the
/// daemon's pipe folder on the host, named after a 36-character claim UID, is far past a unix
/// socket address, but the daemon, chrooted into the driver root, listens at
/// `/tmp/nvidia-mps/control` there (where containers find it too). It runs, a restart adopts it,
/// unprepare leaves nothing.
#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn mps_runs_under_a_kubelet_folder_longer_than_microk8s() {
    let mut node = Node::new("sim:1xH100-SXM5-80GB", MigPolicy::Off);
    let base = node.dir.path().to_path_buf();
    node.config.state_dir = base.join("k".repeat(120));
    let uid = "0b5c1f3e-2a9d-4c6b-8e7f-1234567890ab";
    let (state, _) = node.open();
    let c = claim(
        uid,
        vec![result("gpu", "gpu-0")],
        vec![(None, mps("GpuConfig", json!({})))],
    );
    state.prepare(&claim_ref(uid), &c).expect("prepare");
    let folder = node.config.state_dir.join("mps").join(uid);
    assert!(
        folder.join("pipe/control").as_os_str().len() > 108,
        "the host path is past a socket address"
    );
    assert!(
        std::fs::symlink_metadata(folder.join("pipe/control"))
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())),
        "the daemon listens in its pipe folder"
    );
    assert!(has_mount(
        &node.spec(uid),
        &folder.join("pipe"),
        "/tmp/nvidia-mps"
    ));
    assert_eq!(node.daemons().len(), 1, "the daemon runs");
    drop(state);

    let (state, report) = node.open();
    assert!(
        report.mps_restarted.is_empty() && report.mps_stopped.is_empty(),
        "the restart adopts the daemon: {report:?}"
    );
    state.unprepare(uid).expect("unprepare");
    node.assert_clean();
}

/// A process's cgroup paths, one per hierarchy (`/proc/PID/cgroup`).
fn cgroups_of(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .expect("cgroup")
        .lines()
        .filter_map(|line| Some(line.splitn(3, ':').nth(2)?.to_string()))
        .collect()
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn the_daemon_and_its_server_run_chrooted_in_a_cgroup_of_their_own() {
    let node = Node::new("sim:2xH100-SXM5-80GB", MigPolicy::Static);
    let (state, _) = node.open();
    let c = claim(
        "c1",
        vec![result("gpu", "gpu-0")],
        vec![(None, mps("GpuConfig", json!({})))],
    );
    state.prepare(&claim_ref("c1"), &c).expect("prepare");
    let processes = node.mps_processes();
    assert_eq!(
        processes.len(),
        2,
        "control daemon and server: {processes:?}"
    );
    let ours = cgroups_of(std::process::id());
    let mut daemon_cgroups = Vec::new();
    for pid in &processes {
        // Not in the driver's cgroup (a container's, in production): in gpu-dra-mps/<name>
        // in every hierarchy, so stopping the driver's container does not stop it.
        let cgroups = cgroups_of(*pid);
        assert!(
            cgroups.iter().all(|path| path.starts_with("/gpu-dra-mps/")),
            "{pid}: {cgroups:?} (the driver's: {ours:?})"
        );
        daemon_cgroups.extend(cgroups);
        // Chrooted into the driver root: it loaded the driver root's own C library.
        let root = std::fs::read_link(format!("/proc/{pid}/root")).expect("root");
        assert_eq!(root, node.dir.path().join("driver-root"), "{pid}");
    }
    state.unprepare("c1").expect("unprepare");
    node.assert_clean();
    for path in daemon_cgroups {
        for hierarchy in ["memory", "pids", "devices", "unified"] {
            let dir = Path::new("/sys/fs/cgroup")
                .join(hierarchy)
                .join(path.trim_start_matches('/'));
            assert!(!dir.exists(), "cgroup {} left", dir.display());
        }
    }
}

#[test]
#[ignore = "needs root: the MPS daemons' shm is a tmpfs mount (e2e/run-tests runs ignored tests)"]
fn a_control_binary_the_driver_root_cannot_load_refuses_only_mps_claims() {
    let node = Node::new("sim:2xH100-SXM5-80GB", MigPolicy::Static);
    let control = node
        .dir
        .path()
        .join("driver-root/usr/bin/nvidia-cuda-mps-control");
    // The fake tools load only with the fake driver root's loader: with this machine's (the
    // image's, in production) they do not run at all.
    // A file just written may be held open for writing by a child another test thread forked
    // before exec (ETXTBSY): try again, as such a race resolves at that child's exec.
    let mut outside = std::process::Command::new(&control).output();
    for _ in 0..50 {
        if !outside
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ExecutableFileBusy)
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        outside = std::process::Command::new(&control).output();
    }
    assert!(
        outside
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound),
        "{outside:?}"
    );
    // Without its C library the driver root's control binary cannot load: the driver starts
    // and serves everything else; MPS claims are refused before anything changes, naming the
    // binary and the loader's error.
    std::fs::remove_file(
        node.dir
            .path()
            .join("driver-root")
            .join(gpu_dra::prepare::driver_files::FAKE_LIBC_DIR)
            .join("libgcc_s.so.1"),
    )
    .expect("remove a library");
    let (state, _) = DeviceState::open(node.config.clone(), node.sim.clone())
        .expect("the driver starts without a usable MPS control daemon");
    let reason = state
        .mps_unusable()
        .expect("the reason is kept")
        .to_string();
    assert!(
        reason.contains("usr/bin/nvidia-cuda-mps-control") && reason.contains("libgcc_s.so.1"),
        "{reason}"
    );
    let before = node.sim.sharing_settings(1).expect("settings");
    let c = claim(
        "m1",
        vec![result("gpu", "gpu-1")],
        vec![(None, mps("GpuConfig", json!({})))],
    );
    let error = state
        .prepare(&claim_ref("m1"), &c)
        .expect_err("an MPS claim is refused")
        .to_string();
    assert!(
        error.contains("sharing.strategy") && error.contains("libgcc_s.so.1"),
        "{error}"
    );
    assert!(state.checkpoint().claims.is_empty(), "nothing recorded");
    assert_eq!(node.sim.sharing_settings(1).expect("settings"), before);
    let whole = claim("w1", vec![result("gpu", "gpu-0")], vec![]);
    state
        .prepare(&claim_ref("w1"), &whole)
        .expect("a whole GPU is still served");
    state.unprepare("w1").expect("unprepare");
    node.assert_clean();
}

/// The cgroup v2 hierarchy of this machine (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid one).
fn cgroup2_root() -> PathBuf {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .find_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let point = mount.split(' ').nth(4)?;
            fs.starts_with("cgroup2 ").then(|| PathBuf::from(point))
        })
        .expect("this machine mounts no cgroup v2 hierarchy: the memory limit tests need one")
}

/// A cgroup of the test's own, with one process in it per container; removed at drop.
struct TestCgroups {
    dir: PathBuf,
    children: Vec<std::process::Child>,
}

impl TestCgroups {
    fn new(root: &Path) -> Self {
        let dir = root.join(format!("gpu-dra-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test cgroup");
        Self {
            dir,
            children: vec![],
        }
    }

    /// A container: a cgroup below the test's with a process in it; its cgroup and PID.
    fn container(&mut self, name: &str) -> (PathBuf, u32) {
        let cgroup = self.dir.join(name);
        std::fs::create_dir_all(&cgroup).expect("container cgroup");
        let child = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        std::fs::write(cgroup.join("cgroup.procs"), pid.to_string()).expect("join the cgroup");
        self.children.push(child);
        (cgroup, pid)
    }

    /// The containers exit; their cgroups stay, empty (a runtime may keep them a while).
    fn stop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        self.stop();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten().filter(|e| e.path().is_dir()) {
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// What the runtimes' CDI library gives a container of claim `uid`: its environment and hooks.
fn injected(node: &Node, uid: &str) -> serde_json::Value {
    let tool = std::env::var_os("CDI_INJECT").expect(
        "CDI_INJECT is not set (e2e/build-k8s.sh builds cdi-inject; e2e/run-tests sets it)",
    );
    let spec = node.spec(uid);
    // The runtimes' library stats every device node's host path: make them, under the dev root.
    let dev_root = node.config.dev_root.as_deref().expect("a dev root");
    let nodes = spec["containerEdits"]["deviceNodes"]
        .as_array()
        .into_iter()
        .chain(spec["devices"].as_array().into_iter().flat_map(|d| {
            d.iter()
                .filter_map(|d| d["containerEdits"]["deviceNodes"].as_array())
        }))
        .flatten();
    for (minor, dev) in nodes.enumerate() {
        let host = PathBuf::from(dev["hostPath"].as_str().expect("hostPath"));
        assert!(host.starts_with(dev_root), "{host:?} outside the dev root");
        if !host.exists() {
            std::fs::create_dir_all(host.parent().expect("parent")).expect("dev dir");
            let made = std::process::Command::new("mknod")
                .arg(&host)
                .args(["c", "195", &minor.to_string()])
                .status()
                .expect("mknod");
            assert!(made.success(), "mknod {host:?}");
        }
    }
    let devices: Vec<String> = spec["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| {
            format!(
                "k8s.gpu.nvidia.com/claim={}",
                d["name"].as_str().expect("name")
            )
        })
        .collect();
    let out = std::process::Command::new(tool)
        .arg("--spec-dir")
        .arg(&node.config.cdi_root)
        .arg("--device")
        .arg(devices.join(","))
        .output()
        .expect("cdi-inject");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("cdi-inject json")
}

/// Runs a container's `createRuntime` hooks as runc does (the container's state on stdin, its
/// bundle's config.json holding its environment) for the container process `pid`. Outside runc:
/// this machine's runtime runs on cgroup v1, and the hook wants the node's `/sys/fs/cgroup` to
/// be cgroup v2, so it runs in a mount namespace of its own where it is. The fake NVML's
/// configuration is added to each hook's environment.
fn run_create_runtime_hooks(node: &Node, container: &serde_json::Value, pid: u32, spec: &str) {
    let bundle = tempfile::tempdir().expect("bundle");
    let config = json!({"ociVersion": "1.2.1", "process": {"env": container["env"]}});
    std::fs::write(bundle.path().join("config.json"), config.to_string()).expect("config.json");
    let state = json!({"ociVersion": "1.2.1", "id": format!("c{pid}"), "status": "creating",
                       "pid": pid, "bundle": bundle.path()});
    let hooks = container["hooks"]["createRuntime"]
        .as_array()
        .expect("createRuntime hooks");
    assert!(!hooks.is_empty(), "no createRuntime hook: {container}");
    for hook in hooks {
        let args: Vec<&str> = hook["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let mut command = std::process::Command::new("unshare");
        command
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$0" /sys/fs/cgroup && exec "$@""#)
            .arg(cgroup2_root())
            .arg(hook["path"].as_str().expect("path"))
            .args(&args[1..])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("FAKE_NVML_GPUS", spec)
            .env("FAKE_NVML_NODE", "n1")
            .env("FAKE_NVML_STATE", node.dir.path().join("hw.json"))
            .stdin(std::process::Stdio::piped());
        let mut child = command.spawn().expect("run the hook");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(state.to_string().as_bytes())
            .expect("state on stdin");
        let out = child.wait_with_output().expect("hook");
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
#[ignore = "needs root (cgroups, the MPS shm), NVIDIA's nvidia-cdi-hook (NVIDIA_CDI_HOOK) and cdi-inject (CDI_INJECT): e2e/run-tests builds both"]
fn consumed_memory_is_each_containers_hard_limit_on_the_gpu_set_by_nvidias_hook() {
    use gpu_dra::gpu::memory_limit::MemoryLimit;
    use gpu_dra::prepare::memory_limits::{LimitHook, MemoryLimits};
    let spec = "sim:2xH100-SXM5-80GB";
    let mut node = Node::with_shares(spec, MigPolicy::Off, ConsumableShares::Memory);
    node.config.dev_root = Some(node.dir.path().join("dev-root"));
    let hook =
        PathBuf::from(std::env::var_os("NVIDIA_CDI_HOOK").expect(
            "NVIDIA_CDI_HOOK is not set (e2e/build-k8s.sh builds it; e2e/run-tests sets it)",
        ));
    // The hook loads the driver root's libnvidia-ml.so.1: the fake one, on the same simulated
    // GPUs as the driver.
    let root = node.dir.path().join("driver-root");
    let version = node.sim.inventory().expect("inventory").driver_version;
    std::fs::copy(
        common::fake_library(),
        root.join(format!(
            "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"
        )),
    )
    .expect("install the fake NVML");
    let cgroups_root = cgroup2_root();

    // What the driver finds on its own: the hook and NVML can, the cgroup hierarchy decides.
    let tmpfs = node.dir.path();
    let detected = |cgroup_root: &Path, hook_file: &Path| {
        let commands = gpu_dra::prepare::driver_files::hook_commands(
            &std::fs::read(hook_file).expect("hook binary"),
        );
        MemoryLimits::detect(&*node.sim, Some((&hook, &commands)), &root, cgroup_root)
    };
    assert!(matches!(
        detected(&cgroups_root, &hook),
        MemoryLimits::Enforced(_)
    ));
    let not_v2 = detected(tmpfs, &hook);
    assert!(
        matches!(&not_v2, MemoryLimits::Unavailable(r) if r.contains("not cgroup v2")),
        "{not_v2:?}"
    );
    let old_hook = node.dir.path().join("old-hook");
    std::fs::write(
        &old_hook,
        b"nvidia-cdi-hook 1.17: update-ldcache create-symlinks",
    )
    .expect("old hook");
    let old = detected(&cgroups_root, &old_hook);
    assert!(
        matches!(&old, MemoryLimits::Unavailable(r) if r.contains("has no apply-cuda-memory-limits command")),
        "{old:?}"
    );

    // Without limits, the claim's owner is told what holds it instead.
    let (state, _) = node.open();
    let state = state.with_memory_limits(not_v2);
    let m = claim(
        "m1",
        vec![shared("gpu", "gpu-0", "share-0", "20Gi")],
        vec![(None, mps("GpuConfig", json!({})))],
    );
    state.prepare(&claim_ref("m1"), &m).expect("prepare");
    let warnings = format!("{:?}", state.warnings("m1"));
    assert!(
        warnings.contains("GpuMemoryNotEnforced")
            && warnings.contains("20480 MiB")
            && warnings.contains("not cgroup v2")
            && warnings.contains("MPS client's pinned-memory limit holds it"),
        "{warnings}"
    );
    assert!(
        !injected(&node, "m1")["env"]
            .to_string()
            .contains("NVIDIA_GPU_MEMORY_LIMIT")
    );
    state.unprepare("m1").expect("unprepare");
    drop(state);

    // With them: an MPS claim on gpu-0 and a plain one on gpu-1, each container held to what its
    // claim consumed, request (soft) and limit (hard) alike.
    let (state, _) = node.open();
    let state = state.with_memory_limits(MemoryLimits::Enforced(LimitHook {
        hook: hook.clone(),
        driver_root: root.clone(),
        cgroup_root: cgroups_root.clone(),
    }));
    let p = claim(
        "p1",
        vec![shared("gpu", "gpu-1", "share-1", "10Gi")],
        vec![],
    );
    state.prepare(&claim_ref("m1"), &m).expect("prepare");
    state.prepare(&claim_ref("p1"), &p).expect("prepare");
    assert!(state.warnings("m1").is_empty() && state.warnings("p1").is_empty());
    let mut cgroups = TestCgroups::new(&cgroups_root);
    let mut containers = vec![];
    for (uid, mib, minor) in [("m1", 20480u64, 0u32), ("p1", 10240, 1)] {
        let container = injected(&node, uid);
        let env = container["env"].to_string();
        assert!(
            env.contains(&format!("NVIDIA_GPU_MEMORY_REQUEST={mib}"))
                && env.contains(&format!("NVIDIA_GPU_MEMORY_LIMIT={mib}")),
            "{uid}: {env}"
        );
        let (cgroup, pid) = cgroups.container(uid);
        assert_eq!(node.sim.memory_limit(minor, &cgroup).expect("read"), None);
        run_create_runtime_hooks(&node, &container, pid, spec);
        let bytes = mib << 20;
        assert_eq!(
            node.sim.memory_limit(minor, &cgroup).expect("read"),
            Some(MemoryLimit {
                soft: bytes,
                hard: bytes
            }),
            "{uid}: the container's cgroup on GPU {minor}"
        );
        // The other GPU holds this container to nothing.
        assert_eq!(
            node.sim.memory_limit(1 - minor, &cgroup).expect("read"),
            None
        );
        containers.push((uid, cgroup, minor));
    }

    // The containers exit, their cgroups stay: unprepare clears what they held.
    cgroups.stop();
    for (uid, cgroup, minor) in containers {
        state.unprepare(uid).expect("unprepare");
        assert_eq!(
            node.sim.memory_limit(minor, &cgroup).expect("read"),
            None,
            "{uid}"
        );
    }
    node.assert_clean();
}
