//! The driver root's own tools (`nvidia-smi`, `nvidia-cuda-mps-control`), run as NVIDIA's driver
//! runs them: in the host's mount namespace, chrooted into the driver root. They load with the
//! driver root's own loader and libraries, whatever this process's image holds: running them with
//! this image's loader and the host's libraries mixes two C libraries, which fails wherever the
//! host's glibc is not the image's.
//!
//! Inside the chroot a tool sees only the driver root. What it needs from outside (an MPS pipe
//! folder, the simulated GPUs' state) is bind-mounted under a private `/tmp` in a mount namespace
//! of its own, so neither the host nor the driver root ever sees those mounts. A driver root other
//! than `/` gets the host's `/proc`, `/sys` and `/dev` where it has none of its own.
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Arc;

/// Where this process sees the host's file systems: through the outermost ancestor process it
/// can read (the host's init, or the container runtime's shim when init is out of reach), in a
/// container that shares the host's PID namespace (`hostPID: true` in the chart); or directly,
/// when that ancestor shares this process's mount namespace (the driver runs on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// The ancestor whose mount namespace is the host's; `None`: this process's own.
    pid: Option<u32>,
}

impl HostView {
    pub fn find() -> Self {
        let own = std::fs::read_link("/proc/self/ns/mnt").ok();
        let mut outermost = None;
        let mut pid = std::os::unix::process::parent_id();
        while pid > 0 {
            let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
                break;
            };
            outermost = Some((pid, ns));
            if pid == 1 {
                break;
            }
            pid = parent_of(pid).unwrap_or(0);
        }
        Self {
            pid: outermost
                .filter(|(_, ns)| Some(ns) != own.as_ref())
                .map(|(pid, _)| pid),
        }
    }

    /// The host's `/`, as this process reaches it.
    pub fn root(&self) -> PathBuf {
        match self.pid {
            Some(pid) => PathBuf::from(format!("/proc/{pid}/root")),
            None => PathBuf::from("/"),
        }
    }

    /// A host path, as this process reaches it.
    pub fn path(&self, host_path: &Path) -> PathBuf {
        self.root()
            .join(host_path.strip_prefix("/").unwrap_or(host_path))
    }

    /// The host's mount table.
    pub fn mountinfo(&self) -> PathBuf {
        match self.pid {
            Some(pid) => PathBuf::from(format!("/proc/{pid}/mountinfo")),
            None => PathBuf::from("/proc/self/mountinfo"),
        }
    }

    /// The host's mount namespace, to enter; `None` where this process is in it already.
    fn mount_ns(&self) -> Option<PathBuf> {
        self.pid
            .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/mnt")))
    }

    fn net_ns(&self) -> Option<PathBuf> {
        self.pid
            .map(|pid| PathBuf::from(format!("/proc/{pid}/ns/net")))
    }
}

/// A process's parent, from `/proc/<pid>/status`.
fn parent_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}
/// `PATH` inside the chroot: the tools run with nothing of this process's environment.
const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{tool}: {reason}")]
    Unusable { tool: String, reason: String },
}

/// Runs tools of one driver root.
#[derive(Debug, Clone)]
pub struct DriverRootTools {
    /// The driver root as the host sees it: the chroot.
    host: PathBuf,
    /// The driver root as this process sees it.
    here: PathBuf,
    /// How this process reaches the host.
    host_view: HostView,
    /// The host's mount namespace, where this process is not in it.
    host_mount_ns: Option<Arc<OwnedFd>>,
    /// The host's network namespace, where this process is not in it.
    host_net_ns: Option<Arc<OwnedFd>>,
}

/// A bind mount into the chroot.
#[derive(Debug, Clone)]
struct Bind {
    /// Host path.
    source: PathBuf,
    /// Path inside the driver root: under `/tmp` (made on the private tmpfs) or existing there.
    target: PathBuf,
}

/// One run of a tool: its arguments, environment, binds and cgroups.
#[derive(Debug)]
pub struct ToolCommand {
    tools: DriverRootTools,
    /// Absolute path inside the driver root.
    tool: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    binds: Vec<Bind>,
    cgroup_procs: Vec<OwnedFd>,
    host_network: bool,
}

impl DriverRootTools {
    /// `here`: the driver root as this process sees it; `host`: as the host sees it.
    pub fn new(here: &Path, host: &Path) -> Self {
        let host_view = HostView::find();
        let host_mount_ns = host_view
            .mount_ns()
            .and_then(|ns| std::fs::File::open(ns).ok())
            .map(|f| Arc::new(OwnedFd::from(f)));
        let host_net_ns = host_view
            .net_ns()
            .and_then(|ns| std::fs::File::open(ns).ok())
            .map(|f| Arc::new(OwnedFd::from(f)));
        Self {
            host: host.to_path_buf(),
            here: here.to_path_buf(),
            host_view,
            host_mount_ns,
            host_net_ns,
        }
    }

    pub fn host_root(&self) -> &Path {
        &self.host
    }

    /// How this process reaches the host's files.
    pub fn host_view(&self) -> &HostView {
        &self.host_view
    }

    /// The first of `candidates` (paths relative to the driver root) that is an executable file
    /// there, as a path inside the driver root.
    pub fn find(&self, candidates: &[&str]) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        candidates
            .iter()
            .find(|path| {
                std::fs::metadata(self.here.join(path))
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .map(|path| Path::new("/").join(path))
    }

    /// A run of `tool` (absolute, inside the driver root).
    pub fn command(&self, tool: &Path) -> ToolCommand {
        ToolCommand {
            tools: self.clone(),
            tool: tool.to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            binds: Vec::new(),
            cgroup_procs: Vec::new(),
            host_network: false,
        }
    }

    /// Whether `tool` can run here: the host's view of the driver root has it (the driver shares
    /// the host's PID namespace) and its loader finds every library it links, in the chroot.
    /// Checked without running the tool: the loader only lists what it would load.
    pub fn check(&self, tool: &Path) -> Result<(), ToolError> {
        let unusable = |reason: String| ToolError::Unusable {
            tool: self
                .host
                .join(tool.strip_prefix("/").unwrap_or(tool))
                .display()
                .to_string(),
            reason,
        };
        if std::process::id() == 1 {
            return Err(unusable(
                "the driver runs in a PID namespace of its own, so the tools it starts would die with its container: run it with hostPID: true (the chart does)".into(),
            ));
        }
        if self.host_view.pid.is_some() && self.host_mount_ns.is_none() {
            return Err(unusable(format!(
                "cannot enter the host's mount namespace ({})",
                self.host_view.mount_ns().unwrap_or_default().display()
            )));
        }
        let in_host = self
            .host_view
            .path(&self.host)
            .join(tool.strip_prefix("/").unwrap_or(tool));
        if !in_host.is_file() {
            return Err(unusable(format!(
                "not found in the host's view of the driver root ({}): the driver must share the host's PID namespace (hostPID: true, as the chart sets) and the host must have it",
                in_host.display()
            )));
        }
        // glibc's loader lists the libraries and exits without running the program (`ldd`).
        let mut output = self
            .command(tool)
            .env("LD_TRACE_LOADED_OBJECTS", "1")
            .build()?;
        let output = tool_output(&mut output)
            .map_err(|e| unusable(format!("cannot run it chrooted into the driver root: {e}")))?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let missing: Vec<&str> = said
            .lines()
            .filter(|line| line.contains("not found") || line.contains("error while loading"))
            .map(str::trim)
            .collect();
        if !output.status.success() || !missing.is_empty() {
            return Err(unusable(format!(
                "its loader fails in the driver root ({}): {}",
                output.status,
                if missing.is_empty() {
                    said.trim().to_string()
                } else {
                    missing.join("; ")
                }
            )));
        }
        Ok(())
    }
}

/// Starts a driver tool. `exec` fails with ETXTBSY while any process still holds the file open
/// for writing: a package upgrade on the host replacing it, or a process forked by another thread
/// of ours in the instant between its fork and its own `exec`. Both pass within milliseconds, so
/// the start is tried again for a short while instead of failing the claim.
pub fn spawn_tool(command: &mut Command) -> std::io::Result<Child> {
    const TEXT_BUSY_RETRIES: u32 = 50;
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < TEXT_BUSY_RETRIES => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// [`spawn_tool`], then its whole output, as `Command::output` gives it (stdin null).
pub fn tool_output(command: &mut Command) -> std::io::Result<Output> {
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    spawn_tool(command)?.wait_with_output()
}

impl ToolCommand {
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Makes the host folder `source` appear at `target` inside the chroot (`/tmp/...`, or a
    /// folder the driver root has, such as `/dev/shm`).
    pub fn bind(mut self, source: &Path, target: &str) -> Self {
        self.binds.push(Bind {
            source: source.to_path_buf(),
            target: PathBuf::from(target),
        });
        self
    }

    /// The tool runs in the host's network namespace: a daemon that peers on other nodes reach
    /// (IMEX) must not live in this pod's, which goes with the pod.
    pub fn host_network(mut self) -> Self {
        self.host_network = true;
        self
    }

    /// The tool moves itself into these cgroups (their `cgroup.procs`, open for writing) before
    /// it runs, so it and its children leave this process's cgroup.
    pub fn join_cgroups(mut self, procs: Vec<OwnedFd>) -> Self {
        self.cgroup_procs = procs;
        self
    }

    /// The process to spawn. Everything the child does before `exec` is prepared here: it only
    /// makes system calls.
    pub fn build(self) -> Result<Command, ToolError> {
        let tool_name = self
            .tools
            .host
            .join(self.tool.strip_prefix("/").unwrap_or(&self.tool))
            .display()
            .to_string();
        let cstr = |path: &Path| {
            CString::new(path.as_os_str().as_bytes()).map_err(|_| ToolError::Unusable {
                tool: tool_name.clone(),
                reason: format!("path {} holds a NUL byte", path.display()),
            })
        };
        let root = self.tools.host.clone();
        let in_root = |path: &Path| root.join(path.strip_prefix("/").unwrap_or(path));
        let mut system_binds = Vec::new();
        if root != Path::new("/") {
            // A driver root of its own (GPU operator) may lack the kernel's file systems.
            for (name, marker) in [("proc", "self"), ("sys", "class"), ("dev", "null")] {
                let here = self.tools.here.join(name);
                if here.is_dir() && !here.join(marker).exists() {
                    system_binds.push((
                        cstr(&Path::new("/").join(name))?,
                        cstr(&in_root(Path::new(name)))?,
                    ));
                }
            }
        }
        let tmp = (!self.binds.is_empty())
            .then(|| cstr(&in_root(Path::new("/tmp"))))
            .transpose()?;
        let mut binds = Vec::new();
        for bind in &self.binds {
            let under_tmp = bind.target.starts_with("/tmp");
            binds.push((
                cstr(&bind.source)?,
                cstr(&in_root(&bind.target))?,
                under_tmp,
            ));
        }
        let root_c = cstr(&root)?;
        let host_mount_ns = self.tools.host_mount_ns.clone();
        let host_net_ns = if self.host_network {
            self.tools.host_net_ns.clone()
        } else {
            None
        };
        let cgroup_procs = self.cgroup_procs;

        let mut command = Command::new(&self.tool);
        command
            .args(&self.args)
            .env_clear()
            .env("PATH", TOOL_PATH)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // SAFETY: the closure runs between fork and exec and only makes system calls on data
        // prepared above; it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                use rustix::mount::{MountFlags, MountPropagationFlags};
                for procs in &cgroup_procs {
                    rustix::io::write(procs, b"0")?;
                }
                if let Some(ns) = &host_net_ns {
                    rustix::thread::move_into_link_name_space(
                        ns.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )?;
                }
                if let Some(ns) = &host_mount_ns {
                    rustix::thread::move_into_link_name_space(
                        ns.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Mount),
                    )?;
                }
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
                rustix::mount::mount_change(
                    c"/",
                    MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC,
                )?;
                for (source, target) in &system_binds {
                    rustix::mount::mount_bind_recursive(source.as_c_str(), target.as_c_str())?;
                }
                if let Some(tmp) = &tmp {
                    rustix::mount::mount(
                        c"tmpfs",
                        tmp.as_c_str(),
                        c"tmpfs",
                        MountFlags::NOSUID | MountFlags::NODEV,
                        c"mode=1777,size=1m",
                    )?;
                }
                for (source, target, under_tmp) in &binds {
                    if *under_tmp {
                        match rustix::fs::mkdir(
                            target.as_c_str(),
                            rustix::fs::Mode::from_raw_mode(0o755),
                        ) {
                            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    rustix::mount::mount_bind(source.as_c_str(), target.as_c_str())?;
                }
                rustix::process::chroot(root_c.as_c_str())?;
                rustix::process::chdir(c"/")?;
                Ok(())
            });
        }
        Ok(command)
    }
}

/// The driver's `nvidia-smi`, for what NVML cannot set (the time-slice interval).
#[derive(Debug, Clone)]
pub struct NvidiaSmi {
    tools: DriverRootTools,
    /// Inside the driver root.
    path: PathBuf,
    sim_state: Option<SimStateFile>,
    /// Why it cannot run here (see [`DriverRootTools::check`]), found at start: only the claims
    /// that need it are refused, with this reason.
    unusable: Option<String>,
}

/// Simulated GPUs' state file, for a fake tool in the driver root: its folder is bound at
/// `/tmp/gpu-dra-sim` there and `GPU_DRA_SIM_STATE` names the file in it.
#[derive(Debug, Clone)]
pub struct SimStateFile {
    /// The folder, on the host.
    dir: PathBuf,
    name: OsString,
}

impl SimStateFile {
    pub fn new(path: &Path) -> Option<Self> {
        Some(Self {
            dir: path.parent()?.to_path_buf(),
            name: path.file_name()?.to_os_string(),
        })
    }

    /// `command`, with the state file where a fake tool finds it.
    pub fn give_to(&self, command: ToolCommand) -> ToolCommand {
        command
            .bind(&self.dir, SIM_DIR)
            .env("GPU_DRA_SIM_STATE", Path::new(SIM_DIR).join(&self.name))
    }
}

/// Where the driver root keeps `nvidia-smi`.
const NVIDIA_SMI_PATHS: &[&str] = &["usr/bin/nvidia-smi", "bin/nvidia-smi"];
/// Where fake tools find the simulated GPUs' state folder, in the driver root.
const SIM_DIR: &str = "/tmp/gpu-dra-sim";

impl NvidiaSmi {
    /// The driver root's `nvidia-smi`, if it has one.
    pub fn find(tools: &DriverRootTools) -> Option<Self> {
        Some(Self {
            path: tools.find(NVIDIA_SMI_PATHS)?,
            tools: tools.clone(),
            sim_state: None,
            unusable: None,
        })
    }

    /// Checks it (see [`check`](Self::check)) and keeps the reason if it cannot run here.
    pub fn checked(mut self) -> Self {
        self.unusable = self.check().err().map(|e| e.to_string());
        self
    }

    /// Why it cannot run here, as found by [`checked`](Self::checked).
    pub fn unusable(&self) -> Option<&str> {
        self.unusable.as_deref()
    }

    /// Simulated GPUs: `nvidia-smi` works on this state file.
    pub fn on_simulated_gpus(mut self, state_file: Option<&Path>) -> Self {
        self.sim_state = state_file.and_then(SimStateFile::new);
        self
    }

    /// Whether it loads in the driver root (see [`DriverRootTools::check`]).
    pub fn check(&self) -> Result<(), ToolError> {
        self.tools.check(&self.path)
    }

    /// `nvidia-smi compute-policy -i <uuid> --set-timeslice <n>`, as NVIDIA's driver does; the
    /// reason when it fails.
    pub fn set_timeslice(&self, uuid: &str, timeslice: u32) -> Result<(), String> {
        if let Some(reason) = &self.unusable {
            return Err(reason.clone());
        }
        let mut command = self
            .tools
            .command(&self.path)
            .args(["compute-policy", "-i", uuid, "--set-timeslice"])
            .arg(timeslice.to_string());
        if let Some(state) = &self.sim_state {
            command = state.give_to(command);
        }
        let shown = self
            .tools
            .host
            .join(self.path.strip_prefix("/").unwrap_or(&self.path));
        let mut command = command.build().map_err(|e| e.to_string())?;
        let output = tool_output(&mut command).map_err(|e| {
            format!(
                "cannot run {} chrooted into the driver root: {e}",
                shown.display()
            )
        })?;
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stderr);
        let said = if said.trim().is_empty() {
            String::from_utf8_lossy(&output.stdout)
        } else {
            said
        };
        Err(format!(
            "{} exited with {}: {}",
            shown.display(),
            output.status,
            said.trim()
        ))
    }
}
