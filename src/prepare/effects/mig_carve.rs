//! MIG devices carved at prepare (dynamic MIG): a GPU instance and its compute instance made for
//! a claim's placement, destroyed at unprepare.
//!
//! Intent: the device's [`MigRecord`] with `created: true` and no ids. Apply: MIG mode on if
//! needed ([`super::mig_mode::ensure`]), the GPU instance, its id recorded, the compute instance,
//! its id and the MIG device's UUID recorded. Undo: the instance found by profile and placement,
//! which only this claim could hold, and by its recorded id too where one was written; NVML
//! reuses instance ids, so an id alone may name another claim's instance (a stale record, an
//! admin who re-created instances). Compute instances then the GPU instance destroyed,
//! `created: false` recorded, MIG mode released. Adopt: instances on dynamic GPUs no record owns
//! (same id, profile and placement) are destroyed at start.
use std::collections::BTreeSet;

use super::{ClaimDevice, DeviceEffect, Host, ignore_not_found, mig_mode};
use crate::gpu::mig::GpuMode;
use crate::gpu::{GpuError, Placement};
use crate::prepare::checkpoint::{Checkpoint, MigRecord};
use crate::prepare::error::PrepareError;
use crate::prepare::failpoint::failpoint;

pub struct MigCarve;

impl DeviceEffect for MigCarve {
    fn apply(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let ClaimDevice { uid, index, record } = *device;
        let Some(mig) = record.mig.as_ref() else {
            return Ok(());
        };
        if !mig.created || mig.compute_instance_id.is_some() {
            return Ok(());
        }
        mig_mode::ensure(host, mig.parent_minor)?;
        let gi =
            host.gpus()
                .create_gpu_instance(mig.parent_minor, mig.profile_id, mig.placement)?;
        // The instance exists; the checkpoint does not know its id yet.
        failpoint("prepare-gi-created-unrecorded");
        host.record(&mut |checkpoint| {
            if let Some(m) = mig_of(checkpoint, uid, index) {
                m.gpu_instance_id = Some(gi);
            }
        })?;
        failpoint("prepare-gi-created");
        let (ci, mig_uuid) = host.gpus().create_compute_instance(mig.parent_minor, gi)?;
        failpoint("prepare-ci-created-unrecorded");
        host.record(&mut |checkpoint| {
            if let Some(device) = checkpoint
                .claims
                .get_mut(uid)
                .and_then(|e| e.devices.get_mut(index))
            {
                if let Some(m) = device.mig.as_mut() {
                    m.compute_instance_id = Some(ci);
                }
                device.uuid = mig_uuid.clone();
            }
        })?;
        failpoint("prepare-ci-created");
        host.refresh(&BTreeSet::from([mig.parent_minor]))
    }

    fn undo(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let ClaimDevice { uid, index, record } = *device;
        let Some(mig) = record.mig.as_ref().filter(|m| m.created) else {
            return Ok(());
        };
        destroy(host, mig)?;
        host.record(&mut |checkpoint| {
            if let Some(m) = mig_of(checkpoint, uid, index) {
                m.created = false;
            }
        })?;
        failpoint("rollback-mig-destroyed");
        Ok(())
    }
}

fn mig_of<'a>(
    checkpoint: &'a mut Checkpoint,
    uid: &str,
    index: usize,
) -> Option<&'a mut MigRecord> {
    checkpoint
        .claims
        .get_mut(uid)?
        .devices
        .get_mut(index)?
        .mig
        .as_mut()
}

/// Destroys a carved instance: compute instances, then the GPU instance; then MIG mode goes off
/// if nothing else is carved on a dynamic GPU.
fn destroy(host: &dyn Host, mig: &MigRecord) -> Result<(), PrepareError> {
    let minor = mig.parent_minor;
    let existing = host.gpus().gpu_instances(minor)?;
    let found = existing.iter().find(|gi| {
        gi.profile_id == mig.profile_id
            && gi.placement == mig.placement
            && mig.gpu_instance_id.is_none_or(|id| gi.id == id)
    });
    if let Some(gi) = found {
        for &ci in &gi.compute_instances {
            ignore_not_found(host.gpus().destroy_compute_instance(minor, gi.id, ci))?;
        }
        ignore_not_found(host.gpus().destroy_gpu_instance(minor, gi.id))?;
    }
    mig_mode::release(host, minor)
}

/// A MIG instance a recorded claim holds: its GPU, id, profile and placement. All four must
/// match for an instance to be the claim's (NVML reuses ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct OwnedInstance {
    pub minor: u32,
    pub gpu_instance_id: u32,
    pub profile_id: u32,
    pub placement: Placement,
}

/// Every MIG instance a recorded claim holds.
pub fn owned(checkpoint: &Checkpoint) -> BTreeSet<OwnedInstance> {
    checkpoint
        .claims
        .values()
        .flat_map(|c| c.devices.iter())
        .filter_map(|d| d.mig.as_ref())
        .filter_map(|m| {
            Some(OwnedInstance {
                minor: m.parent_minor,
                gpu_instance_id: m.gpu_instance_id?,
                profile_id: m.profile_id,
                placement: m.placement,
            })
        })
        .collect()
}

/// Destroys MIG instances on the GPUs in `minors` that the host offers dynamically and no claim
/// in `owned` holds (left by a crash, or by someone else under `--mig dynamic`). Returns
/// "gpu<minor>/gi<id>" of each. Runs at start, before any other operation, once the host knows
/// each GPU's mode (releasing MIG mode on an emptied GPU asks it too).
pub fn adopt(
    host: &dyn Host,
    minors: impl IntoIterator<Item = u32>,
    owned: &BTreeSet<OwnedInstance>,
) -> Result<Vec<String>, PrepareError> {
    let mut destroyed = Vec::new();
    for minor in minors
        .into_iter()
        .filter(|m| host.gpu_mode(*m) == Some(GpuMode::Dynamic))
    {
        let instances = match host.gpus().gpu_instances(minor) {
            Ok(instances) => instances,
            // A GPU that fell off the bus holds up nothing else: its leftovers are cleaned at a
            // later start, once it answers.
            Err(GpuError::Mig {
                failure: crate::gpu::MigFailure::Lost,
                ..
            }) => {
                tracing::warn!(
                    gpu = minor,
                    "GPU is lost: its MIG devices no claim owns are left for a later start"
                );
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        for gi in instances {
            if owned.contains(&OwnedInstance {
                minor,
                gpu_instance_id: gi.id,
                profile_id: gi.profile_id,
                placement: gi.placement,
            }) {
                continue;
            }
            for &ci in &gi.compute_instances {
                ignore_not_found(host.gpus().destroy_compute_instance(minor, gi.id, ci))?;
            }
            ignore_not_found(host.gpus().destroy_gpu_instance(minor, gi.id))?;
            destroyed.push(format!("gpu{minor}/gi{}", gi.id));
        }
        mig_mode::release(host, minor)?;
    }
    Ok(destroyed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::checkpoint::{ClaimEntry, ClaimState, DeviceRecord};
    use crate::prepare::effects::test_host::{TestHost, first, record};

    /// A claim `uid` whose device 0 is a 1g placement of GPU 0 to carve, as prepare records it
    /// before carving.
    fn intent(host: &TestHost) -> DeviceRecord {
        let inventory = host.sim.inventory().expect("inventory");
        let profile = &inventory.gpus[0].mig.as_ref().expect("MIG").profiles[0];
        let mut device = record(&format!("gpu-0-mig-{}-{}-0", profile.name, profile.id));
        device.mig = Some(MigRecord {
            parent_minor: 0,
            profile_id: profile.id,
            placement: Placement { start: 0, size: 1 },
            created: true,
            gpu_instance_id: None,
            compute_instance_id: None,
        });
        host.record(&mut |checkpoint| {
            checkpoint.claims.insert(
                "uid".into(),
                ClaimEntry {
                    namespace: "ns".into(),
                    name: "claim".into(),
                    uid: "uid".into(),
                    state: ClaimState::PrepareStarted,
                    devices: vec![device.clone()],
                    pod_claim_name: None,
                    taken_over: None,
                    unknown: Default::default(),
                },
            );
        })
        .expect("intent");
        device
    }

    fn recorded(host: &TestHost) -> DeviceRecord {
        host.checkpoint().claims["uid"].devices[0].clone()
    }

    #[test]
    fn apply_records_each_id_as_it_exists_and_undo_destroys_by_them() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        let device = intent(&host);
        MigCarve.apply(&host, &first(&device)).expect("carve");
        let carved = recorded(&host);
        let mig = carved.mig.clone().expect("mig");
        assert!(mig.gpu_instance_id.is_some() && mig.compute_instance_id.is_some());
        assert!(carved.uuid.starts_with("MIG-"), "{}", carved.uuid);
        assert_eq!(host.gpus().gpu_instances(0).expect("instances").len(), 1);
        // Intent, GPU instance id, compute instance id: three writes.
        assert_eq!(*host.writes.lock().expect("lock"), 3);
        // Carving again is a no-op: the ids say it is done.
        MigCarve.apply(&host, &first(&carved)).expect("again");
        assert_eq!(host.gpus().gpu_instances(0).expect("instances").len(), 1);

        MigCarve.undo(&host, &first(&carved)).expect("undo");
        assert!(host.gpus().gpu_instances(0).expect("instances").is_empty());
        assert!(!recorded(&host).mig.expect("mig").created);
        host.refresh(&BTreeSet::new()).expect("refresh");
        assert!(!host.mig_mode(0).0, "MIG mode released with the last carve");
    }

    #[test]
    fn an_instance_whose_id_was_never_recorded_is_found_by_its_placement() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        let device = intent(&host);
        let mig = device.mig.clone().expect("mig");
        // A crash right after the GPU instance was made: the record has no id.
        mig_mode::ensure(&host, 0).expect("MIG mode");
        host.sim
            .create_gpu_instance(0, mig.profile_id, mig.placement)
            .expect("instance");
        MigCarve.undo(&host, &first(&device)).expect("undo");
        assert!(host.gpus().gpu_instances(0).expect("instances").is_empty());
    }

    #[test]
    fn a_recorded_id_that_now_names_another_instance_destroys_nothing() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        let device = intent(&host);
        MigCarve.apply(&host, &first(&device)).expect("carve");
        let carved = recorded(&host);
        let mig = carved.mig.clone().expect("mig");
        // An admin destroyed the claim's instance and made one of another profile in the same
        // slot (1g.10gb -> 1g.10gb+me): NVML derives the id from the slot, so it is the same.
        let id = mig.gpu_instance_id.expect("id");
        let gi = &host.gpus().gpu_instances(0).expect("instances")[0];
        for &ci in &gi.compute_instances {
            host.gpus().destroy_compute_instance(0, id, ci).expect("ci");
        }
        host.gpus().destroy_gpu_instance(0, id).expect("gi");
        let inventory = host.sim.inventory().expect("inventory");
        let sibling = inventory.gpus[0]
            .mig
            .as_ref()
            .expect("MIG")
            .profiles
            .iter()
            .find(|p| p.id != mig.profile_id && p.placements.contains(&mig.placement))
            .expect("another profile with the same placement")
            .id;
        let other = host
            .sim
            .create_gpu_instance(0, sibling, mig.placement)
            .expect("another instance");
        assert_eq!(other, id, "the same slot gets the same id, as on NVML");
        MigCarve.undo(&host, &first(&carved)).expect("undo");
        assert_eq!(
            host.gpus().gpu_instances(0).expect("instances").len(),
            1,
            "the other instance with the same id is not the claim's"
        );
        // Nor does adoption count it as a stale record's: the record's profile is another one.
        let mut stale = host.checkpoint();
        stale.claims.get_mut("uid").expect("claim").devices[0] = carved.clone();
        let stale_owned = super::owned(&stale);
        assert_eq!(stale_owned.len(), 1);
        let destroyed = adopt(&host, [0], &stale_owned).expect("adopt");
        assert_eq!(destroyed, vec![format!("gpu0/gi{other}")]);
    }

    #[test]
    fn adopt_destroys_only_what_no_claim_owns_on_dynamic_gpus() {
        let host = TestHost::new("sim:2xH100-SXM5-80GB", GpuMode::Dynamic);
        let device = intent(&host);
        MigCarve.apply(&host, &first(&device)).expect("carve");
        // Someone else's instance on the same GPU.
        let stray = host
            .sim
            .create_gpu_instance(
                0,
                device.mig.as_ref().expect("mig").profile_id,
                Placement { start: 1, size: 1 },
            )
            .expect("stray");
        let owned = owned(&host.checkpoint());
        let destroyed = adopt(&host, [0, 1], &owned).expect("adopt");
        assert_eq!(destroyed, vec![format!("gpu0/gi{stray}")]);
        assert_eq!(host.gpus().gpu_instances(0).expect("instances").len(), 1);

        // On a static GPU everything is the admin's.
        let mut host = host;
        host.modes = std::collections::BTreeMap::from([(0, GpuMode::Static), (1, GpuMode::Static)]);
        assert!(
            adopt(&host, [0, 1], &BTreeSet::new())
                .expect("adopt")
                .is_empty()
        );
        assert_eq!(host.gpus().gpu_instances(0).expect("instances").len(), 1);
    }
}
