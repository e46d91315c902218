//! A fake `nvidia-smi` for tests, for what the driver asks of it: `nvidia-smi compute-policy -i
//! <GPU UUID> --set-timeslice <0-3>`, applied to the simulated GPUs (`GPU_DRA_SIM_STATE` or
//! `FAKE_NVML_STATE` names their state file) with the simulator's rules (refused in MIG mode,
//! outside 0-3, for an unknown GPU). Anything else is refused. Linked, like the fake
//! `nvidia-cuda-mps-control`, to the fake driver root's own loader: it runs only chrooted there.
use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra::gpu::SharingSettings;
use gpu_dra::gpu::sim::{SimNode, SimState};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["compute-policy", "-i", uuid, "--set-timeslice", value] => set_timeslice(uuid, value),
        _ => {
            eprintln!("nvidia-smi (fake): unsupported arguments {args:?}");
            ExitCode::from(2)
        }
    }
}

fn set_timeslice(uuid: &str, value: &str) -> ExitCode {
    let fail = |message: String| {
        eprintln!("{message}");
        ExitCode::from(1)
    };
    let Ok(timeslice) = value.parse::<u32>() else {
        return fail(format!("Invalid time-slice value {value}"));
    };
    let Some(path) = std::env::var_os("GPU_DRA_SIM_STATE")
        .or_else(|| std::env::var_os("FAKE_NVML_STATE"))
        .map(PathBuf::from)
    else {
        return fail("No devices were found (no simulated GPUs: GPU_DRA_SIM_STATE)".into());
    };
    let state: SimState = match std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
    {
        Ok(state) => state,
        Err(e) => return fail(format!("cannot read {}: {e}", path.display())),
    };
    let Ok(spec) = state.spec.parse() else {
        return fail(format!(
            "{}: unknown GPU spec {}",
            path.display(),
            state.spec
        ));
    };
    let node = SimNode::new(spec, &state.node_name, Some(path));
    let inventory = match node.inventory() {
        Ok(inventory) => inventory,
        Err(e) => return fail(e.to_string()),
    };
    let Some(gpu) = inventory.gpus.iter().find(|g| g.uuid == uuid) else {
        return fail(format!("No device with UUID {uuid}"));
    };
    let current = match node.sharing_settings(gpu.minor) {
        Ok(settings) => settings,
        Err(e) => return fail(e.to_string()),
    };
    let settings = SharingSettings {
        compute_mode: current.compute_mode,
        timeslice: Some(timeslice),
    };
    match node.set_sharing_settings(gpu.minor, settings) {
        Ok(()) => {
            println!("Set timeslice to {timeslice} for GPU {uuid}.");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e.to_string()),
    }
}
