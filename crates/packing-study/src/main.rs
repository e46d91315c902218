//! `gpu-dra-packing-study`: MIG packing research on simulated nodes, apart from the driver.
//!
//! It replays random MIG workloads through our copy of kube-scheduler's allocator and compares
//! the driver's device order (`gpu_dra::slices::packing`) with name order and with the limits:
//! no fragmentation, the hindsight optimum, the exact best order where it can be solved and
//! proven floors elsewhere. Results are written up in docs/benchmarks.md ("MIG packing").
use std::process::ExitCode;

use clap::Parser;

mod hindsight;
mod online;
mod packing_study;
mod repack;

/// Replay a random MIG workload: failed placements with our device order vs name order.
#[derive(Debug, Parser)]
#[command(name = "gpu-dra-packing-study", version)]
struct Cli {
    /// Log format on stderr (level from RUST_LOG, default `info`).
    #[arg(long, env = "GPU_DRA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: gpu_dra::cli::LogFormat,
    /// Log verbosity as Kubernetes components take it (`-v 4`, `--v=4`): 0-1 info, 2-4 debug,
    /// 5+ trace, for gpu-dra's own logs. RUST_LOG, when set, wins.
    #[arg(short = 'v', long = "v", env = "GPU_DRA_V", value_name = "LEVEL")]
    verbosity: Option<u8>,
    #[command(flatten)]
    study: packing_study::PackingStudyArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The study narrates nothing through `tracing`: its logs stay at the level `-v` asks for.
    gpu_dra::cli::init_logging(cli.log_format, cli.verbosity, false);
    match packing_study::run(cli.study) {
        Ok(code) => code,
        // As `gpu-dra` reports its commands' errors: with their causes, exit status 2.
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            ExitCode::from(2)
        }
    }
}

/// The inventory of a simulated node without state, for tests.
#[cfg(test)]
fn test_inventory(spec: &str) -> gpu_dra::gpu::NodeInventory {
    gpu_dra::gpu::sim::SimNode::new(spec.parse().expect("sim spec"), "n", None)
        .inventory()
        .expect("inventory")
}
