//! A whole GPU handed to a virtual machine: bound to its VFIO driver (`vfio-pci`, or the variant
//! the kernel names for it, `nvgrace_gpu_vfio_pci` on Grace-attached GPUs) at prepare, back to
//! `nvidia` at unprepare.
//!
//! The intent ([`VfioRecord`](crate::prepare::checkpoint::VfioRecord): PCI address, IOMMU group,
//! the minor NVML knew) is in the checkpoint before the binding changes, and binding is
//! idempotent both ways, so undo is always "bind to `nvidia`, wait until NVML sees the GPU":
//! right after a crash before the bind, after it, or after the cdev was recorded.
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{ClaimDevice, DeviceEffect, Host};
use crate::gpu::sim::PciDriver;
use crate::prepare::failpoint::failpoint;
use crate::prepare::state::PrepareError;

/// How long a GPU's last processes get to exit before it leaves `nvidia` (NVIDIA's driver waits
/// 60 s; the kubelet's prepare call is shorter).
const IDLE_WAIT: Duration = Duration::from_secs(20);
/// How long the kernel gets to create `/dev/vfio/<group>`, and NVML to see a GPU come back.
const APPEAR_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

pub struct VfioBind;

fn failed(device: &ClaimDevice, reason: String) -> PrepareError {
    PrepareError::Device {
        device: device.record.device.clone(),
        reason,
    }
}

impl DeviceEffect for VfioBind {
    fn apply(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let Some(vfio) = &device.record.vfio else {
            return Ok(());
        };
        if let Some(minor) = vfio.minor {
            // MIG devices someone made since the GPU was published stay theirs.
            let inventory = host.gpus().inventory_of(&BTreeSet::from([minor]))?;
            let instances = inventory
                .gpus
                .iter()
                .filter(|g| g.pci_bus_id == vfio.bus_id)
                .flat_map(|g| g.mig.iter().flat_map(|m| m.instances.iter()))
                .count();
            if instances > 0 {
                return Err(failed(
                    device,
                    format!(
                        "GPU {} has {instances} MIG device(s); it cannot go to a virtual machine while they exist",
                        vfio.bus_id
                    ),
                ));
            }
            wait_idle(host, device, minor)?;
        }
        host.gpus().bind_pci(&vfio.bus_id, PciDriver::VfioPci)?;
        failpoint("prepare-vfio-bound");
        let group_node = format!("/dev/vfio/{}", vfio.iommu_group);
        if let Some(path) = host.host_dev_path(&group_node) {
            let deadline = Instant::now() + APPEAR_WAIT;
            while !path.exists() {
                if Instant::now() > deadline {
                    return Err(failed(
                        device,
                        format!(
                            "GPU {} is bound to its VFIO driver but {} did not appear within {}s",
                            vfio.bus_id,
                            path.display(),
                            APPEAR_WAIT.as_secs()
                        ),
                    ));
                }
                std::thread::sleep(POLL);
            }
        }
        // NVML no longer sees the GPU; the PCI view now has its iommufd cdev.
        let minors: BTreeSet<u32> = vfio.minor.into_iter().collect();
        host.refresh(&minors)?;
        let cdev = host
            .gpus()
            .inventory_of(&BTreeSet::new())?
            .pci
            .by_bus_id(&vfio.bus_id)
            .and_then(|f| f.vfio_cdev.clone());
        let (uid, index) = (device.uid, device.index);
        host.record(&mut |checkpoint| {
            if let Some(record) = checkpoint
                .claims
                .get_mut(uid)
                .and_then(|c| c.devices.get_mut(index))
                .and_then(|d| d.vfio.as_mut())
            {
                record.cdev = cdev.clone();
            }
        })
    }

    fn undo(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let Some(vfio) = &device.record.vfio else {
            return Ok(());
        };
        host.gpus().bind_pci(&vfio.bus_id, PciDriver::Nvidia)?;
        failpoint("rollback-vfio-unbound");
        // Back on nvidia, NVML sees it again once the module has initialized it.
        let deadline = Instant::now() + APPEAR_WAIT;
        let minor = loop {
            let inventory = host.gpus().inventory()?;
            if let Some(gpu) = inventory.gpus.iter().find(|g| g.pci_bus_id == vfio.bus_id) {
                break gpu.minor;
            }
            if Instant::now() > deadline {
                return Err(failed(
                    device,
                    format!(
                        "GPU {} is bound to nvidia again but NVML did not see it within {}s",
                        vfio.bus_id,
                        APPEAR_WAIT.as_secs()
                    ),
                ));
            }
            std::thread::sleep(POLL);
        };
        host.refresh(&BTreeSet::from([minor]))
    }
}

/// Waits until no process runs on the GPU: `nvidia` does not let go of a GPU in use.
fn wait_idle(host: &dyn Host, device: &ClaimDevice, minor: u32) -> Result<(), PrepareError> {
    let deadline = Instant::now() + IDLE_WAIT;
    loop {
        let pids = host.gpus().processes(minor)?;
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(failed(
                device,
                format!(
                    "GPU {minor} still runs processes {pids:?} after {}s; it cannot leave the nvidia driver while they do",
                    IDLE_WAIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(POLL * 5);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_host::{TestHost, first, record};
    use super::*;
    use crate::gpu::mig::GpuMode;
    use crate::prepare::checkpoint::{ClaimEntry, ClaimState, VfioRecord};

    fn vfio_record(host: &TestHost, minor: u32) -> crate::prepare::checkpoint::DeviceRecord {
        let inventory = host.sim.inventory().expect("inventory");
        let gpu = inventory
            .gpus
            .iter()
            .find(|g| g.minor == minor)
            .expect("gpu");
        let function = inventory.pci.by_bus_id(&gpu.pci_bus_id).expect("function");
        let mut device = record(&format!("gpu-vfio-{}", function.index));
        device.vfio = Some(VfioRecord {
            bus_id: gpu.pci_bus_id.clone(),
            minor: Some(minor),
            iommu_group: function.iommu_group.expect("group"),
            cdev: None,
        });
        device
    }

    fn claim(host: &TestHost, device: &crate::prepare::checkpoint::DeviceRecord) {
        host.checkpoint.lock().expect("lock").claims.insert(
            "uid".into(),
            ClaimEntry {
                namespace: "ns".into(),
                name: "vm".into(),
                uid: "uid".into(),
                state: ClaimState::PrepareStarted,
                devices: vec![device.clone()],
                pod_claim_name: None,
                unknown: Default::default(),
            },
        );
    }

    #[test]
    fn binds_to_vfio_records_the_cdev_and_gives_the_gpu_back() {
        let host = TestHost::new("sim:2xH100-SXM5-80GB", GpuMode::Whole);
        let device = vfio_record(&host, 1);
        claim(&host, &device);
        VfioBind.apply(&host, &first(&device)).expect("apply");
        let inventory = host.sim.inventory().expect("inventory");
        assert_eq!(
            inventory.gpus.iter().map(|g| g.minor).collect::<Vec<_>>(),
            [0],
            "NVML no longer sees GPU 1"
        );
        assert_eq!(
            inventory.pci.gpus[1].driver.as_deref(),
            Some("vfio-pci"),
            "the PCI view shows the binding"
        );
        let recorded = host.checkpoint().claims["uid"].devices[0].clone();
        assert_eq!(
            recorded.vfio.as_ref().and_then(|v| v.cdev.as_deref()),
            Some("vfio1")
        );
        // Undo twice: the second finds it on nvidia already.
        for _ in 0..2 {
            VfioBind.undo(&host, &first(&recorded)).expect("undo");
            let inventory = host.sim.inventory().expect("inventory");
            assert_eq!(inventory.gpus.len(), 2, "GPU 1 is back in NVML");
            assert_eq!(inventory.pci.gpus[1].driver.as_deref(), Some("nvidia"));
        }
    }

    #[test]
    fn undo_before_the_bind_changes_nothing() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let device = vfio_record(&host, 0);
        VfioBind.undo(&host, &first(&device)).expect("undo");
        assert_eq!(host.sim.inventory().expect("inventory").gpus.len(), 1);
    }

    #[test]
    fn a_gpu_with_mig_devices_does_not_leave_nvidia() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        host.sim.set_mig_mode(0, true).expect("mig on");
        host.carve_first_profile(0);
        let device = vfio_record(&host, 0);
        claim(&host, &device);
        let error = VfioBind.apply(&host, &first(&device)).expect_err("refused");
        // A GPU instance without compute instances: the kernel side (simulator) refuses.
        assert!(error.to_string().contains("MIG device"), "{error}");
        assert_eq!(host.sim.drivers().expect("drivers")[0].1, PciDriver::Nvidia);
    }
}
