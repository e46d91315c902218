//! The GPU memory a shared claim consumed, enforced on the GPU per container.
//!
//! NVML 13.4 limits what the processes of one cgroup (v2) may allocate on a full GPU; the
//! container toolkit's `nvidia-cdi-hook apply-cuda-memory-limits` (toolkit 1.20) sets those
//! limits for a container from `NVIDIA_GPU_MEMORY_REQUEST` / `NVIDIA_GPU_MEMORY_LIMIT` (MiB) in
//! its environment, as a `createRuntime` hook: the runtime runs it on the host once the
//! container's cgroup exists. A claim's CDI spec carries both, so every container of the claim is
//! held to what the claim consumed (KEP-5075 `memory`). Where the node cannot (NVML or toolkit
//! too old, cgroup v1, MIG devices), the claim's owner is told, and the MPS client limits stay
//! what holds the claim.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::cdi::{ContainerEdits, Hook};
use super::checkpoint::DeviceRecord;
use crate::gpu::GpuControl;

/// The toolkit hook's command (one of `driver_files::HOOK_COMMANDS`, read from its binary).
pub const HOOK_COMMAND: &str = "apply-cuda-memory-limits";
const REQUEST_ENV: &str = "NVIDIA_GPU_MEMORY_REQUEST";
const LIMIT_ENV: &str = "NVIDIA_GPU_MEMORY_LIMIT";
/// `CGROUP2_SUPER_MAGIC`.
const CGROUP2_MAGIC: i128 = 0x6367_7270;
/// cgroup trees are shallow (kubepods/<qos>/pod/<container> at most a few more under systemd).
const SWEEP_DEPTH: usize = 12;

/// How this node enforces consumed GPU memory.
#[derive(Debug, Clone)]
pub enum MemoryLimits {
    /// Per container, through the toolkit's hook and NVML.
    Enforced(LimitHook),
    /// Not at all on this node: why.
    Unavailable(String),
}

/// What the hook needs and where the limits live.
#[derive(Debug, Clone)]
pub struct LimitHook {
    /// The toolkit's hook, as the host (the container runtime) runs it.
    pub hook: PathBuf,
    /// The driver root as the host sees it: the hook loads its `libnvidia-ml.so.1`.
    pub driver_root: PathBuf,
    /// The host's cgroup v2 hierarchy, as this process reaches it: swept at unprepare.
    pub cgroup_root: PathBuf,
}

impl MemoryLimits {
    /// What this node can do. `hook`: the toolkit's hook (host path) and the commands its binary
    /// has (`DriverFiles::hook_commands`); `host_cgroup_root`: the host's `/sys/fs/cgroup` as
    /// this process reaches it.
    pub fn detect(
        gpus: &dyn GpuControl,
        hook: Option<(&Path, &BTreeSet<&str>)>,
        driver_root: &Path,
        host_cgroup_root: &Path,
    ) -> Self {
        if let Err(reason) = gpus.memory_limits_supported() {
            return Self::Unavailable(reason);
        }
        let Some((hook, commands)) = hook else {
            return Self::Unavailable(format!(
                "the node has no nvidia-cdi-hook (the NVIDIA container toolkit's, 1.20 or newer, applies the limits; --nvidia-cdi-hook-path names it when it is outside {})",
                driver_root.display()
            ));
        };
        if !commands.contains(HOOK_COMMAND) {
            return Self::Unavailable(format!(
                "{} has no {HOOK_COMMAND} command, or cannot be read (the NVIDIA container toolkit added it in 1.20)",
                hook.display()
            ));
        }
        match rustix::fs::statfs(host_cgroup_root) {
            Ok(fs) if i128::from(fs.f_type) == CGROUP2_MAGIC => {}
            Ok(_) => {
                return Self::Unavailable(
                    "the node's /sys/fs/cgroup is not cgroup v2 (NVML limits GPU memory per cgroup v2)"
                        .into(),
                );
            }
            Err(e) => {
                return Self::Unavailable(format!(
                    "cannot read the node's /sys/fs/cgroup ({}): {e}",
                    host_cgroup_root.display()
                ));
            }
        }
        Self::Enforced(LimitHook {
            hook: hook.to_path_buf(),
            driver_root: driver_root.to_path_buf(),
            cgroup_root: host_cgroup_root.to_path_buf(),
        })
    }

    /// What a claim's containers get so that the GPU holds each to the memory the claim consumed
    /// (nothing when it consumed none or the node cannot), and what the claim's owner must be
    /// told: `(reason, note)` for Warning Events.
    pub fn for_claim(
        &self,
        devices: &[DeviceRecord],
    ) -> (ContainerEdits, Vec<(&'static str, String)>) {
        let limited: Vec<(&DeviceRecord, u64)> = devices
            .iter()
            .filter(|d| d.share_id.is_some())
            .filter_map(|d| Some((d, consumed_memory(d)?)))
            .collect();
        let mut edits = ContainerEdits::default();
        let mut warnings = Vec::new();
        let note = |d: &DeviceRecord, why: &str| {
            (
                "GpuMemoryNotEnforced",
                format!(
                    "device {}: the {} MiB of GPU memory this claim consumed are not enforced per container: {why}{}",
                    d.device,
                    consumed_memory(d).unwrap_or_default() >> 20,
                    if super::sharing::wants_mps(d.config.as_ref()) {
                        "; the MPS client's pinned-memory limit holds it"
                    } else {
                        "; nothing holds the container to it"
                    }
                ),
            )
        };
        let (full, mig): (Vec<_>, Vec<_>) = limited.iter().partition(|(d, _)| d.mig.is_none());
        for (d, _) in &mig {
            warnings.push(note(
                d,
                "NVML limits memory per full GPU, not per MIG device",
            ));
        }
        let Some(&(_, bytes)) = full.first() else {
            return (edits, warnings);
        };
        let hook = match self {
            Self::Enforced(hook) => hook,
            Self::Unavailable(reason) => {
                warnings.extend(full.iter().map(|(d, _)| note(d, reason)));
                return (edits, warnings);
            }
        };
        if full.iter().any(|(_, b)| *b != bytes) {
            // One container has one NVIDIA_GPU_MEMORY_LIMIT for all its GPUs.
            warnings.extend(full.iter().map(|(d, _)| {
                note(
                    d,
                    "the claim's GPUs consumed different amounts, and a container has one limit for all its GPUs",
                )
            }));
            return (edits, warnings);
        }
        // Consumed memory is counted in whole MiB (the request rounded up): request and limit
        // are the same amount.
        let mib = bytes >> 20;
        edits.env.push(format!("{REQUEST_ENV}={mib}"));
        edits.env.push(format!("{LIMIT_ENV}={mib}"));
        let mut args = vec![
            "nvidia-cdi-hook".to_string(),
            HOOK_COMMAND.to_string(),
            "--driver-root".to_string(),
            hook.driver_root.display().to_string(),
        ];
        for (d, _) in &full {
            args.push("--gpu-id".into());
            args.push(d.uuid.clone());
        }
        edits.hooks.push(Hook {
            hook_name: "createRuntime".into(),
            path: hook.hook.display().to_string(),
            args,
        });
        (edits, warnings)
    }

    /// Clears the limits that cgroups without a process left hold on these GPUs (by minor):
    /// a claim's containers are gone when it is unprepared. Removing a cgroup clears its limits
    /// too; this covers cgroups the runtime keeps. Returns the cgroups cleared.
    pub fn clear_left_over(&self, gpus: &dyn GpuControl, minors: &[u32]) -> Vec<PathBuf> {
        let Self::Enforced(hook) = self else {
            return vec![];
        };
        if minors.is_empty() {
            return vec![];
        }
        let mut cleared = Vec::new();
        let mut pending = vec![(hook.cgroup_root.clone(), 0)];
        while let Some((dir, depth)) = pending.pop() {
            if depth < SWEEP_DEPTH
                && let Ok(entries) = std::fs::read_dir(&dir)
            {
                pending.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| (e.path(), depth + 1)),
                );
            }
            if populated(&dir) {
                continue;
            }
            for &minor in minors {
                match gpus.memory_limit(minor, &dir) {
                    Ok(Some(_)) => match gpus.clear_memory_limit(minor, &dir) {
                        Ok(()) => cleared.push(dir.clone()),
                        Err(error) => {
                            tracing::warn!(%error, "cannot clear a GPU memory limit left by a container");
                        }
                    },
                    Ok(None) => {}
                    // Gone meanwhile, or a GPU that cannot answer: nothing to clear now.
                    Err(error) => {
                        tracing::debug!(%error, "cannot read a cgroup's GPU memory limits")
                    }
                }
            }
        }
        cleared
    }
}

/// The GPU memory a shared device record consumed, in bytes, when it consumed any.
fn consumed_memory(record: &DeviceRecord) -> Option<u64> {
    let quantity = record.consumed.get("memory")?;
    let bytes = k8s_quantity::Quantity::parse(quantity)
        .ok()?
        .as_approximate_float();
    (bytes >= 1.0).then_some(bytes as u64)
}

/// Whether a cgroup (v2) has processes, in it or below it.
fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|events| events.lines().any(|l| l == "populated 1"))
        // No such file: the root cgroup (never empty) or no cgroup at all.
        .unwrap_or(true)
}
