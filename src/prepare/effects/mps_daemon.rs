//! MPS control daemons ([`crate::prepare::mps`]): one per claim for its MPS devices
//! ([`ClaimMps`]), and one per shared GPU for every claim sharing it through MPS (a `shareID`,
//! [`SharedMps`]).
//!
//! Intent: the devices' configs in the checkpoint say which daemon each claim needs (nothing
//! else to record: a daemon is found by its folder, named after the claim or the GPU). Apply:
//! started after the carve (it needs the MIG devices' UUIDs) and the compute mode. Undo: stopped
//! before the devices it serves are destroyed or given their compute mode back; a shared GPU's
//! only when its last claim leaves. Adopt: at start, daemons no prepared claim needs are stopped
//! and those prepared claims need but that no longer answer are started again ([`adopt`]), and
//! [`daemons_of`] tells a running driver which to check (`DeviceState::repair_mps`).
use std::collections::{BTreeMap, BTreeSet};

use super::{ClaimDevice, ClaimEffect, DeviceEffect, Host};
use crate::prepare::checkpoint::{Checkpoint, ClaimEntry};
use crate::prepare::error::PrepareError;
use crate::prepare::mps::{DaemonSpec, MpsDaemons};
use crate::prepare::sharing;

/// The daemon a claim's own MPS devices need (not shared ones), if any.
pub fn claim_daemon(entry: &ClaimEntry) -> Result<Option<DaemonSpec>, PrepareError> {
    sharing::daemon_spec(&entry.devices, |d| d.uuid.clone()).map_err(|reason| PrepareError::Claim {
        claim: format!("{}/{}", entry.namespace, entry.name),
        reason,
    })
}

/// Every daemon a prepared claim relies on, by folder key: its own and its shared GPUs'.
pub fn daemons_of(entry: &ClaimEntry) -> Result<Vec<(String, DaemonSpec)>, PrepareError> {
    let mut daemons: Vec<(String, DaemonSpec)> = claim_daemon(entry)?
        .into_iter()
        .map(|spec| (entry.uid.clone(), spec))
        .collect();
    daemons.extend(
        entry
            .devices
            .iter()
            .filter(|d| sharing::shared_mps(d))
            .map(|d| {
                (
                    sharing::shared_daemon_key(&d.uuid),
                    sharing::shared_daemon_spec(d),
                )
            }),
    );
    Ok(daemons)
}

/// A claim's own daemon, for its MPS devices that no other claim shares; folder named after the
/// claim's UID.
pub struct ClaimMps<'a>(pub Option<&'a MpsDaemons>);

impl ClaimEffect for ClaimMps<'_> {
    fn apply(&self, _host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError> {
        // Bad MPS settings fail the claim even where the node has no MPS (the planner refuses
        // such claims before this).
        if let (Some(spec), Some(mps)) = (claim_daemon(claim)?, self.0) {
            mps.start(&claim.uid, &spec)?;
        }
        Ok(())
    }

    fn undo(&self, _host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError> {
        // Whether or not the claim asked for one: a folder a crash left is removed too.
        if let Some(mps) = self.0 {
            mps.stop(&claim.uid)?;
        }
        Ok(())
    }
}

/// A shared GPU's daemon: started by its first claim, stopped with its last (the orchestration
/// skips the undo of a device another claim still shares).
pub struct SharedMps<'a>(pub Option<&'a MpsDaemons>);

impl DeviceEffect for SharedMps<'_> {
    fn apply(&self, _host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let record = device.record;
        if let Some(mps) = self.0.filter(|_| sharing::shared_mps(record)) {
            // Already running when another claim shares the GPU.
            mps.start(
                &sharing::shared_daemon_key(&record.uuid),
                &sharing::shared_daemon_spec(record),
            )?;
        }
        Ok(())
    }

    fn undo(&self, _host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let record = device.record;
        if let Some(mps) = self.0.filter(|_| sharing::shared_mps(record)) {
            mps.stop(&sharing::shared_daemon_key(&record.uuid))?;
        }
        Ok(())
    }
}

/// What [`adopt`] does: daemons to stop and daemons to start, by folder key.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adoption {
    pub stop: Vec<String>,
    pub start: Vec<(String, DaemonSpec)>,
}

/// Reconciles the running daemons (`running`, by folder key; `answers` whether one answers)
/// with a checkpoint holding only prepared claims (recovery rolled back the rest).
pub fn plan_adoption(
    checkpoint: &Checkpoint,
    running: &[String],
    answers: impl Fn(&str) -> bool,
) -> Result<Adoption, PrepareError> {
    let mut needed = BTreeMap::new();
    for entry in checkpoint.claims.values() {
        for (key, spec) in daemons_of(entry)? {
            needed.entry(key).or_insert(spec);
        }
    }
    let claims: BTreeSet<&String> = checkpoint.claims.keys().collect();
    let mut adoption = Adoption::default();
    for key in running {
        // A prepared claim without a daemon of its own keeps its (empty) folder to itself.
        if !needed.contains_key(key) && !claims.contains(key) {
            adoption.stop.push(key.clone());
        }
    }
    for (key, spec) in needed {
        if !answers(&key) {
            adoption.start.push((key, spec));
        }
    }
    Ok(adoption)
}

/// Stops the daemons no prepared claim needs and starts again those that no longer answer.
/// Returns `(stopped, restarted)` folder keys.
pub fn adopt(
    mps: &MpsDaemons,
    checkpoint: &Checkpoint,
) -> Result<(Vec<String>, Vec<String>), PrepareError> {
    let adoption = plan_adoption(checkpoint, &mps.claim_uids()?, |key| mps.answers(key))?;
    for key in &adoption.stop {
        mps.stop(key)?;
    }
    let mut restarted = Vec::with_capacity(adoption.start.len());
    for (key, spec) in adoption.start {
        tracing::warn!(daemon = %key, "an MPS daemon a prepared claim needs does not answer: starting it again");
        mps.start(&key, &spec)?;
        restarted.push(key);
    }
    Ok((adoption.stop, restarted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::checkpoint::{ClaimState, DeviceRecord};
    use crate::prepare::effects::test_host::record;

    fn mps_device(device: &str, uuid: &str, shared: bool) -> DeviceRecord {
        let mut d = record(device);
        d.uuid = uuid.into();
        d.share_id = shared.then(|| "share".into());
        d.config = Some(
            crate::config::decode(&serde_json::json!({
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "MPS"},
            }))
            .expect("config"),
        );
        d
    }

    fn claim(uid: &str, devices: Vec<DeviceRecord>) -> ClaimEntry {
        ClaimEntry {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
            state: ClaimState::PrepareCompleted,
            devices,
            pod_claim_name: None,
            taken_over: None,
            unknown: Default::default(),
        }
    }

    #[test]
    fn adoption_stops_strays_and_restarts_what_prepared_claims_need() {
        let mut checkpoint = Checkpoint::new("boot");
        for entry in [
            claim("own", vec![mps_device("gpu-0", "GPU-0", false)]),
            claim("shared-a", vec![mps_device("gpu-1", "GPU-1", true)]),
            claim("shared-b", vec![mps_device("gpu-1", "GPU-1", true)]),
            claim("plain", vec![record("gpu-2")]),
        ] {
            checkpoint.claims.insert(entry.uid.clone(), entry);
        }
        let running = vec![
            "own".to_string(),
            "shared-GPU-1".to_string(),
            "gone-claim".to_string(),
            "plain".to_string(),
        ];
        // The claim's own daemon died; the shared one answers.
        let adoption =
            plan_adoption(&checkpoint, &running, |key| key == "shared-GPU-1").expect("plan");
        assert_eq!(adoption.stop, vec!["gone-claim".to_string()]);
        let started: Vec<&str> = adoption.start.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(started, vec!["own"]);
        assert_eq!(adoption.start[0].1.uuids, vec!["GPU-0".to_string()]);
    }

    #[test]
    fn a_node_without_mps_starts_and_stops_no_claim_daemon() {
        let host = crate::prepare::effects::test_host::TestHost::new(
            "sim:1xH100-SXM5-80GB",
            crate::gpu::mig::GpuMode::Whole,
        );
        let entry = claim("own", vec![mps_device("gpu-0", "GPU-0", false)]);
        assert!(claim_daemon(&entry).expect("spec").is_some());
        ClaimMps(None).apply(&host, &entry).expect("apply");
        ClaimMps(None).undo(&host, &entry).expect("undo");
        assert_eq!(*host.writes.lock().expect("lock"), 0);
    }

    #[test]
    fn one_shared_daemon_serves_every_claim_on_the_gpu() {
        let entry = claim("a", vec![mps_device("gpu-1", "GPU-1", true)]);
        let daemons = daemons_of(&entry).expect("daemons");
        assert_eq!(daemons.len(), 1);
        assert_eq!(daemons[0].0, "shared-GPU-1");
        assert_eq!(claim_daemon(&entry).expect("own"), None);
    }
}
