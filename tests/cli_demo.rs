//! `gpu-dra demo`, `cdi`, `sim inject` and `run`'s start-up refusals as a newcomer meets them (the
//! packing study's runs: `crates/packing-study/tests/study.rs`).
use std::process::Command;

fn gpu_dra(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `gpu-dra run` on `extra` with its node folders under `dir`, a simulator state there and a
/// kubeconfig that does not exist: for start-up refusals. Returns success and stderr.
fn run_node(dir: &std::path::Path, extra: &[&str], env: Option<(&str, &str)>) -> (bool, String) {
    let at = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-dra"));
    command.arg("run").args(extra).args([
        "--node-name",
        "n1",
        "--sim-state",
        &at("hw.json"),
        "--registrar-dir",
        &at("registry"),
        "--plugin-dir",
        &at("plugin"),
        "--cdi-root",
        &at("cdi"),
        "--state-dir",
        &at("state"),
        "--kubeconfig",
        &at("no-kubeconfig"),
    ]);
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    let out = command.output().expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_allocates_prepares_and_leaves_nothing() {
    let (ok, out, err) = gpu_dra(&["demo"]);
    assert!(ok, "demo failed: {err}\n{out}");
    assert!(
        out.contains("big-gpu            → gpu-0"),
        "the 40Gi claim gets an H100, never the T4:\n{out}"
    );
    assert!(
        out.contains("mig-3g             → gpu-1-mig-3g40gb-9-4"),
        "{out}"
    );
    assert!(out.contains("PrepareCompleted"), "{out}");
    assert!(
        out.contains("/dev/nvidia-caps/nvidia-cap"),
        "the MIG spec has capability nodes:\n{out}"
    );
    assert!(
        out.contains(r#""containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05""#)
            && out.contains(r#""containerPath": "/usr/bin/nvidia-debugdump""#)
            && out.contains(r#""update-ldcache""#)
            && out.contains(r#""create-symlinks""#),
        "the spec mounts the driver's libraries and binaries and calls the toolkit's hook:\n{out}"
    );
    assert!(
        out.contains("CDI specs left: 0 · MIG instances left: 0 · claims in checkpoint: 0"),
        "{out}"
    );
    // The narrative alone: the driver's own log lines only with `-v`, and no shipped example
    // asks for something that does nothing (a time-sliced MIG device warned twice).
    assert!(
        !err.contains(" INFO ") && !err.contains(" WARN "),
        "the demo interleaves the driver's logs without -v:\n{err}"
    );
    assert!(
        !out.contains("TimeSlicingNotApplied") && !err.contains("TimeSlicingNotApplied"),
        "a shipped example draws a warning:\n{out}\n{err}"
    );
}

#[test]
fn demo_shows_the_drivers_logs_with_v() {
    let (ok, out, err) = gpu_dra(&["-v", "1", "demo"]);
    assert!(ok, "demo failed: {err}\n{out}");
    assert!(
        err.contains(" INFO "),
        "-v 1 shows the driver's info lines:\n{err}"
    );
}

#[test]
fn demo_keeps_its_files_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, _, err) = gpu_dra(&[
        "demo",
        "--gpus",
        "sim:1xA100-SXM4-40GB,1xH100-SXM5-80GB",
        "--work-dir",
        dir.path().to_str().expect("utf-8"),
    ]);
    assert!(ok, "{err}");
    assert!(dir.path().join("state/checkpoint.json").exists());
    assert!(dir.path().join("hardware.json").exists());
}

#[test]
fn cdi_prints_what_a_claims_containers_get_and_names_an_empty_driver_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("driver-root");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8");
    let root_arg = root.to_str().expect("utf-8");
    let sim = ["--gpus", "sim:1xH100-SXM5-80GB,1xT4", "--sim-state", state];

    // An empty driver root: refused, naming it.
    let mut args = vec!["cdi"];
    args.extend(sim);
    args.extend(["--nvidia-driver-root", root_arg]);
    let (ok, _, err) = gpu_dra(&args);
    assert!(
        !ok && err.contains(root_arg) && err.contains("no libraries of driver"),
        "{err}"
    );

    let (ok, _, err) = gpu_dra(&[
        "sim",
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xT4",
        "--node-name",
        "node",
        "--sim-state",
        state,
        "driver-root",
        root_arg,
    ]);
    assert!(ok, "{err}");
    args.extend(["--device", "gpu-1"]);
    let (ok, out, err) = gpu_dra(&args);
    assert!(ok, "{err}");
    let spec: serde_json::Value = serde_json::from_str(&out).expect("JSON spec");
    assert_eq!(spec["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
        "/dev/nvidia1"
    );
    let mounts: Vec<&str> = spec["containerEdits"]["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    assert!(
        mounts.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.1")
            && mounts.contains(&"/usr/bin/nvidia-debugdump"),
        "{mounts:?}"
    );
    // A MIG placement that is not carved has no spec yet.
    let (ok, _, err) = gpu_dra(&[
        "cdi",
        "--gpus",
        "sim:1xH100-SXM5-80GB,1xT4",
        "--sim-state",
        state,
        "--nvidia-driver-root",
        root_arg,
        "--device",
        "gpu-0-mig-1g10gb-19-0",
    ]);
    assert!(
        !ok && err.contains("--device gpu-0-mig-1g10gb-19-0"),
        "{err}"
    );
}

#[test]
fn the_driver_does_not_start_on_a_driver_root_without_the_driver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let root = at("empty-root");
    std::fs::create_dir_all(&root).expect("root");
    let (ok, err) = run_node(
        dir.path(),
        &["--gpus", "sim:1xT4", "--nvidia-driver-root", &root],
        None,
    );
    assert!(
        !ok && err.contains(&format!(
            "--nvidia-driver-root {root}: no libraries of driver"
        )),
        "{err}"
    );
    assert!(
        !dir.path().join("cdi").exists(),
        "nothing was written before refusing"
    );
}

#[test]
fn a_hook_path_without_driver_files_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, err) = run_node(
        dir.path(),
        &[
            "--gpus",
            "sim:1xT4",
            "--nvidia-cdi-hook-path",
            "/usr/bin/nvidia-cdi-hook",
        ],
        None,
    );
    assert!(!ok && err.contains("--nvidia-cdi-hook-path"), "{err}");
}

#[test]
fn the_clique_label_without_compute_domains_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = ["--gpus", "sim:1xGB200-186GB"];
    // As a flag, and as NVIDIA's variable.
    let flag = run_node(
        dir.path(),
        &[&gpus[..], &["--gpu-clique-label"]].concat(),
        None,
    );
    let variable = run_node(
        dir.path(),
        &gpus,
        Some(("GPU_CLIQUE_LABEL_ENABLED", "true")),
    );
    for (ok, err) in [flag, variable] {
        assert!(
            !ok && err.contains("--gpu-clique-label") && err.contains("--compute-domains"),
            "{err}"
        );
    }
    assert!(
        !dir.path().join("state").exists() && !dir.path().join("cdi").exists(),
        "nothing was written before refusing"
    );
}

#[test]
fn sim_inject_raises_faults_and_refuses_unclear_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8");
    let sim = |args: &[&str]| {
        let mut all = vec!["sim", "--gpus", "sim:2xH100-SXM5-80GB", "--node-name", "n1"];
        all.extend_from_slice(&["--sim-state", state, "inject"]);
        all.extend_from_slice(args);
        gpu_dra(&all)
    };
    let (ok, _, err) = sim(&["--gpu", "1", "--xid", "79"]);
    assert!(ok, "{err}");
    let shown: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("json");
    assert_eq!(shown["gpus"][1]["lost"], true, "XID 79: off the bus");
    assert_eq!(shown["events"][0]["event"]["kind"]["code"], 79);

    let (ok, _, err) = sim(&["--gpu", "0"]);
    assert!(
        !ok && err.contains("--xid N, --ecc-dbe, --lost, --reset"),
        "{err}"
    );
    let (ok, _, err) = sim(&["--gpu", "0", "--xid", "79", "--lost"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, _, err) = sim(&["--gpu", "0", "--reset", "--gpu-instance", "3"]);
    assert!(
        !ok && err.contains("--gpu-instance goes with --xid or --ecc-dbe"),
        "{err}"
    );
    let (ok, _, err) = sim(&["--gpu", "7", "--lost"]);
    assert!(!ok && err.contains("no such GPU"), "{err}");
    let unchanged: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("json");
    assert_eq!(unchanged, shown, "refused input changes nothing");

    let (ok, _, err) = sim(&["--gpu", "1", "--reset"]);
    assert!(ok, "{err}");
    let reset: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state).expect("state")).expect("json");
    assert!(reset["gpus"][1].get("lost").is_none(), "{reset}");
}
