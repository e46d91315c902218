//! Shared by the tests that load the fake libnvidia-ml.
use std::path::PathBuf;

/// The fake library this test build made.
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // Test builds leave the cdylib next to the test in target/<profile>/deps; plain builds put
    // it in target/<profile>.
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        deps.join("libnvidia_ml.so"),
        deps.parent().expect("target dir").join("libnvidia_ml.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| panic!("fake NVML not built; looked at {candidates:?}"))
}
