//! Module layering: which parts of the library may name which. Data flows one way (NVML → device
//! model → slices), and the prepare effects are leaves the orchestrator applies, so none of them
//! may reach back into what uses it. An import circle compiles fine in Rust, so only a scan of the
//! sources keeps these lines from eroding.
//!
//! Comment lines are skipped: a doc link to the layer above says who calls the code, it is not a
//! dependency.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, sorted so failures list in a stable order; `dir`
/// itself when it is a file (a rule for one module).
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    if dir.is_file() {
        return vec![dir.to_path_buf()];
    }
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `file:line: text` for each non-comment line under `dir` (relative to the package root; a
/// folder or one file) that contains one of `forbidden`.
fn violations(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = rust_files(&root.join(dir));
    assert!(!files.is_empty(), "no Rust files at {dir}: was it moved?");
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", file.display()));
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            // One report per line: `super::super::state` also contains `super::state`.
            if let Some(pattern) = forbidden.iter().find(|pattern| line.contains(*pattern)) {
                found.push(format!(
                    "{shown}:{}: names `{pattern}`: {}",
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

fn assert_none(rule: &str, found: Vec<String>) {
    assert!(found.is_empty(), "{rule}:\n{}", found.join("\n"));
}

#[test]
fn prepare_effects_do_not_import_the_orchestrator() {
    assert_none(
        "src/prepare/effects/ must not import the orchestrator (prepare::state), the planner \
         (prepare::plan) or the driver (prepare::driver); shared types belong in \
         prepare::error, prepare::config or another leaf module",
        violations(
            "src/prepare/effects",
            &[
                "prepare::state",
                "prepare::plan",
                "prepare::driver",
                // Longest first: the report names the pattern that matched.
                "super::super::state",
                "super::super::plan",
                "super::super::driver",
                "super::state",
                "super::plan",
                "super::driver",
            ],
        ),
    );
}

#[test]
fn device_model_does_not_import_prepare() {
    assert_none(
        "src/gpu/ must not import crate::prepare (data flows NVML → device model → slices)",
        violations("src/gpu", &["crate::prepare"]),
    );
}

#[test]
fn slices_do_not_import_prepare() {
    assert_none(
        "src/slices/ must not import crate::prepare (data flows NVML → device model → slices)",
        violations("src/slices", &["crate::prepare"]),
    );
}

#[test]
fn device_model_does_not_import_slices() {
    assert_none(
        "src/gpu/ must not import crate::slices (data flows NVML → device model → slices)",
        violations("src/gpu", &["crate::slices"]),
    );
}

// Import circles inside src/prepare/ that were taken apart (issue 56): each pair named one
// another. What both sides need lives in a leaf of its own now; these keep it there.

#[test]
fn the_planner_does_not_import_the_orchestrator() {
    assert_none(
        "src/prepare/plan.rs must not import prepare::state (which imports the planner); \
         DriverConfig is in prepare::config",
        violations("src/prepare/plan.rs", &["prepare::state", "super::state"]),
    );
    assert_none(
        "src/prepare/config.rs is a leaf: it must not import the orchestrator or the planner",
        violations(
            "src/prepare/config.rs",
            &[
                "prepare::state",
                "prepare::plan",
                "super::state",
                "super::plan",
            ],
        ),
    );
}

#[test]
fn in_flight_does_not_import_the_driver() {
    assert_none(
        "src/prepare/in_flight.rs must not import prepare::driver (which imports it); \
         Operation is in prepare (mod.rs)",
        violations(
            "src/prepare/in_flight.rs",
            &["prepare::driver", "super::driver"],
        ),
    );
}

#[test]
fn cgroups_do_not_import_mps() {
    assert_none(
        "src/prepare/cgroup.rs must not import prepare::mps (which imports it); mountinfo \
         parsing is in cgroup.rs",
        violations("src/prepare/cgroup.rs", &["prepare::mps", "super::mps"]),
    );
}

#[test]
fn the_checkpoint_does_not_import_the_takeover() {
    assert_none(
        "src/prepare/checkpoint.rs must not import prepare::takeover (which imports it); \
         NVIDIA's format is read in prepare::nvidia_checkpoint, TakenOver is in checkpoint.rs",
        violations(
            "src/prepare/checkpoint.rs",
            &["prepare::takeover", "super::takeover"],
        ),
    );
    assert_none(
        "src/prepare/nvidia_checkpoint.rs is a leaf: it must not import our checkpoint or the \
         takeover",
        violations(
            "src/prepare/nvidia_checkpoint.rs",
            &[
                "prepare::takeover",
                "prepare::checkpoint",
                "super::takeover",
                "super::checkpoint",
            ],
        ),
    );
}

#[test]
fn the_device_model_does_not_import_its_simulator() {
    // The simulator builds its PCI view and MIG profiles with these modules; their tests that
    // need it are in src/gpu/sim_tests.rs.
    for file in ["src/gpu/pci.rs", "src/gpu/mig.rs"] {
        assert_none(
            &format!("{file} must not import gpu::sim (which imports it)"),
            violations(file, &["gpu::sim::", "super::sim::"]),
        );
    }
}
