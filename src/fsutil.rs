//! Crash-safe file writes shared by the simulator state, the checkpoint and CDI specs.
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Owner-only: the checkpoint, CDI specs and simulator state are read by root processes (the
/// driver, the container runtime) and by no one else.
const FILE_MODE: u32 = 0o600;

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
    let tmp = dir.join(format!(
        "{}{}",
        temp_prefix(&file_name.to_string_lossy()),
        std::process::id()
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `.<name>.tmp-`: what temp files of [`write_atomically`] for `name` start with (the writer's
/// PID follows).
fn temp_prefix(name: &str) -> String {
    format!(".{name}.tmp-")
}

/// Removes temp files a crashed [`write_atomically`] of `path` left behind. Only call this while
/// no other process can be writing `path` (at start, under the node lock).
pub fn sweep_temp_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(vec![]);
    };
    let prefix = temp_prefix(&name.to_string_lossy());
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    let mut removed = vec![];
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            fs::remove_file(entry.path())?;
            removed.push(entry.path());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn files_are_owner_only_and_leftover_temp_files_are_swept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("checkpoint.json");
        write_atomically(&path, b"{}").expect("write");
        let mode = fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let leftover = dir.path().join(".checkpoint.json.tmp-4242");
        let unrelated = dir.path().join(".other.json.tmp-4242");
        fs::write(&leftover, b"half").expect("write");
        fs::write(&unrelated, b"x").expect("write");
        assert_eq!(
            sweep_temp_files(&path).expect("sweep"),
            std::slice::from_ref(&leftover)
        );
        assert!(!leftover.exists() && unrelated.exists() && path.exists());
    }
}
