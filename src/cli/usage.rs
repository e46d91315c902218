//! `gpu-dra usage`: each GPU's use as the driver's per-claim metrics read it, once: NVML's
//! device memory in use, utilization, and the compute processes with their memory and the MIG
//! device each runs on. It changes nothing; on a real GPU it shows what `/metrics` would say.
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use super::CliError;
use super::slices::{GpuArgs, OutputFormat, write_document};
use crate::gpu::{self, mig::gpu_device_name};

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 when every GPU's use could be read; 1 otherwise (the output \
says which).\n\nExample:\n  gpu-dra usage --gpus nvml"
)]
pub struct UsageArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Node name (simulated GPU UUIDs derive from it).
    #[arg(long, env = "NODE_NAME", default_value = "node")]
    pub node_name: String,
    #[arg(short = 'o', long, value_enum, default_value = "json")]
    pub output: OutputFormat,
}

pub fn run(args: UsageArgs) -> Result<ExitCode, CliError> {
    let control = gpu::open_control(&args.gpu.discovery(&args.node_name))?;
    let inventory = control.inventory()?;
    let mut all_read = true;
    let mut gpus = Vec::with_capacity(inventory.gpus.len());
    for gpu in &inventory.gpus {
        let device = gpu_device_name(gpu.minor);
        match control.usage(gpu.minor) {
            Ok(usage) => {
                let processes: Vec<_> = usage
                    .processes
                    .iter()
                    .map(|p| {
                        json!({
                            "pid": p.pid,
                            "memoryUsedBytes": p.memory_used_bytes,
                            "gpuInstanceId": p.gpu_instance_id,
                            "computeInstanceId": p.compute_instance_id,
                        })
                    })
                    .collect();
                gpus.push(json!({
                    "device": device,
                    "uuid": gpu.uuid,
                    "memoryUsedBytes": usage.memory_used_bytes,
                    // null: NVML does not say (a GPU in MIG mode).
                    "utilizationPercent": usage.utilization_percent,
                    "processes": processes,
                }));
            }
            Err(error) => {
                all_read = false;
                gpus.push(json!({"device": device, "uuid": gpu.uuid, "error": error.to_string()}));
            }
        }
    }
    write_document(&json!({ "gpus": gpus }), args.output)?;
    Ok(if all_read {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
