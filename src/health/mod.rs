//! Device health: what GPU faults (NVML events and probes, see [`crate::gpu::events`]) mean for
//! the published devices, and when a device is trusted again.
//!
//! - A fault hits one MIG device (events carrying instance ids) or a whole GPU and every device on
//!   it. It becomes a ResourceSlice device taint with NVIDIA's keys, an `Unhealthy` entry in
//!   kubelet's health stream, a Node event and a metric.
//! - Faults are in three classes, each with its taint effect (`--health-taint-effects`):
//!   `recoverable` XIDs clear after a quiet period with a good probe (`--health-recovery-after`);
//!   `reset` faults (XIDs that need a GPU reset, double-bit ECC errors) clear when the GPU shows
//!   it was reset (the recovery action NVML reports goes back to none, or the GPU comes back after
//!   being lost); `lost` clears when the GPU answers again.
//! - The faults are kept in `<state dir>/health.json` with the boot ID: a driver restart keeps
//!   them, a reboot (which resets every GPU) drops them.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::resource::v1::DeviceTaint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::gpu::events::{
    APPLICATION_XIDS, GpuEvent, GpuEventKind, GpuProbe, RESET_REQUIRED_XIDS, RecoveryAction,
};
use crate::gpu::mig::{gpu_device_name, mig_device_name};
use crate::gpu::{Gpu, NodeInventory};

pub mod monitor;
pub(crate) use monitor::now_seconds;

/// Taint keys, NVIDIA's where it has one, so existing tolerations and DeviceTaintRules match.
pub const XID_TAINT: &str = "gpu.nvidia.com/xid";
pub const LOST_TAINT: &str = "gpu.nvidia.com/gpu-lost";
pub const ECC_TAINT: &str = "gpu.nvidia.com/ecc-dbe";
/// The GPU asks for a reset (NVML's recovery action) without an event we saw.
pub const RESET_TAINT: &str = "gpu.nvidia.com/reset-required";

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error("health state {path}: {reason}")]
    State { path: PathBuf, reason: String },
}

/// How a fault is recovered from, which also picks its taint effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultClass {
    /// Clears after a quiet period with a good probe.
    Recoverable,
    /// Clears when the GPU was reset.
    Reset,
    /// Clears when the GPU answers again.
    Lost,
}

impl FaultClass {
    const ALL: [Self; 3] = [Self::Recoverable, Self::Reset, Self::Lost];

    fn as_str(&self) -> &'static str {
        match self {
            Self::Recoverable => "recoverable",
            Self::Reset => "reset",
            Self::Lost => "lost",
        }
    }
}

/// `DeviceTaint.effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaintEffect {
    /// Informational (Kubernetes 1.35+).
    None,
    NoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

impl FromStr for TaintEffect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "None" => Ok(Self::None),
            "NoSchedule" => Ok(Self::NoSchedule),
            "NoExecute" => Ok(Self::NoExecute),
            _ => Err(format!(
                "effect {s:?} is not one of None, NoSchedule, NoExecute"
            )),
        }
    }
}

/// The taint effect of each fault class (`--health-taint-effects reset=NoExecute,lost=NoExecute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaintEffects {
    pub recoverable: TaintEffect,
    pub reset: TaintEffect,
    pub lost: TaintEffect,
}

impl Default for TaintEffects {
    fn default() -> Self {
        Self {
            recoverable: TaintEffect::NoSchedule,
            reset: TaintEffect::NoSchedule,
            lost: TaintEffect::NoSchedule,
        }
    }
}

impl TaintEffects {
    pub fn of(&self, class: FaultClass) -> TaintEffect {
        match class {
            FaultClass::Recoverable => self.recoverable,
            FaultClass::Reset => self.reset,
            FaultClass::Lost => self.lost,
        }
    }
}

impl FromStr for TaintEffects {
    type Err = String;
    /// `CLASS=EFFECT[,CLASS=EFFECT...]`; classes not named keep NoSchedule.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut effects = Self::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (class, effect) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not CLASS=EFFECT"))?;
            let effect: TaintEffect = effect.trim().parse()?;
            match class.trim() {
                "recoverable" => effects.recoverable = effect,
                "reset" => effects.reset = effect,
                "lost" => effects.lost = effect,
                other => {
                    return Err(format!(
                        "fault class {other:?} is not one of {}",
                        FaultClass::ALL.map(|c| c.as_str()).join(", ")
                    ));
                }
            }
        }
        Ok(effects)
    }
}

impl fmt::Display for TaintEffects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "recoverable={},reset={},lost={}",
            self.recoverable.as_str(),
            self.reset.as_str(),
            self.lost.as_str()
        )
    }
}

/// Parses `--ignored-xids`: comma-separated XIDs; empty ignores none.
pub fn parse_xids(s: &str) -> Result<BTreeSet<u64>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u64>()
                .map_err(|_| format!("{p:?} is not an XID (a non-negative integer)"))
        })
        .collect()
}

/// The default `--ignored-xids`.
pub fn default_ignored_xids() -> String {
    APPLICATION_XIDS.map(|x| x.to_string()).join(",")
}

/// What the health monitor is configured with. Its defaults are `gpu-dra run`'s flag defaults
/// (a test in src/cli/run.rs holds them equal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    pub ignored_xids: BTreeSet<u64>,
    pub effects: TaintEffects,
    /// Quiet period after which a recoverable fault clears.
    pub recovery_after: Duration,
    /// How often every GPU is probed (and the health stream refreshed).
    pub probe_interval: Duration,
    /// How often the hardware is discovered again (MIG changes NVML reports are read at once).
    pub rescan_interval: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            ignored_xids: APPLICATION_XIDS.into_iter().collect(),
            effects: TaintEffects::default(),
            recovery_after: Duration::from_secs(600),
            probe_interval: Duration::from_secs(5),
            rescan_interval: Duration::from_secs(60),
        }
    }
}

/// What a fault hit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FaultTarget {
    /// The GPU and every device on it.
    Gpu { minor: u32 },
    /// One MIG device, by name.
    Device { minor: u32, name: String },
}

impl FaultTarget {
    pub fn minor(&self) -> u32 {
        match self {
            Self::Gpu { minor } | Self::Device { minor, .. } => *minor,
        }
    }

    /// Whether the published device `name` is affected.
    fn covers(&self, name: &str) -> bool {
        match self {
            Self::Gpu { minor } => {
                let gpu = gpu_device_name(*minor);
                name == gpu
                    || name
                        .strip_prefix(gpu.as_str())
                        .is_some_and(|rest| rest.starts_with('-'))
            }
            Self::Device { name: device, .. } => device == name,
        }
    }
}

/// One fault that has not cleared yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    pub target: FaultTarget,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub class: FaultClass,
    pub effect: TaintEffect,
    /// For humans: the health stream's message and the Node event.
    pub reason: String,
    /// Unix seconds: the taint's `timeAdded`.
    pub since: i64,
    /// Unix seconds of the last occurrence (a repeated XID restarts the quiet period).
    pub last_seen: i64,
    /// For reset faults: the GPU asked for a reset when the fault was seen, so "recovery action
    /// back to none" marks the reset. Without it (a driver that does not report one) only the
    /// GPU coming back after being lost, or a reboot, clears the fault.
    #[serde(default)]
    pub reset_asked: bool,
}

impl Fault {
    fn same(&self, other: &Fault) -> bool {
        self.target == other.target && self.key == other.key && self.value == other.value
    }

    fn describe(&self) -> String {
        let what = match &self.target {
            FaultTarget::Gpu { minor } => gpu_device_name(*minor),
            FaultTarget::Device { name, .. } => name.clone(),
        };
        format!("{what}: {}", self.reason)
    }
}

/// A change worth telling the operator about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthChange {
    Raised(Fault),
    Cleared(Fault, String),
}

impl HealthChange {
    /// The GPU the fault is on.
    pub fn minor(&self) -> u32 {
        match self {
            Self::Raised(fault) | Self::Cleared(fault, _) => fault.target.minor(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Raised(fault) => fault.describe(),
            Self::Cleared(fault, why) => format!("{} cleared: {why}", fault.describe()),
        }
    }
}

/// The node's open faults, persisted with the boot they belong to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthBook {
    pub boot_id: String,
    pub faults: Vec<Fault>,
    /// GPUs seen lost at the last probe: answering again afterwards means they were reset.
    #[serde(default)]
    pub lost: BTreeSet<u32>,
}

const STATE_FILE: &str = "health.json";

impl HealthBook {
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(STATE_FILE)
    }

    /// The book of this boot: what the file holds, or an empty one when it is missing or from
    /// an earlier boot (a reboot resets the GPUs). A file that cannot be parsed is an error:
    /// silently forgetting a fault would put a broken GPU back in service.
    pub fn load(state_dir: &Path, boot_id: &str) -> Result<Self, HealthError> {
        let path = Self::path(state_dir);
        let fresh = Self {
            boot_id: boot_id.to_string(),
            ..Self::default()
        };
        match std::fs::read(&path) {
            Ok(bytes) => {
                let book: Self =
                    serde_json::from_slice(&bytes).map_err(|e| HealthError::State {
                        path: path.clone(),
                        reason: format!("cannot parse: {e} (remove it to forget every fault)"),
                    })?;
                Ok(if book.boot_id == boot_id { book } else { fresh })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(fresh),
            Err(e) => Err(HealthError::State {
                path,
                reason: format!("cannot read: {e}"),
            }),
        }
    }

    pub fn save(&self, state_dir: &Path) -> Result<(), HealthError> {
        let path = Self::path(state_dir);
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| HealthError::State {
            path: path.clone(),
            reason: format!("cannot encode: {e}"),
        })?;
        crate::fsutil::write_atomically(&path, &bytes).map_err(|e| HealthError::State {
            path,
            reason: format!("cannot write: {e}"),
        })
    }

    fn add(&mut self, fault: Fault) -> Option<HealthChange> {
        if let Some(open) = self.faults.iter_mut().find(|f| f.same(&fault)) {
            open.last_seen = fault.last_seen;
            open.reset_asked |= fault.reset_asked;
            return None;
        }
        self.faults.push(fault.clone());
        Some(HealthChange::Raised(fault))
    }

    /// An NVML event; `probe` is the GPU's state right after it. `None` when it changes nothing
    /// new (ignored XID, or a repeat of an open fault).
    pub fn raise(
        &mut self,
        event: &GpuEvent,
        probe: Option<GpuProbe>,
        inventory: &NodeInventory,
        config: &HealthConfig,
        now: i64,
    ) -> Option<HealthChange> {
        let (key, value, class, reason) = match event.kind {
            GpuEventKind::Xid { code } => {
                if config.ignored_xids.contains(&code) {
                    return None;
                }
                let class = if RESET_REQUIRED_XIDS.contains(&code) {
                    FaultClass::Reset
                } else {
                    FaultClass::Recoverable
                };
                (
                    XID_TAINT,
                    Some(code.to_string()),
                    class,
                    format!("XID {code}"),
                )
            }
            GpuEventKind::DoubleBitEcc => (
                ECC_TAINT,
                None,
                FaultClass::Reset,
                "double-bit ECC error".to_string(),
            ),
            // Not a fault (the monitor rescans the GPU instead).
            GpuEventKind::MigConfigChange => return None,
        };
        let reset_asked = probe
            .and_then(|p| p.recovery_action)
            .is_some_and(|a| a != RecoveryAction::None);
        // A reset fault the driver does not ask a reset for clears like a recoverable one.
        let class = match (class, probe.and_then(|p| p.recovery_action)) {
            (FaultClass::Reset, Some(RecoveryAction::None)) => FaultClass::Recoverable,
            (class, _) => class,
        };
        let target = event_target(event, inventory);
        let reason = match &target {
            FaultTarget::Device { .. } => format!(
                "{reason} on GPU instance {}",
                event.gpu_instance_id.unwrap_or_default()
            ),
            FaultTarget::Gpu { .. } => reason,
        };
        self.add(Fault {
            target,
            key: key.to_string(),
            value,
            class,
            effect: config.effects.of(class),
            reason,
            since: now,
            last_seen: now,
            reset_asked,
        })
    }

    /// A periodic probe of GPU `minor`: raises lost and reset-required faults, clears what
    /// the GPU has recovered from.
    pub fn probe(
        &mut self,
        minor: u32,
        probe: GpuProbe,
        config: &HealthConfig,
        now: i64,
    ) -> Vec<HealthChange> {
        let mut changes = Vec::new();
        let was_lost = self.lost.contains(&minor);
        let back_from_lost = was_lost && !probe.lost;
        if probe.lost {
            self.lost.insert(minor);
        } else {
            self.lost.remove(&minor);
        }
        let action_none = probe.recovery_action == Some(RecoveryAction::None);
        let quiet = config.recovery_after.as_secs() as i64;
        let mut kept = Vec::with_capacity(self.faults.len());
        for fault in std::mem::take(&mut self.faults) {
            if fault.target.minor() != minor {
                kept.push(fault);
                continue;
            }
            let cleared = match fault.class {
                FaultClass::Lost => (!probe.lost).then(|| "the GPU answers again".to_string()),
                FaultClass::Reset if back_from_lost => {
                    Some("the GPU was reset (it came back after being lost)".into())
                }
                FaultClass::Reset if fault.reset_asked && action_none && !probe.lost => {
                    Some("the GPU was reset (no recovery action pending)".into())
                }
                FaultClass::Reset => None,
                FaultClass::Recoverable => (!probe.lost
                    && now - fault.last_seen >= quiet
                    && probe
                        .recovery_action
                        .is_none_or(|a| a == RecoveryAction::None))
                .then(|| {
                    format!(
                        "no fault for {}s and the GPU answers",
                        now - fault.last_seen
                    )
                }),
            };
            match cleared {
                Some(why) => changes.push(HealthChange::Cleared(fault, why)),
                None => kept.push(fault),
            }
        }
        self.faults = kept;
        let whole = FaultTarget::Gpu { minor };
        if probe.lost {
            changes.extend(self.add(Fault {
                target: whole.clone(),
                key: LOST_TAINT.into(),
                value: None,
                class: FaultClass::Lost,
                effect: config.effects.lost,
                reason: "GPU is lost (fallen off the bus)".into(),
                since: now,
                last_seen: now,
                reset_asked: false,
            }));
        }
        if let Some(action) = probe.recovery_action.filter(|a| *a != RecoveryAction::None) {
            let known = self
                .faults
                .iter()
                .any(|f| f.target.minor() == minor && f.class != FaultClass::Recoverable);
            if !known && !probe.lost {
                changes.extend(self.add(Fault {
                    target: whole,
                    key: RESET_TAINT.into(),
                    value: None,
                    class: FaultClass::Reset,
                    effect: config.effects.reset,
                    reason: format!("the driver asks for recovery: {action:?}"),
                    since: now,
                    last_seen: now,
                    reset_asked: true,
                }));
            }
        }
        changes
    }

    /// Forgets faults on GPUs the node no longer has.
    pub fn retain_gpus(&mut self, minors: &BTreeSet<u32>) {
        self.faults.retain(|f| minors.contains(&f.target.minor()));
    }

    /// The open faults of one published device.
    pub fn faults_of<'a>(&'a self, device: &'a str) -> impl Iterator<Item = &'a Fault> + 'a {
        self.faults.iter().filter(move |f| f.target.covers(device))
    }

    /// The taints of every device in `devices` that has a fault: one per key (the strongest
    /// effect, then the latest), ordered by key.
    pub fn taints<'a>(
        &self,
        devices: impl IntoIterator<Item = &'a str>,
    ) -> BTreeMap<String, Vec<DeviceTaint>> {
        let mut all = BTreeMap::new();
        for device in devices {
            let mut by_key: BTreeMap<&str, &Fault> = BTreeMap::new();
            for fault in self.faults_of(device) {
                let entry = by_key.entry(fault.key.as_str()).or_insert(fault);
                if (fault.effect, fault.since) > (entry.effect, entry.since) {
                    *entry = fault;
                }
            }
            if by_key.is_empty() {
                continue;
            }
            let taints = by_key
                .into_values()
                .map(|fault| DeviceTaint {
                    key: fault.key.clone(),
                    value: fault.value.clone(),
                    effect: fault.effect.as_str().to_string(),
                    time_added: Some(Time(unix_time(fault.since))),
                })
                .collect();
            all.insert(device.to_string(), taints);
        }
        all
    }
}

fn unix_time(seconds: i64) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap_or_default()
}

/// The MIG device an event's instance ids name, else the whole GPU.
fn event_target(event: &GpuEvent, inventory: &NodeInventory) -> FaultTarget {
    let minor = event.minor;
    let device = event.gpu_instance_id.and_then(|gi| {
        let gpu: &Gpu = inventory.gpus.iter().find(|g| g.minor == minor)?;
        let mig = gpu.mig.as_ref()?;
        let instance = mig.instances.iter().find(|i| {
            i.gpu_instance_id == gi
                && event
                    .compute_instance_id
                    .is_none_or(|ci| ci == i.compute_instance_id)
        })?;
        let profile = mig.profile_by_id(instance.profile_id)?;
        Some(mig_device_name(
            minor,
            &profile.name,
            profile.id,
            instance.placement.start,
        ))
    });
    match device {
        Some(name) => FaultTarget::Device { minor, name },
        None => FaultTarget::Gpu { minor },
    }
}

#[cfg(test)]
mod tests;
