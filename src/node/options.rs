//! What `gpu-dra run` is configured with: the node agent's options, the ComputeDomain plugin's,
//! and who may read `/metrics`.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
