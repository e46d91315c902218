//! Device health series: each published device's health state, its fault taints, and the XID
//! and double-bit ECC events counted per GPU.
use prometheus_client::encoding::EncodeLabelSet;

use super::Metrics;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeviceStateLabel {
    device: String,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TaintLabel {
    device: String,
    key: String,
    effect: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct XidLabel {
    gpu: String,
    xid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GpuLabel {
    gpu: String,
}

impl Metrics {
    /// Each device's health after a probe round; devices no longer reported are dropped.
    pub fn observe_device_health(&self, health: &[crate::plugin::DeviceHealth]) {
        use crate::plugin::DeviceHealthStatus;
        let set: Vec<(String, bool)> = health
            .iter()
            .map(|d| {
                (
                    d.device_name.clone(),
                    d.status == DeviceHealthStatus::Healthy,
                )
            })
            .collect();
        let mut last = self
            .device_health_set
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *last == set {
            return;
        }
        *last = set;
        self.device_health.clear();
        for device in health {
            let healthy = device.status == DeviceHealthStatus::Healthy;
            for (state, value) in [("healthy", healthy), ("unhealthy", !healthy)] {
                self.device_health
                    .get_or_create(&DeviceStateLabel {
                        device: device.device_name.clone(),
                        state,
                    })
                    .set(i64::from(value));
            }
        }
    }

    /// The fault taints on the published devices now; devices no longer tainted are dropped.
    pub fn observe_device_taints(
        &self,
        taints: &std::collections::BTreeMap<
            String,
            Vec<k8s_openapi::api::resource::v1::DeviceTaint>,
        >,
    ) {
        self.device_taints.clear();
        for (device, taints) in taints {
            for taint in taints {
                self.device_taints
                    .get_or_create(&TaintLabel {
                        device: device.clone(),
                        key: taint.key.clone(),
                        effect: taint.effect.clone(),
                    })
                    .set(1);
            }
        }
    }

    /// Counts one NVML event.
    pub fn observe_gpu_event(&self, event: &crate::gpu::events::GpuEvent) {
        use crate::gpu::events::GpuEventKind;
        match event.kind {
            GpuEventKind::Xid { code } => {
                self.xid_errors
                    .get_or_create(&XidLabel {
                        gpu: event.minor.to_string(),
                        xid: code.to_string(),
                    })
                    .inc();
            }
            GpuEventKind::DoubleBitEcc => {
                self.ecc_errors
                    .get_or_create(&GpuLabel {
                        gpu: event.minor.to_string(),
                    })
                    .inc();
            }
            // Not an error; the MIG device gauges show what changed.
            GpuEventKind::MigConfigChange => {}
        }
    }
}
