//! The API server's ResourceSlice validation, for what we publish: we fail with a clear error
//! naming the object and field rather than send something `kube-apiserver` would reject.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};

use super::{MAX_DEVICES_PER_SLICE, MAX_DEVICES_PER_SLICE_WITH_COUNTERS, SliceError};

pub const MAX_NAME_LENGTH: usize = 253;
pub const MAX_DRIVER_NAME_LENGTH: usize = 63;
pub const MAX_LABEL_LENGTH: usize = 63;
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
pub const MAX_ATTRIBUTE_VALUES: usize = 48;
pub const MAX_STRING_LENGTH: usize = 64;
pub const MAX_IDENTIFIER_LENGTH: usize = 32;
pub const MAX_COUNTER_SETS: usize = 8;
pub const MAX_COUNTERS: usize = 32;
pub const MAX_CONSUMED_COUNTER_SETS: usize = 2;

struct Ctx {
    object: String,
}

impl Ctx {
    fn err(&self, field: impl Into<String>, reason: impl Into<String>) -> SliceError {
        SliceError::Invalid {
            object: self.object.clone(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Validates all slices of one pool, including what spans slices (unique device names, counter
/// set references, the slice count).
pub fn pool(slices: &[ResourceSlice]) -> Result<(), SliceError> {
    let mut device_names = BTreeSet::new();
    let mut counter_sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for slice in slices {
        let ctx = ctx(slice);
        for (i, set) in slice.spec.shared_counters.iter().flatten().enumerate() {
            let counters = set.counters.keys().cloned().collect();
            if counter_sets.insert(set.name.clone(), counters).is_some() {
                return Err(ctx.err(
                    format!("spec.sharedCounters[{i}].name"),
                    format!("{:?} is not unique in the pool", set.name),
                ));
            }
        }
    }
    for slice in slices {
        one(slice)?;
        let ctx = ctx(slice);
        if slice.spec.pool.resource_slice_count != slices.len() as i64 {
            return Err(ctx.err(
                "spec.pool.resourceSliceCount",
                format!(
                    "is {} but the pool has {} slices",
                    slice.spec.pool.resource_slice_count,
                    slices.len()
                ),
            ));
        }
        for (i, device) in slice.spec.devices.iter().flatten().enumerate() {
            if !device_names.insert(device.name.clone()) {
                return Err(ctx.err(
                    format!("spec.devices[{i}].name"),
                    format!("{:?} is not unique in the pool", device.name),
                ));
            }
            for (j, consumption) in device.consumes_counters.iter().flatten().enumerate() {
                let field = format!("spec.devices[{i}].consumesCounters[{j}]");
                let Some(known) = counter_sets.get(&consumption.counter_set) else {
                    return Err(ctx.err(
                        format!("{field}.counterSet"),
                        format!("no counter set {:?} in the pool", consumption.counter_set),
                    ));
                };
                for name in consumption.counters.keys() {
                    if !known.contains(name) {
                        return Err(ctx.err(
                            format!("{field}.counters[{name:?}]"),
                            format!(
                                "counter set {:?} has no such counter",
                                consumption.counter_set
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

fn ctx(slice: &ResourceSlice) -> Ctx {
    Ctx {
        object: format!(
            "ResourceSlice {}",
            slice.metadata.name.as_deref().unwrap_or("<unnamed>")
        ),
    }
}

/// Validates one slice on its own.
pub fn one(slice: &ResourceSlice) -> Result<(), SliceError> {
    let ctx = ctx(slice);
    let spec = &slice.spec;
    dns_subdomain(&spec.driver.to_ascii_lowercase(), MAX_DRIVER_NAME_LENGTH)
        .map_err(|r| ctx.err("spec.driver", r))?;
    if spec.pool.name.len() > MAX_NAME_LENGTH {
        return Err(ctx.err("spec.pool.name", format!("longer than {MAX_NAME_LENGTH}")));
    }
    for part in spec.pool.name.split('/') {
        dns_subdomain(part, MAX_NAME_LENGTH).map_err(|r| ctx.err("spec.pool.name", r))?;
    }
    if spec.pool.generation < 0 {
        return Err(ctx.err("spec.pool.generation", "must not be negative"));
    }
    if spec.pool.resource_slice_count <= 0 {
        return Err(ctx.err("spec.pool.resourceSliceCount", "must be positive"));
    }
    let selections = [
        spec.node_name.is_some(),
        spec.node_selector.is_some(),
        spec.all_nodes == Some(true),
        spec.per_device_node_selection == Some(true),
    ];
    if selections.iter().filter(|s| **s).count() != 1 {
        return Err(ctx.err(
            "spec",
            "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection must be set",
        ));
    }
    if let Some(node) = &spec.node_name {
        dns_subdomain(node, MAX_NAME_LENGTH).map_err(|r| ctx.err("spec.nodeName", r))?;
    }
    // Checked after the fields it derives from, so the error names the real cause.
    if let Some(name) = &slice.metadata.name {
        dns_subdomain(name, MAX_NAME_LENGTH).map_err(|r| ctx.err("metadata.name", r))?;
    }
    let devices = spec.devices.as_deref().unwrap_or_default();
    let counters = spec.shared_counters.as_deref().unwrap_or_default();
    if !devices.is_empty() && !counters.is_empty() {
        return Err(ctx.err(
            "spec",
            "a slice holds either devices or sharedCounters, not both",
        ));
    }
    if counters.len() > MAX_COUNTER_SETS {
        return Err(ctx.err(
            "spec.sharedCounters",
            format!(
                "{} counter sets, at most {MAX_COUNTER_SETS}",
                counters.len()
            ),
        ));
    }
    for (i, set) in counters.iter().enumerate() {
        dns_label(&set.name).map_err(|r| ctx.err(format!("spec.sharedCounters[{i}].name"), r))?;
        let set_counters = set.counters.len();
        if set_counters == 0 || set_counters > MAX_COUNTERS {
            return Err(ctx.err(
                format!("spec.sharedCounters[{i}].counters"),
                format!("{set_counters} counters, must be 1 to {MAX_COUNTERS}"),
            ));
        }
        for name in set.counters.keys() {
            dns_label(name)
                .map_err(|r| ctx.err(format!("spec.sharedCounters[{i}].counters[{name:?}]"), r))?;
        }
    }
    let strict = devices.iter().any(|d| {
        d.taints.as_ref().is_some_and(|t| !t.is_empty())
            || d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty())
            || d.attributes.iter().flat_map(BTreeMap::values).any(is_list)
    });
    let limit = if strict {
        MAX_DEVICES_PER_SLICE_WITH_COUNTERS
    } else {
        MAX_DEVICES_PER_SLICE
    };
    if devices.len() > limit {
        return Err(ctx.err(
            "spec.devices",
            format!("{} devices, at most {limit} in one slice", devices.len()),
        ));
    }
    for (i, device) in devices.iter().enumerate() {
        self::device(&ctx, &format!("spec.devices[{i}]"), device)?;
    }
    Ok(())
}

fn is_list(a: &DeviceAttribute) -> bool {
    a.ints.is_some() || a.bools.is_some() || a.strings.is_some() || a.versions.is_some()
}

fn device(ctx: &Ctx, field: &str, device: &Device) -> Result<(), SliceError> {
    dns_label(&device.name).map_err(|r| ctx.err(format!("{field}.name"), r))?;
    let attributes = device.attributes.as_ref();
    let capacity = device.capacity.as_ref();
    let entries = attributes.map_or(0, BTreeMap::len) + capacity.map_or(0, BTreeMap::len);
    if entries > MAX_ATTRIBUTES_AND_CAPACITIES {
        return Err(ctx.err(
            field,
            format!("{entries} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES}"),
        ));
    }
    let mut values = 0;
    for (name, value) in attributes.into_iter().flatten() {
        let at = format!("{field}.attributes[{name:?}]");
        qualified_name(name).map_err(|r| ctx.err(&at, r))?;
        values += attribute(value).map_err(|r| ctx.err(&at, r))?;
    }
    if values > MAX_ATTRIBUTE_VALUES {
        return Err(ctx.err(
            format!("{field}.attributes"),
            format!("{values} values, at most {MAX_ATTRIBUTE_VALUES}"),
        ));
    }
    for (name, value) in capacity.into_iter().flatten() {
        let at = format!("{field}.capacity[{name:?}]");
        qualified_name(name).map_err(|r| ctx.err(&at, r))?;
        if value.value.0.is_empty() {
            return Err(ctx.err(format!("{at}.value"), "required"));
        }
    }
    for (name, resource) in device.node_allocatable_resources.iter().flatten() {
        let at = format!("{field}.nodeAllocatableResources[{name:?}]");
        if !super::node_allocatable::is_node_allocatable_name(name) {
            return Err(ctx.err(&at, "must be a node allocatable resource name"));
        }
        if resource.mapping.is_none() && resource.overhead.is_none() {
            return Err(ctx.err(&at, "at least one of mapping or overhead must be set"));
        }
        if let Some(overhead) = &resource.overhead
            && overhead.per_pod.is_none()
            && overhead.per_container.is_none()
        {
            return Err(ctx.err(
                format!("{at}.overhead"),
                "at least one of perPod or perContainer must be set",
            ));
        }
    }
    if let Some(consumption) = &device.consumes_counters {
        if consumption.len() > MAX_CONSUMED_COUNTER_SETS {
            return Err(ctx.err(
                format!("{field}.consumesCounters"),
                format!(
                    "{} counter sets, at most {MAX_CONSUMED_COUNTER_SETS}",
                    consumption.len()
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for (j, c) in consumption.iter().enumerate() {
            if !seen.insert(&c.counter_set) {
                return Err(ctx.err(
                    format!("{field}.consumesCounters[{j}].counterSet"),
                    "duplicate",
                ));
            }
            if c.counters.len() > MAX_COUNTERS {
                return Err(ctx.err(
                    format!("{field}.consumesCounters[{j}].counters"),
                    format!("at most {MAX_COUNTERS}"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks one attribute value; returns how many values it holds.
fn attribute(value: &DeviceAttribute) -> Result<usize, String> {
    let set = [
        value.int.is_some(),
        value.bool.is_some(),
        value.string.is_some(),
        value.version.is_some(),
        value.ints.is_some(),
        value.bools.is_some(),
        value.strings.is_some(),
        value.versions.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err("exactly one value must be set".into());
    }
    let short = |s: &str| {
        if s.len() > MAX_STRING_LENGTH {
            Err(format!("{s:?} is longer than {MAX_STRING_LENGTH}"))
        } else {
            Ok(())
        }
    };
    let semver = |s: &str| {
        short(s)?;
        if is_semver(s) {
            Ok(())
        } else {
            Err(format!("{s:?} is not a semantic version"))
        }
    };
    if let Some(s) = &value.string {
        short(s)?;
    }
    if let Some(v) = &value.version {
        semver(v)?;
    }
    for s in value.strings.iter().flatten() {
        short(s)?;
    }
    for v in value.versions.iter().flatten() {
        semver(v)?;
    }
    let list_len = [
        value.ints.as_ref().map(Vec::len),
        value.bools.as_ref().map(Vec::len),
        value.strings.as_ref().map(Vec::len),
        value.versions.as_ref().map(Vec::len),
    ]
    .into_iter()
    .flatten()
    .next();
    match list_len {
        Some(0) => Err("a list attribute must not be empty".into()),
        Some(n) => Ok(n),
        None => Ok(1),
    }
}

/// A DNS-1123 label: lower-case alphanumerics and `-`, alphanumeric at both ends, ≤63.
pub fn dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > MAX_LABEL_LENGTH {
        return Err(format!("{s:?} is longer than {MAX_LABEL_LENGTH}"));
    }
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
    let bytes = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !bytes.iter().all(|&c| ok_char(c)) || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err(format!(
            "{s:?} is not a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// A DNS-1123 subdomain: dot-separated labels, ≤`max`.
pub fn dns_subdomain(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > max {
        return Err(format!("{s:?} is longer than {max}"));
    }
    for label in s.split('.') {
        dns_label(label).map_err(|_| format!("{s:?} is not a DNS subdomain"))?;
    }
    Ok(())
}

/// `identifier` or `domain/identifier` (the domain a DNS subdomain ≤63, the identifier a C
/// identifier ≤32).
pub fn qualified_name(s: &str) -> Result<(), String> {
    let (domain, identifier) = match s.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, s),
    };
    if let Some(domain) = domain {
        dns_subdomain(domain, MAX_DRIVER_NAME_LENGTH).map_err(|r| format!("domain: {r}"))?;
    }
    let bytes = identifier.as_bytes();
    let valid = !bytes.is_empty()
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if !valid {
        return Err(format!("{identifier:?} is not a C identifier"));
    }
    if identifier.len() > MAX_IDENTIFIER_LENGTH {
        return Err(format!(
            "{identifier:?} is longer than {MAX_IDENTIFIER_LENGTH}"
        ));
    }
    Ok(())
}

/// Semantic Versioning 2.0.0, as the API server's parser accepts it.
pub fn is_semver(s: &str) -> bool {
    let (rest, build) = match s.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (s, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |p: &str| {
        !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) && (p == "0" || !p.starts_with('0'))
    };
    let ident =
        |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-');
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3 || !parts.iter().all(|p| numeric(p)) {
        return false;
    }
    if let Some(pre) = pre {
        let ok = pre
            .split('.')
            .all(|p| ident(p) && (!p.bytes().all(|c| c.is_ascii_digit()) || numeric(p)));
        if !ok {
            return false;
        }
    }
    build.is_none_or(|b| b.split('.').all(ident))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{ResourcePool, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice(devices: Vec<Device>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some("n1-gpu.nvidia.com-0".into()),
                ..Default::default()
            },
            spec: ResourceSliceSpec {
                driver: "gpu.nvidia.com".into(),
                node_name: Some("n1".into()),
                pool: ResourcePool {
                    name: "n1".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    fn device(name: &str, attributes: Vec<(&str, DeviceAttribute)>) -> Device {
        Device {
            name: name.into(),
            attributes: Some(
                attributes
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn s(v: &str) -> DeviceAttribute {
        DeviceAttribute {
            string: Some(v.into()),
            ..Default::default()
        }
    }

    fn err(result: Result<(), SliceError>) -> String {
        result.expect_err("must be rejected").to_string()
    }

    #[test]
    fn names_and_values() {
        assert!(pool(&[slice(vec![device("gpu-0", vec![("type", s("gpu"))])])]).is_ok());
        let e = err(pool(&[slice(vec![device("gpu.0", vec![])])]));
        assert!(
            e.contains("ResourceSlice n1-gpu.nvidia.com-0") && e.contains("spec.devices[0].name"),
            "{e}"
        );
        let e = err(pool(&[slice(vec![
            device("gpu-0", vec![]),
            device("gpu-0", vec![]),
        ])]));
        assert!(e.contains("not unique"), "{e}");
        let e = err(pool(&[slice(vec![device(
            "gpu-0",
            vec![("productName", s(&"x".repeat(65)))],
        )])]));
        assert!(
            e.contains("attributes[\"productName\"]") && e.contains("longer than 64"),
            "{e}"
        );
        let e = err(pool(&[slice(vec![device(
            "gpu-0",
            vec![("bad-name", s("x"))],
        )])]));
        assert!(e.contains("not a C identifier"), "{e}");
        let e = err(pool(&[slice(vec![device(
            "gpu-0",
            vec![("Bad_Domain.io/x", s("x"))],
        )])]));
        assert!(e.contains("domain"), "{e}");
        let v = DeviceAttribute {
            version: Some("580.95.05".into()),
            ..Default::default()
        };
        let e = err(pool(&[slice(vec![device(
            "gpu-0",
            vec![("driverVersion", v)],
        )])]));
        assert!(e.contains("not a semantic version"), "{e}");
        let many = (0..33)
            .map(|i| (Box::leak(format!("a{i}").into_boxed_str()) as &str, s("x")))
            .collect();
        let e = err(pool(&[slice(vec![device("gpu-0", many)])]));
        assert!(e.contains("33 attributes"), "{e}");
    }

    #[test]
    fn slice_limits() {
        let devices: Vec<Device> = (0..129)
            .map(|i| device(&format!("gpu-{i}"), vec![]))
            .collect();
        let e = err(pool(&[slice(devices)]));
        assert!(e.contains("129 devices, at most 128"), "{e}");
        let mut bad = slice(vec![]);
        bad.spec.pool.resource_slice_count = 2;
        assert!(err(pool(&[bad])).contains("resourceSliceCount"));
        let mut bad = slice(vec![]);
        bad.spec.all_nodes = Some(true);
        assert!(err(pool(&[bad])).contains("exactly one of nodeName"));
    }

    #[test]
    fn semver_rules() {
        for ok in [
            "1.0.0",
            "9.0.0",
            "580.95.5",
            "1.2.3-rc.1",
            "1.2.3+build.5",
            "0.0.0-alpha-1",
        ] {
            assert!(is_semver(ok), "{ok}");
        }
        for bad in [
            "1.0", "01.0.0", "1.0.05", "1.2.3-01", "1.2.3-", "v1.2.3", "1.2.3+",
        ] {
            assert!(!is_semver(bad), "{bad}");
        }
    }
}
