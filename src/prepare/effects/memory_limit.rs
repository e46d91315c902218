//! GPU memory limits (NVML, per cgroup v2) that a claim's containers leave behind
//! ([`crate::prepare::memory_limits`]).
//!
//! Intent: the memory each shared device consumed, in the checkpoint's device records (nothing
//! else: the limits are found on the GPUs by cgroup). Apply: nothing here; the container
//! runtime's hook sets each container's limit from the claim's CDI spec. Undo: at unprepare (or
//! a rollback) the claim's containers are gone, so the limits that cgroups without a process
//! still hold on the claim's GPUs are cleared. Adopt: nothing at start; a limit left by a crash
//! is cleared at the next unprepare on that GPU.
use super::{ClaimEffect, Host};
use crate::prepare::checkpoint::ClaimEntry;
use crate::prepare::error::PrepareError;
use crate::prepare::memory_limits::MemoryLimits;

/// Clears the limits a claim's containers left, where this node enforces them.
pub struct MemoryLimit<'a>(pub &'a MemoryLimits);

impl ClaimEffect for MemoryLimit<'_> {
    fn apply(&self, _host: &dyn Host, _claim: &ClaimEntry) -> Result<(), PrepareError> {
        Ok(())
    }

    fn undo(&self, host: &dyn Host, claim: &ClaimEntry) -> Result<(), PrepareError> {
        // No hook in the claim's spec: no container of it had a limit.
        if self.0.for_claim(&claim.devices).0.hooks.is_empty() {
            return Ok(());
        }
        let mut minors = Vec::new();
        host.inspect_inventory(&mut |inventory| {
            minors = claim
                .devices
                .iter()
                .filter_map(|d| inventory.gpus.iter().find(|g| g.uuid == d.uuid))
                .map(|g| g.minor)
                .collect();
        });
        for cgroup in self.0.clear_left_over(host.gpus(), &minors) {
            tracing::info!(claimUID = %claim.uid, cgroup = %cgroup.display(), "cleared the GPU memory limit a container left");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::mig::GpuMode;
    use crate::prepare::checkpoint::ClaimState;
    use crate::prepare::effects::test_host::{TestHost, record};

    #[test]
    fn a_node_without_limits_has_nothing_to_clear() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let mut device = record("gpu-0");
        device.share_id = Some("share".into());
        device.consumed.insert("memory".into(), "10Gi".into());
        let claim = ClaimEntry {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "uid".into(),
            state: ClaimState::PrepareStarted,
            devices: vec![device],
            pod_claim_name: None,
            taken_over: None,
            unknown: Default::default(),
        };
        let limits = MemoryLimits::Unavailable("test".into());
        MemoryLimit(&limits).apply(&host, &claim).expect("apply");
        MemoryLimit(&limits).undo(&host, &claim).expect("undo");
        assert_eq!(*host.writes.lock().expect("lock"), 0);
    }
}
