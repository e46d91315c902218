//! `gpu-dra run`: the node driver (what the DaemonSet runs).
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::CliError;
use super::slices::GpuArgs;
use crate::node::{NodeAgent, NodeOptions};
use crate::slices::DEFAULT_DRIVER_NAME;

#[derive(Debug, Args)]
#[command(after_help = "Example (a simulated node against a test cluster):\n  \
    gpu-dra run --node-name n1 --gpus sim:8xH100-SXM5-80GB --kubeconfig kc.yaml \\\n    \
    --registrar-dir /tmp/reg --plugin-dir /tmp/plugin --cdi-root /tmp/cdi --state-dir /tmp/state")]
pub struct RunArgs {
    /// This node's name (the pool name and the Node that owns the slices).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// DRA driver name.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Kubeconfig file (default: in-cluster config, then KUBECONFIG).
    #[arg(long, env = "KUBECONFIG_PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubelet's plugin registration directory.
    #[arg(
        long,
        env = "GPU_DRA_REGISTRAR_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub registrar_dir: PathBuf,
    /// This driver's plugin directory (default: /var/lib/kubelet/plugins/<driver-name>).
    #[arg(long, env = "GPU_DRA_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Where CDI specs are written.
    #[arg(long, env = "GPU_DRA_CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// Where the host's device nodes are, if not under `/` (e.g. `/run/nvidia/driver` with a
    /// containerized driver): CDI device nodes keep their `/dev/...` path in the container and
    /// get `hostPath: <dev-root>/dev/...`.
    #[arg(long, env = "GPU_DRA_DEV_ROOT")]
    pub dev_root: Option<PathBuf>,
    /// Run beside another instance during a DaemonSet rolling update (maxSurge), as the kubelet
    /// plugin library's RollingUpdate mode does: the pod UID names this instance's own
    /// registration and DRA sockets, node state changes are serialized with a lock in the plugin
    /// directory, and one instance at a time publishes ResourceSlices.
    #[arg(long, env = "GPU_DRA_ROLLING_UPDATE_UID")]
    pub rolling_update_uid: Option<String>,
    /// Where the checkpoint is kept (default: the plugin directory).
    #[arg(long, env = "GPU_DRA_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Prometheus metrics and health endpoints, e.g. `0.0.0.0:9400` (off when unset).
    #[arg(long, env = "GPU_DRA_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Seconds between checks that prepared claims still exist.
    #[arg(long, env = "GPU_DRA_GC_INTERVAL", default_value_t = 60)]
    pub gc_interval_seconds: u64,
    /// Seconds a prepared claim must stay deleted (or deallocated) before garbage collection
    /// unprepares it: kubelet normally does so itself once the pod's containers are gone.
    #[arg(long, env = "GPU_DRA_GC_GRACE", default_value_t = 30)]
    pub gc_grace_seconds: u64,
    /// Seconds between full comparisons of the published slices with the desired ones.
    #[arg(long, env = "GPU_DRA_RESYNC_INTERVAL", default_value_t = 60)]
    pub resync_interval_seconds: u64,
    /// Seconds one call to the API server may take before it is abandoned and retried.
    #[arg(long, env = "GPU_DRA_API_TIMEOUT", default_value_t = 20)]
    pub api_timeout_seconds: u64,
}

pub fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let plugin_dir = args
        .plugin_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet/plugins").join(&args.driver_name));
    let options = NodeOptions {
        discovery: args.gpu.discovery(&args.node_name),
        driver_name: args.driver_name.clone(),
        mig_policy: args.gpu.mig,
        kubeconfig: args.kubeconfig.clone(),
        registrar_dir: args.registrar_dir.clone(),
        state_dir: args.state_dir.clone().unwrap_or_else(|| plugin_dir.clone()),
        plugin_dir,
        cdi_root: args.cdi_root.clone(),
        dev_root: args.dev_root.clone(),
        rolling_update_uid: args.rolling_update_uid.clone(),
        gc_interval: Duration::from_secs(args.gc_interval_seconds.max(1)),
        gc_grace: Duration::from_secs(args.gc_grace_seconds),
        resync_interval: Duration::from_secs(args.resync_interval_seconds.max(1)),
        metrics_addr: args.metrics_addr,
        api_timeouts: crate::kubeapi::ApiTimeouts {
            request: Duration::from_secs(args.api_timeout_seconds.max(1)),
            ..Default::default()
        },
    };
    let runtime = crate::node::runtime()?;
    runtime.block_on(async move {
        let agent = NodeAgent::start(options)
            .await
            .map_err(|e| CliError::Node(Box::new(e)))?;
        wait_for_signal().await?;
        tracing::info!("shutting down");
        agent
            .stop()
            .await
            .map_err(|e| CliError::Node(Box::new(e)))?;
        Ok(ExitCode::SUCCESS)
    })
}

async fn wait_for_signal() -> Result<(), CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
