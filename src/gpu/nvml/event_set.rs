//! The NVML event set and the event source on it (XIDs, double-bit ECC errors, MIG changes), and
//! the health probe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::{
    field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, nvmlEventData_t, nvmlEventMigConfigChange,
    nvmlEventSet_t, nvmlEventTypeDoubleBitEccError, nvmlEventTypeXidCriticalError,
};

use super::NvmlBackend;
use super::cache::{GpuHandles, Handle};
use super::errors::{nvml_err, raw_err};
use super::library::{NvmlLibrary, NvmlOpen};
use crate::gpu::GpuError;
use crate::gpu::events::{GpuEvent, GpuEventKind, GpuEventSource, GpuProbe, RecoveryAction};
use crate::gpu::nvml_raw::{self, RawError};
use crate::gpu::session::{Lease, SessionGate};

/// What the event source listens for: the faults that make a device unhealthy. NVIDIA's driver
/// also registers single-bit ECC errors but acts on XIDs only.
const FAULT_EVENTS: u64 =
    nvmlEventTypeXidCriticalError as u64 | nvmlEventTypeDoubleBitEccError as u64;

/// Also listened for where the GPU reports it: MIG devices made or destroyed by anyone, so they
/// are read again at once instead of at the next periodic rescan.
const MIG_EVENTS: u64 = nvmlEventMigConfigChange as u64;

/// Most events one [`GpuEventSource::wait`] returns; the rest wait in NVML for the next call.
const MAX_EVENTS_PER_WAIT: usize = 64;

/// NVML's "no GPU instance / compute instance" in event data.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// A registered NVML event set (raw: nvml-wrapper's `EventSet` borrows the `Nvml`, and this one
/// must outlive the call that made it). It keeps the session open, so it is given back whenever
/// the session is to close, and registered again on the next session.
struct NvmlEventSource {
    nvml: Arc<NvmlLibrary>,
    session: Arc<SessionGate<NvmlOpen>>,
    registered: Option<RegisteredSet>,
}

/// An event set registered on the GPUs of one session.
struct RegisteredSet {
    set: nvmlEventSet_t,
    /// The registered GPUs: `(minor, handle)`.
    gpus: Vec<(u32, Handle)>,
    nvml: Arc<NvmlLibrary>,
    /// Keeps the session (and so the set and handles) valid; dropped after `Drop` frees the set.
    _lease: Lease<NvmlOpen>,
}

// SAFETY: the set is an opaque NVML token, valid from any thread while the session is open (which
// the lease guarantees); `wait` takes `&mut self`, so one thread uses it at a time, as NVML requires.
unsafe impl Send for RegisteredSet {}

impl Drop for RegisteredSet {
    fn drop(&mut self) {
        // SAFETY: the set is live and freed only here.
        if let Err(e) = unsafe { nvml_raw::free_event_set(&self.nvml, self.set) } {
            tracing::warn!(error = %e, "cannot free the NVML event set");
        }
    }
}

impl RegisteredSet {
    /// A set with XIDs and double-bit ECC errors registered on every GPU of the session that
    /// supports them. A GPU that cannot register is left out with a warning, not the whole node.
    fn register(nvml: &Arc<NvmlLibrary>, lease: Lease<NvmlOpen>) -> Result<Self, GpuError> {
        let handles = GpuHandles::enumerate(nvml)?;
        for (index, e) in &handles.unreachable {
            tracing::warn!(index, error = %e, "GPU unreachable; no fault events from it");
        }
        let set =
            nvml_raw::create_event_set(nvml).map_err(|e| raw_err("create an NVML event set", e))?;
        // From here on, dropping `registered` frees the set.
        let mut registered = Self {
            set,
            gpus: Vec::with_capacity(handles.gpus.len()),
            nvml: Arc::clone(nvml),
            _lease: lease,
        };
        for &(minor, handle) in &handles.gpus {
            // SAFETY: the handle belongs to the session the lease keeps open.
            let device = unsafe { nvml_wrapper::Device::new(handle.0, nvml) };
            // Registering an unsupported type fails the whole call: ask first.
            let supported = match device.supported_event_types() {
                Ok(types) => types.bits(),
                Err(e) => {
                    tracing::warn!(minor, error = %e, "cannot read the GPU's event types; no fault events from it");
                    continue;
                }
            };
            let faults = supported & FAULT_EVENTS;
            if faults == 0 {
                tracing::warn!(
                    minor,
                    supported,
                    "GPU reports neither XIDs nor ECC errors; no fault events from it"
                );
                continue;
            }
            let types = faults | (supported & MIG_EVENTS);
            // SAFETY: a full-GPU handle and a live set, both of this session.
            match unsafe { nvml_raw::register_events(nvml, handle.0, types, set) } {
                Ok(()) => registered.gpus.push((minor, handle)),
                // NVML leaves the set undefined after this one.
                Err(
                    e @ RawError {
                        code: nvml_raw::NVML_ERROR_UNKNOWN,
                        ..
                    },
                ) => return Err(raw_err(&format!("GPU {minor}: register events"), e)),
                Err(e) => {
                    tracing::warn!(minor, error = %e, "cannot register for the GPU's events; no fault events from it");
                }
            }
        }
        tracing::debug!(
            gpus = ?registered.gpus.iter().map(|(m, _)| m).collect::<Vec<_>>(),
            "NVML events registered"
        );
        Ok(registered)
    }

    /// Our event for NVML's, if it is one we registered for on a GPU we know.
    fn event(&self, data: &nvmlEventData_t) -> Option<GpuEvent> {
        let Some(minor) = self
            .gpus
            .iter()
            .find(|(_, h)| std::ptr::eq(h.0, data.device))
            .map(|(m, _)| *m)
        else {
            tracing::warn!(
                event_type = data.eventType,
                "NVML event on a device that was not registered; ignored"
            );
            return None;
        };
        let kind = if data.eventType & u64::from(nvmlEventTypeXidCriticalError) != 0 {
            GpuEventKind::Xid {
                code: data.eventData,
            }
        } else if data.eventType & u64::from(nvmlEventTypeDoubleBitEccError) != 0 {
            GpuEventKind::DoubleBitEcc
        } else if data.eventType & MIG_EVENTS != 0 {
            GpuEventKind::MigConfigChange
        } else {
            tracing::debug!(minor, event_type = data.eventType, "NVML event ignored");
            return None;
        };
        let instance = |id: u32| (id != NO_INSTANCE).then_some(id);
        Some(GpuEvent {
            minor,
            kind,
            gpu_instance_id: instance(data.gpuInstanceId),
            compute_instance_id: instance(data.computeInstanceId),
        })
    }
}

impl NvmlEventSource {
    /// The set of the open session, registered again if the session changed; `None` while it is
    /// closing (the set is given back then, so that the close does not wait for it).
    fn registered(&mut self) -> Result<Option<&mut RegisteredSet>, GpuError> {
        if self.session.closing() {
            self.registered = None;
            return Ok(None);
        }
        if self.registered.is_none() {
            let nvml = Arc::clone(&self.nvml);
            let lease = self.session.lease(|| NvmlOpen::init(&nvml))?;
            self.registered = Some(RegisteredSet::register(&self.nvml, lease)?);
        }
        Ok(self.registered.as_mut())
    }
}

impl GpuEventSource for NvmlEventSource {
    fn watched(&self) -> Vec<u32> {
        self.registered
            .as_ref()
            .map(|r| r.gpus.iter().map(|(minor, _)| *minor).collect())
            .unwrap_or_default()
    }

    fn wait(&mut self, timeout: Duration) -> Result<Vec<GpuEvent>, GpuError> {
        let deadline = Instant::now() + timeout;
        let Some(registered) = self.registered()? else {
            // The session is closing for a GPU leaving `nvidia`; events resume on the next one.
            std::thread::sleep(timeout);
            return Ok(vec![]);
        };
        let mut events = Vec::new();
        while events.len() < MAX_EVENTS_PER_WAIT {
            // NVML hands out one event per call: after the first, take only what is ready. A
            // close waits for this set: the waits are short.
            let left = if events.is_empty() {
                deadline.saturating_duration_since(Instant::now())
            } else {
                Duration::ZERO
            };
            let timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
            // SAFETY: the set is live while `registered` is, and `&mut self` keeps this thread
            // alone on it.
            match unsafe { nvml_raw::wait_event(&registered.nvml, registered.set, timeout_ms) } {
                Ok(data) => events.extend(registered.event(&data)),
                // The timeout, or an interrupt that ended the wait early.
                Err(RawError {
                    code: nvml_raw::NVML_ERROR_TIMEOUT,
                    ..
                }) => {
                    if !events.is_empty() || Instant::now() >= deadline {
                        break;
                    }
                }
                // What was taken from NVML is not lost; the next wait reports the error again.
                Err(e) if !events.is_empty() => {
                    tracing::debug!(error = %e, "NVML event wait failed after events");
                    break;
                }
                Err(e) => return Err(raw_err("wait for GPU events", e)),
            }
        }
        Ok(events)
    }
}

impl NvmlBackend {
    /// Lost or not (a temperature read, which needs the GPU to answer), and the recovery action
    /// the driver asks for (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, R550 and newer).
    pub fn probe(&self, minor: u32) -> Result<GpuProbe, GpuError> {
        let at = |what: &str| format!("GPU {minor}: {what}");
        let _session = self.lease()?;
        let handles = self.gpu_handles()?;
        let Some(handle) = handles.handle(minor) else {
            // A GPU lost before its minor was read is known by index only: it may be this one.
            if handles
                .unreachable
                .iter()
                .any(|(_, e)| matches!(e, NvmlError::GpuLost))
            {
                return Ok(GpuProbe {
                    lost: true,
                    recovery_action: None,
                });
            }
            return Err(GpuError::Nvml {
                operation: at("probe"),
                reason: "no GPU with this minor number".into(),
            });
        };
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(handle.0, &self.nvml) };
        let mut lost = match device.temperature(TemperatureSensor::Gpu) {
            Ok(_) => false,
            Err(NvmlError::GpuLost) => true,
            // No sensor: nothing to tell from it.
            Err(
                NvmlError::NotSupported
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => false,
            Err(e) => return Err(nvml_err(&at("temperature"), e)),
        };
        let field = FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION);
        let value = match device.field_values_for(&[field]) {
            Ok(values) => match values.into_iter().next() {
                Some(Ok(sample)) => sample.value,
                Some(Err(e)) => Err(e),
                None => Err(NvmlError::NotSupported),
            },
            Err(e) => Err(e),
        };
        let recovery_action = match value {
            Ok(value) => Some(RecoveryAction::from_nvml(
                recovery_value(&value).ok_or_else(|| GpuError::Nvml {
                    operation: at("recovery action"),
                    reason: format!("unexpected value {value:?}"),
                })?,
            )),
            // Drivers before R550 do not know the field.
            Err(
                NvmlError::NotSupported
                | NvmlError::InvalidArg
                | NvmlError::FunctionNotFound
                | NvmlError::FailedToLoadSymbol(_),
            ) => None,
            Err(NvmlError::GpuLost) => {
                lost = true;
                None
            }
            Err(e) => return Err(nvml_err(&at("recovery action"), e)),
        };
        Ok(GpuProbe {
            lost,
            recovery_action,
        })
    }

    /// An NVML event set with XIDs and double-bit ECC errors registered on every GPU that
    /// supports them (see [`RegisteredSet::register`]); registered again on each new session.
    pub fn event_source(&self) -> Result<Box<dyn GpuEventSource>, GpuError> {
        let lease = self.lease()?;
        let registered = RegisteredSet::register(&self.nvml, lease)?;
        Ok(Box::new(NvmlEventSource {
            nvml: Arc::clone(&self.nvml),
            session: Arc::clone(&self.session),
            registered: Some(registered),
        }))
    }
}

/// A field value as `nvmlDeviceGpuRecoveryAction_t` (NVML reports it as an unsigned int).
fn recovery_value(value: &SampleValue) -> Option<u32> {
    match *value {
        SampleValue::U32(v) => Some(v),
        SampleValue::U64(v) => u32::try_from(v).ok(),
        SampleValue::I64(v) => u32::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}
