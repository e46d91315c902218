//! Crash-safe file writes shared by the simulator state, the checkpoint and CDI specs.
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `bytes` so that readers and a restarted process see either the old or the
/// new content, never a mix: write a temp file in the same directory, flush its data to disk
/// (`fdatasync`), rename it over `path`.
///
/// The directory is deliberately not synced: the rename is durable against a process crash (the
/// case kill -9 tests exercise), and everything these files describe — prepared claims, MIG
/// instances, CDI specs under `/var/run` — lives only until the next boot, which the boot ID
/// catches. Skipping the second sync halves the fsync cost on the prepare path.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
