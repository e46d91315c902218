//! Compiles and evaluates selector cases given as JSON lines on stdin, one answer line each:
//! how Kubernetes' own CEL test table (`e2e/upstream-tables.sh cel`) runs against this crate.
//!
//! ```text
//! echo '{"expression": "device.driver == \"d\"", "driver": "d", "device": {"name": "x"}}' \
//!     | cargo run -p dra-cel --example cel_case
//! ```
//!
//! A case: `expression`, `driver`, `device` (a resource.k8s.io/v1 Device: attributes, capacity,
//! allowMultipleAllocations), `consumableCapacity` (the DRAConsumableCapacity gate, default on)
//! and `listTypeAttributes` (the DRAListTypeAttributes gate, for the cost estimate). The answer: `compileError` (the selector does not compile), else `cost` (the
//! API server's estimate) and `match` or `matchError` (evaluation on the device).
use std::io::{BufRead, Write};
use std::process::ExitCode;

use dra_cel::{CelError, CostFeatures, DeviceView};
use k8s_openapi::api::resource::v1::Device;
use serde_json::{Value, json};

fn main() -> ExitCode {
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for (n, line) in stdin.lock().lines().enumerate() {
        let answer = match line {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => answer(&line)
                .unwrap_or_else(|e| json!({ "badInput": format!("line {}: {e}", n + 1) })),
            Err(e) => {
                eprintln!("cel_case: stdin: {e}");
                return ExitCode::from(2);
            }
        };
        if writeln!(stdout, "{answer}")
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

fn answer(line: &str) -> Result<Value, String> {
    let case: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let expression = case["expression"].as_str().ok_or("expression: missing")?;
    let driver = case["driver"].as_str().unwrap_or_default();
    let device: Device =
        serde_json::from_value(case["device"].clone()).map_err(|e| format!("device: {e}"))?;
    let features = CostFeatures {
        list_type_attributes: case["listTypeAttributes"].as_bool().unwrap_or(false),
        consumable_capacity: case["consumableCapacity"].as_bool().unwrap_or(true),
    };
    let environment = dra_cel::Features {
        consumable_capacity: case["consumableCapacity"].as_bool().unwrap_or(true),
    };
    let selector = match dra_cel::compile_with(expression, environment) {
        Ok(selector) => selector,
        Err(e) => return Ok(json!({ "compileError": e.message() })),
    };
    let cost = match dra_cel::estimate_cost_with(expression, features) {
        Ok(cost) => cost,
        Err(e) => return Ok(json!({ "compileError": e.message() })),
    };
    let view = DeviceView::new(driver, &device).map_err(|e| format!("device: {e}"))?;
    Ok(match selector.evaluate(&view) {
        Ok(matched) => json!({ "cost": cost, "match": matched }),
        Err(CelError::Runtime(m) | CelError::Compile(m)) => {
            json!({ "cost": cost, "matchError": m })
        }
    })
}
