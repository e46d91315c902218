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
/// The toolkit's default `PATH`, the search of NVIDIA's driver in its container (first wins).
const BINARY_DIRS: [&str; 6] = [
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];
/// The utility binaries NVIDIA's CDI specs mount.
pub const BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// The binaries of [`BINARIES`] the driver itself runs (time-slicing, MPS).
const DRIVER_RUN_TOOLS: [&str; 2] = ["nvidia-smi", "nvidia-cuda-mps-control"];
const SOCKETS: [&str; 2] = [
    "run/nvidia-persistenced/socket",
    "run/nvidia-fabricmanager/socket",
];
/// The GSP and microcode firmware of driver `<version>`, under `<search dir>/nvidia/<version>/`.
const FIRMWARE_PATTERNS: [(&str, &str); 2] = [("gsp", ".bin"), ("ucodes", ".bin")];
/// ICD and vendor files (the toolkit's list): path under a config folder (`etc/` or
/// `usr/share/` of the driver root, searched in that order) and the folder containers see it in.
const CONFIGS: [(&str, &str); 13] = [
    ("glvnd/egl_vendor.d/10_nvidia.json", "/usr/share"),
    (
        "egl/egl_external_platform.d/15_nvidia_gbm.json",
        "/usr/share",
    ),
    (
        "egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share",
    ),
    (
        "egl/egl_external_platform.d/09_nvidia_wayland2.json",
        "/usr/share",
    ),
    (
        "egl/egl_external_platform.d/20_nvidia_xcb.json",
        "/usr/share",
    ),
    (
        "egl/egl_external_platform.d/20_nvidia_xlib.json",
        "/usr/share",
    ),
    ("nvidia/nvoptix.bin", "/usr/share"),
    ("OpenCL/vendors/nvidia.icd", "/etc"),
    ("vulkan/icd.d/nvidia_icd.json", "/etc"),
    ("vulkan/icd.d/nvidia_layers.json", "/etc"),
    ("vulkan/implicit_layer.d/nvidia_layers.json", "/etc"),
    ("vulkan/icd.d/nvidia_icd.x86_64.json", "/etc"),
    ("vulkan/icd.d/nvidia_icd.aarch64.json", "/etc"),
];
const CONFIG_DIRS: [&str; 2] = ["etc", "usr/share"];
/// The NVVM of older CUDA releases, versioned by its own number (`libnvidia-nvvm70.so.4`).
const LEGACY_NVVM: &str = "libnvidia-nvvm70.so.";
/// Libraries applications open by their development name (`dlopen("libcuda.so")`): the toolkit
/// links `<name>.so` in every container, whether or not the host has that link.
const DEV_LINKED: [&str; 2] = ["libcuda", "libnvidia-opticalflow"];
/// Subfolders of a library folder whose links point at driver libraries (GBM's backend).
const LINK_SUBDIRS: [&str; 1] = ["gbm"];
/// GBM loads the driver's backend through this link beside the allocator library; the toolkit
/// makes it in every container that gets `libnvidia-allocator`, whether or not the host has it.
const GBM_BACKEND: (&str, &str) = ("libnvidia-allocator.so.", "gbm/nvidia-drm_gbm.so");
/// The toolkit hook's commands a spec uses only where the node's hook has them (read from the
/// binary, which names its commands); `create-symlinks` and `update-ldcache` every hook has.
pub const HOOK_COMMANDS: [&str; 4] = [
    "enable-cuda-compat",
    "disable-device-node-modification",
    "update-application-profile",
    "apply-cuda-memory-limits",
];

/// Which of [`HOOK_COMMANDS`] a hook binary has.
pub fn hook_commands(binary: &[u8]) -> BTreeSet<&'static str> {
    HOOK_COMMANDS
        .into_iter()
        .filter(|c| binary.windows(c.len()).any(|w| w == c.as_bytes()))
        .collect()
}

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
    /// ICD and vendor files (OpenCL, Vulkan, EGL).
    pub configs: Vec<DriverFile>,
    /// The toolkit's hook binary on the host, when the node has one: it makes the links and
    /// updates the container's ld cache.
    pub hook: Option<PathBuf>,
    /// Which of [`HOOK_COMMANDS`] that hook has (none known when its binary cannot be read).
    pub hook_commands: BTreeSet<&'static str>,
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
    /// Where the kernel loads the driver's firmware from.
    pub firmware: FirmwareSearch,
}

/// The folders the kernel loads firmware from (its `fw_path`), which the container toolkit
/// searches too, each under the driver root: the `firmware_class.path` an admin set, then
/// `/lib/firmware/updates/<release>`, `/lib/firmware/updates`, `/lib/firmware/<release>`,
/// `/lib/firmware`. Some images keep the driver's firmware only under the custom path (a real
/// H200 VM: `/usr/local/nvidia/firmware`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FirmwareSearch {
    /// `/sys/module/firmware_class/parameters/path`, when set.
    pub custom: Option<PathBuf>,
    /// The running kernel's release (`uname -r`).
    pub kernel_release: Option<String>,
}

impl FirmwareSearch {
    /// Reads the host's settings: sysfs (the kernel's own, also inside a container) and the
    /// kernel release.
    pub fn from_host(sysfs_root: &Path) -> Self {
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        Self {
            custom: read(&sysfs_root.join("module/firmware_class/parameters/path"))
                .map(PathBuf::from),
            kernel_release: read(Path::new("/proc/sys/kernel/osrelease")),
        }
    }

    /// The search folders, relative to the driver root, in the kernel's order.
    fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let Some(custom) = self.custom.as_deref().and_then(relative) {
            dirs.push(custom);
        }
        let release = self.kernel_release.as_deref().filter(|r| !r.contains('/'));
        for base in ["lib/firmware/updates", "lib/firmware"] {
            if let Some(release) = release {
                dirs.push(Path::new(base).join(release));
            }
            dirs.push(PathBuf::from(base));
        }
        dirs
    }
}

impl DriverRoot {
    /// Finds the files of driver `version`; a root without its libraries is an error.
    pub fn discover(&self, version: &str) -> Result<DriverFiles, DriverFilesError> {
        let libraries = self.libraries(version)?;
        let suffix = format!(".so.{version}");
        // The legacy NVVM alone (another version's root) is no driver.
        if !libraries
            .iter()
            .any(|l| l.container_path.to_string_lossy().ends_with(&suffix))
        {
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
                // An executable file, as the toolkit's locator wants it: a placeholder
                // without the execute bit is no binary.
                BINARY_DIRS
                    .iter()
                    .map(|dir| Path::new(dir).join(name))
                    .find(|rel| {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::metadata(self.here.join(rel))
                            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                    })
            })
            .map(|rel| self.file(&rel))
            .collect();
        // Every match in every search folder, as the toolkit mounts them.
        let mut firmware: Vec<DriverFile> = Vec::new();
        for dir in self.firmware.dirs() {
            let rel = dir.join("nvidia").join(version);
            for name in self.list(&rel)? {
                let wanted = FIRMWARE_PATTERNS
                    .iter()
                    .any(|(prefix, suffix)| name.starts_with(prefix) && name.ends_with(suffix));
                let file = self.file(&rel.join(&name));
                if wanted && self.here.join(&rel).join(&name).is_file() && !firmware.contains(&file)
                {
                    firmware.push(file);
                }
            }
        }
        let sockets = SOCKETS
            .iter()
            .filter(|rel| self.here.join(rel).exists())
            .map(|rel| self.file(Path::new(rel)))
            .collect();
        let configs = CONFIGS
            .iter()
            .filter_map(|(rel, container_dir)| {
                let found = CONFIG_DIRS
                    .iter()
                    .map(|dir| Path::new(dir).join(rel))
                    .find(|path| self.here.join(path).is_file())?;
                Some(DriverFile {
                    container_path: Path::new(container_dir).join(rel),
                    host_path: self.host.join(found),
                })
            })
            .collect();
        let hook = self.hook.clone().or_else(|| {
            HOOKS
                .iter()
                .find(|rel| self.here.join(rel).is_file())
                .map(|rel| self.host.join(rel))
        });
        let hook_commands = hook
            .as_deref()
            .and_then(|h| std::fs::read(self.here_of(h)).ok())
            .map(|binary| hook_commands(&binary))
            .unwrap_or_default();
        Ok(DriverFiles {
            version: version.to_string(),
            libraries,
            links,
            binaries,
            firmware,
            sockets,
            configs,
            hook,
            hook_commands,
        })
    }

    /// A host path as this process reaches it: through the driver root when under it, else
    /// through the host's view (a `--nvidia-cdi-hook-path` elsewhere on the host).
    fn here_of(&self, host_path: &Path) -> PathBuf {
        match host_path.strip_prefix(&self.host) {
            Ok(rel) => self.here.join(rel),
            Err(_) => crate::gpu::driver_tools::HostView::find().path(host_path),
        }
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
                let wanted = (name.starts_with("lib") && name.ends_with(&suffix))
                    || name.starts_with(LEGACY_NVVM);
                if wanted && is_file {
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
        let link_dirs: Vec<PathBuf> = dirs
            .iter()
            .flat_map(|d| std::iter::once(d.clone()).chain(LINK_SUBDIRS.iter().map(|s| d.join(s))))
            .collect();
        for dir in link_dirs {
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
        for target in &targets {
            let Some(name) = target.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            for lib in DEV_LINKED {
                let link = target.with_file_name(format!("{lib}.so"));
                if name.starts_with(&format!("{lib}.so."))
                    && !links.iter().any(|l: &LibraryLink| l.link == link)
                {
                    links.push(LibraryLink {
                        link,
                        target: target.clone(),
                    });
                }
            }
        }
        for target in &targets {
            let (prefix, link_name) = GBM_BACKEND;
            let is_allocator = target
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix));
            let link = target.with_file_name(link_name);
            if is_allocator && !links.iter().any(|l| l.link == link) {
                links.push(LibraryLink {
                    link,
                    target: target.clone(),
                });
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
        resolve_within(&self.here, rel)
    }
}

/// `rel` with its symlinks followed inside the root at `here` (an absolute link target is the
/// root's, not this process's), relative to the root; `None` when it dangles, loops or leaves
/// the root.
fn resolve_within(here: &Path, rel: &Path) -> Option<PathBuf> {
    let mut current = rel.to_path_buf();
    for _ in 0..16 {
        let full = here.join(&current);
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

/// A library of the driver root by its SONAME, as the root's own dynamic linker finds it: the
/// root's `etc/ld.so.cache` first (drivers installed outside the usual folders, e.g.
/// `/usr/local/nvidia/lib64`, are only there), then [`LIBRARY_DIRS`]. The path is as this
/// process sees it (under `here`), its links followed inside the root. A candidate that is not
/// a regular file (a stray folder of that name, a dangling link) does not shadow a later one.
pub fn find_library(here: &Path, soname: &str) -> Option<PathBuf> {
    let cached = ldcache::read(&here.join("etc/ld.so.cache"))
        .ok()
        .into_iter()
        .flatten()
        .filter(|entry| entry.name == soname)
        .filter_map(|entry| relative(&entry.path));
    cached
        .chain(LIBRARY_DIRS.iter().map(|dir| Path::new(dir).join(soname)))
        .filter_map(|rel| resolve_within(here, &rel))
        .map(|rel| here.join(rel))
        .find(|path| {
            let regular = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file());
            if !regular {
                tracing::debug!(candidate = %path.display(), "not a regular file; the search goes on");
            }
            regular
        })
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
    for (name, soname) in FAKE_LIBRARIES {
        let file = format!("{name}.so.{version}");
        // A SONAME the file itself names, as the toolkit and ldconfig read it.
        let link = soname.map(str::to_string).unwrap_or_else(|| file.clone());
        std::fs::write(lib_dir.join(&file), fake_shared_object(&link))?;
        if link != file {
            symlink(&file, lib_dir.join(&link))?;
        }
        cached.push(ldcache::CachedLibrary {
            name: link.clone(),
            path: Path::new("/usr/lib/x86_64-linux-gnu").join(&link),
        });
    }
    // The legacy NVVM R580 still ships, versioned by its own number.
    std::fs::write(
        lib_dir.join("libnvidia-nvvm70.so.4"),
        fake_shared_object("libnvidia-nvvm70.so.4"),
    )?;
    // GBM finds the driver's backend through this link (the installer makes it).
    std::fs::create_dir_all(lib_dir.join("gbm"))?;
    symlink(
        "../libnvidia-allocator.so.1",
        lib_dir.join("gbm/nvidia-drm_gbm.so"),
    )?;
    // The ICD and vendor files the installer puts in /etc and /usr/share.
    for (path, content) in FAKE_CONFIGS {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap_or(root))?;
        std::fs::write(path, content)?;
    }
    // The development link only libcuda has.
    symlink("libcuda.so.1", lib_dir.join("libcuda.so"))?;
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::write(root.join("etc/ld.so.cache"), ldcache::write(&cached))?;
    // A host root has one; tools run in it may get theirs bound over it (IMEX daemons).
    std::fs::write(root.join("etc/hosts"), "127.0.0.1\tlocalhost\n")?;
    std::fs::create_dir_all(root.join("usr/bin"))?;
    for binary in BINARIES {
        let path = root.join("usr/bin").join(binary);
        std::fs::write(&path, b"")?;
        // Executable, as a driver's are, but for the two tools the driver runs: an empty file
        // must not look runnable to them (a test installs fake ones where it needs them).
        if !DRIVER_RUN_TOOLS.contains(&binary) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
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

/// The driver libraries of a fake driver root, versioned `<name>.so.<version>`, with the SONAME
/// the installer links them by (`None`: the versioned name is the SONAME): the compute, video
/// and graphics libraries an R580 data-center driver installs.
pub const FAKE_LIBRARIES: [(&str, Option<&str>); 26] = [
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
    ("libnvidia-pkcs11-openssl3", None),
    ("libnvcuvid", Some("libnvcuvid.so.1")),
    ("libnvidia-encode", Some("libnvidia-encode.so.1")),
    ("libnvidia-opticalflow", Some("libnvidia-opticalflow.so.1")),
    ("libnvidia-fbc", Some("libnvidia-fbc.so.1")),
    ("libEGL_nvidia", Some("libEGL_nvidia.so.0")),
    ("libGLESv2_nvidia", Some("libGLESv2_nvidia.so.2")),
    ("libGLESv1_CM_nvidia", Some("libGLESv1_CM_nvidia.so.1")),
    ("libGLX_nvidia", Some("libGLX_nvidia.so.0")),
    ("libnvidia-eglcore", None),
    ("libnvidia-glcore", None),
    ("libnvidia-tls", None),
    ("libnvidia-glsi", None),
    ("libnvidia-glvkspirv", None),
    ("libnvidia-rtcore", None),
    ("libnvoptix", Some("libnvoptix.so.1")),
    ("libnvidia-ngx", Some("libnvidia-ngx.so.1")),
];

/// A fake driver root's ICD and vendor files: root-relative path and content.
pub const FAKE_CONFIGS: [(&str, &str); 7] = [
    ("etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n"),
    (
        "etc/vulkan/icd.d/nvidia_icd.json",
        r#"{"file_format_version": "1.0.1", "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.4.312"}}"#,
    ),
    (
        "etc/vulkan/implicit_layer.d/nvidia_layers.json",
        r#"{"file_format_version": "1.0.1", "layer": {"name": "VK_LAYER_NV_optimus", "type": "INSTANCE", "library_path": "libGLX_nvidia.so.0"}}"#,
    ),
    (
        "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        r#"{"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}"#,
    ),
    (
        "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        r#"{"file_format_version": "1.0.0", "ICD": {"library_path": "libnvidia-egl-gbm.so.1"}}"#,
    ),
    (
        "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        r#"{"file_format_version": "1.0.0", "ICD": {"library_path": "libnvidia-egl-wayland.so.1"}}"#,
    ),
    ("usr/share/nvidia/nvoptix.bin", "fake OptiX data"),
];

/// A minimal x86-64 ELF shared object whose dynamic section names `soname`: enough for
/// `ldconfig`, the toolkit's SONAME reader and `readelf -d`; nothing to load or run.
pub fn fake_shared_object(soname: &str) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    const SHDR: usize = 64;
    let align8 = |n: usize| n.div_ceil(8) * 8;
    let dynstr: Vec<u8> = [&[0u8][..], soname.as_bytes(), &[0u8]].concat();
    let shstrtab = b"\0.dynstr\0.dynamic\0.shstrtab\0";
    let dynstr_off = EHDR + 2 * PHDR;
    let dynamic_off = align8(dynstr_off + dynstr.len());
    let dynamic_len = 4 * 16;
    let shstrtab_off = dynamic_off + dynamic_len;
    let shdr_off = align8(shstrtab_off + shstrtab.len());
    let total = shdr_off + 4 * SHDR;
    let mut out = vec![0u8; total];
    let put = |out: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes)
    };
    let u16le = |v: u16| v.to_le_bytes();
    let u32le = |v: u32| v.to_le_bytes();
    let u64le = |v: u64| v.to_le_bytes();
    // ELF header: 64-bit, little-endian, ET_DYN, EM_X86_64.
    put(&mut out, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    put(&mut out, 16, &u16le(3));
    put(&mut out, 18, &u16le(62));
    put(&mut out, 20, &u32le(1));
    put(&mut out, 32, &u64le(EHDR as u64));
    put(&mut out, 40, &u64le(shdr_off as u64));
    put(&mut out, 52, &u16le(EHDR as u16));
    put(&mut out, 54, &u16le(PHDR as u16));
    put(&mut out, 56, &u16le(2));
    put(&mut out, 58, &u16le(SHDR as u16));
    put(&mut out, 60, &u16le(4));
    put(&mut out, 62, &u16le(3));
    // Program headers: one read-write PT_LOAD of the whole file at address 0, and PT_DYNAMIC.
    let phdr = |out: &mut Vec<u8>,
                at: usize,
                kind: u32,
                flags: u32,
                off: usize,
                len: usize,
                align: u64| {
        put(out, at, &u32le(kind));
        put(out, at + 4, &u32le(flags));
        for (field, value) in [
            (8, off as u64),
            (16, off as u64),
            (24, off as u64),
            (32, len as u64),
            (40, len as u64),
            (48, align),
        ] {
            put(out, at + field, &u64le(value));
        }
    };
    phdr(&mut out, EHDR, 1, 6, 0, total, 0x1000);
    phdr(&mut out, EHDR + PHDR, 2, 6, dynamic_off, dynamic_len, 8);
    put(&mut out, dynstr_off, &dynstr);
    // DT_SONAME, DT_STRTAB, DT_STRSZ, DT_NULL.
    for (i, (tag, value)) in [
        (14u64, 1u64),
        (5, dynstr_off as u64),
        (10, dynstr.len() as u64),
        (0, 0),
    ]
    .into_iter()
    .enumerate()
    {
        put(&mut out, dynamic_off + 16 * i, &u64le(tag));
        put(&mut out, dynamic_off + 16 * i + 8, &u64le(value));
    }
    put(&mut out, shstrtab_off, shstrtab);
    // Sections: null, .dynstr, .dynamic (linked to .dynstr), .shstrtab.
    let shdr = |out: &mut Vec<u8>,
                index: usize,
                name: u32,
                kind: u32,
                flags: u64,
                off: usize,
                len: usize,
                link: u32,
                entsize: u64| {
        let at = shdr_off + index * SHDR;
        put(out, at, &u32le(name));
        put(out, at + 4, &u32le(kind));
        put(out, at + 8, &u64le(flags));
        put(
            out,
            at + 16,
            &u64le(if flags != 0 { off as u64 } else { 0 }),
        );
        put(out, at + 24, &u64le(off as u64));
        put(out, at + 32, &u64le(len as u64));
        put(out, at + 40, &u32le(link));
        put(out, at + 48, &u64le(1));
        put(out, at + 56, &u64le(entsize));
    };
    shdr(&mut out, 1, 1, 3, 2, dynstr_off, dynstr.len(), 0, 0);
    shdr(&mut out, 2, 9, 6, 3, dynamic_off, dynamic_len, 1, 16);
    shdr(&mut out, 3, 18, 3, 0, shstrtab_off, shstrtab.len(), 0, 0);
    out
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
mod tests;
