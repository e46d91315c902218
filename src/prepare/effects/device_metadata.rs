//! Device metadata files (KEP-5304, [`crate::prepare::metadata`]) of a claim's GPUs for virtual
//! machines: KubeVirt finds a GPU's PCI address for its virtual machine only there.
//!
//! Intent: the claim's devices bound to vfio-pci, in the checkpoint (their `vfio` records; the
//! files are found by the claim's UID, nothing else is recorded). Apply: one file per request,
//! with each device's published attributes, written after the devices are bound and before the
//! CDI spec that mounts them. Undo: the claim's files removed, right after its CDI spec. Adopt:
//! nothing at start; a rollback of an unfinished claim removes its files.
use super::{ClaimEffect, Host};
use crate::prepare::checkpoint::ClaimEntry;
use crate::prepare::error::PrepareError;
use crate::prepare::metadata::{MetadataDevice, MetadataStore};

/// Writes and removes a claim's device metadata files under one state folder.
pub struct DeviceMetadata<'a>(pub &'a MetadataStore);

impl ClaimEffect for DeviceMetadata<'_> {
    fn apply(&self, host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError> {
        let vm_devices = vm_metadata(host, claim);
        if !vm_devices.is_empty() {
            self.0.write(claim, &vm_devices)?;
        }
        Ok(())
    }

    fn undo(&self, _host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError> {
        self.0.remove(claim)?;
        Ok(())
    }
}

/// The metadata of a claim's GPUs for virtual machines: their published attributes.
fn vm_metadata(host: &dyn Host, claim: &ClaimEntry) -> Vec<MetadataDevice> {
    let mut devices = Vec::new();
    host.inspect_inventory(&mut |inventory| {
        devices = claim
            .devices
            .iter()
            .filter_map(|d| {
                let vfio = d.vfio.as_ref()?;
                let function = inventory.pci.by_bus_id(&vfio.bus_id)?;
                let device = crate::slices::passthrough::vfio_device(inventory, function);
                Some(MetadataDevice {
                    request: d.request_names.first()?.clone(),
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    attributes: device
                        .attributes
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(name, value)| (name.to_string(), value))
                        .collect(),
                })
            })
            .collect();
    });
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::mig::GpuMode;
    use crate::prepare::checkpoint::ClaimState;
    use crate::prepare::effects::test_host::{TestHost, record};

    #[test]
    fn a_claim_without_gpus_for_virtual_machines_gets_no_files() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MetadataStore::new(dir.path(), "gpu.nvidia.com");
        let claim = ClaimEntry {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "uid".into(),
            state: ClaimState::PrepareStarted,
            devices: vec![record("gpu-0")],
            pod_claim_name: None,
            taken_over: None,
            unknown: Default::default(),
        };
        DeviceMetadata(&store).apply(&host, &claim).expect("apply");
        assert!(
            std::fs::read_dir(dir.path())
                .expect("read")
                .next()
                .is_none(),
            "no metadata folder for a claim without vfio devices"
        );
        DeviceMetadata(&store).undo(&host, &claim).expect("undo");
    }
}
