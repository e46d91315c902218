//! A fake `nvidia-cuda-mps-control` for tests: the same command line, environment and control
//! commands as NVIDIA's, and a log (`control.log` in `CUDA_MPS_LOG_DIRECTORY`) of everything it
//! was told, so tests can read what a real daemon would have been told.
//!
//! - `nvidia-cuda-mps-control -d [-M]`: starts the control daemon in the background (its own
//!   process group, so it outlives whoever started it) and returns once it answers on
//!   `$CUDA_MPS_PIPE_DIRECTORY/control`; refused when a daemon already serves that folder.
//! - `nvidia-cuda-mps-control` (no arguments): a client; sends each line of stdin to the daemon
//!   and prints its answer. Exits 1 when no daemon answers.
//!
//! On simulated GPUs (`GPU_DRA_SIM_STATE` or `FAKE_NVML_STATE` names their state file) the
//! daemon is part of the simulated hardware: it records itself and what it is told there, and
//! refuses to start for devices that do not exist.
//!
//! The daemon starts an MPS server (this binary again, `--fake-server`) that models clients: a
//! client makes a FIFO in `$CUDA_MPS_PIPE_DIRECTORY/clients/`, the server opens it and writes
//! `attached server=<pid>` and then `alive <n>` every second. A client reading it sees end of
//! file the moment its server is gone, as a CUDA client of a real server does. A file
//! `clients/<name>.mem` holding a number N makes the server hold N MiB for that client (touched,
//! so it is resident), as a real server holds its clients' contexts: what it costs the node's
//! memory, and whose cgroup pays for it, can be tested.
//!
//! Commands: `get_server_list`, `set_default_active_thread_percentage N`,
//! `get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit DEV LIMIT`,
//! `get_default_device_pinned_mem_limit DEV`, `quit`.
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpu_dra::gpu::sim::{SimMpsDaemon, SimNode, SimState};

const SERVE: &str = "--fake-serve";
const SERVER: &str = "--fake-server";

/// The simulated node the daemon runs on, if any.
fn sim() -> Option<SimNode> {
    let path = std::env::var_os("GPU_DRA_SIM_STATE")
        .or_else(|| std::env::var_os("FAKE_NVML_STATE"))
        .map(PathBuf::from)?;
    let state: SimState = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    Some(SimNode::new(
        state.spec.parse().ok()?,
        &state.node_name,
        Some(path),
    ))
}

fn pipe_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_PIPE_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/nvidia-mps"))
}

fn log_dir() -> PathBuf {
    std::env::var_os("CUDA_MPS_LOG_DIRECTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/log/nvidia-mps"))
}

fn socket() -> PathBuf {
    pipe_dir().join("control")
}

/// The daemon's identity in the simulated hardware: its folder on the host where the driver
/// says (each daemon sees its own pipe folder at the same `/tmp/nvidia-mps`), else the pipe
/// folder.
fn pipe_key() -> String {
    match std::env::var_os("GPU_DRA_MPS_FOLDER") {
        Some(folder) => PathBuf::from(folder)
            .join("pipe")
            .to_string_lossy()
            .into_owned(),
        None => pipe_dir().to_string_lossy().into_owned(),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-d") => start_daemon(args.iter().any(|a| a == "-M")),
        Some(SERVE) => serve(args.iter().any(|a| a == "-M")),
        Some(SERVER) => server(),
        None => client(),
        Some(other) => {
            eprintln!("nvidia-cuda-mps-control: unknown option {other}");
            ExitCode::from(2)
        }
    }
}

/// What a command gets back, or `None` when no daemon answers.
fn ask(command: &str) -> Option<String> {
    let mut stream = UnixStream::connect(socket()).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(command.as_bytes()).ok()?;
    stream.write_all(b"\n").ok()?;
    stream.shutdown(std::net::Shutdown::Write).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

fn start_daemon(multi_user: bool) -> ExitCode {
    if ask("get_server_list").is_some() {
        eprintln!("An instance of this daemon is already running");
        return ExitCode::from(1);
    }
    let Ok(me) = std::env::current_exe() else {
        eprintln!("nvidia-cuda-mps-control: cannot find its own executable");
        return ExitCode::from(1);
    };
    let mut command = Command::new(me);
    command.arg(SERVE);
    if multi_user {
        command.arg("-M");
    }
    let spawned = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group, as a daemon: signals to the starter's group do not reach it.
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("nvidia-cuda-mps-control: cannot start the daemon: {e}");
            return ExitCode::from(1);
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if ask("get_server_list").is_some() {
            return ExitCode::SUCCESS;
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!(
                "nvidia-cuda-mps-control: the daemon exited ({status}); see {}",
                log_dir().join("control.log").display()
            );
            return ExitCode::from(1);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("nvidia-cuda-mps-control: the daemon did not come up");
    ExitCode::from(1)
}

fn log(line: &str) {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    let _ = std::fs::create_dir_all(log_dir());
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_dir().join("control.log"))
    {
        let _ = writeln!(file, "[{at:.3}] {line}");
    }
}

fn serve(multi_user: bool) -> ExitCode {
    let socket = socket();
    if let Some(dir) = socket.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(listener) => listener,
        Err(e) => {
            log(&format!("cannot listen on {}: {e}", socket.display()));
            return ExitCode::from(1);
        }
    };
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    let pipe = pipe_key();
    let sim = sim();
    if let Some(sim) = &sim {
        let daemon = SimMpsDaemon {
            pid: std::process::id(),
            pipe_directory: pipe.clone(),
            devices: visible
                .split(',')
                .filter(|d| !d.is_empty())
                .map(String::from)
                .collect(),
            multi_user,
            ..SimMpsDaemon::default()
        };
        if let Err(e) = sim.mps_started(daemon) {
            log(&format!("cannot start: {e}"));
            let _ = std::fs::remove_file(&socket);
            return ExitCode::from(1);
        }
    }
    let record = |change: &dyn Fn(&mut SimMpsDaemon)| {
        if let Some(sim) = &sim
            && let Err(e) = sim.mps_updated(&pipe, change)
        {
            log(&format!("cannot record in the simulated hardware: {e}"));
        }
    };
    log(&format!(
        "Control daemon started: pid={} CUDA_VISIBLE_DEVICES={visible} multiUser={multi_user}",
        std::process::id()
    ));
    let server = std::env::current_exe().and_then(|me| {
        Command::new(me)
            .arg(SERVER)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    });
    let mut server = match server {
        Ok(child) => child,
        Err(e) => {
            log(&format!("cannot start the server: {e}"));
            let _ = std::fs::remove_file(&socket);
            return ExitCode::from(1);
        }
    };
    log(&format!("Server started: pid={}", server.id()));
    let mut thread_percentage: Option<String> = None;
    let mut pinned: BTreeMap<String, String> = BTreeMap::new();
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            continue;
        }
        let command = line.trim();
        log(&format!("cmd: {command}"));
        let words: Vec<&str> = command.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["get_server_list"] => format!("{}\n", server.id()),
            ["set_default_active_thread_percentage", value] => match value.parse::<f64>() {
                Ok(p) if (0.0..=100.0).contains(&p) => {
                    thread_percentage = Some((*value).to_string());
                    record(&|d| d.active_thread_percentage = Some((*value).to_string()));
                    format!("{value}\n")
                }
                _ => "Invalid value\n".into(),
            },
            ["get_default_active_thread_percentage"] => {
                format!("{}\n", thread_percentage.as_deref().unwrap_or("100.0"))
            }
            ["set_default_device_pinned_mem_limit", device, limit] => {
                if is_limit(limit) && is_visible(&visible, device) {
                    pinned.insert((*device).to_string(), (*limit).to_string());
                    record(&|d| {
                        d.pinned_device_memory_limits
                            .insert((*device).to_string(), (*limit).to_string());
                    });
                    String::new()
                } else {
                    "Invalid device or limit\n".into()
                }
            }
            ["get_default_device_pinned_mem_limit", device] => {
                format!("{}\n", pinned.get(*device).map_or("0M", String::as_str))
            }
            ["quit"] => {
                if let Some(sim) = &sim
                    && let Err(e) = sim.mps_stopped(&pipe)
                {
                    log(&format!("cannot record in the simulated hardware: {e}"));
                }
                let _ = std::fs::remove_file(&socket);
                let _ = server.kill();
                let _ = server.wait();
                log("Control daemon stopped");
                let _ = stream.write_all(b"");
                return ExitCode::SUCCESS;
            }
            _ => "Invalid command\n".into(),
        };
        let _ = stream.write_all(answer.as_bytes());
    }
    ExitCode::SUCCESS
}

/// The MPS server: serves the clients that attach through FIFOs in `<pipe>/clients/` until it
/// is stopped; each client's FIFO reaches end of file when this process is gone.
fn server() -> ExitCode {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let clients_dir = pipe_dir().join("clients");
    if let Err(e) = std::fs::create_dir_all(&clients_dir) {
        log(&format!(
            "server: cannot create {}: {e}",
            clients_dir.display()
        ));
        return ExitCode::from(1);
    }
    let me = std::process::id();
    let mut attached: BTreeMap<std::ffi::OsString, std::fs::File> = BTreeMap::new();
    let mut held: BTreeMap<std::ffi::OsString, Vec<u8>> = BTreeMap::new();
    let mut tick: u64 = 0;
    loop {
        for name in attached.keys() {
            if held.contains_key(name) {
                continue;
            }
            let mut file = name.clone();
            file.push(".mem");
            let Some(mib) = std::fs::read_to_string(clients_dir.join(&file))
                .ok()
                .and_then(|text| text.trim().parse::<usize>().ok())
            else {
                continue;
            };
            // Touched page by page, so the memory is resident and charged to this cgroup.
            let mut memory = vec![0u8; mib << 20];
            for page in memory.chunks_mut(4096) {
                page[0] = 1;
            }
            log(&format!(
                "server {me}: client {} holds {mib} MiB",
                name.to_string_lossy()
            ));
            held.insert(name.clone(), memory);
        }
        if let Ok(entries) = std::fs::read_dir(&clients_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let is_fifo = entry.file_type().is_ok_and(|t| t.is_fifo());
                if !is_fifo || attached.contains_key(&name) {
                    continue;
                }
                // Non-blocking: a FIFO nobody reads yet is tried again on the next round.
                let opened = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc_o_nonblock())
                    .open(entry.path());
                if let Ok(mut fifo) = opened
                    && writeln!(fifo, "attached server={me}").is_ok()
                {
                    log(&format!(
                        "server {me}: client {} attached",
                        name.to_string_lossy()
                    ));
                    attached.insert(name, fifo);
                }
            }
        }
        if tick.is_multiple_of(5) {
            let beat = tick / 5;
            attached.retain(|name, fifo| {
                let alive = writeln!(fifo, "alive {beat}").is_ok();
                if !alive {
                    log(&format!(
                        "server {me}: client {} left",
                        name.to_string_lossy()
                    ));
                }
                alive
            });
        }
        tick += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `O_NONBLOCK` (Linux).
fn libc_o_nonblock() -> i32 {
    0o4000
}

/// `<N>M` or `<N>G`, as MPS takes limits.
fn is_limit(limit: &str) -> bool {
    limit
        .strip_suffix('M')
        .or_else(|| limit.strip_suffix('G'))
        .is_some_and(|n| n.parse::<u64>().is_ok_and(|n| n > 0))
}

/// A device index or UUID among the daemon's visible devices.
fn is_visible(visible: &str, device: &str) -> bool {
    let devices: Vec<&str> = visible.split(',').filter(|d| !d.is_empty()).collect();
    devices.contains(&device)
        || device
            .parse::<usize>()
            .is_ok_and(|index| index < devices.len())
}

fn client() -> ExitCode {
    let mut failed = false;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        match ask(line.trim()) {
            Some(answer) => {
                print!("{answer}");
                if answer.starts_with("Invalid") {
                    failed = true;
                }
            }
            None => {
                eprintln!("Cannot find MPS control daemon process");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
