//! GPU memory limits per cgroup (NVML 13.4's `nvmlDeviceSetMemoryLimits_v1` /
//! `nvmlDeviceGetMemoryLimits_v1`): a soft and a hard limit on what the processes of one cgroup
//! (v2) may allocate on a full GPU. The container toolkit's `apply-cuda-memory-limits` hook sets
//! them for a container; the driver reads and clears them.
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: no hard limit.
pub const LIMIT_MAX: u64 = u64::MAX;

/// The limits one cgroup has on one GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLimit {
    pub soft: u64,
    pub hard: u64,
}

impl MemoryLimit {
    /// What NVML takes as "no limit": setting it clears the cgroup's limits.
    pub const NONE: Self = Self {
        soft: 0,
        hard: LIMIT_MAX,
    };
}

/// Why a memory-limit call was refused, in NVML's terms (so the fake NVML returns the same code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryLimitFailure {
    /// `NVML_ERROR_INVALID_ARGUMENT`: soft above hard, or a limit above the GPU's memory.
    InvalidArgument,
    /// `NVML_ERROR_NOT_SUPPORTED`: a MIG device, a GPU in MIG mode, or a driver without it.
    NotSupported,
    /// `NVML_ERROR_OPERATING_SYSTEM`: the cgroup path cannot be opened.
    OperatingSystem,
    /// `NVML_ERROR_GPU_IS_LOST`.
    Lost,
}

impl MemoryLimitFailure {
    /// The `nvmlReturn_t` value.
    pub fn nvml_return(&self) -> u32 {
        match self {
            Self::InvalidArgument => 2,
            Self::NotSupported => 3,
            Self::OperatingSystem => 17,
            Self::Lost => 15,
        }
    }
}

impl fmt::Display for MemoryLimitFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InvalidArgument => "invalid argument",
            Self::NotSupported => "not supported",
            Self::OperatingSystem => "the cgroup cannot be opened",
            Self::Lost => "GPU is lost",
        })
    }
}

/// The identity of the cgroup at `path`: its inode number (a cgroup v2 directory's inode is the
/// cgroup's id), so one cgroup reached through different mount points is one key. `None` where
/// `path` is no cgroup directory.
pub fn cgroup_id(path: &Path) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    (meta.is_dir() && path.join("cgroup.procs").is_file()).then(|| meta.ino())
}

/// Checks a limit against a GPU with `memory_bytes` of memory, as NVML does.
pub fn check(limit: MemoryLimit, memory_bytes: u64) -> Result<(), MemoryLimitFailure> {
    if limit.soft > limit.hard
        || limit.soft > memory_bytes
        || (limit.hard != LIMIT_MAX && limit.hard > memory_bytes)
    {
        return Err(MemoryLimitFailure::InvalidArgument);
    }
    Ok(())
}
