//! Prometheus metrics and the HTTP probe endpoints of `gpu-dra run --metrics-addr`.
//!
//! [`Metrics`] is fed by the driver (as a [`DriverObserver`]), by the ResourceSlice publisher's
//! sync results and by kubelet's registration verdicts; [`MetricsServer`] serves it as
//! Prometheus text on `/metrics`, with `/healthz` (the process answers) and `/readyz`
//! (registered with kubelet and the first slice sync done).
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
mod server;

pub use server::{MetricsError, MetricsServer};

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
struct DeviceStateLabel {
    device: String,
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaintLabel {
    device: String,
    key: String,
    effect: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct XidLabel {
    gpu: String,
    xid: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabel {
    gpu: String,
}

#[derive(Default)]
struct ClaimPods {
    pods: std::collections::HashMap<String, Vec<ClaimUser>>,
    last: Option<(Checkpoint, NodeInventory)>,
    /// The GPUs' use as last read (by minor), so a claim's use series go with its unprepare.
    usage: std::collections::BTreeMap<u32, crate::gpu::usage::GpuUsage>,
    /// The pod (UID) each of those processes runs in, from its cgroup.
    process_pods: std::collections::BTreeMap<u32, String>,
}

/// Labels of the per-claim use series: the claim and its device as `prepared_device_info` names
/// them (join on `claim_uid` and `dra_device`, or with DCGM on `UUID` and `GPU_I_ID`).
type UsageLabels = Vec<(&'static str, String)>;

/// Labels of `prepared_device_info`, in order. `UUID`, `GPU_I_ID`, `GPU_I_PROFILE` and
/// `Hostname` are DCGM exporter's names, so PromQL joins its series with ours on them.
type PreparedDeviceLabels = Vec<(&'static str, String)>;

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
struct NvidiaMetrics {
    /// The GPU driver's name (the `driver` label of its series).
    driver: String,
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
    fn register(registry: &mut Registry, driver: &str, node: &str) -> Self {
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

    fn starting(&self, driver: &str, operation: &'static str, claims: usize) {
        self.inflight
            .get_or_create(&Self::labels(driver, operation))
            .inc_by(to_gauge(claims));
    }

    fn finished(&self, driver: &str, operation: &'static str, ok: bool, seconds: f64) {
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
    fn observe_checkpoint(&self, checkpoint: &Checkpoint) {
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

    /// The GPUs (minors) of the prepared claims' devices: what the use reader asks.
    pub fn usage_targets(&self) -> std::collections::BTreeSet<u32> {
        let claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        let Some((checkpoint, inventory)) = &claim_pods.last else {
            return Default::default();
        };
        checkpoint
            .claims
            .values()
            .filter(|c| c.is_completed())
            .flat_map(|c| &c.devices)
            .filter_map(|d| device_gpu(d, inventory).map(|(minor, _, _)| minor))
            .collect()
    }

    /// Whether any use is reported now (a round with no prepared claim clears it).
    pub fn has_usage(&self) -> bool {
        let claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        !claim_pods.usage.is_empty() || !claim_pods.process_pods.is_empty()
    }

    /// One round of GPU use (by minor): each prepared claim's device gets its memory in use,
    /// process count and, for a full GPU, its utilization. Devices of GPUs not read this round
    /// have no series until the next.
    pub fn observe_usage(
        &self,
        usage: &std::collections::BTreeMap<u32, crate::gpu::usage::GpuUsage>,
        process_pods: &std::collections::BTreeMap<u32, String>,
    ) {
        let mut claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        claim_pods.usage = usage.clone();
        claim_pods.process_pods = process_pods.clone();
        self.render_usage(&claim_pods);
    }

    /// The use series of the prepared claims' devices, from the use last read.
    fn render_usage(&self, claim_pods: &ClaimPods) {
        self.claim_memory_used.clear();
        self.claim_utilization.clear();
        self.claim_processes.clear();
        self.pod_memory_used.clear();
        let usage = &claim_pods.usage;
        let Some((checkpoint, inventory)) = &claim_pods.last else {
            return;
        };
        for claim in checkpoint.claims.values().filter(|c| c.is_completed()) {
            for device in &claim.devices {
                let Some((minor, uuid, gi)) = device_gpu(device, inventory) else {
                    continue;
                };
                let Some(gpu_usage) = usage.get(&minor) else {
                    continue;
                };
                let labels: UsageLabels = vec![
                    ("namespace", claim.namespace.clone()),
                    ("claim", claim.name.clone()),
                    ("claim_uid", claim.uid.clone()),
                    ("dra_device", device.device.clone()),
                    ("UUID", uuid),
                    ("GPU_I_ID", gi.map(|g| g.to_string()).unwrap_or_default()),
                    ("Hostname", device.pool.clone()),
                ];
                let on_device: Vec<&crate::gpu::usage::ProcessUsage> = gpu_usage
                    .processes
                    .iter()
                    .filter(|p| gi.is_none() || p.gpu_instance_id == gi)
                    .collect();
                let (memory, processes) = match gi {
                    Some(gi) => (gpu_usage.gpu_instance_memory(gi), on_device.len()),
                    None => (gpu_usage.memory_used_bytes, on_device.len()),
                };
                // Per pod: the device's processes in the cgroups of the pods the claim is
                // reserved for (another claim's pods on a shared GPU count under that claim).
                let mut by_pod: std::collections::BTreeMap<&str, u64> = Default::default();
                for process in &on_device {
                    let Some(pod_uid) = claim_pods.process_pods.get(&process.pid) else {
                        continue;
                    };
                    let user = claim_pods
                        .pods
                        .get(&claim.uid)
                        .and_then(|users| users.iter().find(|u| &u.uid == pod_uid));
                    if let Some(user) = user {
                        *by_pod.entry(user.pod.as_str()).or_default() +=
                            process.memory_used_bytes.unwrap_or(0);
                    }
                }
                for (pod, bytes) in by_pod {
                    let (namespace, name) = pod.split_once('/').unwrap_or(("", pod));
                    let mut pod_labels = labels.clone();
                    pod_labels[0] = ("namespace", namespace.to_string());
                    pod_labels.insert(1, ("pod", name.to_string()));
                    self.pod_memory_used
                        .get_or_create(&pod_labels)
                        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                }
                self.claim_memory_used
                    .get_or_create(&labels)
                    .set(i64::try_from(memory).unwrap_or(i64::MAX));
                self.claim_processes
                    .get_or_create(&labels)
                    .set(to_gauge(processes));
                if let (None, Some(percent)) = (gi, gpu_usage.utilization_percent) {
                    self.claim_utilization
                        .get_or_create(&labels)
                        .set(f64::from(percent) / 100.0);
                }
            }
        }
    }

    /// MPS control daemons found dead and started again.
    pub fn observe_mps_restarts(&self, count: usize) {
        self.mps_daemon_restarts.inc_by(count as u64);
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

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Counts the MIG devices of an inventory (at start and after every state change).
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

    /// One `prepared_device_info` series per device of each prepared claim; series of claims
    /// unprepared since are dropped (so the series count stays the prepared devices').
    pub fn observe_prepared_devices(&self, checkpoint: &Checkpoint, inventory: &NodeInventory) {
        let mut claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        claim_pods
            .pods
            .retain(|uid, _| checkpoint.claims.contains_key(uid));
        self.render_prepared_devices(checkpoint, inventory, &claim_pods.pods);
        claim_pods.last = Some((checkpoint.clone(), inventory.clone()));
        self.render_usage(&claim_pods);
    }

    /// The pods a claim is reserved for changed: its info series say so from now on.
    pub fn observe_claim_pods(&self, claim_uid: &str, pods: &[ClaimUser]) {
        let mut claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        if claim_pods.pods.get(claim_uid).map(Vec::as_slice) == Some(pods) {
            return;
        }
        claim_pods.pods.insert(claim_uid.to_string(), pods.to_vec());
        if let Some((checkpoint, inventory)) = &claim_pods.last {
            self.render_prepared_devices(checkpoint, inventory, &claim_pods.pods);
        }
    }

    fn render_prepared_devices(
        &self,
        checkpoint: &Checkpoint,
        inventory: &NodeInventory,
        pods: &std::collections::HashMap<String, Vec<ClaimUser>>,
    ) {
        self.prepared_device_info.clear();
        for claim in checkpoint.claims.values().filter(|c| c.is_completed()) {
            for device in &claim.devices {
                let located = device_gpu(device, inventory);
                let gpu = located
                    .as_ref()
                    .and_then(|(minor, ..)| inventory.gpus.iter().find(|g| g.minor == *minor));
                // A static MIG device (an admin's) has no carve record: its instance says.
                let static_instance = gpu
                    .and_then(|g| g.mig.as_ref())
                    .and_then(|m| m.instances.iter().find(|i| i.uuid == device.uuid));
                let (gi, ci, profile_id) = match (&device.mig, static_instance) {
                    (Some(mig), _) => (
                        mig.gpu_instance_id,
                        mig.compute_instance_id,
                        Some(mig.profile_id),
                    ),
                    (None, Some(i)) => (
                        Some(i.gpu_instance_id),
                        Some(i.compute_instance_id),
                        Some(i.profile_id),
                    ),
                    (None, None) => (None, None, None),
                };
                let is_mig = device.mig.is_some() || static_instance.is_some();
                let profile = profile_id.and_then(|id| {
                    gpu.and_then(|g| g.mig.as_ref())
                        .and_then(|m| m.profile_by_id(id))
                        .map(|p| p.name.clone())
                });
                let (gi, ci) = (gi.map(|id| id.to_string()), ci.map(|id| id.to_string()));
                let mig_uuid = is_mig.then(|| device.uuid.clone());
                let gpu_uuid = match located {
                    Some((_, uuid, _)) => Some(uuid),
                    None => Some(device.uuid.clone()),
                };
                let consumed: Vec<String> = device
                    .consumed
                    .iter()
                    .map(|(name, quantity)| format!("{name}={quantity}"))
                    .collect();
                let labels: PreparedDeviceLabels = vec![
                    ("namespace", claim.namespace.clone()),
                    ("claim", claim.name.clone()),
                    ("claim_uid", claim.uid.clone()),
                    ("request", device.request_names.join(",")),
                    (
                        "pods",
                        pods.get(&claim.uid)
                            .map(|p| {
                                p.iter()
                                    .map(|u| u.pod.as_str())
                                    .collect::<Vec<_>>()
                                    .join(",")
                            })
                            .unwrap_or_default(),
                    ),
                    ("dra_device", device.device.clone()),
                    ("UUID", gpu_uuid.unwrap_or_default()),
                    ("GPU_I_ID", gi.unwrap_or_default()),
                    ("GPU_I_PROFILE", profile.unwrap_or_default()),
                    ("compute_instance_id", ci.unwrap_or_default()),
                    ("mig_uuid", mig_uuid.unwrap_or_default()),
                    ("Hostname", device.pool.clone()),
                    ("sharing", crate::prepare::sharing::mode(device).to_string()),
                    ("consumed", consumed.join(",")),
                    ("admin_access", device.admin_access.to_string()),
                ];
                self.prepared_device_info.get_or_create(&labels).set(1);
            }
        }
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

/// The UID of the pod whose cgroup a process's `/proc/<pid>/cgroup` names: kubelet's
/// `…/pod<uid>/…` (cgroupfs) or `…-pod<uid with _>.slice/…` (systemd).
pub fn pod_uid_of_cgroup(cgroup: &str) -> Option<String> {
    for line in cgroup.lines() {
        let path = line.rsplit(':').next().unwrap_or("");
        // `kubepods` holds "pod" too: every occurrence is tried.
        for (at, _) in path.match_indices("pod") {
            let uid: String = path[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == '_')
                .map(|c| if c == '_' { '-' } else { c })
                .collect();
            if uid.len() == 36 && uid.matches('-').count() == 4 {
                return Some(uid);
            }
        }
    }
    None
}

/// The GPU (minor, UUID) a prepared device is on, and its GPU instance for a MIG device.
fn device_gpu(
    device: &crate::prepare::checkpoint::DeviceRecord,
    inventory: &NodeInventory,
) -> Option<(u32, String, Option<u32>)> {
    match &device.mig {
        Some(mig) => {
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| g.minor == mig.parent_minor)?;
            Some((gpu.minor, gpu.uuid.clone(), mig.gpu_instance_id))
        }
        None => {
            if let Some(gpu) = inventory.gpus.iter().find(|g| g.uuid == device.uuid) {
                return Some((gpu.minor, gpu.uuid.clone(), None));
            }
            // A static MIG device (made by an admin): found by its MIG UUID.
            inventory.gpus.iter().find_map(|gpu| {
                let instance = gpu
                    .mig
                    .as_ref()?
                    .instances
                    .iter()
                    .find(|i| i.uuid == device.uuid)?;
                Some((gpu.minor, gpu.uuid.clone(), Some(instance.gpu_instance_id)))
            })
        }
    }
}
