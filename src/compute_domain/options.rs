//! What the ComputeDomain plugin on a node is started with: its own options
//! (`--compute-domains` and the flags beside it) and the few settings it shares with the node
//! agent that starts it. They live here, not in `crate::node`, so this module never names the
//! node agent (which depends on it).
use std::path::PathBuf;
use std::time::Duration;

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
    pub imex: super::node::ImexMode,
    pub cdi_root: PathBuf,
    /// Keep the `nvidia.com/gpu.clique` label on this node's Node object.
    pub clique_label: bool,
    /// Where the controller keeps the domains' IMEX credentials; `None`: the client's own
    /// namespace (in a pod: its ServiceAccount's).
    pub credentials_namespace: Option<String>,
}

/// What the ComputeDomain plugin takes from the node agent's own options.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// This node's name (the Node object, the pool).
    pub node_name: String,
    /// Where the host's `/dev` is, when not at `/`.
    pub dev_root: Option<PathBuf>,
    /// kubelet's plugin registration folder.
    pub registrar_dir: PathBuf,
    /// The deadline of one call to the API server.
    pub request_timeout: Duration,
    /// How often the pool is compared with the server even without events.
    pub resync_interval: Duration,
    /// How often the domains, IMEX daemons and the clique label are reconciled.
    pub reconcile_interval: Duration,
}
