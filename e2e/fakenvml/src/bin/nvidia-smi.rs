//! A fake `nvidia-smi` for tests, for what the driver asks of it: `nvidia-smi compute-policy -i
//! <GPU UUID> --set-timeslice <0-3>`, applied to the simulated GPUs (`GPU_DRA_SIM_STATE` or
//! `FAKE_NVML_STATE` names their state file) with the simulator's rules (refused in MIG mode,
//! outside 0-3, for an unknown GPU); and for what workloads ask of it: `nvidia-smi -L`, the GPUs
//! (and MIG devices) NVML lists, read through `libnvidia-ml.so.1` as the real one does, so in a
//! container it lists what the claim's CDI spec gave it (the fake library's container mode).
//! Anything else is refused. Linked, like the fake `nvidia-cuda-mps-control`, to the fake driver
//! root's own loader: it runs chrooted there, or in a container whose image carries that loader
//! (e2e/images/build.sh's cuda-standin, as CUDA's images carry their C library).
use std::path::PathBuf;
use std::process::ExitCode;

use gpu_dra::gpu::SharingSettings;
use gpu_dra::gpu::sim::{SimNode, SimState};
use nvml_wrapper::Nvml;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["compute-policy", "-i", uuid, "--set-timeslice", value] => set_timeslice(uuid, value),
        ["-L"] | ["--list-gpus"] => list_gpus(),
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

/// `nvidia-smi -L`: one line per GPU NVML enumerates, its MIG devices indented below it, in the
/// real tool's format; its messages and exit codes when NVML cannot start or sees no GPU.
fn list_gpus() -> ExitCode {
    let nvml = match Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
    {
        Ok(nvml) => nvml,
        Err(nvml_wrapper::error::NvmlError::NotFound) => {
            eprintln!("No devices were found");
            return ExitCode::from(6);
        }
        Err(e) => {
            eprintln!(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver ({e})."
            );
            return ExitCode::from(9);
        }
    };
    let count = match nvml.device_count() {
        Ok(0) => {
            eprintln!("No devices were found");
            return ExitCode::from(6);
        }
        Ok(count) => count,
        Err(e) => {
            eprintln!("Unable to count the GPUs: {e}");
            return ExitCode::from(255);
        }
    };
    for index in 0..count {
        let gpu = match nvml.device_by_index(index) {
            Ok(gpu) => gpu,
            Err(e) => {
                eprintln!("Unable to determine the device handle for GPU{index}: {e}");
                return ExitCode::from(255);
            }
        };
        let name = gpu.name().unwrap_or_else(|_| "Unknown Error".into());
        let uuid = gpu.uuid().unwrap_or_else(|_| "Unknown Error".into());
        println!("GPU {index}: {name} (UUID: {uuid})");
        if !gpu.mig_mode().is_ok_and(|mode| mode.current == 1) {
            continue;
        }
        for slot in 0..gpu.mig_device_count().unwrap_or(0) {
            let Ok(mig) = gpu.mig_device_by_index(slot) else {
                continue;
            };
            let mig_name = mig.name().unwrap_or_default();
            let profile = mig_name.rsplit(" MIG ").next().unwrap_or(&mig_name);
            let mig_uuid = mig.uuid().unwrap_or_else(|_| "Unknown Error".into());
            println!("  MIG {profile:<13}Device {slot:>2}: (UUID: {mig_uuid})");
        }
    }
    ExitCode::SUCCESS
}
