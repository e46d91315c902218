//! A full GPU's sharing settings (compute mode, time-slice interval) for time-slicing and MPS.
//!
//! Intent: what the GPU had, read before anything changes ([`record_before`]), in the device's
//! [`SharingRecord`]. Apply: the settings the claim's config asks for ([`sharing::wanted`]).
//! Undo: what was recorded, put back (also after a crash at any point in between). Claims sharing
//! a GPU through MPS carry the record of the first of them, so whichever leaves last restores it.
use super::{ClaimDevice, DeviceEffect, Host};
use crate::config::DeviceConfig;
use crate::gpu::{GpuControl, GpuError, SharingSettings};
use crate::prepare::checkpoint::SharingRecord;
use crate::prepare::error::PrepareError;
use crate::prepare::failpoint::failpoint;
use crate::prepare::sharing;

/// What must be recorded before preparing a full GPU with this configuration: its current
/// settings, when sharing will change them.
pub fn record_before(
    gpus: &dyn GpuControl,
    minor: u32,
    config: Option<&DeviceConfig>,
) -> Result<Option<SharingRecord>, GpuError> {
    if sharing::wanted(config).is_none() {
        return Ok(None);
    }
    Ok(Some(SharingRecord {
        minor,
        before: gpus.sharing_settings(minor)?,
    }))
}

pub struct ComputeMode;

impl DeviceEffect for ComputeMode {
    fn apply(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let record = device.record;
        let (Some(recorded), Some(settings)) =
            (&record.sharing, sharing::wanted(record.config.as_ref()))
        else {
            return Ok(());
        };
        host.gpus().set_sharing_settings(recorded.minor, settings)?;
        tracing::info!(device = %record.device, uuid = %record.uuid, compute_mode = ?settings.compute_mode, timeslice = ?settings.timeslice, "sharing settings applied");
        failpoint("prepare-sharing-applied");
        Ok(())
    }

    fn undo(&self, host: &dyn Host, device: &ClaimDevice) -> Result<(), PrepareError> {
        let record = device.record;
        let Some(recorded) = &record.sharing else {
            return Ok(());
        };
        // A node that cannot set intervals (refused at planning) never changed this one.
        let changed_timeslice = sharing::wanted(record.config.as_ref())
            .is_none_or(|s| s.timeslice.is_some())
            && host.gpus().timeslice_unavailable().is_none();
        let before = SharingSettings {
            compute_mode: recorded.before.compute_mode,
            // Unknown (NVML cannot read it): the driver's default, as NVIDIA's driver restores.
            timeslice: changed_timeslice.then(|| recorded.before.timeslice.unwrap_or(0)),
        };
        host.gpus().set_sharing_settings(recorded.minor, before)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ComputeMode as Mode;
    use crate::gpu::mig::GpuMode;
    use crate::prepare::effects::test_host::{TestHost, first, record};

    fn config(strategy: &str) -> DeviceConfig {
        crate::config::decode(&serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": strategy},
        }))
        .expect("config")
    }

    fn compute_mode(host: &TestHost) -> Mode {
        host.gpus()
            .sharing_settings(0)
            .expect("settings")
            .compute_mode
    }

    #[test]
    fn mps_and_time_slicing_are_applied_and_put_back() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let before = host.gpus().sharing_settings(0).expect("settings");
        for strategy in ["MPS", "TimeSlicing"] {
            let mut device = record("gpu-0");
            device.config = Some(config(strategy));
            device.sharing = record_before(&host.sim, 0, device.config.as_ref()).expect("read");
            assert_eq!(device.sharing.as_ref().map(|s| &s.before), Some(&before));
            ComputeMode.apply(&host, &first(&device)).expect("apply");
            let want = if strategy == "MPS" {
                Mode::ExclusiveProcess
            } else {
                Mode::Default
            };
            assert_eq!(compute_mode(&host), want, "{strategy}");
            ComputeMode.undo(&host, &first(&device)).expect("undo");
            assert_eq!(compute_mode(&host), before.compute_mode);
        }
    }

    #[test]
    fn a_device_without_sharing_is_left_alone() {
        let host = TestHost::new("sim:1xH100-SXM5-80GB", GpuMode::Whole);
        let device = record("gpu-0");
        assert_eq!(record_before(&host.sim, 0, None).expect("read"), None);
        ComputeMode.apply(&host, &first(&device)).expect("apply");
        ComputeMode.undo(&host, &first(&device)).expect("undo");
        assert_eq!(compute_mode(&host), Mode::Default);
    }
}
