//! MIG state as read: a GPU's profiles (with placements) per mode, and the instances that exist.

use nvml_wrapper::error::NvmlError;

use super::NvmlBackend;
use super::cache::{CachedGpu, GpuSlot};
use super::errors::{nvml_err, raw_err};
use crate::gpu::GpuError;
use crate::gpu::mig::{self, GPU_INSTANCE_PROFILE_COUNT};
use crate::gpu::model::*;
use crate::gpu::nvml_raw;

impl NvmlBackend {
    /// MIG state in `mode`: the profiles cached for that mode (read on first sight) and the
    /// instances that exist now.
    pub(super) fn read_mig(
        &self,
        gpu: &mut CachedGpu,
        mode: nvml_wrapper::structs::device::MigMode,
    ) -> Result<MigInfo, GpuError> {
        let current = mode.current == 1;
        let (profiles, memory_slices) = match &gpu.profiles[usize::from(current)] {
            Some(known) => known.clone(),
            None => {
                let read = self.read_profiles(gpu)?;
                gpu.profiles[usize::from(current)] = Some(read.clone());
                read
            }
        };
        let instances = if current {
            self.mig_instances(gpu)?
        } else {
            vec![]
        };
        Ok(MigInfo {
            mode: MigMode {
                current,
                pending: mode.pending == 1,
            },
            memory_slices,
            profiles,
            instances,
        })
    }

    /// The GPU instance profiles NVML offers now, with their placements, and the memory slices
    /// those span.
    fn read_profiles(&self, gpu: &CachedGpu) -> Result<(Vec<GiProfile>, u32), GpuError> {
        let index = gpu.gpu.index;
        let at = |what: &str| format!("GPU {index}: {what}");
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(gpu.handle.0, &self.nvml) };
        let mut profiles = Vec::new();
        for profile_enum in 0..GPU_INSTANCE_PROFILE_COUNT {
            let info = match device.profile_info(profile_enum) {
                Ok(info) => info,
                // NVML's documented way of saying "this GPU has no such profile".
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => continue,
                Err(e) => {
                    return Err(nvml_err(
                        &at(&format!("GPU instance profile {profile_enum}")),
                        e,
                    ));
                }
            };
            let Some(name) = mig::profile_name(
                profile_enum,
                info.memory_size_mb,
                gpu.gpu.memory_bytes.unwrap_or_default(),
            ) else {
                continue;
            };
            // SAFETY: a live full-GPU handle of `self.nvml`.
            let placements =
                unsafe { nvml_raw::possible_placements(&self.nvml, gpu.handle.0, info.id) }
                    .map_err(|e| raw_err(&at("placements"), e))?;
            profiles.push(GiProfile {
                name,
                profile_enum,
                id: info.id,
                slice_count: info.slice_count,
                instance_count: info.instance_count,
                memory_mib: info.memory_size_mb,
                multiprocessors: info.multiprocessor_count,
                copy_engines: info.copy_engine_count,
                decoders: info.decoder_count,
                encoders: info.encoder_count,
                jpeg_engines: info.jpeg_count,
                ofa_engines: info.ofa_count,
                p2p_supported: info.is_p2p_supported,
                placements,
            });
        }
        let memory_slices = profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(|pl| pl.end()))
            .max()
            .unwrap_or(0);
        Ok((profiles, memory_slices))
    }

    /// Walks the MIG device handles; each is one (GI, CI) pair.
    fn mig_instances(&self, gpu: &CachedGpu) -> Result<Vec<MigInstance>, GpuError> {
        let index = gpu.gpu.index;
        let handle = gpu.handle.0;
        let at = |what: &str| format!("GPU {index}: {what}");
        // SAFETY: the handle belongs to `self.nvml`.
        let device = unsafe { nvml_wrapper::Device::new(handle, &self.nvml) };
        let max = device
            .mig_device_count()
            .map_err(|e| nvml_err(&at("max MIG devices"), e))?;
        let mut instances = Vec::new();
        for slot in 0..max {
            let mig_device = match device.mig_device_by_index(slot) {
                Ok(d) => d,
                // Empty slots answer NOT_FOUND (some drivers INVALID_ARGUMENT).
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(e) => return Err(nvml_err(&at(&format!("MIG device {slot}")), e)),
            };
            // SAFETY: handles from `self.nvml`, alive for this call.
            let (gi, ci) = unsafe { nvml_raw::mig_instance_ids(&self.nvml, mig_device.handle()) }
                .map_err(|e| raw_err(&at("MIG instance ids"), e))?;
            let (profile_id, placement) =
                unsafe { nvml_raw::gpu_instance_info(&self.nvml, handle, gi) }
                    .map_err(|e| raw_err(&at(&format!("GPU instance {gi}")), e))?;
            instances.push(MigInstance {
                gpu_instance_id: gi,
                compute_instance_id: ci,
                profile_id,
                placement,
                uuid: mig_device
                    .uuid()
                    .map_err(|e| nvml_err(&at("MIG UUID"), e))?,
            });
        }
        instances.sort_by_key(|i| (i.gpu_instance_id, i.compute_instance_id));
        Ok(instances)
    }

    /// The profiles to look GPU instances up by: those of MIG mode when known (GPU instances exist
    /// only there), else those of the mode the GPU is in now, as a full discovery would list.
    pub(super) fn gi_profiles<'a>(
        &self,
        slot: &GpuSlot,
        gpu: &'a mut CachedGpu,
    ) -> Result<&'a [GiProfile], GpuError> {
        if gpu.profiles[1].is_none() {
            self.refresh(slot, gpu)?;
        }
        Ok(match (&gpu.profiles[1], &gpu.gpu.mig) {
            (Some((profiles, _)), _) => profiles,
            (None, Some(mig)) => &mig.profiles,
            (None, None) => &[],
        })
    }
}
