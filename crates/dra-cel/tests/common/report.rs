//! The differentials' count lines. Under `.ci/run` (`GPU_DRA_TEST_REPORT` names a file) each line
//! is also appended there, so the run ends with every count in one place instead of inside
//! captured test output. Shared by the dra-cel and the allocation differentials.

/// Prints `line` and appends it to `$GPU_DRA_TEST_REPORT` when that is set.
pub fn report(line: &str) {
    use std::io::Write as _;
    eprintln!("{line}");
    let Some(path) = std::env::var_os("GPU_DRA_TEST_REPORT") else {
        return;
    };
    // One short O_APPEND write per line: tests running in parallel do not interleave.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
        .unwrap_or_else(|e| panic!("appending to GPU_DRA_TEST_REPORT {path:?}: {e}"));
}
