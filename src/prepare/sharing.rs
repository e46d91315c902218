//! Per-claim GPU sharing (`GpuConfig` / `MigDeviceConfig` `sharing`), as NVIDIA's driver applies
//! it, so their users' claims behave the same here.
//!
//! - Time-slicing on a full GPU: compute mode `DEFAULT` and the claim's interval (`Default` when
//!   none is given), set at prepare and put back at unprepare to what the GPU had before. What it
//!   had is recorded in the checkpoint before anything changes, so recovery after a crash restores
//!   it too.
//! - Time-slicing on a MIG device: a MIG device time-slices its processes already and has no
//!   interval to set; accepted (NVIDIA's manifests use it) with a warning.
//! - MPS: refused with the field named until this driver runs MPS control daemons; a claim never
//!   gets a sharing mode it did not ask for, nor silently loses one it did.
use crate::config::{DeviceConfig, GpuConfig, GpuSharing, MigDeviceConfig, SharingStrategy};
use crate::gpu::{ComputeMode, GpuControl, GpuError, SharingSettings};

use super::checkpoint::{DeviceRecord, SharingRecord};

/// Why a claim's sharing configuration cannot be applied: `(field under the config's
/// parameters, reason)`.
pub fn check(config: &DeviceConfig) -> Result<(), (&'static str, String)> {
    let strategy = match config {
        DeviceConfig::GpuConfig(GpuConfig { sharing }) => sharing.as_ref().map(|s| s.strategy),
        DeviceConfig::MigDeviceConfig(MigDeviceConfig { sharing }) => {
            sharing.as_ref().map(|s| s.strategy)
        }
    };
    match strategy {
        Some(SharingStrategy::Mps) => Err((
            "sharing.strategy",
            "MPS is not supported by this driver yet (TimeSlicing is); the claim is refused \
             rather than prepared without it"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// The settings time-slicing will give a full GPU, if the configuration asks for it.
fn wanted(config: Option<&DeviceConfig>) -> Option<SharingSettings> {
    let Some(DeviceConfig::GpuConfig(GpuConfig {
        sharing:
            Some(GpuSharing {
                strategy: SharingStrategy::TimeSlicing,
                time_slicing_config,
                ..
            }),
    })) = config
    else {
        return None;
    };
    let interval = time_slicing_config
        .as_ref()
        .and_then(|c| c.interval)
        .unwrap_or(crate::config::TimeSliceInterval::Default);
    Some(SharingSettings {
        compute_mode: ComputeMode::Default,
        timeslice: Some(interval.nvml_value()),
    })
}

/// What must be recorded before preparing a full GPU with this configuration: its current
/// settings, when time-slicing will change them.
pub fn record_before(
    gpus: &dyn GpuControl,
    minor: u32,
    config: Option<&DeviceConfig>,
) -> Result<Option<SharingRecord>, GpuError> {
    if wanted(config).is_none() {
        return Ok(None);
    }
    Ok(Some(SharingRecord {
        minor,
        before: gpus.sharing_settings(minor)?,
    }))
}

/// Applies a prepared device's sharing configuration to the hardware.
pub fn apply(gpus: &dyn GpuControl, record: &DeviceRecord) -> Result<(), GpuError> {
    if let Some(DeviceConfig::MigDeviceConfig(MigDeviceConfig {
        sharing: Some(sharing),
    })) = &record.config
        && sharing.strategy == SharingStrategy::TimeSlicing
    {
        tracing::warn!(device = %record.device, "TimeSlicing on a MIG device: nothing to set, its processes are time-sliced already");
    }
    match (&record.sharing, wanted(record.config.as_ref())) {
        (Some(sharing), Some(settings)) => {
            gpus.set_sharing_settings(sharing.minor, settings)?;
            tracing::info!(device = %record.device, uuid = %record.uuid, timeslice = ?settings.timeslice, "time-slicing applied");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Puts back what [`apply`] changed (also after a crash at any point in between).
pub fn revert(gpus: &dyn GpuControl, record: &DeviceRecord) -> Result<(), GpuError> {
    let Some(sharing) = &record.sharing else {
        return Ok(());
    };
    let before = SharingSettings {
        compute_mode: sharing.before.compute_mode,
        // Unknown (NVML cannot read it): the driver's default, as NVIDIA's driver restores.
        timeslice: Some(sharing.before.timeslice.unwrap_or(0)),
    };
    gpus.set_sharing_settings(sharing.minor, before)
}
