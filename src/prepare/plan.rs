//! From an allocated claim to what preparing it means on this node: each allocation result
//! checked (ours, this pool, not held by another claim, no whole GPU beside one of its MIG
//! devices, sharing settings valid and allowed) and resolved to a [`Target`], with the claim's
//! opaque configs decoded strictly. Nothing here changes anything: [`super::state`] applies the
//! plan through [`super::effects`].
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};

use super::ClaimRef;
use super::cdi::CdiStore;
use super::checkpoint::{Checkpoint, DeviceRecord, MigRecord, VfioRecord};
use super::config::DriverConfig;
use super::error::PrepareError;
use super::sharing;
use crate::config::{self, DeviceConfig};
use crate::gpu::mig::{GpuMode, gpu_device_name, mig_device_name, parse_mig_device_name};
use crate::gpu::{NodeInventory, Placement};

/// A device of this node a claim result names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Gpu {
        minor: u32,
        uuid: String,
    },
    /// An existing MIG device (static MIG): used as is, never destroyed by us.
    StaticMig {
        parent_minor: u32,
        gpu_instance_id: u32,
        compute_instance_id: u32,
        uuid: String,
    },
    /// A free MIG placement: carved at prepare, destroyed at unprepare.
    Placement {
        parent_minor: u32,
        profile_id: u32,
        placement: Placement,
    },
    /// A whole GPU for a virtual machine: bound to `vfio-pci` at prepare, back at unprepare.
    Vfio {
        bus_id: String,
        /// `None` when it is bound to vfio-pci already (NVML does not see it).
        minor: Option<u32>,
        iommu_group: u32,
    },
}

impl Target {
    /// The GPU the device is on, by minor, when NVML knows it.
    pub fn minor(&self) -> Option<u32> {
        match self {
            Self::Gpu { minor, .. } => Some(*minor),
            Self::StaticMig { parent_minor, .. } | Self::Placement { parent_minor, .. } => {
                Some(*parent_minor)
            }
            Self::Vfio { minor, .. } => *minor,
        }
    }
}
/// One allocation result planned: the result, the device it names, the config that applies.
pub type PlannedDevice = (DeviceRequestAllocationResult, Target, Option<DeviceConfig>);

/// What planning reads: the node's settings and state at one moment.
pub struct Planner<'a> {
    pub config: &'a DriverConfig,
    pub modes: BTreeMap<u32, GpuMode>,
    pub checkpoint: &'a Checkpoint,
    pub inventory: &'a NodeInventory,
    pub cdi: &'a CdiStore,
    /// Whether MPS daemons can run here.
    pub mps_available: sharing::MpsAvailability<'a>,
    /// Why time-slice intervals cannot be set here (see `GpuControl::timeslice_unavailable`).
    pub timeslice_unavailable: Option<&'a str>,
    /// `--mps-share-across-namespaces`.
    pub mps_across_namespaces: bool,
}

impl Planner<'_> {
    pub fn plan(
        &self,
        claim_ref: &ClaimRef,
        claim: &ResourceClaim,
    ) -> Result<Vec<PlannedDevice>, PrepareError> {
        let name = format!("{}/{}", claim_ref.namespace, claim_ref.name);
        let bad = |reason: String| PrepareError::Claim {
            claim: name.clone(),
            reason,
        };
        let actual_uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if actual_uid != claim_ref.uid {
            return Err(bad(format!(
                "has UID {actual_uid:?}, kubelet asked for {:?}",
                claim_ref.uid
            )));
        }
        let allocation = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .ok_or_else(|| bad("is not allocated".into()))?;
        let configs =
            self.decode_configs(allocation.config.as_deref().unwrap_or_default(), &bad)?;
        let mut plan = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, result) in allocation.results.iter().flatten().enumerate() {
            if result.driver != self.config.driver_name {
                continue;
            }
            let at = format!("status.allocation.devices.results[{i}]");
            if result.pool != self.config.node_name {
                return Err(bad(format!(
                    "{at}: device {:?} is in pool {:?}, not this node's pool {:?}",
                    result.device, result.pool, self.config.node_name
                )));
            }
            let target = self
                .resolve(&result.device)
                .map_err(|reason| bad(format!("{at}: device {:?}: {reason}", result.device)))?;
            let admin = result.admin_access == Some(true);
            // A shareID: the scheduler allocated part of a device published for several claims.
            let shared = result.share_id.is_some();
            if shared && !self.config.consumable.is_on() {
                return Err(bad(format!(
                    "{at}.shareID: device {:?} is not published for sharing (--consumable-shares is off)",
                    result.device
                )));
            }
            if !admin
                && let Some(holder) = self.checkpoint.exclusive_holder_of(
                    &result.pool,
                    &result.device,
                    &claim_ref.uid,
                    shared,
                )
            {
                return Err(bad(format!(
                    "{at}: device {:?} is already prepared for ResourceClaim {}/{}",
                    result.device, holder.namespace, holder.name
                )));
            }
            // Stale slices can still offer a placement of a GPU another claim holds whole (or the
            // whole GPU while another claim holds one of its MIG devices): never share a GPU
            // that way, and never switch a GPU that is in use into MIG mode.
            if !admin
                && let Some((holder, device)) =
                    self.checkpoint
                        .holder_on_gpu(&result.pool, &claim_ref.uid, |held| {
                            conflicts_on_gpu(&target, held)
                        })
            {
                return Err(bad(format!(
                    "{at}: device {:?} shares its GPU with {device:?}, which is prepared for ResourceClaim {}/{}",
                    result.device, holder.namespace, holder.name
                )));
            }
            if !admin && result.share_id.is_none() && !seen.insert(result.device.clone()) {
                return Err(bad(format!(
                    "{at}: device {:?} is allocated twice",
                    result.device
                )));
            }
            let config = configs
                .iter()
                .rev()
                .find(|(requests, _, _)| applies_to(requests, &result.request));
            if matches!(target, Target::Vfio { .. }) && admin {
                return Err(bad(format!(
                    "{at}.adminAccess: device {:?} is a GPU for a virtual machine; it cannot be shared with an admin-access claim (binding it to vfio-pci takes it from every process)",
                    result.device
                )));
            }
            if let Some((_, config, path)) = config {
                let capability = self
                    .inventory
                    .gpus
                    .iter()
                    .find(|g| Some(g.minor) == target.minor())
                    .map_or(0, |g| g.cuda_compute_capability.major);
                if let Some(reason) = self.timeslice_unavailable
                    && sharing::wanted(Some(config)).is_some_and(|s| s.timeslice.is_some())
                {
                    // Refused before anything is recorded or changed: the interval could not be
                    // set, nor put back.
                    return Err(bad(format!(
                        "request {:?}: {path}.sharing.timeSlicingConfig.interval: this node cannot set time-slice intervals: {reason}; the claim is refused rather than prepared without it",
                        result.request
                    )));
                }
                sharing::check(config, self.mps_available, capability).map_err(
                    |(field, reason)| {
                        bad(format!(
                            "request {:?}: {path}.{field}: {reason}",
                            result.request
                        ))
                    },
                )?;
                // Sharing settings change the device for everyone on it: never under another
                // claim's processes (an admin-access claim may be prepared beside one). Claims
                // sharing a device through MPS share its one daemon instead.
                let joins_shared_mps = shared && sharing::wants_mps(Some(config));
                if shared && sharing::changes_device(config) && !joins_shared_mps {
                    return Err(bad(format!(
                        "request {:?}: {path}.sharing.strategy: time-slicing changes the GPU for every claim sharing it; claims sharing a GPU (shareID) are time-sliced already, or use MPS",
                        result.request
                    )));
                }
                // Any other claim on the device counts here, admin-access ones included.
                let other_holder = self.checkpoint.claims.values().find(|c| {
                    c.uid != claim_ref.uid
                        && c.devices
                            .iter()
                            .any(|d| d.pool == result.pool && d.device == result.device)
                });
                if sharing::changes_device(config)
                    && !joins_shared_mps
                    && let Some(holder) = other_holder
                {
                    return Err(bad(format!(
                        "request {:?}: {path}.sharing: device {:?} is in use by ResourceClaim {}/{}; its sharing mode cannot change under that claim's processes",
                        result.request, result.device, holder.namespace, holder.name
                    )));
                }
            }
            let config = config.map(|(_, c, _)| c.clone());
            if shared {
                // The claims sharing a GPU all reach it through its one MPS daemon, or none does:
                // a process outside MPS cannot use a GPU in EXCLUSIVE_PROCESS mode.
                let mps = sharing::wants_mps(config.as_ref());
                let other = self.checkpoint.claims.values().find_map(|c| {
                    let d = c.devices.iter().find(|d| {
                        c.uid != claim_ref.uid
                            && d.pool == result.pool
                            && d.device == result.device
                            && d.share_id.is_some()
                    })?;
                    (sharing::wants_mps(d.config.as_ref()) != mps).then_some(c)
                });
                if let Some(other) = other {
                    return Err(bad(format!(
                        "{at}: device {:?} is shared by ResourceClaim {}/{} {} MPS; all claims sharing a GPU must use MPS, or none",
                        result.device,
                        other.namespace,
                        other.name,
                        if mps { "without" } else { "with" }
                    )));
                }
                // One daemon serves every claim on the device: its pipe, shm and control
                // commands are shared, so tenants of different namespaces are kept apart.
                let foreign = self.checkpoint.claims.values().find(|c| {
                    c.uid != claim_ref.uid
                        && c.namespace != claim_ref.namespace
                        && c.devices.iter().any(|d| {
                            d.pool == result.pool
                                && d.device == result.device
                                && sharing::shared_mps(d)
                        })
                });
                if mps
                    && !self.mps_across_namespaces
                    && let Some(other) = foreign
                {
                    return Err(bad(format!(
                        "{at}: device {:?} is shared through one MPS daemon by ResourceClaim {}/{} of namespace {:?}; claims of namespace {:?} and {:?} do not share an MPS daemon (its pipe, shm and control commands are one for all) unless the node allows it (--mps-share-across-namespaces, chart value mpsShareAcrossNamespaces)",
                        result.device,
                        other.namespace,
                        other.name,
                        other.namespace,
                        claim_ref.namespace,
                        other.namespace
                    )));
                }
            }
            match (&target, &config) {
                (Target::Gpu { .. }, Some(DeviceConfig::MigDeviceConfig(_))) => {
                    return Err(bad(format!(
                        "{at}: a MigDeviceConfig cannot apply to full GPU {:?}",
                        result.device
                    )));
                }
                (
                    Target::StaticMig { .. } | Target::Placement { .. },
                    Some(DeviceConfig::GpuConfig(_)),
                ) => {
                    return Err(bad(format!(
                        "{at}: a GpuConfig cannot apply to MIG device {:?}",
                        result.device
                    )));
                }
                (Target::Vfio { .. }, Some(DeviceConfig::GpuConfig(_))) => {
                    return Err(bad(format!(
                        "{at}: a GpuConfig cannot apply to device {:?}, a GPU for a virtual machine (use a VfioDeviceConfig)",
                        result.device
                    )));
                }
                (Target::Vfio { .. }, Some(DeviceConfig::MigDeviceConfig(_))) => {
                    return Err(bad(format!(
                        "{at}: a MigDeviceConfig cannot apply to device {:?}, a GPU for a virtual machine (use a VfioDeviceConfig)",
                        result.device
                    )));
                }
                (
                    Target::Gpu { .. } | Target::StaticMig { .. } | Target::Placement { .. },
                    Some(DeviceConfig::VfioDeviceConfig(_)),
                ) => {
                    return Err(bad(format!(
                        "{at}: a VfioDeviceConfig applies only to GPUs for virtual machines (class vfio.gpu.nvidia.com), not to device {:?}",
                        result.device
                    )));
                }
                _ => {}
            }
            plan.push((result.clone(), target, config));
        }
        // A container either runs CUDA on the driver's devices or hands GPUs to a virtual
        // machine (NVIDIA_VISIBLE_DEVICES=void, no driver files): never both in one claim.
        let vfio = plan
            .iter()
            .filter(|(_, t, _)| matches!(t, Target::Vfio { .. }))
            .count();
        if vfio > 0 && vfio < plan.len() {
            return Err(bad(format!(
                "allocates {vfio} GPU(s) for a virtual machine (class vfio.gpu.nvidia.com) beside {} other device(s); a claim holds one kind or the other",
                plan.len() - vfio
            )));
        }
        // The MPS client limits of a shared GPU address it as the container's device 0.
        if plan.len() > 1
            && let Some((result, _, _)) = plan
                .iter()
                .find(|(r, _, c)| r.share_id.is_some() && sharing::wants_mps(c.as_ref()))
        {
            return Err(bad(format!(
                "request {:?}: device {:?} is a shared GPU with MPS, which must be the claim's only device ({} allocated)",
                result.request,
                result.device,
                plan.len()
            )));
        }
        Ok(plan)
    }

    /// Decodes every opaque config for this driver, strictly; one bad config fails the claim.
    fn decode_configs(
        &self,
        configs: &[k8s_openapi::api::resource::v1::DeviceAllocationConfiguration],
        bad: &dyn Fn(String) -> PrepareError,
    ) -> Result<Vec<(Vec<String>, DeviceConfig, String)>, PrepareError> {
        let mut decoded = Vec::new();
        // Class configs come before claim configs, so a claim's setting wins.
        let ordered = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.source == "FromClass")
            .chain(
                configs
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.source != "FromClass"),
            );
        for (i, c) in ordered {
            let Some(opaque) = c
                .opaque
                .as_ref()
                .filter(|o| o.driver == self.config.driver_name)
            else {
                continue;
            };
            let config = config::decode(&opaque.parameters.0).map_err(|e| {
                bad(format!(
                    "status.allocation.devices.config[{i}].opaque.parameters: {e}"
                ))
            })?;
            decoded.push((
                c.requests.clone().unwrap_or_default(),
                config,
                format!("status.allocation.devices.config[{i}].opaque.parameters"),
            ));
        }
        Ok(decoded)
    }

    fn resolve(&self, device: &str) -> Result<Target, String> {
        if let Some(index) = crate::slices::passthrough::parse_vfio_device_name(device) {
            return self.resolve_vfio(index);
        }
        for gpu in &self.inventory.gpus {
            if gpu_device_name(gpu.minor) == device {
                if gpu.mig.as_ref().is_some_and(|m| !m.instances.is_empty()) {
                    return Err("its GPU has MIG devices, so it cannot be used whole".into());
                }
                let dynamic = self.modes.get(&gpu.minor) == Some(&GpuMode::Dynamic);
                if gpu.mig.as_ref().is_some_and(|m| m.mode.current)
                    && !(dynamic && gpu.architecture.toggles_mig_without_reset())
                {
                    return Err("its GPU is in MIG mode, so it cannot be used whole".into());
                }
                return Ok(Target::Gpu {
                    minor: gpu.minor,
                    uuid: gpu.uuid.clone(),
                });
            }
        }
        let parsed = parse_mig_device_name(device).ok_or("no such device on this node")?;
        let gpu = self
            .inventory
            .gpus
            .iter()
            .find(|g| g.minor == parsed.parent_minor)
            .ok_or_else(|| format!("no GPU with minor {}", parsed.parent_minor))?;
        let mig = gpu.mig.as_ref().ok_or("its GPU is not MIG-capable")?;
        let profile = mig
            .profile_by_id(parsed.profile_id)
            .ok_or("its GPU has no such MIG profile")?;
        if mig_device_name(gpu.minor, &profile.name, profile.id, parsed.start) != device {
            return Err("the name does not match the GPU's MIG profile".into());
        }
        if let Some(instance) = mig
            .instances
            .iter()
            .find(|i| i.profile_id == parsed.profile_id && i.placement.start == parsed.start)
        {
            return Ok(Target::StaticMig {
                parent_minor: gpu.minor,
                gpu_instance_id: instance.gpu_instance_id,
                compute_instance_id: instance.compute_instance_id,
                uuid: instance.uuid.clone(),
            });
        }
        let placement = profile
            .placements
            .iter()
            .find(|p| p.start == parsed.start)
            .copied()
            .ok_or("no such placement for its profile")?;
        if self.modes.get(&gpu.minor) != Some(&GpuMode::Dynamic) {
            return Err("no such MIG device exists, and its GPU is not in dynamic MIG mode".into());
        }
        Ok(Target::Placement {
            parent_minor: gpu.minor,
            profile_id: profile.id,
            placement,
        })
    }

    /// `gpu-vfio-<index>`: published (`--passthrough`) and still eligible.
    fn resolve_vfio(&self, index: u32) -> Result<Target, String> {
        if !self.config.passthrough {
            return Err(
                "GPUs for virtual machines are not published on this node (--passthrough, chart value passthrough, is off)"
                    .into(),
            );
        }
        let (function, verdict) =
            crate::slices::passthrough::eligibility(self.inventory, &self.modes)
                .into_iter()
                .find(|(f, _)| f.index == index)
                .ok_or_else(|| format!("no GPU with PCI index {index} on this node"))?;
        verdict.map_err(|reason| {
            format!(
                "GPU {} cannot go to a virtual machine: {reason}",
                function.bus_id
            )
        })?;
        let iommu_group = function
            .iommu_group
            .ok_or_else(|| format!("GPU {} has no IOMMU group", function.bus_id))?;
        Ok(Target::Vfio {
            bus_id: function.bus_id.clone(),
            minor: self
                .inventory
                .gpus
                .iter()
                .find(|g| g.pci_bus_id == function.bus_id)
                .map(|g| g.minor),
            iommu_group,
        })
    }

    pub fn record(
        &self,
        uid: &str,
        result: &DeviceRequestAllocationResult,
        target: &Target,
        config: &Option<DeviceConfig>,
    ) -> DeviceRecord {
        let (uuid, mig) = match target {
            Target::Gpu { uuid, .. } => (uuid.clone(), None),
            Target::Vfio { .. } => (String::new(), None),
            Target::StaticMig {
                parent_minor,
                gpu_instance_id,
                compute_instance_id,
                uuid,
            } => {
                let instance = self
                    .inventory
                    .gpus
                    .iter()
                    .find(|g| g.minor == *parent_minor)
                    .and_then(|g| g.mig.as_ref())
                    .and_then(|m| {
                        m.instances
                            .iter()
                            .find(|i| i.gpu_instance_id == *gpu_instance_id)
                    });
                (
                    uuid.clone(),
                    instance.map(|i| MigRecord {
                        parent_minor: *parent_minor,
                        profile_id: i.profile_id,
                        placement: i.placement,
                        created: false,
                        gpu_instance_id: Some(*gpu_instance_id),
                        compute_instance_id: Some(*compute_instance_id),
                    }),
                )
            }
            Target::Placement {
                parent_minor,
                profile_id,
                placement,
            } => (
                String::new(),
                Some(MigRecord {
                    parent_minor: *parent_minor,
                    profile_id: *profile_id,
                    placement: *placement,
                    created: true,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                }),
            ),
        };
        DeviceRecord {
            request_names: vec![result.request.clone()],
            pool: result.pool.clone(),
            device: result.device.clone(),
            cdi_device_ids: vec![self.cdi.device_id(uid, &result.device)],
            share_id: result.share_id.clone(),
            consumed: result
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(name, quantity)| (name.clone(), quantity.0.clone()))
                .collect(),
            admin_access: result.admin_access == Some(true),
            uuid,
            mig,
            config: config.clone(),
            sharing: None,
            vfio: match target {
                Target::Vfio {
                    bus_id,
                    minor,
                    iommu_group,
                } => Some(VfioRecord {
                    bus_id: bus_id.clone(),
                    minor: *minor,
                    iommu_group: *iommu_group,
                    cdev: None,
                    persistence: false,
                }),
                _ => None,
            },
            unknown: Default::default(),
        }
    }
}

/// Whether a config with these `requests` applies to `request` (`req` or `req/sub`).
fn applies_to(requests: &[String], request: &str) -> bool {
    let parent = request.split('/').next().unwrap_or(request);
    requests.is_empty() || requests.iter().any(|r| r == request || r == parent)
}

/// Whether `held` (another claim's device) and `target` cannot both be in use: a whole GPU and any
/// MIG device of that GPU; a GPU for a virtual machine and anything else on it.
fn conflicts_on_gpu(target: &Target, held: &DeviceRecord) -> bool {
    let held_gpu = held
        .vfio
        .as_ref()
        .and_then(|v| v.minor)
        .or_else(|| held.mig.as_ref().map(|m| m.parent_minor))
        .or_else(|| {
            crate::slices::passthrough::parse_vfio_device_name(&held.device)
                .is_none()
                .then(|| device_minor(&held.device))
                .flatten()
        });
    match (target, &held.vfio) {
        (Target::Vfio { bus_id, minor, .. }, _) => {
            return held.vfio.as_ref().is_some_and(|v| &v.bus_id == bus_id)
                || (minor.is_some() && held_gpu == *minor);
        }
        (other, Some(vfio)) => return vfio.minor.is_some() && vfio.minor == other.minor(),
        _ => {}
    }
    let held_mig_parent = held
        .mig
        .as_ref()
        .map(|m| m.parent_minor)
        .or_else(|| parse_mig_device_name(&held.device).map(|parsed| parsed.parent_minor));
    match target {
        Target::Gpu { minor, .. } => held_mig_parent == Some(*minor),
        Target::StaticMig { parent_minor, .. } | Target::Placement { parent_minor, .. } => {
            held_mig_parent.is_none() && held.device == gpu_device_name(*parent_minor)
        }
        Target::Vfio { .. } => false,
    }
}

/// The GPU minor of a `gpu-<minor>` or MIG device name.
fn device_minor(device: &str) -> Option<u32> {
    if let Some(parsed) = parse_mig_device_name(device) {
        return Some(parsed.parent_minor);
    }
    device.strip_prefix("gpu-")?.parse().ok()
}
