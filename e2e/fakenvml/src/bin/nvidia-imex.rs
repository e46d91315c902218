//! A fake `nvidia-imex` (and, installed under that name, `nvidia-imex-ctl`) for simulated NVL72
//! racks. It reads NVIDIA's config file format, listens for its peers on `BIND_INTERFACE_IP:
//! SERVER_PORT`, connects to every peer of its node config file (addresses, or names resolved
//! through `/etc/hosts`; SIGUSR1 resolves them again and reconnects, as the real daemon restarts
//! its outgoing connections), and answers `nvidia-imex-ctl` on `IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT`:
//! `READY` once it holds a live connection to every peer the node file lists, `UNAVAILABLE`
//! before. Several nodes share one machine by binding distinct loopback addresses.
//!
//! Daemon: `nvidia-imex -c CONFIG`. Control: `nvidia-imex-ctl -c CONFIG -q` (state),
//! `nvidia-imex-ctl -c CONFIG -N` (one line per peer: `<ip> CONNECTED|UNAVAILABLE`), or
//! `-i IP -p PORT` instead of `-c`.
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

static RELOAD: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_reload(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}
extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args
        .first()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or("nvidia-imex")
        .to_string();
    let result = if name.ends_with("-ctl") {
        ctl(&args[1..])
    } else {
        daemon(&args[1..])
    };
    if let Err(e) = result {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

fn flag(args: &[String], short: &str) -> Option<String> {
    let at = args.iter().position(|a| a == short)?;
    args.get(at + 1).cloned()
}

/// `KEY=VALUE` lines of NVIDIA's config format; comments and blanks skipped.
fn read_config(path: &str) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

fn port(config: &BTreeMap<String, String>, key: &str, default: u16) -> Result<u16, String> {
    match config.get(key).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("{key}={v} is not a port")),
    }
}

fn command_address(args: &[String]) -> Result<SocketAddr, String> {
    let (ip, port) = if let Some(path) = flag(args, "-c") {
        let config = read_config(&path)?;
        let ip = config
            .get("IMEX_CMD_BIND_INTERFACE_IP")
            .filter(|v| !v.is_empty())
            .or_else(|| config.get("BIND_INTERFACE_IP"))
            .cloned()
            .unwrap_or_else(|| "127.0.0.1".into());
        (ip, port(&config, "IMEX_CMD_PORT", 50005)?)
    } else {
        let ip = flag(args, "-i").unwrap_or_else(|| "127.0.0.1".into());
        let port = flag(args, "-p")
            .map(|p| p.parse().map_err(|_| format!("-p {p} is not a port")))
            .transpose()?
            .unwrap_or(50005);
        (ip, port)
    };
    format!("{ip}:{port}")
        .parse()
        .map_err(|_| format!("{ip}:{port} is not an address"))
}

fn ctl(args: &[String]) -> Result<(), String> {
    let request = if args.iter().any(|a| a == "-q") {
        "QUERY"
    } else if args.iter().any(|a| a == "-N") {
        "NODES"
    } else {
        return Err(
            "usage: nvidia-imex-ctl (-c CONFIG | -i IP -p PORT | --u=SOCKET) (-q | -N)".into(),
        );
    };
    let mut answer = String::new();
    if let Some(socket) = args.iter().find_map(|a| a.strip_prefix("--u=")) {
        let mut stream = std::os::unix::net::UnixStream::connect(socket)
            .map_err(|e| format!("cannot reach the IMEX daemon at {socket}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        writeln!(stream, "{request}").map_err(|e| e.to_string())?;
        std::io::Read::read_to_string(&mut stream, &mut answer).map_err(|e| e.to_string())?;
    } else {
        let address = command_address(args)?;
        let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))
            .map_err(|e| format!("cannot reach the IMEX daemon at {address}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        writeln!(stream, "{request}").map_err(|e| e.to_string())?;
        std::io::Read::read_to_string(&mut stream, &mut answer).map_err(|e| e.to_string())?;
    }
    print!("{answer}");
    Ok(())
}

/// Peer address → live outbound connection.
type Peers = Arc<Mutex<BTreeMap<String, Option<TcpStream>>>>;

fn daemon(args: &[String]) -> Result<(), String> {
    let path = flag(args, "-c").ok_or("usage: nvidia-imex -c CONFIG")?;
    let config = read_config(&path)?;
    let bind_ip = config
        .get("BIND_INTERFACE_IP")
        .filter(|v| !v.is_empty())
        .cloned()
        .ok_or("BIND_INTERFACE_IP is empty: this fake needs the node's own address")?;
    let server_port = port(&config, "SERVER_PORT", 50000)?;
    let node_file = config
        .get("IMEX_NODE_CONFIG_FILE")
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| "/etc/nvidia-imex/nodes_config.cfg".into());
    // SAFETY: the handlers only store to atomics.
    unsafe {
        libc::signal(libc::SIGUSR1, on_reload as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
    }
    let listener = TcpListener::bind((bind_ip.as_str(), server_port))
        .map_err(|e| format!("cannot listen on {bind_ip}:{server_port}: {e}"))?;
    let commands = if config.get("IMEX_CMD_ENABLED").map(String::as_str) != Some("0") {
        let address = command_address(&["-c".to_string(), path.clone()])?;
        Some(
            TcpListener::bind(address)
                .map_err(|e| format!("cannot listen for commands on {address}: {e}"))?,
        )
    } else {
        None
    };
    // IMEX_CMD_UNIX_DOMAIN_PATH: commands on a unix socket too (a host daemon for containers).
    let unix_commands = match config
        .get("IMEX_CMD_UNIX_DOMAIN_PATH")
        .filter(|p| !p.is_empty())
    {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            Some(
                std::os::unix::net::UnixListener::bind(path)
                    .map_err(|e| format!("cannot listen for commands on {path}: {e}"))?,
            )
        }
        None => None,
    };
    let mut wanted = read_nodes(&node_file, &bind_ip)?;
    // DAEMONIZE=1 (NVIDIA's default): the launcher returns once the daemon listens, and the
    // daemon leaves its session. Forked before any thread exists.
    if config.get("DAEMONIZE").map(String::as_str) != Some("0") {
        // SAFETY: single-threaded here; the child only continues this function.
        match unsafe { libc::fork() } {
            -1 => return Err("cannot fork".into()),
            0 => {
                // SAFETY: plain system call in the child.
                unsafe { libc::setsid() };
                // A daemon keeps none of its launcher's stdio (a pipe its reader closes would
                // make every later message fail): it logs to LOG_FILE_NAME, as the real one.
                detach_stdio(
                    config
                        .get("LOG_FILE_NAME")
                        .map(String::as_str)
                        .unwrap_or(""),
                );
            }
            _ => std::process::exit(0),
        }
    }
    let me = bind_ip.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let me = me.clone();
            std::thread::spawn(move || greet_back(stream, &me));
        }
    });
    let peers: Peers = Arc::default();
    if let Some(commands) = unix_commands {
        let peers = peers.clone();
        std::thread::spawn(move || {
            for stream in commands.incoming().flatten() {
                answer(&stream, &stream, &peers);
            }
        });
    }
    if let Some(commands) = commands {
        let peers = peers.clone();
        std::thread::spawn(move || {
            for stream in commands.incoming().flatten() {
                answer(&stream, &stream, &peers);
            }
        });
    }
    eprintln!("nvidia-imex: listening on {bind_ip}:{server_port}; peers {wanted:?}");
    while !STOP.load(Ordering::SeqCst) {
        let reload = RELOAD.swap(false, Ordering::SeqCst);
        if reload {
            wanted = read_nodes(&node_file, &bind_ip)?;
            eprintln!("nvidia-imex: SIGUSR1: peers resolved again: {wanted:?}");
        }
        let mut table = peers.lock().unwrap_or_else(|p| p.into_inner());
        if reload {
            // Every outgoing connection restarts.
            table.clear();
        }
        table.retain(|ip, _| wanted.contains(ip));
        for ip in &wanted {
            let entry = table.entry(ip.clone()).or_insert(None);
            let alive = entry
                .as_mut()
                .is_some_and(|s| writeln!(s, "PING").and_then(|_| s.flush()).is_ok());
            if !alive {
                *entry = connect(ip, server_port, &bind_ip);
            }
        }
        drop(table);
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("nvidia-imex: stopping");
    Ok(())
}

fn detach_stdio(log: &str) {
    use std::os::fd::AsRawFd;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    let log = (!log.is_empty())
        .then(|| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .ok()
        })
        .flatten();
    if let Ok(null) = &null {
        // SAFETY: plain system calls on open descriptors.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
            libc::dup2(log.as_ref().map_or(null.as_raw_fd(), |l| l.as_raw_fd()), 2);
        }
    }
}

/// The node file's peers other than this node: addresses as they are, names through
/// `/etc/hosts` (NVIDIA's ComputeDomain daemons list static names and map them there); a name
/// without an address is a node not configured yet and is skipped.
fn read_nodes(path: &str, me: &str) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let hosts: BTreeMap<String, String> = std::fs::read_to_string("/etc/hosts")
        .unwrap_or_default()
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let ip = fields.next()?.to_string();
            Some(
                fields
                    .map(move |name| (name.to_string(), ip.clone()))
                    .collect::<Vec<_>>(),
            )
        })
        .flatten()
        .collect();
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|entry| {
            if entry.parse::<std::net::IpAddr>().is_ok() {
                Some(entry.to_string())
            } else {
                hosts.get(entry).cloned()
            }
        })
        .filter(|ip| ip != me)
        .collect())
}

fn connect(ip: &str, port: u16, me: &str) -> Option<TcpStream> {
    let address: SocketAddr = format!("{ip}:{port}").parse().ok()?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(300)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    writeln!(stream, "HELLO {me}").ok()?;
    let mut line = String::new();
    BufReader::new(stream.try_clone().ok()?)
        .read_line(&mut line)
        .ok()?;
    line.starts_with("HELLO ").then_some(stream)
}

fn greet_back(stream: TcpStream, me: &str) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(stream).lines();
    if !matches!(lines.next(), Some(Ok(l)) if l.starts_with("HELLO ")) {
        return;
    }
    if writeln!(writer, "HELLO {me}").is_err() {
        return;
    }
    // Pings until the peer goes.
    for line in lines {
        if line.is_err() {
            return;
        }
    }
}

fn answer(reader: impl std::io::Read, mut writer: impl Write, peers: &Peers) {
    let mut request = String::new();
    if BufReader::new(reader).read_line(&mut request).is_err() {
        return;
    }
    let table = peers.lock().unwrap_or_else(|p| p.into_inner());
    let reply = match request.trim() {
        "QUERY" if table.values().all(Option::is_some) => "READY\n".to_string(),
        "QUERY" => "UNAVAILABLE\n".to_string(),
        "NODES" => table
            .iter()
            .map(|(ip, s)| {
                let state = if s.is_some() {
                    "CONNECTED"
                } else {
                    "UNAVAILABLE"
                };
                format!("{ip} {state}\n")
            })
            .collect(),
        other => format!("unknown request {other:?}\n"),
    };
    let _ = writer.write_all(reply.as_bytes());
}
