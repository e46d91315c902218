//! The PCI side of simulated GPUs: which kernel driver each is bound to (`nvidia` or VFIO for
//! passthrough), binding and unbinding as sysfs does, and the simulated sysfs and
//! `modules.alias` laid out for the driver's PCI scan.
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{SimNode, SimSpec, SimState, gpu_uuid, mig_err};
use crate::gpu::model::ComputeMode;
use crate::gpu::{GpuError, MigFailure};

/// The kernel driver a simulated GPU is bound to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PciDriver {
    /// NVIDIA's kernel module: NVML, CUDA and the device nodes `/dev/nvidia*`.
    #[default]
    Nvidia,
    /// For passthrough to a virtual machine: the function's VFIO driver (`vfio-pci`, or the
    /// variant the kernel's aliases name for it, `nvgrace_gpu_vfio_pci` on Grace-attached GPUs):
    /// `/dev/vfio/<IOMMU group>`, no NVML.
    VfioPci,
}

/// The simulated kernel's `modules.alias` (its VFIO lines and one other): Linux's nvgrace-gpu
/// variant for every Grace-attached GPU, and another vendor's variant, so that a match must be
/// exact.
pub fn sim_modules_alias() -> String {
    let mut text: String = crate::gpu::pci::NVGRACE_DEVICE_IDS
        .iter()
        .map(|id| {
            format!("alias vfio_pci:v000010DEd0000{id:04X}sv*sd*bc*sc*i* nvgrace_gpu_vfio_pci\n")
        })
        .collect();
    text.push_str("alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci\n");
    text.push_str("alias pci:v000010DEd*sv*sd*bc03sc*i* nvidia\n");
    text
}

/// [`sim_modules_alias`]'s VFIO aliases, parsed once.
pub fn sim_vfio_aliases() -> &'static crate::gpu::pci::VfioAliases {
    static ALIASES: std::sync::LazyLock<crate::gpu::pci::VfioAliases> =
        std::sync::LazyLock::new(|| crate::gpu::pci::VfioAliases::parse(&sim_modules_alias()));
    &ALIASES
}

/// The drivers the simulated kernel has loaded (`bus/pci/drivers/<name>`).
const SIM_PCI_DRIVERS: [&str; 3] = ["nvidia", "vfio-pci", "nvgrace_gpu_vfio_pci"];

/// The modalias the simulated kernel shows for a GPU with `pci_id` (`device << 16 | vendor`):
/// NVIDIA's subsystem, a 3D controller.
pub fn sim_modalias(pci_id: u32) -> String {
    crate::gpu::pci::ModAlias::of(
        (pci_id & 0xFFFF) as u16,
        (pci_id >> 16) as u16,
        (crate::gpu::pci::NVIDIA_VENDOR, 0x1234),
        0x03_02_00,
    )
}

/// The sysfs name of the driver a simulated GPU with `pci_id` is bound to.
fn sim_driver_name(driver: PciDriver, pci_id: u32) -> String {
    match driver {
        PciDriver::Nvidia => "nvidia".into(),
        PciDriver::VfioPci => sim_vfio_aliases()
            .best(&sim_modalias(pci_id))
            .unwrap_or(crate::gpu::pci::VFIO_PCI)
            .to_string(),
    }
}

impl PciDriver {
    pub(super) fn is_nvidia(&self) -> bool {
        *self == Self::Nvidia
    }

    /// The driver's name in sysfs (`/sys/bus/pci/drivers/<name>`).
    pub fn sysfs_name(&self) -> &'static str {
        match self {
            Self::Nvidia => "nvidia",
            Self::VfioPci => "vfio-pci",
        }
    }
}

impl std::str::FromStr for PciDriver {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nvidia" => Ok(Self::Nvidia),
            "vfio-pci" => Ok(Self::VfioPci),
            other => Err(format!("{other:?}: the drivers are nvidia and vfio-pci")),
        }
    }
}

/// How long the simulated kernel lets an unbind of a held GPU wait before failing it (a real one
/// waits forever; the simulation must end).
pub const UNBIND_STUCK_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// PCI buses of an HGX baseboard's eight GPUs, repeated per PCI domain for larger fleets.
const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// Deterministic PCI placement of simulated GPU `index`: (bus id, PCIe root, NUMA node).
pub fn sim_pci_location(index: u32) -> (String, String, i64) {
    let domain = index / 8;
    let bus = HGX_BUSES[(index % 8) as usize];
    (
        format!("{domain:04x}:{bus:02x}:00.0"),
        format!("pci{domain:04x}:{:02x}", bus - 3),
        ((index % 8) / 4) as i64,
    )
}

/// Lays out the sysfs of `spec`'s simulated GPUs under `root`, every one bound to `nvidia`, so
/// NVML-backed discovery finds the same PCIe roots the simulator reports (see [`render_sysfs`]).
pub fn write_fake_sysfs(root: &Path, spec: &SimSpec) -> std::io::Result<()> {
    let gpus: Vec<(u32, PciDriver)> = (0..spec.gpu_count())
        .map(|i| (i, PciDriver::Nvidia))
        .collect();
    render_sysfs(root, &gpus, |index| {
        spec.models().nth(index as usize).map(|m| m.pci_device_id)
    })
}

/// The IOMMU group of a simulated GPU: one group per GPU, as on servers with ACS.
pub fn sim_iommu_group(index: u32) -> u32 {
    40 + index
}

/// Lays out, for GPUs `(index, driver)`, what the kernel shows of them in sysfs: the function's
/// folder under its PCIe root (`vendor`, `device`, `class`, `numa_node`, `driver_override`, the
/// `driver` and `iommu_group` links), `bus/pci/devices/<bdf>`, `bus/pci/drivers/<driver>/<bdf>`
/// with the drivers' `bind`/`unbind` files, and `kernel/iommu_groups/<group>/devices/<bdf>`.
/// `pci_id` gives a GPU's `device << 16 | vendor` (0x10de: NVIDIA's vendor id when unknown).
/// Run again after a binding changes: links are replaced.
pub fn render_sysfs(
    root: &Path,
    gpus: &[(u32, PciDriver)],
    pci_id: impl Fn(u32) -> Option<u32>,
) -> std::io::Result<()> {
    let link = |target: &str, at: &Path| -> std::io::Result<()> {
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent)?;
        }
        let _ = fs::remove_file(at);
        std::os::unix::fs::symlink(target, at)
    };
    for name in SIM_PCI_DRIVERS {
        let dir = root.join("bus/pci/drivers").join(name);
        fs::create_dir_all(&dir)?;
        for file in ["bind", "unbind", "new_id"] {
            if !dir.join(file).exists() {
                fs::write(dir.join(file), "")?;
            }
        }
    }
    if !root.join("bus/pci/drivers_probe").exists() {
        fs::write(root.join("bus/pci/drivers_probe"), "")?;
    }
    for &(index, driver) in gpus {
        let (bus_id, pcie_root, numa_node) = sim_pci_location(index);
        let domain = &bus_id[..4];
        let bridge = format!("{domain}:{}:01.0", &pcie_root[pcie_root.len() - 2..]);
        let function = format!("devices/{pcie_root}/{bridge}/{bus_id}");
        let folder = root.join(&function);
        fs::create_dir_all(&folder)?;
        let id = pci_id(index).unwrap_or(0x10DE);
        let bound = sim_driver_name(driver, id);
        for (file, value) in [
            ("vendor", format!("0x{:04x}", id & 0xFFFF)),
            ("device", format!("0x{:04x}", id >> 16)),
            // A 3D controller: NVIDIA's data-center GPUs.
            ("class", "0x030200".to_string()),
            ("numa_node", numa_node.to_string()),
            ("modalias", sim_modalias(id)),
        ] {
            fs::write(folder.join(file), format!("{value}\n"))?;
        }
        // An H100's BARs: 16 MiB of registers (32-bit), 128 GiB and 32 MiB 64-bit windows.
        let base = 0x2200_0000_0000_u64 + u64::from(index) * 0x40_0000_0000;
        let bars = [
            (0xe200_0000_u64, 16 << 20, 0x0004_0200_u64),
            (base, 128 << 30, 0x0014_220c),
            (0, 0, 0),
            (base + (128 << 30), 32 << 20, 0x0014_220c),
        ];
        let resource: String = bars
            .iter()
            .map(|&(start, size, flags)| {
                let end = if size == 0 { 0 } else { start + size - 1 };
                format!("0x{start:016x} 0x{end:016x} 0x{flags:016x}\n")
            })
            .collect();
        fs::write(folder.join("resource"), resource)?;
        // The iommufd cdev of a function bound to vfio-pci.
        let _ = fs::remove_dir_all(folder.join("vfio-dev"));
        if driver == PciDriver::VfioPci {
            fs::create_dir_all(folder.join(format!("vfio-dev/vfio{index}")))?;
        }
        let override_file = folder.join("driver_override");
        let wanted = match driver {
            PciDriver::Nvidia => "(null)".to_string(),
            PciDriver::VfioPci => bound.clone(),
        };
        fs::write(override_file, format!("{wanted}\n"))?;
        let group = sim_iommu_group(index);
        link(
            &format!("../../../../kernel/iommu_groups/{group}"),
            &folder.join("iommu_group"),
        )?;
        link(
            &format!("../../../../bus/pci/drivers/{bound}"),
            &folder.join("driver"),
        )?;
        link(
            &format!("../../../{function}"),
            &root.join("bus/pci/devices").join(&bus_id),
        )?;
        link(
            &format!("../../../../{function}"),
            &root.join(format!("kernel/iommu_groups/{group}/devices/{bus_id}")),
        )?;
        for name in SIM_PCI_DRIVERS {
            let at = root.join("bus/pci/drivers").join(name).join(&bus_id);
            if name == bound {
                link(&format!("../../../../{function}"), &at)?;
            } else {
                let _ = fs::remove_file(at);
            }
        }
    }
    Ok(())
}

impl SimNode {
    /// Binds a GPU's PCI function to another kernel driver, as writing `driver_override`,
    /// `unbind` and `drivers_probe` in sysfs does. Leaving `nvidia` needs the GPU idle (no MIG
    /// device, no MPS daemon, not lost: NVIDIA's module refuses to let go of a GPU in use);
    /// coming back to it initializes the GPU as a reset does (instances, compute mode,
    /// time-slice and memory limits gone; a pending MIG mode applied).
    pub fn bind_driver(&self, minor: u32, driver: PciDriver) -> Result<(), GpuError> {
        const OP: &str = "bind the PCI function";
        self.model(minor, OP)?;
        if driver != PciDriver::Nvidia {
            self.unbind_waits_for_holders(minor)?;
        }
        self.write(|state| {
            let uuid = gpu_uuid(&self.node_name, minor);
            let daemons = state.mps_daemons.iter().any(|d| d.devices.contains(&uuid));
            let gpu = state
                .gpus
                .iter_mut()
                .find(|g| g.minor == minor)
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotFound, "no such GPU"))?;
            if gpu.driver == driver {
                return Ok(());
            }
            if gpu.driver == PciDriver::Nvidia {
                let busy = if gpu.lost {
                    Some("the GPU is lost")
                } else if !gpu.gpu_instances.is_empty() {
                    Some("MIG devices exist on it")
                } else if daemons {
                    Some("an MPS daemon uses it")
                } else {
                    None
                };
                if let Some(reason) = busy {
                    return Err(mig_err(minor, OP, MigFailure::InUse, reason));
                }
                // Off `nvidia` there is no device file to hold (the unbind waited for them).
                gpu.holders.clear();
                gpu.persistence = false;
            } else {
                gpu.gpu_instances.clear();
                gpu.mig_current = gpu.mig_pending;
                gpu.compute_mode = ComputeMode::Default;
                gpu.timeslice = 0;
                gpu.volatile_dbe = 0;
                gpu.recovery_action = 0;
                gpu.memory_limits.clear();
                gpu.processes.clear();
            }
            gpu.driver = driver;
            Ok(())
        })
    }

    /// The kernel's `nv_pci_remove`: an unbind from `nvidia` sleeps until nothing holds the GPU
    /// open. It is recorded in [`SimState::stuck_unbinds`] and waited out here for at most
    /// [`UNBIND_STUCK_LIMIT`] (a real kernel waits forever), then fails.
    fn unbind_waits_for_holders(&self, minor: u32) -> Result<(), GpuError> {
        let on_nvidia = |state: &SimState| {
            state
                .gpus
                .iter()
                .any(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
        };
        let (held, leaving) =
            self.read(|state| Ok((self.holders_in(state, minor), on_nvidia(state))))?;
        if held.is_empty() || !leaving {
            return Ok(());
        }
        let what = format!(
            "GPU {minor}: unbind from nvidia while held open by {}",
            crate::gpu::holders::describe(&held)
        );
        tracing::error!(
            gpu = minor,
            "simulated kernel: {what}; the unbind waits until they close it"
        );
        self.write(|state| {
            state.stuck_unbinds.push(what.clone());
            Ok(())
        })?;
        let started = std::time::Instant::now();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let held = self.read(|state| Ok(self.holders_in(state, minor)))?;
            if held.is_empty() {
                return Ok(());
            }
            if started.elapsed() >= UNBIND_STUCK_LIMIT {
                return Err(mig_err(
                    minor,
                    "bind the PCI function",
                    MigFailure::InUse,
                    &format!(
                        "the simulated kernel's unbind waited {}s for {} to close the GPU (a real kernel waits forever)",
                        UNBIND_STUCK_LIMIT.as_secs(),
                        crate::gpu::holders::describe(&held)
                    ),
                ));
            }
        }
    }

    /// The kernel driver each GPU is bound to, by minor.
    pub fn drivers(&self) -> Result<Vec<(u32, PciDriver)>, GpuError> {
        self.read(|state| Ok(state.gpus.iter().map(|g| (g.minor, g.driver)).collect()))
    }

    /// Lays out this node's sysfs under `root` as the kernel would show it now (the bindings
    /// included); see [`render_sysfs`].
    pub fn write_sysfs(&self, root: &Path) -> Result<(), GpuError> {
        let drivers = self.drivers()?;
        render_sysfs(root, &drivers, |index| {
            self.spec
                .models()
                .nth(index as usize)
                .map(|m| m.pci_device_id)
        })
        .map_err(|e| GpuError::State {
            path: root.to_path_buf(),
            reason: format!("writing the simulated sysfs: {e}"),
        })
    }

    /// Writes the simulated kernel's `modules.alias` ([`sim_modules_alias`]) where
    /// [`crate::gpu::pci::VfioAliases::read`] looks under `modules_root` (the running kernel's
    /// release folder).
    pub fn write_modules(modules_root: &Path) -> Result<(), GpuError> {
        let failed = |reason: String| GpuError::State {
            path: modules_root.to_path_buf(),
            reason,
        };
        let release = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_err(|e| failed(format!("the kernel's release: {e}")))?;
        let dir = modules_root.join(release.trim());
        fs::create_dir_all(&dir)
            .and_then(|()| fs::write(dir.join("modules.alias"), sim_modules_alias()))
            .map_err(|e| failed(format!("writing modules.alias: {e}")))
    }

    /// What [`crate::gpu::pci::scan`] finds in this node's sysfs ([`render_sysfs`]).
    pub(super) fn pci_view(&self, state: &SimState) -> crate::gpu::pci::PciView {
        let gpus = self
            .spec
            .models()
            .enumerate()
            .map(|(index, model)| {
                let index = index as u32;
                let (bus_id, pcie_root, numa_node) = sim_pci_location(index);
                let driver = state
                    .gpus
                    .iter()
                    .find(|g| g.minor == index)
                    .map_or(PciDriver::Nvidia, |g| g.driver);
                crate::gpu::pci::PciGpu {
                    index,
                    bus_id,
                    vendor_id: crate::gpu::pci::NVIDIA_VENDOR,
                    device_id: (model.pci_device_id >> 16) as u16,
                    driver: Some(sim_driver_name(driver, model.pci_device_id)),
                    iommu_group: Some(sim_iommu_group(index)),
                    group_peers: vec![],
                    numa_node: Some(numa_node),
                    pcie_root: Some(pcie_root),
                    // render_sysfs's BARs: 128 GiB + 32 MiB.
                    addressable_memory: 256 << 30,
                    vfio_cdev: (driver == PciDriver::VfioPci).then(|| format!("vfio{index}")),
                    vfio_driver: sim_driver_name(PciDriver::VfioPci, model.pci_device_id),
                    vfio_driver_loaded: true,
                }
            })
            .collect();
        crate::gpu::pci::PciView {
            gpus,
            iommu: true,
            iommufd: false,
        }
    }

    /// Binds the GPU at PCI address `bus_id` to `driver` (see [`bind_driver`](Self::bind_driver)).
    pub fn bind_pci(&self, bus_id: &str, driver: PciDriver) -> Result<(), GpuError> {
        let index = (0..self.spec.models().count() as u32)
            .find(|&i| sim_pci_location(i).0 == bus_id)
            .ok_or_else(|| {
                GpuError::Pci(crate::gpu::pci::PciError::Bind {
                    bus_id: bus_id.to_string(),
                    reason: "no such simulated GPU".into(),
                })
            })?;
        self.bind_driver(index, driver)
    }
}
