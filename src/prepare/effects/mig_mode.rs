//! MIG mode of a dynamic GPU: switched on for its first carve and off again once nothing is
//! carved, on GPUs that switch without a reset (Hopper and newer), so the whole GPU is usable,
//! and behaves, as before. It needs no record of its own: whether the GPU should be in MIG mode
//! follows from the carves recorded on it, so undo and recovery are [`release`] after the carves
//! are gone.
use std::collections::BTreeSet;

use super::{ClaimDevice, DeviceEffect, Host};
use crate::gpu::GpuError;
use crate::gpu::mig::GpuMode;
use crate::prepare::checkpoint::DeviceRecord;
use crate::prepare::error::PrepareError;
use crate::prepare::failpoint::failpoint;

/// Turns MIG mode on for a carve; a GPU that needs a reset for it is refused.
pub fn ensure(host: &dyn Host, minor: u32) -> Result<(), PrepareError> {
    let (enabled, toggles) = host.mig_mode(minor);
    if enabled {
        return Ok(());
    }
    if !toggles {
        return Err(GpuError::Mig {
            minor,
            operation: "enable MIG mode",
            failure: crate::gpu::MigFailure::NotSupported,
            detail: "this GPU needs a reset to change MIG mode; enable it beforehand".into(),
        }
        .into());
    }
    host.gpus().set_mig_mode(minor, true)?;
    failpoint("mig-mode-enabled");
    host.refresh(&BTreeSet::from([minor]))
}

/// Turns MIG mode off again on a dynamic GPU that can toggle it, once nothing is carved on it.
pub fn release(host: &dyn Host, minor: u32) -> Result<(), PrepareError> {
    if host.gpu_mode(minor) != Some(GpuMode::Dynamic) {
        return Ok(());
    }
    let (enabled, toggles) = host.mig_mode(minor);
    if !enabled || !toggles {
        return Ok(());
    }
    if host.gpus().gpu_instances(minor)?.is_empty() {
        host.gpus().set_mig_mode(minor, false)?;
        failpoint("mig-mode-disabled");
    }
    Ok(())
}

/// A whole GPU handed out of a dynamic GPU: MIG mode off first (a crash may have left it on after
/// the last instance was destroyed).
pub struct WholeGpu;

impl DeviceEffect for WholeGpu {
    fn apply(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let record = device.record;
        let Some(minor) = whole_gpu(record) else {
            return Ok(());
        };
        if host.mig_mode(minor).0 {
            release(host, minor)?;
            host.refresh(&BTreeSet::from([minor]))?;
        }
        Ok(())
    }

    /// Nothing to put back: MIG mode stays off while the GPU is whole.
    fn undo(&self, _: &dyn Host, _: &ClaimDevice) -> Result<(), PrepareError> {
        Ok(())
    }
}

/// The minor of a record that holds a whole GPU (`gpu-<minor>`).
fn whole_gpu(record: &DeviceRecord) -> Option<u32> {
    if record.mig.is_some() {
        return None;
    }
    record.device.strip_prefix("gpu-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::effects::test_host::{TestHost, first, record};

    fn whole(minor: u32) -> DeviceRecord {
        record(&format!("gpu-{minor}"))
    }

    #[test]
    fn hopper_switches_for_a_carve_and_back_when_empty() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        ensure(&host, 0).expect("on");
        assert!(host.mig_mode(0).0, "MIG mode on after ensure");
        release(&host, 0).expect("off");
        host.refresh(&BTreeSet::from([0])).expect("refresh");
        assert!(!host.mig_mode(0).0, "MIG mode off once nothing is carved");
    }

    #[test]
    fn release_keeps_mig_mode_while_an_instance_lives_or_the_gpu_is_not_dynamic() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        ensure(&host, 0).expect("on");
        host.carve_first_profile(0);
        release(&host, 0).expect("release");
        host.refresh(&BTreeSet::from([0])).expect("refresh");
        assert!(host.mig_mode(0).0, "an instance keeps MIG mode on");

        let static_host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Static);
        ensure(&static_host, 0).expect("on");
        release(&static_host, 0).expect("release");
        static_host.refresh(&BTreeSet::from([0])).expect("refresh");
        assert!(
            static_host.mig_mode(0).0,
            "a static GPU's MIG mode is the admin's"
        );
    }

    #[test]
    fn ampere_needs_a_reset_and_is_refused() {
        let host = TestHost::new("sim:1xA100-SXM4-40GB", GpuMode::Dynamic);
        let error = ensure(&host, 0).expect_err("refused").to_string();
        assert!(error.contains("needs a reset"), "{error}");
        assert!(!host.mig_mode(0).0);
    }

    #[test]
    fn a_whole_gpu_left_in_mig_mode_is_switched_back() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Dynamic);
        ensure(&host, 0).expect("on");
        WholeGpu.apply(&host, &first(&whole(0))).expect("whole");
        assert!(
            !host.mig_mode(0).0,
            "the whole GPU is handed out without MIG mode"
        );
    }
}
