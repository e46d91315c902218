//! GPUs as PCI functions, as the kernel shows them in sysfs: what passthrough to a virtual
//! machine needs and NVML cannot say (NVML does not see a GPU bound to `vfio-pci`).
//!
//! - [`scan`] lists NVIDIA's GPUs under `<sysfs>/bus/pci/devices` in NVIDIA's order (go-nvlib's
//!   `nvpci`: vendor 0x10de, class VGA or 3D controller, no virtual functions, sorted by bus id),
//!   with their driver, IOMMU group and what else is in it.
//! - [`bind`] moves a function to another driver the way the kernel documents it
//!   (`driver_override`, `unbind`, `drivers_probe`).
//! - [`VfioAliases`] picks the VFIO driver a function goes to a virtual machine through, as
//!   go-nvlib's `FindBestVFIOVariant` does: the `vfio_pci:` alias of the running kernel's
//!   `modules.alias` that matches the function's `modalias` with the fewest wildcards (Linux's
//!   `nvgrace_gpu_vfio_pci` for Grace-attached GPUs), else plain `vfio-pci`.
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
/// The plain VFIO driver, as its sysfs folder is named (its module is `vfio_pci`).
pub const VFIO_PCI: &str = "vfio-pci";
/// Where the kernel's modules (and their `modules.alias`) are, per release.
pub const MODULES_ROOT: &str = "/lib/modules";
/// PCI device ids of the GPUs Linux's `nvgrace_gpu_vfio_pci` drives (its device table as of
/// 6.18): GH200 120GB, 480GB and another SKU, GB200, GB300 — the Grace-attached GPUs.
pub const NVGRACE_DEVICE_IDS: [u16; 5] = [0x2342, 0x2345, 0x2348, 0x2941, 0x31c2];
/// The `modules.alias` lines of VFIO variant drivers.
const VFIO_ALIAS_PREFIX: &str = "alias vfio_pci:";

fn vfio_pci() -> String {
    VFIO_PCI.to_string()
}

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
    /// `vfioN` of `/dev/vfio/devices/vfioN` (the iommufd cdev), while bound to a VFIO driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio_cdev: Option<String>,
    /// The VFIO driver a virtual machine gets it through, as its `bus/pci/drivers` folder is
    /// named: a variant the kernel's module aliases name for this function, else `vfio-pci`.
    #[serde(default = "vfio_pci")]
    pub vfio_driver: String,
    /// Whether that driver is loaded (its `bus/pci/drivers` folder exists).
    #[serde(default)]
    pub vfio_driver_loaded: bool,
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
                p.class != BRIDGE_CLASS
                    && p.driver
                        .as_deref()
                        .is_some_and(|d| d != VFIO_PCI && d != self.vfio_driver)
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

/// The `resource.kubernetes.io/pcieRoot` of a PCI device (`pci<domain>:<bus>`), or none
/// (logged) where Kubernetes' helper has none: the attribute other drivers' devices are matched
/// on, so it is derived exactly as `deviceattribute.GetPCIeRootAttributeByPCIBusID` derives it,
/// which NVIDIA's driver and NIC drivers call.
pub fn pcie_root(sysfs_root: &Path, bus_id: &str) -> Option<String> {
    match resolve_pcie_root(sysfs_root, bus_id) {
        Ok(root) => Some(root),
        Err(e) => {
            tracing::warn!(bus_id, error = %e, "no PCIe root for the device, publishing it without the attribute");
            None
        }
    }
}

/// `GetPCIeRootAttributeByPCIBusID` (k8s.io/dynamic-resource-allocation/deviceattribute
/// v0.37): the bus ID in extended BDF form; `bus/pci/devices/<id>` links to
/// `devices/pci<root>/…/<id>`; the root is the first folder under `devices`.
fn resolve_pcie_root(sysfs_root: &Path, bus_id: &str) -> Result<String, String> {
    if bus_id.is_empty() {
        return Err("PCI Bus ID cannot be empty".into());
    }
    if !is_extended_bdf(bus_id) {
        return Err(format!("invalid PCI Bus ID format: {bus_id}"));
    }
    let link = Path::new("bus/pci/devices").join(bus_id);
    let target = std::fs::read_link(sysfs_root.join(&link)).map_err(|e| {
        format!(
            "failed to resolve PCIe Root Complex for PCI Bus ID {bus_id}: failed to read symlink for PCI Bus ID {}: {e}",
            link.display()
        )
    })?;
    // Go's filepath.Clean of the link's folder joined with a relative target; an absolute
    // target is taken as it is (and then fails the prefix check, as in Go).
    let target = if target.is_absolute() {
        target.to_string_lossy().into_owned()
    } else {
        let mut parts: Vec<String> = vec!["bus".into(), "pci".into(), "devices".into()];
        for c in target.components() {
            match c {
                std::path::Component::ParentDir if parts.last().is_some_and(|p| p != "..") => {
                    parts.pop();
                }
                std::path::Component::CurDir => {}
                other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
            }
        }
        parts.join("/")
    };
    let invalid = |rule: String| {
        format!(
            "failed to resolve PCIe Root Complex for PCI Bus ID {bus_id}: symlink target for PCI Bus ID {bus_id} is invalid: {rule}: {target}"
        )
    };
    if !target.starts_with("devices/pci") {
        return Err(invalid("it must start with devices/pci".into()));
    }
    if target.rsplit('/').next() != Some(bus_id) {
        return Err(invalid(format!("it must end with {bus_id}")));
    }
    let under_devices = target.trim_start_matches("devices/");
    Ok(under_devices
        .split('/')
        .next()
        .unwrap_or(under_devices)
        .to_string())
}

/// `^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$` (deviceattribute's `verifyPCIBDFFormat`).
fn is_extended_bdf(bus_id: &str) -> bool {
    let b = bus_id.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        r.into_iter()
            .all(|i| matches!(b[i], b'0'..=b'9' | b'a'..=b'f'))
    };
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && hex(11..12)
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

/// A PCI modalias (`pci:v<vendor>d<device>sv<subvendor>sd<subdevice>bc<class>sc<subclass>i<if>`),
/// field by field; in `modules.alias` a field may be `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModAlias {
    fields: [String; 7],
}

impl ModAlias {
    /// Parses a function's `modalias` (`pci:v...`) or an alias's pattern (`vfio_pci:v...`).
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let (_, rest) = text.split_once("pci:")?;
        let mut rest = rest.strip_prefix('v')?;
        let mut fields: [String; 7] = Default::default();
        for (field, delimiter) in fields.iter_mut().zip(["d", "sv", "sd", "bc", "sc", "i"]) {
            let (value, after) = rest.split_once(delimiter)?;
            *field = value.to_string();
            rest = after;
        }
        fields[6] = rest.to_string();
        Some(Self { fields })
    }

    /// The modalias the kernel gives a function with these ids (upper-case hex, as it writes).
    pub fn of(vendor: u16, device: u16, subsystem: (u16, u16), class: u32) -> String {
        format!(
            "pci:v{vendor:08X}d{device:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02X}",
            subsystem.0,
            subsystem.1,
            (class >> 16) & 0xFF,
            (class >> 8) & 0xFF,
            class & 0xFF
        )
    }

    /// Whether `pattern` matches this function, and with how many wildcard fields.
    fn matched_by(&self, pattern: &ModAlias) -> Option<usize> {
        let mut wildcards = 0;
        for (value, wanted) in self.fields.iter().zip(&pattern.fields) {
            if wanted == "*" {
                wildcards += 1;
            } else if value != wanted {
                return None;
            }
        }
        Some(wildcards)
    }
}

/// The VFIO variant drivers the running kernel's modules declare (`alias vfio_pci:<pattern>
/// <module>` lines of `modules.alias`).
#[derive(Debug, Clone, Default)]
pub struct VfioAliases {
    aliases: Vec<(ModAlias, String)>,
}

impl VfioAliases {
    pub fn parse(text: &str) -> Self {
        let aliases = text
            .lines()
            .map(str::trim)
            .filter(|line| line.starts_with(VFIO_ALIAS_PREFIX))
            .filter_map(|line| {
                let mut parts = line.splitn(3, ' ');
                let (_, pattern, module) = (parts.next()?, parts.next()?, parts.next()?);
                Some((ModAlias::parse(pattern)?, module.trim().to_string()))
            })
            .collect();
        Self { aliases }
    }

    /// `<modules_root>/<running kernel's release>/modules.alias`.
    pub fn read(modules_root: &Path) -> Result<Self, String> {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_err(|e| format!("the kernel's release: {e}"))?;
        let path = modules_root.join(release.trim()).join("modules.alias");
        fs::read_to_string(&path)
            .map(|text| Self::parse(&text))
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The variant's module for a function (`modalias` as sysfs shows it): the matching alias
    /// with the fewest wildcards, the first of equals; `None`: plain `vfio-pci`.
    pub fn best(&self, modalias: &str) -> Option<&str> {
        let device = ModAlias::parse(modalias)?;
        let mut best: Option<(usize, &str)> = None;
        for (pattern, module) in &self.aliases {
            if let Some(wildcards) = device.matched_by(pattern)
                && best.is_none_or(|(fewest, _)| wildcards < fewest)
            {
                best = Some((wildcards, module));
            }
        }
        best.map(|(_, module)| module)
    }
}

/// A module's driver as `bus/pci/drivers` names it: the module name, or with `-` for `_` (the
/// kernel's module names have `_`, some drivers register with `-`, as `vfio-pci`). Whether it is
/// there (loaded).
fn driver_folder(sysfs_root: &Path, module: &str) -> (String, bool) {
    let drivers = sysfs_root.join("bus/pci/drivers");
    let dashed = module.replace('_', "-");
    for name in [module, dashed.as_str()] {
        if drivers.join(name).is_dir() {
            return (name.to_string(), true);
        }
    }
    let name = if module == "vfio_pci" {
        dashed
    } else {
        module.to_string()
    };
    (name, false)
}

/// The VFIO driver for a function with `modalias` (see [`PciGpu::vfio_driver`]).
pub fn vfio_driver(
    sysfs_root: &Path,
    aliases: &VfioAliases,
    modalias: Option<&str>,
) -> (String, bool) {
    let module = modalias.and_then(|m| aliases.best(m)).unwrap_or("vfio_pci");
    driver_folder(sysfs_root, module)
}

/// The VFIO driver of the function at `bus_id`, from its sysfs `modalias`.
pub fn function_vfio_driver(
    sysfs_root: &Path,
    aliases: &VfioAliases,
    bus_id: &str,
) -> (String, bool) {
    let modalias = fs::read_to_string(
        sysfs_root
            .join("bus/pci/devices")
            .join(bus_id)
            .join("modalias"),
    )
    .ok();
    vfio_driver(sysfs_root, aliases, modalias.as_deref())
}

/// The NVIDIA GPUs under `<sysfs_root>/bus/pci/devices`, in bus-id order, each with the VFIO
/// driver `aliases` choose for it.
pub fn scan(sysfs_root: &Path, aliases: &VfioAliases) -> Result<PciView, PciError> {
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
        let (vfio_driver, vfio_driver_loaded) = function_vfio_driver(sysfs_root, aliases, &bus_id);
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
            pcie_root: pcie_root(sysfs_root, &bus_id),
            addressable_memory: addressable_memory(&dir.join("resource")),
            vfio_cdev: fs::read_dir(dir.join("vfio-dev")).ok().and_then(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .find(|n| n.starts_with("vfio"))
            }),
            vfio_driver,
            vfio_driver_loaded,
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

    // Tests that scan the simulator's sysfs are in src/gpu/sim_tests.rs: the simulator renders
    // PCI views with this module, so this one does not import it back.

    /// Kubernetes' own cases (`TestGetPCIeRootAttributePCIBusID`, deviceattribute v0.37):
    /// the same folders and links, the same outcome, errors naming the same rule.
    #[test]
    fn pcie_root_follows_kubernetes_deviceattribute() {
        const ROOT: &str = "pci0000:00";
        const BRIDGE: &str = "0000:01:00.0";
        const ID: &str = "0000:02:00.0";
        // A sysfs with `devices/<root>/<bridge>/<leaf>` and bus/pci/devices/ID linking to it.
        let machine = |root: &str, leaf: &str| {
            let dir = tempfile::tempdir().expect("tempdir");
            let device = format!("devices/{root}/{BRIDGE}/{leaf}");
            std::fs::create_dir_all(dir.path().join(&device)).expect("mkdir");
            let bus = dir.path().join("bus/pci/devices");
            std::fs::create_dir_all(&bus).expect("mkdir");
            std::os::unix::fs::symlink(format!("../../../{device}"), bus.join(ID))
                .expect("symlink");
            dir
        };
        let valid = machine(ROOT, ID);
        assert_eq!(resolve_pcie_root(valid.path(), ID).as_deref(), Ok(ROOT));
        assert_eq!(pcie_root(valid.path(), ID).as_deref(), Some(ROOT));

        let empty = tempfile::tempdir().expect("tempdir");
        let error = |sysfs: &Path, id: &str| resolve_pcie_root(sysfs, id).expect_err(id);
        assert!(error(empty.path(), "").contains("PCI Bus ID cannot be empty"));
        assert!(
            error(empty.path(), "invalid-pci-id")
                .contains("invalid PCI Bus ID format: invalid-pci-id")
        );
        assert!(error(empty.path(), "0000:02:00.0").contains("No such file or directory"));
        let bad_prefix = machine("invalid-pci-root", ID);
        assert!(error(bad_prefix.path(), ID).contains(&format!(
            "symlink target for PCI Bus ID {ID} is invalid: it must start with"
        )));
        let bad_suffix = machine(ROOT, "0000:00:13.1");
        assert!(error(bad_suffix.path(), ID).contains(&format!(
            "symlink target for PCI Bus ID {ID} is invalid: it must end with"
        )));
        assert_eq!(pcie_root(bad_suffix.path(), ID), None);
        // Upper case is not extended BDF to Kubernetes either (NVML's IDs are lowered first).
        assert!(error(valid.path(), "0000:0A:00.0").contains("invalid PCI Bus ID format"));
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
    fn the_variant_matching_a_function_with_fewest_wildcards_wins() {
        let aliases = VfioAliases::parse(
            "alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia
alias vfio_pci:v000010DEd*sv*sd*bc03sc02i* broad_vfio_pci
alias vfio_pci:v000010DEd00002941sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci
alias vfio_pci:v000010DEd00002941sv000010DEsd*bc03sc*i* narrower_vfio_pci
alias vfio_pci:v000010DEd00002941sv000010DEsd*bc03sc*i* same_but_later_vfio_pci
alias vfio_pci:not-a-modalias broken
",
        );
        let gb200 = "pci:v000010DEd00002941sv000010DEsd00002046bc03sc02i00\n";
        // 3 wildcards beat 4 (broad) and 5 (nvgrace); the first of equals wins.
        assert_eq!(aliases.best(gb200), Some("narrower_vfio_pci"));
        let h100 = ModAlias::of(0x10de, 0x2330, (0x10de, 0x16c1), 0x03_02_00);
        assert_eq!(
            h100,
            "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"
        );
        assert_eq!(aliases.best(&h100), Some("broad_vfio_pci"));
        // Another class or vendor: no variant (plain vfio-pci); `pci:` aliases are not VFIO's.
        let audio = ModAlias::of(0x10de, 0x22e8, (0x10de, 0), 0x04_03_00);
        assert_eq!(aliases.best(&audio), None);
        assert_eq!(VfioAliases::default().best(gb200), None);
        assert_eq!(aliases.best("garbage"), None);
    }
}
