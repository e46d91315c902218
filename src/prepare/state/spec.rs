//! What a claim's CDI spec holds: its devices (GPUs, MIG devices, GPUs for virtual machines)
//! and the edits all its containers get.
use super::{Book, DeviceState};
use crate::prepare::cdi::{CdiDevice, ContainerEdits};
use crate::prepare::checkpoint::{ClaimEntry, DeviceRecord};
use crate::prepare::sharing;

impl DeviceState {
    /// A claim's spec content: its devices, and what all its containers get (the MPS daemon's
    /// pipe and shm when it has one).
    pub(super) fn claim_spec(
        &self,
        book: &Book,
        entry: &ClaimEntry,
    ) -> (Vec<CdiDevice>, ContainerEdits) {
        let has_daemon = entry
            .devices
            .iter()
            .any(|d| d.share_id.is_none() && sharing::wants_mps(d.config.as_ref()));
        let shared = entry.devices.iter().find(|d| sharing::shared_mps(d));
        let mut edits = match (&self.mps, shared) {
            (Some(mps), _) if has_daemon => mps.container_edits(&entry.uid),
            (Some(mps), Some(record)) => {
                let mut edits = mps.container_edits(&sharing::shared_daemon_key(&record.uuid));
                let shares = match self.config.consumable {
                    crate::slices::consumable::ConsumableShares::Shares(n) => Some(n),
                    _ => None,
                };
                edits.env.extend(sharing::shared_client_env(
                    record,
                    device_memory(book, &record.uuid),
                    shares,
                ));
                edits
            }
            _ => ContainerEdits::default(),
        };
        let (limits, _) = self.memory_limits.for_claim(&entry.devices);
        edits.env.extend(limits.env);
        edits.hooks.extend(limits.hooks);
        let vm_requests: Vec<&str> = entry
            .devices
            .iter()
            .filter(|d| d.vfio.is_some())
            .flat_map(|d| d.request_names.iter().map(String::as_str))
            .collect();
        edits
            .mounts
            .extend(self.metadata.mounts(entry, &vm_requests));
        (self.cdi_devices(book, entry), edits)
    }

    fn cdi_devices(&self, book: &Book, entry: &ClaimEntry) -> Vec<CdiDevice> {
        entry
            .devices
            .iter()
            .filter_map(|d| match &d.mig {
                _ if d.vfio.is_some() => vfio_cdi_device(book.inventory.pci.iommufd, d),
                Some(mig) => Some(CdiDevice::Mig {
                    name: d.device.clone(),
                    parent_minor: mig.parent_minor,
                    gpu_instance_id: mig.gpu_instance_id?,
                    compute_instance_id: mig.compute_instance_id?,
                    uuid: d.uuid.clone(),
                }),
                None => {
                    let minor = book
                        .inventory
                        .gpus
                        .iter()
                        .find(|g| g.uuid == d.uuid)
                        .map(|g| g.minor)?;
                    Some(CdiDevice::Gpu {
                        name: d.device.clone(),
                        minor,
                        uuid: d.uuid.clone(),
                    })
                }
            })
            .collect()
    }
}

/// Memory of the GPU or MIG device with this UUID.
fn device_memory(book: &Book, uuid: &str) -> u64 {
    book.inventory
        .gpus
        .iter()
        .find_map(|g| {
            if g.uuid == uuid {
                return g.memory_bytes;
            }
            let mig = g.mig.as_ref()?;
            let instance = mig.instances.iter().find(|i| i.uuid == uuid)?;
            Some(mig.profile_by_id(instance.profile_id)?.memory_bytes())
        })
        .unwrap_or_default()
}

/// The minor of the GPU a device name of ours is on (`gpu-<minor>` or a MIG device of it).
/// A GPU for a virtual machine in a claim's spec: through iommufd when the config prefers it and
/// the node has it (and the function its cdev), else through its legacy group node.
pub(crate) fn vfio_cdi_device(iommufd: bool, device: &DeviceRecord) -> Option<CdiDevice> {
    let vfio = device.vfio.as_ref()?;
    let config = match &device.config {
        Some(crate::config::DeviceConfig::VfioDeviceConfig(config)) => config.clone(),
        _ => Default::default(),
    };
    let cdev = vfio
        .cdev
        .as_ref()
        .filter(|_| config.backend() == crate::config::IommuBackend::PreferIommuFd && iommufd);
    Some(CdiDevice::Vfio {
        name: device.device.clone(),
        node: match cdev {
            Some(cdev) => format!("/dev/vfio/devices/{cdev}"),
            None => format!("/dev/vfio/{}", vfio.iommu_group),
        },
        api_device: config.api_device().then(|| {
            if cdev.is_some() {
                "/dev/iommu".to_string()
            } else {
                "/dev/vfio/vfio".to_string()
            }
        }),
    })
}
