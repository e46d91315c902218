//! `gpu-dra demo` and `gpu-dra packing-study` as a newcomer runs them.
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
        out.contains("CDI specs left: 0 · MIG instances left: 0 · claims in checkpoint: 0"),
        "{out}"
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
fn packing_study_compares_both_orders() {
    let (ok, out, err) = gpu_dra(&["packing-study", "--events", "150", "--mean-lifetime", "30"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("name order (NVIDIA's):") && out.contains("best-fit order (ours):"),
        "{out}"
    );
    let (ok, _, err) = gpu_dra(&["packing-study", "--events", "10", "--mix", "9g.99gb=1"]);
    assert!(!ok);
    assert!(err.contains("\"9g.99gb\" is not a MIG profile"), "{err}");
}
