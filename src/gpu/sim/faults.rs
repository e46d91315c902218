//! Faults raised on simulated GPUs (`gpu-dra sim inject`) and the NVML events the simulated
//! hardware raises, polled by [`SimEventSource`].
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{PciDriver, SimNode, SimSession, SimState, StateStamp, gpu_even_if_lost, mig_err};
use crate::gpu::events::{
    GpuEvent, GpuEventKind, GpuEventSource, GpuProbe, RESET_REQUIRED_XIDS, RecoveryAction,
};
use crate::gpu::session::Lease;
use crate::gpu::{GpuError, MigFailure};

/// An event as the simulated hardware raised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimEvent {
    pub serial: u64,
    pub event: GpuEvent,
}

/// How many raised events the state keeps for readers that poll.
pub const EVENTS_KEPT: usize = 256;

/// Numbers `event` and keeps it for every reader (the oldest beyond [`EVENTS_KEPT`] go).
pub(super) fn raise(state: &mut SimState, event: GpuEvent) {
    if event.kind == GpuEventKind::MigConfigChange {
        // A reader that missed one still learns "this GPU's MIG devices changed" from the
        // newest: one per GPU is kept, so carve churn neither grows the state file nor pushes
        // faults out of the list.
        state.events.retain(|e| {
            !(e.event.kind == GpuEventKind::MigConfigChange && e.event.minor == event.minor)
        });
    }
    state.event_serial += 1;
    state.events.push(SimEvent {
        serial: state.event_serial,
        event,
    });
    let excess = state.events.len().saturating_sub(EVENTS_KEPT);
    state.events.drain(..excess);
}

/// `nvmlEventMigConfigChange` on GPU `minor`: raised by every GPU or compute instance made or
/// destroyed, whoever made it.
pub(super) fn mig_config_change(minor: u32) -> GpuEvent {
    GpuEvent {
        minor,
        kind: GpuEventKind::MigConfigChange,
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

/// A fault to raise on a simulated GPU, or its reset (`gpu-dra sim inject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFault {
    /// An XID event; 79 also takes the GPU off the bus, and the XIDs that need a reset make the
    /// driver ask for one.
    Xid {
        code: u64,
        gpu_instance_id: Option<u32>,
        compute_instance_id: Option<u32>,
    },
    /// A double-bit ECC error: an event, the volatile count up, a reset asked for.
    EccDoubleBit { gpu_instance_id: Option<u32> },
    /// The GPU stops answering (`NVML_ERROR_GPU_IS_LOST`), without an event.
    Lost,
    /// A GPU reset: faults cleared, volatile ECC counts zeroed, MIG instances gone, a pending MIG
    /// mode applied.
    Reset,
}

/// Polls the hardware state for events newer than the last one seen (the state file is shared
/// with `gpu-dra sim inject` and the fake libnvidia-ml).
pub struct SimEventSource {
    node: SimNode,
    seen: u64,
    watched: Vec<u32>,
    /// Keeps this process's session open while events are awaited (see [`SimSession`]).
    lease: Option<Lease<SimSession>>,
    /// The state file as last read: an unchanged file holds no new event.
    stamp: Option<StateStamp>,
}

/// How often [`SimEventSource`] looks at the state while waiting.
const EVENT_POLL: Duration = Duration::from_millis(100);

impl GpuEventSource for SimEventSource {
    fn watched(&self) -> Vec<u32> {
        self.watched.clone()
    }

    fn wait(&mut self, timeout: Duration) -> Result<Vec<GpuEvent>, GpuError> {
        let deadline = Instant::now() + timeout;
        // As an NVML event set: it keeps the session open, so it is given back while the
        // session closes and taken again after.
        if let Some(gate) = &self.node.session {
            if gate.closing() {
                self.lease = None;
                std::thread::sleep(timeout);
                return Ok(vec![]);
            }
            if self.lease.is_none() {
                self.lease = self.node.lease()?;
            }
        }
        loop {
            let stamp = self.node.state_stamp();
            if stamp.is_some() && stamp == self.stamp {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(vec![]);
                }
                std::thread::sleep(EVENT_POLL.min(deadline - now));
                continue;
            }
            self.stamp = stamp.filter(StateStamp::settled);
            let seen = self.seen;
            let (serial, events) = self.node.read(|state| {
                let events = state
                    .events
                    .iter()
                    .filter(|e| e.serial > seen)
                    .map(|e| e.event)
                    .collect::<Vec<_>>();
                Ok((state.event_serial, events))
            })?;
            // A reboot empties the list and restarts the numbering.
            self.seen = serial;
            if !events.is_empty() {
                return Ok(events);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(vec![]);
            }
            std::thread::sleep(EVENT_POLL.min(deadline - now));
        }
    }
}

impl SimNode {
    /// Raises a fault on a GPU, or resets it (see [`SimFault`]).
    pub fn inject(&self, minor: u32, fault: SimFault) -> Result<(), GpuError> {
        const OP: &str = "inject";
        self.model(minor, OP)?;
        self.write(|state| {
            let gpu = gpu_even_if_lost(state, minor)
                .ok_or_else(|| mig_err(minor, OP, MigFailure::NotFound, "no such GPU"))?;
            let event = match fault {
                SimFault::Xid {
                    code,
                    gpu_instance_id,
                    compute_instance_id,
                } => {
                    if RESET_REQUIRED_XIDS.contains(&code) {
                        gpu.recovery_action = RecoveryAction::GpuReset.nvml_value();
                    }
                    if code == 79 {
                        gpu.lost = true;
                    }
                    Some(GpuEvent {
                        minor,
                        kind: GpuEventKind::Xid { code },
                        gpu_instance_id,
                        compute_instance_id,
                    })
                }
                SimFault::EccDoubleBit { gpu_instance_id } => {
                    gpu.volatile_dbe += 1;
                    gpu.recovery_action = RecoveryAction::GpuReset.nvml_value();
                    Some(GpuEvent {
                        minor,
                        kind: GpuEventKind::DoubleBitEcc,
                        gpu_instance_id,
                        compute_instance_id: None,
                    })
                }
                SimFault::Lost => {
                    gpu.lost = true;
                    None
                }
                SimFault::Reset => {
                    gpu.lost = false;
                    gpu.volatile_dbe = 0;
                    gpu.recovery_action = 0;
                    gpu.gpu_instances.clear();
                    gpu.processes.clear();
                    gpu.mig_current = gpu.mig_pending;
                    None
                }
            };
            if let Some(event) = event {
                raise(state, event);
            }
            Ok(())
        })
    }

    /// The liveness probe: lost or not, and the recovery action the driver asks for.
    pub fn probe(&self, minor: u32) -> Result<GpuProbe, GpuError> {
        self.read(|state| {
            let gpu = state
                .gpus
                .iter()
                .find(|g| g.minor == minor && g.driver == PciDriver::Nvidia)
                .ok_or_else(|| mig_err(minor, "probe", MigFailure::NotFound, "no such GPU"))?;
            Ok(GpuProbe {
                lost: gpu.lost,
                recovery_action: Some(RecoveryAction::from_nvml(gpu.recovery_action)),
            })
        })
    }

    /// Events raised from now on, as an NVML event set delivers them.
    pub fn event_source(&self) -> Result<SimEventSource, GpuError> {
        let seen = self.read(|state| Ok(state.event_serial))?;
        // As NVML: a GPU registers if it answers now (a lost one cannot).
        let watched = self.inventory()?.gpus.iter().map(|g| g.minor).collect();
        Ok(SimEventSource {
            node: self.clone(),
            seen,
            watched,
            lease: self.lease()?,
            stamp: None,
        })
    }
}
