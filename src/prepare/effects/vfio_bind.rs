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
use crate::gpu::holders::{self, GpuHolder};
use crate::gpu::sim::PciDriver;
use crate::prepare::error::PrepareError;
use crate::prepare::failpoint::failpoint;

/// How long a GPU gets to be let go of (its processes to exit, other holders to close it) before
/// the claim is refused naming them. NVIDIA's driver waits 60 s; the kubelet's prepare call is
/// shorter, and it retries.
const RELEASE_WAIT: Duration = Duration::from_secs(20);
/// How long this driver's own NVML calls in flight get to end before its session closes.
const SESSION_CLOSE_WAIT: Duration = Duration::from_secs(10);
/// How long the kernel gets to create `/dev/vfio/<group>`, and NVML to see a GPU come back.
const APPEAR_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

pub struct VfioBind {
    /// How long the GPU gets to be let go of ([`RELEASE_WAIT`] in the driver).
    pub release_wait: Duration,
}

/// The effect as the driver applies it.
pub const VFIO_BIND: VfioBind = VfioBind {
    release_wait: RELEASE_WAIT,
};

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
        // Still on `nvidia` (not after a crash past the bind): let go of it first.
        let on_nvidia = match vfio.minor {
            Some(minor) => {
                let inventory = host.gpus().inventory_of(&BTreeSet::from([minor]))?;
                let gpu = inventory.gpus.iter().find(|g| g.pci_bus_id == vfio.bus_id);
                // MIG devices someone made since the GPU was published stay theirs.
                let instances = gpu
                    .iter()
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
                gpu.map(|_| minor)
            }
            None => None,
        };
        match on_nvidia {
            Some(minor) => release_and_bind(host, device, minor, self.release_wait)?,
            None => host.gpus().bind_pci(&vfio.bus_id, PciDriver::VfioPci)?,
        }
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
            if let Some(record) = vfio_record(checkpoint, uid, index) {
                record.cdev = cdev.clone();
            }
        })
    }

    fn undo(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let Some(vfio) = &device.record.vfio else {
            return Ok(());
        };
        {
            // NVML enumerates when its session opens: one opened while the GPU was away would
            // never see it back. The session is closed across the rebind and opens anew after.
            let _closed = host
                .gpus()
                .close_session(SESSION_CLOSE_WAIT)
                .map_err(|e| failed(device, format!("GPU {}: {e}", vfio.bus_id)))?;
            host.gpus().bind_pci(&vfio.bus_id, PciDriver::Nvidia)?;
        }
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
        if vfio.persistence && !host.gpus().persistence_mode(minor)? {
            host.gpus().set_persistence_mode(minor, true)?;
        }
        host.refresh(&BTreeSet::from([minor]))
    }
}

fn vfio_record<'a>(
    checkpoint: &'a mut crate::prepare::checkpoint::Checkpoint,
    uid: &str,
    index: usize,
) -> Option<&'a mut crate::prepare::checkpoint::VfioRecord> {
    checkpoint
        .claims
        .get_mut(uid)
        .and_then(|c| c.devices.get_mut(index))
        .and_then(|d| d.vfio.as_mut())
}

/// Lets go of a GPU on `nvidia` and binds it to its VFIO driver. The kernel's unbind sleeps
/// until nothing holds the GPU open, forever and holding every lock of the claim, so nothing may
/// when it is written: processes on the GPU, persistence mode, other processes with its device
/// file open (DCGM, monitoring agents), and this driver's own NVML session and event set. Each
/// is waited for within [`RELEASE_WAIT`]; what is left is named in the claim's error, and the
/// GPU stays where it was.
fn release_and_bind(
    host: &dyn Host,
    device: &ClaimDevice,
    minor: u32,
    wait: Duration,
) -> Result<(), PrepareError> {
    let Some(vfio) = &device.record.vfio else {
        return Ok(());
    };
    let deadline = Instant::now() + wait;
    wait_idle(host, device, minor, deadline)?;
    if host.gpus().persistence_mode(minor)? {
        // Recorded before it changes, so that a crash from here on still turns it back on.
        let (uid, index) = (device.uid, device.index);
        host.record(&mut |checkpoint| {
            if let Some(record) = vfio_record(checkpoint, uid, index) {
                record.persistence = true;
            }
        })?;
        host.gpus().set_persistence_mode(minor, false)?;
    }
    let own = std::process::id();
    let others = || -> Result<Vec<GpuHolder>, PrepareError> {
        let mut holders = host.gpus().open_holders(minor)?;
        holders.retain(|h| h.pid != Some(own));
        Ok(holders)
    };
    wait_until(deadline, others).map_err(|held| held_open(device, vfio, minor, &held))?;
    // Last, this driver's own handles, for as short a time as can be: every other NVML call of
    // the driver waits while the session is closed.
    let closed = host.gpus().close_session(SESSION_CLOSE_WAIT).map_err(|e| {
        failed(
            device,
            format!("GPU {} cannot leave nvidia: {e}", vfio.bus_id),
        )
    })?;
    failpoint("prepare-vfio-released");
    let held = host.gpus().open_holders(minor)?;
    if !held.is_empty() {
        return Err(held_open(device, vfio, minor, &held));
    }
    host.gpus().bind_pci(&vfio.bus_id, PciDriver::VfioPci)?;
    drop(closed);
    Ok(())
}

fn held_open(
    device: &ClaimDevice,
    vfio: &crate::prepare::checkpoint::VfioRecord,
    minor: u32,
    held: &[GpuHolder],
) -> PrepareError {
    failed(
        device,
        format!(
            "GPU {minor} ({}) is held open by {}; it cannot leave the nvidia driver while anything has /dev/nvidia{minor} open (the kernel would wait for it forever)",
            vfio.bus_id,
            holders::describe(held)
        ),
    )
}

/// Polls `look` until it finds nothing or `deadline` passes; then, what it found last.
fn wait_until(
    deadline: Instant,
    look: impl Fn() -> Result<Vec<GpuHolder>, PrepareError>,
) -> Result<(), Vec<GpuHolder>> {
    loop {
        match look() {
            Ok(found) if found.is_empty() => return Ok(()),
            Ok(found) if Instant::now() >= deadline => return Err(found),
            Ok(_) => {}
            Err(error) if Instant::now() >= deadline => {
                return Err(vec![GpuHolder {
                    pid: None,
                    name: format!("unknown ({error})"),
                }]);
            }
            Err(_) => {}
        }
        std::thread::sleep(POLL * 5);
    }
}

/// Waits until no process runs on the GPU: `nvidia` does not let go of a GPU in use.
fn wait_idle(
    host: &dyn Host,
    device: &ClaimDevice,
    minor: u32,
    deadline: Instant,
) -> Result<(), PrepareError> {
    loop {
        let pids = host.gpus().processes(minor)?;
        if pids.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(failed(
                device,
                format!(
                    "GPU {minor} still runs processes {pids:?}; it cannot leave the nvidia driver while they do"
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
    use crate::gpu::sim::SimHolder;
    use crate::prepare::checkpoint::{ClaimEntry, ClaimState, VfioRecord};
    use crate::prepare::effects::Host;

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
            persistence: false,
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
                taken_over: None,
                unknown: Default::default(),
            },
        );
    }

    #[test]
    fn binds_to_vfio_records_the_cdev_and_gives_the_gpu_back() {
        let host = TestHost::new("sim:2xH100-SXM5-80GB", GpuMode::Whole);
        let device = vfio_record(&host, 1);
        claim(&host, &device);
        VFIO_BIND.apply(&host, &first(&device)).expect("apply");
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
        assert!(host.sim.state().expect("state").stuck_unbinds.is_empty());
        // Undo twice: the second finds it on nvidia already.
        for _ in 0..2 {
            VFIO_BIND.undo(&host, &first(&recorded)).expect("undo");
            let inventory = host.sim.inventory().expect("inventory");
            assert_eq!(inventory.gpus.len(), 2, "GPU 1 is back in NVML");
            assert_eq!(inventory.pci.gpus[1].driver.as_deref(), Some("nvidia"));
        }
    }

    /// A process that holds GPU `minor` open (as DCGM would) until dropped.
    struct Holder(std::process::Child);
    impl Holder {
        fn start(host: &TestHost, minor: u32, name: &str) -> Self {
            let child = std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .expect("sleep");
            let holder = SimHolder::of_process(child.id(), name);
            host.sim
                .hold(&BTreeSet::from([minor]), &holder)
                .expect("hold");
            Self(child)
        }
    }
    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn the_simulated_kernel_holds_an_unbind_while_the_drivers_session_is_open() {
        // What the driver did before it closed its session: the unbind waits in the kernel.
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let sim = host.sim.clone();
        let unbind = std::thread::spawn(move || sim.bind_driver(0, PciDriver::VfioPci));
        while host.sim.state().expect("state").stuck_unbinds.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!unbind.is_finished(), "the unbind waits");
        let stuck = &host.sim.state().expect("state").stuck_unbinds[0];
        assert!(stuck.contains("gpu-dra (NVML session)"), "{stuck}");
        // Only the session's end lets it through.
        let closed = host
            .sim
            .close_session(Duration::from_secs(1))
            .expect("close");
        unbind
            .join()
            .expect("join")
            .expect("bound once the session closed");
        drop(closed);
        assert_eq!(
            host.sim.drivers().expect("drivers")[0].1,
            PciDriver::VfioPci
        );
    }

    #[test]
    fn a_gpu_another_process_holds_open_is_refused_naming_it_and_no_unbind_waits() {
        let host = TestHost::new("sim:2xH100-SXM5-80GB", GpuMode::Whole);
        let device = vfio_record(&host, 1);
        claim(&host, &device);
        let holder = Holder::start(&host, 1, "nv-hostengine");
        let quick = VfioBind {
            release_wait: Duration::from_millis(500),
        };
        let error = quick.apply(&host, &first(&device)).expect_err("refused");
        let text = error.to_string();
        assert!(
            text.contains(&format!("pid {} (nv-hostengine)", holder.0.id()))
                && text.contains("/dev/nvidia1"),
            "{text}"
        );
        let state = host.sim.state().expect("state");
        assert!(state.stuck_unbinds.is_empty(), "{:?}", state.stuck_unbinds);
        assert_eq!(host.sim.drivers().expect("drivers")[1].1, PciDriver::Nvidia);
        // The driver's session is open again: other GPUs are served.
        assert_eq!(host.gpus().inventory().expect("inventory").gpus.len(), 2);
        // Once the holder is gone the same claim goes through.
        drop(holder);
        quick.apply(&host, &first(&device)).expect("apply");
        assert_eq!(
            host.sim.drivers().expect("drivers")[1].1,
            PciDriver::VfioPci
        );
        assert!(host.sim.state().expect("state").stuck_unbinds.is_empty());
    }

    #[test]
    fn persistence_mode_is_turned_off_for_the_vm_and_on_again_when_the_gpu_returns() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        host.sim.set_persistence(0, true).expect("persistence on");
        let device = vfio_record(&host, 0);
        claim(&host, &device);
        VFIO_BIND.apply(&host, &first(&device)).expect("apply");
        assert!(host.sim.state().expect("state").stuck_unbinds.is_empty());
        let recorded = host.checkpoint().claims["uid"].devices[0].clone();
        assert!(
            recorded.vfio.as_ref().is_some_and(|v| v.persistence),
            "recorded before the change"
        );
        VFIO_BIND.undo(&host, &first(&recorded)).expect("undo");
        assert!(host.sim.persistence(0).expect("persistence"), "back on");
    }

    #[test]
    fn undo_before_the_bind_changes_nothing() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let device = vfio_record(&host, 0);
        VFIO_BIND.undo(&host, &first(&device)).expect("undo");
        assert_eq!(host.sim.inventory().expect("inventory").gpus.len(), 1);
    }

    #[test]
    fn a_gpu_with_mig_devices_does_not_leave_nvidia() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        host.sim.set_mig_mode(0, true).expect("mig on");
        host.carve_first_profile(0);
        let device = vfio_record(&host, 0);
        claim(&host, &device);
        let error = VFIO_BIND
            .apply(&host, &first(&device))
            .expect_err("refused");
        // A GPU instance without compute instances: the kernel side (simulator) refuses.
        assert!(error.to_string().contains("MIG device"), "{error}");
        assert_eq!(host.sim.drivers().expect("drivers")[0].1, PciDriver::Nvidia);
    }
}
