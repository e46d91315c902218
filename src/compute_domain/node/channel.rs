//! What a node publishes for `compute-domain.nvidia.com`: its channel slice, the clique it reads
//! from its GPUs' fabric info, and the channel major from `/proc/devices`.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::CHANNEL_0;
use crate::compute_domain::DRIVER_NAME;

/// A node's `compute-domain.nvidia.com` pool: channel 0 (`type: channel`, `id: 0`), as
/// NVIDIA's plugin publishes it (channels other than 0 are not; NVIDIA's `daemon-0`, which its
/// IMEX DaemonSet's pods claim, is not either: ours runs the domain's daemon itself), and, on
/// a node with multi-node NVLink, `cliqueID` (`<cluster UUID>.<clique id>`; ours: selectors may
/// keep a workload in one clique).
pub fn channel_slices(node_name: &str, clique: Option<&str>) -> Vec<ResourceSlice> {
    let options = crate::slices::SliceOptions::new(DRIVER_NAME, node_name);
    let mut attributes = BTreeMap::from([
        (
            "type".to_string(),
            DeviceAttribute {
                string: Some("channel".into()),
                ..DeviceAttribute::default()
            },
        ),
        (
            "id".to_string(),
            DeviceAttribute {
                int: Some(0),
                ..DeviceAttribute::default()
            },
        ),
    ]);
    if let Some(clique) = clique.filter(|c| !c.is_empty()) {
        attributes.insert(
            "cliqueID".to_string(),
            DeviceAttribute {
                string: Some(clique.to_string()),
                ..DeviceAttribute::default()
            },
        );
    }
    let device = Device {
        name: CHANNEL_0.into(),
        attributes: Some(attributes),
        ..Device::default()
    };
    vec![ResourceSlice {
        metadata: ObjectMeta {
            name: Some(crate::slices::slice_name(&options, 0)),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER_NAME.into(),
            node_name: Some(node_name.to_string()),
            pool: ResourcePool {
                name: node_name.to_string(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(vec![device]),
            ..ResourceSliceSpec::default()
        },
    }]
}

/// The major number `/proc/devices` lists for a character device.
pub(super) fn proc_devices_major(proc_devices: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(proc_devices).ok()?;
    text.lines()
        .take_while(|l| !l.starts_with("Block devices"))
        .filter_map(|l| l.trim().split_once(' '))
        .find(|(_, n)| n.trim() == name)
        .and_then(|(major, _)| major.parse().ok())
}

/// The node's clique from its GPUs' fabric info: `<cluster UUID>.<clique id>`, empty where no
/// GPU has multi-node NVLink. GPUs of one node in different cliques, or not yet registered with
/// the fabric manager, are an error: the node cannot join a domain then.
pub fn node_clique(gpus: &dyn crate::gpu::GpuControl) -> Result<String, String> {
    let inventory = gpus.inventory().map_err(|e| e.to_string())?;
    let mut cliques = BTreeSet::new();
    for gpu in &inventory.gpus {
        match gpus.fabric(gpu.minor).map_err(|e| e.to_string())? {
            None => {}
            Some(info) if info.state == crate::gpu::model::FabricState::Completed => {
                cliques.insert(info.clique());
            }
            Some(info) => {
                return Err(format!(
                    "GPU {}: NVLink fabric registration is {:?}, not completed",
                    gpu.minor, info.state
                ));
            }
        }
    }
    match cliques.len() {
        0 => Ok(String::new()),
        1 => Ok(cliques.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "the node's GPUs are in several NVLink cliques: {cliques:?}"
        )),
    }
}

/// The clique to keep after reading `read` where `known` was known: the first one read (even
/// none, a node without multi-node NVLink), then only another clique; a failed read or none
/// keeps the last.
pub(super) fn next_clique<E>(known: Option<&str>, read: Result<String, E>) -> Option<String> {
    let read = read.ok()?;
    match known {
        None => Some(read),
        Some(known) if !read.is_empty() && read != known => Some(read),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute_domain::CHANNEL_DEVICE;

    #[test]
    fn a_node_moved_to_another_clique_takes_it_and_a_failed_read_keeps_the_last() {
        let ok = |c: &str| Ok::<String, String>(c.to_string());
        assert_eq!(next_clique(None, ok("uuid.7")), Some("uuid.7".into()));
        assert_eq!(next_clique(None, ok("")), Some(String::new()));
        assert_eq!(next_clique(None, Err("registering")), None);
        assert_eq!(
            next_clique(Some("uuid.7"), ok("uuid.9")),
            Some("uuid.9".into())
        );
        assert_eq!(next_clique(Some("uuid.7"), ok("uuid.7")), None);
        assert_eq!(next_clique(Some("uuid.7"), ok("")), None);
        assert_eq!(next_clique(Some("uuid.7"), Err("lost")), None);
    }

    #[test]
    fn the_channel_major_comes_from_proc_devices() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("devices");
        std::fs::write(
            &path,
            "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps-imex-channels\n\nBlock devices:\n234 other\n",
        )
        .expect("write");
        assert_eq!(proc_devices_major(&path, CHANNEL_DEVICE), Some(234));
        assert_eq!(proc_devices_major(&path, "other"), None);
    }
}
