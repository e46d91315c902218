//! The node agent behind `gpu-dra run`: discovery → slices → API server, and the kubelet plugin
//! serving prepare/unprepare, until a shutdown signal.
//!
//! Start-up order matters: devices are discovered and slices validated before anything is
//! published (never an empty pool by accident), the checkpoint is recovered before kubelet can
//! call, and the plugin registers before the first API round trip so a slow or absent API server
//! does not delay registration.
use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;

use crate::gpu::mig::GpuMode;
use crate::gpu::{self, DiscoveryConfig, GpuError, NodeInventory};
use crate::health::monitor::{HealthMonitor, HealthSink};
use crate::health::{HealthBook, HealthChange, HealthConfig, HealthError};
use crate::kubeapi::ApiTimeouts;
use crate::metrics::{Metrics, MetricsError, MetricsServer, ObserverList};
use crate::plugin::{PluginConfig, PluginError, PluginServer};
use crate::prepare::checkpoint::CheckpointError;
use crate::prepare::claims::{ClaimSource, KubeClaims};
use crate::prepare::driver::{Driver, DriverObserver};
use crate::prepare::lock::{self, NodeLock, Presence};
use crate::prepare::state::{DeviceState, DriverConfig, PrepareError};
use crate::prepare::{ClaimRef, NodeDriver, PrepareResult, UnprepareResult};
use crate::slices::publish::{PublishError, Publisher, SyncReport};
use crate::slices::{self, SliceError, SliceOptions};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Slices(#[from] SliceError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Health(#[from] HealthError),
    #[error(transparent)]
    GateOff(#[from] crate::slices::gates::GateOff),
    #[error("Kubernetes client: {0}")]
    Kube(String),
    #[error("node lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The runtime `gpu-dra run` serves on. Two workers: one may be inside a MIG change or an fsync
/// (handed off with `block_in_place`) while the other keeps kubelet's registration and health
/// streams, the probes and slice publication answering. Few threads keep the resident set small
/// on every GPU node.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .thread_name("gpu-dra")
        .enable_all()
        .build()
}

/// How kubelet reaches this agent: its sockets (per instance in a rolling update) and driver.
fn plugin_config(options: &NodeOptions, driver: Arc<dyn NodeDriver>) -> PluginConfig {
    PluginConfig {
        instance: options.rolling_update_uid.clone(),
        // The health monitor feeds kubelet's device health streams.
        advertise_health: true,
        ..PluginConfig::new(
            options.driver_name.clone(),
            options.registrar_dir.clone(),
            options.plugin_dir.clone(),
            driver,
        )
    }
}

/// Opens a lock file in the plugin directory (created 0700 if missing, like the sockets' dir).
fn open_node_lock(plugin_dir: &Path, name: &str) -> Result<NodeLock, NodeError> {
    let path = plugin_dir.join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(plugin_dir)
        .and_then(|()| NodeLock::open(&path))
        .map_err(|source| NodeError::Lock { path, source })
}

/// Everything `gpu-dra run` is configured with.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub discovery: DiscoveryConfig,
    pub driver_name: String,
    pub mig_policy: crate::gpu::mig::MigPolicy,
    pub kubeconfig: Option<PathBuf>,
    pub registrar_dir: PathBuf,
    pub plugin_dir: PathBuf,
    pub cdi_root: PathBuf,
    pub state_dir: PathBuf,
    /// Where the host's `/dev` is, when not at `/`.
    pub dev_root: Option<PathBuf>,
    /// The NVIDIA driver's files for containers; `None` on simulated GPUs without one.
    pub driver_root: Option<crate::prepare::driver_files::DriverRoot>,
    /// Devices several claims may share (`--consumable-shares`).
    pub consumable: crate::slices::consumable::ConsumableShares,
    /// Claims of different namespaces may share one MPS daemon.
    pub mps_across_namespaces: bool,
    /// GPUs are also offered to virtual machines (`--passthrough`).
    pub passthrough: bool,
    /// Gated slice fields (`--feature-gates`): numaNode as a list.
    pub numa_node_list: bool,
    /// Gated slice fields: per-device node-allocatable overhead (empty: none).
    pub node_allocatable: Arc<crate::slices::node_allocatable::OverheadTable>,
    /// Device order within the pool (`--device-order`).
    pub device_order: crate::slices::DeviceOrder,
    /// Set during a rolling update: this instance's id (pod UID).
    pub rolling_update_uid: Option<String>,
    /// How often prepared claims are checked against the API server.
    pub gc_interval: Duration,
    /// How often the prepared claims' GPUs are asked for their use (metrics); off when `None`.
    pub usage_interval: Option<Duration>,
    /// How long a claim must stay gone before garbage collection unprepares it.
    pub gc_grace: Duration,
    /// How often the pool is compared with the server even without events.
    pub resync_interval: Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served; off when `None`.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Who may read `/metrics`.
    pub metrics_auth: MetricsAuthMode,
    /// Deadlines of calls to the API server.
    pub api_timeouts: ApiTimeouts,
    /// GPU fault handling and hardware rescans.
    pub health: HealthConfig,
    /// The `compute-domain.nvidia.com` plugin beside this one (`--compute-domains`).
    pub compute_domains: Option<ComputeDomainOptions>,
}

/// Who may read `/metrics` (`--metrics-auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAuthMode {
    /// Anyone who reaches the port.
    #[default]
    None,
    /// A bearer token the API server authenticates and authorizes for `get /metrics`.
    Kubernetes,
}

/// The metrics server as `--metrics-auth` says (the client reviews the callers' tokens).
fn with_metrics_auth(
    server: MetricsServer,
    mode: MetricsAuthMode,
    client: &kube::Client,
) -> MetricsServer {
    match mode {
        MetricsAuthMode::None => server,
        MetricsAuthMode::Kubernetes => server.with_auth(Arc::new(
            crate::metrics::auth::KubernetesAuth::new(client.clone()),
        )),
    }
}

/// How the ComputeDomain plugin runs on this node.
#[derive(Debug, Clone)]
pub struct ComputeDomainOptions {
    /// Its own folder under kubelet's plugins folder (its DRA socket).
    pub plugin_dir: PathBuf,
    /// Its book and the IMEX daemons' folders.
    pub state_dir: PathBuf,
    /// The address other nodes' IMEX daemons reach this node at; `None`: the Node's InternalIP.
    pub node_ip: Option<String>,
    /// How long one prepare waits for the domain before kubelet has to retry.
    pub ready_timeout: Duration,
    /// The driver root's tools (`nvidia-imex`, `nvidia-imex-ctl`).
    pub tools: crate::gpu::driver_tools::DriverRootTools,
    /// Who runs the IMEX daemons.
    pub imex: crate::compute_domain::node::ImexMode,
    pub cdi_root: PathBuf,
    /// Keep the `nvidia.com/gpu.clique` label on this node's Node object.
    pub clique_label: bool,
    /// Where the controller keeps the domains' IMEX credentials; `None`: the client's own
    /// namespace (in a pod: its ServiceAccount's).
    pub credentials_namespace: Option<String>,
}

/// Builds a client from `--kubeconfig`, else in-cluster, else `KUBECONFIG`/`~/.kube/config`,
/// with `timeouts` for connecting (requests are bounded by their callers).
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    timeouts: &ApiTimeouts,
) -> Result<kube::Client, NodeError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| NodeError::Kube(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| NodeError::Kube(format!("{}: {e}", path.display())))?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(_) => kube::Config::from_kubeconfig(&Default::default())
                .await
                .map_err(|e| {
                    NodeError::Kube(format!("not in a cluster and no usable KUBECONFIG: {e}"))
                })?,
        },
    };
    timeouts.apply(&mut config);
    kube::Client::try_from(config).map_err(|e| NodeError::Kube(e.to_string()))
}

/// Pushes new desired slices when prepare (or a rescan) changed the inventory, or the health
/// monitor changed the devices' taints.
struct SliceUpdater {
    /// One lock for both inputs, so the two kinds of change never wait on each other in
    /// opposite orders, and the slices sent last are built from the latest of both.
    inputs: std::sync::Mutex<SliceInputs>,
    desired: watch::Sender<Arc<Vec<ResourceSlice>>>,
}

/// What the desired slices are built from.
struct SliceInputs {
    options: SliceOptions,
    inventory: NodeInventory,
}

impl SliceUpdater {
    fn new(
        options: SliceOptions,
        inventory: NodeInventory,
        desired: watch::Sender<Arc<Vec<ResourceSlice>>>,
    ) -> Self {
        Self {
            inputs: std::sync::Mutex::new(SliceInputs { options, inventory }),
            desired,
        }
    }

    fn inputs(&self) -> std::sync::MutexGuard<'_, SliceInputs> {
        // Each change is a plain assignment: a panicking holder leaves it usable.
        self.inputs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rebuild(&self, inputs: &SliceInputs) {
        match slices::build(&inputs.inventory, &inputs.options) {
            Ok(slices) => {
                self.desired.send_if_modified(|desired| {
                    if **desired == slices {
                        return false;
                    }
                    *desired = Arc::new(slices);
                    true
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "the changed inventory gives invalid slices; keeping the published ones")
            }
        }
    }

    fn set_taints(
        &self,
        taints: std::collections::BTreeMap<
            String,
            Vec<k8s_openapi::api::resource::v1::DeviceTaint>,
        >,
    ) {
        let mut inputs = self.inputs();
        inputs.options.taints = Arc::new(taints);
        self.rebuild(&inputs);
    }
}

impl SliceUpdater {
    fn set_inventory(&self, inventory: NodeInventory, modes: BTreeMap<u32, GpuMode>) {
        let mut inputs = self.inputs();
        let modes = Some(modes);
        if inputs.inventory == inventory && inputs.options.modes == modes {
            return;
        }
        inputs.inventory = inventory;
        inputs.options.modes = modes;
        self.rebuild(&inputs);
    }
}

impl DriverObserver for SliceUpdater {
    fn state_changed(&self, state: &DeviceState) {
        // Read before taking our lock: the state has locks of its own. A GPU a rescan found
        // comes with its mode.
        self.set_inventory(state.inventory(), state.modes());
    }
}

/// Reads, every `interval`, how much of each prepared claim's GPU is in use (off the kubelet's
/// path; a GPU that does not answer is skipped this round).
fn spawn_usage_sampler(
    control: Arc<dyn crate::gpu::GpuControl>,
    metrics: Arc<Metrics>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = shutdown.changed() => break,
            }
            let minors = metrics.usage_targets();
            if minors.is_empty() && !metrics.has_usage() {
                // No prepared claim and nothing reported: no thread to wake.
                continue;
            }
            let control = control.clone();
            let read = tokio::task::spawn_blocking(move || {
                let mut usage = std::collections::BTreeMap::new();
                for minor in minors {
                    match control.usage(minor) {
                        Ok(u) => {
                            usage.insert(minor, u);
                        }
                        Err(error) => {
                            tracing::debug!(gpu = minor, %error, "cannot read the GPU's use")
                        }
                    }
                }
                // Each process's pod, from its cgroup in the host's /proc (hostPID); a
                // process that ended since, or of no pod, has none.
                let pods: std::collections::BTreeMap<u32, String> = usage
                    .values()
                    .flat_map(|u: &crate::gpu::usage::GpuUsage| &u.processes)
                    .filter_map(|p| {
                        let cgroup =
                            std::fs::read_to_string(format!("/proc/{}/cgroup", p.pid)).ok()?;
                        Some((p.pid, crate::metrics::pod_uid_of_cgroup(&cgroup)?))
                    })
                    .collect();
                (usage, pods)
            })
            .await;
            match read {
                Ok((usage, pods)) => metrics.observe_usage(&usage, &pods),
                Err(error) => tracing::warn!(%error, "the GPU use reader stopped"),
            }
        }
    })
}

/// The health monitor's conclusions: taints into the slices, Node events, metrics.
struct NodeHealth {
    updater: Arc<SliceUpdater>,
    metrics: Arc<Metrics>,
    client: kube::Client,
    node_name: String,
    driver_name: String,
    timeout: Duration,
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

/// A running node agent.
pub struct NodeAgent {
    pub plugin: PluginServer,
    /// The ComputeDomain plugin, when it runs.
    pub compute_domain_plugin: Option<PluginServer>,
    /// `None` while the agent refuses to act on the node (an unusable checkpoint).
    pub driver: Option<Arc<Driver>>,
    pub metrics: Arc<Metrics>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub started: Instant,
}

impl NodeAgent {
    /// Starts everything; returns once the plugin sockets are served.
    pub async fn start(options: NodeOptions) -> Result<Self, NodeError> {
        let started = Instant::now();
        // Bound first: a taken port fails the start before anything is published or registered.
        let metrics_server = match options.metrics_addr {
            Some(addr) => Some(MetricsServer::bind(addr).await?),
            None => None,
        };
        let node_name = options.discovery.node_name.clone();
        let metrics = Arc::new(Metrics::for_node(&options.driver_name, &node_name));
        let mut slice_options = SliceOptions::new(&options.driver_name, &node_name);
        slice_options.consumable = options.consumable;
        slice_options.passthrough = options.passthrough;
        slice_options.order = options.device_order;
        slice_options.numa_node_list = options.numa_node_list;
        slice_options.node_allocatable = options.node_allocatable.clone();
        if !options.node_allocatable.is_empty() {
            // Seen on the e2e control plane (e2e/gates.sh, e2e/helm.sh): the scheduler's PreBind
            // writes `<extended-resources>` as the claim name, which pod validation refuses.
            tracing::warn!(
                "--node-allocatable-overhead: kube-scheduler 1.37 cannot bind a pod that gets these devices through an extended resource (nvidia.com/gpu, deviceclass.resource.kubernetes.io/...): status.nodeAllocatableResourceClaimStatuses is refused for its claim; such pods stay Pending with a SchedulerError. Pods with ResourceClaims are not affected"
            );
        }
        let control = gpu::open_control(&options.discovery)?;
        let monitor_control = control.clone();
        // In a rolling update the other instance may be preparing right now: recover under the
        // node lock, from what it last wrote.
        // Present before recovery: an instance already running sees this one from now on and
        // takes the node lock exclusively for each of its operations.
        let node_lock = match &options.rolling_update_uid {
            Some(uid) => {
                let instances = options.plugin_dir.join(lock::INSTANCES_DIR);
                let presence =
                    Presence::register(&instances, uid).map_err(|source| NodeError::Lock {
                        path: instances.clone(),
                        source,
                    })?;
                Some((
                    open_node_lock(&options.plugin_dir, lock::SERIALIZE_LOCK)?,
                    presence,
                ))
            }
            None => None,
        };
        let recovery_guard = match node_lock.as_ref().map(|(lock, _)| lock) {
            Some(lock) => Some(lock.acquire().await.map_err(|source| NodeError::Lock {
                path: lock.path().to_path_buf(),
                source,
            })?),
            None => None,
        };
        let opened = DeviceState::open(
            DriverConfig {
                driver_name: options.driver_name.clone(),
                mig_policy: options.mig_policy,
                node_name: node_name.clone(),
                cdi_root: options.cdi_root.clone(),
                state_dir: options.state_dir.clone(),
                dev_root: options.dev_root.clone(),
                driver_root: options.driver_root.clone(),
                consumable: options.consumable,
                passthrough: options.passthrough,
            },
            control,
        );
        drop(recovery_guard);
        let (state, recovery) = match opened {
            Ok((state, recovery)) => (
                state.with_mps_across_namespaces(options.mps_across_namespaces),
                recovery,
            ),
            Err(PrepareError::Checkpoint(error @ CheckpointError::Unusable { .. })) => {
                return Self::start_refusing(options, metrics, metrics_server, error, started)
                    .await;
            }
            Err(error) => return Err(error.into()),
        };
        tracing::info!(
            checkpoint = recovery.checkpoint.as_deref().unwrap_or(""),
            rolled_back = ?recovery.rolled_back,
            specs_rewritten = ?recovery.specs_rewritten,
            specs_removed = ?recovery.specs_removed,
            "recovered prepared state"
        );
        metrics.state_changed(&state);
        if state.mps_unusable().is_some() {
            metrics.observe_tool_unusable("nvidia-cuda-mps-control");
        }
        if options
            .discovery
            .nvidia_smi
            .as_ref()
            .is_some_and(|smi| smi.unusable().is_some())
        {
            metrics.observe_tool_unusable("nvidia-smi");
        }
        let inventory = state.inventory().clone();
        slice_options.modes = Some(state.modes());
        tracing::info!(modes = ?state.modes(), destroyed = ?recovery.instances_destroyed, "GPU modes");
        if options.passthrough {
            crate::slices::passthrough::log_offer(&inventory, &state.modes());
        }
        // Faults seen before a restart are published with the first slices, not after them.
        let mut health_book =
            HealthBook::load(&options.state_dir, &state.checkpoint().node_boot_id)?;
        // Each GPU probed once before anything is published: a GPU lost (or asking for a reset)
        // at start is published tainted from the first slice on.
        let startup_changes: Vec<HealthChange> = inventory
            .gpus
            .iter()
            .filter_map(|gpu| match monitor_control.probe(gpu.minor) {
                Ok(probe) => Some((gpu.minor, probe)),
                Err(error) => {
                    tracing::warn!(gpu = gpu.minor, %error, "cannot probe GPU at start");
                    None
                }
            })
            .flat_map(|(minor, probe)| {
                health_book.probe(minor, probe, &options.health, crate::health::now_seconds())
            })
            .collect();
        let untainted = slices::build(&inventory, &slice_options)?;
        slice_options.taints = Arc::new(
            health_book.taints(
                untainted
                    .iter()
                    .filter_map(|s| s.spec.devices.as_ref())
                    .flatten()
                    .map(|d| d.name.as_str()),
            ),
        );
        metrics.observe_device_taints(&slice_options.taints);
        metrics.observe_mps_restarts(recovery.mps_restarted.len());
        if !health_book.faults.is_empty() {
            tracing::warn!(
                faults = health_book.faults.len(),
                "devices still unhealthy from before the restart"
            );
        }
        let desired_slices = slices::build(&inventory, &slice_options)?;
        tracing::info!(
            gpus = inventory.gpus.len(),
            devices = device_count(&desired_slices),
            "discovered GPUs"
        );
        let (desired_tx, desired_rx) = watch::channel(Arc::new(desired_slices));

        let client = kube_client(options.kubeconfig.as_deref(), &options.api_timeouts).await?;
        // Gated fields the API server would drop: refused before anything is published.
        let first_slices = desired_rx.borrow().clone();
        slices::gates::check(&client, &first_slices, options.api_timeouts.request).await?;
        let claims: Arc<dyn ClaimSource> = Arc::new(
            KubeClaims::on_node(client.clone(), &options.driver_name, Some(&node_name))
                .with_timeout(options.api_timeouts.request),
        );
        let updater = Arc::new(SliceUpdater::new(
            slice_options.clone(),
            inventory,
            desired_tx,
        ));
        let observers = ObserverList(vec![updater.clone(), metrics.clone()]);
        let mut driver = Driver::new(state, claims)
            .with_observer(Arc::new(observers))
            .with_gc_grace(options.gc_grace);
        let presence_view = node_lock.as_ref().map(|(_, presence)| presence.view());
        if let Some((lock, presence)) = node_lock {
            driver = driver.with_node_lock(lock, presence);
        }
        let driver = Arc::new(driver);

        let plugin = PluginServer::start(plugin_config(&options, driver.clone())).await?;
        tracing::info!(
            registration = %plugin.registration_socket_path().display(),
            dra = %plugin.dra_socket_path().display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "node driver started"
        );

        let (shutdown, shutdown_rx) = watch::channel(false);
        let monitored_slices = desired_rx.clone();
        let health_client = client.clone();
        let publisher = Publisher::new(client, slice_options, options.api_timeouts.request);
        let sync_metrics = metrics.clone();
        let synced_slices = desired_rx.clone();
        // One publisher per node: during a rolling update the new instance takes over once the
        // old one has exited, so the two never fight over the pool.
        let publisher_lock = match &options.rolling_update_uid {
            Some(_) => Some(open_node_lock(&options.plugin_dir, lock::PUBLISHER_LOCK)?),
            None => None,
        };
        let publication = publisher.run(
            desired_rx,
            options.resync_interval,
            shutdown_rx.clone(),
            move |result: &Result<SyncReport, PublishError>| {
                // The synced slices are the desired ones unless they changed meanwhile; then
                // another sync follows at once and corrects the count.
                sync_metrics.observe_slice_sync(result, device_count(&synced_slices.borrow()));
                if let Ok(report) = result
                    && report.writes() == 0
                {
                    tracing::debug!(generation = report.generation, "ResourceSlices up to date");
                }
                // A sync compares and encodes the whole pool (a few MiB for 8 GPUs with MIG
                // placements) and then idles for a long time: give the memory back.
                release_free_memory();
            },
        );
        let mut publisher_shutdown = shutdown_rx.clone();
        let standby_metrics = metrics.clone();
        let publish_task = tokio::spawn(async move {
            let Some(lock) = publisher_lock else {
                return publication.await;
            };
            // Held by the instance this one replaces: its slices stay current meanwhile.
            standby_metrics.set_publisher_standby(true);
            let held = tokio::select! {
                held = lock.acquire() => held,
                _ = publisher_shutdown.changed() => return,
            };
            standby_metrics.set_publisher_standby(false);
            match held {
                Ok(_guard) => {
                    tracing::info!(lock = %lock.path().display(), "publishing ResourceSlices for this node");
                    publication.await
                }
                Err(error) => {
                    tracing::error!(lock = %lock.path().display(), %error, "cannot take the publisher lock; not publishing")
                }
            }
        });
        let mut tasks = vec![
            publish_task,
            metrics
                .clone()
                .follow_registration(plugin.registration(), shutdown_rx.clone()),
        ];
        if let Some(server) = metrics_server {
            let server = with_metrics_auth(server, options.metrics_auth, &health_client);
            let (metrics, shutdown) = (metrics.clone(), shutdown_rx.clone());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = server.serve(metrics, shutdown).await {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            }));
        }
        let compute_domain_plugin = match &options.compute_domains {
            Some(cd) => {
                let (server, cd_tasks) = start_compute_domains(
                    cd,
                    &options,
                    metrics.clone(),
                    health_client.clone(),
                    monitor_control.clone(),
                    presence_view.clone(),
                    shutdown_rx.clone(),
                )
                .await?;
                tasks.extend(cd_tasks);
                Some(server)
            }
            None => None,
        };
        let gc_driver = driver.clone();
        let gc_metrics = metrics.clone();
        let usage_control = monitor_control.clone();
        let usage_shutdown = shutdown_rx.clone();
        let health_shutdown = shutdown_rx.clone();
        let mut gc_shutdown = shutdown_rx;
        let gc_interval = options.gc_interval;
        let gc_task = tokio::spawn(async move {
            loop {
                let collected = gc_driver.collect_garbage().await;
                if !collected.is_empty() {
                    tracing::info!(count = collected.len(), "garbage-collected prepared claims");
                }
                let restarted = gc_driver.repair_sharing().await;
                if !restarted.is_empty() {
                    tracing::warn!(daemons = ?restarted, "MPS daemons started again");
                    gc_metrics.observe_mps_restarts(restarted.len());
                }
                tokio::select! {
                    _ = tokio::time::sleep(gc_interval) => {}
                    _ = gc_shutdown.changed() => break,
                }
            }
        });
        tasks.push(gc_task);
        if let Some(interval) = options.usage_interval {
            tasks.push(spawn_usage_sampler(
                usage_control,
                metrics.clone(),
                interval,
                usage_shutdown,
            ));
        }
        let monitor = HealthMonitor {
            config: options.health.clone(),
            control: monitor_control,
            driver: driver.clone(),
            book: health_book,
            startup_changes,
            state_dir: options.state_dir.clone(),
            pool: node_name.clone(),
            reporter: plugin.device_health(),
            desired: monitored_slices,
            sink: Arc::new(NodeHealth {
                updater,
                metrics: metrics.clone(),
                client: health_client,
                node_name: node_name.clone(),
                driver_name: options.driver_name.clone(),
                timeout: options.api_timeouts.request,
            }),
            published: Default::default(),
            reported: None,
        };
        tasks.push(tokio::spawn(monitor.run(health_shutdown)));
        Ok(Self {
            plugin,
            compute_domain_plugin,
            driver: Some(driver),
            metrics,
            shutdown,
            tasks,
            started,
        })
    }

    /// Fail closed: the checkpoint cannot be trusted, so nothing on the node is touched (no
    /// recovery, sweep, MIG destruction, publication or garbage collection). Kubelet still
    /// reaches the plugin and gets the reason with every call; an event on the Node and the
    /// `checkpoint_unusable` metric tell the operator, and readiness stays false.
    async fn start_refusing(
        options: NodeOptions,
        metrics: Arc<Metrics>,
        metrics_server: Option<MetricsServer>,
        error: CheckpointError,
        started: Instant,
    ) -> Result<Self, NodeError> {
        let reason = error.to_string();
        tracing::error!(error = %reason, "refusing to prepare or unprepare any claim");
        metrics.observe_checkpoint_unusable();
        let client = kube_client(options.kubeconfig.as_deref(), &options.api_timeouts).await?;
        let node_name = options.discovery.node_name.clone();
        let event = NodeEvent {
            warning: true,
            reason: "CheckpointUnusable",
            action: "Recover",
            note: &reason,
        };
        let report = report_on_node(&client, &node_name, &options.driver_name, event);
        if let Err(e) = crate::kubeapi::bounded(options.api_timeouts.request, report).await {
            tracing::warn!(error = %e, node = %node_name, "cannot record the refusal as a Node event");
        }
        let plugin =
            PluginServer::start(plugin_config(&options, Arc::new(RefusingDriver { reason })))
                .await?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = vec![
            metrics
                .clone()
                .follow_registration(plugin.registration(), shutdown_rx.clone()),
        ];
        if let Some(server) = metrics_server {
            let server = with_metrics_auth(server, options.metrics_auth, &client);
            let metrics = metrics.clone();
            tasks.push(tokio::spawn(async move {
                if let Err(e) = server.serve(metrics, shutdown_rx).await {
                    tracing::error!(error = %e, "metrics endpoint stopped");
                }
            }));
        }
        Ok(Self {
            compute_domain_plugin: None,
            plugin,
            driver: None,
            metrics,
            shutdown,
            tasks,
            started,
        })
    }

    /// Stops publishing and serving; the published slices stay (a restart then writes nothing),
    /// the sockets are removed.
    pub async fn stop(self) -> Result<(), NodeError> {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        self.plugin.shutdown().await?;
        if let Some(plugin) = self.compute_domain_plugin {
            plugin.shutdown().await?;
        }
        Ok(())
    }
}

/// The node's address for IMEX peers: the Node's first InternalIP.
async fn node_internal_ip(
    client: &kube::Client,
    node: &str,
    timeout: Duration,
) -> Result<String, NodeError> {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let object = crate::kubeapi::bounded(timeout, api.get(node))
        .await
        .map_err(|e| NodeError::Kube(format!("get Node {node}: {e}")))?;
    object
        .status
        .and_then(|s| s.addresses)
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .ok_or_else(|| {
            NodeError::Kube(format!(
                "Node {node} has no InternalIP address for IMEX peers; give --node-ip"
            ))
        })
}

/// Starts the `compute-domain.nvidia.com` plugin: its sockets, its pool (channel 0) and the
/// loop that keeps its IMEX daemons and this node's entries in the domains current.
async fn start_compute_domains(
    cd: &ComputeDomainOptions,
    options: &NodeOptions,
    metrics: Arc<Metrics>,
    client: kube::Client,
    control: Arc<dyn crate::gpu::GpuControl>,
    presence: Option<lock::PresenceView>,
    shutdown: watch::Receiver<bool>,
) -> Result<(PluginServer, Vec<tokio::task::JoinHandle<()>>), NodeError> {
    use crate::compute_domain::{self, imex::ImexDaemons, node::ChannelPlugin};
    let node_name = options.discovery.node_name.clone();
    let node_ip = match &cd.node_ip {
        Some(ip) => ip.clone(),
        None => node_internal_ip(&client, &node_name, options.api_timeouts.request).await?,
    };
    let daemons = ImexDaemons::new(cd.tools.clone(), cd.state_dir.join("domains"));
    // Only nodes with multi-node NVLink run IMEX daemons; one whose fabric cannot be read yet
    // is checked as well (it will have it).
    let fabric = compute_domain::node::node_clique(control.as_ref());
    if fabric.as_deref() != Ok("") && cd.imex == compute_domain::node::ImexMode::DriverManaged {
        daemons
            .check()
            .map_err(|e| NodeError::Kube(format!("--compute-domains: {e}")))?;
    }
    let claims: Arc<dyn ClaimSource> = Arc::new(
        KubeClaims::on_node(
            client.clone(),
            compute_domain::DRIVER_NAME,
            Some(&node_name),
        )
        .with_timeout(options.api_timeouts.request),
    );
    let plugin = ChannelPlugin::new(
        client.clone(),
        claims,
        compute_domain::node::ChannelPluginOptions {
            node_name: node_name.clone(),
            node_ip: node_ip.clone(),
            credentials_namespace: cd
                .credentials_namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_string()),
            state_dir: cd.state_dir.clone(),
            cdi_root: cd.cdi_root.clone(),
            dev_root: options.dev_root.clone(),
            ready_timeout: cd.ready_timeout,
            simulated: control.simulated(),
            imex: cd.imex.clone(),
        },
        daemons,
        control.clone(),
    )
    .map_err(|e| NodeError::Kube(format!("--compute-domains: {e}")))?;
    let plugin = Arc::new(plugin);
    let (slices_tx, slices_rx) = watch::channel(Arc::new(plugin.slices()));
    let measured =
        crate::metrics::MeasuredDriver::new(plugin.clone(), compute_domain::DRIVER_NAME, metrics);
    let server = PluginServer::start(PluginConfig::new(
        compute_domain::DRIVER_NAME,
        options.registrar_dir.clone(),
        cd.plugin_dir.clone(),
        Arc::new(measured),
    ))
    .await?;
    tracing::info!(node_ip, clique = ?plugin.clique(), registration = %server.registration_socket_path().display(), "ComputeDomain plugin started");
    let mut label = cd.clique_label.then(|| {
        compute_domain::clique_label::CliqueLabel::new(
            client.clone(),
            node_name.clone(),
            options.api_timeouts.request,
        )
    });
    let publisher = Publisher::new(
        client,
        SliceOptions::new(compute_domain::DRIVER_NAME, &node_name),
        options.api_timeouts.request,
    );
    let publish =
        tokio::spawn(publisher.run(slices_rx, options.resync_interval, shutdown.clone(), |_| {}));
    let interval = options.gc_interval;
    let mut stop = shutdown;
    let maintain = tokio::spawn(async move {
        loop {
            plugin.reconcile().await;
            // The clique, once it could be read, joins the published channel (and the label).
            let slices = plugin.slices();
            if **slices_tx.borrow() != slices {
                let _ = slices_tx.send(Arc::new(slices));
            }
            if let (Some(label), Ok(clique)) = (label.as_mut(), plugin.clique()) {
                label.follow(&clique).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.changed() => break,
            }
        }
        // In a rolling update the other instance keeps the label true: removing it would
        // leave the node unlabelled until that instance re-asserts it (minutes).
        let others = presence
            .as_ref()
            .and_then(|p| p.others().ok())
            .map(|o| o.alive)
            .unwrap_or_default();
        match &label {
            Some(_) if !others.is_empty() => {
                tracing::info!(instances = ?others, "another driver instance runs on the node: the clique label stays")
            }
            Some(label) => label.remove().await,
            None => {}
        }
    });
    Ok((server, vec![publish, maintain]))
}

fn device_count(slices: &[ResourceSlice]) -> usize {
    slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum()
}

/// Returns freed heap pages to the kernel (glibc keeps them otherwise), so the resident set
/// reflects what the driver holds, not its peak.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Answers kubelet while the node's state cannot be trusted: every call fails with the reason.
struct RefusingDriver {
    reason: String,
}

#[tonic::async_trait]
impl NodeDriver for RefusingDriver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
        claims
            .into_iter()
            .map(|claim| (claim, Err(self.reason.clone())))
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
        claims
            .into_iter()
            .map(|claim| (claim, Err(self.reason.clone())))
            .collect()
    }
}

/// An event about this node.
struct NodeEvent<'a> {
    warning: bool,
    reason: &'static str,
    action: &'static str,
    note: &'a str,
}

/// An event on this node's Node object (`kubectl describe node` shows it).
async fn report_on_node(
    client: &kube::Client,
    node_name: &str,
    driver_name: &str,
    event: NodeEvent<'_>,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: driver_name.to_string(),
            instance: Some(node_name.to_string()),
        },
    );
    let node = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.to_string()),
        ..Default::default()
    };
    recorder
        .publish(
            &Event {
                type_: if event.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: event.reason.into(),
                note: Some(event.note.chars().take(1024).collect()),
                action: event.action.into(),
                secondary: None,
            },
            &node,
        )
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
        ResourceClaimStatus,
    };
    use tokio::sync::watch;

    use super::*;
    use crate::gpu::mig::MigPolicy;
    use crate::gpu::sim::SimNode;
    use crate::prepare::ClaimRef;

    fn mig_claim(uid: &str, device: &str) -> ResourceClaim {
        let mut claim = ResourceClaim::default();
        claim.metadata.name = Some(format!("claim-{uid}"));
        claim.metadata.namespace = Some("default".into());
        claim.metadata.uid = Some(uid.into());
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "mig".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool: "n1".into(),
                        device: device.into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        claim
    }

    /// A carve changes the node's MIG state: the desired slices are rebuilt from the new
    /// inventory (once), and nothing is sent while the inventory stays the same.
    #[test]
    fn slices_are_rebuilt_after_a_carve_and_only_then() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sim = Arc::new(SimNode::new(
            "sim:1xH100-SXM5-80GB".parse().expect("spec"),
            "n1",
            Some(dir.path().join("hw.json")),
        ));
        let (state, _) = DeviceState::open(
            DriverConfig {
                driver_name: "gpu.nvidia.com".into(),
                mig_policy: MigPolicy::Auto,
                node_name: "n1".into(),
                cdi_root: dir.path().join("cdi"),
                state_dir: dir.path().join("state"),
                dev_root: None,
                driver_root: None,
                consumable: Default::default(),
                passthrough: false,
            },
            sim.clone(),
        )
        .expect("open");
        let options = SliceOptions {
            modes: Some(state.modes().clone()),
            ..SliceOptions::new("gpu.nvidia.com", "n1")
        };
        let before = slices::build(&state.inventory(), &options).expect("slices");
        let (desired, mut seen) = watch::channel(Arc::new(before));
        seen.mark_unchanged();
        let updater = SliceUpdater::new(options.clone(), state.inventory(), desired);
        updater.state_changed(&state);
        assert!(!seen.has_changed().expect("open"), "nothing changed yet");

        let claim_ref = ClaimRef {
            namespace: "default".into(),
            name: "claim-c".into(),
            uid: "c".into(),
        };
        state
            .prepare(&claim_ref, &mig_claim("c", "gpu-0-mig-1g10gb-19-3"))
            .expect("carve");
        updater.state_changed(&state);
        assert!(
            seen.has_changed().expect("open"),
            "the carve is republished"
        );
        let now = seen.borrow_and_update().clone();
        assert_eq!(
            *now,
            slices::build(&state.inventory(), &options).expect("slices"),
            "built from the inventory after the carve"
        );
        assert!(
            state.inventory().gpus[0]
                .mig
                .as_ref()
                .is_some_and(|m| m.instances.len() == 1)
        );
        updater.state_changed(&state);
        assert!(!seen.has_changed().expect("open"), "sent once");
    }

    /// The health monitor (taints) and prepares (inventory) change the slices from different
    /// threads at once, in a loop: every change lands and nothing hangs (the two once took two
    /// locks in opposite orders and could deadlock both runtime workers).
    #[test]
    fn taint_and_inventory_changes_at_once_never_hang() {
        use k8s_openapi::api::resource::v1::DeviceTaint;
        let inventory = crate::gpu::discover(&crate::gpu::DiscoveryConfig::new(
            "sim:2xH100-SXM5-80GB".parse().expect("spec"),
            "n1",
        ))
        .expect("inventory");
        let mut second = inventory.clone();
        second.gpus.pop();
        let options = SliceOptions::new("gpu.nvidia.com", "n1");
        let first = slices::build(&inventory, &options).expect("slices");
        let (desired, seen) = watch::channel(Arc::new(first));
        let updater = Arc::new(SliceUpdater::new(options, inventory.clone(), desired));
        const ROUNDS: usize = 300;
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let taints = {
            let (updater, done) = (updater.clone(), done_tx.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let taint = DeviceTaint {
                        key: "gpu.nvidia.com/xid".into(),
                        value: Some((round % 2).to_string()),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    };
                    updater.set_taints(std::collections::BTreeMap::from([(
                        "gpu-0".to_string(),
                        vec![taint],
                    )]));
                }
                let _ = done.send("taints");
            })
        };
        let inventories = {
            let updater = updater.clone();
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let next = if round % 2 == 0 {
                        second.clone()
                    } else {
                        inventory.clone()
                    };
                    let modes = SliceOptions::new("gpu.nvidia.com", "n1").modes(&next);
                    updater.set_inventory(next, modes);
                }
                let _ = done_tx.send("inventory");
            })
        };
        for _ in 0..2 {
            done_rx
                .recv_timeout(Duration::from_secs(60))
                .expect("taint and inventory changes hung");
        }
        taints.join().expect("taints thread");
        inventories.join().expect("inventory thread");
        // The last of both is what is published: the second inventory's ends with 2 GPUs
        // (ROUNDS is even: the last inventory round is odd, the full one), and taint value "1".
        let published = seen.borrow().clone();
        let devices: Vec<_> = published
            .iter()
            .filter_map(|s| s.spec.devices.as_ref())
            .flatten()
            .collect();
        assert!(
            devices.iter().any(|d| d.name == "gpu-1"),
            "the full inventory is the last"
        );
        let gpu0 = devices.iter().find(|d| d.name == "gpu-0").expect("gpu-0");
        let value = gpu0
            .taints
            .as_ref()
            .and_then(|t| t.first())
            .and_then(|t| t.value.clone());
        assert_eq!(value.as_deref(), Some("1"), "the last taint is published");
    }
}
