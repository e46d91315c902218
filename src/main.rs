use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = gpu_dra::cli::Cli::parse();
    gpu_dra::cli::init_logging(cli.log_format, cli.verbosity, cli.narrates());
    match gpu_dra::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            ExitCode::from(2)
        }
    }
}
