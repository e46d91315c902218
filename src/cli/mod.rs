//! Command-line interface: one submodule per subcommand.
//!
//! The offline commands (`demo`, `cel`, `match`, `explain`, `capacity`) need the CEL engine and
//! the allocator; they exist only with the cargo feature `tools` (on by default). The
//! DaemonSet image builds without it, so the privileged node binary offers `run`, `slices` and
//! `sim` and links neither engine.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[cfg(feature = "tools")]
pub mod capacity;
pub mod cdi;
#[cfg(feature = "tools")]
pub mod cel;
#[cfg(feature = "tools")]
pub mod claims;
pub mod compute_domain_controller;
#[cfg(feature = "tools")]
pub mod demo;
pub mod duration;
pub mod health;
#[cfg(feature = "tools")]
pub mod live;
#[cfg(feature = "tools")]
pub mod manifests;
pub mod run;
pub mod sim;
pub mod slices;
pub mod templates;
pub mod usage;
pub mod vfio_check;

/// gpu-dra: Kubernetes DRA driver for NVIDIA GPUs.
#[derive(Debug, Parser)]
#[command(name = "gpu-dra", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr (level from RUST_LOG, default `info`).
    #[arg(
        long,
        global = true,
        env = "GPU_DRA_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log verbosity as Kubernetes components take it (`-v 4`, `--v=4`): 0-1 info, 2-4 debug,
    /// 5+ trace, for gpu-dra's own logs. RUST_LOG, when set, wins.
    #[arg(
        short = 'v',
        long = "v",
        global = true,
        env = "GPU_DRA_V",
        value_name = "LEVEL"
    )]
    pub verbosity: Option<u8>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The log filter for a `-v` level: klog's scale mapped onto tracing's levels.
pub fn verbosity_filter(level: Option<u8>) -> String {
    match level.unwrap_or(0) {
        0 | 1 => "info".into(),
        2..=4 => "info,gpu_dra=debug".into(),
        _ => "info,gpu_dra=trace".into(),
    }
}

impl Cli {
    /// Whether the command tells its own story on stdout (`demo`): the driver's logs would
    /// interleave with it, so they show only with `-v` (errors always).
    pub fn narrates(&self) -> bool {
        #[cfg(feature = "tools")]
        if matches!(self.command, Command::Demo(_)) {
            return true;
        }
        false
    }
}

/// Sends `tracing` logs to stderr in the chosen format; a narrating command without `-v` logs
/// errors only.
pub fn init_logging(format: LogFormat, verbosity: Option<u8>, narrates: bool) {
    let default = match verbosity {
        None if narrates => "error".to_string(),
        level => verbosity_filter(level),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process; boxing buys nothing
pub enum Command {
    /// Walk through the whole driver on a simulated node: discover, publish, allocate, prepare,
    /// unprepare. No GPU or cluster needed.
    #[cfg(feature = "tools")]
    Demo(demo::DemoArgs),
    /// Run the node driver: publish slices and serve kubelet's prepare/unprepare calls.
    Run(run::RunArgs),
    /// Run the ComputeDomain controller: channel ResourceClaimTemplates, finalizers and status
    /// of `resource.nvidia.com/v1beta1` ComputeDomains.
    ComputeDomainController(compute_domain_controller::ControllerArgs),
    /// Print the ResourceSlices this node would publish, as a v1 List.
    Slices(slices::SlicesArgs),
    /// Print the ResourceSlices a node of a model will publish as an autoscaler's templates
    /// (Karpenter's instance-type form, or ResourceSlices), without the GPUs' UUIDs.
    Templates(templates::TemplatesArgs),
    /// Print the CDI spec a claim holding some of this node's devices gets (device nodes, driver
    /// libraries, binaries, firmware, hooks).
    Cdi(cdi::CdiArgs),
    /// Read each GPU's health once as the driver's watcher does (NVML fault events, liveness,
    /// recovery action); changes nothing.
    Health(health::HealthArgs),
    /// Read each GPU's use once as the driver's metrics do (memory, utilization, compute
    /// processes with their memory and MIG device); changes nothing.
    Usage(usage::UsageArgs),
    /// Hand one GPU to its VFIO driver and back as a VM claim's prepare and unprepare do, and
    /// report each half: CHANGES the GPU's kernel binding (the GPU's PCI address is asked twice).
    VfioCheck(vfio_check::VfioCheckArgs),
    /// Operate simulated GPU hardware (MIG mode, instances) in a state file.
    Sim(sim::SimArgs),
    /// Evaluate DRA CEL selectors exactly as Kubernetes does.
    #[cfg(feature = "tools")]
    #[command(subcommand)]
    Cel(cel::CelCommand),
    /// Allocate ResourceClaims (or the claims of the pods and workloads in manifests) offline as
    /// kube-scheduler would; print them with status.allocation.
    #[cfg(feature = "tools")]
    Match(claims::MatchArgs),
    /// Explain, device by device, how kube-scheduler would allocate claims (or not): offline, or
    /// for a pod, claim or workload of a live cluster (`explain pod/NAME -n NS`, `job/NAME`).
    #[cfg(feature = "tools")]
    Explain(claims::ExplainArgs),
    /// How many more copies of a pod fit right now, per node, and what runs out first.
    #[cfg(feature = "tools")]
    Capacity(capacity::CapacityArgs),
}

/// Errors a subcommand reports; `main` prints them with their causes.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error(transparent)]
    Slices(#[from] crate::slices::SliceError),
    #[error("{0}")]
    Usage(String),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Node(Box<crate::node::NodeError>),
    #[error("encoding output: {0}")]
    Encode(String),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::ComputeDomainController(args) => compute_domain_controller::run(args),
        Command::Slices(args) => slices::run(args),
        Command::Templates(args) => templates::run(args),
        Command::Cdi(args) => cdi::run(args),
        Command::Health(args) => health::run(args),
        Command::Usage(args) => usage::run(args),
        Command::VfioCheck(args) => vfio_check::run(args),
        Command::Sim(args) => sim::run(args),
        #[cfg(feature = "tools")]
        Command::Demo(args) => demo::run(args),
        #[cfg(feature = "tools")]
        Command::Cel(cmd) => cel::run(cmd),
        #[cfg(feature = "tools")]
        Command::Match(args) => claims::run_match(args),
        #[cfg(feature = "tools")]
        Command::Explain(args) => claims::run_explain(args),
        #[cfg(feature = "tools")]
        Command::Capacity(args) => capacity::run(args),
    }
}
