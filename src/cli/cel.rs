//! `gpu-dra cel ...`: evaluate selectors offline.
use std::process::ExitCode;

use clap::Subcommand;

use super::CliError;

#[derive(Debug, Subcommand)]
pub enum CelCommand {
    /// Evaluate selectors (not implemented yet).
    Eval,
}

pub fn run(_cmd: CelCommand) -> Result<ExitCode, CliError> {
    Err(CliError::Usage("cel eval is not implemented yet".into()))
}
