//! Prometheus metrics and the HTTP probe endpoints of `gpu-dra run --metrics-addr`.
//!
//! [`Metrics`] is fed by the driver (as a [`DriverObserver`]), by the ResourceSlice publisher's
//! sync results and by kubelet's registration verdicts; [`MetricsServer`] serves it as
//! Prometheus text on `/metrics`, with `/healthz` (the process answers) and `/readyz`
//! (registered with kubelet and the first slice sync done).
//!
//! This module registers every series and holds the driver's own (requests, slices,
//! readiness); `nvidia` has NVIDIA's driver's series, `health` the device health and fault
//! series, `claims` the per-claim device info and use.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::sync::watch;

use crate::gpu::NodeInventory;
use crate::plugin::KubeletRegistration;
use crate::prepare::ClaimRef;
use crate::prepare::checkpoint::Checkpoint;
use crate::prepare::driver::{ClaimUser, DriverObserver, Operation};
use crate::prepare::state::DeviceState;
use crate::slices::publish::{PublishError, SyncReport};

pub mod auth;
mod claims;
mod health;
mod nvidia;
mod server;

pub use claims::pod_uid_of_cgroup;
pub use nvidia::MeasuredDriver;
pub use server::{MetricsError, MetricsServer};

use claims::{ClaimPods, PreparedDeviceLabels, UsageLabels};
use health::{DeviceStateLabel, GpuLabel, TaintLabel, XidLabel};
use nvidia::NvidiaMetrics;

#[cfg(test)]
mod tests;

/// Every metric name starts with this (`gpu_dra_prepare_requests_total`, ...).
pub const METRIC_PREFIX: &str = "gpu_dra";
/// NVIDIA's driver's series keep their own prefix (`nvidia_dra_requests_total`, ...).
pub const NVIDIA_METRIC_PREFIX: &str = "nvidia_dra";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

impl ResultLabel {
    fn of(ok: bool) -> Self {
        Self {
            result: if ok { "ok" } else { "error" },
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

/// A request's latency histogram and its per-result and error counters.
struct RequestMetrics {
    requests: Family<ResultLabel, Counter>,
    errors: Counter,
    duration: Histogram,
}

impl RequestMetrics {
    fn register(registry: &mut Registry, name: &str, what: &str) -> Self {
        let metrics = Self {
            requests: Family::default(),
            errors: Counter::default(),
            // 1 ms … ~33 s: a full GPU is prepared in milliseconds, MIG carving and API round
            // trips take up to seconds.
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        };
        registry.register(
            format!("{name}_requests"),
            format!("Claims kubelet asked to {what}, by result"),
            metrics.requests.clone(),
        );
        registry.register(
            format!("{name}_errors"),
            format!("Claims that failed to {what}"),
            metrics.errors.clone(),
        );
        registry.register_with_unit(
            format!("{name}_duration"),
            format!("Time from the kubelet call until a claim was {what}d (or failed)"),
            Unit::Seconds,
            metrics.duration.clone(),
        );
        metrics
    }

    fn record(&self, ok: bool, seconds: f64) {
        self.requests.get_or_create(&ResultLabel::of(ok)).inc();
        if !ok {
            self.errors.inc();
        }
        self.duration.observe(seconds);
    }
}

/// Whether the node agent is ready to serve kubelet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub registered: bool,
    pub slices_synced: bool,
    /// A seamless upgrade's new instance while the old one still publishes the node's slices
    /// (it holds the publisher lock): ready to serve kubelet, so the DaemonSet rollout can
    /// retire the old pod, after which this one takes over publishing.
    pub publisher_standby: bool,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.registered && (self.slices_synced || self.publisher_standby)
    }

    /// What is still missing, for the `/readyz` body.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if !self.registered {
            missing.push("not registered with kubelet");
        }
        if !self.slices_synced && !self.publisher_standby {
            missing.push("ResourceSlices not published yet");
        }
        missing
    }
}

/// The node agent's metrics and readiness.
pub struct Metrics {
    registry: Registry,
    nvidia: NvidiaMetrics,
    prepare: RequestMetrics,
    unprepare: RequestMetrics,
    prepared_claims: Gauge,
    prepared_devices: Gauge,
    published_devices: Gauge,
    mig_instances: Gauge,
    checkpoint_unusable: Gauge,
    driver_tool_unusable: Family<ToolLabel, Gauge>,
    slice_writes: Family<OperationLabel, Counter>,
    slice_sync_errors: Counter,
    device_health: Family<DeviceStateLabel, Gauge>,
    /// What `device_health` was last set from (device, healthy): the monitor reports every
    /// round, and most rounds change nothing.
    device_health_set: std::sync::Mutex<Vec<(String, bool)>>,
    prepared_device_info: Family<PreparedDeviceLabels, Gauge>,
    /// The pods each claim (by UID) is reserved for, and what the info series were last
    /// rendered from, so a change of either renders them again.
    claim_pods: std::sync::Mutex<ClaimPods>,
    xid_errors: Family<XidLabel, Counter>,
    ecc_errors: Family<GpuLabel, Counter>,
    device_taints: Family<TaintLabel, Gauge>,
    claim_memory_used: Family<UsageLabels, Gauge>,
    claim_utilization: Family<UsageLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    claim_processes: Family<UsageLabels, Gauge>,
    pod_memory_used: Family<UsageLabels, Gauge>,
    mps_daemon_restarts: Counter,
    registered_gauge: Gauge,
    registered: AtomicBool,
    slices_synced: AtomicBool,
    publisher_standby: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Metrics of the default driver (`gpu.nvidia.com`) on a node whose name is not known.
    pub fn new() -> Self {
        Self::for_node(crate::slices::DEFAULT_DRIVER_NAME, "")
    }

    /// Metrics of `driver` on node `node` (the labels of NVIDIA's series).
    pub fn for_node(driver: &str, node: &str) -> Self {
        let mut root = Registry::default();
        let nvidia = NvidiaMetrics::register(
            root.sub_registry_with_prefix(NVIDIA_METRIC_PREFIX),
            driver,
            node,
        );
        let registry = root.sub_registry_with_prefix(METRIC_PREFIX);
        let prepare = RequestMetrics::register(&mut *registry, "prepare", "prepare");
        let unprepare = RequestMetrics::register(&mut *registry, "unprepare", "unprepare");
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let prepared_claims = gauge(
            &mut *registry,
            "prepared_claims",
            "Claims prepared on this node (checkpointed as complete)",
        );
        let prepared_devices = gauge(
            &mut *registry,
            "prepared_devices",
            "Devices of the claims prepared on this node",
        );
        let published_devices = gauge(
            &mut *registry,
            "published_devices",
            "Devices in this node's ResourceSlices as last synced with the API server",
        );
        let mig_instances = gauge(
            &mut *registry,
            "mig_instances",
            "MIG devices (GPU instance + compute instance) that exist on this node's GPUs",
        );
        let checkpoint_unusable = gauge(
            &mut *registry,
            "checkpoint_unusable",
            "1 while the checkpoint cannot be used (corrupt or from a newer version) and the driver refuses to prepare or unprepare",
        );
        let driver_tool_unusable = Family::<ToolLabel, Gauge>::default();
        registry.register(
            "driver_tool_unusable",
            "1 for each tool of the driver root that cannot run on this node (nvidia-smi, nvidia-cuda-mps-control): only the claims that need it are refused, with the reason; everything else is served",
            driver_tool_unusable.clone(),
        );
        let slice_writes = Family::<OperationLabel, Counter>::default();
        registry.register(
            "slice_sync_writes",
            "ResourceSlice writes to the API server, by operation (create, update, delete)",
            slice_writes.clone(),
        );
        let slice_sync_errors = Counter::default();
        registry.register(
            "slice_sync_errors",
            "ResourceSlice syncs that failed (retried with backoff)",
            slice_sync_errors.clone(),
        );
        let device_health = Family::<DeviceStateLabel, Gauge>::default();
        registry.register(
            "device_health",
            "1 for each published device's current health state (healthy, unhealthy), 0 for the other",
            device_health.clone(),
        );
        let prepared_device_info = Family::<PreparedDeviceLabels, Gauge>::default();
        registry.register(
            "prepared_device_info",
            "1 for each device of each claim prepared on this node: the claim (namespace, claim, claim_uid, request, pods: the namespace/name of the pods it is reserved for), the DRA device (dra_device), the GPU and MIG device as DCGM exporter labels them (UUID, GPU_I_ID, GPU_I_PROFILE, Hostname) with mig_uuid and compute_instance_id, and how it is shared (sharing, consumed, admin_access); join DCGM's series on UUID and GPU_I_ID",
            prepared_device_info.clone(),
        );
        let xid_errors = Family::<XidLabel, Counter>::default();
        registry.register(
            "gpu_xid_errors",
            "XID events by GPU and XID, ignored ones included",
            xid_errors.clone(),
        );
        let ecc_errors = Family::<GpuLabel, Counter>::default();
        registry.register(
            "gpu_ecc_double_bit_errors",
            "Double-bit ECC error events by GPU",
            ecc_errors.clone(),
        );
        let device_taints = Family::<TaintLabel, Gauge>::default();
        registry.register(
            "device_taint",
            "1 for each taint the driver puts on a published device for a GPU fault (key: gpu.nvidia.com/xid, gpu-lost, ecc-dbe, reset-required; effect)",
            device_taints.clone(),
        );
        let mps_daemon_restarts = Counter::default();
        registry.register(
            "mps_daemon_restarts",
            "MPS control daemons of prepared claims found dead and started again",
            mps_daemon_restarts.clone(),
        );
        let claim_memory_used = Family::<UsageLabels, Gauge>::default();
        registry.register_with_unit(
            "claim_device_memory_used",
            "GPU memory in use on each prepared claim's device, from NVML every --usage-interval: the whole GPU's for a full GPU (every process on it, shared or not), its compute processes' for a MIG device",
            Unit::Bytes,
            claim_memory_used.clone(),
        );
        let claim_utilization =
            Family::<UsageLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "claim_device_utilization_ratio",
            "Fraction of time a kernel ran on each prepared claim's full GPU over NVML's last sample period (none for MIG devices: NVML has no per-instance figure)",
            claim_utilization.clone(),
        );
        let claim_processes = Family::<UsageLabels, Gauge>::default();
        registry.register(
            "claim_device_processes",
            "Compute processes NVML sees on each prepared claim's device",
            claim_processes.clone(),
        );
        let pod_memory_used = Family::<UsageLabels, Gauge>::default();
        registry.register_with_unit(
            "pod_device_memory_used",
            "GPU memory the compute processes of each pod a prepared claim is reserved for use on the claim's device (processes mapped to pods through their cgroups, read in the host's /proc: the chart's hostPID)",
            Unit::Bytes,
            pod_memory_used.clone(),
        );
        let registered_gauge = gauge(
            &mut *registry,
            "registered",
            "1 while kubelet accepts the plugin registration, 0 otherwise (kubelet cannot prepare claims then)",
        );
        Self {
            registry: root,
            nvidia,
            device_taints,
            claim_memory_used,
            claim_utilization,
            claim_processes,
            pod_memory_used,
            mps_daemon_restarts,
            registered_gauge,
            device_health,
            device_health_set: std::sync::Mutex::new(Vec::new()),
            prepared_device_info,
            claim_pods: std::sync::Mutex::new(ClaimPods::default()),
            xid_errors,
            ecc_errors,
            prepare,
            unprepare,
            prepared_claims,
            prepared_devices,
            published_devices,
            mig_instances,
            checkpoint_unusable,
            driver_tool_unusable,
            slice_writes,
            slice_sync_errors,
            registered: AtomicBool::new(false),
            slices_synced: AtomicBool::new(false),
            publisher_standby: AtomicBool::new(false),
        }
    }

    /// MPS control daemons found dead and started again.
    pub fn observe_mps_restarts(&self, count: usize) {
        self.mps_daemon_restarts.inc_by(count as u64);
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// The driver refuses all node operations because its checkpoint cannot be used.
    pub fn observe_checkpoint_unusable(&self) {
        self.checkpoint_unusable.set(1);
    }

    /// A tool of the driver root that cannot run here (found at start).
    pub fn observe_tool_unusable(&self, tool: &str) {
        self.driver_tool_unusable
            .get_or_create(&ToolLabel {
                tool: tool.to_string(),
            })
            .set(1);
    }

    /// Counts the MIG devices of an inventory (at start and after every state change).
    pub fn observe_inventory(&self, inventory: &NodeInventory) {
        let instances: usize = inventory
            .gpus
            .iter()
            .filter_map(|gpu| gpu.mig.as_ref())
            .map(|mig| mig.instances.len())
            .sum();
        self.mig_instances.set(to_gauge(instances));
    }

    /// Counts the prepared claims and their devices. Claims still being prepared (or rolled
    /// back at the next start) do not count.
    pub fn observe_checkpoint(&self, checkpoint: &Checkpoint) {
        let completed = checkpoint
            .claims
            .values()
            .filter(|claim| claim.is_completed());
        let (claims, devices) = completed.fold((0, 0), |(claims, devices), claim| {
            (claims + 1, devices + claim.devices.len())
        });
        self.prepared_claims.set(to_gauge(claims));
        self.prepared_devices.set(to_gauge(devices));
        self.nvidia.observe_checkpoint(checkpoint);
    }

    /// Records one run of the ResourceSlice publisher; `published_devices` is the device count
    /// of the slices it synced.
    pub fn observe_slice_sync(
        &self,
        result: &Result<SyncReport, PublishError>,
        published_devices: usize,
    ) {
        match result {
            Ok(report) => {
                for (operation, count) in [
                    ("create", report.created),
                    ("update", report.updated),
                    ("delete", report.deleted),
                ] {
                    if count > 0 {
                        self.slice_writes
                            .get_or_create(&OperationLabel { operation })
                            .inc_by(count as u64);
                    }
                }
                self.published_devices.set(to_gauge(published_devices));
                self.slices_synced.store(true, Ordering::Relaxed);
            }
            Err(_) => {
                self.slice_sync_errors.inc();
            }
        }
    }

    /// Whether this instance waits for another one (the pod it replaces) to stop publishing.
    pub fn set_publisher_standby(&self, standby: bool) {
        self.publisher_standby.store(standby, Ordering::Relaxed);
    }

    /// Records kubelet's latest verdict on the plugin registration.
    pub fn observe_registration(&self, registration: &KubeletRegistration) {
        let registered = *registration == KubeletRegistration::Registered;
        self.registered.store(registered, Ordering::Relaxed);
        self.registered_gauge.set(i64::from(registered));
    }

    pub fn readiness(&self) -> Readiness {
        Readiness {
            registered: self.registered.load(Ordering::Relaxed),
            slices_synced: self.slices_synced.load(Ordering::Relaxed),
            publisher_standby: self.publisher_standby.load(Ordering::Relaxed),
        }
    }

    /// Follows kubelet's registration verdicts until `shutdown` fires (or the plugin is gone).
    pub fn follow_registration(
        self: Arc<Self>,
        mut registration: watch::Receiver<KubeletRegistration>,
        mut shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                self.observe_registration(&registration.borrow_and_update());
                tokio::select! {
                    changed = registration.changed() => if changed.is_err() { break },
                    _ = shutdown.changed() => break,
                }
            }
        })
    }
}

impl DriverObserver for Metrics {
    fn starting(&self, operation: Operation, claims: usize) {
        self.nvidia
            .starting(&self.nvidia.driver, operation.as_str(), claims);
    }

    fn prepared(&self, _claim: &ClaimRef, ok: bool, seconds: f64) {
        self.prepare.record(ok, seconds);
        self.nvidia
            .finished(&self.nvidia.driver, "prepare", ok, seconds);
    }

    fn unprepared(&self, _claim: &ClaimRef, ok: bool, seconds: f64) {
        self.unprepare.record(ok, seconds);
        self.nvidia
            .finished(&self.nvidia.driver, "unprepare", ok, seconds);
    }

    fn claim_users(&self, claim_uid: &str, pods: &[ClaimUser]) {
        self.observe_claim_pods(claim_uid, pods);
    }

    fn state_changed(&self, state: &DeviceState) {
        let checkpoint = state.checkpoint();
        let inventory = state.inventory();
        self.observe_checkpoint(&checkpoint);
        self.observe_inventory(&inventory);
        self.observe_prepared_devices(&checkpoint, &inventory);
    }
}

fn to_gauge(count: usize) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Hands every driver event to several observers (slice updates and metrics), in order.
pub struct ObserverList(pub Vec<Arc<dyn DriverObserver>>);

impl DriverObserver for ObserverList {
    fn starting(&self, operation: Operation, claims: usize) {
        for observer in &self.0 {
            observer.starting(operation, claims);
        }
    }

    fn prepared(&self, claim: &ClaimRef, ok: bool, seconds: f64) {
        for observer in &self.0 {
            observer.prepared(claim, ok, seconds);
        }
    }

    fn unprepared(&self, claim: &ClaimRef, ok: bool, seconds: f64) {
        for observer in &self.0 {
            observer.unprepared(claim, ok, seconds);
        }
    }

    fn state_changed(&self, state: &DeviceState) {
        for observer in &self.0 {
            observer.state_changed(state);
        }
    }

    fn claim_users(&self, claim_uid: &str, pods: &[ClaimUser]) {
        for observer in &self.0 {
            observer.claim_users(claim_uid, pods);
        }
    }
}
