//! Cgroups of the host for processes this driver starts that must outlive its container (MPS
//! control daemons and their servers): `gpu-dra-mps/<name>` at the top of every hierarchy the
//! host mounts (each cgroup v1 controller, and v2). A process there is not in the driver pod's
//! cgroup, so the container runtime does not kill it when the driver's container stops, and its
//! memory does not count against the driver's limit. The cgroups are found again by name after
//! a driver restart; a reboot removes them with their processes.
//!
//! Mount points are read from `mountinfo` here ([`unescape_mount_path`]); MPS reads its shm
//! mounts with the same function, so it lives in this leaf rather than in `mps`, which uses it.
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::gpu::driver_tools::HostView;
/// The folder of our cgroups at the top of each hierarchy.
pub const PARENT: &str = "gpu-dra-mps";

#[derive(Debug, thiserror::Error)]
#[error("cgroup {name}: {reason}")]
pub struct CgroupError {
    pub name: String,
    pub reason: String,
}

/// The host's cgroup hierarchies, as this process reaches them.
#[derive(Debug, Clone, Default)]
pub struct HostCgroups {
    hierarchies: Vec<PathBuf>,
}

impl HostCgroups {
    /// Every cgroup file system the host mounts. None is an error: a daemon that cannot leave the
    /// driver's cgroup would die with it.
    pub fn discover() -> Result<Self, CgroupError> {
        let fail = |reason: String| CgroupError {
            name: PARENT.into(),
            reason,
        };
        let host = HostView::find();
        let mounts = host.mountinfo();
        let table = std::fs::read_to_string(&mounts).map_err(|e| {
            fail(format!(
                "cannot read the host's mounts ({}): {e}",
                mounts.display()
            ))
        })?;
        let mut hierarchies = cgroup_mounts(&table)
            .into_iter()
            .map(|mount| host.path(&mount))
            .filter(|path| path.join("cgroup.procs").exists())
            .collect::<Vec<_>>();
        hierarchies.dedup();
        if hierarchies.is_empty() {
            return Err(fail(format!(
                "the host mounts no cgroup file system ({})",
                mounts.display()
            )));
        }
        Ok(Self { hierarchies })
    }

    fn dirs(&self, name: &str) -> impl Iterator<Item = PathBuf> + '_ {
        let name = name.to_string();
        self.hierarchies
            .iter()
            .map(move |h| h.join(PARENT).join(&name))
    }

    /// Creates the cgroup `name` in every hierarchy and opens their `cgroup.procs` for a child
    /// to write itself into.
    pub fn create(&self, name: &str) -> Result<Vec<OwnedFd>, CgroupError> {
        let fail = |path: &Path, e: std::io::Error| CgroupError {
            name: name.to_string(),
            reason: format!("{}: {e}", path.display()),
        };
        let mut procs = Vec::new();
        for hierarchy in &self.hierarchies {
            let parent = hierarchy.join(PARENT);
            let dir = parent.join(name);
            for (folder, above) in [(&parent, hierarchy.as_path()), (&dir, parent.as_path())] {
                match std::fs::create_dir(folder) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(fail(folder, e)),
                }
                // cgroup v1's cpuset takes no process until it has CPUs and memory nodes.
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let own = folder.join(file);
                    if own.exists()
                        && std::fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty())
                    {
                        let inherited = std::fs::read_to_string(above.join(file))
                            .map_err(|e| fail(&above.join(file), e))?;
                        std::fs::write(&own, inherited.trim()).map_err(|e| fail(&own, e))?;
                    }
                }
            }
            let path = dir.join("cgroup.procs");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| fail(&path, e))?;
            procs.push(OwnedFd::from(file));
        }
        Ok(procs)
    }

    /// The processes in cgroup `name` (in any hierarchy).
    pub fn pids(&self, name: &str) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs(name)
            .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Removes the (empty) cgroup `name` everywhere; a missing one is fine.
    pub fn remove(&self, name: &str) -> Result<(), CgroupError> {
        for dir in self.dirs(name) {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(CgroupError {
                        name: name.to_string(),
                        reason: format!("cannot remove {}: {e}", dir.display()),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The mount points of cgroup file systems in a mountinfo table.
fn cgroup_mounts(table: &str) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let mount_point = left.split_whitespace().nth(4)?;
            Some(PathBuf::from(unescape_mount_path(mount_point)))
        })
        .collect()
}

/// A mount point as `/proc/self/mountinfo` writes it, unescaped (mountinfo escapes space, tab,
/// newline and backslash as `\ooo`).
pub(crate) fn unescape_mount_path(escaped: &str) -> String {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(value) = u8::from_str_radix(&escaped[i + 1..i + 4], 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b/c"), "/a b/c");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path(r"/end\"), r"/end\");
    }

    #[test]
    fn cgroup_mounts_are_read_from_mountinfo() {
        let table = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw
34 30 0:30 / /sys/fs/cgroup/memory rw shared:15 - cgroup cgroup rw,memory
40 23 0:35 / /proc rw - proc proc rw";
        assert_eq!(
            cgroup_mounts(table),
            vec![
                PathBuf::from("/sys/fs/cgroup/unified"),
                PathBuf::from("/sys/fs/cgroup/memory")
            ]
        );
    }
}
