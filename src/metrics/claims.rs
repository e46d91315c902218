//! Per-claim series: `prepared_device_info` (each prepared device with its claim, pods and the
//! DCGM exporter's labels to join on) and the use of each prepared claim's device, by claim and
//! by pod.
use super::{Metrics, to_gauge};
use crate::gpu::NodeInventory;
use crate::prepare::checkpoint::Checkpoint;
use crate::prepare::driver::ClaimUser;

#[derive(Default)]
pub(super) struct ClaimPods {
    pods: std::collections::HashMap<String, Vec<ClaimUser>>,
    last: Option<(Checkpoint, NodeInventory)>,
    /// The GPUs' use as last read (by minor), so a claim's use series go with its unprepare.
    usage: std::collections::BTreeMap<u32, crate::gpu::usage::GpuUsage>,
    /// The pod (UID) each of those processes runs in, from its cgroup.
    process_pods: std::collections::BTreeMap<u32, String>,
}

/// Labels of the per-claim use series: the claim and its device as `prepared_device_info` names
/// them (join on `claim_uid` and `dra_device`, or with DCGM on `UUID` and `GPU_I_ID`).
pub(super) type UsageLabels = Vec<(&'static str, String)>;

/// Labels of `prepared_device_info`, in order. `UUID`, `GPU_I_ID`, `GPU_I_PROFILE` and
/// `Hostname` are DCGM exporter's names, so PromQL joins its series with ours on them.
pub(super) type PreparedDeviceLabels = Vec<(&'static str, String)>;

/// The UID of the pod whose cgroup a process's `/proc/<pid>/cgroup` names: kubelet's
/// `…/pod<uid>/…` (cgroupfs) or `…-pod<uid with _>.slice/…` (systemd).
pub fn pod_uid_of_cgroup(cgroup: &str) -> Option<String> {
    for line in cgroup.lines() {
        let path = line.rsplit(':').next().unwrap_or("");
        // `kubepods` holds "pod" too: every occurrence is tried.
        for (at, _) in path.match_indices("pod") {
            let uid: String = path[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_hexdigit() || *c == '-' || *c == '_')
                .map(|c| if c == '_' { '-' } else { c })
                .collect();
            if uid.len() == 36 && uid.matches('-').count() == 4 {
                return Some(uid);
            }
        }
    }
    None
}

/// The GPU (minor, UUID) a prepared device is on, and its GPU instance for a MIG device.
fn device_gpu(
    device: &crate::prepare::checkpoint::DeviceRecord,
    inventory: &NodeInventory,
) -> Option<(u32, String, Option<u32>)> {
    match &device.mig {
        Some(mig) => {
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| g.minor == mig.parent_minor)?;
            Some((gpu.minor, gpu.uuid.clone(), mig.gpu_instance_id))
        }
        None => {
            if let Some(gpu) = inventory.gpus.iter().find(|g| g.uuid == device.uuid) {
                return Some((gpu.minor, gpu.uuid.clone(), None));
            }
            // A static MIG device (made by an admin): found by its MIG UUID.
            inventory.gpus.iter().find_map(|gpu| {
                let instance = gpu
                    .mig
                    .as_ref()?
                    .instances
                    .iter()
                    .find(|i| i.uuid == device.uuid)?;
                Some((gpu.minor, gpu.uuid.clone(), Some(instance.gpu_instance_id)))
            })
        }
    }
}

impl Metrics {
    /// The GPUs (minors) of the prepared claims' devices: what the use reader asks.
    pub fn usage_targets(&self) -> std::collections::BTreeSet<u32> {
        let claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        let Some((checkpoint, inventory)) = &claim_pods.last else {
            return Default::default();
        };
        checkpoint
            .claims
            .values()
            .filter(|c| c.is_completed())
            .flat_map(|c| &c.devices)
            .filter_map(|d| device_gpu(d, inventory).map(|(minor, _, _)| minor))
            .collect()
    }

    /// Whether any use is reported now (a round with no prepared claim clears it).
    pub fn has_usage(&self) -> bool {
        let claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        !claim_pods.usage.is_empty() || !claim_pods.process_pods.is_empty()
    }

    /// One round of GPU use (by minor): each prepared claim's device gets its memory in use,
    /// process count and, for a full GPU, its utilization. Devices of GPUs not read this round
    /// have no series until the next.
    pub fn observe_usage(
        &self,
        usage: &std::collections::BTreeMap<u32, crate::gpu::usage::GpuUsage>,
        process_pods: &std::collections::BTreeMap<u32, String>,
    ) {
        let mut claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        claim_pods.usage = usage.clone();
        claim_pods.process_pods = process_pods.clone();
        self.render_usage(&claim_pods);
    }

    /// The use series of the prepared claims' devices, from the use last read.
    fn render_usage(&self, claim_pods: &ClaimPods) {
        self.claim_memory_used.clear();
        self.claim_utilization.clear();
        self.claim_processes.clear();
        self.pod_memory_used.clear();
        let usage = &claim_pods.usage;
        let Some((checkpoint, inventory)) = &claim_pods.last else {
            return;
        };
        for claim in checkpoint.claims.values().filter(|c| c.is_completed()) {
            for device in &claim.devices {
                let Some((minor, uuid, gi)) = device_gpu(device, inventory) else {
                    continue;
                };
                let Some(gpu_usage) = usage.get(&minor) else {
                    continue;
                };
                let labels: UsageLabels = vec![
                    ("namespace", claim.namespace.clone()),
                    ("claim", claim.name.clone()),
                    ("claim_uid", claim.uid.clone()),
                    ("dra_device", device.device.clone()),
                    ("UUID", uuid),
                    ("GPU_I_ID", gi.map(|g| g.to_string()).unwrap_or_default()),
                    ("Hostname", device.pool.clone()),
                ];
                let on_device: Vec<&crate::gpu::usage::ProcessUsage> = gpu_usage
                    .processes
                    .iter()
                    .filter(|p| gi.is_none() || p.gpu_instance_id == gi)
                    .collect();
                let (memory, processes) = match gi {
                    Some(gi) => (gpu_usage.gpu_instance_memory(gi), on_device.len()),
                    None => (gpu_usage.memory_used_bytes, on_device.len()),
                };
                // Per pod: the device's processes in the cgroups of the pods the claim is
                // reserved for (another claim's pods on a shared GPU count under that claim).
                let mut by_pod: std::collections::BTreeMap<&str, u64> = Default::default();
                for process in &on_device {
                    let Some(pod_uid) = claim_pods.process_pods.get(&process.pid) else {
                        continue;
                    };
                    let user = claim_pods
                        .pods
                        .get(&claim.uid)
                        .and_then(|users| users.iter().find(|u| &u.uid == pod_uid));
                    if let Some(user) = user {
                        *by_pod.entry(user.pod.as_str()).or_default() +=
                            process.memory_used_bytes.unwrap_or(0);
                    }
                }
                for (pod, bytes) in by_pod {
                    let (namespace, name) = pod.split_once('/').unwrap_or(("", pod));
                    let mut pod_labels = labels.clone();
                    pod_labels[0] = ("namespace", namespace.to_string());
                    pod_labels.insert(1, ("pod", name.to_string()));
                    self.pod_memory_used
                        .get_or_create(&pod_labels)
                        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                }
                self.claim_memory_used
                    .get_or_create(&labels)
                    .set(i64::try_from(memory).unwrap_or(i64::MAX));
                self.claim_processes
                    .get_or_create(&labels)
                    .set(to_gauge(processes));
                if let (None, Some(percent)) = (gi, gpu_usage.utilization_percent) {
                    self.claim_utilization
                        .get_or_create(&labels)
                        .set(f64::from(percent) / 100.0);
                }
            }
        }
    }

    /// One `prepared_device_info` series per device of each prepared claim; series of claims
    /// unprepared since are dropped (so the series count stays the prepared devices').
    pub fn observe_prepared_devices(&self, checkpoint: &Checkpoint, inventory: &NodeInventory) {
        let mut claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        claim_pods
            .pods
            .retain(|uid, _| checkpoint.claims.contains_key(uid));
        self.render_prepared_devices(checkpoint, inventory, &claim_pods.pods);
        claim_pods.last = Some((checkpoint.clone(), inventory.clone()));
        self.render_usage(&claim_pods);
    }

    /// The pods a claim is reserved for changed: its info series say so from now on.
    pub fn observe_claim_pods(&self, claim_uid: &str, pods: &[ClaimUser]) {
        let mut claim_pods = self.claim_pods.lock().unwrap_or_else(|p| p.into_inner());
        if claim_pods.pods.get(claim_uid).map(Vec::as_slice) == Some(pods) {
            return;
        }
        claim_pods.pods.insert(claim_uid.to_string(), pods.to_vec());
        if let Some((checkpoint, inventory)) = &claim_pods.last {
            self.render_prepared_devices(checkpoint, inventory, &claim_pods.pods);
        }
    }

    fn render_prepared_devices(
        &self,
        checkpoint: &Checkpoint,
        inventory: &NodeInventory,
        pods: &std::collections::HashMap<String, Vec<ClaimUser>>,
    ) {
        self.prepared_device_info.clear();
        for claim in checkpoint.claims.values().filter(|c| c.is_completed()) {
            for device in &claim.devices {
                let located = device_gpu(device, inventory);
                let gpu = located
                    .as_ref()
                    .and_then(|(minor, ..)| inventory.gpus.iter().find(|g| g.minor == *minor));
                // A static MIG device (an admin's) has no carve record: its instance says.
                let static_instance = gpu
                    .and_then(|g| g.mig.as_ref())
                    .and_then(|m| m.instances.iter().find(|i| i.uuid == device.uuid));
                let (gi, ci, profile_id) = match (&device.mig, static_instance) {
                    (Some(mig), _) => (
                        mig.gpu_instance_id,
                        mig.compute_instance_id,
                        Some(mig.profile_id),
                    ),
                    (None, Some(i)) => (
                        Some(i.gpu_instance_id),
                        Some(i.compute_instance_id),
                        Some(i.profile_id),
                    ),
                    (None, None) => (None, None, None),
                };
                let is_mig = device.mig.is_some() || static_instance.is_some();
                let profile = profile_id.and_then(|id| {
                    gpu.and_then(|g| g.mig.as_ref())
                        .and_then(|m| m.profile_by_id(id))
                        .map(|p| p.name.clone())
                });
                let (gi, ci) = (gi.map(|id| id.to_string()), ci.map(|id| id.to_string()));
                let mig_uuid = is_mig.then(|| device.uuid.clone());
                let gpu_uuid = match located {
                    Some((_, uuid, _)) => Some(uuid),
                    None => Some(device.uuid.clone()),
                };
                let consumed: Vec<String> = device
                    .consumed
                    .iter()
                    .map(|(name, quantity)| format!("{name}={quantity}"))
                    .collect();
                let labels: PreparedDeviceLabels = vec![
                    ("namespace", claim.namespace.clone()),
                    ("claim", claim.name.clone()),
                    ("claim_uid", claim.uid.clone()),
                    ("request", device.request_names.join(",")),
                    (
                        "pods",
                        pods.get(&claim.uid)
                            .map(|p| {
                                p.iter()
                                    .map(|u| u.pod.as_str())
                                    .collect::<Vec<_>>()
                                    .join(",")
                            })
                            .unwrap_or_default(),
                    ),
                    ("dra_device", device.device.clone()),
                    ("UUID", gpu_uuid.unwrap_or_default()),
                    ("GPU_I_ID", gi.unwrap_or_default()),
                    ("GPU_I_PROFILE", profile.unwrap_or_default()),
                    ("compute_instance_id", ci.unwrap_or_default()),
                    ("mig_uuid", mig_uuid.unwrap_or_default()),
                    ("Hostname", device.pool.clone()),
                    ("sharing", crate::prepare::sharing::mode(device).to_string()),
                    ("consumed", consumed.join(",")),
                    ("admin_access", device.admin_access.to_string()),
                ];
                self.prepared_device_info.get_or_create(&labels).set(1);
            }
        }
    }
}
