//! kube-scheduler's `--feature-gates` as far as the allocator is concerned: parsing as
//! `featuregate.Set` does, the 1.37 defaults, and `AllocatorFeatures` (scheduler plugin).
//!
//! Only the DRA gates (and the gates they depend on or the e2e cluster sets) are known; any
//! other name is rejected rather than silently ignored, since it could not change what the
//! allocator does only if we knew it.
use std::collections::BTreeMap;

use super::Features;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("missing bool value for {0}")]
    MissingValue(String),
    #[error(
        "invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
    )]
    InvalidValue { name: String, value: String },
    /// Unknown to kube-scheduler, or a real gate this model does not know.
    #[error("unrecognized feature gate: {0}")]
    Unrecognized(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked}")]
    Locked {
        name: String,
        value: bool,
        locked: bool,
    },
    #[error("{feature} is enabled, but depends on features that are disabled: [{}]", .disabled.join(" "))]
    Dependency {
        feature: String,
        disabled: Vec<String>,
    },
}

/// One gate at kube-scheduler 1.37's default emulation version (1.37) and minimum
/// compatibility version (1.36): its default, whether it is locked, its dependencies.
struct Gate {
    name: &'static str,
    default: bool,
    locked: bool,
    deps: &'static [&'static str],
}

const DRA: &str = "DynamicResourceAllocation";

/// From k8s.io/kubernetes v1.37.2 pkg/features/kube_features.go (specs and dependencies).
const GATES: &[Gate] = &[
    gate("DRAAdminAccess", true, true, &[DRA]),
    gate("DRAConsumableCapacity", true, false, &[DRA]),
    gate("DRADerivedAttributes", false, false, &[DRA]),
    gate(
        "DRADeviceBindingConditions",
        true,
        false,
        &[DRA, "DRAResourceClaimDeviceStatus"],
    ),
    gate(
        "DRADeviceCompatibilityGroups",
        false,
        false,
        &[DRA, "DRAPartitionableDevices"],
    ),
    gate("DRADeviceTaintRules", true, false, &["DRADeviceTaints"]),
    gate("DRADeviceTaints", true, false, &[DRA]),
    gate("DRAExtendedResource", true, true, &[DRA]),
    // Beta, on by default only once the minimum compatibility version is 1.37.
    gate(
        "DRAFractionalCapacityRange",
        false,
        false,
        &["DRAConsumableCapacity"],
    ),
    gate("DRAListTypeAttributes", false, false, &[DRA]),
    gate("DRANodeAllocatableResources", false, false, &[DRA]),
    gate(
        "DRAOptionalNodeOperations",
        false,
        false,
        &[DRA, "NodeDeclaredFeatures"],
    ),
    gate("DRAPartitionableDevices", true, false, &[DRA]),
    gate(
        "DRAPartitionableDevicesType",
        false,
        false,
        &[DRA, "DRAPartitionableDevices", "DRAResourcePoolStatus"],
    ),
    gate("DRAPrioritizedList", true, true, &[DRA]),
    gate("DRAResourceClaimDeviceStatus", true, true, &[]),
    gate(
        "DRAResourceClaimGranularStatusAuthorization",
        true,
        false,
        &[DRA, "DRAResourceClaimDeviceStatus"],
    ),
    gate("DRAResourcePoolStatus", false, false, &[DRA]),
    gate("DRASchedulerFilterTimeout", true, false, &[DRA]),
    gate(
        "DRAWorkloadResourceClaims",
        false,
        false,
        &[DRA, "GenericWorkload"],
    ),
    gate(DRA, true, true, &[]),
    gate("GenericWorkload", false, false, &[]),
    gate("NodeDeclaredFeatures", true, true, &[]),
    gate("ResourceHealthStatus", true, false, &[DRA]),
];

const fn gate(
    name: &'static str,
    default: bool,
    locked: bool,
    deps: &'static [&'static str],
) -> Gate {
    Gate {
        name,
        default,
        locked,
        deps,
    }
}

fn find(name: &str) -> Option<&'static Gate> {
    GATES.iter().find(|g| g.name == name)
}

/// `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Enabled state of every known gate after applying `spec` ("A=true,B=false") to the 1.37
/// defaults, with featuregate's checks (unknown, locked, dependencies).
pub fn parse(spec: &str) -> Result<BTreeMap<&'static str, bool>, GateError> {
    let mut set: BTreeMap<String, bool> = BTreeMap::new();
    for part in spec.split(',') {
        if part.is_empty() {
            continue;
        }
        let (k, v) = match part.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => return Err(GateError::MissingValue(part.trim().to_string())),
        };
        let value = parse_bool(v).ok_or_else(|| GateError::InvalidValue {
            name: k.to_string(),
            value: v.to_string(),
        })?;
        set.insert(k.to_string(), value);
    }
    let mut enabled: BTreeMap<&'static str, bool> =
        GATES.iter().map(|g| (g.name, g.default)).collect();
    for (k, &v) in &set {
        let gate = find(k).ok_or_else(|| GateError::Unrecognized(k.clone()))?;
        if gate.locked && gate.default != v {
            return Err(GateError::Locked {
                name: k.clone(),
                value: v,
                locked: gate.default,
            });
        }
        enabled.insert(gate.name, v);
    }
    for gate in GATES {
        if !enabled[gate.name] {
            continue;
        }
        let disabled: Vec<String> = gate
            .deps
            .iter()
            .filter(|d| !enabled.get(**d).copied().unwrap_or(false))
            .map(|d| d.to_string())
            .collect();
        if !disabled.is_empty() {
            return Err(GateError::Dependency {
                feature: gate.name.to_string(),
                disabled,
            });
        }
    }
    Ok(enabled)
}

/// `dynamicresources.AllocatorFeatures` for the gates `spec` sets on top of the defaults.
pub fn features(spec: &str) -> Result<Features, GateError> {
    let on = parse(spec)?;
    let g = |name: &str| on.get(name).copied().unwrap_or(false);
    let features = Features {
        admin_access: g("DRAAdminAccess"),
        compatibility_groups: g("DRADeviceCompatibilityGroups"),
        consumable_capacity: g("DRAConsumableCapacity"),
        derived_attributes: g("DRADerivedAttributes"),
        device_binding_and_status: g("DRADeviceBindingConditions")
            && g("DRAResourceClaimDeviceStatus"),
        device_taints: g("DRADeviceTaints"),
        fractional_capacity_range: g("DRAFractionalCapacityRange"),
        list_type_attributes: g("DRAListTypeAttributes"),
        optional_node_operations: g("DRAOptionalNodeOperations"),
        partitionable_devices: g("DRAPartitionableDevices"),
        prioritized_list: g("DRAPrioritizedList"),
    };
    Ok(features)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kubernetes_1_37() {
        assert_eq!(features(""), Ok(Features::KUBERNETES_1_37));
    }

    #[test]
    fn cluster_gates() {
        let f = features(
            "DRAConsumableCapacity=true,DRAPartitionableDevices=true,DRADeviceBindingConditions=true,\
             ResourceHealthStatus=true,DRAListTypeAttributes=true,DRANodeAllocatableResources=true,\
             DRAOptionalNodeOperations=true,DRADeviceCompatibilityGroups=true,\
             DRAPartitionableDevicesType=true,DRAResourcePoolStatus=true",
        )
        .unwrap();
        assert!(f.list_type_attributes && f.optional_node_operations && f.compatibility_groups);
        assert!(!f.derived_attributes && !f.fractional_capacity_range);
        assert!(f.experimental());
        assert!(!Features::KUBERNETES_1_37.experimental());
    }

    #[test]
    fn errors_read_as_featuregate_ones() {
        let err = |s: &str| features(s).unwrap_err().to_string();
        assert_eq!(err("Bogus=true"), "unrecognized feature gate: Bogus");
        assert_eq!(
            err("DRAListTypeAttributes"),
            "missing bool value for DRAListTypeAttributes"
        );
        assert_eq!(
            err("DRAAdminAccess=false"),
            "cannot set feature gate DRAAdminAccess to false, feature is locked to true"
        );
        assert_eq!(
            err("DRAPartitionableDevices=false,DRADeviceCompatibilityGroups=true"),
            "DRADeviceCompatibilityGroups is enabled, but depends on features that are disabled: [DRAPartitionableDevices]"
        );
        assert_eq!(
            err("DRAListTypeAttributes=yes"),
            "invalid value of DRAListTypeAttributes=yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
        let derived = features("DRADerivedAttributes=true").expect("derived attributes");
        assert!(derived.derived_attributes && derived.experimental());
        // Whitespace and empty items are tolerated, as by featuregate.
        assert!(
            features(" DRAListTypeAttributes = true ,,")
                .unwrap()
                .list_type_attributes
        );
        assert!(
            !features("DRAConsumableCapacity=false")
                .unwrap()
                .consumable_capacity
        );
    }
}
