//! The node agent behind `gpu-dra run`: discovery → slices → API server, and the kubelet plugin
//! serving prepare/unprepare, until a shutdown signal.
//!
//! Start-up order matters: devices are discovered and slices validated before anything is
//! published (never an empty pool by accident), the checkpoint is recovered before kubelet can
//! call, and the plugin registers before the first API round trip so a slow or absent API server
//! does not delay registration.
//!
//! This module ties the parts together ([`NodeAgent::start`] and [`NodeAgent::stop`]); each
//! concern has a file of its own: the options, the runtime, the Kubernetes client, the slice
//! updater, the GPU use sampler, the health sink, the refusing mode and Node events. The
//! ComputeDomain plugin's start-up is in [`crate::compute_domain::node_agent`].
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::sync::watch;

use crate::compute_domain::node_agent::{self, start_compute_domains};
use crate::gpu::{self, GpuError};
use crate::health::monitor::HealthMonitor;
use crate::health::{HealthBook, HealthChange, HealthError};
use crate::metrics::{Metrics, MetricsError, MetricsServer, ObserverList};
use crate::plugin::{PluginConfig, PluginError, PluginServer};
use crate::prepare::NodeDriver;
use crate::prepare::checkpoint::CheckpointError;
use crate::prepare::claims::{ClaimSource, KubeClaims};
use crate::prepare::driver::{Driver, DriverObserver};
use crate::prepare::error::PrepareError;
use crate::prepare::lock::{self, NodeLock, Presence};
use crate::prepare::state::{DeviceState, DriverConfig};
use crate::slices::publish::{PublishError, Publisher, SyncReport};
use crate::slices::{self, SliceError, SliceOptions};

mod client;
mod events;
mod health_sink;
mod options;
mod refusing;
mod runtime;
mod slice_updater;
mod usage;

pub use client::kube_client;
// Re-exported: callers configure the ComputeDomain plugin beside the node agent's own options.
pub use crate::compute_domain::options::ComputeDomainOptions;
pub use options::{MetricsAuthMode, NodeOptions};
pub use runtime::runtime;

use health_sink::NodeHealth;
use options::with_metrics_auth;
use slice_updater::SliceUpdater;
use usage::spawn_usage_sampler;

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
    #[error(transparent)]
    ComputeDomains(#[from] node_agent::StartError),
    #[error("Kubernetes client: {0}")]
    Kube(String),
    #[error("node lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
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
                    &options.compute_domain_settings(),
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
