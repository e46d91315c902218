//! Command-line interface: one submodule per subcommand.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod cel;
pub mod sim;
pub mod slices;

/// gpu-dra: Kubernetes DRA driver for NVIDIA GPUs.
#[derive(Debug, Parser)]
#[command(name = "gpu-dra", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the ResourceSlices this node would publish, as a v1 List.
    Slices(slices::SlicesArgs),
    /// Operate simulated GPU hardware (MIG mode, instances) in a state file.
    Sim(sim::SimArgs),
    /// Evaluate DRA CEL selectors exactly as Kubernetes does.
    #[command(subcommand)]
    Cel(cel::CelCommand),
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
    #[error("encoding output: {0}")]
    Encode(String),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Slices(args) => slices::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Cel(cmd) => cel::run(cmd),
    }
}
