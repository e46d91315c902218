//! Opaque per-claim configuration for our driver: NVIDIA's `resource.nvidia.com/v1beta1`
//! `GpuConfig` and `MigDeviceConfig`, decoded strictly so a typo is an error, not a silent default.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// Path inside the parameters object, e.g. `sharing.mpsConfig.defaultActiveThreadPercentage`.
    pub field: String,
    pub reason: String,
}

fn err(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// A decoded opaque configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum DeviceConfig {
    GpuConfig(GpuConfig),
    MigDeviceConfig(MigDeviceConfig),
    VfioDeviceConfig(VfioDeviceConfig),
}

/// How a GPU handed to a virtual machine is reached (NVIDIA's `VfioDeviceConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VfioDeviceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iommu: Option<IommuConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IommuConfig {
    /// `LegacyOnly` (default; `/dev/vfio/<group>`) or `PreferIommuFD` (the function's
    /// `/dev/vfio/devices/vfioN` cdev when the node has iommufd). Checked in `validate` so
    /// the error names the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_policy: Option<String>,
    /// Also give the container the IOMMU API device: `/dev/vfio/vfio` (legacy) or `/dev/iommu`
    /// (iommufd). KubeVirt needs it, with `LegacyOnly`.
    #[serde(
        default,
        rename = "enableAPIDevice",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_api_device: Option<bool>,
}

/// The IOMMU backend a VFIO device is reached through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IommuBackend {
    #[default]
    LegacyOnly,
    PreferIommuFd,
}

impl VfioDeviceConfig {
    /// The backend policy (`LegacyOnly` when unset or empty, as NVIDIA normalizes it).
    pub fn backend(&self) -> IommuBackend {
        match self
            .iommu
            .as_ref()
            .and_then(|i| i.backend_policy.as_deref())
        {
            Some("PreferIommuFD") => IommuBackend::PreferIommuFd,
            _ => IommuBackend::LegacyOnly,
        }
    }

    pub fn api_device(&self) -> bool {
        self.iommu
            .as_ref()
            .and_then(|i| i.enable_api_device)
            .unwrap_or(false)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing: Option<GpuSharing>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing: Option<MigDeviceSharing>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharingStrategy {
    TimeSlicing,
    #[serde(rename = "MPS")]
    Mps,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuSharing {
    pub strategy: SharingStrategy,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MigDeviceSharing {
    pub strategy: SharingStrategy,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<TimeSliceInterval>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    Default,
    Short,
    Medium,
    Long,
}

impl TimeSliceInterval {
    /// The value `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn nvml_value(&self) -> u32 {
        match self {
            Self::Default => 0,
            Self::Short => 1,
            Self::Medium => 2,
            Self::Long => 3,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MpsConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<i64>,
    /// A Kubernetes quantity, e.g. `10Gi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<String>,
    /// Device UUID or index → quantity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<String, String>>,
    /// Runs the daemon in multi-user mode (processes of different UIDs share it); needs compute
    /// capability 7.0 or newer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_user: Option<bool>,
}

/// Decodes the `parameters` of an opaque config for our driver, strictly: `apiVersion` and `kind`
/// must be ours and unknown fields are errors.
pub fn decode(parameters: &serde_json::Value) -> Result<DeviceConfig, ConfigError> {
    let object = parameters
        .as_object()
        .ok_or_else(|| err("parameters", "must be a JSON object"))?;
    let api_version = object
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    if api_version != API_VERSION {
        return Err(err(
            "apiVersion",
            format!("{api_version:?} is not supported; use {API_VERSION:?}"),
        ));
    }
    let kind = object
        .get("kind")
        .and_then(|v| v.as_str())
        .unwrap_or_default();
    let mut body = object.clone();
    body.remove("apiVersion");
    body.remove("kind");
    let body = serde_json::Value::Object(body);
    let config = match kind {
        "GpuConfig" => DeviceConfig::GpuConfig(from_body(body)?),
        "MigDeviceConfig" => DeviceConfig::MigDeviceConfig(from_body(body)?),
        "VfioDeviceConfig" => DeviceConfig::VfioDeviceConfig(from_body(body)?),
        other => {
            return Err(err(
                "kind",
                format!(
                    "{other:?} is not supported; use \"GpuConfig\", \"MigDeviceConfig\" or \"VfioDeviceConfig\""
                ),
            ));
        }
    };
    validate(&config)?;
    Ok(config)
}

/// Decodes a config's fields, an error naming the field serde stopped at (the object holding
/// an unknown field, `parameters` itself at the top).
fn from_body<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { "parameters" } else { &path };
        err(field, strict_decoding_reason(e.inner()))
    })
}

/// serde's reason for refusing parameters, with an unknown field worded as NVIDIA's driver
/// words it (`strict decoding error: unknown field "foo"`, which its users' scripts look for),
/// followed by the fields that are known there.
pub fn strict_decoding_reason(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message;
    };
    match rest.split_once('`') {
        Some((name, expected)) => {
            let expected = expected.trim_start_matches(", ");
            format!("strict decoding error: unknown field \"{name}\" ({expected})")
        }
        None => message,
    }
}

fn validate(config: &DeviceConfig) -> Result<(), ConfigError> {
    match config {
        DeviceConfig::VfioDeviceConfig(VfioDeviceConfig {
            iommu:
                Some(IommuConfig {
                    backend_policy: Some(policy),
                    ..
                }),
        }) if !["", "LegacyOnly", "PreferIommuFD"].contains(&policy.as_str()) => {
            return Err(err(
                "iommu.backendPolicy",
                format!(
                    "unknown IOMMU backend policy {policy:?}; supported: \"LegacyOnly\", \"PreferIommuFD\""
                ),
            ));
        }
        DeviceConfig::GpuConfig(GpuConfig {
            sharing: Some(sharing),
        }) => {
            match sharing.strategy {
                SharingStrategy::TimeSlicing if sharing.mps_config.is_some() => {
                    return Err(err(
                        "sharing.mpsConfig",
                        "must not be set with strategy TimeSlicing",
                    ));
                }
                SharingStrategy::Mps if sharing.time_slicing_config.is_some() => {
                    return Err(err(
                        "sharing.timeSlicingConfig",
                        "must not be set with strategy MPS",
                    ));
                }
                _ => {}
            }
            if let Some(mps) = &sharing.mps_config {
                validate_mps("sharing.mpsConfig", mps)?;
            }
        }
        DeviceConfig::MigDeviceConfig(MigDeviceConfig {
            sharing: Some(sharing),
        }) => {
            if let Some(mps) = &sharing.mps_config {
                if sharing.strategy != SharingStrategy::Mps {
                    return Err(err(
                        "sharing.mpsConfig",
                        "must not be set with strategy TimeSlicing",
                    ));
                }
                validate_mps("sharing.mpsConfig", mps)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn validate_mps(field: &str, mps: &MpsConfig) -> Result<(), ConfigError> {
    if let Some(p) = mps.default_active_thread_percentage
        && !(0..=100).contains(&p)
    {
        return Err(err(
            &format!("{field}.defaultActiveThreadPercentage"),
            format!("{p} is not between 0 and 100"),
        ));
    }
    let limits = mps
        .default_pinned_device_memory_limit
        .iter()
        .map(|v| (format!("{field}.defaultPinnedDeviceMemoryLimit"), v))
        .chain(
            mps.default_per_device_pinned_memory_limit
                .iter()
                .flatten()
                .map(|(k, v)| {
                    (
                        format!("{field}.defaultPerDevicePinnedMemoryLimit[{k:?}]"),
                        v,
                    )
                }),
        );
    for (at, value) in limits {
        let bytes = k8s_quantity::Quantity::parse(value)
            .map_err(|e| err(&at, format!("{value:?} is not a quantity: {e}")))?
            .as_approximate_float();
        if bytes < (1 << 20) as f64 {
            return Err(err(&at, format!("{value:?} is below the 1Mi minimum")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_nvidia_examples() {
        let mps = decode(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}
        }))
        .expect("valid");
        let DeviceConfig::GpuConfig(GpuConfig {
            sharing: Some(sharing),
        }) = mps
        else {
            panic!("GpuConfig")
        };
        assert_eq!(sharing.strategy, SharingStrategy::Mps);
        let ts = decode(&json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
        }))
        .expect("valid");
        assert!(matches!(ts, DeviceConfig::GpuConfig(_)));
        let mig = decode(&json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}))
            .expect("valid");
        assert!(matches!(mig, DeviceConfig::MigDeviceConfig(_)));
    }

    #[test]
    fn decodes_nvidias_vfio_configs_with_their_defaults() {
        let decode_vfio = |parameters: serde_json::Value| match decode(&parameters) {
            Ok(DeviceConfig::VfioDeviceConfig(c)) => c,
            other => panic!("not a VfioDeviceConfig: {other:?}"),
        };
        let full = decode_vfio(json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": true}
        }));
        assert_eq!(full.backend(), IommuBackend::LegacyOnly);
        assert!(full.api_device());
        let bare = decode_vfio(
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}),
        );
        assert_eq!(bare.backend(), IommuBackend::LegacyOnly);
        assert!(!bare.api_device());
        let fd = decode_vfio(json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": "PreferIommuFD"}
        }));
        assert_eq!(fd.backend(), IommuBackend::PreferIommuFd);
    }

    /// NVIDIA's admission webhook table (cmd/webhook/main_test.go,
    /// TestResourceClaimValidatingWebhook): the GpuConfigs it allows and denies, which prepare
    /// (and `match`) accept and refuse alike, naming the field it names.
    #[test]
    fn nvidias_webhook_table() {
        let gpu_config = |sharing: serde_json::Value| json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing});
        let allowed = gpu_config(
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}),
        );
        decode(&allowed).expect("allowed by NVIDIA's webhook");
        for (denied, field) in [
            (
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Invalid Interval"}}),
                "interval",
            ),
            (
                json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
                "defaultActiveThreadPercentage",
            ),
        ] {
            let err = decode(&gpu_config(denied.clone())).expect_err("denied by NVIDIA's webhook");
            assert!(err.to_string().contains(field), "{denied}: {err}");
        }
    }

    #[test]
    fn rejects_bad_input_naming_the_field() {
        let cases = [
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharin": {}}),
                "strict decoding error: unknown field \"sharin\" (expected `sharing`)",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}),
                "apiVersion",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "TpuConfig"}),
                "kind",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}}),
                "sharing.timeSlicingConfig",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}}),
                "defaultActiveThreadPercentage",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Ki"}}}),
                "1Mi minimum",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}),
                "unknown variant",
            ),
            (json!(["not", "an", "object"]), "JSON object"),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "IommuFDOnly"}}),
                "iommu.backendPolicy: unknown IOMMU backend policy \"IommuFDOnly\"",
            ),
            (
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig", "iommu": {"enableApiDevice": true}}),
                "strict decoding error: unknown field \"enableApiDevice\"",
            ),
        ];
        for (input, needle) in cases {
            let e = decode(&input).expect_err("must be rejected").to_string();
            assert!(e.contains(needle), "{input}: {e}");
        }
    }
}
