//! MPS control daemons: one per claim that asks for sharing strategy `MPS`, run from the driver
//! root's `nvidia-cuda-mps-control` as NVIDIA's driver runs it (same commands, chrooted into the
//! driver root, the pipe folder at `/tmp/nvidia-mps` on both sides, same container edits), but
//! as a host process rather than a Deployment: the daemon runs in the host's mount namespace and
//! in a cgroup of its own (`gpu-dra-mps/<name>`, see `cgroup`), so it outlives the driver's
//! container (upgrade, crash, OOM kill) and its memory is not the driver's. Its processes are
//! found by that cgroup.
//!
//! Everything a daemon owns is under one folder named after the claim UID,
//! `<state dir>/mps/<claimUID>/{pipe,log,shm}` (`shm` a size-limited tmpfs; an older driver named
//! it by a 12-digit digest with the UID in an `owner` file under a long kubelet folder, which
//! chrooted daemons no longer need), so whatever a crash leaves is found from the checkpoint's
//! claim UID alone, or by listing the folder: no step needs a
//! record written after the fact. The daemon is stopped through its pipe folder (`quit`), and any
//! process left in its cgroup (or, from an older driver, naming that folder in its environment)
//! is killed.
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cdi::{ContainerEdits, Mount};
use super::cgroup::{HostCgroups, unescape_mount_path};
use crate::gpu::driver_tools::{DriverRootTools, SimStateFile, ToolCommand, spawn_tool};

/// Where a claim's containers, and its daemon in the driver root, find the daemon's pipes
/// (`CUDA_MPS_PIPE_DIRECTORY`).
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// Where the daemon writes its logs, in the driver root.
const DAEMON_LOG_DIR: &str = "/tmp/nvidia-mps-log";
/// Set in the daemon's environment: its folder on the host (tests and people find it by this).
pub const FOLDER_ENV: &str = "GPU_DRA_MPS_FOLDER";
/// The control binary, under the driver root.
pub const CONTROL_PATHS: &[&str] = &[
    "usr/bin/nvidia-cuda-mps-control",
    "bin/nvidia-cuda-mps-control",
];
/// In a daemon folder named by digest: the claim UID (or shared key) it belongs to.
const OWNER_FILE: &str = "owner";
/// How long a daemon may take to come up or to go away.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one control command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
#[error("MPS control daemon of claim {claim_uid}: {reason}")]
pub struct MpsError {
    pub claim_uid: String,
    pub reason: String,
}

/// What one claim's daemon is started with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonSpec {
    /// The claim's MPS devices (GPU or MIG UUIDs): the daemon's `CUDA_VISIBLE_DEVICES`.
    pub uuids: Vec<String>,
    pub active_thread_percentage: Option<i64>,
    /// Device UUID → limit in MPS's form (`<N>M`).
    pub pinned_limits: BTreeMap<String, String>,
    pub multi_user: bool,
}

/// Starts, checks and stops the claims' daemons.
#[derive(Debug, Clone)]
pub struct MpsDaemons {
    tools: DriverRootTools,
    /// `nvidia-cuda-mps-control`, inside the driver root.
    control: PathBuf,
    root: PathBuf,
    shm_size: String,
    /// The host's cgroups the daemons run in, or why there are none.
    cgroups: Result<HostCgroups, String>,
    sim_state: Option<SimStateFile>,
}

impl MpsDaemons {
    /// `control` is the driver root's `nvidia-cuda-mps-control` (a path inside it); `root` the
    /// folder for the daemons' folders (the same path on the host, where containers' mounts
    /// come from).
    pub fn new(tools: DriverRootTools, control: PathBuf, root: PathBuf) -> Self {
        Self {
            tools,
            control,
            root,
            shm_size: default_shm_size(),
            cgroups: HostCgroups::discover().map_err(|e| e.to_string()),
            sim_state: None,
        }
    }

    /// Simulated GPUs: the daemons run on (and record themselves in) this state file.
    pub fn on_simulated_gpus(mut self, state_file: Option<PathBuf>) -> Self {
        self.sim_state = state_file.as_deref().and_then(SimStateFile::new);
        self
    }

    /// Whether the daemons can run here: the control binary loads in the driver root, and the
    /// host's cgroups are there to hold them.
    pub fn check_tools(&self) -> Result<(), MpsError> {
        self.tools
            .check(&self.control)
            .map_err(|e| Self::err("*", e.to_string()))?;
        self.cgroups
            .as_ref()
            .map(|_| ())
            .map_err(|reason| Self::err("*", reason.clone()))
    }

    /// The daemon's cgroup: named after its folder's path, so it is found again from the folder.
    fn cgroup_name(&self, uid: &str) -> String {
        short_name(&self.dir(uid).to_string_lossy())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The claim's daemon folder, named after it. The daemon sees its pipe folder at
    /// `/tmp/nvidia-mps` in the driver root whatever this folder's path, so its sockets always
    /// fit a unix socket address. A folder an older driver named by a digest of the UID (under a
    /// long kubelet folder) is kept while it exists.
    pub fn dir(&self, uid: &str) -> PathBuf {
        let named = self.root.join(uid);
        if !named.exists() {
            let digest = self.root.join(short_name(uid));
            if digest.exists() {
                return digest;
            }
        }
        named
    }

    pub fn pipe_dir(&self, uid: &str) -> PathBuf {
        self.dir(uid).join("pipe")
    }

    pub fn log_dir(&self, uid: &str) -> PathBuf {
        self.dir(uid).join("log")
    }

    pub fn shm_dir(&self, uid: &str) -> PathBuf {
        self.dir(uid).join("shm")
    }

    fn err(uid: &str, reason: impl Into<String>) -> MpsError {
        MpsError {
            claim_uid: uid.to_string(),
            reason: reason.into(),
        }
    }

    /// Starts the claim's daemon with its settings and returns once it answers. A daemon that
    /// already answers for the claim is kept (an earlier start that was not recorded).
    pub fn start(&self, uid: &str, spec: &DaemonSpec) -> Result<(), MpsError> {
        let io = |what: &str, path: &Path, e: std::io::Error| {
            Self::err(uid, format!("cannot {what} {}: {e}", path.display()))
        };
        for dir in [self.pipe_dir(uid), self.log_dir(uid), self.shm_dir(uid)] {
            std::fs::create_dir_all(&dir).map_err(|e| io("create", &dir, e))?;
        }
        let dir = self.dir(uid);
        if dir.file_name() != Some(std::ffi::OsStr::new(uid)) {
            let owner = dir.join(OWNER_FILE);
            std::fs::write(&owner, uid).map_err(|e| io("write", &owner, e))?;
        }
        let shm = self.shm_dir(uid);
        if !is_mount_point(&shm) {
            let options = CString::new(format!("size={}", self.shm_size))
                .map_err(|e| Self::err(uid, e.to_string()))?;
            use rustix::mount::MountFlags;
            rustix::mount::mount(
                "shm",
                &shm,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RELATIME,
                options.as_c_str(),
            )
            .map_err(|e| io("mount a tmpfs on", &shm, e.into()))?;
        }
        super::failpoint::failpoint("prepare-mps-shm-mounted");
        if !self.answers(uid) {
            let cgroups = self
                .cgroups
                .as_ref()
                .map_err(|reason| Self::err(uid, reason.clone()))?;
            let procs = cgroups
                .create(&self.cgroup_name(uid))
                .map_err(|e| Self::err(uid, e.to_string()))?;
            let mut command = self.command(uid, &spec.uuids).arg("-d");
            if spec.multi_user {
                command = command.arg("-M");
            }
            let mut command = command
                .join_cgroups(procs)
                .build()
                .map_err(|e| Self::err(uid, e.to_string()))?;
            // The daemon keeps no handle of ours: it must not hold this driver's pipes or
            // sockets open after it detaches.
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let status = wait_for(&mut command, DAEMON_TIMEOUT)
                .map_err(|reason| Self::err(uid, format!("`-d`: {reason}")))?;
            if !status.success() {
                return Err(Self::err(
                    uid,
                    format!(
                        "`{} -d` (chrooted into {}) exited with {status}; see {}",
                        self.control.display(),
                        self.tools.host_root().display(),
                        self.log_dir(uid).join("control.log").display()
                    ),
                ));
            }
        }
        super::failpoint::failpoint("prepare-mps-started");
        let mut commands = Vec::new();
        if let Some(percentage) = spec.active_thread_percentage {
            commands.push(format!("set_default_active_thread_percentage {percentage}"));
        }
        for (uuid, limit) in &spec.pinned_limits {
            commands.push(format!(
                "set_default_device_pinned_mem_limit {uuid} {limit}"
            ));
        }
        for command in commands {
            self.ask(uid, &spec.uuids, &command)
                .map_err(|reason| Self::err(uid, format!("`{command}`: {reason}")))?;
        }
        let deadline = Instant::now() + DAEMON_TIMEOUT;
        let mut pause = Pause::new();
        while !self.answers(uid) {
            if Instant::now() > deadline {
                return Err(Self::err(uid, "started, but does not answer"));
            }
            pause.sleep();
        }
        tracing::info!(claimUID = %uid, devices = ?spec.uuids, threads = ?spec.active_thread_percentage, pinned = ?spec.pinned_limits, multi_user = spec.multi_user, "MPS control daemon running");
        Ok(())
    }

    /// Whether the claim's daemon answers a control command.
    pub fn answers(&self, uid: &str) -> bool {
        self.pipe_dir(uid).exists() && self.ask(uid, &[], "get_server_list").is_ok()
    }

    /// Stops the claim's daemon (and its servers), unmounts its shm and removes its folder.
    /// Returns whether there was anything to stop.
    pub fn stop(&self, uid: &str) -> Result<bool, MpsError> {
        let dir = self.dir(uid);
        if !dir.exists() {
            // An empty cgroup a crash left between its folder's removal and its own.
            if let Ok(cgroups) = &self.cgroups {
                cgroups
                    .remove(&self.cgroup_name(uid))
                    .map_err(|e| Self::err(uid, e.to_string()))?;
            }
            return Ok(false);
        }
        let pipe = self.pipe_dir(uid);
        if self.answers(uid)
            && let Err(reason) = self.ask(uid, &[], "quit")
        {
            tracing::warn!(claimUID = %uid, %reason, "MPS control daemon did not take `quit`; its processes are killed");
        }
        let mut deadline = Instant::now() + DAEMON_TIMEOUT;
        let mut killed = false;
        let mut pause = Pause::new();
        loop {
            let left = self.processes(uid, &pipe);
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                if killed {
                    return Err(Self::err(
                        uid,
                        format!("processes {left:?} survive SIGKILL"),
                    ));
                }
                for pid in &left {
                    if let Some(pid) = rustix::process::Pid::from_raw(*pid) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
                tracing::warn!(claimUID = %uid, pids = ?left, "MPS processes did not stop: killed");
                killed = true;
                deadline = Instant::now() + Duration::from_secs(5);
            }
            pause.sleep();
        }
        let shm = self.shm_dir(uid);
        for _ in 0..8 {
            if !is_mount_point(&shm) {
                break;
            }
            rustix::mount::unmount(&shm, rustix::mount::UnmountFlags::DETACH)
                .map_err(|e| Self::err(uid, format!("cannot unmount {}: {e}", shm.display())))?;
        }
        if let Ok(cgroups) = &self.cgroups {
            cgroups
                .remove(&self.cgroup_name(uid))
                .map_err(|e| Self::err(uid, e.to_string()))?;
        }
        std::fs::remove_dir_all(&dir)
            .map_err(|e| Self::err(uid, format!("cannot remove {}: {e}", dir.display())))?;
        tracing::info!(claimUID = %uid, "MPS control daemon stopped");
        Ok(true)
    }

    /// The claims that have a daemon folder.
    pub fn claim_uids(&self) -> Result<Vec<String>, MpsError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => {
                return Err(Self::err(
                    "*",
                    format!("cannot list {}: {e}", self.root.display()),
                ));
            }
        };
        let mut uids: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| {
                // A folder named by digest says whose it is (one a crash left before that
                // stays known by its name, and is stopped as nobody's).
                std::fs::read_to_string(e.path().join(OWNER_FILE))
                    .ok()
                    .or_else(|| e.file_name().into_string().ok())
            })
            .collect();
        uids.sort();
        Ok(uids)
    }

    /// The daemon folders whose shm is still mounted: made in this boot (mounts end with it).
    pub fn live_claim_uids(&self) -> Result<Vec<String>, MpsError> {
        Ok(self
            .claim_uids()?
            .into_iter()
            .filter(|uid| is_mount_point(&self.shm_dir(uid)))
            .collect())
    }

    /// What the claim's containers get: the pipe folder at `CUDA_MPS_PIPE_DIRECTORY` and the
    /// daemon's shm at `/dev/shm`, as NVIDIA's driver gives them.
    pub fn container_edits(&self, uid: &str) -> ContainerEdits {
        let bind = |host: PathBuf, container: &str| Mount {
            host_path: host.to_string_lossy().into_owned(),
            container_path: container.into(),
            options: ["rw", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
        };
        ContainerEdits {
            env: vec![format!("CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}")],
            mounts: vec![
                bind(self.pipe_dir(uid), CONTAINER_PIPE_DIR),
                bind(self.shm_dir(uid), "/dev/shm"),
            ],
            ..ContainerEdits::default()
        }
    }

    /// The daemon's processes: those in its cgroup, and any that names its folder in its
    /// environment (a daemon an older driver started outside a cgroup of ours).
    fn processes(&self, uid: &str, pipe: &Path) -> Vec<i32> {
        let mut pids = match &self.cgroups {
            Ok(cgroups) => cgroups.pids(&self.cgroup_name(uid)),
            Err(_) => Vec::new(),
        };
        pids.extend(processes_using(&self.dir(uid), pipe));
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// A run of the control binary for the claim's daemon: chrooted into the driver root, with
    /// the daemon's folders bound where NVIDIA's driver puts them.
    fn command(&self, uid: &str, uuids: &[String]) -> ToolCommand {
        let mut command = self
            .tools
            .command(&self.control)
            .env("CUDA_MPS_PIPE_DIRECTORY", CONTAINER_PIPE_DIR)
            .env("CUDA_MPS_LOG_DIRECTORY", DAEMON_LOG_DIR)
            .env(FOLDER_ENV, self.dir(uid))
            .bind(&self.pipe_dir(uid), CONTAINER_PIPE_DIR)
            .bind(&self.log_dir(uid), DAEMON_LOG_DIR)
            .bind(&self.shm_dir(uid), "/dev/shm");
        if let Some(state) = &self.sim_state {
            command = state.give_to(command);
        }
        if !uuids.is_empty() {
            command = command.env("CUDA_VISIBLE_DEVICES", uuids.join(","));
        }
        command
    }

    /// Sends one control command; its answer, or why it failed.
    fn ask(&self, uid: &str, uuids: &[String], line: &str) -> Result<String, String> {
        let mut command = self
            .command(uid, uuids)
            .build()
            .map_err(|e| e.to_string())?;
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_tool(&mut command).map_err(|e| {
            format!(
                "cannot run {} chrooted into {}: {e}",
                self.control.display(),
                self.tools.host_root().display()
            )
        })?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(format!("{line}\n").as_bytes());
        }
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let mut pause = Pause::new();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => pause.sleep(),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("no answer within {COMMAND_TIMEOUT:?}"));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if output.status.success() {
            Ok(stdout)
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
            Err(format!(
                "exited with {}: {}",
                output.status,
                if stderr.is_empty() { stdout } else { stderr }
            ))
        }
    }
}

/// Polling that answers fast when the wait is short (a control command takes milliseconds) and
/// costs little when it is long: 200 µs, doubling up to 20 ms.
struct Pause(Duration);

impl Pause {
    fn new() -> Self {
        Self(Duration::from_micros(200))
    }

    fn sleep(&mut self) {
        std::thread::sleep(self.0);
        self.0 = (self.0 * 2).min(Duration::from_millis(20));
    }
}

/// Runs a command that must finish on its own (it daemonizes), killing it after `timeout`.
fn wait_for(command: &mut Command, timeout: Duration) -> Result<std::process::ExitStatus, String> {
    let mut child = spawn_tool(command).map_err(|e| format!("cannot run: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut pause = Pause::new();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => pause.sleep(),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not return within {timeout:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Processes whose environment names the daemon folder `dir` (ours) or `pipe` as their MPS pipe
/// folder (an older driver's): the control daemon and the servers it started.
fn processes_using(dir: &Path, pipe: &Path) -> Vec<i32> {
    let entry = |key: &str, path: &Path| {
        let mut entry = format!("{key}=").into_bytes();
        entry.extend_from_slice(path.as_os_str().as_encoded_bytes());
        entry
    };
    let ours = entry(FOLDER_ENV, dir);
    let older = entry("CUDA_MPS_PIPE_DIRECTORY", pipe);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let me = std::process::id() as i32;
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        // MPS's processes (control daemon and servers) are all `nvidia-cuda-mps-*`: reading one
        // small file per process first keeps the environment reads to those.
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.starts_with(b"nvidia-cuda-mps"))
        })
        .filter(|pid| {
            // A process that exits meanwhile, or a zombie (empty environment), is not running.
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|e| e == ours.as_slice() || e == older.as_slice())
            })
        })
        .collect()
}

/// Whether `path` is a mount point (in this process's mount namespace).
/// 12 hex digits: a daemon's cgroup (a name-based UUID of its folder's path), and the folder of
/// an older driver's daemon under a long kubelet folder (of the claim UID or shared key).
fn short_name(uid: &str) -> String {
    let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, uid.as_bytes());
    id.simple().to_string()[..12].to_string()
}

fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mount_point| unescape_mount_path(mount_point) == wanted)
}

/// Half the node's memory, as NVIDIA's driver sizes the MPS shm (64 MiB when unknown).
fn default_shm_size() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{}k", kib / 2))
        })
        .unwrap_or_else(|| "65536k".into())
}

/// MPS's form of a pinned-memory limit: whole MiB, `<N>M`.
pub fn megabytes(bytes: u64) -> String {
    format!("{}M", bytes / (1024 * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_whole_mebibytes() {
        assert_eq!(megabytes(10 << 30), "10240M");
        assert_eq!(megabytes((1 << 20) + 5), "1M");
    }

    #[test]
    fn containers_get_the_pipe_and_shm_of_their_claim() {
        let tools = DriverRootTools::new(Path::new("/"), Path::new("/"));
        let daemons = MpsDaemons::new(tools, "/bin/false".into(), "/var/lib/x/mps".into());
        let edits = daemons.container_edits("uid-1");
        assert_eq!(edits.env, ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]);
        assert_eq!(edits.mounts[0].host_path, "/var/lib/x/mps/uid-1/pipe");
        assert_eq!(edits.mounts[0].container_path, "/tmp/nvidia-mps");
        assert_eq!(edits.mounts[1].host_path, "/var/lib/x/mps/uid-1/shm");
        assert_eq!(edits.mounts[1].container_path, "/dev/shm");
    }
}
