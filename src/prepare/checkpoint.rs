//! The checkpoint: which claims this node prepared and what was created for them.
//!
//! A versioned JSON document written atomically. Reading is tolerant by design (NVIDIA's driver
//! declared checkpoints corrupt after upgrades, #1080): unknown fields are kept and written back,
//! unknown states read as "started" so they get rolled back, and no checksum makes an added field
//! fatal. A changed boot ID means everything recorded is gone (GPU instances and `/var/run` do not
//! survive a reboot), so the claims are dropped and prepared again on demand (#951).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::DeviceConfig;
use crate::gpu::{Placement, SharingSettings};

pub const SCHEMA_VERSION: u32 = 1;
pub const FILE_NAME: &str = "checkpoint.json";

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint {path}: {reason}")]
    Io { path: PathBuf, reason: String },
    /// The file exists but this version cannot trust it (corrupt, or written by a newer
    /// gpu-dra): the driver must not act on the node at all until an operator looks.
    #[error(
        "checkpoint {path} cannot be used: {reason}; the driver prepares and unprepares nothing until it is repaired or removed (running containers keep their devices)"
    )]
    Unusable { path: PathBuf, reason: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub schema_version: u32,
    #[serde(rename = "nodeBootID", default)]
    pub node_boot_id: String,
    /// Claims by UID.
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimEntry>,
    /// Fields written by newer versions, preserved on rewrite.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    PrepareStarted,
    PrepareCompleted,
    /// A state a newer version wrote; treated as unfinished.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimEntry {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub state: ClaimState,
    #[serde(default)]
    pub devices: Vec<DeviceRecord>,
    /// The pod's name for the claim (`resource.kubernetes.io/pod-claim-name`) when a template
    /// made it: where containers find the claim's device metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    /// Prepared by NVIDIA's driver and taken over when gpu-dra replaced it on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_over: Option<TakenOver>,
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// Where a claim came from when gpu-dra took it over from NVIDIA's driver
/// ([`super::takeover`]): part of the checkpoint's format, so it is defined here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TakenOver {
    /// The CDI spec NVIDIA's driver wrote for the claim: removed once gpu-dra's serves it, or at
    /// unprepare.
    pub nvidia_spec: PathBuf,
    /// Why gpu-dra cannot undo what NVIDIA's driver did for the claim: its spec stays, its
    /// devices stay held, and unpreparing it answers this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl ClaimEntry {
    pub fn is_completed(&self) -> bool {
        self.state == ClaimState::PrepareCompleted
    }
}

/// One prepared device and everything needed to undo its preparation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// What a shared (consumable) allocation consumed of the device, e.g. `memory: 20Gi`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed: BTreeMap<String, String>,
    #[serde(default)]
    pub admin_access: bool,
    /// GPU or MIG UUID; empty until a carved MIG device exists.
    #[serde(default)]
    pub uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRecord>,
    /// Sharing configuration applied to the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DeviceConfig>,
    /// Set when preparing changes the GPU's sharing settings (time-slicing): what they were, so
    /// unprepare (or recovery after a crash) puts them back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingRecord>,
    /// A GPU handed to a virtual machine: recorded before it leaves `nvidia`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vfio: Option<VfioRecord>,
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// A GPU bound to `vfio-pci` for a claim; unpreparing binds it back to `nvidia` (whatever
/// happened in between: binding twice, or back, changes nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioRecord {
    pub bus_id: String,
    /// The GPU's minor while NVML saw it (`None` when it was bound to vfio-pci already).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    pub iommu_group: u32,
    /// `vfioN` of the iommufd cdev, once bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdev: Option<String>,
    /// The GPU was in persistence mode, turned off so that it could leave `nvidia`; turned on
    /// again when it comes back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub persistence: bool,
}

/// A full GPU's sharing settings before a claim changed them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingRecord {
    pub minor: u32,
    pub before: SharingSettings,
}

/// A MIG device used by a claim. `created` marks instances this driver carved (and must destroy);
/// the ids are recorded only once the instances exist, so a crash in between is detectable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigRecord {
    pub parent_minor: u32,
    pub profile_id: u32,
    pub placement: Placement,
    #[serde(default)]
    pub created: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
}

impl Checkpoint {
    pub fn new(boot_id: &str) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            node_boot_id: boot_id.to_string(),
            claims: BTreeMap::new(),
            unknown: serde_json::Map::new(),
        }
    }

    /// The claim (other than `except_uid`) that holds `device` of `pool`, if any.
    /// A claim (other than `except_uid`) holding `device` for itself: a shared (consumable)
    /// holding leaves room for another shared one when `shared`.
    pub fn exclusive_holder_of(
        &self,
        pool: &str,
        device: &str,
        except_uid: &str,
        shared: bool,
    ) -> Option<&ClaimEntry> {
        self.claims
            .values()
            .filter(|c| c.uid != except_uid)
            .find(|c| {
                c.devices.iter().any(|d| {
                    d.pool == pool
                        && d.device == device
                        && !d.admin_access
                        && !(shared && d.share_id.is_some())
                })
            })
    }

    pub fn holder_of(&self, pool: &str, device: &str, except_uid: &str) -> Option<&ClaimEntry> {
        self.claims
            .values()
            .filter(|c| c.uid != except_uid)
            .find(|c| {
                c.devices
                    .iter()
                    .any(|d| d.pool == pool && d.device == device && !d.admin_access)
            })
    }

    /// A claim (other than `except_uid`) holding any device of `pool` that `uses_gpu` says lives
    /// on the GPU in question, with that device's name.
    pub fn holder_on_gpu(
        &self,
        pool: &str,
        except_uid: &str,
        uses_gpu: impl Fn(&DeviceRecord) -> bool,
    ) -> Option<(&ClaimEntry, &str)> {
        self.claims
            .values()
            .filter(|c| c.uid != except_uid)
            .find_map(|c| {
                c.devices
                    .iter()
                    .find(|d| d.pool == pool && !d.admin_access && uses_gpu(d))
                    .map(|d| (c, d.device.as_str()))
            })
    }
}

/// Where the checkpoint lives.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    path: PathBuf,
}

/// What loading found, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// No file yet.
    Fresh,
    Loaded,
    /// Written in another boot; its claims were dropped.
    PreviousBoot {
        dropped: usize,
    },
    /// NVIDIA's driver's checkpoint (the same path: the same driver name) holding no claim of
    /// this boot, as its uninstall leaves it: kept aside at `backup`, started afresh.
    ReplacedNvidia {
        backup: PathBuf,
    },
    /// NVIDIA's driver's checkpoint with claims it prepared in this boot (the node switched
    /// drivers without draining): kept aside at `backup`, its claims to be taken over
    /// ([`super::takeover`]) once the node's GPUs are known.
    NvidiaClaims {
        backup: PathBuf,
        nvidia: super::nvidia_checkpoint::NvidiaCheckpoint,
    },
}

impl CheckpointStore {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join(FILE_NAME),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the checkpoint for this boot. A file that cannot be parsed, or that a newer gpu-dra
    /// wrote, is [`CheckpointError::Unusable`] and stays untouched: starting empty would make
    /// recovery delete the CDI specs and MIG devices of running pods (a downgrade, a corrupt
    /// disk).
    pub fn load(&self, boot_id: &str) -> Result<(Checkpoint, LoadOutcome), CheckpointError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Checkpoint::new(boot_id), LoadOutcome::Fresh));
            }
            Err(e) => return Err(self.io_err(format!("cannot read: {e}"))),
        };
        let document = self.document(&bytes)?;
        if let Some(nvidia) = self.nvidias(&document, boot_id)? {
            let backup = self.path.with_extension("json.dra-driver-nvidia-gpu");
            std::fs::copy(&self.path, &backup).map_err(|e| {
                self.io_err(format!(
                    "cannot keep NVIDIA's driver's checkpoint at {}: {e}",
                    backup.display()
                ))
            })?;
            let outcome = if nvidia.claims.is_empty() {
                LoadOutcome::ReplacedNvidia { backup }
            } else {
                LoadOutcome::NvidiaClaims { backup, nvidia }
            };
            return Ok((Checkpoint::new(boot_id), outcome));
        }
        let mut checkpoint = self.parse(document)?;
        // A checkpoint from before boot IDs were recorded is taken as this boot's.
        if !checkpoint.node_boot_id.is_empty() && checkpoint.node_boot_id != boot_id {
            let dropped = checkpoint.claims.len();
            checkpoint.claims.clear();
            checkpoint.node_boot_id = boot_id.to_string();
            return Ok((checkpoint, LoadOutcome::PreviousBoot { dropped }));
        }
        checkpoint.node_boot_id = boot_id.to_string();
        Ok((checkpoint, LoadOutcome::Loaded))
    }

    /// Reads the checkpoint another driver instance may have written meanwhile. Unlike
    /// [`CheckpointStore::load`], a document that cannot be parsed is an error and stays where
    /// it is: a running driver must not start over.
    pub fn read(&self, boot_id: &str) -> Result<Checkpoint, CheckpointError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint::new(boot_id));
            }
            Err(e) => return Err(self.io_err(format!("cannot read: {e}"))),
        };
        let document = self.document(&bytes)?;
        if let Some(nvidia) = self.nvidias(&document, boot_id)? {
            if nvidia.claims.is_empty() {
                return Ok(Checkpoint::new(boot_id));
            }
            // Taken over at a start only, where nothing else acts on the node yet.
            return Err(CheckpointError::Unusable {
                path: self.path.clone(),
                reason: format!(
                    "it is NVIDIA's driver's (dra-driver-nvidia-gpu), with claims it prepared on this node since it booted ({}): gpu-dra takes them over when it starts, not while it runs",
                    nvidia
                        .claims
                        .iter()
                        .map(|c| c.label())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let mut checkpoint = self.parse(document)?;
        if checkpoint.node_boot_id.is_empty() {
            checkpoint.node_boot_id = boot_id.to_string();
        }
        Ok(checkpoint)
    }

    /// Removes what a crash in the middle of [`CheckpointStore::save`] left behind.
    pub fn sweep_temp_files(&self) -> Result<Vec<PathBuf>, CheckpointError> {
        crate::fsutil::sweep_temp_files(&self.path)
            .map_err(|e| self.io_err(format!("cannot remove leftover temp files: {e}")))
    }

    pub fn save(&self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        let bytes = serde_json::to_vec_pretty(checkpoint)
            .map_err(|e| self.io_err(format!("cannot encode: {e}")))?;
        crate::fsutil::write_atomically(&self.path, &bytes)
            .map_err(|e| self.io_err(format!("cannot write: {e}")))
    }

    /// The file read as NVIDIA's driver's checkpoint, with the claims it prepared in this boot;
    /// `None` when it is not NVIDIA's. One of NVIDIA's shape that cannot be read is unusable.
    fn nvidias(
        &self,
        document: &serde_json::Value,
        boot_id: &str,
    ) -> Result<Option<super::nvidia_checkpoint::NvidiaCheckpoint>, CheckpointError> {
        match super::nvidia_checkpoint::NvidiaCheckpoint::from_document(document, boot_id) {
            None => Ok(None),
            Some(Ok(nvidia)) => Ok(Some(nvidia)),
            Some(Err(reason)) => Err(CheckpointError::Unusable {
                path: self.path.clone(),
                reason,
            }),
        }
    }

    /// Parses a checkpoint of this schema or an earlier one (migrated to this one).
    /// The file as JSON, read once for both NVIDIA's format and ours.
    fn document(&self, bytes: &[u8]) -> Result<serde_json::Value, CheckpointError> {
        serde_json::from_slice(bytes).map_err(|e| CheckpointError::Unusable {
            path: self.path.clone(),
            reason: format!("not a JSON document ({e})"),
        })
    }

    fn parse(&self, document: serde_json::Value) -> Result<Checkpoint, CheckpointError> {
        let unusable = |reason: String| CheckpointError::Unusable {
            path: self.path.clone(),
            reason,
        };
        let version = document
            .get("schemaVersion")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| unusable("no schemaVersion".into()))?;
        if version > u64::from(SCHEMA_VERSION) {
            return Err(unusable(format!(
                "schema version {version} was written by a newer gpu-dra (this one reads up to {SCHEMA_VERSION}); upgrade again, or drain the node before downgrading"
            )));
        }
        // Version 1 is the first schema: there is nothing older to migrate yet. A later schema
        // converts `document` from each earlier version here, step by step.
        let mut checkpoint: Checkpoint = serde_json::from_value(document)
            .map_err(|e| unusable(format!("schema version {version}: {e}")))?;
        checkpoint.schema_version = SCHEMA_VERSION;
        Ok(checkpoint)
    }

    fn io_err(&self, reason: String) -> CheckpointError {
        CheckpointError::Io {
            path: self.path.clone(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, CheckpointStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CheckpointStore::new(dir.path());
        (dir, store)
    }

    /// NVIDIA's driver's checkpoint, as its `MarshalCheckpoint` writes it (v1 beside v2).
    fn nvidias(boot: &str, claims: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "checksum": 2_905_124_375_u32,
            "v1": {"preparedClaims": {}},
            "v2": {"checksum": 1_126_344_921_u32, "preparedClaims": claims, "nodeBootID": boot},
        }))
        .expect("json")
    }

    #[test]
    fn nvidias_checkpoint_without_claims_of_this_boot_is_replaced_and_kept() {
        let (dir, store) = store();
        let claim = serde_json::json!({"u-1": {
            "checkpointState": "PrepareCompleted", "status": {}, "preparedDevices": [],
            "name": "pod1-gpu-x7k2f", "namespace": "gpu-test1",
        }});
        // Left by its uninstall (no claims), or from before a reboot.
        for bytes in [
            nvidias("boot-1", serde_json::json!({})),
            nvidias("boot-0", claim.clone()),
        ] {
            std::fs::write(store.path(), &bytes).expect("write");
            let (checkpoint, outcome) = store.load("boot-1").expect("loads");
            assert!(checkpoint.claims.is_empty());
            let backup = dir.path().join("checkpoint.json.dra-driver-nvidia-gpu");
            assert_eq!(
                outcome,
                LoadOutcome::ReplacedNvidia {
                    backup: backup.clone()
                }
            );
            assert_eq!(std::fs::read(&backup).expect("kept"), bytes);
            assert!(store.read("boot-1").expect("reads").claims.is_empty());
        }
    }

    #[test]
    fn nvidias_checkpoint_with_claims_of_this_boot_is_kept_and_its_claims_handed_on() {
        let (dir, store) = store();
        let claim = serde_json::json!({"u-1": {
            "checkpointState": "PrepareStarted", "status": {},
            "name": "pod1-gpu-x7k2f", "namespace": "gpu-test1",
        }});
        let v1_only = serde_json::to_vec(&serde_json::json!({
            "checksum": 1, "v1": {"preparedClaims": {"u-2": {"status": {}, "preparedDevices": []}}},
        }))
        .expect("json");
        for (bytes, named) in [
            (nvidias("boot-1", claim), "gpu-test1/pod1-gpu-x7k2f (u-1)"),
            // Its first format records no boot: its claims count.
            (v1_only, "claim u-2"),
        ] {
            std::fs::write(store.path(), &bytes).expect("write");
            // A running instance does not take over.
            let error = store.read("boot-1").expect_err("refused").to_string();
            assert!(
                error.contains("NVIDIA's driver's") && error.contains(named),
                "{error}"
            );
            let (checkpoint, outcome) = store.load("boot-1").expect("load");
            assert!(checkpoint.claims.is_empty());
            let LoadOutcome::NvidiaClaims { backup, nvidia } = outcome else {
                panic!("{outcome:?}");
            };
            assert_eq!(nvidia.claims.len(), 1);
            assert_eq!(nvidia.claims[0].label(), named);
            assert_eq!(
                backup,
                dir.path().join("checkpoint.json.dra-driver-nvidia-gpu")
            );
            assert_eq!(std::fs::read(&backup).expect("backup"), bytes);
        }
    }

    #[test]
    fn old_checkpoint_with_unknown_fields_loads_and_keeps_them() {
        let (_dir, store) = store();
        std::fs::write(
            store.path(),
            r#"{"schemaVersion": 1, "nodeBootID": "boot-a", "futureField": {"x": 1},
                "claims": {"u1": {"namespace": "ns", "name": "c", "uid": "u1", "state": "PrepareCompleted",
                  "addedLater": true,
                  "devices": [{"requestNames": ["gpu"], "pool": "n1", "device": "gpu-0", "uuid": "GPU-1", "newThing": 7}]},
                 "u2": {"namespace": "ns", "name": "d", "uid": "u2", "state": "PrepareRolledSideways"}}}"#,
        )
        .expect("write");
        let (cp, outcome) = store.load("boot-a").expect("load");
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert!(cp.claims["u1"].is_completed());
        assert_eq!(cp.claims["u1"].devices[0].device, "gpu-0");
        assert_eq!(cp.claims["u2"].state, ClaimState::Unknown);
        store.save(&cp).expect("save");
        let text = std::fs::read_to_string(store.path()).expect("read back");
        for kept in ["futureField", "addedLater", "newThing"] {
            assert!(text.contains(kept), "{kept} must survive a rewrite");
        }
    }

    #[test]
    fn checkpoint_from_a_previous_boot_drops_its_claims() {
        let (_dir, store) = store();
        let mut cp = Checkpoint::new("boot-a");
        cp.claims.insert(
            "u1".into(),
            ClaimEntry {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "u1".into(),
                state: ClaimState::PrepareCompleted,
                devices: vec![],
                pod_claim_name: None,
                taken_over: None,
                unknown: Default::default(),
            },
        );
        store.save(&cp).expect("save");
        let (cp, outcome) = store.load("boot-b").expect("load");
        assert_eq!(outcome, LoadOutcome::PreviousBoot { dropped: 1 });
        assert!(cp.claims.is_empty());
        assert_eq!(cp.node_boot_id, "boot-b");
        // Once saved in this boot, it loads as this boot's.
        store.save(&cp).expect("save");
        let (_, outcome) = store.load("boot-b").expect("load");
        assert_eq!(outcome, LoadOutcome::Loaded);
    }

    #[test]
    fn legacy_checkpoint_without_boot_id_is_this_boots() {
        let (_dir, store) = store();
        std::fs::write(store.path(), r#"{"schemaVersion": 1, "claims": {"u": {"namespace": "a", "name": "b", "uid": "u", "state": "PrepareCompleted"}}}"#)
            .expect("write");
        let (cp, outcome) = store.load("boot-x").expect("load");
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert_eq!(cp.claims.len(), 1);
    }

    #[test]
    fn garbage_and_newer_schemas_are_unusable_and_left_alone() {
        for (content, expected) in [
            ("{not json", "not a JSON document"),
            (r#"{"claims": {}}"#, "no schemaVersion"),
            (
                r#"{"schemaVersion": 2, "claims": {}}"#,
                "written by a newer gpu-dra",
            ),
            (r#"{"schemaVersion": 1, "claims": 7}"#, "schema version 1"),
        ] {
            let (_dir, store) = store();
            std::fs::write(store.path(), content).expect("write");
            let error = store.load("b").expect_err(content).to_string();
            assert!(error.contains(expected), "{content}: {error}");
            assert!(matches!(
                store.read("b"),
                Err(CheckpointError::Unusable { .. })
            ));
            assert_eq!(
                std::fs::read_to_string(store.path()).expect("kept"),
                content
            );
        }
    }

    /// What the previous release (schema 1) wrote loads, keeps every field this version does not
    /// know, and saves as schema 1 again, so a downgrade back to it reads it too.
    #[test]
    fn previous_release_checkpoint_upgrades_and_downgrades() {
        let (_dir, store) = store();
        let fixture = include_str!("testdata/checkpoint-v1.json");
        std::fs::write(store.path(), fixture).expect("write");
        let (cp, outcome) = store
            .load("7f4c2d36-1f8e-4c36-9f0b-6d0f1b2f3c4d")
            .expect("load");
        assert_eq!(outcome, LoadOutcome::Loaded);
        assert_eq!(cp.claims.len(), 2);
        store.save(&cp).expect("save");
        let before: serde_json::Value = serde_json::from_str(fixture).expect("fixture");
        let after: serde_json::Value =
            serde_json::from_slice(&std::fs::read(store.path()).expect("read")).expect("json");
        assert_eq!(after, before, "nothing lost or changed in a round trip");
    }
}
