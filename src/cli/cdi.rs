//! `gpu-dra cdi`: the CDI spec a claim holding some of this node's devices would get, with the
//! driver's files from a driver root; what an admin checks first when a container has no
//! `libcuda` (as `nvidia-ctk cdi generate` does for NVIDIA's toolkit).
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::CliError;
use super::slices::{GpuArgs, OutputFormat, write_document};
use crate::gpu::mig::{gpu_device_name, mig_device_name, parse_mig_device_name};
use crate::gpu::{self, NodeInventory};
use crate::prepare::cdi::{CdiDevice, CdiStore};
use crate::prepare::driver_files::{DriverRoot, FirmwareSearch};

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  gpu-dra cdi --gpus sim:2xH100-SXM5-80GB --nvidia-driver-root /run/nvidia/driver --device gpu-1"
)]
pub struct CdiArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Node name (simulated GPU UUIDs derive from it).
    #[arg(long, env = "NODE_NAME", default_value = "node")]
    pub node_name: String,
    /// Devices the claim holds (`gpu-0`, or an existing MIG device); default: every whole GPU.
    #[arg(long = "device")]
    pub devices: Vec<String>,
    /// The NVIDIA driver's root, whose files the containers get.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", default_value = "/")]
    pub nvidia_driver_root: PathBuf,
    /// The toolkit's hook on the host (default: searched under the driver root).
    #[arg(long, env = "NVIDIA_CDI_HOOK_PATH")]
    pub nvidia_cdi_hook_path: Option<PathBuf>,
    /// Where the host's `/dev` is, when not at `/`.
    #[arg(long)]
    pub dev_root: Option<PathBuf>,
    /// DRA driver name (the CDI vendor is `k8s.<name>`).
    #[arg(long, default_value = crate::slices::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    #[arg(short = 'o', long, value_enum, default_value = "json")]
    pub output: OutputFormat,
}

pub fn run(args: CdiArgs) -> Result<ExitCode, CliError> {
    let inventory = gpu::discover(&args.gpu.discovery(&args.node_name))?;
    let names = if args.devices.is_empty() {
        inventory
            .gpus
            .iter()
            .map(|g| gpu_device_name(g.minor))
            .collect()
    } else {
        args.devices.clone()
    };
    let devices = names
        .iter()
        .map(|name| resolve(&inventory, name))
        .collect::<Result<Vec<_>, _>>()?;
    let root = DriverRoot {
        here: args.nvidia_driver_root.clone(),
        host: args.nvidia_driver_root.clone(),
        hook: args.nvidia_cdi_hook_path.clone(),
        firmware: FirmwareSearch::from_host(&args.gpu.sysfs_root),
    };
    let files = root
        .discover(&inventory.driver_version)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let store = CdiStore::new(Path::new("/var/run/cdi"), &args.driver_name)
        .with_dev_root(args.dev_root.as_deref())
        .with_driver_files(Some(std::sync::Arc::new(files)));
    let spec = store.spec(
        "example-claim-uid",
        &devices,
        &crate::prepare::cdi::ContainerEdits::default(),
    );
    let value = serde_json::to_value(&spec).map_err(|e| CliError::Encode(e.to_string()))?;
    write_document(&value, args.output)?;
    Ok(ExitCode::SUCCESS)
}

/// A whole GPU or an existing MIG device of the node, by its published name.
fn resolve(inventory: &NodeInventory, name: &str) -> Result<CdiDevice, CliError> {
    let bad = |reason: &str| CliError::Usage(format!("--device {name}: {reason}"));
    if let Some(gpu) = inventory
        .gpus
        .iter()
        .find(|g| gpu_device_name(g.minor) == name)
    {
        return Ok(CdiDevice::Gpu {
            name: name.to_string(),
            minor: gpu.minor,
            uuid: gpu.uuid.clone(),
        });
    }
    let parsed = parse_mig_device_name(name).ok_or_else(|| bad("no such device on this node"))?;
    let gpu = inventory
        .gpus
        .iter()
        .find(|g| g.minor == parsed.parent_minor)
        .ok_or_else(|| bad("no such GPU"))?;
    let mig = gpu
        .mig
        .as_ref()
        .ok_or_else(|| bad("its GPU is not MIG-capable"))?;
    let instance = mig
        .instances
        .iter()
        .find(|i| {
            i.profile_id == parsed.profile_id
                && i.placement.start == parsed.start
                && mig
                    .profile_by_id(i.profile_id)
                    .is_some_and(|p| mig_device_name(gpu.minor, &p.name, p.id, parsed.start) == name)
        })
        .ok_or_else(|| {
            bad("no such MIG device exists (a placement is carved at prepare; its spec then names the new instance)")
        })?;
    Ok(CdiDevice::Mig {
        name: name.to_string(),
        parent_minor: gpu.minor,
        gpu_instance_id: instance.gpu_instance_id,
        compute_instance_id: instance.compute_instance_id,
        uuid: instance.uuid.clone(),
    })
}
