//! Prints the cost kube-apiserver would estimate for each selector, one per line of a file (or
//! of stdin): a tool for chasing a cost mismatch with the Go oracle.
//!
//! ```text
//! cargo run -p dra-cel --example cost_probe -- selectors.txt
//! ```
use std::io::Read;

fn main() -> std::process::ExitCode {
    let mut text = String::new();
    let read = match std::env::args().nth(1) {
        Some(path) => std::fs::read_to_string(&path)
            .map(|t| text = t)
            .map_err(|e| format!("{path}: {e}")),
        None => std::io::stdin()
            .read_to_string(&mut text)
            .map(|_| ())
            .map_err(|e| format!("stdin: {e}")),
    };
    if let Err(e) = read {
        eprintln!("cost_probe: {e}");
        return std::process::ExitCode::FAILURE;
    }
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match dra_cel::estimate_cost(line) {
            Ok(cost) => println!("{cost}\t{line}"),
            Err(e) => println!("error: {e}\t{line}"),
        }
    }
    std::process::ExitCode::SUCCESS
}
