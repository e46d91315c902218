//! Who has a GPU's device file open: the kernel's `nvidia` module does not let the GPU go
//! (`driver/unbind` waits, forever) while anyone does. Read from `/proc/<pid>/fd` as NVIDIA's
//! driver does before it hands a GPU to a virtual machine.
use std::fmt;
use std::fs;
use std::path::Path;

/// A process (or the driver's persistence mode) holding a GPU open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuHolder {
    /// `None` for what is no process of its own (persistence mode kept by the kernel module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The process's name (`comm`), or what holds it.
    pub name: String,
}

impl fmt::Display for GpuHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid} ({})", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Every process under `proc_root` with `/dev/nvidia<minor>` open. Processes that end or cannot
/// be read while the scan runs are skipped (the kernel's view changes under it).
pub fn scan(proc_root: &Path, minor: u32) -> std::io::Result<Vec<GpuHolder>> {
    let device = format!("/dev/nvidia{minor}");
    let mut holders = Vec::new();
    for entry in fs::read_dir(proc_root)? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == device.as_str())
        });
        if holds {
            let name = fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            holders.push(GpuHolder {
                pid: Some(pid),
                name,
            });
        }
    }
    holders.sort_by_key(|h| h.pid);
    Ok(holders)
}

/// `holders` as a sentence: "pid 12 (dcgm), pid 40 (python)".
pub fn describe(holders: &[GpuHolder]) -> String {
    holders
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_processes_with_the_device_file_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let process = |pid: u32, comm: &str, targets: &[&str]| {
            let fd = dir.path().join(pid.to_string()).join("fd");
            fs::create_dir_all(&fd).expect("mkdir");
            fs::write(
                dir.path().join(pid.to_string()).join("comm"),
                format!("{comm}\n"),
            )
            .expect("comm");
            for (n, target) in targets.iter().enumerate() {
                std::os::unix::fs::symlink(target, fd.join(n.to_string())).expect("link");
            }
        };
        process(40, "python", &["/dev/nvidia1", "/dev/nvidiactl"]);
        process(12, "nv-hostengine", &["/dev/nvidia1"]);
        process(7, "other", &["/dev/nvidia0", "/dev/nvidia10"]);
        fs::create_dir_all(dir.path().join("self")).expect("not a pid");
        let holders = scan(dir.path(), 1).expect("scan");
        assert_eq!(
            describe(&holders),
            "pid 12 (nv-hostengine), pid 40 (python)"
        );
        assert!(scan(dir.path(), 2).expect("scan").is_empty());
    }
}
