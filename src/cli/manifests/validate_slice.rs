//! The API server's create-time checks on ResourceSlices given to `match` (k8s.io/kubernetes
//! v1.37 `validateResourceSliceSpec`, with the limits its declarative validation adds): driver
//! and pool, node selection, devices (names, attributes, capacity keys, taints, counters,
//! binding conditions, node-allocatable resources, per-device node selection), shared counters,
//! the partition type attribute and skipped node operations. Fields the API server drops for a
//! disabled gate are not looked at. The first error found is returned, a list longer than its
//! limit before its items. Held to Kubernetes' `TestValidateResourceSlice` by
//! `e2e/upstream-tables.sh validation`.
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use dra_cel::names;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::convert::FieldError;
use super::validate::{self, ApiGates, at_most, dns_label, invalid_if};

/// A field's path under `at` (as `format!`), or "" under the empty path of a first, path-less
/// pass over a device (see [`slice_spec`]).
macro_rules! field {
    ($at:expr, $($arg:tt)*) => {
        if $at.is_empty() {
            String::new()
        } else {
            format!($($arg)*)
        }
    };
}

mod request_policy;
use request_policy::{valid_range, valid_values};

const MAX_DEVICES: usize = 128;
/// `ResourceSliceMaxDevicesWithAdvancedFeatures`: with taints, counters or list attributes.
const MAX_DEVICES_ADVANCED: usize = 64;
const MAX_COUNTER_SETS: usize = 8;
const MAX_COUNTERS: usize = 32;
const MAX_CONSUMED_COUNTER_SETS: usize = 2;
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
const MAX_ATTRIBUTE_VALUES: usize = 48;
const MAX_VALUE_LENGTH: usize = 64;
const MAX_TAINTS: usize = 16;
const MAX_BINDING_CONDITIONS: usize = 4;
const NODE_SELECTION: &str =
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required";
const DEVICE_NODE_SELECTION: &str = "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec";

/// Checks a ResourceSlice spec.
pub fn slice_spec(spec: &ResourceSliceSpec, gates: ApiGates) -> Result<(), FieldError> {
    validate::driver_name(&spec.driver, "spec.driver")?;
    validate::pool_name(&spec.pool.name, "spec.pool.name")?;
    if spec.pool.resource_slice_count <= 0 {
        return Err(FieldError::new(
            "spec.pool.resourceSliceCount",
            format!(
                "Invalid value: {}: must be greater than zero",
                spec.pool.resource_slice_count
            ),
        ));
    }
    if spec.pool.generation < 0 {
        return Err(FieldError::new(
            "spec.pool.generation",
            format!(
                "Invalid value: {}: must be greater than or equal to zero",
                spec.pool.generation
            ),
        ));
    }
    node_selection(
        "spec",
        spec.node_name.as_deref(),
        spec.node_selector.as_ref(),
        spec.all_nodes,
        spec.per_device_node_selection,
        true,
    )?;
    if spec.shared_counters.is_some() && spec.devices.is_some() {
        return Err(FieldError::new(
            "spec",
            "Invalid value: \"\": only one of `sharedCounters` or `devices` is allowed",
        ));
    }
    let devices = spec.devices.as_deref().unwrap_or_default();
    let advanced = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty())
            || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
            || (gates.list_type_attributes
                && d.attributes.iter().flatten().any(|(_, a)| has_list(a)))
    });
    let max = if advanced {
        MAX_DEVICES_ADVANCED
    } else {
        MAX_DEVICES
    };
    at_most(Some(devices), max, "spec.devices")?;
    let mut device_names = BTreeSet::new();
    let per_device = spec.per_device_node_selection == Some(true);
    for (i, device) in devices.iter().enumerate() {
        let at = || format!("spec.devices[{i}]");
        // Checked without field paths first: writing them for each of a fleet's 200,000
        // devices was most of the check. A device that fails is checked again with them, for
        // the message (the checks do not depend on the path).
        if self::device(device, "", per_device, gates).is_err() {
            self::device(device, &at(), per_device, gates)?;
        }
        if !device_names.insert(device.name.as_str()) {
            return Err(FieldError::new(
                at(),
                format!("Duplicate value: {:?}", device.name),
            ));
        }
    }
    if gates.partitionable_devices_type
        && let Some(name) = &spec.partition_type_attribute
    {
        partition_type_attribute(spec, name)?;
    }
    if gates.optional_node_operations {
        let skipped = spec.skip_node_operations.as_deref().unwrap_or_default();
        let has = |op: &str| skipped.iter().any(|s| s == op);
        if has("NodePrepareResources") && !has("NodeUnprepareResources") && !has("*") {
            return Err(FieldError::new(
                "spec.skipNodeOperations",
                "Invalid value: NodePrepareResources cannot be skipped unless NodeUnprepareResources is also skipped",
            ));
        }
    }
    let sets = spec.shared_counters.as_deref();
    at_most(sets, MAX_COUNTER_SETS, "spec.sharedCounters")?;
    let mut set_names = BTreeSet::new();
    for (i, set) in sets.unwrap_or_default().iter().enumerate() {
        let at = format!("spec.sharedCounters[{i}]");
        dns_label(&set.name, &field!(at, "{at}.name"))?;
        counters(&set.counters, &field!(at, "{at}.counters"))?;
        if !set_names.insert(set.name.as_str()) {
            return Err(FieldError::new(
                at,
                format!("Duplicate value: {:?}", set.name),
            ));
        }
    }
    Ok(())
}

fn has_list(a: &DeviceAttribute) -> bool {
    a.bools.is_some() || a.ints.is_some() || a.strings.is_some() || a.versions.is_some()
}

fn counters(
    counters: &BTreeMap<String, k8s_openapi::api::resource::v1::Counter>,
    at: &str,
) -> Result<(), FieldError> {
    let n = counters.len();
    if n == 0 {
        return Err(FieldError::new(at, "Required value"));
    }
    if n > MAX_COUNTERS {
        return Err(FieldError::new(
            at,
            format!("Too many: {n}: must have at most {MAX_COUNTERS} items"),
        ));
    }
    for (name, counter) in counters {
        invalid_if(names::dns1123_label(name), name, at)?;
        validate::quantity(&counter.value, &field!(at, "{at}[{name}].value"))?;
    }
    Ok(())
}

/// Exactly one way of selecting nodes: the slice's (`spec`) or, with `perDeviceNodeSelection`,
/// each device's.
fn node_selection(
    at: &str,
    node_name: Option<&str>,
    selector: Option<&NodeSelector>,
    all_nodes: Option<bool>,
    per_device: Option<bool>,
    slice: bool,
) -> Result<(), FieldError> {
    let mut set = Vec::new();
    match node_name {
        Some("") if slice => {
            return Err(FieldError::new(
                field!(at, "{at}.nodeName"),
                "Invalid value: \"\": must be either unset or set to a non-empty string",
            ));
        }
        Some("") => {
            return Err(FieldError::new(
                field!(at, "{at}.nodeName"),
                "Invalid value: \"\": must not be empty",
            ));
        }
        Some(name) => {
            validate::dns_subdomain(name, &field!(at, "{at}.nodeName"))?;
            set.push("`nodeName`");
        }
        None => {}
    }
    if let Some(selector) = selector {
        node_selector(selector, &field!(at, "{at}.nodeSelector"))?;
        if slice && selector.node_selector_terms.len() != 1 {
            return Err(FieldError::new(
                field!(at, "{at}.nodeSelector.nodeSelectorTerms"),
                "Invalid value: must have exactly one node selector term",
            ));
        }
        set.push("`nodeSelector`");
    }
    for (value, name) in [
        (all_nodes, "allNodes"),
        (per_device, "perDeviceNodeSelection"),
    ] {
        match value {
            Some(true) => set.push(if name == "allNodes" {
                "`allNodes`"
            } else {
                "`perDeviceNodeSelection`"
            }),
            Some(false) => {
                return Err(FieldError::new(
                    field!(at, "{at}.{name}"),
                    "Invalid value: false: must be either unset or set to true",
                ));
            }
            None => {}
        }
    }
    let rule = if slice {
        NODE_SELECTION
    } else {
        DEVICE_NODE_SELECTION
    };
    match set.len() {
        0 => Err(FieldError::new(at, format!("Required value: {rule}"))),
        1 => Ok(()),
        _ => Err(FieldError::new(
            at,
            format!(
                "Invalid value: \"{{{}}}\": {rule}{}",
                set.join(", "),
                if slice {
                    ", but multiple fields are set"
                } else {
                    ""
                }
            ),
        )),
    }
}

/// `ValidateNodeSelector`: at least one term; each requirement's key, operator and values.
fn node_selector(selector: &NodeSelector, at: &str) -> Result<(), FieldError> {
    let terms_at = field!(at, "{at}.nodeSelectorTerms");
    if selector.node_selector_terms.is_empty() {
        return Err(FieldError::new(
            terms_at,
            "Required value: must have at least one node selector term",
        ));
    }
    for (i, term) in selector.node_selector_terms.iter().enumerate() {
        let at = field!(terms_at, "{terms_at}[{i}]");
        for (j, r) in term.match_expressions.iter().flatten().enumerate() {
            requirement(r, &field!(at, "{at}.matchExpressions[{j}]"), false)?;
        }
        for (j, r) in term.match_fields.iter().flatten().enumerate() {
            requirement(r, &field!(at, "{at}.matchFields[{j}]"), true)?;
        }
    }
    Ok(())
}

fn requirement(r: &NodeSelectorRequirement, at: &str, field: bool) -> Result<(), FieldError> {
    let values = r.values.as_deref().unwrap_or_default();
    let values_at = field!(at, "{at}.values");
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => {
            return Err(FieldError::new(
                values_at,
                "Required value: must be specified when `operator` is 'In' or 'NotIn'",
            ));
        }
        "In" | "NotIn" if field && values.len() != 1 => {
            return Err(FieldError::new(
                values_at,
                "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
            ));
        }
        "In" | "NotIn" => {}
        "Exists" | "DoesNotExist" if !field => {
            if !values.is_empty() {
                return Err(FieldError::new(
                    values_at,
                    "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                ));
            }
        }
        "Gt" | "Lt" if !field => {
            if values.len() != 1 {
                return Err(FieldError::new(
                    values_at,
                    "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
                ));
            }
        }
        other => {
            return Err(FieldError::new(
                field!(at, "{at}.operator"),
                format!("Invalid value: {other:?}: not a valid selector operator"),
            ));
        }
    }
    if field {
        if r.key != "metadata.name" {
            return Err(FieldError::new(
                field!(at, "{at}.key"),
                format!("Invalid value: {:?}: not a valid field selector key", r.key),
            ));
        }
        return Ok(());
    }
    invalid_if(
        names::qualified_name(&r.key),
        &r.key,
        &field!(at, "{at}.key"),
    )?;
    if !matches!(r.operator.as_str(), "Gt" | "Lt") {
        for (k, value) in values.iter().enumerate() {
            invalid_if(
                names::label_value(value),
                value,
                &field!(values_at, "{values_at}[{k}]"),
            )?;
        }
    }
    Ok(())
}

fn device(device: &Device, at: &str, per_device: bool, gates: ApiGates) -> Result<(), FieldError> {
    dns_label(&device.name, &field!(at, "{at}.name"))?;
    let empty = BTreeMap::new();
    // Without DRAListTypeAttributes the API server drops list values before validating.
    let attributes: Vec<(&String, Cow<DeviceAttribute>)> = device
        .attributes
        .as_ref()
        .unwrap_or(&empty)
        .iter()
        .map(|(k, a)| {
            if gates.list_type_attributes || !has_list(a) {
                return (k, Cow::Borrowed(a));
            }
            let mut a = a.clone();
            (a.bools, a.ints, a.strings, a.versions) = (None, None, None, None);
            (k, Cow::Owned(a))
        })
        .collect();
    let no_capacity = BTreeMap::new();
    let capacity = device.capacity.as_ref().unwrap_or(&no_capacity);
    let total = attributes.len() + capacity.len();
    if total > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(FieldError::new(
            at,
            format!(
                "Invalid value: {total}: the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"
            ),
        ));
    }
    let values: usize = attributes
        .iter()
        .map(|(_, a)| {
            let listed = [
                a.bools.as_ref().map_or(0, Vec::len),
                a.ints.as_ref().map_or(0, Vec::len),
                a.strings.as_ref().map_or(0, Vec::len),
                a.versions.as_ref().map_or(0, Vec::len),
            ]
            .iter()
            .sum::<usize>();
            listed.max(1)
        })
        .sum();
    if values > MAX_ATTRIBUTE_VALUES {
        return Err(FieldError::new(
            at,
            format!(
                "Invalid value: {values}: the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}"
            ),
        ));
    }
    let attributes_at = field!(at, "{at}.attributes");
    for (key, attribute) in &attributes {
        qualified_key(key, &attributes_at)?;
        let at = field!(attributes_at, "{attributes_at}[{key}]");
        if let Cow::Owned(dropped) = attribute
            && attribute_value(dropped, &at).is_err()
        {
            // Slices read from a cluster that has the gate: say which flag is missing.
            return Err(FieldError::new(
                at,
                "Invalid value: a list value needs the DRAListTypeAttributes gate (--feature-gates DRAListTypeAttributes=true); without it the API server drops list values, and exactly one value must be specified",
            ));
        }
        attribute_value(attribute, &at)?;
    }
    let capacity_at = field!(at, "{at}.capacity");
    let multiple = gates.consumable_capacity && device.allow_multiple_allocations == Some(true);
    for (key, capacity) in capacity {
        qualified_key(key, &capacity_at)?;
        validate::quantity(
            &capacity.value,
            &field!(capacity_at, "{capacity_at}[{key}].value"),
        )?;
        let policy_at = field!(capacity_at, "{capacity_at}[{key}].requestPolicy");
        if let Some(policy) = &capacity.request_policy {
            let range = policy.valid_range.as_ref();
            let quantities = policy
                .default
                .iter()
                .map(|q| (q, "default".to_string()))
                .chain(
                    policy
                        .valid_values
                        .iter()
                        .flatten()
                        .enumerate()
                        .map(|(i, q)| (q, format!("validValues[{i}]"))),
                )
                .chain(range.map(|r| (&r.min, "validRange.min".to_string())))
                .chain(
                    range
                        .and_then(|r| r.max.as_ref())
                        .map(|q| (q, "validRange.max".to_string())),
                )
                .chain(
                    range
                        .and_then(|r| r.step.as_ref())
                        .map(|q| (q, "validRange.step".to_string())),
                );
            for (q, field) in quantities {
                validate::quantity(q, &field!(policy_at, "{policy_at}.{field}"))?;
            }
        }
        match &capacity.request_policy {
            // Without DRAConsumableCapacity the API server drops request policies.
            Some(_) if gates.consumable_capacity && !multiple => {
                return Err(FieldError::new(
                    policy_at,
                    "Forbidden: allowMultipleAllocations must be true",
                ));
            }
            Some(policy) if multiple => {
                let values = policy.valid_values.as_deref().unwrap_or_default();
                if !values.is_empty() && policy.valid_range.is_some() {
                    return Err(FieldError::new(
                        policy_at,
                        "Forbidden: exactly one policy can be specified, cannot specify \"validValues\" and \"validRange\" at the same time",
                    ));
                }
                if (!values.is_empty() || policy.valid_range.is_some()) && policy.default.is_none()
                {
                    return Err(FieldError::new(
                        field!(policy_at, "{policy_at}.default"),
                        "Required value",
                    ));
                }
                // Quantities were checked above: these parse.
                let parse = |q: &Quantity| k8s_quantity::Quantity::parse(&q.0).ok();
                if let (Some(capacity), Some(default)) = (
                    parse(&capacity.value),
                    policy.default.as_ref().and_then(parse),
                ) {
                    if !values.is_empty() {
                        valid_values(&capacity, &default, values, &policy_at, gates)?;
                    }
                    if let Some(range) = &policy.valid_range {
                        valid_range(&capacity, &default, range, &policy_at, gates)?;
                    }
                }
            }
            _ => {}
        }
    }
    let taints = device.taints.as_deref();
    at_most(taints, MAX_TAINTS, &field!(at, "{at}.taints"))?;
    for (i, taint) in taints.unwrap_or_default().iter().enumerate() {
        validate::taint(taint, &field!(at, "{at}.taints[{i}]"))?;
    }
    let consumed = device.consumes_counters.as_deref();
    let consumed_at = field!(at, "{at}.consumesCounters");
    at_most(consumed, MAX_CONSUMED_COUNTER_SETS, &consumed_at)?;
    let mut sets = BTreeSet::new();
    for (i, c) in consumed.unwrap_or_default().iter().enumerate() {
        let at = field!(consumed_at, "{consumed_at}[{i}]");
        dns_label(&c.counter_set, &field!(at, "{at}.counterSet"))?;
        counters(&c.counters, &field!(at, "{at}.counters"))?;
        if !sets.insert(c.counter_set.as_str()) {
            return Err(FieldError::new(
                at,
                format!("Duplicate value: {:?}", c.counter_set),
            ));
        }
    }
    if per_device {
        node_selection(
            at,
            device.node_name.as_deref(),
            device.node_selector.as_ref(),
            device.all_nodes,
            None,
            false,
        )?;
    } else if device.node_name.is_some()
        || device.node_selector.is_some()
        || device.all_nodes.is_some()
    {
        return Err(FieldError::new(
            at,
            "Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        ));
    }
    binding_conditions(
        device.binding_conditions.as_deref().unwrap_or_default(),
        device
            .binding_failure_conditions
            .as_deref()
            .unwrap_or_default(),
        at,
    )?;
    if gates.node_allocatable_resources {
        node_allocatable(device, &field!(at, "{at}.nodeAllocatableResources"))?;
    }
    Ok(())
}

/// `validateNodeAllocatableResources`: cpu, memory or hugepages, each mapped from a capacity of
/// the device or given as an overhead, with positive multipliers and non-negative overheads.
fn node_allocatable(device: &Device, at: &str) -> Result<(), FieldError> {
    for (name, resource) in device.node_allocatable_resources.iter().flatten() {
        let at = field!(at, "{at}[{name}]");
        let mapping = resource.mapping.as_ref();
        let overhead = resource.overhead.as_ref();
        for (q, field) in [
            (
                mapping.and_then(|m| m.capacity_multiplier.as_ref()),
                "mapping.capacityMultiplier",
            ),
            (
                mapping.and_then(|m| m.device_multiplier.as_ref()),
                "mapping.deviceMultiplier",
            ),
            (overhead.and_then(|o| o.per_pod.as_ref()), "overhead.perPod"),
            (
                overhead.and_then(|o| o.per_container.as_ref()),
                "overhead.perContainer",
            ),
        ] {
            if let Some(q) = q {
                validate::quantity(q, &field!(at, "{at}.{field}"))?;
            }
        }
    }
    let sign = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        k8s_quantity::Quantity::parse(&q.0)
            .map(|q| q.as_approximate_float())
            .unwrap_or(0.0)
    };
    for (name, resource) in device.node_allocatable_resources.iter().flatten() {
        let at = field!(at, "{at}[{name}]");
        if !(name == "cpu" || name == "memory" || name.starts_with("hugepages-")) {
            return Err(FieldError::new(
                at,
                format!("Invalid value: {name:?}: must be a node allocatable resource name"),
            ));
        }
        if resource.mapping.is_none() && resource.overhead.is_none() {
            return Err(FieldError::new(
                at,
                "Required value: at least one of mapping or overhead must be set",
            ));
        }
        if let Some(mapping) = &resource.mapping {
            let at = field!(at, "{at}.mapping");
            match (&mapping.capacity_key, &mapping.capacity_multiplier) {
                (Some(key), _) if key.is_empty() => {
                    return Err(FieldError::new(
                        field!(at, "{at}.capacityKey"),
                        "Invalid value: \"\": capacityKey must not be an empty string",
                    ));
                }
                (Some(key), _)
                    if !device
                        .capacity
                        .as_ref()
                        .is_some_and(|c| c.contains_key(key)) =>
                {
                    return Err(FieldError::new(
                        field!(at, "{at}.capacityKey"),
                        format!("Not found: {key:?}"),
                    ));
                }
                (Some(_), None) => {
                    return Err(FieldError::new(
                        field!(at, "{at}.capacityMultiplier"),
                        "Required value: capacityMultiplier is required when capacityKey is set",
                    ));
                }
                (Some(_), Some(m)) if sign(m) <= 0.0 => {
                    return Err(FieldError::new(
                        field!(at, "{at}.capacityMultiplier"),
                        format!("Invalid value: {:?}: must be positive", m.0),
                    ));
                }
                (None, Some(_)) => {
                    return Err(FieldError::new(
                        field!(at, "{at}.capacityKey"),
                        "Required value: capacityKey is required when capacityMultiplier is set",
                    ));
                }
                _ => {}
            }
            if let Some(m) = &mapping.device_multiplier
                && sign(m) <= 0.0
            {
                return Err(FieldError::new(
                    field!(at, "{at}.deviceMultiplier"),
                    format!("Invalid value: {:?}: must be positive", m.0),
                ));
            }
        }
        if let Some(overhead) = &resource.overhead {
            let at = field!(at, "{at}.overhead");
            if overhead.per_pod.is_none() && overhead.per_container.is_none() {
                return Err(FieldError::new(
                    at,
                    "Invalid value: \"\": at least one of perPod or perContainer must be set",
                ));
            }
            for (q, name) in [
                (&overhead.per_pod, "perPod"),
                (&overhead.per_container, "perContainer"),
            ] {
                if let Some(q) = q
                    && sign(q) < 0.0
                {
                    return Err(FieldError::new(
                        field!(at, "{at}.{name}"),
                        format!("Invalid value: {:?}: must be non-negative", q.0),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// `validatePartitionTypeAttribute`: only on a slice with devices that consume counters, each
/// of which carries the attribute (bare in the driver's domain or qualified) as a string.
fn partition_type_attribute(spec: &ResourceSliceSpec, name: &str) -> Result<(), FieldError> {
    let devices = spec.devices.as_deref().unwrap_or_default();
    let consumes = |d: &Device| d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty());
    if !devices.iter().any(consumes) {
        return Err(FieldError::new(
            "spec.partitionTypeAttribute",
            format!(
                "Invalid value: {name:?}: may only be set on a slice which declares devices that consume counters"
            ),
        ));
    }
    let bare = name.strip_prefix(&format!("{}/", spec.driver));
    for (i, device) in devices.iter().enumerate().filter(|(_, d)| consumes(d)) {
        let at = format!("spec.devices[{i}].attributes[{name}]");
        let attributes = device.attributes.as_ref();
        let found = attributes
            .and_then(|a| a.get(name))
            .or_else(|| bare.and_then(|b| attributes.and_then(|a| a.get(b))));
        match found {
            None => {
                return Err(FieldError::new(
                    at,
                    "Required value: device consumes counters and `partitionTypeAttribute` names this attribute, so it must be set",
                ));
            }
            Some(a) if a.string.is_none() => {
                return Err(FieldError::new(
                    at,
                    "Invalid value: must be a string value because `partitionTypeAttribute` names this attribute",
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An attribute or capacity name: `<domain>/<C identifier>` or a bare C identifier, within
/// the key length (errors on the map, as `validateMap` reports key errors).
fn qualified_key(key: &str, at: &str) -> Result<(), FieldError> {
    let too_long = |max: usize| {
        Err(FieldError::new(
            at,
            format!("Too long: may not be more than {max} bytes"),
        ))
    };
    let id = match key.split_once('/') {
        Some((domain, id)) => {
            if domain.is_empty() {
                return Err(FieldError::new(
                    at,
                    "Invalid value: \"\": the domain must not be empty",
                ));
            }
            if domain.len() > 63 {
                return too_long(63);
            }
            validate::driver_name(domain, at)?;
            if id.is_empty() {
                return Err(FieldError::new(
                    at,
                    "Invalid value: \"\": the name must not be empty",
                ));
            }
            id
        }
        None => key,
    };
    if id.len() > 32 {
        return too_long(32);
    }
    validate::c_identifier(id, at)
}

/// Exactly one value; strings and versions within 64 bytes; versions semver; lists not empty.
fn attribute_value(a: &DeviceAttribute, at: &str) -> Result<(), FieldError> {
    let set = [
        a.bool.is_some(),
        a.int.is_some(),
        a.string.is_some(),
        a.version.is_some(),
        a.bools.is_some(),
        a.ints.is_some(),
        a.strings.is_some(),
        a.versions.is_some(),
    ]
    .iter()
    .filter(|s| **s)
    .count();
    if set != 1 {
        return Err(FieldError::new(
            at,
            "Invalid value: exactly one value must be specified",
        ));
    }
    let long = |v: &str, at: String| {
        if v.len() > MAX_VALUE_LENGTH {
            Err(FieldError::new(
                at,
                format!("Too long: may not be more than {MAX_VALUE_LENGTH} bytes"),
            ))
        } else {
            Ok(())
        }
    };
    let version = |v: &str, at: String| {
        if !crate::slices::validate::is_semver(v) {
            return Err(FieldError::new(
                &at,
                format!(
                    "Invalid value: {v:?}: must be a string compatible with semver.org spec 2.0.0"
                ),
            ));
        }
        long(v, at)
    };
    if let Some(s) = &a.string {
        long(s, field!(at, "{at}.string"))?;
    }
    if let Some(v) = &a.version {
        version(v, field!(at, "{at}.version"))?;
    }
    for (name, len) in [
        ("bools", a.bools.as_ref().map(Vec::len)),
        ("ints", a.ints.as_ref().map(Vec::len)),
        ("strings", a.strings.as_ref().map(Vec::len)),
        ("versions", a.versions.as_ref().map(Vec::len)),
    ] {
        if len == Some(0) {
            return Err(FieldError::new(
                field!(at, "{at}.{name}"),
                "Invalid value: []: must not be empty if specified",
            ));
        }
    }
    for (i, s) in a.strings.iter().flatten().enumerate() {
        long(s, field!(at, "{at}.strings[{i}]"))?;
    }
    for (i, v) in a.versions.iter().flatten().enumerate() {
        version(v, field!(at, "{at}.versions[{i}]"))?;
    }
    Ok(())
}

/// Binding conditions and failure conditions: at most 4 each, label keys, no duplicates, no
/// overlap, each needing the other.
fn binding_conditions(
    conditions: &[String],
    failures: &[String],
    at: &str,
) -> Result<(), FieldError> {
    let c_at = field!(at, "{at}.bindingConditions");
    let f_at = field!(at, "{at}.bindingFailureConditions");
    at_most(Some(conditions), MAX_BINDING_CONDITIONS, &c_at)?;
    at_most(Some(failures), MAX_BINDING_CONDITIONS, &f_at)?;
    for (list, list_at) in [(conditions, &c_at), (failures, &f_at)] {
        let mut seen = BTreeSet::new();
        for (i, c) in list.iter().enumerate() {
            let item = field!(list_at, "{list_at}[{i}]");
            invalid_if(names::qualified_name(c), c, &item)?;
            if !seen.insert(c) {
                return Err(FieldError::new(item, format!("Duplicate value: {c:?}")));
            }
        }
    }
    if let Some((i, c)) = failures
        .iter()
        .enumerate()
        .find(|(_, c)| conditions.contains(c))
    {
        return Err(FieldError::new(
            field!(f_at, "{f_at}[{i}]"),
            format!(
                "Invalid value: {c:?}: bindingFailureConditions must not overlap with bindingConditions"
            ),
        ));
    }
    if conditions.is_empty() && !failures.is_empty() {
        return Err(FieldError::new(
            c_at,
            "Invalid value: null: bindingConditions are required to use bindingFailureConditions",
        ));
    }
    if failures.is_empty() && !conditions.is_empty() {
        return Err(FieldError::new(
            f_at,
            "Invalid value: null: bindingFailureConditions are required to use bindingConditions",
        ));
    }
    Ok(())
}
