//! Where the health monitor's conclusions go on a running node: taints into the slices, Node
//! events, metrics.
use std::sync::Arc;
use std::time::Duration;

use super::events::{NodeEvent, report_on_node};
use super::slice_updater::SliceUpdater;
use crate::health::HealthChange;
use crate::health::monitor::HealthSink;
use crate::metrics::Metrics;

/// The health monitor's conclusions: taints into the slices, Node events, metrics.
pub(super) struct NodeHealth {
    pub(super) updater: Arc<SliceUpdater>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) client: kube::Client,
    pub(super) node_name: String,
    pub(super) driver_name: String,
    pub(super) timeout: Duration,
}

impl HealthSink for NodeHealth {
    fn taints_changed(
        &self,
        taints: std::collections::BTreeMap<
            String,
            Vec<k8s_openapi::api::resource::v1::DeviceTaint>,
        >,
    ) {
        self.metrics.observe_device_taints(&taints);
        self.updater.set_taints(taints);
    }

    fn changed(&self, change: &HealthChange) {
        let (warning, reason, action) = match change {
            HealthChange::Raised(_) => (true, "GpuUnhealthy", "Taint"),
            HealthChange::Cleared(..) => (false, "GpuHealthy", "Untaint"),
        };
        let (client, node, driver) = (
            self.client.clone(),
            self.node_name.clone(),
            self.driver_name.clone(),
        );
        let note = change.describe();
        let timeout = self.timeout;
        tokio::spawn(async move {
            let event = NodeEvent {
                warning,
                reason,
                action,
                note: &note,
            };
            let report = report_on_node(&client, &node, &driver, event);
            if let Err(e) = crate::kubeapi::bounded(timeout, report).await {
                tracing::warn!(error = %e, node = %node, "cannot record a device health change as a Node event");
            }
        });
    }

    fn event_seen(&self, event: &crate::gpu::events::GpuEvent) {
        self.metrics.observe_gpu_event(event);
    }

    fn device_health(&self, health: &[crate::plugin::DeviceHealth]) {
        self.metrics.observe_device_health(health);
    }
}
