//! `gpu-dra slices`: print what this node would publish.
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::CliError;
use crate::gpu::{self, DiscoveryConfig, GpuSource};
use crate::slices::{self, SliceOptions};

/// Where GPUs come from; shared by every subcommand that discovers GPUs.
#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// GPU source: `nvml`, or a simulated node `sim:<N>x<MODEL>[,<N>x<MODEL>...]` (models:
    /// A100-SXM4-40GB, A100-SXM4-80GB, A30-24GB, A10, H100-SXM5-80GB, H100-PCIE-80GB,
    /// H100-NVL-94GB, H20-96GB, GH200-96GB, H200-SXM5-141GB, B200-SXM6-180GB, GB200-186GB, GB10,
    /// RTX-PRO-6000-BSE-96GB, L40S, L4, T4).
    #[arg(long, env = "GPU_DRA_GPUS", default_value = "nvml", value_parser = parse_source)]
    pub gpus: GpuSource,
    /// Simulator hardware state file (MIG mode and instances persist here across restarts).
    #[arg(long, env = "GPU_DRA_SIM_STATE")]
    pub sim_state: Option<PathBuf>,
    /// NVML library to load instead of `libnvidia-ml.so.1`.
    #[arg(long, env = "GPU_DRA_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// How MIG-capable GPUs are offered: `auto` (dynamic on Hopper+ and on GPUs in MIG mode,
    /// static where MIG devices someone else made exist), `dynamic`, `static` or `off`.
    #[arg(long, env = "GPU_DRA_MIG", default_value = "auto")]
    pub mig: crate::gpu::mig::MigPolicy,
    /// sysfs mount, for PCIe root lookups.
    #[arg(long, env = "GPU_DRA_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Devices several claims may share (KEP-5075, needs the `DRAConsumableCapacity` gate), with
    /// NVIDIA's values: `off` (or `disabled`); `memory` (claims ask for
    /// `capacity.requests.memory`, default all of it); `unlimited` (memory, default none); or a
    /// number N of `shares` per device (default request 1). Applies to full GPUs and MIG devices.
    #[arg(long, env = "GPU_DRA_CONSUMABLE_SHARES", default_value = "off")]
    pub consumable_shares: slices::consumable::ConsumableShares,
    /// Also publish each eligible GPU for virtual machines as `gpu-vfio-<index>` (class
    /// `vfio.gpu.nvidia.com`; NVIDIA's `PassthroughSupport`): prepared, it is bound to its VFIO
    /// driver (`vfio-pci`, or the kernel's variant for it). A GPU's VFIO device and its other devices exclude each other (a counter set
    /// per PCI function). Needs the IOMMU on; GPUs in MIG mode with MIG devices offered
    /// statically, or sharing an IOMMU group with a device bound elsewhere, are not offered.
    #[arg(long, env = "GPU_DRA_PASSTHROUGH")]
    pub passthrough: bool,
    /// The kernel's modules folder (`<dir>/<release>/modules.alias`): which VFIO variant driver
    /// a GPU goes to a virtual machine through (`nvgrace_gpu_vfio_pci` for Grace-attached GPUs).
    #[arg(
        long,
        env = "GPU_DRA_MODULES_ROOT",
        default_value = crate::gpu::pci::MODULES_ROOT,
        requires = "passthrough"
    )]
    pub modules_root: PathBuf,
}

impl GpuArgs {
    pub fn discovery(&self, node_name: &str) -> DiscoveryConfig {
        DiscoveryConfig {
            sim_state: self.sim_state.clone(),
            nvml_library: self.nvml_lib.clone(),
            sysfs_root: self.sysfs_root.clone(),
            scan_pci: self.passthrough,
            modules_root: self.modules_root.clone(),
            ..DiscoveryConfig::new(self.gpus.clone(), node_name)
        }
    }
}

fn parse_source(s: &str) -> Result<GpuSource, String> {
    s.parse().map_err(|e: gpu::GpuError| e.to_string())
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Yaml,
    Json,
}

/// Slice fields behind Kubernetes alpha gates (see [`crate::slices::gates`]).
#[derive(Debug, Args)]
pub struct GatedArgs {
    /// Driver feature gates `NAME=true|false,...` (chart `featureGates`, as NVIDIA's driver names
    /// them): `DRAListTypeAttributes` publishes `resource.kubernetes.io/numaNode` as a one-element
    /// list; `DRANodeAllocatableResources` publishes --node-allocatable-overhead. Each needs the
    /// gate of the same name on kube-apiserver and kube-scheduler: `run` refuses to start when
    /// the API server drops the field. NVIDIA's TimeSlicingSettings, MPSSupport and
    /// NVMLDeviceHealthCheck are always on (=true accepted).
    #[arg(long, env = "GPU_DRA_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// YAML table of per-device node-allocatable overhead (KEP-5517): `PRODUCT[/PROFILE]|"*"` →
    /// `cpu|memory|hugepages-<size>` → `{perPod, perContainer}`; needs
    /// `--feature-gates DRANodeAllocatableResources=true`.
    #[arg(long, env = "GPU_DRA_NODE_ALLOCATABLE_OVERHEAD", value_name = "FILE")]
    pub node_allocatable_overhead: Option<PathBuf>,
}

impl GatedArgs {
    /// Sets the gated fields of `options`; a bad gate, a table without its gate (or the gate
    /// without a table) or a bad table is an error naming the flag and field.
    pub fn apply(&self, options: &mut SliceOptions) -> Result<(), CliError> {
        let gates = slices::gates::DriverGates::parse(&self.feature_gates)
            .map_err(|e| CliError::Usage(format!("--feature-gates: {e}")))?;
        options.numa_node_list = gates.list_type_attributes;
        match (
            &self.node_allocatable_overhead,
            gates.node_allocatable_resources,
        ) {
            (None, false) => {}
            (Some(path), false) => {
                return Err(CliError::Usage(format!(
                    "--node-allocatable-overhead {}: needs --feature-gates {}=true (and that gate on in kube-apiserver and kube-scheduler)",
                    path.display(),
                    slices::gates::NODE_ALLOCATABLE_RESOURCES
                )));
            }
            (None, true) => {
                return Err(CliError::Usage(format!(
                    "--feature-gates {}=true: give the overhead table with --node-allocatable-overhead FILE (chart nodeAllocatableOverhead)",
                    slices::gates::NODE_ALLOCATABLE_RESOURCES
                )));
            }
            (Some(path), true) => {
                let at = |e: String| {
                    CliError::Usage(format!(
                        "--node-allocatable-overhead {}: {e}",
                        path.display()
                    ))
                };
                let text = std::fs::read_to_string(path).map_err(|e| at(e.to_string()))?;
                let table = slices::node_allocatable::OverheadTable::parse(&text).map_err(at)?;
                if table.is_empty() {
                    return Err(at("the table is empty".into()));
                }
                options.node_allocatable = std::sync::Arc::new(table);
            }
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  gpu-dra slices --gpus sim:8xH100-SXM5-80GB --node-name n1 -o yaml"
)]
pub struct SlicesArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub gated: GatedArgs,
    /// Node whose pool the slices describe.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// DRA driver name the slices are published under.
    #[arg(long, env = "GPU_DRA_DRIVER_NAME", default_value = slices::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: OutputFormat,
}

/// The node's GPUs and the options the driver would publish them with, from the flags.
pub fn discover_with_options(
    gpu: &GpuArgs,
    gated: &GatedArgs,
    driver_name: &str,
    node_name: &str,
) -> Result<(gpu::NodeInventory, SliceOptions), CliError> {
    let inventory = gpu::discover(&gpu.discovery(node_name))?;
    let mut options = SliceOptions {
        mig_policy: gpu.mig,
        consumable: gpu.consumable_shares,
        passthrough: gpu.passthrough,
        ..SliceOptions::new(driver_name, node_name)
    };
    gated.apply(&mut options)?;
    Ok((inventory, options))
}

pub fn run(args: SlicesArgs) -> Result<ExitCode, CliError> {
    let (inventory, options) =
        discover_with_options(&args.gpu, &args.gated, &args.driver_name, &args.node_name)?;
    if options.passthrough {
        slices::passthrough::log_offer(&inventory, &options.modes(&inventory));
    }
    let slices = slices::build(&inventory, &options)?;
    let items: Vec<serde_json::Value> = slices
        .iter()
        .map(|s| serde_json::to_value(s).map_err(|e| CliError::Encode(e.to_string())))
        .collect::<Result<_, _>>()?;
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items });
    write_document(&list, args.output)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints one document to stdout in the chosen format.
pub fn write_document(value: &serde_json::Value, format: OutputFormat) -> Result<(), CliError> {
    let text = match format {
        OutputFormat::Json => {
            let mut s =
                serde_json::to_string_pretty(value).map_err(|e| CliError::Encode(e.to_string()))?;
            s.push('\n');
            s
        }
        OutputFormat::Yaml => {
            serde_yaml_ng::to_string(value).map_err(|e| CliError::Encode(e.to_string()))?
        }
    };
    std::io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}
