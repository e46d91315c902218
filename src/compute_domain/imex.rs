//! The IMEX daemons this node runs, one per ComputeDomain it serves: NVIDIA's `nvidia-imex`
//! from the driver root, chrooted into it, in the host's network namespace and a cgroup of its
//! own, so it outlives the plugin's container and is found again after a restart. Its config
//! and node file live in the domain's folder, bound at [`CONFIG_DIR`] in the chroot.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::credentials::DomainCredentials;
use crate::gpu::driver_tools::{DriverRootTools, ToolCommand, spawn_tool, tool_output};
use crate::prepare::cgroup::HostCgroups;

/// Nodes one IMEX domain holds (NVIDIA's `maxNodesPerIMEXDomain` default: an NVL72 rack's 18
/// compute trays); its node file names all of them.
pub const MAX_NODES: i64 = 18;

/// NVIDIA's name of the clique's node with this index.
pub fn node_name(index: i64) -> String {
    format!("compute-domain-daemon-{index:04}")
}

/// Where the daemon and `nvidia-imex-ctl` see the domain's folder.
pub const CONFIG_DIR: &str = "/tmp/nvidia-imex";
/// NVIDIA's port for peers (`SERVER_PORT`).
pub const SERVER_PORT: u16 = 50000;
/// Where the daemon takes commands (`IMEX_CMD_UNIX_DOMAIN_PATH`): no port, so nothing off the
/// node can ask it anything.
pub const COMMAND_SOCKET: &str = "/tmp/nvidia-imex/cmd.sock";
const DAEMON_CANDIDATES: &[&str] = &["usr/bin/nvidia-imex", "usr/sbin/nvidia-imex"];
const CTL_CANDIDATES: &[&str] = &["usr/bin/nvidia-imex-ctl", "usr/sbin/nvidia-imex-ctl"];
/// [`ImexDaemons::err`]'s name for the admin's daemon (host-managed IMEX).
const HOST: &str = "";
const START_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("{daemon}: {reason}")]
pub struct ImexError {
    /// Which daemon: a domain's, or the host's.
    pub daemon: String,
    pub reason: String,
}

pub struct ImexDaemons {
    tools: DriverRootTools,
    daemon: Option<PathBuf>,
    ctl: Option<PathBuf>,
    /// One folder per domain (UID); the same path on the host and here.
    root: PathBuf,
    cgroups: Result<HostCgroups, String>,
}

impl ImexDaemons {
    pub fn new(tools: DriverRootTools, root: PathBuf) -> Self {
        Self {
            daemon: tools.find(DAEMON_CANDIDATES),
            ctl: tools.find(CTL_CANDIDATES),
            tools,
            root,
            cgroups: HostCgroups::discover().map_err(|e| e.to_string()),
        }
    }

    fn err(domain: &str, reason: impl Into<String>) -> ImexError {
        ImexError {
            daemon: if domain == HOST {
                "the host's IMEX daemon".into()
            } else {
                format!("IMEX daemon of ComputeDomain {domain}")
            },
            reason: reason.into(),
        }
    }

    /// Whether this node can run IMEX daemons: the driver root has `nvidia-imex` and
    /// `nvidia-imex-ctl` and they load there, and the host's cgroups can hold the daemons.
    pub fn check(&self) -> Result<(), ImexError> {
        for (tool, candidates) in [
            (&self.daemon, DAEMON_CANDIDATES),
            (&self.ctl, CTL_CANDIDATES),
        ] {
            let tool = tool.as_ref().ok_or_else(|| {
                Self::err(
                    "*",
                    format!(
                        "the driver root {} has none of {candidates:?} (the nvidia-imex package)",
                        self.tools.host_root().display()
                    ),
                )
            })?;
            self.tools
                .check(tool)
                .map_err(|e| Self::err("*", e.to_string()))?;
        }
        self.cgroups
            .as_ref()
            .map(|_| ())
            .map_err(|reason| Self::err("*", reason.clone()))
    }

    pub fn dir(&self, domain: &str) -> PathBuf {
        self.root.join(domain)
    }

    fn cgroup_name(&self, domain: &str) -> String {
        let id = uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            self.dir(domain).to_string_lossy().as_bytes(),
        );
        format!("imex-{}", &id.simple().to_string()[..12])
    }

    /// The domains with a folder here (a daemon, or what a crash left).
    pub fn domains(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return vec![];
        };
        let mut domains: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        domains.sort();
        domains
    }

    /// The daemon's processes.
    pub fn pids(&self, domain: &str) -> Vec<i32> {
        match &self.cgroups {
            Ok(cgroups) => cgroups.pids(&self.cgroup_name(domain)),
            Err(_) => vec![],
        }
    }

    /// Writes what a daemon reads once, when it starts: its config (with `bind_ip`, mutual TLS
    /// with the domain's `credentials`, and commands on a unix socket in the domain's folder
    /// only) and the credentials' files, readable by root alone.
    fn write_start_files(
        &self,
        domain: &str,
        bind_ip: &str,
        credentials: &DomainCredentials,
    ) -> Result<(), ImexError> {
        if bind_ip.parse::<std::net::IpAddr>().is_err() {
            return Err(Self::err(
                domain,
                format!("this node's address {bind_ip:?} is not an IP address"),
            ));
        }
        let dir = self.dir(domain);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Self::err(domain, format!("cannot create {}: {e}", dir.display())))?;
        for (name, text) in credentials.files() {
            let path = dir.join(name);
            crate::fsutil::write_atomically(&path, text.as_bytes())
                .map_err(|e| Self::err(domain, format!("cannot write {}: {e}", path.display())))?;
        }
        let path = dir.join("config.cfg");
        crate::fsutil::write_atomically(&path, config_file(bind_ip).as_bytes())
            .map_err(|e| Self::err(domain, format!("cannot write {}: {e}", path.display())))
    }

    /// Writes the daemon's node file (NVIDIA's static names, one per possible node of the
    /// clique) and its hosts file (the names of the clique's nodes so far → their addresses;
    /// bound as the daemon's `/etc/hosts`). Returns whether the hosts file changed.
    fn write_config(&self, domain: &str, peers: &[(i64, String)]) -> Result<bool, ImexError> {
        let dir = self.dir(domain);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Self::err(domain, format!("cannot create {}: {e}", dir.display())))?;
        let unchanged =
            |path: &Path, text: &str| std::fs::read_to_string(path).is_ok_and(|old| old == text);
        let io = |path: &Path, e: std::io::Error| {
            Self::err(domain, format!("cannot write {}: {e}", path.display()))
        };
        let nodes: String = (0..MAX_NODES)
            .map(|i| format!("{}\n", node_name(i)))
            .collect();
        let path = dir.join("nodes_config.cfg");
        if !unchanged(&path, &nodes) {
            crate::fsutil::write_atomically(&path, nodes.as_bytes()).map_err(|e| io(&path, e))?;
        }
        // Addresses come from the domain's status, which other nodes write: an entry whose
        // address is not an IP address (a newline would add hosts entries of its writer's
        // choosing) is left out, and the other peers are served.
        let mut hosts = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost\n");
        for (index, ip) in peers {
            if ip.parse::<std::net::IpAddr>().is_err() {
                tracing::warn!(
                    domain,
                    node = %node_name(*index),
                    address = ?ip,
                    "the ComputeDomain's status.nodes gives this node an address that is not an IP address: left out of the daemon's hosts"
                );
                continue;
            }
            if !(0..MAX_NODES).contains(index) {
                return Err(Self::err(
                    domain,
                    format!(
                        "node {ip} has index {index}: an IMEX domain holds {MAX_NODES} nodes ({} to {})",
                        node_name(0),
                        node_name(MAX_NODES - 1)
                    ),
                ));
            }
            hosts.push_str(&format!("{ip}\t{}\n", node_name(*index)));
        }
        let path = dir.join("hosts");
        if unchanged(&path, &hosts) {
            return Ok(false);
        }
        // Rewritten in place: the daemon's /etc/hosts is a bind of this very file.
        std::fs::write(&path, hosts).map_err(|e| io(&path, e))?;
        Ok(true)
    }

    fn command(&self, domain: &str, tool: &Path) -> ToolCommand {
        self.tools
            .command(tool)
            .bind(&self.dir(domain), CONFIG_DIR)
            .bind(&self.dir(domain).join("hosts"), "/etc/hosts")
            .host_network()
    }

    /// Makes the domain's daemon run with `peers` (index and address of each node of the clique
    /// in the domain, this one's among them): starts it, or, when they changed, tells a running
    /// one to resolve its peers' names again and reconnect (SIGUSR1, NVIDIA's way: the node file
    /// never changes, the names' addresses do).
    ///
    /// `credentials` are needed only to start one (a running daemon read its files already).
    pub fn ensure(
        &self,
        domain: &str,
        bind_ip: &str,
        peers: &[(i64, String)],
        credentials: Option<&DomainCredentials>,
    ) -> Result<(), ImexError> {
        let changed = self.write_config(domain, peers)?;
        let running = self.pids(domain);
        if !running.is_empty() {
            if changed {
                for pid in &running {
                    signal(*pid, rustix::process::Signal::USR1);
                }
                tracing::info!(
                    domain,
                    ?peers,
                    "IMEX daemon told to read its node file again"
                );
            }
            return Ok(());
        }
        let daemon = self
            .daemon
            .as_ref()
            .ok_or_else(|| Self::err(domain, "the driver root has no nvidia-imex"))?;
        let credentials = credentials
            .ok_or_else(|| Self::err(domain, "no IMEX credentials to start the daemon with"))?;
        self.write_start_files(domain, bind_ip, credentials)?;
        let cgroups = self
            .cgroups
            .as_ref()
            .map_err(|reason| Self::err(domain, reason.clone()))?;
        let procs = cgroups
            .create(&self.cgroup_name(domain))
            .map_err(|e| Self::err(domain, e.to_string()))?;
        let mut command = self
            .command(domain, daemon)
            .arg("-c")
            .arg(format!("{CONFIG_DIR}/config.cfg"))
            .join_cgroups(procs)
            .build()
            .map_err(|e| Self::err(domain, e.to_string()))?;
        // Nothing of ours stays open in the daemon once it detaches (DAEMONIZE=1): what the
        // launcher says goes to a file in the domain's folder, read when it fails.
        let said_path = self.dir(domain).join("launch.log");
        let said = std::fs::File::create(&said_path).map_err(|e| {
            Self::err(
                domain,
                format!("cannot create {}: {e}", said_path.display()),
            )
        })?;
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(said);
        let mut child = spawn_tool(&mut command)
            .map_err(|e| Self::err(domain, format!("cannot run {}: {e}", daemon.display())))?;
        let deadline = Instant::now() + START_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Self::err(
                        domain,
                        format!("nvidia-imex did not detach within {START_TIMEOUT:?}"),
                    ));
                }
            }
        };
        if !status.success() {
            let said = std::fs::read_to_string(&said_path).unwrap_or_default();
            return Err(Self::err(
                domain,
                format!("nvidia-imex exited with {status}: {}", said.trim()),
            ));
        }
        tracing::info!(domain, bind_ip, ?peers, pids = ?self.pids(domain), "IMEX daemon started");
        Ok(())
    }

    /// `nvidia-imex-ctl -q`: whether the daemon is ready (connected to its peers).
    pub fn ready(&self, domain: &str) -> Result<bool, ImexError> {
        let ctl = self
            .ctl
            .as_ref()
            .ok_or_else(|| Self::err(domain, "the driver root has no nvidia-imex-ctl"))?;
        // A daemon started by an older gpu-dra (its config has no command socket) answers on
        // its command port, as that config says.
        let config =
            std::fs::read_to_string(self.dir(domain).join("config.cfg")).unwrap_or_default();
        let ask = if config.contains(&format!("IMEX_CMD_UNIX_DOMAIN_PATH={COMMAND_SOCKET}")) {
            vec!["-q".to_string(), format!("--u={COMMAND_SOCKET}")]
        } else {
            vec![
                "-c".to_string(),
                format!("{CONFIG_DIR}/config.cfg"),
                "-q".to_string(),
            ]
        };
        let mut command = self
            .command(domain, ctl)
            .args(ask)
            .build()
            .map_err(|e| Self::err(domain, e.to_string()))?;
        let output = tool_output(&mut command)
            .map_err(|e| Self::err(domain, format!("cannot run nvidia-imex-ctl: {e}")))?;
        Ok(output.status.success() && String::from_utf8_lossy(&output.stdout).trim() == "READY")
    }

    /// Host-managed IMEX: whether the admin's daemon answers READY on its command socket
    /// (`nvidia-imex-ctl -q --u=SOCKET`, as NVIDIA's plugin asks), the reason when not. The
    /// socket's folder is bound into the chroot, so it may live outside the driver root.
    pub fn host_ready(&self, socket: &Path) -> Result<(), ImexError> {
        let ctl = self
            .ctl
            .as_ref()
            .ok_or_else(|| Self::err(HOST, "the driver root has no nvidia-imex-ctl"))?;
        let (Some(folder), Some(file)) = (socket.parent(), socket.file_name()) else {
            return Err(Self::err(
                HOST,
                format!("{} is not a socket path", socket.display()),
            ));
        };
        let inside = format!("/tmp/nvidia-imex-host/{}", file.to_string_lossy());
        let mut command = self
            .tools
            .command(ctl)
            .bind(folder, "/tmp/nvidia-imex-host")
            .args(["-q".to_string(), format!("--u={inside}")])
            .build()
            .map_err(|e| Self::err(HOST, e.to_string()))?;
        let output = tool_output(&mut command)
            .map_err(|e| Self::err(HOST, format!("cannot run nvidia-imex-ctl: {e}")))?;
        let said = String::from_utf8_lossy(&output.stdout).trim().to_string();
        if output.status.success() && said == "READY" {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&output.stderr).trim().to_string();
        Err(Self::err(
            HOST,
            format!(
                "not ready on {}: {}",
                socket.display(),
                if said.is_empty() { err } else { said }
            ),
        ))
    }

    /// Stops the domain's daemon and removes its folder and cgroup; returns whether a daemon ran.
    pub fn stop(&self, domain: &str) -> Result<bool, ImexError> {
        let mut pids = self.pids(domain);
        let ran = !pids.is_empty();
        for pid in &pids {
            signal(*pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while !pids.is_empty() {
            if Instant::now() > deadline {
                for pid in &pids {
                    signal(*pid, rustix::process::Signal::KILL);
                }
                tracing::warn!(domain, ?pids, "IMEX daemon did not stop on SIGTERM: killed");
                std::thread::sleep(Duration::from_millis(200));
                pids = self.pids(domain);
                if !pids.is_empty() {
                    return Err(Self::err(
                        domain,
                        format!("processes {pids:?} survive SIGKILL"),
                    ));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            pids = self.pids(domain);
        }
        if let Ok(cgroups) = &self.cgroups {
            cgroups
                .remove(&self.cgroup_name(domain))
                .map_err(|e| Self::err(domain, e.to_string()))?;
        }
        let dir = self.dir(domain);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Self::err(
                    domain,
                    format!("cannot remove {}: {e}", dir.display()),
                ));
            }
        }
        if ran {
            tracing::info!(domain, "IMEX daemon stopped");
        }
        Ok(ran)
    }
}

fn signal(pid: i32, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// NVIDIA's IMEX config, as its ComputeDomain daemon writes it for this node's address, but
/// for who may talk to the daemon: peers only with the domain's certificate (NVIDIA's has
/// authentication off), commands only on a unix socket in the domain's folder (NVIDIA's listen
/// on a port).
fn config_file(bind_ip: &str) -> String {
    format!(
        "# Written by gpu-dra for one ComputeDomain.\n\
         LOG_LEVEL=4\n\
         LOG_FILE_NAME={CONFIG_DIR}/nvidia-imex.log\n\
         LOG_APPEND_TO_LOG=1\n\
         DAEMONIZE=1\n\
         BIND_INTERFACE_IP={bind_ip}\n\
         SERVER_PORT={SERVER_PORT}\n\
         IMEX_NODE_CONFIG_FILE={CONFIG_DIR}/nodes_config.cfg\n\
         IMEX_WAIT_FOR_QUORUM=RECOVERY\n\
         {}\
         IMEX_CMD_ENABLED=1\n\
         IMEX_CMD_UNIX_DOMAIN_PATH={COMMAND_SOCKET}\n\
         IMEX_NODE_DISCONNECTED_GRACE_TIME=-1\n",
        DomainCredentials::config_lines(CONFIG_DIR)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_file_is_static_and_the_hosts_file_maps_the_cliques_nodes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let daemons = ImexDaemons::new(
            DriverRootTools::new(dir.path(), dir.path()),
            dir.path().join("domains"),
        );
        let peers = vec![(0, "10.0.0.1".to_string()), (2, "10.0.0.3".to_string())];
        assert!(daemons.write_config("d1", &peers).expect("write"));
        let folder = daemons.dir("d1");
        let nodes = std::fs::read_to_string(folder.join("nodes_config.cfg")).expect("nodes");
        assert_eq!(nodes.lines().count(), MAX_NODES as usize);
        assert_eq!(nodes.lines().next(), Some("compute-domain-daemon-0000"));
        let hosts = std::fs::read_to_string(folder.join("hosts")).expect("hosts");
        assert!(
            hosts.contains("10.0.0.1\tcompute-domain-daemon-0000\n"),
            "{hosts}"
        );
        assert!(
            hosts.contains("10.0.0.3\tcompute-domain-daemon-0002\n"),
            "{hosts}"
        );
        // The same peers again: nothing to tell the daemon.
        assert!(!daemons.write_config("d1", &peers).expect("write"));
        // An index past the node file's names is refused, naming it.
        let error = daemons
            .write_config("d1", &[(18, "10.0.0.9".to_string())])
            .expect_err("index 18");
        assert!(error.to_string().contains("index 18"), "{error}");
        // An address that is not one (a newline would add hosts entries) is left out; the other
        // peers are kept.
        let mut injected = peers.clone();
        injected.push((
            1,
            "10.0.0.2\n6.6.6.6\tcompute-domain-daemon-0000".to_string(),
        ));
        assert!(
            !daemons.write_config("d1", &injected).expect("write"),
            "nothing changed"
        );
        let after = std::fs::read_to_string(folder.join("hosts")).expect("hosts");
        assert_eq!(after, hosts);
        assert!(!after.contains("6.6.6.6"), "{after}");
    }

    #[test]
    fn a_daemon_starts_with_mutual_tls_and_commands_on_a_socket_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("usr/bin")).expect("bin");
        let daemon = dir.path().join("usr/bin/nvidia-imex");
        std::fs::write(&daemon, "").expect("daemon");
        std::fs::set_permissions(&daemon, std::fs::Permissions::from_mode(0o755)).expect("mode");
        let daemons = ImexDaemons::new(
            DriverRootTools::new(dir.path(), dir.path()),
            dir.path().join("domains"),
        );
        let credentials = DomainCredentials::generate("d1").expect("credentials");
        daemons
            .write_start_files("d1", "10.0.0.1", &credentials)
            .expect("write");
        let folder = daemons.dir("d1");
        let config = std::fs::read_to_string(folder.join("config.cfg")).expect("config");
        for line in [
            "BIND_INTERFACE_IP=10.0.0.1",
            "IMEX_ENABLE_AUTH_ENCRYPTION=1",
            "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS",
            "IMEX_AUTH_SOURCE=FILE",
            "IMEX_SERVER_CERT_AUTH=/tmp/nvidia-imex/ca.crt",
            "IMEX_CLIENT_KEY=/tmp/nvidia-imex/tls.key",
            "IMEX_SECURITY_TARGET_OVERRIDE=compute-domain-daemon",
            "IMEX_CMD_UNIX_DOMAIN_PATH=/tmp/nvidia-imex/cmd.sock",
        ] {
            assert!(
                config.lines().any(|l| l == line),
                "{line} missing: {config}"
            );
        }
        assert!(COMMAND_SOCKET.starts_with(CONFIG_DIR));
        assert!(!config.contains("IMEX_CMD_PORT"), "{config}");
        assert!(
            !config.contains("IMEX_ENABLE_AUTH_ENCRYPTION=0"),
            "{config}"
        );
        for (name, text) in credentials.files() {
            let path = folder.join(name);
            assert_eq!(std::fs::read_to_string(&path).expect("file"), text);
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o077, 0, "{name} is readable by others: {mode:o}");
        }
        // This node's own address must be one.
        let error = daemons
            .write_start_files("d1", "10.0.0.1\nBIND_INTERFACE_IP=0.0.0.0", &credentials)
            .expect_err("a bad bind address");
        assert!(error.to_string().contains("not an IP address"), "{error}");
        // No daemon starts without credentials.
        let error = daemons
            .ensure("d2", "10.0.0.1", &[], None)
            .expect_err("no credentials");
        assert_eq!(
            error.to_string(),
            "IMEX daemon of ComputeDomain d2: no IMEX credentials to start the daemon with"
        );
    }
}
