//! `gpu-dra sim`: operate the simulated hardware, as `nvidia-smi mig` would on a real node.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::CliError;
use crate::gpu::sim::{PciDriver, SimFault, SimNode, SimSpec};
use crate::gpu::{GpuError, Placement};

#[derive(Debug, Args)]
pub struct SimArgs {
    /// The simulated node: `sim:<N>x<MODEL>[,...]`.
    #[arg(long, env = "GPU_DRA_GPUS", value_parser = parse_spec)]
    pub gpus: SimSpec,
    /// Node name (GPU UUIDs derive from it).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Hardware state file.
    #[arg(long, env = "GPU_DRA_SIM_STATE")]
    pub sim_state: PathBuf,
    #[command(subcommand)]
    pub command: SimCommand,
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Print the hardware state as JSON.
    Show,
    /// Enable or disable MIG mode (Ampere applies it at the next `reset`).
    MigMode {
        #[arg(long)]
        gpu: u32,
        #[arg(long, action = clap::ArgAction::Set)]
        enabled: bool,
    },
    /// Reset a GPU, applying a pending MIG mode.
    Reset {
        #[arg(long)]
        gpu: u32,
    },
    /// Create a GPU instance and its full compute instance (`nvidia-smi mig -cgi P:S -C`).
    Create {
        #[arg(long)]
        gpu: u32,
        /// Profile name (e.g. `3g.40gb`) or unique profile id (e.g. `9`).
        #[arg(long)]
        profile: String,
        /// Placement start in memory slices (default: the first free placement).
        #[arg(long)]
        start: Option<u32>,
    },
    /// Destroy a GPU instance with its compute instances.
    Destroy {
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        gpu_instance: u32,
    },
    /// Raise a fault on a GPU, as the hardware would, or reset it: the driver sees it through
    /// NVML's event API and its probe (`--xid 79` also takes the GPU off the bus).
    Inject {
        #[arg(long)]
        gpu: u32,
        /// An XID event (e.g. 79 fallen off the bus, 48 double-bit ECC, 31 MMU fault).
        #[arg(long, group = "fault")]
        xid: Option<u64>,
        /// A double-bit ECC error event.
        #[arg(long, group = "fault")]
        ecc_dbe: bool,
        /// The GPU stops answering (NVML_ERROR_GPU_IS_LOST), without an event.
        #[arg(long, group = "fault")]
        lost: bool,
        /// A GPU reset: faults cleared, MIG instances gone, a pending MIG mode applied.
        #[arg(long, group = "fault")]
        reset: bool,
        /// The GPU instance the event hit (a MIG device), with --xid or --ecc-dbe.
        #[arg(long)]
        gpu_instance: Option<u32>,
        /// The compute instance the event hit, with --gpu-instance.
        #[arg(long, requires = "gpu_instance")]
        compute_instance: Option<u32>,
    },
    /// Start (or, with --end, end) a simulated compute process on a GPU or one of its MIG
    /// devices: NVML then reports its memory and the GPU's utilization (the driver's per-claim
    /// use metrics read them).
    Process {
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        pid: u32,
        /// The GPU instance (MIG device) it runs on; required in MIG mode.
        #[arg(long)]
        gpu_instance: Option<u32>,
        #[arg(long, requires = "gpu_instance", default_value_t = 0)]
        compute_instance: u32,
        /// Device memory it uses, MiB.
        #[arg(long, default_value_t = 0)]
        memory_mib: u64,
        /// Percent of the GPU's time it keeps a kernel running.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
        sm_percent: u32,
        /// End the process instead.
        #[arg(long)]
        end: bool,
    },
    /// Put the node into an NVLink clique, or change its fabric registration state, as the
    /// fabric manager would (Grace Blackwell models; others have no fabric).
    Fabric {
        /// The NVLink domain's cluster UUID (one per rack).
        #[arg(long)]
        cluster_uuid: String,
        #[arg(long)]
        clique_id: u32,
        /// not-supported, not-started, in-progress or completed.
        #[arg(long, default_value = "completed", value_parser = parse_fabric_state)]
        state: crate::gpu::model::FabricState,
    },
    /// Write a driver root holding the simulated driver's files (an R580 set of libraries named
    /// for its version, minimal ELF files with their SONAMEs, their links and ld cache, binaries,
    /// GSP firmware, ICD files), for
    /// `gpu-dra run --nvidia-driver-root DIR` on simulated GPUs.
    DriverRoot { dir: PathBuf },
    /// Bind a GPU's PCI function to another kernel driver, as `driver_override` + `unbind` +
    /// `drivers_probe` in sysfs do: `vfio-pci` (for a virtual machine; NVML no longer sees the
    /// GPU; refused while MIG devices or an MPS daemon use it) or back to `nvidia` (initialized as
    /// by a reset). A binding made this way is gone at the next boot.
    Bind {
        #[arg(long)]
        gpu: u32,
        /// `vfio-pci` or `nvidia`.
        #[arg(long, value_parser = parse_driver)]
        driver: PciDriver,
        /// Also lay out the simulated sysfs here, as `sysfs` does.
        #[arg(long)]
        sysfs: Option<PathBuf>,
    },
    /// Hold a GPU's device file open, as DCGM, a monitoring agent or a debugger does, until this
    /// process is killed: the simulated kernel's unbind from `nvidia` waits for it.
    Hold {
        #[arg(long)]
        gpu: u32,
        /// The name the holder is listed under.
        #[arg(long, default_value = "sim-hold")]
        name: String,
    },
    /// Turn a GPU's persistence mode on or off (as `nvidia-smi -pm` or nvidia-persistenced): the
    /// kernel module then keeps the GPU open.
    Persistence {
        #[arg(long)]
        gpu: u32,
        #[arg(long, action = clap::ArgAction::Set)]
        enabled: bool,
    },
    /// Stall a GPU's MIG calls (GPU instance create and destroy hang until it is let go), as
    /// NVML calls on a sick GPU do; `--enabled false` lets them finish.
    Stall {
        #[arg(long)]
        gpu: u32,
        #[arg(long, action = clap::ArgAction::Set)]
        enabled: bool,
    },
    /// Write what the kernel shows of the simulated GPUs in sysfs under a folder (`bus/pci`
    /// devices and drivers, IOMMU groups, each function's `driver` link and `driver_override`),
    /// for `gpu-dra run --sysfs-root DIR`.
    Sysfs { dir: PathBuf },
}

fn parse_driver(s: &str) -> Result<PciDriver, String> {
    s.parse()
}

fn parse_spec(s: &str) -> Result<SimSpec, String> {
    s.parse().map_err(|e: GpuError| e.to_string())
}

pub fn run(args: SimArgs) -> Result<ExitCode, CliError> {
    let node = SimNode::new(args.gpus, &args.node_name, Some(args.sim_state));
    match args.command {
        SimCommand::Show => {
            let state = node.state()?;
            println!(
                "{}",
                serde_json::to_string_pretty(&state)
                    .map_err(|e| CliError::Encode(e.to_string()))?
            );
        }
        SimCommand::MigMode { gpu, enabled } => {
            let mode = node.set_mig_mode(gpu, enabled)?;
            println!(
                "GPU {gpu}: MIG mode current={} pending={}",
                mode.current, mode.pending
            );
        }
        SimCommand::Reset { gpu } => node.reset_gpu(gpu)?,
        SimCommand::Hold { gpu, name } => {
            let holder = crate::gpu::sim::SimHolder::this_process(&name);
            let held = node.hold(&std::collections::BTreeSet::from([gpu]), &holder)?;
            if held.is_empty() {
                return Err(CliError::Usage(format!(
                    "--gpu {gpu}: no such GPU on nvidia to hold"
                )));
            }
            println!("pid {} holds GPU {gpu} open until killed", holder.pid);
            std::io::Write::flush(&mut std::io::stdout())
                .map_err(|e| CliError::Encode(e.to_string()))?;
            // Its files close when the process ends, as a killed process's do.
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        SimCommand::Persistence { gpu, enabled } => node.set_persistence(gpu, enabled)?,
        SimCommand::Stall { gpu, enabled } => node.set_stalled(gpu, enabled)?,
        SimCommand::Fabric {
            cluster_uuid,
            clique_id,
            state,
        } => node.set_fabric(crate::gpu::model::FabricInfo {
            cluster_uuid,
            clique_id,
            state,
        })?,
        SimCommand::Process {
            gpu,
            pid,
            gpu_instance,
            compute_instance,
            memory_mib,
            sm_percent,
            end,
        } => {
            let process = (!end).then(|| crate::gpu::sim::SimProcess {
                usage: crate::gpu::usage::ProcessUsage {
                    pid,
                    memory_used_bytes: Some(memory_mib << 20),
                    gpu_instance_id: gpu_instance,
                    compute_instance_id: gpu_instance.map(|_| compute_instance),
                },
                sm_percent,
            });
            node.set_process(gpu, pid, process)?;
        }
        SimCommand::Inject {
            gpu,
            xid,
            ecc_dbe,
            lost,
            reset,
            gpu_instance,
            compute_instance,
        } => {
            let fault = match (xid, ecc_dbe, lost, reset) {
                (Some(code), ..) => SimFault::Xid {
                    code,
                    gpu_instance_id: gpu_instance,
                    compute_instance_id: compute_instance,
                },
                (None, true, ..) => SimFault::EccDoubleBit {
                    gpu_instance_id: gpu_instance,
                },
                (None, false, true, _) => SimFault::Lost,
                (None, false, false, true) => SimFault::Reset,
                (None, false, false, false) => {
                    return Err(CliError::Usage(
                        "sim inject: give one of --xid N, --ecc-dbe, --lost, --reset".into(),
                    ));
                }
            };
            if gpu_instance.is_some() && matches!(fault, SimFault::Lost | SimFault::Reset) {
                return Err(CliError::Usage(
                    "sim inject: --gpu-instance goes with --xid or --ecc-dbe (a loss or reset is the whole GPU's)".into(),
                ));
            }
            node.inject(gpu, fault)?;
            println!("GPU {gpu}: {fault:?}");
        }
        SimCommand::Bind { gpu, driver, sysfs } => {
            node.bind_driver(gpu, driver)?;
            if let Some(dir) = sysfs {
                node.write_sysfs(&dir)?;
            }
            // Its VFIO driver may be a variant (nvgrace_gpu_vfio_pci): as the kernel shows it.
            let bound = node
                .inventory()?
                .pci
                .gpus
                .get(gpu as usize)
                .and_then(|f| f.driver.clone())
                .unwrap_or_else(|| driver.sysfs_name().to_string());
            println!("GPU {gpu}: bound to {bound}");
        }
        SimCommand::Sysfs { dir } => {
            node.write_sysfs(&dir)?;
            println!(
                "{}: sysfs of {} GPUs",
                dir.display(),
                node.spec().gpu_count()
            );
        }
        SimCommand::DriverRoot { dir } => {
            let version = crate::gpu::catalog::SIM_DRIVER_VERSION;
            crate::prepare::driver_files::write_fake_driver_root(&dir, version)
                .map_err(|e| CliError::Usage(format!("driver-root {}: {e}", dir.display())))?;
            println!("{}: driver {version}", dir.display());
        }
        SimCommand::Create {
            gpu,
            profile,
            start,
        } => {
            let inventory = node.inventory()?;
            let mig = inventory
                .gpus
                .iter()
                .find(|g| g.minor == gpu)
                .and_then(|g| g.mig.as_ref())
                .ok_or_else(|| CliError::Usage(format!("--gpu {gpu}: no such MIG-capable GPU")))?;
            let chosen = mig
                .profiles
                .iter()
                .find(|p| p.name == profile || p.id.to_string() == profile)
                .ok_or_else(|| {
                    let known: Vec<_> = mig
                        .profiles
                        .iter()
                        .map(|p| format!("{} ({})", p.name, p.id))
                        .collect();
                    CliError::Usage(format!(
                        "--profile {profile:?}: not offered by GPU {gpu}; known: {}",
                        known.join(", ")
                    ))
                })?;
            let occupied: Vec<Placement> = mig.instances.iter().map(|i| i.placement).collect();
            let placement = match start {
                Some(start) => Placement {
                    start,
                    size: chosen.placements.first().map_or(1, |p| p.size),
                },
                None => *chosen
                    .placements
                    .iter()
                    .find(|p| !occupied.iter().any(|o| o.overlaps(p)))
                    .ok_or_else(|| {
                        CliError::Usage(format!(
                            "--profile {profile}: no free placement on GPU {gpu}"
                        ))
                    })?,
            };
            let gi = node.create_gpu_instance(gpu, chosen.id, placement)?;
            let (ci, uuid) = node.create_compute_instance(gpu, gi)?;
            println!(
                "GPU {gpu}: created {} at {}:{} (GI {gi}, CI {ci}) {uuid}",
                chosen.name, placement.start, placement.size
            );
        }
        SimCommand::Destroy { gpu, gpu_instance } => {
            let state = node.state()?;
            let cis: Vec<u32> = state
                .gpus
                .iter()
                .filter(|g| g.minor == gpu)
                .flat_map(|g| g.gpu_instances.iter().filter(|gi| gi.id == gpu_instance))
                .flat_map(|gi| gi.compute_instances.iter().map(|ci| ci.id))
                .collect();
            for ci in cis {
                node.destroy_compute_instance(gpu, gpu_instance, ci)?;
            }
            node.destroy_gpu_instance(gpu, gpu_instance)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_fabric_state(raw: &str) -> Result<crate::gpu::model::FabricState, String> {
    serde_json::from_value(serde_json::Value::String(raw.to_string())).map_err(|_| {
        format!(
            "{raw:?} is not a fabric state (not-supported, not-started, in-progress, completed)"
        )
    })
}
