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

/// `Ok(false)` for NVML_ERROR_NOT_SUPPORTED: the platform has no such feature.
fn supported(function: &'static str, ret: nvmlReturn_t) -> Result<bool, RawError> {
    const NOT_SUPPORTED: nvmlReturn_t = 3;
    if ret == NOT_SUPPORTED {
        return Ok(false);
    }
    check(function, ret).map(|()| true)
}

macro_rules! symbol {
    ($nvml:expr, $name:ident) => {
        $nvml.lib().$name.as_ref().map_err(|_| RawError {
            function: stringify!($name),
            code: MISSING_SYMBOL,
        })?
    };
}

/// `nvmlDeviceGetAddressingMode`: how the GPU addresses system memory. `Ok(None)` where the
/// platform does not support it (NOT_SUPPORTED, or a missing symbol on drivers before R565),
/// as go-nvlib treats both.
///
/// # Safety
/// `device` must be a valid handle obtained from `nvml`.
pub unsafe fn addressing_mode(
    nvml: &Nvml,
    device: nvmlDevice_t,
) -> Result<Option<super::model::AddressingMode>, RawError> {
    const NAME: &str = "nvmlDeviceGetAddressingMode";
    let Ok(call) = nvml.lib().nvmlDeviceGetAddressingMode.as_ref() else {
        return Ok(None);
    };
    let mut mode = nvml_wrapper_sys::bindings::nvmlDeviceAddressingMode_t {
        // nvmlDeviceAddressingMode_v1: sizeof(struct) | 1 << 24.
        version: (std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlDeviceAddressingMode_t>()
            as u32)
            | (1 << 24),
        value: 0,
    };
    // SAFETY: `mode` is a valid out-pointer for the call's duration.
    if !supported(NAME, unsafe { call(device, &mut mode) })? {
        return Ok(None);
    }
    super::model::AddressingMode::from_nvml(mode.value)
        .map(Some)
        .ok_or(RawError {
            function: NAME,
            code: mode.value,
        })
}

/// `nvmlDeviceGetGpuFabricInfo`: the GPU's multi-node NVLink registration. `Ok(None)` where
/// the GPU or driver has no fabric (NOT_SUPPORTED, or a missing symbol on old drivers).
///
/// # Safety
/// `device` must be a valid handle obtained from `nvml`.
pub unsafe fn fabric_info(
    nvml: &Nvml,
    device: nvmlDevice_t,
) -> Result<Option<super::model::FabricInfo>, RawError> {
    const NAME: &str = "nvmlDeviceGetGpuFabricInfo";
    let Ok(call) = nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref() else {
        return Ok(None);
    };
    let mut info = nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: `info` is a valid out-pointer for the call's duration.
    if !supported(NAME, unsafe { call(device, &mut info) })? {
        return Ok(None);
    }
    let Some(state) = super::model::FabricState::from_nvml(info.state) else {
        return Err(RawError {
            function: NAME,
            code: info.state as u32,
        });
    };
    if state == super::model::FabricState::NotSupported {
        return Ok(None);
    }
    Ok(Some(super::model::FabricInfo {
        cluster_uuid: uuid::Uuid::from_bytes(info.clusterUuid).to_string(),
        clique_id: info.cliqueId,
        state,
    }))
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
    // SAFETY: the caller vouches for `device`; the handle comes from NVML.
    let (_, profile_id, placement) = unsafe {
        let gi = gpu_instance_handle(nvml, device, gpu_instance_id)?;
        gpu_instance_placement(nvml, gi)?
    };
    Ok((profile_id, placement))
}

// ---- MIG lifecycle (dynamic MIG) -------------------------------------------------------------

use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstanceProfileInfo_t,
};

/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const COMPUTE_INSTANCE_PROFILE_COUNT: u32 = 9;
const NVML_ERROR_INSUFFICIENT_SIZE: u32 = 7;

/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
unsafe fn gpu_instance_handle(
    nvml: &Nvml,
    device: nvmlDevice_t,
    id: u32,
) -> Result<nvmlGpuInstance_t, RawError> {
    let by_id = symbol!(nvml, nvmlDeviceGetGpuInstanceById);
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local.
    check("nvmlDeviceGetGpuInstanceById", unsafe {
        by_id(device, id, &mut gi)
    })?;
    Ok(gi)
}

/// # Safety
/// `gi` must be a GPU instance handle from `nvml`.
unsafe fn gpu_instance_placement(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
) -> Result<(u32, u32, Placement), RawError> {
    let info_call = symbol!(nvml, nvmlGpuInstanceGetInfo);
    let mut info = nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: out-pointer to a live local.
    check("nvmlGpuInstanceGetInfo", unsafe {
        info_call(gi, &mut info)
    })?;
    Ok((
        info.id,
        info.profileId,
        Placement {
            start: info.placement.start,
            size: info.placement.size,
        },
    ))
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`; returns the new GPU instance id.
///
/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
pub unsafe fn create_gpu_instance(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profile_id: u32,
    placement: Placement,
) -> Result<u32, RawError> {
    let create = symbol!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement);
    let wanted = nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: pointers to live locals.
    check("nvmlDeviceCreateGpuInstanceWithPlacement", unsafe {
        create(device, profile_id, &wanted, &mut gi)
    })?;
    // SAFETY: `gi` was just returned by NVML.
    Ok(unsafe { gpu_instance_placement(nvml, gi) }?.0)
}

/// The per-GPU-instance id of compute profile `profile_enum` (`NVML_COMPUTE_INSTANCE_PROFILE_*`).
unsafe fn compute_profile_id(
    nvml: &Nvml,
    gi: nvmlGpuInstance_t,
    profile_enum: u32,
) -> Result<u32, RawError> {
    let info_call = symbol!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
    let mut info = nvmlComputeInstanceProfileInfo_t {
        id: 0,
        sliceCount: 0,
        instanceCount: 0,
        multiprocessorCount: 0,
        sharedCopyEngineCount: 0,
        sharedDecoderCount: 0,
        sharedEncoderCount: 0,
        sharedJpegCount: 0,
        sharedOfaCount: 0,
    };
    // SAFETY: out-pointer to a live local; engine profile 0 is the only one (SHARED).
    check("nvmlGpuInstanceGetComputeInstanceProfileInfo", unsafe {
        info_call(gi, profile_enum, 0, &mut info)
    })?;
    Ok(info.id)
}

/// Creates a compute instance of `compute_profile_enum` in GPU instance `gi_id`; returns its id
/// and the MIG device UUID (read through the compute instance's device handle, not by walking
/// every MIG device).
///
/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
pub unsafe fn create_compute_instance(
    nvml: &Nvml,
    device: nvmlDevice_t,
    gi_id: u32,
    compute_profile_enum: u32,
) -> Result<(u32, String), RawError> {
    let create = symbol!(nvml, nvmlGpuInstanceCreateComputeInstance);
    let info_call = symbol!(nvml, nvmlComputeInstanceGetInfo_v2);
    let uuid_call = symbol!(nvml, nvmlDeviceGetUUID);
    // SAFETY: handles from NVML, out-pointers to live locals, buffer sizes as declared.
    unsafe {
        let gi = gpu_instance_handle(nvml, device, gi_id)?;
        let profile_id = compute_profile_id(nvml, gi, compute_profile_enum)?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        check(
            "nvmlGpuInstanceCreateComputeInstance",
            create(gi, profile_id, &mut ci),
        )?;
        let mut info: nvmlComputeInstanceInfo_t = std::mem::zeroed();
        check("nvmlComputeInstanceGetInfo_v2", info_call(ci, &mut info))?;
        let mut buffer = [0 as std::os::raw::c_char; 96];
        check(
            "nvmlDeviceGetUUID",
            uuid_call(info.device, buffer.as_mut_ptr(), buffer.len() as c_uint),
        )?;
        let uuid = std::ffi::CStr::from_ptr(buffer.as_ptr())
            .to_string_lossy()
            .into_owned();
        Ok((info.id, uuid))
    }
}

/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
pub unsafe fn destroy_compute_instance(
    nvml: &Nvml,
    device: nvmlDevice_t,
    gi_id: u32,
    ci_id: u32,
) -> Result<(), RawError> {
    let by_id = symbol!(nvml, nvmlGpuInstanceGetComputeInstanceById);
    let destroy = symbol!(nvml, nvmlComputeInstanceDestroy);
    // SAFETY: handles from NVML, out-pointer to a live local.
    unsafe {
        let gi = gpu_instance_handle(nvml, device, gi_id)?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        check(
            "nvmlGpuInstanceGetComputeInstanceById",
            by_id(gi, ci_id, &mut ci),
        )?;
        check("nvmlComputeInstanceDestroy", destroy(ci))
    }
}

/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
pub unsafe fn destroy_gpu_instance(
    nvml: &Nvml,
    device: nvmlDevice_t,
    gi_id: u32,
) -> Result<(), RawError> {
    let destroy = symbol!(nvml, nvmlGpuInstanceDestroy);
    // SAFETY: handle from NVML.
    unsafe {
        let gi = gpu_instance_handle(nvml, device, gi_id)?;
        check("nvmlGpuInstanceDestroy", destroy(gi))
    }
}

/// Every GPU instance of the given unique profile ids with their compute instance ids.
///
/// # Safety
/// `device` must be a valid full-GPU handle obtained from `nvml`.
pub unsafe fn gpu_instances(
    nvml: &Nvml,
    device: nvmlDevice_t,
    profiles: &[(u32, u32)],
) -> Result<Vec<super::GpuInstanceInfo>, RawError> {
    let list = symbol!(nvml, nvmlDeviceGetGpuInstances);
    let list_cis = symbol!(nvml, nvmlGpuInstanceGetComputeInstances);
    let ci_info = symbol!(nvml, nvmlComputeInstanceGetInfo_v2);
    let mut found = Vec::new();
    for &(profile_id, instance_count) in profiles {
        let mut handles = vec![std::ptr::null_mut(); instance_count.max(1) as usize];
        let mut count: c_uint = handles.len() as c_uint;
        // SAFETY: the buffer holds `count` handles.
        check("nvmlDeviceGetGpuInstances", unsafe {
            list(device, profile_id, handles.as_mut_ptr(), &mut count)
        })?;
        for &gi in handles.iter().take(count as usize) {
            // SAFETY: handles returned by NVML just now.
            let (id, profile, placement) = unsafe { gpu_instance_placement(nvml, gi) }?;
            let mut compute = Vec::new();
            for ci_enum in 0..COMPUTE_INSTANCE_PROFILE_COUNT {
                // A GPU instance offers only some compute profiles; the others answer errors.
                let Ok(ci_profile) = (unsafe { compute_profile_id(nvml, gi, ci_enum) }) else {
                    continue;
                };
                let mut cis = vec![std::ptr::null_mut(); 8];
                let mut n: c_uint = cis.len() as c_uint;
                // SAFETY: the buffer holds `n` handles.
                let ret = unsafe { list_cis(gi, ci_profile, cis.as_mut_ptr(), &mut n) };
                if ret == NVML_ERROR_INSUFFICIENT_SIZE {
                    continue;
                }
                check("nvmlGpuInstanceGetComputeInstances", ret)?;
                for &ci in cis.iter().take(n as usize) {
                    // SAFETY: handle from NVML; zeroed plain-data struct as out-parameter.
                    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
                    check("nvmlComputeInstanceGetInfo_v2", unsafe {
                        ci_info(ci, &mut info)
                    })?;
                    if !compute.contains(&info.id) {
                        compute.push(info.id);
                    }
                }
            }
            compute.sort_unstable();
            found.push(super::GpuInstanceInfo {
                id,
                profile_id: profile,
                placement,
                compute_instances: compute,
            });
        }
    }
    found.sort_by_key(|gi| gi.id);
    Ok(found)
}

// ---- events ----------------------------------------------------------------------------------

/// `nvmlInitWithFlags(NVML_INIT_FLAG_NO_GPUS)`: one more reference on NVML's session (opened
/// if it was closed, enumerating the GPUs afresh). Each is ended by [`shutdown`].
pub fn init_no_gpus(nvml: &Nvml) -> Result<(), RawError> {
    const NO_GPUS: c_uint = 1;
    let init = symbol!(nvml, nvmlInitWithFlags);
    // SAFETY: plain flags argument.
    check("nvmlInitWithFlags", unsafe { init(NO_GPUS) })
}

/// `nvmlShutdown`: ends one [`init_no_gpus`] (or the library's first init); the last one closes
/// the session and every handle on the GPUs it held.
pub fn shutdown(nvml: &Nvml) -> Result<(), RawError> {
    let shutdown = symbol!(nvml, nvmlShutdown);
    // SAFETY: no arguments.
    check("nvmlShutdown", unsafe { shutdown() })
}

use nvml_wrapper_sys::bindings::{nvmlEventData_t, nvmlEventSet_t};

/// `NVML_ERROR_TIMEOUT`: no event within the wait.
pub const NVML_ERROR_TIMEOUT: u32 = 10;
/// `NVML_ERROR_UNKNOWN`: after a failed registration NVML leaves the set undefined.
pub const NVML_ERROR_UNKNOWN: u32 = 999;

/// `nvmlEventSetCreate`. nvml-wrapper's `EventSet` borrows the `Nvml`, which an event source that
/// outlives the call cannot hold; the set is freed with [`free_event_set`].
pub fn create_event_set(nvml: &Nvml) -> Result<nvmlEventSet_t, RawError> {
    let create = symbol!(nvml, nvmlEventSetCreate);
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local.
    check("nvmlEventSetCreate", unsafe { create(&mut set) })?;
    Ok(set)
}

/// `nvmlDeviceRegisterEvents`.
///
/// # Safety
/// `device` must be a valid full-GPU handle and `set` a live event set, both from `nvml`.
pub unsafe fn register_events(
    nvml: &Nvml,
    device: nvmlDevice_t,
    event_types: u64,
    set: nvmlEventSet_t,
) -> Result<(), RawError> {
    let register = symbol!(nvml, nvmlDeviceRegisterEvents);
    // SAFETY: the caller vouches for both handles.
    check("nvmlDeviceRegisterEvents", unsafe {
        register(device, event_types, set)
    })
}

/// `nvmlEventSetWait_v2`: the next event, waiting up to `timeout_ms`.
///
/// # Safety
/// `set` must be a live event set from `nvml`, used by one thread at a time.
pub unsafe fn wait_event(
    nvml: &Nvml,
    set: nvmlEventSet_t,
    timeout_ms: u32,
) -> Result<nvmlEventData_t, RawError> {
    let wait = symbol!(nvml, nvmlEventSetWait_v2);
    // SAFETY: plain-data struct; NVML fills it.
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: the caller vouches for `set`; out-pointer to a live local.
    check("nvmlEventSetWait_v2", unsafe {
        wait(set, &mut data, timeout_ms)
    })?;
    Ok(data)
}

/// `nvmlEventSetFree`.
///
/// # Safety
/// `set` must be a live event set from `nvml`; it is gone afterwards.
pub unsafe fn free_event_set(nvml: &Nvml, set: nvmlEventSet_t) -> Result<(), RawError> {
    let free = symbol!(nvml, nvmlEventSetFree);
    // SAFETY: the caller vouches for `set`.
    check("nvmlEventSetFree", unsafe { free(set) })
}

/// `nvmlSetMemoryLimits_v1_t` (NVML 13.4).
#[repr(C)]
struct SetMemoryLimits {
    name_space: *const std::os::raw::c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t` (NVML 13.4).
#[repr(C)]
struct GetMemoryLimits {
    name_space: *const std::os::raw::c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type SetMemoryLimitsFn = unsafe extern "C" fn(nvmlDevice_t, *mut SetMemoryLimits) -> nvmlReturn_t;
type GetMemoryLimitsFn = unsafe extern "C" fn(nvmlDevice_t, *mut GetMemoryLimits) -> nvmlReturn_t;

/// NVML 13.4's per-cgroup memory limit calls, which nvml-wrapper's symbol table predates: looked
/// up in the same library NVML was loaded from (the loader hands back the loaded copy).
pub struct MemoryLimitCalls {
    set: SetMemoryLimitsFn,
    get: GetMemoryLimitsFn,
    /// Keeps the symbols above valid.
    _library: libloading::Library,
}

/// `NVML_ERROR_NOT_FOUND`: the cgroup has no limits on the device.
const NOT_FOUND: nvmlReturn_t = 6;

impl MemoryLimitCalls {
    /// The calls, if the library at `path` (or the loader's `libnvidia-ml.so.1`) has both.
    pub fn load(path: &std::ffi::OsStr) -> Result<Self, String> {
        // SAFETY: NVML is loaded already (nvml-wrapper initialised it); loading it again runs no
        // initialiser and returns the same copy.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.to_string_lossy()))?;
        // SAFETY: the types are the published prototypes of these two functions.
        let set = unsafe { library.get::<SetMemoryLimitsFn>(b"nvmlDeviceSetMemoryLimits_v1\0") }
            .map(|s| *s)
            .map_err(|_| {
                "the driver's NVML has no nvmlDeviceSetMemoryLimits_v1 (NVML 13.4 added it)"
                    .to_string()
            })?;
        // SAFETY: as above.
        let get = unsafe { library.get::<GetMemoryLimitsFn>(b"nvmlDeviceGetMemoryLimits_v1\0") }
            .map(|s| *s)
            .map_err(|_| {
                "the driver's NVML has no nvmlDeviceGetMemoryLimits_v1 (NVML 13.4 added it)"
                    .to_string()
            })?;
        Ok(Self {
            set,
            get,
            _library: library,
        })
    }

    /// The limits of the cgroup at `cgroup` on `device`; `None` when it has none.
    ///
    /// # Safety
    /// `device` must be a live handle of the library these calls came from.
    pub unsafe fn get(
        &self,
        device: nvmlDevice_t,
        cgroup: &std::ffi::CStr,
    ) -> Result<Option<(u64, u64)>, RawError> {
        let mut limits = GetMemoryLimits {
            name_space: cgroup.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: per this function's contract; `limits` lives for the call.
        let ret = unsafe { (self.get)(device, &mut limits) };
        if ret == NOT_FOUND {
            return Ok(None);
        }
        check("nvmlDeviceGetMemoryLimits_v1", ret)?;
        Ok(Some((limits.soft_limit, limits.hard_limit)))
    }

    /// Sets the limits of the cgroup at `cgroup` on `device` (0 and `u64::MAX` clear them).
    ///
    /// # Safety
    /// `device` must be a live handle of the library these calls came from.
    pub unsafe fn set(
        &self,
        device: nvmlDevice_t,
        cgroup: &std::ffi::CStr,
        soft: u64,
        hard: u64,
    ) -> Result<(), RawError> {
        let mut limits = SetMemoryLimits {
            name_space: cgroup.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: per this function's contract; `limits` lives for the call.
        check("nvmlDeviceSetMemoryLimits_v1", unsafe {
            (self.set)(device, &mut limits)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nvml_without_the_memory_limit_calls_says_which_it_lacks() {
        // Any loadable library without them stands for an NVML older than 13.4.
        let error = MemoryLimitCalls::load(std::ffi::OsStr::new("libc.so.6"))
            .err()
            .expect("no such symbols in the C library");
        assert!(
            error.contains("nvmlDeviceSetMemoryLimits_v1") && error.contains("13.4"),
            "{error}"
        );
        let error = MemoryLimitCalls::load(std::ffi::OsStr::new("/nonexistent/libnvidia-ml.so.1"))
            .err()
            .expect("no such library");
        assert!(error.contains("/nonexistent/libnvidia-ml.so.1"), "{error}");
    }
}
