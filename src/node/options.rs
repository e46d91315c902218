//! What `gpu-dra run` is configured with: the node agent's options and who may read `/metrics`.
//! The ComputeDomain plugin's options are `crate::compute_domain::options` (re-exported from
//! `crate::node`); [`NodeOptions::compute_domain_settings`] hands that plugin what it shares with
//! the node agent.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::compute_domain::options::{ComputeDomainOptions, NodeSettings};
use crate::gpu::DiscoveryConfig;
use crate::health::HealthConfig;
use crate::kubeapi::ApiTimeouts;
use crate::metrics::MetricsServer;

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

impl NodeOptions {
    /// What the ComputeDomain plugin takes from these options; its loop runs as often as
    /// garbage collection does.
    pub(super) fn compute_domain_settings(&self) -> NodeSettings {
        NodeSettings {
            node_name: self.discovery.node_name.clone(),
            dev_root: self.dev_root.clone(),
            registrar_dir: self.registrar_dir.clone(),
            request_timeout: self.api_timeouts.request,
            resync_interval: self.resync_interval,
            reconcile_interval: self.gc_interval,
        }
    }
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
pub(super) fn with_metrics_auth(
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
