//! GPUs as PCI functions, as the kernel shows them in sysfs: what passthrough to a virtual
//! machine needs and NVML cannot say (NVML does not see a GPU bound to `vfio-pci`).
//!
//! - [`scan`] lists NVIDIA's GPUs under `<sysfs>/bus/pci/devices` in NVIDIA's order (go-nvlib's
//!   `nvpci`: vendor 0x10de, class VGA or 3D controller, no virtual functions, sorted by bus id),
//!   with their driver, IOMMU group and what else is in it.
//! - [`bind`] moves a function to another driver the way the kernel documents it
//!   (`driver_override`, `unbind`, `drivers_probe`).
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// NVIDIA's PCI vendor id.
pub const NVIDIA_VENDOR: u16 = 0x10de;
/// `PCI_CLASS_DISPLAY_VGA` and `PCI_CLASS_DISPLAY_3D`, without the programming interface.
const GPU_CLASSES: [u32; 2] = [0x0300, 0x0302];
/// `PCI_CLASS_BRIDGE_PCI`: bridges in a GPU's IOMMU group stay with their driver.
const BRIDGE_CLASS: u32 = 0x0604;
/// A `resource` line's flags keep the BAR's own low bits: memory type 64-bit (go-nvlib's test).
const MEM_TYPE_MASK: u64 = 0x06;
const MEM_TYPE_64: u64 = 0x04;
/// The standard BARs of a `resource` file (then the expansion ROM and bridge windows).
const STANDARD_BARS: usize = 6;

/// One GPU's PCI function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciGpu {
    /// Position in bus-id order among the node's GPUs: the `<index>` of `gpu-vfio-<index>`.
    pub index: u32,
    /// Lower-case `dddd:bb:dd.f`.
    pub bus_id: String,
    pub vendor_id: u16,
    pub device_id: u16,
    /// The kernel driver bound now (`nvidia`, `vfio-pci`), `None` when unbound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
    /// The other functions in the IOMMU group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_peers: Vec<PciPeer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// The 64-bit BARs summed and rounded up to a power of two (NVIDIA's `addressableMemory`).
    pub addressable_memory: u64,
    /// `vfioN` of `/dev/vfio/devices/vfioN` (the iommufd cdev), while bound to `vfio-pci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_cdev: Option<String>,
}

/// Another function in a GPU's IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciPeer {
    pub bus_id: String,
    /// Class code without the programming interface (`0x0403` audio, `0x0604` bridge).
    pub class: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

/// What the node offers passthrough with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciView {
    pub gpus: Vec<PciGpu>,
    /// Whether the kernel has IOMMU groups at all (`/sys/kernel/iommu_groups` is not empty).
    pub iommu: bool,
    /// Whether iommufd is there (`/dev/iommu`, seen as `/sys/class/misc/iommu`).
    pub iommufd: bool,
}

impl PciView {
    pub fn by_bus_id(&self, bus_id: &str) -> Option<&PciGpu> {
        self.gpus.iter().find(|g| g.bus_id == bus_id)
    }
}

impl PciGpu {
    /// Why the GPU cannot be handed to a virtual machine on its own, if it cannot: another
    /// function in its IOMMU group is bound to a driver that is not `vfio-pci` (a bridge is fine).
    pub fn group_blocker(&self) -> Option<String> {
        if self.iommu_group.is_none() {
            return Some("it has no IOMMU group (is the IOMMU on?)".into());
        }
        self.group_peers
            .iter()
            .find(|p| {
                p.class != BRIDGE_CLASS && p.driver.as_deref().is_some_and(|d| d != "vfio-pci")
            })
            .map(|p| {
                format!(
                    "its IOMMU group {} also holds {} (class 0x{:04x}) bound to {}",
                    self.iommu_group.unwrap_or_default(),
                    p.bus_id,
                    p.class,
                    p.driver.as_deref().unwrap_or_default()
                )
            })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PciError {
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
    #[error("PCI function {bus_id}: {reason}")]
    Bind { bus_id: String, reason: String },
}

fn io(path: &Path, e: impl std::fmt::Display) -> PciError {
    PciError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn read_hex(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    u64::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

fn link_name(path: &Path) -> Option<String> {
    let target = fs::read_link(path).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// The NVIDIA GPUs under `<sysfs_root>/bus/pci/devices`, in bus-id order.
pub fn scan(sysfs_root: &Path) -> Result<PciView, PciError> {
    let devices = sysfs_root.join("bus/pci/devices");
    let mut bus_ids: Vec<String> = match fs::read_dir(&devices) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
        Err(e) => return Err(io(&devices, e)),
    };
    // Zero-padded lower-case hex: string order is numeric order.
    bus_ids.sort();
    let mut gpus = Vec::new();
    for bus_id in bus_ids {
        let dir = devices.join(&bus_id);
        let vendor = read_hex(&dir.join("vendor"));
        let class = read_hex(&dir.join("class")).map(|c| (c >> 8) as u32);
        if vendor != Some(u64::from(NVIDIA_VENDOR))
            || !class.is_some_and(|c| GPU_CLASSES.contains(&c))
            || dir.join("physfn").exists()
        {
            continue;
        }
        let iommu_group = link_name(&dir.join("iommu_group")).and_then(|g| g.parse().ok());
        let group_peers = match iommu_group {
            Some(group) => group_peers(sysfs_root, group, &bus_id),
            None => vec![],
        };
        gpus.push(PciGpu {
            index: gpus.len() as u32,
            device_id: read_hex(&dir.join("device")).unwrap_or_default() as u16,
            vendor_id: NVIDIA_VENDOR,
            driver: link_name(&dir.join("driver")),
            iommu_group,
            group_peers,
            numa_node: fs::read_to_string(dir.join("numa_node"))
                .ok()
                .and_then(|n| n.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0),
            pcie_root: super::nvml::pcie_root(sysfs_root, &bus_id),
            addressable_memory: addressable_memory(&dir.join("resource")),
            vfio_cdev: fs::read_dir(dir.join("vfio-dev")).ok().and_then(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .find(|n| n.starts_with("vfio"))
            }),
            bus_id,
        });
    }
    let groups = sysfs_root.join("kernel/iommu_groups");
    let iommu = fs::read_dir(&groups).is_ok_and(|mut entries| entries.next().is_some());
    Ok(PciView {
        gpus,
        iommu,
        iommufd: sysfs_root.join("class/misc/iommu").exists(),
    })
}

fn group_peers(sysfs_root: &Path, group: u32, own: &str) -> Vec<PciPeer> {
    let dir = sysfs_root.join(format!("kernel/iommu_groups/{group}/devices"));
    let Ok(entries) = fs::read_dir(&dir) else {
        return vec![];
    };
    let mut peers: Vec<PciPeer> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|bus_id| bus_id != own)
        .map(|bus_id| {
            let function = dir.join(&bus_id);
            PciPeer {
                class: read_hex(&function.join("class")).map_or(0, |c| (c >> 8) as u32),
                driver: link_name(&function.join("driver")),
                bus_id,
            }
        })
        .collect();
    peers.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    peers
}

/// The 64-bit memory BARs of a `resource` file summed, rounded up to a power of two.
fn addressable_memory(resource: &Path) -> u64 {
    let Ok(text) = fs::read_to_string(resource) else {
        return 0;
    };
    let total: u64 = text
        .lines()
        .take(STANDARD_BARS)
        .filter_map(|line| {
            let mut fields = line
                .split_whitespace()
                .map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).unwrap_or_default());
            let (start, end, flags) = (fields.next()?, fields.next()?, fields.next()?);
            (flags & MEM_TYPE_MASK == MEM_TYPE_64 && end > start).then(|| end - start + 1)
        })
        .sum();
    if total == 0 {
        0
    } else {
        total.checked_next_power_of_two().unwrap_or(total)
    }
}

/// Moves a function to `driver` as the kernel documents it: `driver_override`, unbind from the
/// current driver, `drivers_probe`; then checks the function is bound to it. Bound already, it
/// changes nothing.
pub fn bind(sysfs_root: &Path, bus_id: &str, driver: &str) -> Result<(), PciError> {
    let function = sysfs_root.join("bus/pci/devices").join(bus_id);
    if !function.exists() {
        return Err(PciError::Bind {
            bus_id: bus_id.into(),
            reason: format!("no such function under {}", function.display()),
        });
    }
    if link_name(&function.join("driver")).as_deref() == Some(driver) {
        return Ok(());
    }
    let write = |path: PathBuf, value: &str| fs::write(&path, value).map_err(|e| io(&path, e));
    // `nvidia` claims its GPUs without an override; an override left behind would keep the GPU
    // from it after a reboot's probe.
    let wanted = if driver == "nvidia" { "\n" } else { driver };
    write(function.join("driver_override"), wanted)?;
    if function.join("driver").exists() {
        write(function.join("driver/unbind"), bus_id)?;
    }
    write(sysfs_root.join("bus/pci/drivers_probe"), bus_id)?;
    match link_name(&function.join("driver")) {
        Some(bound) if bound == driver => Ok(()),
        bound => Err(PciError::Bind {
            bus_id: bus_id.into(),
            reason: format!(
                "still bound to {} after drivers_probe (is the {driver} module loaded?)",
                bound.as_deref().unwrap_or("no driver")
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::{PciDriver, render_sysfs, sim_iommu_group, sim_pci_location};

    #[test]
    fn scan_finds_gpus_in_bus_order_with_driver_group_and_bars() {
        let dir = tempfile::tempdir().expect("tmp");
        let gpus: Vec<(u32, PciDriver)> = vec![
            (0, PciDriver::Nvidia),
            (1, PciDriver::VfioPci),
            (9, PciDriver::Nvidia),
        ];
        render_sysfs(dir.path(), &gpus, |_| Some(0x2330_10DE)).expect("sysfs");
        let view = scan(dir.path()).expect("scan");
        assert!(view.iommu);
        assert!(!view.iommufd);
        let ids: Vec<(&str, u32)> = view
            .gpus
            .iter()
            .map(|g| (g.bus_id.as_str(), g.index))
            .collect();
        // Index 9 is in PCI domain 1: last in bus-id order, and numbered by position.
        assert_eq!(
            ids,
            [
                ("0000:18:00.0", 0),
                ("0000:2a:00.0", 1),
                ("0001:2a:00.0", 2)
            ]
        );
        let second = &view.gpus[1];
        assert_eq!(second.driver.as_deref(), Some("vfio-pci"));
        assert_eq!(second.device_id, 0x2330);
        assert_eq!(second.iommu_group, Some(sim_iommu_group(1)));
        assert_eq!(
            second.pcie_root.as_deref(),
            Some(sim_pci_location(1).1.as_str())
        );
        assert_eq!(second.numa_node, Some(0));
        assert_eq!(second.vfio_cdev.as_deref(), Some("vfio1"));
        assert_eq!(view.gpus[0].vfio_cdev, None);
        assert!(second.addressable_memory.is_power_of_two());
        assert_eq!(second.group_blocker(), None);
    }

    /// The simulator's PCI view is what scanning its sysfs finds, bindings included.
    #[test]
    fn the_simulators_view_is_what_its_sysfs_shows() {
        let node = crate::gpu::sim::SimNode::new(
            "sim:2xH100-SXM5-80GB,1xT4".parse().expect("spec"),
            "n1",
            None,
        );
        node.bind_driver(2, PciDriver::VfioPci).expect("bind");
        let dir = tempfile::tempdir().expect("tmp");
        node.write_sysfs(dir.path()).expect("sysfs");
        let inventory = node.inventory().expect("inventory");
        assert_eq!(scan(dir.path()).expect("scan"), inventory.pci);
        assert_eq!(inventory.pci.gpus[2].driver.as_deref(), Some("vfio-pci"));
    }

    #[test]
    fn a_group_peer_bound_to_another_driver_blocks_passthrough() {
        let dir = tempfile::tempdir().expect("tmp");
        render_sysfs(dir.path(), &[(0, PciDriver::Nvidia)], |_| None).expect("sysfs");
        // The GPU's audio function, bound to the sound driver, in the same group.
        let group = dir.path().join(format!(
            "kernel/iommu_groups/{}/devices",
            sim_iommu_group(0)
        ));
        let audio = dir.path().join("devices/audio");
        fs::create_dir_all(&audio).expect("mkdir");
        fs::write(audio.join("class"), "0x040300\n").expect("class");
        fs::create_dir_all(dir.path().join("bus/pci/drivers/snd_hda_intel")).expect("mkdir");
        std::os::unix::fs::symlink(
            dir.path().join("bus/pci/drivers/snd_hda_intel"),
            audio.join("driver"),
        )
        .expect("link");
        std::os::unix::fs::symlink(&audio, group.join("0000:18:00.1")).expect("link");
        let view = scan(dir.path()).expect("scan");
        let reason = view.gpus[0].group_blocker().expect("blocked");
        assert!(reason.contains("0000:18:00.1"), "{reason}");
        assert!(reason.contains("snd_hda_intel"), "{reason}");
    }

    #[test]
    fn bars_sum_the_64_bit_memory_windows_to_a_power_of_two() {
        let dir = tempfile::tempdir().expect("tmp");
        let resource = dir.path().join("resource");
        fs::write(
            &resource,
            "0x00000000e2000000 0x00000000e2ffffff 0x0000000000040200\n\
             0x0000220000000000 0x0000221fffffffff 0x000000000014220c\n\
             0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
             0x0000222000000000 0x0000222001ffffff 0x000000000014220c\n",
        )
        .expect("write");
        // 128 GiB + 32 MiB → 256 GiB; the 32-bit BAR0 does not count.
        assert_eq!(addressable_memory(&resource), 256 << 30);
        assert_eq!(addressable_memory(&dir.path().join("missing")), 0);
    }

    #[test]
    fn bind_writes_the_kernel_protocol_and_checks_the_result() {
        let dir = tempfile::tempdir().expect("tmp");
        render_sysfs(dir.path(), &[(0, PciDriver::Nvidia)], |_| None).expect("sysfs");
        // Static files: nothing moves the link, so the check fails and says so.
        let error = bind(dir.path(), "0000:18:00.0", "vfio-pci").expect_err("not rebound");
        assert!(
            error.to_string().contains("still bound to nvidia"),
            "{error}"
        );
        let function = dir.path().join("bus/pci/devices/0000:18:00.0");
        assert_eq!(
            fs::read_to_string(function.join("driver_override")).expect("override"),
            "vfio-pci"
        );
        let unbind = dir.path().join("bus/pci/drivers/nvidia/unbind");
        assert_eq!(fs::read_to_string(unbind).expect("unbind"), "0000:18:00.0");
        let probe = dir.path().join("bus/pci/drivers_probe");
        assert_eq!(fs::read_to_string(probe).expect("probe"), "0000:18:00.0");
        // Already bound: nothing written.
        bind(dir.path(), "0000:18:00.0", "nvidia").expect("already nvidia");
        assert!(bind(dir.path(), "0000:99:00.0", "nvidia").is_err());
    }
}
