//! The simulated node's place in a multi-node NVLink fabric (NVL72 racks).
use super::SimNode;
use crate::gpu::GpuError;
use crate::gpu::catalog::SimModel;
use crate::gpu::model::{FabricInfo, FabricState};

/// Models whose GPUs sit in a multi-node NVLink fabric (NVL72 racks).
pub fn multi_node_nvlink(model: &SimModel) -> bool {
    model.key.starts_with("GB")
}

/// A simulated rack's fabric unless told otherwise: one cluster, clique 1, registered.
pub fn default_fabric() -> FabricInfo {
    FabricInfo {
        cluster_uuid: "7f1f1a8e-5b7d-4c1e-9a34-0c2e6d0b7201".into(),
        clique_id: 1,
        state: FabricState::Completed,
    }
}

impl SimNode {
    /// The GPU's fabric info as NVML reports it: the node's, on models with multi-node NVLink
    /// (Grace Blackwell); none elsewhere.
    pub fn fabric(&self, minor: u32) -> Result<Option<FabricInfo>, GpuError> {
        let model = self.model(minor, "fabric info")?;
        if !multi_node_nvlink(model) {
            return Ok(None);
        }
        self.read(|state| {
            if state.gpus.iter().any(|g| g.minor == minor && g.lost) {
                return Err(GpuError::Nvml {
                    operation: format!("GPU {minor}: fabric info"),
                    reason: "GPU is lost".into(),
                });
            }
            Ok(Some(state.fabric.clone().unwrap_or_else(default_fabric)))
        })
    }

    /// Puts the node into another NVLink clique or fabric state (`gpu-dra sim fabric`).
    pub fn set_fabric(&self, fabric: FabricInfo) -> Result<(), GpuError> {
        self.write(|state| {
            state.fabric = Some(fabric);
            Ok(())
        })
    }
}
