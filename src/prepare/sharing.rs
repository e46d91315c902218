//! Per-claim GPU sharing (`GpuConfig` / `MigDeviceConfig` `sharing`), as NVIDIA's driver applies
//! it, so their users' claims behave the same here.
//!
//! - Time-slicing on a full GPU: compute mode `DEFAULT` and the claim's interval (`Default` when
//!   none is given), set at prepare and put back at unprepare to what the GPU had before. What it
//!   had is recorded in the checkpoint before anything changes, so recovery after a crash restores
//!   it too.
//! - Time-slicing on a MIG device: a MIG device time-slices its processes already and has no
//!   interval to set; accepted (NVIDIA's manifests use it) with a warning.
//! - MPS: full GPUs go to `EXCLUSIVE_PROCESS` (recorded and restored like time-slicing); every MPS
//!   device of a claim (full GPUs and MIG devices, carved ones included) is served by one control
//!   daemon per claim ([`super::mps`]) with the claim's thread share and pinned-memory limits.
use std::collections::BTreeMap;

use crate::config::{
    DeviceConfig, GpuConfig, GpuSharing, MigDeviceConfig, MpsConfig, SharingStrategy,
};
use crate::gpu::{ComputeMode, SharingSettings};

use super::checkpoint::DeviceRecord;
use super::mps::{DaemonSpec, megabytes};

/// The sharing strategy a configuration asks for, and its MPS settings.
fn strategy(config: Option<&DeviceConfig>) -> Option<(SharingStrategy, Option<&MpsConfig>)> {
    match config? {
        DeviceConfig::GpuConfig(GpuConfig { sharing }) => sharing
            .as_ref()
            .map(|s| (s.strategy, s.mps_config.as_ref())),
        DeviceConfig::MigDeviceConfig(MigDeviceConfig { sharing }) => sharing
            .as_ref()
            .map(|s| (s.strategy, s.mps_config.as_ref())),
        // A GPU in a virtual machine is the machine's alone.
        DeviceConfig::VfioDeviceConfig(_) => None,
    }
}

/// Whether a configuration changes its device for every process on it (compute mode, time-slice
/// interval, an MPS daemon).
pub fn changes_device(config: &DeviceConfig) -> bool {
    match strategy(Some(config)) {
        Some((SharingStrategy::Mps, _)) => true,
        Some((SharingStrategy::TimeSlicing, _)) => wanted(Some(config)).is_some(),
        None => false,
    }
}

/// Whether a device's configuration asks for MPS.
/// How a prepared device is shared, in one word (metrics): `shared-mps` (a consumable share
/// through its GPU's one MPS daemon), `shared` (a consumable share), `mps`, `time-slicing` or
/// `exclusive`.
pub fn mode(record: &DeviceRecord) -> &'static str {
    match (record.share_id.is_some(), strategy(record.config.as_ref())) {
        (true, Some((SharingStrategy::Mps, _))) => "shared-mps",
        (true, _) => "shared",
        (false, Some((SharingStrategy::Mps, _))) => "mps",
        (false, Some((SharingStrategy::TimeSlicing, _))) => "time-slicing",
        (false, None) => "exclusive",
    }
}

pub fn wants_mps(config: Option<&DeviceConfig>) -> bool {
    matches!(strategy(config), Some((SharingStrategy::Mps, _)))
}

/// Whether this node can run MPS control daemons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpsAvailability<'a> {
    Available,
    /// The driver root has no `nvidia-cuda-mps-control`.
    Missing,
    /// It has one that cannot run here: why.
    Unusable(&'a str),
}

/// Why a claim's sharing configuration cannot be applied on this node: `(field under the
/// config's parameters, reason)`. `mps_available` says whether the node can run MPS daemons
/// (`Err`: why not, where it has a control binary that cannot run);
/// `compute_capability_major` is that of the device's GPU.
pub fn check(
    config: &DeviceConfig,
    mps_available: MpsAvailability<'_>,
    compute_capability_major: u32,
) -> Result<(), (&'static str, String)> {
    let Some((SharingStrategy::Mps, mps)) = strategy(Some(config)) else {
        return Ok(());
    };
    if let MpsAvailability::Unusable(reason) = mps_available {
        return Err((
            "sharing.strategy",
            format!(
                "MPS needs the NVIDIA driver's nvidia-cuda-mps-control, which cannot run on this node: {reason}; the claim is refused rather than prepared without it"
            ),
        ));
    }
    if mps_available == MpsAvailability::Missing {
        return Err((
            "sharing.strategy",
            "MPS needs the NVIDIA driver's nvidia-cuda-mps-control, and the driver root \
             (--nvidia-driver-root) has no executable one; the claim is refused rather than \
             prepared without it"
                .into(),
        ));
    }
    if mps.and_then(|m| m.multi_user) == Some(true) && compute_capability_major < 7 {
        return Err((
            "sharing.mpsConfig.multiUser",
            format!(
                "multi-user MPS needs compute capability 7.0 or newer (Volta); this GPU has {compute_capability_major}.x"
            ),
        ));
    }
    Ok(())
}

/// The settings sharing gives a full GPU, if its configuration changes them (applied by
/// [`super::effects::compute_mode`]).
pub fn wanted(config: Option<&DeviceConfig>) -> Option<SharingSettings> {
    let Some(DeviceConfig::GpuConfig(GpuConfig {
        sharing:
            Some(GpuSharing {
                strategy,
                time_slicing_config,
                ..
            }),
    })) = config
    else {
        return None;
    };
    Some(match strategy {
        SharingStrategy::TimeSlicing => {
            let interval = time_slicing_config
                .as_ref()
                .and_then(|c| c.interval)
                .unwrap_or(crate::config::TimeSliceInterval::Default);
            SharingSettings {
                compute_mode: ComputeMode::Default,
                timeslice: Some(interval.nvml_value()),
            }
        }
        // Only the MPS server may use the GPU; its clients reach it through the daemon.
        SharingStrategy::Mps => SharingSettings {
            compute_mode: ComputeMode::ExclusiveProcess,
            timeslice: None,
        },
    })
}

/// What a claim's owner should be told about how its sharing configuration was applied:
/// `(reason, note)` for a Warning Event on the claim.
pub fn warnings(devices: &[DeviceRecord]) -> Vec<(&'static str, String)> {
    devices
        .iter()
        .filter(|d| {
            matches!(
                &d.config,
                Some(DeviceConfig::MigDeviceConfig(MigDeviceConfig {
                    sharing: Some(sharing),
                })) if sharing.strategy == SharingStrategy::TimeSlicing
            )
        })
        .map(|d| {
            (
                "TimeSlicingNotApplied",
                format!(
                    "device {}: TimeSlicing on a MIG device changes nothing: a MIG device time-slices its processes already and has no interval to set",
                    d.device
                ),
            )
        })
        .collect()
}

/// The MPS daemon a claim's devices need, if any of them asks for MPS. `uuid_of` gives a device's
/// UUID (a placeholder for a MIG device not carved yet, so bad input is found before anything
/// changes). Errors name the request and the field.
pub fn daemon_spec(
    devices: &[DeviceRecord],
    uuid_of: impl Fn(&DeviceRecord) -> String,
) -> Result<Option<DaemonSpec>, String> {
    // Shared (consumable) devices are served by their GPU's daemon, not the claim's.
    let mps: Vec<(&DeviceRecord, &MpsConfig, String)> = devices
        .iter()
        .filter(|d| d.share_id.is_none())
        .filter_map(|d| match strategy(d.config.as_ref()) {
            Some((SharingStrategy::Mps, config)) => {
                static NONE: MpsConfig = MpsConfig {
                    default_active_thread_percentage: None,
                    default_pinned_device_memory_limit: None,
                    default_per_device_pinned_memory_limit: None,
                    multi_user: None,
                };
                Some((d, config.unwrap_or(&NONE), uuid_of(d)))
            }
            _ => None,
        })
        .collect();
    let Some((first, first_config, _)) = mps.first() else {
        return Ok(None);
    };
    let request = |d: &DeviceRecord| d.request_names.join(",");
    // One daemon serves the claim: its defaults must be the same for every MPS device.
    for (d, config, _) in &mps {
        for (field, same) in [
            (
                "defaultActiveThreadPercentage",
                config.default_active_thread_percentage
                    == first_config.default_active_thread_percentage,
            ),
            (
                "multiUser",
                config.multi_user.unwrap_or(false) == first_config.multi_user.unwrap_or(false),
            ),
        ] {
            if !same {
                return Err(format!(
                    "request {:?}: sharing.mpsConfig.{field}: differs from request {:?}'s; one MPS daemon serves all of a claim's MPS devices",
                    request(d),
                    request(first)
                ));
            }
        }
    }
    let mut pinned_limits = BTreeMap::new();
    for (_, config, uuid) in &mps {
        if let Some(limit) = &config.default_pinned_device_memory_limit {
            pinned_limits.insert(uuid.clone(), limit_megabytes(limit));
        }
    }
    for (d, config, _) in &mps {
        // Keys are UUIDs or indexes into the devices this configuration applies to.
        let group: Vec<&String> = mps
            .iter()
            .filter(|(_, c, _)| c == config)
            .map(|(_, _, u)| u)
            .collect();
        for (key, limit) in config
            .default_per_device_pinned_memory_limit
            .iter()
            .flatten()
        {
            let uuid = group
                .iter()
                .find(|u| **u == key)
                .or_else(|| key.parse::<usize>().ok().and_then(|i| group.get(i)))
                .ok_or_else(|| {
                    format!(
                        "request {:?}: sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key:?}]: no device with that UUID or index among the {} device(s) this configuration applies to",
                        request(d),
                        group.len()
                    )
                })?;
            pinned_limits.insert((*uuid).clone(), limit_megabytes(limit));
        }
    }
    Ok(Some(DaemonSpec {
        uuids: mps.iter().map(|(_, _, u)| u.clone()).collect(),
        active_thread_percentage: first_config.default_active_thread_percentage,
        pinned_limits,
        multi_user: first_config.multi_user.unwrap_or(false),
    }))
}

/// A validated quantity (config decoding checked it) in MPS's `<N>M` form.
fn limit_megabytes(quantity: &str) -> String {
    let bytes = k8s_quantity::Quantity::parse(quantity)
        .map(|q| q.as_approximate_float())
        .unwrap_or_default();
    megabytes(bytes.max(0.0) as u64)
}

/// Whether a device record is a shared (consumable, `shareID`) allocation served by its GPU's
/// one MPS daemon, which every claim sharing the device uses.
pub fn shared_mps(record: &DeviceRecord) -> bool {
    record.share_id.is_some() && wants_mps(record.config.as_ref())
}

/// The folder key of the MPS daemon that serves every claim sharing the device `uuid`.
pub fn shared_daemon_key(uuid: &str) -> String {
    format!("shared-{uuid}")
}

/// The daemon a shared device's claims use: the device alone; limits are per client.
pub fn shared_daemon_spec(record: &DeviceRecord) -> DaemonSpec {
    let multi_user = strategy(record.config.as_ref())
        .and_then(|(_, mps)| mps?.multi_user)
        .unwrap_or(false);
    DaemonSpec {
        uuids: vec![record.uuid.clone()],
        multi_user,
        ..DaemonSpec::default()
    }
}

/// The MPS client environment that holds a claim to its part of a shared device: its pinned
/// memory (what it consumed, or its config's limit when lower) and its thread share (its
/// config's, or its part of the device's memory or shares). The claim's only device is ordinal 0.
pub fn shared_client_env(
    record: &DeviceRecord,
    device_memory: u64,
    shares: Option<u32>,
) -> Vec<String> {
    let config = strategy(record.config.as_ref()).and_then(|(_, mps)| mps);
    let quantity = |q: &str| {
        k8s_quantity::Quantity::parse(q)
            .map(|q| q.as_approximate_float().max(0.0) as u64)
            .ok()
    };
    let consumed = record.consumed.get("memory").and_then(|q| quantity(q));
    let configured = config
        .and_then(|c| c.default_pinned_device_memory_limit.as_deref())
        .and_then(quantity);
    let limit = match (consumed.filter(|b| *b > 0), configured) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let share = |part: f64, whole: f64| ((part / whole * 100.0).ceil() as i64).clamp(1, 100);
    let threads = config
        .and_then(|c| c.default_active_thread_percentage)
        .or_else(|| match shares {
            Some(total) => record
                .consumed
                .get("shares")
                .and_then(|q| quantity(q))
                .map(|n| share(n as f64, f64::from(total))),
            // A claim that consumed no memory (`unlimited`) gets no thread limit, not 1%.
            None => consumed
                .filter(|b| *b > 0 && device_memory > 0)
                .map(|b| share(b as f64, device_memory as f64)),
        });
    let mut env = Vec::new();
    if let Some(bytes) = limit {
        env.push(format!(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={}",
            megabytes(bytes)
        ));
    }
    if let Some(percentage) = threads {
        env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage}"));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode;

    fn mps_config(mps: serde_json::Value) -> DeviceConfig {
        decode(
            &serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": mps}}),
        )
        .expect("valid config")
    }

    #[test]
    fn multi_user_mps_needs_volta_or_newer() {
        let config = mps_config(serde_json::json!({"multiUser": true}));
        assert_eq!(check(&config, MpsAvailability::Available, 7), Ok(()));
        let (field, reason) = check(&config, MpsAvailability::Available, 6).expect_err("Pascal");
        assert_eq!(field, "sharing.mpsConfig.multiUser");
        assert!(reason.contains("7.0") && reason.contains("6.x"), "{reason}");
        // Without the driver's control binary MPS is refused, whatever the GPU.
        let (field, _) =
            check(&config, MpsAvailability::Missing, 9).expect_err("no control binary");
        assert_eq!(field, "sharing.strategy");
        let (field, reason) = check(&config, MpsAvailability::Unusable("no loader"), 9)
            .expect_err("a control binary that cannot run");
        assert!(
            reason.contains("cannot run on this node: no loader"),
            "{reason}"
        );
        assert_eq!(field, "sharing.strategy");
    }

    fn mps_record(mps: serde_json::Value) -> DeviceRecord {
        DeviceRecord {
            request_names: vec!["gpu".into()],
            pool: "n1".into(),
            device: "gpu-0".into(),
            cdi_device_ids: vec![],
            share_id: None,
            consumed: Default::default(),
            admin_access: false,
            uuid: "GPU-1".into(),
            mig: None,
            config: Some(mps_config(mps)),
            sharing: None,
            vfio: None,
            unknown: Default::default(),
        }
    }

    #[test]
    fn shared_clients_are_held_to_what_they_consumed() {
        const GIB: u64 = 1 << 30;
        let shared = |consumed: &[(&str, &str)]| {
            let mut record = mps_record(serde_json::json!({}));
            record.share_id = Some("share-1".into());
            for (name, amount) in consumed {
                record.consumed.insert((*name).into(), (*amount).into());
            }
            record
        };
        // `memory`: its part of the memory, and the same part of the threads (rounded up).
        assert_eq!(
            shared_client_env(&shared(&[("memory", "20Gi")]), 80 * GIB, None),
            [
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"
            ]
        );
        // `unlimited`: a claim that asked for no memory is not held to 1% of the threads.
        assert!(shared_client_env(&shared(&[("memory", "0")]), 80 * GIB, None).is_empty());
        // N shares: its shares of N, whatever memory it took.
        assert_eq!(
            shared_client_env(
                &shared(&[("memory", "0"), ("shares", "1")]),
                80 * GIB,
                Some(3)
            ),
            ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=34"]
        );
    }

    /// NVIDIA's `TestMpsPerDevicePinnedMemoryLimitNormalize` (api/nvidia.com/resource/v1beta1/
    /// sharing_test.go): a default limit, per-device overrides by index or UUID, MiB-based `M`
    /// units, and what is refused. Its cases without devices have no counterpart (a claim's MPS
    /// configuration always applies to at least one device); its "too low" cases are refused when
    /// the configuration is decoded, naming the field.
    #[test]
    fn nvidias_pinned_memory_limit_table() {
        let limits = |mps: serde_json::Value| {
            let mut record = mps_record(mps);
            record.uuid = "UUID0".into();
            daemon_spec(&[record], |d| d.uuid.clone())
                .map(|spec| spec.expect("a daemon").pinned_limits)
        };
        let ok = |mps: serde_json::Value, want: &[(&str, &str)]| {
            let want: BTreeMap<String, String> = want
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
            assert_eq!(limits(mps.clone()), Ok(want), "{mps}");
        };
        ok(serde_json::json!({}), &[]);
        ok(
            serde_json::json!({"defaultPinnedDeviceMemoryLimit": "2Gi"}),
            &[("UUID0", "2048M")],
        );
        for key in ["0", "UUID0"] {
            ok(
                serde_json::json!({"defaultPinnedDeviceMemoryLimit": "2Gi",
                    "defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}}),
                &[("UUID0", "1024M")],
            );
        }
        for key in ["UUID1", "1"] {
            let error = limits(serde_json::json!({"defaultPinnedDeviceMemoryLimit": "2Gi",
                "defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}}))
            .expect_err(key);
            assert!(
                error.contains(&format!("defaultPerDevicePinnedMemoryLimit[{key:?}]")),
                "{error}"
            );
        }
        for (limit, megabytes) in [
            ("10Mi", "10M"),
            ("1Gi", "1024M"),
            ("10M", "9M"),
            ("1G", "953M"),
        ] {
            ok(
                serde_json::json!({"defaultPinnedDeviceMemoryLimit": limit}),
                &[("UUID0", megabytes)],
            );
        }
        for mps in [
            serde_json::json!({"defaultPinnedDeviceMemoryLimit": "1M"}),
            serde_json::json!({"defaultPerDevicePinnedMemoryLimit": {"UUID0": "1M"}}),
        ] {
            let config = serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": mps}});
            let error = decode(&config).expect_err("below 1Mi").to_string();
            assert!(error.contains("below the 1Mi minimum"), "{error}");
        }
    }

    #[test]
    fn a_multi_user_daemon_is_asked_for() {
        let record = mps_record(serde_json::json!({"multiUser": true}));
        let spec = daemon_spec(&[record], |d| d.uuid.clone())
            .expect("valid")
            .expect("a daemon");
        assert!(spec.multi_user);
        assert_eq!(spec.uuids, ["GPU-1"]);
    }
}
