//! What a container gets from a prepared claim, as the container runtimes' own CDI library
//! (`tags.cncf.io/container-device-interface`, through `e2e/cdi-inject`) reads our specs: the
//! claim's device nodes and the driver's libraries, links, binaries, firmware and sockets from
//! a driver root, for a whole GPU, a MIG device and a claim with two devices; and for a GPU
//! handed to a virtual machine, its VFIO nodes and device metadata only.
//!
//! Needs `CDI_INJECT` (the tool) and permission to make device nodes (root): plain `cargo test`
//! lists the test as ignored; `cargo test -- --include-ignored` (e2e/run-tests) runs it, and
//! without the tool it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use gpu_dra::gpu::sim::SimNode;
use gpu_dra::prepare::ClaimRef;
use gpu_dra::prepare::driver_files::{DriverRoot, write_fake_driver_root};
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::Value;

const VERSION: &str = "580.95.05";
const LIBS: &str = "/usr/lib/x86_64-linux-gnu";

/// The runtimes' CDI library as a tool; a test that needs it is ignored by plain `cargo test`
/// (e2e/run-tests builds it and runs the ignored tests), and fails when run without it.
fn cdi_inject() -> PathBuf {
    match std::env::var_os("CDI_INJECT") {
        Some(path) => PathBuf::from(path),
        None => panic!(
            "CDI_INJECT is not set: build it with \
             `cd e2e/cdi-inject && go build -o /tmp/cdi-inject .` and set CDI_INJECT=/tmp/cdi-inject"
        ),
    }
}

/// Device nodes as the NVIDIA driver makes them, under a dev root: the CDI library reads their
/// type and numbers from the host files.
fn make_device_nodes(dev_root: &Path, gpus: u32) {
    let dev = dev_root.join("dev");
    std::fs::create_dir_all(dev.join("nvidia-caps")).expect("dev dirs");
    let mut nodes = vec![
        ("nvidiactl".to_string(), 195, 255),
        ("nvidia-uvm".to_string(), 509, 0),
        ("nvidia-uvm-tools".to_string(), 509, 1),
    ];
    nodes.extend((0..gpus).map(|m| (format!("nvidia{m}"), 195, m)));
    for (name, major, minor) in nodes {
        mknod(&dev.join(&name), major, minor);
    }
}

/// A character device node (this test must run as root).
fn mknod(path: &Path, major: u32, minor: u32) {
    let status = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .expect("run mknod");
    assert!(
        status.success(),
        "mknod {} failed: this test makes device nodes and must run as root",
        path.display()
    );
}

/// The driver on simulated GPUs under `dir`, with the dev and driver roots given.
fn driver_config(
    dir: &Path,
    dev_root: &Path,
    driver_root: &Path,
    passthrough: bool,
) -> DriverConfig {
    DriverConfig {
        driver_name: "gpu.nvidia.com".into(),
        mig_policy: gpu_dra::gpu::mig::MigPolicy::Auto,
        node_name: "n1".into(),
        cdi_root: dir.join("cdi"),
        state_dir: dir.join("state"),
        dev_root: Some(dev_root.to_path_buf()),
        consumable: Default::default(),
        passthrough,
        driver_root: Some(DriverRoot {
            here: driver_root.to_path_buf(),
            // As on a GPU-operator node, the host may see the root elsewhere than this process.
            host: driver_root.to_path_buf(),
            hook: None,
            firmware: Default::default(),
        }),
    }
}

fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: uid.into(),
        uid: uid.into(),
    }
}

fn claim(uid: &str, devices: &[&str]) -> ResourceClaim {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| serde_json::json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": d}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .expect("claim")
}

/// The MIG capability nodes a spec gives its `device`-th device.
fn cap_paths(spec: &Path, device: usize) -> Vec<String> {
    let spec: Value =
        serde_json::from_slice(&std::fs::read(spec).expect("spec")).expect("spec JSON");
    spec["devices"][device]["containerEdits"]["deviceNodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["path"].as_str())
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .map(String::from)
        .collect()
}

/// Capability nodes exist only once an instance is carved: make them as the driver would.
fn make_cap_nodes(dev_root: &Path, caps: &[String]) {
    for cap in caps {
        let number = cap
            .trim_start_matches("/dev/nvidia-caps/nvidia-cap")
            .parse()
            .expect("capability number");
        mknod(&dev_root.join(cap.trim_start_matches('/')), 508, number);
    }
}

/// Runs the tool over the spec folder for `ids`; fails on any spec the library rejects.
fn inject(tool: &Path, cdi_root: &Path, ids: &[String]) -> Value {
    let mut command = Command::new(tool);
    command.arg("--spec-dir").arg(cdi_root);
    for id in ids {
        command.arg("--device").arg(id);
    }
    let output = command.output().expect("run cdi-inject");
    assert!(
        output.status.success(),
        "the CDI library refused our specs or devices: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).expect("cdi-inject JSON")
}

fn strings(value: &Value, key: &str, field: &str) -> Vec<String> {
    value[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} in {value}"))
        .iter()
        .map(|v| {
            if field.is_empty() {
                v.as_str().unwrap_or_default().to_string()
            } else {
                v[field].as_str().unwrap_or_default().to_string()
            }
        })
        .collect()
}

#[test]
#[ignore = "needs CDI_INJECT, the container runtimes' CDI library (e2e/run-tests builds it and runs ignored tests)"]
fn containers_get_device_nodes_and_the_drivers_files() {
    let tool = cdi_inject();
    let dir = tempfile::tempdir().expect("tempdir");
    let driver_root = dir.path().join("driver-root");
    write_fake_driver_root(&driver_root, VERSION).expect("fake driver root");
    let dev_root = dir.path().join("devroot");
    make_device_nodes(&dev_root, 3);
    let sim = Arc::new(SimNode::new(
        "sim:3xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.path().join("hw.json")),
    ));
    let config = driver_config(dir.path(), &dev_root, &driver_root, false);
    let (state, _) = DeviceState::open(config.clone(), sim.clone()).expect("open");
    let whole = state
        .prepare(&claim_ref("whole"), &claim("whole", &["gpu-0"]))
        .expect("prepare a whole GPU");
    let mig = state
        .prepare(&claim_ref("mig"), &claim("mig", &["gpu-1-mig-1g10gb-19-0"]))
        .expect("prepare a MIG device");

    // The MIG device's capability nodes exist only once carved: make them as the driver would.
    let caps = cap_paths(&state.cdi().spec_path("mig"), 0);
    assert_eq!(caps.len(), 2, "GI and CI access nodes");
    make_cap_nodes(&dev_root, &caps);

    let got = inject(&tool, &config.cdi_root, &whole[0].cdi_device_ids);
    let errors = &got["specErrors"];
    assert!(errors.as_object().is_none_or(|e| e.is_empty()), "{errors}");
    let nodes = strings(&got, "linuxDevices", "path");
    for want in [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ] {
        assert!(nodes.contains(&want.to_string()), "{want} in {nodes:?}");
    }
    assert!(!nodes.contains(&"/dev/nvidia1".to_string()), "{nodes:?}");
    let mounts = got["mounts"].as_array().expect("mounts");
    let mount_of = |container: &str| {
        mounts
            .iter()
            .find(|m| m["destination"] == container)
            .unwrap_or_else(|| panic!("no mount at {container}: {mounts:?}"))
    };
    let libcuda = mount_of(&format!("{LIBS}/libcuda.so.{VERSION}"));
    assert_eq!(
        libcuda["source"],
        driver_root
            .join(format!("usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"))
            .to_string_lossy()
            .as_ref()
    );
    let options = strings(libcuda, "options", "");
    assert!(
        ["ro", "nosuid", "nodev", "rbind", "rprivate"]
            .iter()
            .all(|o| options.contains(&o.to_string())),
        "{options:?}"
    );
    // No toolkit hook on this node: the links a CUDA program opens are bound as files too.
    for link in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-nvvm.so.4",
    ] {
        mount_of(&format!("{LIBS}/{link}"));
    }
    // An executable of the driver root (its nvidia-smi here is a placeholder, not executable).
    mount_of("/usr/bin/nvidia-debugdump");
    mount_of(&format!("/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"));
    mount_of("/run/nvidia-persistenced/socket");
    let env = strings(&got, "env", "");
    assert!(
        env.iter()
            .any(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES=GPU-")),
        "{env:?}"
    );

    // One claim with two devices (a whole GPU and a MIG device of another GPU): every device's
    // nodes, and both UUIDs in NVIDIA_VISIBLE_DEVICES.
    let pair = state
        .prepare(
            &claim_ref("pair"),
            &claim("pair", &["gpu-2", "gpu-1-mig-1g10gb-19-1"]),
        )
        .expect("prepare a claim with two devices");
    let pair_caps = cap_paths(&state.cdi().spec_path("pair"), 1);
    make_cap_nodes(&dev_root, &pair_caps);
    let ids: Vec<String> = pair.iter().flat_map(|d| d.cdi_device_ids.clone()).collect();
    assert_eq!(ids.len(), 2);
    let got = inject(&tool, &config.cdi_root, &ids);
    let nodes = strings(&got, "linuxDevices", "path");
    for want in ["/dev/nvidia2", "/dev/nvidia1"]
        .iter()
        .map(|s| s.to_string())
        .chain(pair_caps)
    {
        assert!(nodes.contains(&want), "{want} in {nodes:?}");
    }
    let visible: Vec<String> = strings(&got, "env", "")
        .into_iter()
        .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    assert!(
        visible.len() == 1 && visible[0].contains("GPU-") && visible[0].contains(",MIG-"),
        "one variable naming both devices: {visible:?}"
    );

    // Both claims at once (a container with two claims): each device once, the common edits
    // merged by the library without conflict.
    let mut both = whole[0].cdi_device_ids.clone();
    both.extend(mig[0].cdi_device_ids.clone());
    let got = inject(&tool, &config.cdi_root, &both);
    let nodes = strings(&got, "linuxDevices", "path");
    for want in ["/dev/nvidia0", "/dev/nvidia1"]
        .iter()
        .map(|s| s.to_string())
        .chain(caps)
    {
        assert!(nodes.contains(&want), "{want} in {nodes:?}");
    }
    assert_eq!(
        got["hooks"]["createContainer"]
            .as_array()
            .map(Vec::len)
            .unwrap_or_default(),
        0
    );

    // With the toolkit's hook the links and the ld cache are the hook's job.
    drop(state);
    std::fs::write(driver_root.join("usr/bin/nvidia-cdi-hook"), b"").expect("hook");
    let (state, _) = DeviceState::open(config.clone(), sim).expect("reopen");
    state.unprepare("whole").expect("unprepare");
    let whole = state
        .prepare(&claim_ref("whole"), &claim("whole", &["gpu-0"]))
        .expect("prepare again");
    let got = inject(&tool, &config.cdi_root, &whole[0].cdi_device_ids);
    let hooks = got["hooks"]["createContainer"].as_array().expect("hooks");
    let args: Vec<String> = hooks
        .iter()
        .map(|h| {
            h["args"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default()
        })
        .collect();
    assert!(
        args.iter()
            .any(|a| a.starts_with("nvidia-cdi-hook create-symlinks")
                && a.contains(&format!(
                    "--link {LIBS}/libcuda.so.{VERSION}::{LIBS}/libcuda.so.1"
                ))),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("nvidia-cdi-hook update-ldcache --folder {LIBS}")),
        "{args:?}"
    );
    assert!(
        !got["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["destination"] == format!("{LIBS}/libcuda.so.1")),
        "links are the hook's job"
    );
}

/// A GPU for a virtual machine, as the runtimes' CDI library hands it to the container (what
/// KubeVirt's virt-launcher gets): the VFIO group node and the IOMMU API device, the metadata
/// file with the PCI address, `NVIDIA_VISIBLE_DEVICES=void`, and nothing of the NVIDIA driver.
#[test]
#[ignore = "needs CDI_INJECT, the container runtimes' CDI library (e2e/run-tests builds it and runs ignored tests)"]
fn a_vm_gets_the_vfio_nodes_and_the_device_metadata_only() {
    let tool = cdi_inject();
    let dir = tempfile::tempdir().expect("tempdir");
    let driver_root = dir.path().join("driver-root");
    write_fake_driver_root(&driver_root, VERSION).expect("fake driver root");
    let dev_root = dir.path().join("devroot");
    make_device_nodes(&dev_root, 2);
    let group = gpu_dra::gpu::sim::sim_iommu_group(1);
    // What the kernel makes: the VFIO container node and, once bound, the group's node.
    std::fs::create_dir_all(dev_root.join("dev/vfio")).expect("vfio dir");
    mknod(&dev_root.join("dev/vfio/vfio"), 10, 196);
    mknod(&dev_root.join(format!("dev/vfio/{group}")), 243, 0);
    let sim = Arc::new(SimNode::new(
        "sim:2xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.path().join("hw.json")),
    ));
    let config = driver_config(dir.path(), &dev_root, &driver_root, true);
    let (state, _) = DeviceState::open(config.clone(), sim).expect("open");
    let mut vm = claim("vm", &["gpu-vfio-1"]);
    let parameters = serde_json::json!({
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
        "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}
    });
    vm.status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .expect("allocation")
        .config = Some(vec![
        serde_json::from_value(serde_json::json!({
            "source": "FromClaim",
            "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}
        }))
        .expect("config"),
    ]);
    let prepared = state.prepare(&claim_ref("vm"), &vm).expect("prepare");
    let got = inject(&tool, &config.cdi_root, &prepared[0].cdi_device_ids);
    let errors = &got["specErrors"];
    assert!(errors.as_object().is_none_or(|e| e.is_empty()), "{errors}");
    let mut nodes = strings(&got, "linuxDevices", "path");
    nodes.sort();
    assert_eq!(
        nodes,
        [format!("/dev/vfio/{group}"), "/dev/vfio/vfio".to_string()]
    );
    let env = strings(&got, "env", "");
    assert!(
        env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()),
        "{env:?}"
    );
    let mounts = got["mounts"].as_array().expect("mounts");
    assert_eq!(mounts.len(), 1, "only the metadata file: {mounts:?}");
    assert_eq!(
        mounts[0]["destination"],
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm/gpu/gpu.nvidia.com-metadata.json"
    );
    let source = mounts[0]["source"].as_str().expect("source");
    // One object per API version (v1beta1, v1alpha1), each naming the same device.
    let text = std::fs::read(source).expect("metadata");
    let stream: Vec<Value> = serde_json::Deserializer::from_slice(&text)
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("json stream");
    assert_eq!(stream.len(), 2, "{stream:?}");
    for metadata in &stream {
        assert_eq!(
            metadata["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]
                ["string"],
            gpu_dra::gpu::sim::sim_pci_location(1).0
        );
    }
}
