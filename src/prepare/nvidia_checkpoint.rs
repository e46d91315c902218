//! NVIDIA's driver's checkpoint (dra-driver-nvidia-gpu), read as far as taking its claims over
//! needs it ([`super::takeover`]): `{"checksum", "v1": {...}, "v2": {"preparedClaims": {uid:
//! claim}, "nodeBootID"}}`, v2 read first (v1 is its older copy of the completed claims).
//!
//! A leaf of its own: the checkpoint store ([`super::checkpoint`]) recognises NVIDIA's file when
//! it loads, and the takeover turns its claims into checkpoint entries; neither imports the other
//! through it.
use std::collections::BTreeMap;

use serde::Deserialize;

/// NVIDIA's checkpoint, as far as taking it over needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvidiaCheckpoint {
    /// Claims prepared (or being prepared) in this boot.
    pub claims: Vec<NvidiaClaim>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaClaim {
    pub uid: String,
    /// `PrepareCompleted` (v1 holds only those).
    pub completed: bool,
    /// Recorded by NVIDIA's driver only while a prepare runs; empty otherwise.
    pub namespace: String,
    pub name: String,
    pub(super) groups: Vec<Group>,
}

impl NvidiaClaim {
    /// `namespace/name (uid)`, or `claim uid` where NVIDIA's driver did not record the name.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            format!("claim {}", self.uid)
        } else {
            format!("{}/{} ({})", self.namespace, self.name, self.uid)
        }
    }
}

// NVIDIA's JSON, as its `MarshalCheckpoint` writes it (cmd/gpu-kubelet-plugin/checkpointv.go,
// prepared.go). Fields it may lack default; nothing of ours is checked against its checksum
// (a field added by a later release must not make the node unswitchable).
#[derive(Debug, Deserialize)]
struct Document {
    #[serde(default)]
    v1: Option<V1>,
    #[serde(default)]
    v2: Option<V2>,
}

#[derive(Debug, Deserialize)]
struct V1 {
    #[serde(rename = "preparedClaims", default)]
    prepared_claims: BTreeMap<String, Claim>,
}

#[derive(Debug, Deserialize)]
struct V2 {
    #[serde(rename = "preparedClaims", default)]
    prepared_claims: BTreeMap<String, Claim>,
    #[serde(rename = "nodeBootID", default)]
    node_boot_id: String,
}

#[derive(Debug, Deserialize)]
struct Claim {
    #[serde(rename = "checkpointState", default)]
    checkpoint_state: Option<String>,
    #[serde(rename = "preparedDevices", default)]
    prepared_devices: Option<Vec<Group>>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct Group {
    #[serde(default)]
    pub(super) devices: Vec<Device>,
    #[serde(rename = "configState", default)]
    pub(super) config_state: ConfigState,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(super) struct ConfigState {
    #[serde(rename = "mpsControlDaemonID", default)]
    pub(super) mps_control_daemon_id: String,
    #[serde(rename = "timeSliceApplied", default)]
    pub(super) time_slice_applied: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct Device {
    #[serde(default)]
    pub(super) gpu: Option<WholeGpu>,
    #[serde(default)]
    pub(super) mig: Option<Mig>,
    #[serde(default)]
    pub(super) vfio: Option<Vfio>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct WholeGpu {
    #[serde(default)]
    pub(super) info: Option<Uuid>,
    #[serde(default)]
    pub(super) device: Option<KubeletDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct Uuid {
    #[serde(default)]
    pub(super) uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct Mig {
    #[serde(default)]
    pub(super) concrete: Option<MigLive>,
    #[serde(default)]
    pub(super) device: Option<KubeletDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MigLive {
    pub(super) parent_minor: u32,
    pub(super) gi_id: u32,
    pub(super) ci_id: u32,
    #[serde(rename = "migUUID", default)]
    pub(super) mig_uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct Vfio {
    #[serde(default)]
    pub(super) info: Option<VfioInfo>,
    #[serde(default)]
    pub(super) device: Option<KubeletDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct VfioInfo {
    #[serde(rename = "pciBusID", default)]
    pub(super) pci_bus_id: String,
}

/// `kubeletplugin.Device` as NVIDIA's `CheckpointedDevice` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(super) struct KubeletDevice {
    #[serde(rename = "Requests", default)]
    pub(super) requests: Vec<String>,
    #[serde(rename = "PoolName", default)]
    pub(super) pool_name: String,
    #[serde(rename = "DeviceName", default)]
    pub(super) device_name: String,
    #[serde(rename = "CDIDeviceIDs", default)]
    pub(super) cdi_device_ids: Vec<String>,
    #[serde(rename = "ShareID", default)]
    pub(super) share_id: Option<String>,
}

impl NvidiaCheckpoint {
    /// `document` read as NVIDIA's checkpoint (`checksum` and `v1`/`v2`, no `schemaVersion`), with
    /// the claims of boot `boot_id` (its v1 records no boot: they count); `None` when it is not
    /// NVIDIA's. A document of NVIDIA's shape that cannot be read is an error (the reason).
    pub fn from_document(
        document: &serde_json::Value,
        boot_id: &str,
    ) -> Option<Result<Self, String>> {
        let object = document.as_object()?;
        if object.contains_key("schemaVersion")
            || !object.contains_key("checksum")
            || !(object.contains_key("v1") || object.contains_key("v2"))
        {
            return None;
        }
        Some(Self::read(document, boot_id))
    }

    fn read(document: &serde_json::Value, boot_id: &str) -> Result<Self, String> {
        let document: Document = serde_json::from_value(document.clone())
            .map_err(|e| format!("NVIDIA's driver's checkpoint cannot be read: {e}"))?;
        let (claims, boot) = match (document.v2, document.v1) {
            (Some(v2), _) => (v2.prepared_claims, v2.node_boot_id),
            (None, Some(v1)) => (v1.prepared_claims, String::new()),
            (None, None) => (BTreeMap::new(), String::new()),
        };
        // Another boot: nothing it prepared exists any more (NVIDIA's driver drops it too).
        if !boot.is_empty() && boot != boot_id {
            return Ok(Self::default());
        }
        Ok(Self {
            claims: claims
                .into_iter()
                .map(|(uid, claim)| NvidiaClaim {
                    completed: claim
                        .checkpoint_state
                        .as_deref()
                        .is_none_or(|s| s == "PrepareCompleted"),
                    namespace: claim.namespace,
                    name: claim.name,
                    groups: claim.prepared_devices.unwrap_or_default(),
                    uid,
                })
                .collect(),
        })
    }
}
