//! The pod spec of a Pod or workload (its kind's pod-spec path, replicas, claims, placement)
//! read into a [`Workload`].
use std::collections::HashSet;

use serde_json::Value;

use super::convert::FieldError;
use super::names::generated_name;
use super::{ClaimRef, DEFAULT_NAMESPACE, Origin, PodClaim, Replicas, Workload};
use super::{controllers, convert, extended, kueue, placement, validate};

/// A kind with a pod spec: its API group/version and where the pod spec is.
pub(super) struct PodKind {
    pub(super) kind: &'static str,
    pub(super) group_version: &'static str,
    pub(super) spec_path: Vec<String>,
    pub(super) spec_field: String,
}

pub(super) fn pod_kind(kind: &str) -> Option<PodKind> {
    const POD: &[&str] = &["spec"];
    const TEMPLATE: &[&str] = &["spec", "template", "spec"];
    const CRON: &[&str] = &["spec", "jobTemplate", "spec", "template", "spec"];
    let (kind, group_version, spec_path) = match kind {
        "Pod" => ("Pod", "v1", POD),
        "Deployment" => ("Deployment", "apps/v1", TEMPLATE),
        "ReplicaSet" => ("ReplicaSet", "apps/v1", TEMPLATE),
        "StatefulSet" => ("StatefulSet", "apps/v1", TEMPLATE),
        "DaemonSet" => ("DaemonSet", "apps/v1", TEMPLATE),
        "Job" => ("Job", "batch/v1", TEMPLATE),
        "CronJob" => ("CronJob", "batch/v1", CRON),
        // KubeVirt: the VMI's spec holds `resourceClaims` as a pod spec does.
        "VirtualMachineInstance" => ("VirtualMachineInstance", "kubevirt.io/v1", POD),
        "VirtualMachine" => ("VirtualMachine", "kubevirt.io/v1", TEMPLATE),
        _ => return None,
    };
    Some(PodKind {
        kind,
        group_version,
        spec_path: spec_path.iter().map(|s| s.to_string()).collect(),
        spec_field: spec_path.join("."),
    })
}

pub(super) fn at_path<'a, S: AsRef<str>>(value: &'a Value, path: &[S]) -> Option<&'a Value> {
    controllers::at(value, path)
}

/// A non-negative integer field (absent or null: `default`).
pub(super) fn count_field(value: &Value, path: &[&str], default: u64) -> Result<u64, FieldError> {
    match at_path(value, path) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().ok_or_else(|| {
            FieldError::new(
                path.join("."),
                format!("Invalid value: {v}: must be greater than or equal to 0"),
            )
        }),
    }
}

pub(super) fn parse_workload(
    pk: &PodKind,
    value: &Value,
    origin: &Origin,
    seq: usize,
) -> Result<Workload, FieldError> {
    let meta = value.get("metadata").unwrap_or(&Value::Null);
    let text = |key: &str| meta.get(key).and_then(Value::as_str).unwrap_or("");
    let namespace = match text("namespace") {
        "" => DEFAULT_NAMESPACE.to_string(),
        ns => ns.to_string(),
    };
    let name = match (text("name"), text("generateName")) {
        ("", "") => return Err(FieldError::new("metadata.name", "Required value")),
        ("", base) => generated_name(base, &format!("{origin}#{seq}")),
        (name, _) => name.to_string(),
    };
    validate::dns_subdomain(&name, "metadata.name")?;
    let field = format!("{}.resourceClaims", pk.spec_field);
    let mut claims = Vec::new();
    let mut names = HashSet::new();
    let entries = match at_path(value, &pk.spec_path).and_then(|s| s.get("resourceClaims")) {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(entries)) => entries.as_slice(),
        Some(_) => return Err(FieldError::new(field, "must be a list")),
    };
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let Value::Object(map) = entry else {
            return Err(FieldError::new(at, "must be an object"));
        };
        for (key, v) in map {
            let known = matches!(
                key.as_str(),
                "name" | "resourceClaimName" | "resourceClaimTemplateName"
            );
            if !known && !v.is_null() {
                return Err(FieldError::new(convert::child(&at, key), "unknown field"));
            }
        }
        let get = |key: &str| -> Result<Option<String>, FieldError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(FieldError::new(
                    format!("{at}.{key}"),
                    format!("Invalid value: {other}: must be a string"),
                )),
            }
        };
        let name =
            get("name")?.ok_or_else(|| FieldError::new(format!("{at}.name"), "Required value"))?;
        if !names.insert(name.clone()) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!("Duplicate value: {name:?}"),
            ));
        }
        let source = match (get("resourceClaimName")?, get("resourceClaimTemplateName")?) {
            (Some(claim), None) => ClaimRef::Named(claim),
            (None, Some(template)) => ClaimRef::Template(template),
            (None, None) => {
                return Err(FieldError::new(
                    at,
                    "Required value: must specify one of: `resourceClaimName`, `resourceClaimTemplateName`",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    at,
                    "Invalid value: at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified",
                ));
            }
        };
        claims.push(PodClaim { name, source });
    }
    if pk.kind.starts_with("VirtualMachine") {
        device_claim_refs(value, pk, &names)?;
    }
    let job = |spec: &[&'static str]| -> Result<Replicas, FieldError> {
        let with = |key: &'static str| [spec, &[key]].concat();
        let parallelism = count_field(value, &with("parallelism"), 1)?;
        let completions = count_field(value, &with("completions"), u64::MAX)?;
        Ok(Replicas::Parallel(parallelism.min(completions)))
    };
    let replicas = match pk.kind {
        "Pod" | "VirtualMachineInstance" => Replicas::Replicas(1),
        "VirtualMachine" => Replicas::Replicas(u64::from(vm_runs(value)?)),
        "DaemonSet" => Replicas::PerNode,
        "Job" => job(&["spec"])?,
        "CronJob" => job(&["spec", "jobTemplate", "spec"])?,
        _ => Replicas::Replicas(count_field(value, &["spec", "replicas"], 1)?),
    };
    let spec = at_path(value, &pk.spec_path);
    let containers = extended::containers(spec, &pk.spec_field)?;
    let placement = placement::PodPlacement::from_spec(spec, &pk.spec_field)?;
    let pod_group = match spec.and_then(|s| s.pointer("/schedulingGroup/podGroupName")) {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) if !name.is_empty() => Some(name.clone()),
        Some(other) => {
            return Err(FieldError::new(
                format!("{}.schedulingGroup.podGroupName", pk.spec_field),
                format!("Invalid value: {other}: must be a PodGroup's name"),
            ));
        }
    };
    Ok(Workload {
        kind: pk.kind,
        namespace,
        name,
        spec_path: pk.spec_field.clone(),
        claims,
        containers,
        replicas,
        placement,
        pod_names: None,
        group: None,
        pod_group,
        queue: controllers::queue_name(value).map(str::to_string),
        kueue_priority_class: kueue::priority_class_label(value).map(str::to_string),
        priority_class_name: spec
            .and_then(|s| s.get("priorityClassName"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        created: value
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// Whether a VirtualMachine runs a VMI (and so a virt-launcher pod): `spec.runStrategy`
/// (`Halted` does not; `Always`, `RerunOnFailure`, `Manual`, `Once` do) or the older
/// `spec.running`.
pub(super) fn vm_runs(value: &Value) -> Result<bool, FieldError> {
    let spec = value.get("spec");
    match (
        spec.and_then(|s| s.get("runStrategy")),
        spec.and_then(|s| s.get("running")),
    ) {
        (Some(Value::String(strategy)), None) => match strategy.as_str() {
            "Halted" => Ok(false),
            "Always" | "RerunOnFailure" | "Manual" | "Once" => Ok(true),
            other => Err(FieldError::new(
                "spec.runStrategy",
                format!(
                    "Unsupported value: {other:?}: supported values: \"Always\", \"Halted\", \"Manual\", \"RerunOnFailure\", \"Once\""
                ),
            )),
        },
        (None | Some(Value::Null), Some(Value::Bool(running))) => Ok(*running),
        (None | Some(Value::Null), None | Some(Value::Null)) => Ok(false),
        (Some(_), Some(_)) => Err(FieldError::new(
            "spec.running",
            "Invalid value: running and runStrategy are mutually exclusive",
        )),
        (Some(other), None) => Err(FieldError::new(
            "spec.runStrategy",
            format!("Invalid value: {other}: must be a string"),
        )),
        (_, Some(other)) => Err(FieldError::new(
            "spec.running",
            format!("Invalid value: {other}: must be a boolean"),
        )),
    }
}

/// KubeVirt's devices that take a claim (`domain.devices.gpus[]`, `hostDevices[]`): each with a
/// `claimName` names an entry of `resourceClaims` and gives a `requestName`, and has no
/// `deviceName` beside them (as KubeVirt's admission checks).
pub(super) fn device_claim_refs(
    value: &Value,
    pk: &PodKind,
    claim_names: &HashSet<String>,
) -> Result<(), FieldError> {
    let devices = at_path(value, &pk.spec_path)
        .and_then(|s| s.get("domain"))
        .and_then(|d| d.get("devices"));
    for list in ["gpus", "hostDevices"] {
        let entries = match devices.and_then(|d| d.get(list)) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(entries)) => entries,
            Some(_) => {
                return Err(FieldError::new(
                    format!("{}.domain.devices.{list}", pk.spec_field),
                    "must be a list",
                ));
            }
        };
        for (i, device) in entries.iter().enumerate() {
            let at = format!("{}.domain.devices.{list}[{i}]", pk.spec_field);
            let text = |key: &str| device.get(key).and_then(Value::as_str).unwrap_or("");
            let claim = text("claimName");
            if claim.is_empty() {
                continue;
            }
            if !text("deviceName").is_empty() {
                return Err(FieldError::new(
                    at,
                    "Invalid value: deviceName and claimName are mutually exclusive",
                ));
            }
            if !claim_names.contains(claim) {
                return Err(FieldError::new(
                    format!("{at}.claimName"),
                    format!(
                        "Invalid value: {claim:?}: no {}.resourceClaims entry has this name",
                        pk.spec_field
                    ),
                ));
            }
            if text("requestName").is_empty() {
                return Err(FieldError::new(
                    format!("{at}.requestName"),
                    "Required value: a device taken from a claim names its request",
                ));
            }
        }
    }
    Ok(())
}
