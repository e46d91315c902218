//! The NVIDIA driver's user-space files a CUDA container needs, found under the driver root the
//! way the NVIDIA container toolkit finds them: libraries of the running driver version through
//! the root's ld cache (then the usual library folders), utility binaries, GSP firmware and IPC
//! sockets. Discovered once at start; every claim's CDI spec mounts them.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use super::ldcache;

/// Library folders searched when the ld cache does not name any (as the toolkit does).
pub const LIBRARY_DIRS: [&str; 6] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib",
];
const BINARY_DIRS: [&str; 3] = ["usr/bin", "bin", "usr/sbin"];
/// The utility binaries NVIDIA's CDI specs mount.
pub const BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
const SOCKETS: [&str; 2] = [
    "run/nvidia-persistenced/socket",
    "run/nvidia-fabricmanager/socket",
];
const FIRMWARE_DIRS: [&str; 2] = ["lib/firmware/nvidia", "usr/lib/firmware/nvidia"];
/// The toolkit's hook binaries, newest first.
const HOOKS: [&str; 2] = ["usr/bin/nvidia-cdi-hook", "usr/bin/nvidia-ctk"];

#[derive(Debug, thiserror::Error)]
pub enum DriverFilesError {
    #[error(
        "--nvidia-driver-root {root}: no libraries of driver {version} (looked for lib*.so.{version} in the folders its etc/ld.so.cache names and in {searched})"
    )]
    NoDriver {
        root: PathBuf,
        version: String,
        searched: String,
    },
    #[error("--nvidia-driver-root {root}: {reason}")]
    Unreadable { root: PathBuf, reason: String },
}

/// A driver file: where containers see it and where it is on the host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DriverFile {
    /// Path inside the container (the path under the driver root, from `/`).
    pub container_path: PathBuf,
    /// Path on the host (under the host's view of the driver root).
    pub host_path: PathBuf,
}

/// A symlink the driver ships beside a library (`libcuda.so.1 -> libcuda.so.580.95.05`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibraryLink {
    /// The link, as containers see it.
    pub link: PathBuf,
    /// The library it points to, as containers see it.
    pub target: PathBuf,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    pub version: String,
    pub libraries: Vec<DriverFile>,
    pub links: Vec<LibraryLink>,
    pub binaries: Vec<DriverFile>,
    pub firmware: Vec<DriverFile>,
    pub sockets: Vec<DriverFile>,
    /// The toolkit's hook binary on the host, when the node has one: it makes the links and
    /// updates the container's ld cache.
    pub hook: Option<PathBuf>,
}

impl DriverFiles {
    /// The folders holding the libraries, as containers see them.
    pub fn library_dirs(&self) -> Vec<PathBuf> {
        let dirs: BTreeSet<PathBuf> = self
            .libraries
            .iter()
            .filter_map(|l| l.container_path.parent().map(Path::to_path_buf))
            .collect();
        dirs.into_iter().collect()
    }
}

/// Where to look and how to name what is found.
#[derive(Debug, Clone)]
pub struct DriverRoot {
    /// The driver root as this process sees it (e.g. `/driver-root` inside the plugin's pod).
    pub here: PathBuf,
    /// The same folder on the host (e.g. `/run/nvidia/driver`): CDI host paths point there.
    pub host: PathBuf,
    /// `--nvidia-cdi-hook-path`: the toolkit's hook on the host, overriding the search.
    pub hook: Option<PathBuf>,
}

impl DriverRoot {
    /// Finds the files of driver `version`; a root without its libraries is an error.
    pub fn discover(&self, version: &str) -> Result<DriverFiles, DriverFilesError> {
        let libraries = self.libraries(version)?;
        if libraries.is_empty() {
            return Err(DriverFilesError::NoDriver {
                root: self.here.clone(),
                version: version.to_string(),
                searched: LIBRARY_DIRS.join(", "),
            });
        }
        let links = self.links(&libraries)?;
        let binaries = BINARIES
            .iter()
            .filter_map(|name| {
                BINARY_DIRS
                    .iter()
                    .map(|dir| Path::new(dir).join(name))
                    .find(|rel| self.here.join(rel).is_file())
            })
            .map(|rel| self.file(&rel))
            .collect();
        let mut firmware = Vec::new();
        for dir in FIRMWARE_DIRS {
            let rel = Path::new(dir).join(version);
            for name in self.list(&rel)? {
                if name.ends_with(".bin") && self.here.join(&rel).join(&name).is_file() {
                    firmware.push(self.file(&rel.join(name)));
                }
            }
            if !firmware.is_empty() {
                break;
            }
        }
        let sockets = SOCKETS
            .iter()
            .filter(|rel| self.here.join(rel).exists())
            .map(|rel| self.file(Path::new(rel)))
            .collect();
        let hook = self.hook.clone().or_else(|| {
            HOOKS
                .iter()
                .find(|rel| self.here.join(rel).is_file())
                .map(|rel| self.host.join(rel))
        });
        Ok(DriverFiles {
            version: version.to_string(),
            libraries,
            links,
            binaries,
            firmware,
            sockets,
            hook,
        })
    }

    fn file(&self, rel: &Path) -> DriverFile {
        DriverFile {
            container_path: Path::new("/").join(rel),
            host_path: self.host.join(rel),
        }
    }

    /// Every regular file `lib*.so.<version>` in the library folders: those of the ld cache's
    /// entries that resolve to such a file, else the usual folders.
    fn libraries(&self, version: &str) -> Result<Vec<DriverFile>, DriverFilesError> {
        let suffix = format!(".so.{version}");
        let mut dirs: Vec<PathBuf> = Vec::new();
        let cache = self.here.join("etc/ld.so.cache");
        if cache.is_file() {
            match ldcache::read(&cache) {
                Ok(entries) => {
                    for entry in entries {
                        let Some(rel) = relative(&entry.path) else {
                            continue;
                        };
                        let Some(resolved) = self.resolve(&rel) else {
                            continue;
                        };
                        let versioned = resolved
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().ends_with(&suffix));
                        if let Some(dir) = resolved.parent().filter(|_| versioned)
                            && !dirs.iter().any(|d| d == dir)
                        {
                            dirs.push(dir.to_path_buf());
                        }
                    }
                }
                // A broken cache is no reason to refuse: the folders are searched instead.
                Err(error) => tracing::warn!(%error, "cannot read the driver root's ld cache"),
            }
        }
        if dirs.is_empty() {
            dirs = LIBRARY_DIRS.iter().map(PathBuf::from).collect();
        }
        let mut found = BTreeMap::new();
        for dir in dirs {
            for name in self.list(&dir)? {
                let rel = dir.join(&name);
                let is_file = std::fs::symlink_metadata(self.here.join(&rel))
                    .is_ok_and(|m| m.file_type().is_file());
                if name.starts_with("lib") && name.ends_with(&suffix) && is_file {
                    // First folder wins, as in the dynamic linker's search.
                    found.entry(name).or_insert_with(|| self.file(&rel));
                }
            }
        }
        Ok(found.into_values().collect())
    }

    /// Symlinks beside the libraries that resolve to one of them.
    fn links(&self, libraries: &[DriverFile]) -> Result<Vec<LibraryLink>, DriverFilesError> {
        let targets: BTreeSet<PathBuf> =
            libraries.iter().map(|l| l.container_path.clone()).collect();
        let dirs: BTreeSet<PathBuf> = targets
            .iter()
            .filter_map(|t| t.parent().map(Path::to_path_buf))
            .collect();
        let mut links = Vec::new();
        for dir in dirs {
            let Some(rel_dir) = relative(&dir) else {
                continue;
            };
            for name in self.list(&rel_dir)? {
                let rel = rel_dir.join(&name);
                let is_link = std::fs::symlink_metadata(self.here.join(&rel))
                    .is_ok_and(|m| m.file_type().is_symlink());
                if !is_link {
                    continue;
                }
                if let Some(target) = self.resolve(&rel).map(|r| Path::new("/").join(r))
                    && targets.contains(&target)
                {
                    links.push(LibraryLink {
                        link: Path::new("/").join(&rel),
                        target,
                    });
                }
            }
        }
        links.sort();
        Ok(links)
    }

    /// Names in a folder under the root (none if it does not exist).
    fn list(&self, rel: &Path) -> Result<Vec<String>, DriverFilesError> {
        let dir = self.here.join(rel);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return Ok(vec![]),
            Err(e) => {
                return Err(DriverFilesError::Unreadable {
                    root: self.here.clone(),
                    reason: format!("cannot list {}: {e}", dir.display()),
                });
            }
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Follows symlinks inside the root (absolute targets are taken as under the root, as they
    /// are on the host); returns the final path relative to the root.
    fn resolve(&self, rel: &Path) -> Option<PathBuf> {
        let mut current = rel.to_path_buf();
        for _ in 0..16 {
            let full = self.here.join(&current);
            let meta = std::fs::symlink_metadata(&full).ok()?;
            if !meta.file_type().is_symlink() {
                return Some(current);
            }
            let target = std::fs::read_link(&full).ok()?;
            current = if target.is_absolute() {
                relative(&target)?
            } else {
                normalize(&current.parent()?.join(target))?
            };
        }
        None
    }
}

/// `/usr/lib/x` → `usr/lib/x`.
fn relative(path: &Path) -> Option<PathBuf> {
    normalize(path.strip_prefix("/").unwrap_or(path))
}

/// Resolves `.` and `..` lexically; `None` when it would leave the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Builds a driver root with the files of driver `version` a real one has (empty files and the
/// links `ldconfig` and the installer make), for tests and the demo.
pub fn write_fake_driver_root(root: &Path, version: &str) -> std::io::Result<()> {
    use std::os::unix::fs::symlink;
    write_fake_c_library(root)?;
    // Where a chrooted tool finds the kernel's file systems and its private /tmp.
    for dir in ["tmp", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let lib_dir = root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&lib_dir)?;
    let mut cached = Vec::new();
    for (name, soname) in [
        ("libcuda", Some("libcuda.so.1")),
        ("libnvidia-ml", Some("libnvidia-ml.so.1")),
        (
            "libnvidia-ptxjitcompiler",
            Some("libnvidia-ptxjitcompiler.so.1"),
        ),
        ("libnvidia-nvvm", Some("libnvidia-nvvm.so.4")),
        ("libcudadebugger", Some("libcudadebugger.so.1")),
        ("libnvidia-opencl", Some("libnvidia-opencl.so.1")),
        ("libnvidia-cfg", Some("libnvidia-cfg.so.1")),
        ("libnvidia-allocator", Some("libnvidia-allocator.so.1")),
        ("libnvidia-gpucomp", None),
    ] {
        let file = format!("{name}.so.{version}");
        std::fs::write(lib_dir.join(&file), b"")?;
        let link = soname.map(str::to_string).unwrap_or_else(|| file.clone());
        if link != file {
            symlink(&file, lib_dir.join(&link))?;
        }
        cached.push(ldcache::CachedLibrary {
            name: link.clone(),
            path: Path::new("/usr/lib/x86_64-linux-gnu").join(&link),
        });
    }
    // The development link only libcuda has.
    symlink("libcuda.so.1", lib_dir.join("libcuda.so"))?;
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::write(root.join("etc/ld.so.cache"), ldcache::write(&cached))?;
    std::fs::create_dir_all(root.join("usr/bin"))?;
    for binary in BINARIES {
        std::fs::write(root.join("usr/bin").join(binary), b"")?;
    }
    let firmware = root.join("lib/firmware/nvidia").join(version);
    std::fs::create_dir_all(&firmware)?;
    for blob in ["gsp_ga10x.bin", "gsp_tu10x.bin"] {
        std::fs::write(firmware.join(blob), b"")?;
    }
    std::fs::create_dir_all(root.join("run/nvidia-persistenced"))?;
    std::fs::write(root.join("run/nvidia-persistenced/socket"), b"")?;
    Ok(())
}

/// The loader of the fake driver root's tools (e2e/fakenvml links its binaries to it): a path
/// no image and no host has, so a tool runs only chrooted into a fake driver root.
pub const FAKE_LOADER: &str = "lib/ld-gpu-dra-driver-root.so";
/// The C library of the fake driver root's tools (their rpath).
pub const FAKE_LIBC_DIR: &str = "lib/gpu-dra-driver-root";

/// Gives a fake driver root a C library of its own: this machine's loader and libraries, copied
/// under paths only a fake driver root has.
fn write_fake_c_library(root: &Path) -> std::io::Result<()> {
    const LOADERS: [&str; 2] = ["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"];
    const DIRS: [&str; 6] = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/usr/lib64",
    ];
    let not_found = |what: &str| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no {what} on this machine to give the fake driver root's tools"),
        )
    };
    let loader = LOADERS
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or_else(|| not_found("C library loader"))?;
    std::fs::create_dir_all(root.join(FAKE_LOADER).parent().unwrap_or(root))?;
    std::fs::copy(loader, root.join(FAKE_LOADER))?;
    let lib_dir = root.join(FAKE_LIBC_DIR);
    std::fs::create_dir_all(&lib_dir)?;
    for (name, required) in [
        ("libc.so.6", true),
        ("libgcc_s.so.1", true),
        ("libm.so.6", false),
        ("libpthread.so.0", false),
        ("libdl.so.2", false),
        ("librt.so.1", false),
    ] {
        match DIRS
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
        {
            Some(path) => {
                std::fs::copy(&path, lib_dir.join(name))?;
            }
            None if required => return Err(not_found(name)),
            None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERSION: &str = "580.95.05";

    fn root(dir: &Path) -> DriverRoot {
        DriverRoot {
            here: dir.to_path_buf(),
            host: PathBuf::from("/run/nvidia/driver"),
            hook: None,
        }
    }

    #[test]
    fn finds_the_running_versions_files_through_the_ld_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_fake_driver_root(dir.path(), VERSION).expect("fake root");
        // Another version left behind by an upgrade: never mounted.
        let lib_dir = dir.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::write(lib_dir.join("libcuda.so.470.00.01"), b"").expect("old library");
        let files = root(dir.path()).discover(VERSION).expect("discover");
        let names: Vec<String> = files
            .libraries
            .iter()
            .map(|l| l.container_path.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 9, "{names:?}");
        assert!(names.contains(&format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}")));
        assert!(!names.iter().any(|n| n.contains("470")), "{names:?}");
        assert_eq!(
            files.libraries[0].host_path,
            Path::new("/run/nvidia/driver").join(
                files.libraries[0]
                    .container_path
                    .strip_prefix("/")
                    .expect("absolute")
            )
        );
        assert!(files.links.contains(&LibraryLink {
            link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            target: format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}").into(),
        }));
        // libcuda.so -> libcuda.so.1 -> libcuda.so.<version>: followed to the end.
        assert!(
            files
                .links
                .iter()
                .any(|l| l.link == Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so"))
        );
        assert_eq!(files.binaries.len(), 5);
        assert_eq!(files.firmware.len(), 2);
        assert_eq!(files.sockets.len(), 1);
        assert_eq!(files.hook, None);
        assert_eq!(
            files.library_dirs(),
            [PathBuf::from("/usr/lib/x86_64-linux-gnu")]
        );
    }

    #[test]
    fn without_an_ld_cache_the_usual_folders_are_searched() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_fake_driver_root(dir.path(), VERSION).expect("fake root");
        std::fs::remove_file(dir.path().join("etc/ld.so.cache")).expect("rm cache");
        std::fs::create_dir_all(dir.path().join("usr/bin")).expect("bin");
        std::fs::write(dir.path().join("usr/bin/nvidia-cdi-hook"), b"").expect("hook");
        let files = root(dir.path()).discover(VERSION).expect("discover");
        assert_eq!(files.libraries.len(), 9);
        assert_eq!(
            files.hook,
            Some(PathBuf::from("/run/nvidia/driver/usr/bin/nvidia-cdi-hook"))
        );
    }

    #[test]
    fn a_root_without_the_driver_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = root(dir.path()).discover(VERSION).expect_err("empty root");
        let message = err.to_string();
        assert!(
            message.contains(&dir.path().display().to_string())
                && message.contains(VERSION)
                && message.contains("--nvidia-driver-root"),
            "{message}"
        );
        // Another version's files are not this driver's.
        write_fake_driver_root(dir.path(), "470.00.01").expect("old root");
        assert!(root(dir.path()).discover(VERSION).is_err());
    }
}
