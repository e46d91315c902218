//! A fake `nvidia-imex` (and, installed under that name, `nvidia-imex-ctl`) for simulated NVL72
//! racks. It reads NVIDIA's config file format, listens for its peers on `BIND_INTERFACE_IP:
//! SERVER_PORT`, connects to every peer of its node config file (addresses, or names resolved
//! through `/etc/hosts`; SIGUSR1 resolves them again and reconnects, as the real daemon restarts
//! its outgoing connections), and answers `nvidia-imex-ctl` on `IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT`:
//! `READY` once it holds a live connection to every peer the node file lists, `UNAVAILABLE`
//! before. Several nodes share one machine by binding distinct loopback addresses.
//! With `IMEX_ENABLE_AUTH_ENCRYPTION=1` (mode `SSL_TLS`, source `FILE`, as the real daemon reads
//! them) every peer connection is mutual TLS: a peer without a certificate of the configured
//! authority is refused in the handshake, and any other auth setting is refused at start.
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

/// A peer connection: plain TCP, or TLS over it.
trait Wire: std::io::Read + Write + Send {}
impl<T: std::io::Read + Write + Send> Wire for T {}

/// Peer address → live outbound connection.
type Peers = Arc<Mutex<BTreeMap<String, Option<Box<dyn Wire>>>>>;

/// `SSL_TLS` with `FILE` sources: both ends of every peer connection prove they hold a
/// certificate of the configured authorities.
struct Tls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    /// `IMEX_SECURITY_TARGET_OVERRIDE`: the name peers' certificates are checked for (else
    /// their address).
    target: Option<String>,
}

fn tls(config: &BTreeMap<String, String>) -> Result<Option<Tls>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let get = |key: &str| config.get(key).map(String::as_str).unwrap_or("");
    match get("IMEX_ENABLE_AUTH_ENCRYPTION") {
        "" | "0" => return Ok(None),
        "1" => {}
        other => return Err(format!("IMEX_ENABLE_AUTH_ENCRYPTION={other} is not 0 or 1")),
    }
    if get("IMEX_AUTH_ENCRYPTION_MODE") != "SSL_TLS" {
        return Err(format!(
            "IMEX_AUTH_ENCRYPTION_MODE={:?}: this fake knows SSL_TLS only",
            get("IMEX_AUTH_ENCRYPTION_MODE")
        ));
    }
    if get("IMEX_AUTH_SOURCE") != "FILE" {
        return Err(format!(
            "IMEX_AUTH_SOURCE={:?}: this fake knows FILE only",
            get("IMEX_AUTH_SOURCE")
        ));
    }
    let path = |key: &str| match get(key) {
        "" => Err(format!("{key} is empty")),
        p => Ok(p.to_string()),
    };
    let certs = |key: &str| -> Result<Vec<CertificateDer<'static>>, String> {
        let p = path(key)?;
        CertificateDer::pem_file_iter(&p)
            .and_then(|i| i.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("{key}={p}: {e}"))
    };
    let key = |key: &str| -> Result<PrivateKeyDer<'static>, String> {
        let p = path(key)?;
        PrivateKeyDer::from_pem_file(&p).map_err(|e| format!("{key}={p}: {e}"))
    };
    let roots = |key: &str| -> Result<Arc<rustls::RootCertStore>, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs(key)? {
            roots.add(cert).map_err(|e| format!("{key}: {e}"))?;
        }
        Ok(Arc::new(roots))
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots("IMEX_SERVER_CERT_AUTH")?,
        provider.clone(),
    )
    .build()
    .map_err(|e| format!("IMEX_SERVER_CERT_AUTH: {e}"))?;
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs("IMEX_SERVER_CERT")?, key("IMEX_SERVER_KEY")?)
        .map_err(|e| format!("IMEX_SERVER_CERT/IMEX_SERVER_KEY: {e}"))?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots("IMEX_CLIENT_CERT_AUTH")?)
        .with_client_auth_cert(certs("IMEX_CLIENT_CERT")?, key("IMEX_CLIENT_KEY")?)
        .map_err(|e| format!("IMEX_CLIENT_CERT/IMEX_CLIENT_KEY: {e}"))?;
    Ok(Some(Tls {
        server: Arc::new(server),
        client: Arc::new(client),
        target: Some(get("IMEX_SECURITY_TARGET_OVERRIDE").to_string()).filter(|t| !t.is_empty()),
    }))
}

fn daemon(args: &[String]) -> Result<(), String> {
    let path = flag(args, "-c").ok_or("usage: nvidia-imex -c CONFIG")?;
    let config = read_config(&path)?;
    let bind_ip = config
        .get("BIND_INTERFACE_IP")
        .filter(|v| !v.is_empty())
        .cloned()
        .ok_or("BIND_INTERFACE_IP is empty: this fake needs the node's own address")?;
    let server_port = port(&config, "SERVER_PORT", 50000)?;
    let tls = tls(&config)?.map(Arc::new);
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
    let tcp_commands = config.get("IMEX_CMD_PORT").is_some_and(|p| !p.is_empty())
        || config
            .get("IMEX_CMD_UNIX_DOMAIN_PATH")
            .is_none_or(|p| p.is_empty());
    let commands =
        if config.get("IMEX_CMD_ENABLED").map(String::as_str) != Some("0") && tcp_commands {
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
    let server_tls = tls.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let me = me.clone();
            let tls = server_tls.clone();
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                match tls {
                    None => greet_back(stream, &me),
                    Some(tls) => match rustls::ServerConnection::new(tls.server.clone()) {
                        Ok(conn) => greet_back(rustls::StreamOwned::new(conn, stream), &me),
                        Err(e) => eprintln!("nvidia-imex: TLS: {e}"),
                    },
                }
            });
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
                *entry = connect(ip, server_port, &bind_ip, tls.as_deref());
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

fn connect(ip: &str, port: u16, me: &str, tls: Option<&Tls>) -> Option<Box<dyn Wire>> {
    let address: SocketAddr = format!("{ip}:{port}").parse().ok()?;
    let stream = TcpStream::connect_timeout(&address, Duration::from_millis(300)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut wire: Box<dyn Wire> = match tls {
        None => Box::new(stream),
        Some(tls) => {
            let name = tls.target.clone().unwrap_or_else(|| ip.to_string());
            let name = rustls::pki_types::ServerName::try_from(name).ok()?;
            let conn = rustls::ClientConnection::new(tls.client.clone(), name).ok()?;
            Box::new(rustls::StreamOwned::new(conn, stream))
        }
    };
    if let Err(e) = writeln!(wire, "HELLO {me}").and_then(|_| wire.flush()) {
        eprintln!("nvidia-imex: {ip}: {e}");
        return None;
    }
    let line = read_line(&mut wire)?;
    line.starts_with("HELLO ").then_some(wire)
}

/// One line, byte by byte (nothing past it is read: the stream goes on as it is).
fn read_line(wire: &mut dyn Wire) -> Option<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 256 {
        match wire.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => return String::from_utf8(line).ok(),
            Ok(1) => line.push(byte[0]),
            _ => return None,
        }
    }
    None
}

fn greet_back(mut wire: impl Wire, me: &str) {
    if !read_line(&mut wire).is_some_and(|l| l.starts_with("HELLO ")) {
        return;
    }
    if writeln!(wire, "HELLO {me}")
        .and_then(|_| wire.flush())
        .is_err()
    {
        return;
    }
    // Pings until the peer goes.
    while read_line(&mut wire).is_some() {}
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
