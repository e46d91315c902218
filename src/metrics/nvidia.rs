//! NVIDIA's kubelet plugin's series (`nvidia_dra_*`), kept with their names, labels and buckets
//! so that dashboards and alerts written for NVIDIA's driver keep working; [`MeasuredDriver`]
//! counts another plugin of this process (the ComputeDomain channel plugin) in them.
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::{Metrics, to_gauge};
use crate::prepare::ClaimRef;
use crate::prepare::checkpoint::Checkpoint;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NvidiaRequestLabels {
    driver: String,
    operation: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NvidiaErrorLabels {
    driver: String,
    error_type: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NvidiaDeviceLabels {
    node: String,
    driver: String,
    device_type: &'static str,
}

fn nvidia_duration_histogram() -> Histogram {
    // NVIDIA's buckets: 50 ms doubling to 12.8 s.
    Histogram::new(exponential_buckets(0.05, 2.0, 9))
}

/// The series NVIDIA's kubelet plugin exports (`nvidia_dra_*`, its `pkg/metrics`), with its
/// names, labels, buckets and device types, so dashboards and alerts written for NVIDIA's
/// driver keep working: requests by driver and operation (counted and timed when they succeed,
/// as NVIDIA counts them), in flight, errors by type, and prepared devices by type.
pub(super) struct NvidiaMetrics {
    /// The GPU driver's name (the `driver` label of its series).
    pub(super) driver: String,
    node: String,
    requests: Family<NvidiaRequestLabels, Counter>,
    duration: Family<NvidiaRequestLabels, Histogram, fn() -> Histogram>,
    inflight: Family<NvidiaRequestLabels, Gauge>,
    prepare_errors: Family<NvidiaErrorLabels, Counter>,
    unprepare_errors: Family<NvidiaErrorLabels, Counter>,
    prepared_devices: Family<NvidiaDeviceLabels, Gauge>,
}

/// NVIDIA's device types (`gpu`, `mig`, `vfio`, `unknown`).
const NVIDIA_DEVICE_TYPES: [&str; 4] = ["gpu", "mig", "vfio", "unknown"];

impl NvidiaMetrics {
    pub(super) fn register(registry: &mut Registry, driver: &str, node: &str) -> Self {
        let metrics = Self {
            driver: driver.to_string(),
            node: node.to_string(),
            requests: Family::default(),
            duration: Family::new_with_constructor(nvidia_duration_histogram),
            inflight: Family::default(),
            prepare_errors: Family::default(),
            unprepare_errors: Family::default(),
            prepared_devices: Family::default(),
        };
        registry.register(
            "requests",
            "Total number of DRA prepare and unprepare requests",
            metrics.requests.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Duration of DRA prepare and unprepare requests",
            Unit::Seconds,
            metrics.duration.clone(),
        );
        registry.register(
            "requests_inflight",
            "Number of in-flight DRA prepare and unprepare requests",
            metrics.inflight.clone(),
        );
        registry.register(
            "prepared_devices",
            "Current number of prepared devices by device type",
            metrics.prepared_devices.clone(),
        );
        registry.register(
            "node_prepare_errors",
            "Total number of failures during DRA node prepare for kubelet plugins",
            metrics.prepare_errors.clone(),
        );
        registry.register(
            "node_unprepare_errors",
            "Total number of failures during DRA node unprepare for kubelet plugins",
            metrics.unprepare_errors.clone(),
        );
        metrics.add_driver(driver);
        metrics
    }

    /// Zero-valued request series from the start, as NVIDIA's driver creates them.
    fn add_driver(&self, driver: &str) {
        for operation in ["prepare", "unprepare"] {
            let labels = Self::labels(driver, operation);
            let _ = self.requests.get_or_create(&labels);
            let _ = self.duration.get_or_create(&labels);
            let _ = self.inflight.get_or_create(&labels);
        }
    }

    fn labels(driver: &str, operation: &'static str) -> NvidiaRequestLabels {
        NvidiaRequestLabels {
            driver: driver.to_string(),
            operation,
        }
    }

    pub(super) fn starting(&self, driver: &str, operation: &'static str, claims: usize) {
        self.inflight
            .get_or_create(&Self::labels(driver, operation))
            .inc_by(to_gauge(claims));
    }

    pub(super) fn finished(&self, driver: &str, operation: &'static str, ok: bool, seconds: f64) {
        let labels = Self::labels(driver, operation);
        self.inflight.get_or_create(&labels).dec();
        if ok {
            self.requests.get_or_create(&labels).inc();
            self.duration.get_or_create(&labels).observe(seconds);
            return;
        }
        let (errors, error_type) = if operation == "prepare" {
            (&self.prepare_errors, "prepare_devices")
        } else {
            (&self.unprepare_errors, "unprepare_devices")
        };
        errors
            .get_or_create(&NvidiaErrorLabels {
                driver: driver.to_string(),
                error_type,
            })
            .inc();
    }

    fn set_prepared_devices(&self, driver: &str, device_type: &'static str, count: usize) {
        self.prepared_devices
            .get_or_create(&NvidiaDeviceLabels {
                node: self.node.clone(),
                driver: driver.to_string(),
                device_type,
            })
            .set(to_gauge(count));
    }

    /// Devices of the completed claims by NVIDIA's device type, every type present (zero too).
    pub(super) fn observe_checkpoint(&self, checkpoint: &Checkpoint) {
        let mut counts = [0usize; NVIDIA_DEVICE_TYPES.len()];
        for device in checkpoint
            .claims
            .values()
            .filter(|claim| claim.is_completed())
            .flat_map(|claim| &claim.devices)
        {
            // No device of ours is of a type NVIDIA's would call unknown: that one stays 0.
            let kind = if device.vfio.is_some() {
                2
            } else if device.mig.is_some() {
                1
            } else {
                0
            };
            counts[kind] += 1;
        }
        for (device_type, count) in NVIDIA_DEVICE_TYPES.into_iter().zip(counts) {
            self.set_prepared_devices(&self.driver, device_type, count);
        }
    }
}

/// Another kubelet plugin of this process (the ComputeDomain channel plugin), whose calls and
/// prepared devices count in NVIDIA's series under its own driver name, as NVIDIA's plugin of
/// that name counts them.
pub struct MeasuredDriver {
    inner: Arc<dyn crate::prepare::NodeDriver>,
    driver: String,
    metrics: Arc<Metrics>,
}

impl MeasuredDriver {
    pub fn new(
        inner: Arc<dyn crate::prepare::NodeDriver>,
        driver: &str,
        metrics: Arc<Metrics>,
    ) -> Self {
        metrics.nvidia.add_driver(driver);
        let measured = Self {
            inner,
            driver: driver.to_string(),
            metrics,
        };
        // What the plugin holds from before this start counts from the start.
        measured.observe_prepared_devices();
        measured
    }

    fn observe_prepared_devices(&self) {
        for (device_type, count) in self.inner.prepared_device_counts() {
            self.metrics
                .nvidia
                .set_prepared_devices(&self.driver, device_type, count);
        }
    }
}

impl MeasuredDriver {
    /// Counts each claim's result of a call that began at `started` with `results.len()` claims.
    fn finished<T>(
        &self,
        operation: &'static str,
        started: std::time::Instant,
        results: &[(ClaimRef, Result<T, String>)],
    ) {
        let seconds = started.elapsed().as_secs_f64();
        for (_, result) in results {
            self.metrics
                .nvidia
                .finished(&self.driver, operation, result.is_ok(), seconds);
        }
        self.observe_prepared_devices();
    }
}

#[tonic::async_trait]
impl crate::prepare::NodeDriver for MeasuredDriver {
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Vec<(ClaimRef, crate::prepare::PrepareResult)> {
        let started = std::time::Instant::now();
        self.metrics
            .nvidia
            .starting(&self.driver, "prepare", claims.len());
        let results = self.inner.prepare(claims).await;
        self.finished("prepare", started, &results);
        results
    }

    async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> Vec<(ClaimRef, crate::prepare::UnprepareResult)> {
        let started = std::time::Instant::now();
        self.metrics
            .nvidia
            .starting(&self.driver, "unprepare", claims.len());
        let results = self.inner.unprepare(claims).await;
        self.finished("unprepare", started, &results);
        results
    }

    fn prepared_device_counts(&self) -> Vec<(&'static str, usize)> {
        self.inner.prepared_device_counts()
    }
}
