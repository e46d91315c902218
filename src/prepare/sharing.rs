//! Per-claim GPU sharing (`GpuConfig` / `MigDeviceConfig` `sharing`).
//!
//! The configuration is decoded, validated and recorded with the prepared device so that unprepare
//! knows what to revert. Applying it to real hardware (compute policy for time-slicing, an MPS
//! control daemon) needs `nvidia-smi`/MPS on the node; on simulated GPUs there is nothing to
//! change, so both steps only log.
use super::checkpoint::DeviceRecord;
use super::state::PrepareError;
use crate::config::{DeviceConfig, GpuConfig, MigDeviceConfig};

pub fn apply(record: &DeviceRecord) -> Result<(), PrepareError> {
    if let Some(strategy) = strategy(record) {
        tracing::debug!(device = %record.device, uuid = %record.uuid, strategy, "sharing configured");
    }
    Ok(())
}

pub fn revert(record: &DeviceRecord) -> Result<(), PrepareError> {
    if let Some(strategy) = strategy(record) {
        tracing::debug!(device = %record.device, uuid = %record.uuid, strategy, "sharing reverted");
    }
    Ok(())
}

fn strategy(record: &DeviceRecord) -> Option<&'static str> {
    let strategy = match record.config.as_ref()? {
        DeviceConfig::GpuConfig(GpuConfig { sharing }) => sharing.as_ref()?.strategy,
        DeviceConfig::MigDeviceConfig(MigDeviceConfig { sharing }) => sharing.as_ref()?.strategy,
    };
    Some(match strategy {
        crate::config::SharingStrategy::TimeSlicing => "TimeSlicing",
        crate::config::SharingStrategy::Mps => "MPS",
    })
}
