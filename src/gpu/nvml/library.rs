//! The loaded `libnvidia-ml` and its `nvmlInit` references: the glue between the backend and
//! the NVML session (see [`crate::gpu::session`]).

use std::sync::Arc;

use nvml_wrapper::Nvml;

use super::NvmlBackend;
use super::errors::raw_err;
use crate::gpu::GpuError;
use crate::gpu::nvml_raw;
use crate::gpu::session::Lease;

/// The loaded `libnvidia-ml`. nvml-wrapper's `Nvml` ends one `nvmlInit` when dropped; here each
/// reference is an [`NvmlOpen`] of its own, so the library is never dropped (nor unloaded: it
/// lives as long as the process, as one backend does).
pub(crate) struct NvmlLibrary(pub(super) std::mem::ManuallyDrop<Nvml>);

impl std::ops::Deref for NvmlLibrary {
    type Target = Nvml;
    fn deref(&self) -> &Nvml {
        &self.0
    }
}

/// One `nvmlInit` reference: the session is open while any lives (NVML counts them), and its
/// drop ends one with `nvmlShutdown`.
pub(crate) struct NvmlOpen {
    nvml: Arc<NvmlLibrary>,
}

impl NvmlOpen {
    /// Opens (or joins) NVML's session, enumerating the GPUs afresh when it was closed.
    pub(super) fn init(nvml: &Arc<NvmlLibrary>) -> Result<Self, GpuError> {
        nvml_raw::init_no_gpus(nvml).map_err(|e| raw_err("initialise NVML", e))?;
        Ok(Self {
            nvml: Arc::clone(nvml),
        })
    }

    /// The reference the library's own first init took.
    pub(super) fn adopt(nvml: &Arc<NvmlLibrary>) -> Self {
        Self {
            nvml: Arc::clone(nvml),
        }
    }
}

impl Drop for NvmlOpen {
    fn drop(&mut self) {
        if let Err(e) = nvml_raw::shutdown(&self.nvml) {
            tracing::warn!(error = %e, "cannot end the NVML session");
        }
    }
}

impl NvmlBackend {
    /// A lease on the NVML session, opening a new one if it was closed; the cached handles of an
    /// older session are dropped first. Never taken while holding the cache (a close may be
    /// waiting for the caller's other lease).
    pub(super) fn lease(&self) -> Result<Lease<NvmlOpen>, GpuError> {
        let lease = self.session.lease(|| NvmlOpen::init(&self.nvml))?;
        let mut cached = self
            .cached_session
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *cached != lease.generation() {
            self.invalidate_all();
            *cached = lease.generation();
        }
        Ok(lease)
    }
}
