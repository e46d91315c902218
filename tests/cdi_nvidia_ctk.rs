//! Our CDI specs against NVIDIA's own generator: `nvidia-ctk cdi generate --mode nvml` (container
//! toolkit v1.20.2, `pkg/nvcdi`, what NVIDIA's DRA driver and GPU Operator write specs with) and
//! `gpu-dra cdi`, on the same fake driver root (an R580 file set with real ELF SONAMEs), the same
//! fake `libnvidia-ml` and the same dev root. For every device, what a container holding it gets
//! from each spec (common edits plus the device's) is compared entry by entry: device nodes,
//! mounts (host path and options), the library links the hook makes (followed to the library
//! they end at), the ld cache folders, every other hook command and the environment. Each entry
//! only one side has is listed in `EXPLAINED` with the reason; an explanation that matches
//! nothing fails the test, so the table stays true. Hook `env` (`NVIDIA_CTK_DEBUG=false`) is not
//! compared: it is the hook's own debug switch, off either way.
//!
//! Needs root (device nodes, and `/proc/driver` replaced in a mount namespace of nvidia-ctk's
//! own, where it reads MIG capability minors), `NVIDIA_CTK` and `NVIDIA_CDI_HOOK` (e2e/build-k8s.sh
//! builds both from the toolkit's module; e2e/run-tests sets them).
mod differential;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_dra::gpu::Placement;
use gpu_dra::gpu::mig::{ci_access_cap_minor, gi_access_cap_minor, mig_device_name};
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::prepare::driver_files::write_fake_driver_root;
use serde_json::Value;

const GPU_DRA: &str = env!("CARGO_BIN_EXE_gpu-dra");

/// The deliberate differences, `(side, entry, why)`: `side` is `nvidia` (only NVIDIA's spec has
/// it) or `ours`; `entry` a glob (`*`: any text) over the entries as `compare` names them. One
/// table for this test and the real-GPU kit's comparison (`gpu-check-compare`).
const EXPLAINED_TSV: &str =
    include_str!("../e2e/harness/cmd/gpu-check-compare/cdi-differences.tsv");

fn explained() -> Vec<(&'static str, &'static str, &'static str)> {
    EXPLAINED_TSV
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            match cols[..] {
                [side @ ("nvidia" | "ours"), entry, why] => (side, entry, why),
                _ => panic!("cdi-differences.tsv: bad row {line:?}"),
            }
        })
        .collect()
}

fn tool(var: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: e2e/build-k8s.sh builds it (e2e/run-tests sets it)")
    }))
}

/// The fake libnvidia-ml this workspace builds (e2e/fakenvml).
fn fake_nvml() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps");
    [
        deps.join("libnvidia_ml.so"),
        deps.join("../libnvidia_ml.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("the fake libnvidia-ml is not built: cargo build --workspace (e2e/fakenvml)")
}

/// A MIG device to make: `(gpu, profile id, start)`.
type Carve = (u32, u32, u32);

/// A simulated node with a fake driver root, dev root and `/proc/driver`.
struct Node {
    _dir: tempfile::TempDir,
    spec: String,
    state: PathBuf,
    root: PathBuf,
    dev: PathBuf,
    proc_driver: PathBuf,
    sim: SimNode,
}

fn mknod(path: &Path, major: u32, minor: u32) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dev dir");
    let status = Command::new("mknod")
        .arg(path)
        .args(["c", &major.to_string(), &minor.to_string()])
        .status()
        .expect("mknod");
    assert!(status.success(), "mknod {path:?}: this test runs as root");
}

impl Node {
    /// `carves`: MIG devices to make before either side looks, `(gpu, profile id, start)`.
    fn new(spec: &str, carves: &[Carve]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("hw.json");
        let sim = SimNode::new(spec.parse().expect("spec"), "n1", Some(state.clone()));
        let inventory = sim.inventory().expect("inventory");
        let gpus: BTreeSet<u32> = carves.iter().map(|c| c.0).collect();
        for &gpu in &gpus {
            sim.set_mig_mode(gpu, true).expect("MIG on");
            sim.reset_gpu(gpu).expect("reset");
        }
        for &(gpu, profile_id, start) in carves {
            let size = sim.inventory().expect("inventory").gpus[gpu as usize]
                .mig
                .as_ref()
                .and_then(|m| m.profile_by_id(profile_id))
                .and_then(|p| {
                    p.placements
                        .iter()
                        .find(|pl| pl.start == start)
                        .map(|pl| pl.size)
                })
                .expect("placement");
            let gi = sim
                .create_gpu_instance(gpu, profile_id, Placement { start, size })
                .expect("GPU instance");
            sim.create_compute_instance(gpu, gi)
                .expect("compute instance");
        }
        let root = dir.path().join("root");
        write_fake_driver_root(&root, &inventory.driver_version).expect("driver root");
        std::fs::copy(
            fake_nvml(),
            root.join(format!(
                "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{}",
                inventory.driver_version
            )),
        )
        .expect("fake NVML in the driver root");
        // Real driver binaries are executable; the toolkit mounts only executables.
        for entry in std::fs::read_dir(root.join("usr/bin"))
            .expect("bin")
            .flatten()
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
        let dev = dir.path().join("devroot");
        for (name, major, minor) in [
            ("nvidiactl", 195, 255),
            ("nvidia-modeset", 195, 254),
            ("nvidia-uvm", 509, 0),
            ("nvidia-uvm-tools", 509, 1),
        ] {
            mknod(&dev.join("dev").join(name), major, minor);
        }
        let mut minors = String::from("config 1\nmonitor 2\n");
        for gpu in &inventory.gpus {
            mknod(
                &dev.join(format!("dev/nvidia{}", gpu.minor)),
                195,
                gpu.minor,
            );
            for gi in 0..15 {
                let cap = gi_access_cap_minor(gpu.minor, gi);
                minors.push_str(&format!("gpu{}/gi{gi}/access {cap}\n", gpu.minor));
                for ci in 0..8 {
                    let cap = ci_access_cap_minor(gpu.minor, gi, ci);
                    minors.push_str(&format!("gpu{}/gi{gi}/ci{ci}/access {cap}\n", gpu.minor));
                }
            }
        }
        // The capability nodes of the MIG devices that exist, as the driver makes them.
        let carved = sim.inventory().expect("inventory");
        for gpu in &carved.gpus {
            for i in gpu.mig.iter().flat_map(|m| &m.instances) {
                for cap in [
                    gi_access_cap_minor(gpu.minor, i.gpu_instance_id),
                    ci_access_cap_minor(gpu.minor, i.gpu_instance_id, i.compute_instance_id),
                ] {
                    mknod(
                        &dev.join(format!("dev/nvidia-caps/nvidia-cap{cap}")),
                        237,
                        cap,
                    );
                }
            }
        }
        let proc_driver = dir.path().join("proc-driver");
        std::fs::create_dir_all(proc_driver.join("nvidia-caps")).expect("proc dir");
        std::fs::write(proc_driver.join("nvidia-caps/mig-minors"), minors).expect("mig-minors");
        Node {
            _dir: dir,
            spec: spec.into(),
            state,
            root,
            dev,
            proc_driver,
            sim,
        }
    }

    fn with_fake_nvml(&self, command: &mut Command) {
        command
            .env("FAKE_NVML_GPUS", &self.spec)
            .env("FAKE_NVML_NODE", "n1")
            .env("FAKE_NVML_STATE", &self.state);
    }

    /// NVIDIA's spec, one device per UUID.
    fn nvidia(&self) -> Value {
        let out = self.root.parent().expect("dir").join("nvidia.json");
        let mut command = Command::new("unshare");
        command
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$0" /proc/driver && exec "$@""#)
            .arg(&self.proc_driver)
            .arg(tool("NVIDIA_CTK"))
            .args(["cdi", "generate", "--mode", "nvml", "--format", "json"])
            .args(["--device-name-strategy", "uuid", "--driver-root"])
            .arg(&self.root)
            .arg("--dev-root")
            .arg(&self.dev)
            .arg("--nvidia-cdi-hook-path")
            .arg(tool("NVIDIA_CDI_HOOK"))
            .arg("--output")
            .arg(&out);
        self.with_fake_nvml(&mut command);
        let result = command.output().expect("nvidia-ctk");
        assert!(
            result.status.success(),
            "nvidia-ctk cdi generate: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        serde_json::from_slice(&std::fs::read(out).expect("spec")).expect("spec json")
    }

    /// Ours, for a claim holding `device` alone.
    fn ours(&self, device: &str) -> Value {
        let mut command = Command::new(GPU_DRA);
        command
            .args([
                "cdi",
                "--gpus",
                "nvml",
                "--node-name",
                "n1",
                "--mig",
                "static",
            ])
            .arg("--nvml-lib")
            .arg(self.root.join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
            .arg("--nvidia-driver-root")
            .arg(&self.root)
            .arg("--dev-root")
            .arg(&self.dev)
            .arg("--nvidia-cdi-hook-path")
            .arg(tool("NVIDIA_CDI_HOOK"))
            .args(["--device", device]);
        self.with_fake_nvml(&mut command);
        let result = command.output().expect("gpu-dra cdi");
        assert!(
            result.status.success(),
            "gpu-dra cdi --device {device}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        serde_json::from_slice(&result.stdout).expect("spec json")
    }

    /// Our device names with their UUIDs: whole GPUs not in MIG mode, and every MIG device.
    fn devices(&self) -> Vec<(String, String)> {
        let inventory = self.sim.inventory().expect("inventory");
        let mut devices = vec![];
        for gpu in &inventory.gpus {
            match &gpu.mig {
                Some(mig) if !mig.instances.is_empty() => {
                    for i in &mig.instances {
                        let profile = mig.profile_by_id(i.profile_id).expect("profile");
                        devices.push((
                            mig_device_name(
                                gpu.minor,
                                &profile.name,
                                profile.id,
                                i.placement.start,
                            ),
                            i.uuid.clone(),
                        ));
                    }
                }
                _ => devices.push((format!("gpu-{}", gpu.minor), gpu.uuid.clone())),
            }
        }
        devices
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// What a container holding `device` gets from `spec`, as named entries.
fn entries(spec: &Value, device: &Value) -> BTreeSet<String> {
    let edits: Vec<&Value> = [&spec["containerEdits"], &device["containerEdits"]].into();
    let mut out = BTreeSet::new();
    let mut links: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    for e in &edits {
        for env in strings(&e["env"]) {
            out.insert(format!("env {env}"));
        }
        for node in e["deviceNodes"].as_array().into_iter().flatten() {
            out.insert(format!(
                "device-node {} {}",
                node["path"].as_str().unwrap_or_default(),
                node["hostPath"].as_str().unwrap_or_default()
            ));
        }
        for mount in e["mounts"].as_array().into_iter().flatten() {
            let mut options = strings(&mount["options"]);
            options.sort();
            out.insert(format!(
                "mount {} {} {}",
                mount["containerPath"].as_str().unwrap_or_default(),
                mount["hostPath"].as_str().unwrap_or_default(),
                options.join(",")
            ));
        }
        for hook in e["hooks"].as_array().into_iter().flatten() {
            let args = strings(&hook["args"]);
            let name = hook["hookName"].as_str().unwrap_or_default();
            match args.get(1).map(String::as_str) {
                Some("create-symlinks") => {
                    for pair in args[2..].chunks(2) {
                        let Some((target, link)) = pair.get(1).and_then(|p| p.split_once("::"))
                        else {
                            continue;
                        };
                        let link = PathBuf::from(link);
                        let target = link.parent().expect("link dir").join(target);
                        links.insert(link, normalize(&target));
                    }
                }
                Some("update-ldcache") => {
                    for folder in args[2..].chunks(2).filter_map(|p| p.get(1)) {
                        out.insert(format!("ldcache-folder {folder}"));
                    }
                }
                _ => {
                    out.insert(format!("hook {} ({name})", args[1..].join(" ")));
                }
            }
        }
    }
    // A link is the library it ends at, however many links lead there.
    for (link, target) in &links {
        let mut end = target.clone();
        for _ in 0..8 {
            match links.get(&end) {
                Some(next) => end = next.clone(),
                None => break,
            }
        }
        out.insert(format!("link {} -> {}", link.display(), end.display()));
    }
    out
}

/// `a/b/../c` → `a/c`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
#[ignore = "needs root, NVIDIA_CTK and NVIDIA_CDI_HOOK (e2e/build-k8s.sh builds them; e2e/run-tests runs ignored tests)"]
fn our_cdi_specs_give_what_nvidia_ctk_gives_or_the_difference_is_explained() {
    let scenarios: [(&str, &[Carve]); 3] = [
        // Two whole H100s.
        ("sim:2xH100-SXM5-80GB", &[]),
        // An A100 in MIG mode with a 1g.5gb and a 3g.20gb that exist, and a whole L4 beside it.
        ("sim:1xA100-SXM4-40GB,1xL4", &[(0, 19, 0), (0, 9, 4)]),
        // Blackwell: a whole B200.
        ("sim:1xB200-SXM6-180GB", &[]),
    ];
    let table = explained();
    let mut explanations = differential::Explanations::new(&table);
    let (mut devices, mut compared) = (0, 0);
    for (spec, carves) in scenarios {
        let node = Node::new(spec, carves);
        let nvidia = node.nvidia();
        for (name, uuid) in node.devices() {
            let theirs = nvidia["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|d| d["name"] == uuid.as_str())
                .unwrap_or_else(|| panic!("{spec}: nvidia-ctk has no device {uuid} ({name})"));
            let ours = node.ours(&name);
            let our_device = &ours["devices"][0];
            let a = entries(&ours, our_device);
            let b = entries(&nvidia, theirs);
            devices += 1;
            compared += a.union(&b).count();
            for (side, entry) in b
                .difference(&a)
                .map(|e| ("nvidia", e))
                .chain(a.difference(&b).map(|e| ("ours", e)))
            {
                explanations.difference(
                    side,
                    entry,
                    format!("{spec} {name}: only {side}: {entry}"),
                );
            }
        }
    }
    explanations.assert_all_explained();
    differential::report(&format!(
        "CDI vs nvidia-ctk: {devices} devices, {compared} entries compared, 0 mismatches ({} differences explained in tests/cdi_nvidia_ctk.rs)",
        explanations.differences
    ));
}
