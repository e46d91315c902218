//! CDI specs: one transient spec per claim, as NVIDIA's driver writes them
//! (kind `k8s.<driver name>/claim`, e.g. `k8s.gpu.nvidia.com/claim`, device
//! `<claimUID>-<device>`), so container runtimes inject exactly the claim's device nodes.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::driver_files::DriverFiles;
use crate::gpu::mig::{ci_access_cap_minor, gi_access_cap_minor};

pub const CLASS: &str = "claim";
/// Spec annotations (0.6.0) mark the specs this driver wrote; nothing else is ever swept.
pub const CDI_VERSION: &str = "0.6.0";
/// Names the driver that wrote a spec.
pub const WRITTEN_BY: &str = "gpu-dra.io/driver";
/// The node's boot ID when the spec was written: a spec of an earlier boot (a CDI root that
/// outlives reboots, such as `/etc/cdi`) belongs to no running container.
pub const WRITTEN_IN_BOOT: &str = "gpu-dra.io/boot-id";

#[derive(Debug, thiserror::Error)]
#[error("CDI spec {path}: {reason}")]
pub struct CdiError {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<SpecDevice>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    /// Where the node is on the host, when not at `path` (a `--dev-root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "type")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
}

/// What a device contributes to a claim's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CdiDevice {
    Gpu {
        name: String,
        minor: u32,
        uuid: String,
    },
    Mig {
        name: String,
        parent_minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
        uuid: String,
    },
    /// A GPU bound to vfio-pci for a virtual machine: its group node (`/dev/vfio/<group>`) or
    /// iommufd cdev (`/dev/vfio/devices/vfioN`), and the IOMMU API device when asked for.
    Vfio {
        name: String,
        node: String,
        api_device: Option<String>,
    },
}

impl CdiDevice {
    fn name(&self) -> &str {
        match self {
            Self::Gpu { name, .. } | Self::Mig { name, .. } | Self::Vfio { name, .. } => name,
        }
    }

    fn uuid(&self) -> Option<&str> {
        match self {
            Self::Gpu { uuid, .. } | Self::Mig { uuid, .. } => Some(uuid),
            Self::Vfio { .. } => None,
        }
    }
}

/// Writes and removes claim specs under one CDI root.
#[derive(Debug, Clone)]
pub struct CdiStore {
    root: PathBuf,
    driver_name: String,
    /// `k8s.<driver name>`, the CDI vendor of our specs.
    vendor: String,
    /// Major number of `nvidia-caps` devices, when the host has them (`/proc/devices`).
    caps_major: Option<u32>,
    /// Recorded in every spec written (`WRITTEN_IN_BOOT`).
    boot_id: Option<String>,
    /// The host's device root when it is not `/`.
    dev_root: Option<PathBuf>,
    /// The driver's libraries, binaries and firmware every claim's containers get.
    driver_files: Option<Arc<DriverFiles>>,
}

impl CdiStore {
    pub fn new(root: &Path, driver_name: &str) -> Self {
        Self {
            root: root.to_path_buf(),
            driver_name: driver_name.to_string(),
            vendor: format!("k8s.{driver_name}"),
            caps_major: nvidia_caps_major(Path::new("/proc/devices")),
            boot_id: None,
            dev_root: None,
            driver_files: None,
        }
    }

    /// Records `boot_id` in the specs written from now on.
    pub fn with_boot_id(mut self, boot_id: &str) -> Self {
        self.boot_id = Some(boot_id.to_string());
        self
    }

    /// Mounts the driver's user-space files into every claim's containers.
    pub fn with_driver_files(mut self, files: Option<Arc<DriverFiles>>) -> Self {
        self.driver_files = files;
        self
    }

    /// Device nodes live under `dev_root` on the host (`<dev_root>/dev/nvidia0`); containers
    /// still see them at `/dev/...`. `None` or `/` means the host's own `/dev`.
    pub fn with_dev_root(mut self, dev_root: Option<&Path>) -> Self {
        self.dev_root = dev_root
            .filter(|root| *root != Path::new("/"))
            .map(Path::to_path_buf);
        self
    }

    /// The spec's device node for `path`, with its host path under the dev root.
    fn node(&self, path: String) -> DeviceNode {
        DeviceNode {
            host_path: self.host_path(&path),
            path,
            ..DeviceNode::default()
        }
    }

    fn host_path(&self, path: &str) -> Option<String> {
        let root = self.dev_root.as_ref()?;
        Some(
            root.join(path.trim_start_matches('/'))
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.root
            .join(format!("{}-{CLASS}_{claim_uid}.json", self.vendor))
    }

    /// `k8s.gpu.nvidia.com/claim=<uid>-<device>`.
    pub fn device_id(&self, claim_uid: &str, device: &str) -> String {
        format!("{}/{CLASS}={claim_uid}-{device}", self.vendor)
    }

    /// The spec a claim's devices get; `claim_edits` go to every container of the claim (e.g. its
    /// MPS daemon's pipe).
    pub fn spec(
        &self,
        claim_uid: &str,
        devices: &[CdiDevice],
        claim_edits: &ContainerEdits,
    ) -> Spec {
        let devices_in = devices;
        // Every device of the claim sees all the claim's GPUs: a container that references any of
        // them gets the same, consistent NVIDIA_VISIBLE_DEVICES.
        let visible = devices
            .iter()
            .filter_map(CdiDevice::uuid)
            .collect::<Vec<_>>()
            .join(",");
        // GPUs for a virtual machine: no driver files, no CUDA devices (the planner never mixes
        // them with other devices in one claim).
        let for_vm =
            !devices.is_empty() && devices.iter().all(|d| matches!(d, CdiDevice::Vfio { .. }));
        let devices = devices
            .iter()
            .map(|device| {
                let mut nodes = vec![];
                let mut env = vec![format!("NVIDIA_VISIBLE_DEVICES={visible}")];
                match device {
                    CdiDevice::Vfio { node, .. } => {
                        nodes.push(self.node(node.clone()));
                        env.clear();
                    }
                    CdiDevice::Gpu { minor, .. } => {
                        nodes.push(self.node(format!("/dev/nvidia{minor}")))
                    }
                    CdiDevice::Mig {
                        parent_minor,
                        gpu_instance_id,
                        compute_instance_id,
                        ..
                    } => {
                        nodes.push(self.node(format!("/dev/nvidia{parent_minor}")));
                        for cap in [
                            gi_access_cap_minor(*parent_minor, *gpu_instance_id),
                            ci_access_cap_minor(
                                *parent_minor,
                                *gpu_instance_id,
                                *compute_instance_id,
                            ),
                        ] {
                            // The capability nodes need not exist on the host, so the spec carries
                            // their numbers (0o400 as the driver's capability files say).
                            let path = format!("/dev/nvidia-caps/nvidia-cap{cap}");
                            nodes.push(DeviceNode {
                                host_path: self.host_path(&path),
                                path,
                                kind: Some("c".into()),
                                major: self.caps_major,
                                minor: Some(cap),
                                file_mode: Some(0o400),
                            });
                        }
                    }
                }
                SpecDevice {
                    name: format!("{claim_uid}-{}", device.name()),
                    container_edits: ContainerEdits {
                        env,
                        device_nodes: nodes,
                        ..ContainerEdits::default()
                    },
                }
            })
            .collect();
        let mut container_edits = if for_vm {
            let mut api_devices: Vec<&String> = devices_in
                .iter()
                .filter_map(|d| match d {
                    CdiDevice::Vfio { api_device, .. } => api_device.as_ref(),
                    _ => None,
                })
                .collect();
            api_devices.sort();
            api_devices.dedup();
            ContainerEdits {
                // The toolkit's runtime hook, where one is installed, then injects nothing.
                env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
                device_nodes: api_devices
                    .into_iter()
                    .map(|p| self.node(p.clone()))
                    .collect(),
                ..ContainerEdits::default()
            }
        } else {
            ContainerEdits {
                device_nodes: ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
                    .into_iter()
                    .map(|p| self.node(p.to_string()))
                    .collect(),
                ..self.driver_edits()
            }
        };
        container_edits.env.extend(claim_edits.env.iter().cloned());
        container_edits
            .device_nodes
            .extend(claim_edits.device_nodes.iter().cloned());
        container_edits
            .mounts
            .extend(claim_edits.mounts.iter().cloned());
        container_edits
            .hooks
            .extend(claim_edits.hooks.iter().cloned());
        Spec {
            cdi_version: CDI_VERSION.into(),
            kind: format!("{}/{CLASS}", self.vendor),
            annotations: BTreeMap::from_iter(
                [
                    (WRITTEN_BY, Some(self.driver_name.clone())),
                    (WRITTEN_IN_BOOT, self.boot_id.clone()),
                ]
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_string(), value?))),
            ),
            devices,
            container_edits,
        }
    }

    /// What every container of a claim needs from the driver to run CUDA: its libraries,
    /// binaries, firmware and sockets (read-only binds), the libraries' links and the container's
    /// ld cache (through the toolkit's hook when the node has it, else by binding each library at
    /// its link's path as well).
    fn driver_edits(&self) -> ContainerEdits {
        let Some(files) = &self.driver_files else {
            return ContainerEdits::default();
        };
        // The toolkit's options (rbind and rprivate: a mount under the file's folder comes along
        // and nothing propagates back).
        let read_only = || -> Vec<String> {
            ["ro", "nosuid", "nodev", "rbind", "rprivate"]
                .map(String::from)
                .to_vec()
        };
        let bind = |host: &Path, container: &Path, options: Vec<String>| Mount {
            host_path: host.to_string_lossy().into_owned(),
            container_path: container.to_string_lossy().into_owned(),
            options,
        };
        let mut mounts: Vec<Mount> = files
            .libraries
            .iter()
            .chain(&files.binaries)
            .chain(&files.firmware)
            .chain(&files.configs)
            .map(|f| bind(&f.host_path, &f.container_path, read_only()))
            .collect();
        mounts.extend(files.sockets.iter().map(|f| {
            bind(
                &f.host_path,
                &f.container_path,
                ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
                    .map(String::from)
                    .to_vec(),
            )
        }));
        let mut hooks = Vec::new();
        let mut env = Vec::new();
        match &files.hook {
            Some(hook) => {
                if !files.links.is_empty() {
                    let mut args = vec!["create-symlinks".to_string()];
                    for link in &files.links {
                        args.push("--link".into());
                        args.push(format!(
                            "{}::{}",
                            link.target.display(),
                            link.link.display()
                        ));
                    }
                    hooks.push(toolkit_hook(hook, args));
                }
                // As NVIDIA's specs, where the node's hook has the command: CUDA forward
                // compatibility libraries in the image are used only when newer than the driver.
                if files.hook_commands.contains("enable-cuda-compat") {
                    hooks.push(toolkit_hook(
                        hook,
                        vec![
                            "enable-cuda-compat".into(),
                            format!("--host-driver-version={}", files.version),
                        ],
                    ));
                    let dirs: Vec<String> = files
                        .library_dirs()
                        .iter()
                        .map(|d| d.to_string_lossy().into_owned())
                        .collect();
                    env.push(format!("NVIDIA_CTK_LIBCUDA_DIR={}", dirs.join(":")));
                }
                let mut args = vec!["update-ldcache".to_string()];
                for dir in files.library_dirs() {
                    args.push("--folder".into());
                    args.push(dir.to_string_lossy().into_owned());
                }
                hooks.push(toolkit_hook(hook, args));
                // The container cannot make device nodes the claim was not given; EGL and Vulkan
                // see only the claim's GPUs.
                for command in [
                    "disable-device-node-modification",
                    "update-application-profile",
                ] {
                    if files.hook_commands.contains(command) {
                        hooks.push(toolkit_hook(hook, vec![command.to_string()]));
                    }
                }
            }
            None => {
                let host_of: BTreeMap<&Path, &Path> = files
                    .libraries
                    .iter()
                    .map(|l| (l.container_path.as_path(), l.host_path.as_path()))
                    .collect();
                for link in &files.links {
                    if let Some(host) = host_of.get(link.target.as_path()) {
                        mounts.push(bind(host, &link.link, read_only()));
                    }
                }
            }
        }
        ContainerEdits {
            env,
            mounts,
            hooks,
            ..ContainerEdits::default()
        }
    }

    /// Writes the claim's spec atomically (temp file, fsync, rename).
    pub fn write(
        &self,
        claim_uid: &str,
        devices: &[CdiDevice],
        claim_edits: &ContainerEdits,
    ) -> Result<PathBuf, CdiError> {
        let path = self.spec_path(claim_uid);
        let err = |reason: String| CdiError {
            path: path.clone(),
            reason,
        };
        let bytes = serde_json::to_vec_pretty(&self.spec(claim_uid, devices, claim_edits))
            .map_err(|e| err(e.to_string()))?;
        crate::fsutil::write_atomically(&path, &bytes)
            .map_err(|e| err(format!("cannot write: {e}")))?;
        Ok(path)
    }

    /// Removes the claim's spec; a missing spec is fine.
    pub fn remove(&self, claim_uid: &str) -> Result<(), CdiError> {
        let path = self.spec_path(claim_uid);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            // No spec there: none was written, or the root is not even a directory.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(CdiError {
                path,
                reason: format!("cannot remove: {e}"),
            }),
        }
    }

    /// UIDs of the claims that have a spec in the root (ours only), plus leftover temp files.
    pub fn claim_uids(&self) -> Result<Vec<String>, CdiError> {
        let prefix = format!("{}-{CLASS}_", self.vendor);
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => {
                return Err(CdiError {
                    path: self.root.clone(),
                    reason: format!("cannot list: {e}"),
                });
            }
        };
        let mut uids = vec![];
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(uid) = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".json"))
            {
                if self.wrote(&entry.path()) {
                    uids.push(uid.to_string());
                } else {
                    tracing::debug!(path = %entry.path().display(), "leaving a CDI spec this driver did not write");
                }
            } else if name.starts_with(&format!(".{prefix}")) && name.contains(".tmp-") {
                // A crash mid-write leaves a temp file; it never became a spec.
                let _ = std::fs::remove_file(entry.path());
            }
        }
        uids.sort();
        Ok(uids)
    }

    /// UIDs of the claims whose spec (ours) was written in boot `boot_id`, or in an unknown boot
    /// (a spec from before the boot annotation: it may be this boot's).
    pub fn claim_uids_of_boot(&self, boot_id: &str) -> Result<Vec<String>, CdiError> {
        Ok(self
            .claim_uids()?
            .into_iter()
            .filter(|uid| {
                let header = std::fs::read(self.spec_path(uid))
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<SpecHeader>(&bytes).ok());
                header
                    .and_then(|h| h.annotations.get(WRITTEN_IN_BOOT).cloned())
                    .is_none_or(|written| written == boot_id)
            })
            .collect())
    }

    /// Whether the spec at `path` is one of ours: annotated with our driver name, or (written by
    /// an earlier gpu-dra, before the annotation) of our kind with no annotations at all.
    fn wrote(&self, path: &Path) -> bool {
        let Ok(bytes) = std::fs::read(path) else {
            return false;
        };
        let Ok(spec) = serde_json::from_slice::<SpecHeader>(&bytes) else {
            return false;
        };
        match spec.annotations.get(WRITTEN_BY) {
            Some(driver) => *driver == self.driver_name,
            None => spec.annotations.is_empty() && spec.kind == format!("{}/{CLASS}", self.vendor),
        }
    }
}

/// The part of a spec that says who wrote it.
#[derive(Deserialize)]
struct SpecHeader {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// The `nvidia-caps` character-device major from `/proc/devices`.
fn nvidia_caps_major(proc_devices: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(proc_devices).ok()?;
    text.lines().find_map(|line| {
        let (major, name) = line.trim().split_once(' ')?;
        (name.trim() == "nvidia-caps")
            .then(|| major.parse().ok())
            .flatten()
    })
}

/// A `createContainer` hook run by the toolkit's binary: `nvidia-cdi-hook <command> ...`, or
/// `nvidia-ctk hook <command> ...` for older toolkits.
fn toolkit_hook(binary: &Path, args: Vec<String>) -> Hook {
    let name = binary
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut full = vec![name.clone()];
    if name == "nvidia-ctk" {
        full.push("hook".into());
    }
    full.extend(args);
    Hook {
        hook_name: "createContainer".into(),
        path: binary.to_string_lossy().into_owned(),
        args: full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_root_sets_host_paths_and_keeps_container_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let devices = [CdiDevice::Mig {
            name: "gpu-0-mig-1g10gb-19-0".into(),
            parent_minor: 0,
            gpu_instance_id: 1,
            compute_instance_id: 0,
            uuid: "MIG-a".into(),
        }];
        let store = CdiStore::new(dir.path(), "gpu.nvidia.com")
            .with_dev_root(Some(Path::new("/run/nvidia/driver")));
        let spec = store.spec("uid-1", &devices, &ContainerEdits::default());
        let nodes = spec.devices[0]
            .container_edits
            .device_nodes
            .iter()
            .chain(&spec.container_edits.device_nodes);
        for node in nodes {
            assert!(node.path.starts_with("/dev/"), "{node:?}");
            assert_eq!(
                node.host_path.as_deref(),
                Some(format!("/run/nvidia/driver{}", node.path).as_str())
            );
        }
        let json = serde_json::to_value(&spec).expect("json");
        assert_eq!(
            json["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/run/nvidia/driver/dev/nvidiactl"
        );
        // The host's own /dev: no hostPath at all.
        let plain = CdiStore::new(dir.path(), "gpu.nvidia.com").with_dev_root(Some(Path::new("/")));
        let json = serde_json::to_value(plain.spec("uid-1", &devices, &ContainerEdits::default()))
            .expect("json");
        assert!(
            json["containerEdits"]["deviceNodes"][0]
                .get("hostPath")
                .is_none()
        );
    }

    #[test]
    fn full_gpu_and_mig_specs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CdiStore {
            caps_major: Some(238),
            ..CdiStore::new(dir.path(), "gpu.nvidia.com")
        };
        let devices = [
            CdiDevice::Gpu {
                name: "gpu-1".into(),
                minor: 1,
                uuid: "GPU-a".into(),
            },
            CdiDevice::Mig {
                name: "gpu-3-mig-3g40gb-9-4".into(),
                parent_minor: 3,
                gpu_instance_id: 3,
                compute_instance_id: 3,
                uuid: "MIG-b".into(),
            },
        ];
        let path = store
            .write("uid-1", &devices, &ContainerEdits::default())
            .expect("write");
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some("k8s.gpu.nvidia.com-claim_uid-1.json")
        );
        let spec: Spec =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("parse");
        assert_eq!(spec.kind, "k8s.gpu.nvidia.com/claim");
        assert_eq!(spec.devices[0].name, "uid-1-gpu-1");
        assert_eq!(
            spec.devices[0].container_edits.env,
            ["NVIDIA_VISIBLE_DEVICES=GPU-a,MIG-b"]
        );
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].path,
            "/dev/nvidia1"
        );
        let mig_nodes: Vec<_> = spec.devices[1]
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            mig_nodes,
            [
                "/dev/nvidia3",
                "/dev/nvidia-caps/nvidia-cap435",
                "/dev/nvidia-caps/nvidia-cap439"
            ]
        );
        assert_eq!(
            spec.devices[1].container_edits.device_nodes[2].major,
            Some(238)
        );
        let common: Vec<_> = spec
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            common,
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        assert_eq!(
            store.device_id("uid-1", "gpu-1"),
            "k8s.gpu.nvidia.com/claim=uid-1-gpu-1"
        );
        assert_eq!(store.claim_uids().expect("list"), ["uid-1"]);
        store.remove("uid-1").expect("remove");
        store.remove("uid-1").expect("idempotent");
        assert!(store.claim_uids().expect("list").is_empty());
    }

    #[test]
    fn caps_major_from_proc_devices() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("devices");
        std::fs::write(
            &p,
            "Character devices:\n  1 mem\n195 nvidia-frontend\n238 nvidia-caps\n\nBlock devices:\n",
        )
        .expect("write");
        assert_eq!(nvidia_caps_major(&p), Some(238));
        assert_eq!(nvidia_caps_major(&dir.path().join("none")), None);
    }
}
