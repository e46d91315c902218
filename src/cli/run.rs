//! `gpu-dra run`: the node driver (what the DaemonSet runs).
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::CliError;
use super::duration;
use super::slices::GpuArgs;
use crate::gpu::GpuSource;
use crate::node::{NodeAgent, NodeOptions};
use crate::slices::{DEFAULT_DRIVER_NAME, DeviceOrder};

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
    #[command(flatten)]
    pub gated: super::slices::GatedArgs,
    /// Kubeconfig file (default: in-cluster config, then KUBECONFIG).
    #[arg(long, env = "KUBECONFIG_PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubelet's plugin registration directory.
    #[arg(
        long,
        env = "GPU_DRA_REGISTRAR_DIR",
        default_value = "/var/lib/kubelet/plugins_registry",
        alias = "kubelet-registrar-directory-path"
    )]
    pub registrar_dir: PathBuf,
    /// This driver's plugin directory (default: <kubelet plugins directory>/<driver-name>).
    #[arg(long, env = "GPU_DRA_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Kubelet's plugins directory, as NVIDIA's driver and the kubelet plugin library name it:
    /// the plugin directory is `<this>/<driver-name>` unless --plugin-dir says otherwise.
    #[arg(
        long,
        env = "KUBELET_PLUGINS_DIRECTORY_PATH",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub kubelet_plugins_directory_path: PathBuf,
    /// Where CDI specs are written.
    #[arg(long, env = "GPU_DRA_CDI_ROOT", default_value = "/var/run/cdi")]
    pub cdi_root: PathBuf,
    /// Where the host's device nodes are, if not under `/` (e.g. `/run/nvidia/driver` with a
    /// containerized driver): CDI device nodes keep their `/dev/...` path in the container and
    /// get `hostPath: <dev-root>/dev/...`. Default: the NVIDIA driver root when it has
    /// `dev/nvidiactl`, else `/`.
    #[arg(long, env = "GPU_DRA_DEV_ROOT")]
    pub dev_root: Option<PathBuf>,
    /// The NVIDIA driver's root on the host (`/`, or `/run/nvidia/driver` under the GPU
    /// operator), as NVIDIA's driver takes it: libnvidia-ml.so.1 is loaded from it and its
    /// device nodes are used when it has `dev/`.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", default_value = "/")]
    pub nvidia_driver_root: PathBuf,
    /// Where the NVIDIA driver root is mounted in this container (default: the same path).
    #[arg(long, env = "CONTAINER_DRIVER_ROOT")]
    pub container_driver_root: Option<PathBuf>,
    /// The NVIDIA container toolkit's hook on the host (`nvidia-cdi-hook`, or `nvidia-ctk` of
    /// older toolkits), as NVIDIA's driver takes it: CDI specs call it to link the driver's
    /// libraries and update the container's ld cache. Default: `usr/bin/nvidia-cdi-hook` (or
    /// `nvidia-ctk`) under the driver root when there; without one, each library is also
    /// bind-mounted at its links' paths.
    #[arg(long, env = "NVIDIA_CDI_HOOK_PATH")]
    pub nvidia_cdi_hook_path: Option<PathBuf>,
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
    /// Who may read `/metrics` (the series name every tenant's claims and pods on the node):
    /// `none`, anyone who reaches the port; `kubernetes`, a bearer token the API server
    /// authenticates (TokenReview) and allows `get` on the URL `/metrics`
    /// (SubjectAccessReview). The probes stay open either way.
    #[arg(long, env = "GPU_DRA_METRICS_AUTH", value_enum, default_value = "none")]
    pub metrics_auth: crate::node::MetricsAuthMode,
    /// How often prepared claims are checked against the API server (Go duration, e.g. `1m`;
    /// a bare number is seconds).
    #[arg(long, env = "GPU_DRA_GC_INTERVAL", default_value = "1m", value_parser = duration::parse,
        alias = "gc-interval-seconds")]
    pub gc_interval: Duration,
    /// How long a prepared claim must stay deleted (or deallocated) before garbage collection
    /// unprepares it: kubelet normally does so itself once the pod's containers are gone.
    #[arg(long, env = "GPU_DRA_GC_GRACE", default_value = "30s", value_parser = duration::parse,
        alias = "gc-grace-seconds")]
    pub gc_grace: Duration,
    /// How often the GPUs of prepared claims are asked how much of them is in use (memory,
    /// utilization, compute processes) for the per-claim use metrics; `0` turns it off. Never
    /// on the prepare path.
    #[arg(long, env = "GPU_DRA_USAGE_INTERVAL", default_value = "15s", value_parser = duration::parse)]
    pub usage_interval: Duration,
    /// Also run the `compute-domain.nvidia.com` plugin (ComputeDomains, IMEX channels): its own
    /// registration and DRA sockets, channel 0 in its own pool, and one IMEX daemon per domain
    /// this node serves.
    #[arg(long, env = "GPU_DRA_COMPUTE_DOMAINS")]
    pub compute_domains: bool,
    /// The address other nodes' IMEX daemons reach this node at (default: the Node's
    /// InternalIP). Only with --compute-domains.
    #[arg(long, env = "GPU_DRA_NODE_IP", requires = "compute_domains")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Where the ComputeDomain controller keeps each domain's IMEX credentials (Secrets
    /// `gpu-dra-imex-<domain UID>`; default: this process's own namespace, as the chart runs
    /// both). Only with --compute-domains.
    #[arg(
        long,
        env = "GPU_DRA_IMEX_CREDENTIALS_NAMESPACE",
        requires = "compute_domains"
    )]
    pub imex_credentials_namespace: Option<String>,
    /// Who runs the IMEX daemons (NVIDIA's `imex.mode`): `driver-managed` (one per ComputeDomain,
    /// started by the plugin) or `host-managed` (the admin runs nvidia-imex on the host; give
    /// --imex-host-socket).
    #[arg(
        long,
        env = "GPU_DRA_IMEX_MODE",
        value_enum,
        default_value = "driver-managed",
        requires = "compute_domains"
    )]
    pub imex_mode: ImexModeArg,
    /// Host-managed IMEX: the host daemon's command socket (its IMEX_CMD_UNIX_DOMAIN_PATH),
    /// asked `nvidia-imex-ctl -q` before each channel is injected.
    #[arg(long, env = "GPU_DRA_IMEX_HOST_SOCKET")]
    pub imex_host_socket: Option<PathBuf>,
    /// Keep the node's NVLink clique in its `nvidia.com/gpu.clique` label (NVIDIA's
    /// `gpuCliqueLabelEnabled`, once set by gpu-feature-discovery): set once known, moved with
    /// the fabric, removed when the driver stops. Only with --compute-domains.
    // Not `requires`: NVIDIA's chart sets GPU_CLIQUE_LABEL_ENABLED=false everywhere, which
    // clap would count as given. Checked in `run`.
    #[arg(long, env = "GPU_CLIQUE_LABEL_ENABLED")]
    pub gpu_clique_label: bool,
    /// How long one prepare of a channel waits for its ComputeDomain's nodes before it fails
    /// and kubelet retries (kubelet gives a prepare call 45 s).
    #[arg(long, env = "GPU_DRA_COMPUTE_DOMAIN_READY_TIMEOUT", default_value = "30s",
        value_parser = duration::parse, requires = "compute_domains")]
    pub compute_domain_ready_timeout: Duration,
    /// Let claims of different namespaces share a GPU's one MPS daemon (`--consumable-shares`
    /// with MPS). Off by default: they would share its pipe, shm and control commands, and the
    /// per-claim limits are only asked for in each client's environment (cooperative).
    #[arg(long, env = "GPU_DRA_MPS_SHARE_ACROSS_NAMESPACES")]
    pub mps_share_across_namespaces: bool,
    /// Simulated GPUs only (`--gpus sim:...`): how long each GPU instance create and destroy
    /// takes (Go duration, e.g. `1s`), as real MIG changes take up to seconds; benchmarks and
    /// tests use it. Refused with real GPUs.
    #[arg(long, env = "GPU_DRA_SIM_MIG_DELAY", default_value = "0s", value_parser = duration::parse)]
    pub sim_mig_delay: Duration,
    /// How often the published slices are compared with the desired ones even without events.
    #[arg(long, env = "GPU_DRA_RESYNC_INTERVAL", default_value = "1m", value_parser = duration::parse,
        alias = "resync-interval-seconds")]
    pub resync_interval: Duration,
    /// XIDs that are the application's fault and change nothing (comma-separated; empty acts on
    /// every XID).
    #[arg(long, env = "GPU_DRA_IGNORED_XIDS", default_value = DEFAULT_IGNORED_XIDS,
        value_parser = crate::health::parse_xids)]
    pub ignored_xids: BTreeSet<u64>,
    /// More XIDs to ignore besides --ignored-xids, as NVIDIA's driver takes them.
    #[arg(long, env = "ADDITIONAL_XIDS_TO_IGNORE", default_value = "",
        value_parser = crate::health::parse_xids)]
    pub additional_xids_to_ignore: BTreeSet<u64>,
    /// The device taint effect of each class of GPU fault: `recoverable` (XIDs that clear after
    /// a quiet period), `reset` (XIDs that need a GPU reset, double-bit ECC errors), `lost` (the
    /// GPU fell off the bus). NoExecute makes kube-controller-manager evict the pods using it.
    #[arg(
        long,
        env = "GPU_DRA_HEALTH_TAINT_EFFECTS",
        default_value = "recoverable=NoSchedule,reset=NoSchedule,lost=NoSchedule"
    )]
    pub health_taint_effects: crate::health::TaintEffects,
    /// How long a recoverable fault must stay quiet, with the GPU answering, before its taint is
    /// removed.
    #[arg(long, env = "GPU_DRA_HEALTH_RECOVERY_AFTER", default_value = "10m", value_parser = duration::parse)]
    pub health_recovery_after: Duration,
    /// How often every GPU is probed (lost, reset) and kubelet's health stream refreshed.
    #[arg(long, env = "GPU_DRA_HEALTH_PROBE_INTERVAL", default_value = "5s", value_parser = duration::parse)]
    pub health_probe_interval: Duration,
    /// How often the GPUs are discovered again, besides after every fault and every MIG change
    /// NVML reports (`nvmlEventMigConfigChange`: MIG devices made or destroyed by anyone, read at
    /// once): the fallback for what no event reports (MIG mode changed at a reset, GPUs whose NVML
    /// has no MIG events).
    #[arg(long, env = "GPU_DRA_RESCAN_INTERVAL", default_value = "60s", value_parser = duration::parse)]
    pub rescan_interval: Duration,
    /// Device order within each node's pool: `packed` (best fit for dynamic MIG placements: the
    /// scheduler takes the first device that fits, so the order decides where MIG devices land)
    /// or `name` (NVIDIA's plain name order, for comparison).
    #[arg(long, env = "GPU_DRA_DEVICE_ORDER", default_value = "packed", value_parser = device_order())]
    pub device_order: DeviceOrder,
    /// How long one call to the API server may take before it is abandoned and retried.
    #[arg(long, env = "GPU_DRA_API_TIMEOUT", default_value = "20s", value_parser = duration::parse,
        alias = "api-timeout-seconds")]
    pub api_timeout: Duration,
}

/// `--device-order`: `packed` or `name`.
pub(super) fn device_order() -> impl clap::builder::TypedValueParser<Value = DeviceOrder> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["packed", "name"]).map(|s| match s.as_str() {
        "name" => DeviceOrder::Name,
        _ => DeviceOrder::Packed,
    })
}

/// NVIDIA's application XIDs (13, 31, 43, 45, 68, 109).
const DEFAULT_IGNORED_XIDS: &str = "13,31,43,45,68,109";

/// Where libnvidia-ml.so.1 is looked for under a driver root: the toolkit's library folders.
const NVML_LIBRARY_DIRS: [&str; 6] = crate::prepare::driver_files::LIBRARY_DIRS;

impl RunArgs {
    fn container_driver_root(&self) -> &Path {
        self.container_driver_root
            .as_deref()
            .unwrap_or(&self.nvidia_driver_root)
    }

    /// libnvidia-ml.so.1 under the driver root (through its ld cache, then the toolkit's library
    /// folders), unless given explicitly or the root is `/` (the loader's own search finds it).
    fn nvml_library(&self) -> Result<Option<PathBuf>, CliError> {
        if self.gpu.nvml_lib.is_some() || !matches!(self.gpu.gpus, GpuSource::Nvml) {
            return Ok(self.gpu.nvml_lib.clone());
        }
        let root = self.container_driver_root();
        if root == Path::new("/") {
            return Ok(None);
        }
        crate::prepare::driver_files::find_library(root, "libnvidia-ml.so.1")
            .map(Some)
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "--nvidia-driver-root: no libnvidia-ml.so.1 under {} (looked in its etc/ld.so.cache and in {})",
                    root.display(),
                    NVML_LIBRARY_DIRS.join(", ")
                ))
            })
    }

    /// The driver's `nvidia-smi` (time-slicing sets the interval with it, as NVIDIA's driver
    /// does), run chrooted into the driver root; `None` when the driver root has none. Either
    /// way, or when it cannot run there (a driver root without its own loader), only the claims
    /// that set a time-slice interval notice: they are refused with the reason, and the node
    /// serves everything else.
    fn nvidia_smi(&self) -> Option<crate::gpu::driver_tools::NvidiaSmi> {
        let tools = crate::gpu::driver_tools::DriverRootTools::new(
            self.container_driver_root(),
            &self.nvidia_driver_root,
        );
        let smi = crate::gpu::driver_tools::NvidiaSmi::find(&tools)?.checked();
        if let Some(reason) = smi.unusable() {
            tracing::warn!(%reason, "time-sliced claims that set an interval are refused: nvidia-smi cannot run in the driver root; everything else is served");
        }
        Some(smi.on_simulated_gpus(self.gpu.sim_state.as_deref()))
    }

    /// Where containers' driver files come from: the driver root for real GPUs (an empty one is a
    /// start-up error), and for simulated GPUs only when a driver root was given.
    fn driver_root(&self) -> Result<Option<crate::prepare::driver_files::DriverRoot>, CliError> {
        let real_gpus = matches!(self.gpu.gpus, GpuSource::Nvml);
        if !real_gpus && self.nvidia_driver_root == Path::new("/") {
            // A hook path would have no driver files to link: refused, not ignored.
            if let Some(hook) = &self.nvidia_cdi_hook_path {
                return Err(CliError::Usage(format!(
                    "--nvidia-cdi-hook-path {}: simulated GPUs mount no driver files unless given --nvidia-driver-root",
                    hook.display()
                )));
            }
            return Ok(None);
        }
        Ok(Some(crate::prepare::driver_files::DriverRoot {
            here: self.container_driver_root().to_path_buf(),
            host: self.nvidia_driver_root.clone(),
            hook: self.nvidia_cdi_hook_path.clone(),
            firmware: crate::prepare::driver_files::FirmwareSearch::from_host(&self.gpu.sysfs_root),
        }))
    }

    /// `--dev-root`, else the driver root when the driver keeps its device nodes there.
    fn dev_root(&self) -> Option<PathBuf> {
        if self.dev_root.is_some() {
            return self.dev_root.clone();
        }
        let has_devices = self.container_driver_root().join("dev/nvidiactl").exists();
        (self.nvidia_driver_root != Path::new("/") && has_devices)
            .then(|| self.nvidia_driver_root.clone())
    }
}

pub fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    if args.gpu_clique_label && !args.compute_domains {
        return Err(CliError::Usage(
            "--gpu-clique-label (GPU_CLIQUE_LABEL_ENABLED): the ComputeDomain plugin keeps that label; add --compute-domains".into(),
        ));
    }
    let plugin_dir = args
        .plugin_dir
        .clone()
        .unwrap_or_else(|| args.kubelet_plugins_directory_path.join(&args.driver_name));
    // Zero would spin: a minimum keeps the loops sane.
    let at_least = |duration: Duration, min: Duration| duration.max(min);
    let mut discovery = args.gpu.discovery(&args.node_name);
    discovery.nvml_library = args.nvml_library()?;
    discovery.nvidia_smi = args.nvidia_smi();
    if !args.sim_mig_delay.is_zero() && !matches!(discovery.source, crate::gpu::GpuSource::Sim(_)) {
        return Err(CliError::Usage(format!(
            "--sim-mig-delay: only simulated GPUs (--gpus sim:...) can be slowed down, but --gpus is {}",
            discovery.source
        )));
    }
    discovery.sim_mig_delay = args.sim_mig_delay;
    let mut gated = crate::slices::SliceOptions::new(&args.driver_name, &args.node_name);
    args.gated.apply(&mut gated)?;
    let imex = match (args.imex_mode, &args.imex_host_socket) {
        (ImexModeArg::DriverManaged, None) => crate::compute_domain::node::ImexMode::DriverManaged,
        (ImexModeArg::DriverManaged, Some(socket)) => {
            return Err(CliError::Usage(format!(
                "--imex-host-socket {}: only with --imex-mode host-managed",
                socket.display()
            )));
        }
        (ImexModeArg::HostManaged, Some(socket)) => {
            crate::compute_domain::node::ImexMode::HostManaged {
                command_socket: socket.clone(),
            }
        }
        (ImexModeArg::HostManaged, None) => {
            return Err(CliError::Usage(
                "--imex-mode host-managed: give --imex-host-socket (the host daemon's IMEX_CMD_UNIX_DOMAIN_PATH)".into(),
            ));
        }
    };
    let compute_domains = args.compute_domains.then(|| {
        let plugin_dir = args
            .kubelet_plugins_directory_path
            .join(crate::compute_domain::DRIVER_NAME);
        crate::node::ComputeDomainOptions {
            state_dir: args
                .state_dir
                .as_ref()
                .map(|d| d.join("compute-domains"))
                .unwrap_or_else(|| plugin_dir.clone()),
            plugin_dir,
            node_ip: args.node_ip.map(|ip| ip.to_string()),
            ready_timeout: args
                .compute_domain_ready_timeout
                .max(Duration::from_secs(1)),
            tools: crate::gpu::driver_tools::DriverRootTools::new(
                args.container_driver_root(),
                &args.nvidia_driver_root,
            ),
            cdi_root: args.cdi_root.clone(),
            imex,
            clique_label: args.gpu_clique_label,
            credentials_namespace: args.imex_credentials_namespace.clone(),
        }
    });
    let options = NodeOptions {
        compute_domains,
        discovery,
        driver_name: args.driver_name.clone(),
        mig_policy: args.gpu.mig,
        consumable: args.gpu.consumable_shares,
        passthrough: args.gpu.passthrough,
        numa_node_list: gated.numa_node_list,
        node_allocatable: gated.node_allocatable,
        mps_across_namespaces: args.mps_share_across_namespaces,
        device_order: args.device_order,
        kubeconfig: args.kubeconfig.clone(),
        registrar_dir: args.registrar_dir.clone(),
        state_dir: args.state_dir.clone().unwrap_or_else(|| plugin_dir.clone()),
        plugin_dir,
        cdi_root: args.cdi_root.clone(),
        dev_root: args.dev_root(),
        driver_root: args.driver_root()?,
        rolling_update_uid: args.rolling_update_uid.clone(),
        gc_interval: at_least(args.gc_interval, Duration::from_secs(1)),
        usage_interval: (!args.usage_interval.is_zero())
            .then(|| at_least(args.usage_interval, Duration::from_secs(1))),
        gc_grace: args.gc_grace,
        resync_interval: at_least(args.resync_interval, Duration::from_secs(1)),
        metrics_addr: args.metrics_addr,
        metrics_auth: args.metrics_auth,
        api_timeouts: crate::kubeapi::ApiTimeouts {
            request: at_least(args.api_timeout, Duration::from_millis(100)),
            ..Default::default()
        },
        health: health_config(&args),
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

pub(crate) async fn wait_for_signal() -> Result<(), CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

/// The health monitor's settings from the flags (intervals held to a floor).
fn health_config(args: &RunArgs) -> crate::health::HealthConfig {
    crate::health::HealthConfig {
        ignored_xids: args
            .ignored_xids
            .union(&args.additional_xids_to_ignore)
            .copied()
            .collect(),
        effects: args.health_taint_effects,
        recovery_after: args.health_recovery_after,
        probe_interval: args.health_probe_interval.max(Duration::from_millis(100)),
        rescan_interval: args.rescan_interval.max(Duration::from_millis(500)),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> (Option<u8>, RunArgs) {
        let mut argv = vec!["gpu-dra", "run", "--node-name", "n1"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).expect("parses");
        match cli.command {
            Command::Run(run) => (cli.verbosity, run),
            other => panic!("not run: {other:?}"),
        }
    }

    #[test]
    fn old_and_kubernetes_style_flags_both_work() {
        let (_, old) = parse(&[
            "--gc-interval-seconds",
            "5",
            "--registrar-dir",
            "/r",
            "--api-timeout-seconds",
            "7",
        ]);
        assert_eq!(old.gc_interval, Duration::from_secs(5));
        assert_eq!(old.api_timeout, Duration::from_secs(7));
        assert_eq!(old.registrar_dir, Path::new("/r"));
        let (verbosity, new) = parse(&[
            "--gc-interval",
            "1m30s",
            "--gc-grace=250ms",
            "--kubelet-registrar-directory-path",
            "/r2",
            "--kubelet-plugins-directory-path",
            "/plugins",
            "-v",
            "4",
        ]);
        assert_eq!(new.gc_interval, Duration::from_secs(90));
        assert_eq!(new.gc_grace, Duration::from_millis(250));
        assert_eq!(new.registrar_dir, Path::new("/r2"));
        assert_eq!(new.kubelet_plugins_directory_path, Path::new("/plugins"));
        assert_eq!(verbosity, Some(4));
        assert_eq!(
            crate::cli::verbosity_filter(verbosity),
            "info,gpu_dra=debug"
        );
        let bad = Cli::try_parse_from(["gpu-dra", "run", "--node-name", "n", "--gc-grace", "5x"]);
        let message = bad.expect_err("bad duration").to_string();
        assert!(
            message.contains("--gc-grace") && message.contains("unknown unit"),
            "{message}"
        );
    }

    #[test]
    fn the_health_flags_default_to_what_the_monitor_defaults_to() {
        // The clap defaults are strings; HealthConfig::default (tests, the demo) is the same
        // settings in code: this keeps the two from drifting apart (the rescan went 10 s -> 60 s).
        let (_, args) = parse(&[]);
        assert_eq!(health_config(&args), crate::health::HealthConfig::default());
    }

    #[test]
    fn device_order_flag_parses() {
        assert_eq!(parse(&[]).1.device_order, DeviceOrder::Packed);
        assert_eq!(
            parse(&["--device-order", "name"]).1.device_order,
            DeviceOrder::Name
        );
        assert_eq!(
            parse(&["--device-order=packed"]).1.device_order,
            DeviceOrder::Packed
        );
        let bad =
            Cli::try_parse_from(["gpu-dra", "run", "--node-name", "n", "--device-order", "x"]);
        let message = bad.expect_err("unknown order").to_string();
        assert!(
            message.contains("--device-order") && message.contains("packed, name"),
            "{message}"
        );
    }

    #[test]
    fn the_driver_root_supplies_nvml_and_device_nodes() {
        let root = tempfile::tempdir().expect("tempdir");
        let lib_dir = root.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib_dir).expect("mkdir");
        std::fs::write(lib_dir.join("libnvidia-ml.so.1"), b"").expect("lib");
        std::fs::create_dir_all(root.path().join("dev")).expect("mkdir");
        std::fs::write(root.path().join("dev/nvidiactl"), b"").expect("dev");
        let container_root = root.path().to_string_lossy().into_owned();
        let (_, args) = parse(&[
            "--nvidia-driver-root",
            "/run/nvidia/driver",
            "--container-driver-root",
            &container_root,
        ]);
        assert_eq!(
            args.nvml_library().expect("found"),
            Some(lib_dir.join("libnvidia-ml.so.1"))
        );
        assert_eq!(args.dev_root(), Some(PathBuf::from("/run/nvidia/driver")));
        // An explicit --dev-root wins; a root without the library is an error, not a guess.
        let (_, args) = parse(&["--nvidia-driver-root", "/nonexistent", "--dev-root", "/d"]);
        assert_eq!(args.dev_root(), Some(PathBuf::from("/d")));
        assert!(args.nvml_library().is_err());
        // The host's own driver: the loader finds NVML, /dev is the dev root.
        let (_, args) = parse(&[]);
        assert_eq!(args.nvml_library().expect("default"), None);
        assert_eq!(args.dev_root(), None);
    }
}

/// `--imex-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImexModeArg {
    DriverManaged,
    HostManaged,
}
