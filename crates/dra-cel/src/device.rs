//! The `device` a selector sees, built once per (driver, Device) and reused across selectors.
//!
//! Kubernetes rebuilds these maps on every evaluation; building them once is the main
//! structural speed-up. Conversion problems (a bad version string, an attribute without a
//! value) are kept and reported by every evaluation on the device, as Kubernetes does.
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use k8s_quantity::Quantity;

use super::semver::Semver;
use super::value::{MapValue, Value};

#[derive(Debug, Clone)]
pub struct DeviceView {
    pub driver: Arc<str>,
    pub allow_multiple_allocations: bool,
    /// domain → (id → value), sorted by domain.
    pub attributes: Vec<(Arc<str>, Arc<MapValue>)>,
    /// domain → (id → quantity), sorted by domain.
    pub capacity: Vec<(Arc<str>, Arc<MapValue>)>,
    /// Set when an attribute cannot be converted: every evaluation fails with it.
    pub conversion_error: Option<String>,
    pub(crate) empty: Arc<MapValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("capacity {name}: {message}")]
    Capacity { name: String, message: String },
}

/// `parseQualifiedName`: split at the first `/`, else the driver's domain.
fn split_qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    }
}

fn insert(domains: &mut Vec<(Arc<str>, MapValue)>, domain: &str, id: &str, value: Value) {
    let idx = match domains.iter().position(|(d, _)| &**d == domain) {
        Some(i) => i,
        None => {
            domains.push((Arc::from(domain), MapValue::default()));
            domains.len() - 1
        }
    };
    let map = &mut domains[idx].1;
    // Both `x` and `<driver>/x` land on one key; Go's map order decides which wins, here
    // the later one in name order does.
    if let Some(slot) = map
        .entries
        .iter_mut()
        .find(|(k, _)| matches!(k, Value::String(s) if &**s == id))
    {
        slot.1 = value;
    } else {
        map.entries.push((Value::string(id), value));
    }
}

fn finish(domains: Vec<(Arc<str>, MapValue)>) -> Vec<(Arc<str>, Arc<MapValue>)> {
    let mut out: Vec<_> = domains.into_iter().map(|(d, m)| (d, Arc::new(m))).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn semver_value(s: &str) -> Result<Value, String> {
    Semver::parse(s)
        .map(|v| Value::Semver(Arc::new(v)))
        .map_err(|e| format!("parse semantic version: {e}"))
}

/// `getAttributeValue`, in Go's order of precedence.
fn attribute_value(attr: &DeviceAttribute) -> Result<Value, String> {
    let list = |items: Vec<Value>| Value::List(Arc::new(items));
    if let Some(v) = &attr.ints {
        return Ok(list(v.iter().map(|i| Value::Int(*i)).collect()));
    }
    if let Some(v) = &attr.bools {
        return Ok(list(v.iter().map(|b| Value::Bool(*b)).collect()));
    }
    if let Some(v) = &attr.strings {
        return Ok(list(v.iter().map(|s| Value::string(s)).collect()));
    }
    if let Some(v) = &attr.versions {
        return v
            .iter()
            .map(|s| semver_value(s))
            .collect::<Result<Vec<_>, _>>()
            .map(list);
    }
    if let Some(i) = attr.int {
        return Ok(Value::Int(i));
    }
    if let Some(b) = attr.bool {
        return Ok(Value::Bool(b));
    }
    if let Some(s) = &attr.string {
        return Ok(Value::string(s));
    }
    if let Some(s) = &attr.version {
        return semver_value(s);
    }
    Err("unsupported attribute value".into())
}

impl DeviceView {
    /// Builds the view. A malformed capacity quantity is an error here (Go rejects it while
    /// decoding the object, before CEL runs).
    pub fn new(driver: &str, device: &Device) -> Result<DeviceView, DeviceError> {
        let mut attributes = Vec::new();
        let mut conversion_error = None;
        for (name, attr) in device.attributes.iter().flatten() {
            match attribute_value(attr) {
                Ok(value) => {
                    let (domain, id) = split_qualified(name, driver);
                    insert(&mut attributes, domain, id, value);
                }
                Err(message) => {
                    if conversion_error.is_none() {
                        conversion_error = Some(format!("attribute {name}: {message}"));
                    }
                }
            }
        }
        let mut capacity = Vec::new();
        for (name, cap) in device.capacity.iter().flatten() {
            let quantity = Quantity::parse(&cap.value.0).map_err(|e| DeviceError::Capacity {
                name: name.clone(),
                message: e.to_string(),
            })?;
            let (domain, id) = split_qualified(name, driver);
            insert(
                &mut capacity,
                domain,
                id,
                Value::Quantity(Arc::new(quantity)),
            );
        }
        Ok(DeviceView {
            driver: Arc::from(driver),
            allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
            attributes: finish(attributes),
            capacity: finish(capacity),
            conversion_error,
            empty: Arc::new(MapValue::default()),
        })
    }

    pub(crate) fn domains(&self, of: super::value::DomainsOf) -> &[(Arc<str>, Arc<MapValue>)] {
        match of {
            super::value::DomainsOf::Attributes => &self.attributes,
            super::value::DomainsOf::Capacity => &self.capacity,
        }
    }

    /// The inner map of a domain, if the device has it.
    pub(crate) fn domain(
        &self,
        of: super::value::DomainsOf,
        domain: &str,
    ) -> Option<&Arc<MapValue>> {
        self.domains(of)
            .iter()
            .find(|(d, _)| &**d == domain)
            .map(|(_, m)| m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::DeviceCapacity;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
    use std::collections::BTreeMap;

    #[test]
    fn unqualified_names_go_to_the_driver_domain() {
        let mut attrs = BTreeMap::new();
        attrs.insert(
            "model".to_string(),
            DeviceAttribute {
                string: Some("H100".into()),
                ..Default::default()
            },
        );
        attrs.insert(
            "other.io/x".to_string(),
            DeviceAttribute {
                int: Some(3),
                ..Default::default()
            },
        );
        let mut caps = BTreeMap::new();
        caps.insert(
            "memory".to_string(),
            DeviceCapacity {
                value: K8sQuantity("80Gi".into()),
                ..Default::default()
            },
        );
        let device = Device {
            name: "gpu-0".into(),
            attributes: Some(attrs),
            capacity: Some(caps),
            ..Default::default()
        };
        let view = DeviceView::new("gpu.nvidia.com", &device).unwrap();
        assert!(
            view.domain(super::super::value::DomainsOf::Attributes, "gpu.nvidia.com")
                .unwrap()
                .get_str("model")
                .is_some()
        );
        assert!(
            view.domain(super::super::value::DomainsOf::Attributes, "other.io")
                .unwrap()
                .get_str("x")
                .is_some()
        );
        assert!(
            view.domain(super::super::value::DomainsOf::Capacity, "gpu.nvidia.com")
                .unwrap()
                .get_str("memory")
                .is_some()
        );
        assert!(view.conversion_error.is_none());
    }

    #[test]
    fn bad_versions_poison_the_device() {
        let mut attrs = BTreeMap::new();
        attrs.insert(
            "v".to_string(),
            DeviceAttribute {
                version: Some("1.0".into()),
                ..Default::default()
            },
        );
        let device = Device {
            name: "d".into(),
            attributes: Some(attrs),
            ..Default::default()
        };
        let view = DeviceView::new("x.io", &device).unwrap();
        assert_eq!(
            view.conversion_error.as_deref(),
            Some("attribute v: parse semantic version: No Major.Minor.Patch elements found")
        );
    }
}
