//! NVML's failures as [`GpuError`]s; a lost GPU and a refused MIG call as the simulator says them.

use nvml_wrapper::error::NvmlError;

use crate::gpu::GpuError;
use crate::gpu::nvml_raw::{self, RawError};

pub(super) fn nvml_err(operation: &str, e: NvmlError) -> GpuError {
    GpuError::Nvml {
        operation: operation.to_string(),
        reason: e.to_string(),
    }
}

/// A failed call on GPU `minor`; a lost GPU's as [`MigFailure::Lost`](super::MigFailure::Lost),
/// as the simulator says it, so callers tell a lost GPU from a refusal.
pub(super) fn read_err(minor: u32, operation: &'static str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::GpuLost => GpuError::Mig {
            minor,
            operation,
            failure: super::MigFailure::Lost,
            detail: String::new(),
        },
        e => nvml_err(&format!("GPU {minor}: {operation}"), e),
    }
}

/// A failed compute-mode call; a lost GPU's as the simulator says it.
pub(super) fn sharing_err(minor: u32, operation: &'static str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::GpuLost => GpuError::Sharing {
            minor,
            operation,
            reason: "GPU is lost".into(),
        },
        e => nvml_err(&format!("GPU {minor}: {operation}"), e),
    }
}

pub(super) fn raw_err(operation: &str, e: RawError) -> GpuError {
    let reason = match e.code {
        nvml_raw::MISSING_SYMBOL => format!("the NVML library lacks {}", e.function),
        code => format!("{} returned NVML error {code}", e.function),
    };
    GpuError::Nvml {
        operation: operation.to_string(),
        reason,
    }
}

/// An NVML MIG call's failure, in the terms the simulator uses.
pub(super) fn mig_failure(minor: u32, operation: &'static str, e: RawError) -> GpuError {
    let failure = match e.code {
        2 => super::MigFailure::InvalidArgument,
        3 => super::MigFailure::NotSupported,
        6 => super::MigFailure::NotFound,
        15 => super::MigFailure::Lost,
        19 => super::MigFailure::InUse,
        23 => super::MigFailure::InsufficientResources,
        _ => return raw_err(&format!("GPU {minor}: {operation}"), e),
    };
    GpuError::Mig {
        minor,
        operation,
        failure,
        detail: e.to_string(),
    }
}
