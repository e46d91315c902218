//! `gpu-dra vfio-check` on simulated GPUs: the opt-in hardware step of `e2e/gpu-check.sh` runs
//! the claim's own VFIO effect. Here the simulator stands in for the kernel (it records any
//! unbind that finds the GPU held), so this proves the command's plumbing and its refusals, not
//! the hardware (only a run on a GPU does).
use std::process::{Command, Output};

const SPEC: &str = "sim:2xH100-SXM5-80GB";

fn gpu_dra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .output()
        .expect("run gpu-dra")
}

/// `vfio-check` of `bus` with `extra` arguments (`--unbind` confirms it unless given).
fn check(state: &str, bus: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "vfio-check",
        "--gpus",
        SPEC,
        "--sim-state",
        state,
        "--passthrough",
        "--bus-id",
        bus,
    ];
    if !extra.contains(&"--unbind") {
        args.extend(["--unbind", bus]);
    }
    args.extend_from_slice(extra);
    gpu_dra(&args)
}

/// GPU 1's PCI address as the simulator lays it out.
fn bus_of_gpu_1() -> String {
    gpu_dra::gpu::sim::sim_pci_location(1).0
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
fn a_gpu_goes_to_its_vfio_driver_and_back_and_a_held_one_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8");
    let bus = bus_of_gpu_1();

    let done = check(state, &bus, &[]);
    let report = json(&done);
    assert!(done.status.success(), "{report}");
    assert_eq!(report["toVfio"]["ok"], true, "{report}");
    assert_eq!(report["vfioCdev"], "vfio1", "{report}");
    assert_eq!(report["backToNvidia"]["ok"], true, "{report}");
    assert_eq!(report["seenByNvmlAgain"], true, "{report}");

    // Another process holds GPU 1 open: refused naming it, the GPU left on nvidia.
    let sim = [
        "sim",
        "--gpus",
        SPEC,
        "--node-name",
        "node",
        "--sim-state",
        state,
    ];
    let mut holder = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(sim)
        .args(["hold", "--gpu", "1", "--name", "nv-hostengine"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("holder");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("holder's line");
    let refused = check(state, &bus, &["--release-wait", "1s"]);
    holder.kill().expect("kill");
    holder.wait().expect("wait");
    let report = json(&refused);
    assert_eq!(refused.status.code(), Some(1), "{report}");
    let error = report["toVfio"]["error"].as_str().expect("error");
    assert!(
        error.contains(&format!("pid {} (nv-hostengine)", holder.id())),
        "{error}"
    );
    assert_eq!(report["seenByNvmlAgain"], true, "{report}");
    let shown = gpu_dra(&[&sim[..], &["show"]].concat());
    let hw: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("state");
    assert_eq!(
        hw["stuck_unbinds"],
        serde_json::Value::Null,
        "no unbind found the GPU held: {hw}"
    );

    // Bad input changes nothing: a confirmation that is not the same address.
    let unconfirmed = check(state, &bus, &["--unbind", "0000:00:00.0"]);
    assert_eq!(unconfirmed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("--unbind"));
}
