//! The NVML calls nvml-wrapper does not wrap (or wraps wrongly), made through its raw symbol
//! table. `possible_placements` in nvml-wrapper never sets the vector's length and always returns
//! nothing; the GI/CI lookups are not wrapped at all.
use std::os::raw::c_uint;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t,
    nvmlReturn_t,
};

use super::model::Placement;

/// A raw NVML call that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{function} returned {code}")]
pub struct RawError {
    pub function: &'static str,
    /// `nvmlReturn_t`; 0 never appears here. `u32::MAX` means the symbol is missing.
    pub code: u32,
}

pub const MISSING_SYMBOL: u32 = u32::MAX;

fn check(function: &'static str, ret: nvmlReturn_t) -> Result<(), RawError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(RawError {
            function,
            code: ret,
        })
    }
}

macro_rules! symbol {
    ($nvml:expr, $name:ident) => {
        $nvml.lib().$name.as_ref().map_err(|_| RawError {
            function: stringify!($name),
            code: MISSING_SYMBOL,
        })?
    };
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for a unique profile id.
///
/// # Safety
/// `device` must be a valid handle obtained from `nvml`.
pub unsafe fn possible_placements(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<Placement>, RawError> {
    let call = symbol!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    const NAME: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
    let mut count: c_uint = 0;
    // SAFETY: a NULL buffer asks for the count only.
    check(NAME, unsafe {
        call(device, profile_id, std::ptr::null_mut(), &mut count)
    })?;
    let mut buffer = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    if count > 0 {
        // SAFETY: the buffer holds `count` elements, as NVML was told.
        check(NAME, unsafe {
            call(device, profile_id, buffer.as_mut_ptr(), &mut count)
        })?;
    }
    buffer.truncate(count as usize);
    Ok(buffer
        .into_iter()
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

/// GPU-instance and compute-instance ids of a MIG device handle.
///
/// # Safety
/// `mig_device` must be a valid MIG device handle obtained from `nvml`.
pub unsafe fn mig_instance_ids(
    nvml: &Nvml,
    mig_device: nvmlDevice_t,
) -> Result<(u32, u32), RawError> {
    let gi_call = symbol!(nvml, nvmlDeviceGetGpuInstanceId);
    let ci_call = symbol!(nvml, nvmlDeviceGetComputeInstanceId);
    let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
    // SAFETY: out-pointers to live locals.
    check("nvmlDeviceGetGpuInstanceId", unsafe {
        gi_call(mig_device, &mut gi)
    })?;
    check("nvmlDeviceGetComputeInstanceId", unsafe {
        ci_call(mig_device, &mut ci)
    })?;
    Ok((gi, ci))
}

/// Unique profile id and placement of GPU instance `gpu_instance_id` on `device`.
///
/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
pub unsafe fn gpu_instance_info(
    nvml: &Nvml,
    device: nvmlDevice_t,
    gpu_instance_id: u32,
) -> Result<(u32, Placement), RawError> {
    let by_id = symbol!(nvml, nvmlDeviceGetGpuInstanceById);
    let info_call = symbol!(nvml, nvmlGpuInstanceGetInfo);
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local.
    check("nvmlDeviceGetGpuInstanceById", unsafe {
        by_id(device, gpu_instance_id, &mut gi)
    })?;
    let mut info = nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: `gi` came from NVML; out-pointer to a live local.
    check("nvmlGpuInstanceGetInfo", unsafe {
        info_call(gi, &mut info)
    })?;
    Ok((
        info.profileId,
        Placement {
            start: info.placement.start,
            size: info.placement.size,
        },
    ))
}
