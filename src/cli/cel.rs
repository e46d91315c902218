//! `gpu-dra cel ...`: evaluate selectors offline, exactly as kube-scheduler would.
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use dra_cel::{CelError, DeviceView, SelectorCache};
use k8s_openapi::api::resource::v1::Device;
use serde::Deserialize;
use serde_json::json;

use super::CliError;

#[derive(Debug, Subcommand)]
pub enum CelCommand {
    /// Evaluate a selector against a device (or JSON lines of them with --batch).
    Eval(EvalArgs),
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Read `{"driver","expression","device"}` JSON lines on stdin; write one
    /// `{"result": bool}` or `{"error": {"kind","message"}}` line per input.
    #[arg(long, conflicts_with_all = ["driver", "device", "expression"])]
    pub batch: bool,
    /// Driver name: the domain of unqualified attribute and capacity names.
    #[arg(long, required_unless_present = "batch")]
    pub driver: Option<String>,
    /// A resource.k8s.io/v1 Device as JSON or YAML.
    #[arg(long, required_unless_present = "batch")]
    pub device: Option<PathBuf>,
    /// The CEL selector expression.
    #[arg(required_unless_present = "batch")]
    pub expression: Option<String>,
}

#[derive(Deserialize)]
struct BatchInput {
    driver: String,
    expression: String,
    device: Device,
}

pub fn run(cmd: CelCommand) -> Result<ExitCode, CliError> {
    match cmd {
        CelCommand::Eval(args) if args.batch => run_batch(),
        CelCommand::Eval(args) => run_single(args),
    }
}

fn error_line(kind: &str, message: &str) -> serde_json::Value {
    json!({"error": {"kind": kind, "message": message}})
}

/// Evaluates one batch line; malformed input is reported as an `input` error for that line.
fn evaluate_line(cache: &SelectorCache, line: &str) -> serde_json::Value {
    let input: BatchInput = match serde_json::from_str(line) {
        Ok(i) => i,
        Err(e) => return error_line("input", &format!("malformed input line: {e}")),
    };
    let view = match DeviceView::new(&input.driver, &input.device) {
        Ok(v) => v,
        Err(e) => return error_line("input", &e.to_string()),
    };
    match dra_cel::evaluate(cache, &input.expression, &view) {
        Ok(b) => json!({"result": b}),
        Err(e) => error_line(e.kind(), e.message()),
    }
}

fn run_batch() -> Result<ExitCode, CliError> {
    let cache = SelectorCache::new();
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let result = evaluate_line(&cache, &line);
        serde_json::to_writer(&mut out, &result).map_err(|e| CliError::Encode(e.to_string()))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn run_single(args: EvalArgs) -> Result<ExitCode, CliError> {
    let (Some(driver), Some(path), Some(expression)) = (args.driver, args.device, args.expression)
    else {
        return Err(CliError::Usage(
            "--driver, --device and an expression are required".into(),
        ));
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| CliError::Usage(format!("reading {}: {e}", path.display())))?;
    let device: Device = serde_yaml_ng::from_str(&text)
        .map_err(|e| CliError::Usage(format!("parsing {} as a v1 Device: {e}", path.display())))?;
    let view = DeviceView::new(&driver, &device).map_err(|e| CliError::Usage(e.to_string()))?;
    let cache = SelectorCache::new();
    match dra_cel::evaluate(&cache, &expression, &view) {
        Ok(true) => {
            println!("true");
            Ok(ExitCode::SUCCESS)
        }
        Ok(false) => {
            println!("false");
            Ok(ExitCode::from(1))
        }
        Err(e) => {
            let label = match e {
                CelError::Compile(_) => "CEL compile error",
                CelError::Runtime(_) => "CEL runtime error",
            };
            eprintln!("{label}: {}", e.message());
            Ok(ExitCode::from(2))
        }
    }
}
