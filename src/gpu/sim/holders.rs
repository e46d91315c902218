//! Who holds a simulated GPU open (processes, this process's NVML session, persistence mode):
//! the simulated kernel does not let a held GPU leave `nvidia`.
use std::collections::BTreeSet;
use std::fs;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{PciDriver, SimNode, SimState, gpu_state, mig_err};
use crate::gpu::session::{Lease, SessionGate};
use crate::gpu::{GpuError, MigFailure};

/// A process holding a simulated GPU open, told apart from a later process with the same PID by
/// its start time (`/proc/<pid>/stat`). PIDs are those of the host's namespace (the chart runs
/// the driver with the host's PIDs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimHolder {
    pub pid: u32,
    pub start_time: u64,
    pub name: String,
}

impl SimHolder {
    /// This process, holding the GPU as `name`.
    pub fn this_process(name: &str) -> Self {
        Self::of_process(std::process::id(), name)
    }

    /// The running process `pid`, holding the GPU as `name`.
    pub fn of_process(pid: u32, name: &str) -> Self {
        Self {
            pid,
            start_time: process_start_time(pid).unwrap_or_default(),
            name: name.to_string(),
        }
    }

    /// Whether the process still runs (a killed one's files are closed by the kernel).
    pub fn alive(&self) -> bool {
        process_start_time(self.pid) == Some(self.start_time)
    }
}

/// Field 22 of `/proc/<pid>/stat`: when the process started, in clock ticks since boot.
pub(super) fn process_start_time(pid: u32) -> Option<u64> {
    // This process's own, read once: the fake libnvidia-ml checks at every call that the
    // session's holder (the process it is loaded in) still runs. Keyed by pid, as a forked child
    // is another process.
    static OWN: std::sync::Mutex<Option<(u32, u64)>> = std::sync::Mutex::new(None);
    let own = pid == std::process::id();
    if own
        && let Some((cached_pid, start)) = *OWN.lock().unwrap_or_else(|p| p.into_inner())
        && cached_pid == pid
    {
        return Some(start);
    }
    let start = read_process_start_time(pid)?;
    if own {
        *OWN.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, start));
    }
    Some(start)
}

fn read_process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// What an NVML session is to the kernel, for a process that uses the simulator in its place:
/// while open, this process holds every GPU on `nvidia` (as enumerated when it opened).
pub struct SimSession {
    node: SimNode,
}

impl SimSession {
    const HOLDER: &'static str = "gpu-dra (NVML session)";

    fn open(node: &SimNode) -> Result<Self, GpuError> {
        let node = SimNode {
            session: None,
            ..node.clone()
        };
        let all = (0..node.spec.gpu_count()).collect();
        node.hold(&all, &SimHolder::this_process(Self::HOLDER))?;
        Ok(Self { node })
    }
}

impl Drop for SimSession {
    fn drop(&mut self) {
        if let Err(error) = self.node.release_holds(std::process::id(), Self::HOLDER) {
            tracing::warn!(%error, "cannot record the simulated NVML session's end");
        }
    }
}

impl SimNode {
    /// This process holds the GPUs open as an NVML session does (opened now; see
    /// [`SimSession`]), so that the simulated kernel holds an unbind until it is closed
    /// ([`GpuControl::close_session`](crate::gpu::GpuControl::close_session)).
    pub fn with_session(mut self) -> Result<Self, GpuError> {
        let session = SimSession::open(&self)?;
        self.session = Some(Arc::new(SessionGate::opened(session)));
        Ok(self)
    }

    /// A lease on this process's session, opening it again after a close; `None` without one.
    pub fn lease(&self) -> Result<Option<Lease<SimSession>>, GpuError> {
        self.session
            .as_ref()
            .map(|gate| gate.lease(|| SimSession::open(self)))
            .transpose()
    }

    /// Closes this process's session (see [`SessionGate::close`]).
    pub fn close_session(
        &self,
        within: Duration,
    ) -> Result<Option<crate::gpu::session::Closed<'_, SimSession>>, GpuError> {
        let Some(gate) = &self.session else {
            return Ok(None);
        };
        gate.close(within).map(Some).map_err(|busy| GpuError::Nvml {
            operation: "close the simulated NVML session".into(),
            reason: format!(
                "{} of this driver's own calls did not end within {}s",
                busy.leases,
                busy.waited.as_secs()
            ),
        })
    }

    /// Who holds the GPU open now: live processes, and persistence mode.
    pub(super) fn holders_in(
        &self,
        state: &SimState,
        minor: u32,
    ) -> Vec<crate::gpu::holders::GpuHolder> {
        let Some(gpu) = state.gpus.iter().find(|g| g.minor == minor) else {
            return vec![];
        };
        let mut held: Vec<_> = gpu
            .holders
            .iter()
            .filter(|h| h.alive())
            .map(|h| crate::gpu::holders::GpuHolder {
                pid: Some(h.pid),
                name: h.name.clone(),
            })
            .collect();
        if gpu.persistence {
            held.push(crate::gpu::holders::GpuHolder {
                pid: None,
                name: "persistence mode".into(),
            });
        }
        held
    }

    /// Who holds the GPU open (see [`SimGpuState::holders`]).
    pub fn holders(&self, minor: u32) -> Result<Vec<crate::gpu::holders::GpuHolder>, GpuError> {
        self.read(|state| Ok(self.holders_in(state, minor)))
    }

    /// Records `holder` as holding the GPUs in `minors` open (those bound to `nvidia`; a GPU on
    /// another driver has no `nvidia` device file).
    pub fn hold(&self, minors: &BTreeSet<u32>, holder: &SimHolder) -> Result<Vec<u32>, GpuError> {
        self.write(|state| {
            let mut held = vec![];
            for gpu in state
                .gpus
                .iter_mut()
                .filter(|g| minors.contains(&g.minor) && g.driver == PciDriver::Nvidia)
            {
                gpu.holders
                    .retain(|h| (h.pid, &h.name) != (holder.pid, &holder.name));
                gpu.holders.push(holder.clone());
                held.push(gpu.minor);
            }
            Ok(held)
        })
    }

    /// The process `pid` closed every GPU it held as `name`.
    pub fn release_holds(&self, pid: u32, name: &str) -> Result<(), GpuError> {
        self.write(|state| {
            for gpu in &mut state.gpus {
                gpu.holders
                    .retain(|h| (h.pid, h.name.as_str()) != (pid, name));
            }
            Ok(())
        })
    }

    /// Persistence mode of a GPU.
    pub fn persistence(&self, minor: u32) -> Result<bool, GpuError> {
        self.read(|state| Ok(state.gpus.iter().any(|g| g.minor == minor && g.persistence)))
    }

    /// Turns persistence mode on or off (NVML's `nvmlDeviceSetPersistenceMode`).
    pub fn set_persistence(&self, minor: u32, enabled: bool) -> Result<(), GpuError> {
        const OP: &str = "set persistence mode";
        self.write(|state| {
            let gpu = gpu_state(state, minor, OP)?;
            if gpu.driver != PciDriver::Nvidia {
                return Err(mig_err(
                    minor,
                    OP,
                    MigFailure::NotFound,
                    "the GPU is not on nvidia",
                ));
            }
            gpu.persistence = enabled;
            Ok(())
        })
    }
}
