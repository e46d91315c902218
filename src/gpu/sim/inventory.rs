//! What discovery sees of a simulated node: the device model built from the catalog and the
//! hardware state, with deterministic UUIDs.
use super::{PciDriver, SimGpuState, SimNode, SimState, sim_pci_location};
use crate::gpu::GpuError;
use crate::gpu::catalog::{self, SimModel};
use crate::gpu::mig::profile_name;
use crate::gpu::model::*;

/// NVML's CUDA driver version integer (`12040`) as major.minor.
pub fn cuda_version(encoded: i32) -> Version2 {
    let encoded = encoded.max(0) as u32;
    Version2::new(encoded / 1000, (encoded % 1000) / 10)
}

/// `GPU-<uuid>` derived from node name and minor, stable across restarts.
pub fn gpu_uuid(node_name: &str, minor: u32) -> String {
    let id = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("gpu-dra-sim/{node_name}/{minor}").as_bytes(),
    );
    format!("GPU-{id}")
}

/// Profile-table rows of `model` as the device model's GI profiles.
pub fn sim_profiles(model: &SimModel) -> Vec<GiProfile> {
    let device_bytes = model.memory_mib << 20;
    let Some(table) = &model.mig else {
        return vec![];
    };
    let mut profiles: Vec<GiProfile> = table
        .profiles
        .iter()
        .filter_map(|row| {
            Some(GiProfile {
                name: profile_name(row.profile_enum, row.memory_mib, device_bytes)?,
                profile_enum: row.profile_enum,
                id: row.id,
                slice_count: row.slice_count,
                instance_count: row.instance_count,
                memory_mib: row.memory_mib,
                multiprocessors: row.multiprocessors,
                copy_engines: row.copy_engines,
                decoders: row.decoders,
                encoders: row.encoders,
                jpeg_engines: row.jpeg_engines,
                ofa_engines: row.ofa_engines,
                p2p_supported: false,
                placements: row
                    .placement_starts
                    .iter()
                    .map(|&start| Placement {
                        start,
                        size: row.placement_size,
                    })
                    .collect(),
            })
        })
        .collect();
    profiles.sort_by_key(|p| p.profile_enum);
    profiles
}

fn sim_gpu(model: &SimModel, index: u32, node_name: &str, state: Option<&SimGpuState>) -> Gpu {
    let minor = index;
    let (pci_bus_id, pcie_root, numa_node) = sim_pci_location(index);
    let mig = model.mig.as_ref().map(|table| {
        let mut instances: Vec<MigInstance> = state
            .map(|s| {
                s.gpu_instances
                    .iter()
                    .flat_map(|gi| {
                        gi.compute_instances.iter().map(move |ci| MigInstance {
                            gpu_instance_id: gi.id,
                            compute_instance_id: ci.id,
                            profile_id: gi.profile_id,
                            placement: gi.placement,
                            uuid: ci.uuid.clone(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        instances.sort_by_key(|i| (i.gpu_instance_id, i.compute_instance_id));
        MigInfo {
            mode: MigMode {
                current: state.is_some_and(|s| s.mig_current),
                pending: state.is_some_and(|s| s.mig_pending),
            },
            memory_slices: table.memory_slices,
            profiles: sim_profiles(model),
            instances,
        }
    });
    Gpu {
        index,
        minor,
        uuid: gpu_uuid(node_name, minor),
        product_name: model.product_name.to_string(),
        brand: catalog::brand_name(model.brand).to_string(),
        architecture: model.architecture,
        cuda_compute_capability: model.compute_capability,
        memory_bytes: model.memory_bytes(),
        pci_bus_id,
        pcie_root: Some(pcie_root),
        numa_node: Some(numa_node),
        addressing_mode: model.addressing_mode(),
        mig,
    }
}

impl SimNode {
    /// What discovery sees now.
    pub fn inventory(&self) -> Result<NodeInventory, GpuError> {
        self.read(|state| Ok(self.inventory_of(state)))
    }

    fn inventory_of(&self, state: &SimState) -> NodeInventory {
        let mut gpus: Vec<Gpu> = self
            .spec
            .models()
            .enumerate()
            .filter_map(|(index, model)| {
                let minor = index as u32;
                let gpu_state = state.gpus.iter().find(|g| g.minor == minor);
                // NVML sees only GPUs bound to NVIDIA's kernel module.
                if gpu_state.is_some_and(|g| g.driver != PciDriver::Nvidia) {
                    return None;
                }
                Some(sim_gpu(model, minor, &self.node_name, gpu_state))
            })
            .collect();
        // NVML's indexes count the GPUs it sees.
        for (index, gpu) in gpus.iter_mut().enumerate() {
            gpu.index = index as u32;
        }
        NodeInventory {
            driver_version: catalog::SIM_DRIVER_VERSION.to_string(),
            cuda_driver_version: cuda_version(catalog::SIM_CUDA_DRIVER_VERSION),
            gpus,
            pci: self.pci_view(state),
        }
    }
}
