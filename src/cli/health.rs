//! `gpu-dra health`: what the driver's health watcher would see on this node, read once. It
//! registers the same NVML event set (XIDs, double-bit ECC errors), reads each GPU's liveness and
//! the recovery action the driver asks for, waits a while for faults and prints all of it. It
//! changes nothing on the GPUs: the first thing to run when a node's devices are tainted, and
//! what `e2e/gpu-check.sh` runs on a real GPU.
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::CliError;
use super::duration;
use super::slices::{GpuArgs, OutputFormat, write_document};
use crate::gpu::{self, mig::gpu_device_name};

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 when every GPU answers, is watched for faults and got \
no fault event while waiting; 1 otherwise (the output says which).\n\nExample:\n  gpu-dra \
health --gpus nvml --wait 5s"
)]
pub struct HealthArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Node name (simulated GPU UUIDs derive from it).
    #[arg(long, env = "NODE_NAME", default_value = "node")]
    pub node_name: String,
    /// How long to wait for fault events after registering.
    #[arg(long, default_value = "2s", value_parser = duration::parse)]
    pub wait: Duration,
    #[arg(short = 'o', long, value_enum, default_value = "json")]
    pub output: OutputFormat,
}

pub fn run(args: HealthArgs) -> Result<ExitCode, CliError> {
    let control = gpu::open_control(&args.gpu.discovery(&args.node_name))?;
    let inventory = control.inventory()?;
    let mut source = control.event_source()?;
    let watched = source.watched();
    let events = source.wait(args.wait)?;
    let mut healthy = true;
    let mut gpus = Vec::with_capacity(inventory.gpus.len());
    for gpu in &inventory.gpus {
        let probe = control.probe(gpu.minor)?;
        let is_watched = watched.contains(&gpu.minor);
        let faulted = events
            .iter()
            .any(|e| e.minor == gpu.minor && e.kind.is_fault());
        healthy &= is_watched && !probe.lost && !faulted;
        gpus.push(json!({
            "device": gpu_device_name(gpu.minor),
            "uuid": gpu.uuid,
            "lost": probe.lost,
            // null: the driver is older than R550 and does not report one.
            "recoveryAction": probe.recovery_action,
            "faultEvents": if is_watched { "registered" } else { "not registered" },
        }));
    }
    let report = json!({
        "driverVersion": inventory.driver_version,
        "gpus": gpus,
        "waited": format!("{:?}", args.wait),
        "events": events,
    });
    write_document(&report, args.output)?;
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
