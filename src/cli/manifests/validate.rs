//! The API server's create-time checks on claim and class specs that matter for allocation
//! (k8s.io/kubernetes v1.37 `pkg/apis/resource/validation`): request names, one of `exactly` or
//! `firstAvailable`, device class names, allocation mode and count, selectors that compile,
//! and constraint/config references to requests. Messages follow `field.Error`'s wording.
use std::collections::BTreeSet;

use dra_cel::{CelError, SelectorCache};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClassSpec, DeviceSelector, ExactDeviceRequest, ResourceClaimSpec,
};

use super::convert::FieldError;

/// Checks a claim spec found at `path` (`spec`, or `spec.spec` in a template).
pub fn claim_spec(
    spec: Option<&ResourceClaimSpec>,
    path: &str,
    cel: &SelectorCache,
) -> Result<(), FieldError> {
    match spec.and_then(|s| s.devices.as_ref()) {
        Some(devices) => device_claim(devices, &format!("{path}.devices"), cel),
        None => Ok(()),
    }
}

fn device_claim(claim: &DeviceClaim, path: &str, cel: &SelectorCache) -> Result<(), FieldError> {
    let requests = claim.requests.as_deref().unwrap_or_default();
    let mut names = BTreeSet::new();
    // `request` and `request/subrequest`, the names constraints and config may use.
    let mut references = BTreeSet::new();
    for (i, request) in requests.iter().enumerate() {
        let at = format!("{path}.requests[{i}]");
        dns_label(&request.name, &format!("{at}.name"))?;
        if !names.insert(request.name.as_str()) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!("Duplicate value: {:?}", request.name),
            ));
        }
        references.insert(request.name.clone());
        let subs = request.first_available.as_deref().unwrap_or_default();
        match (&request.exactly, subs.is_empty()) {
            (None, true) => {
                return Err(FieldError::new(
                    at,
                    "Required value: exactly one of `exactly` or `firstAvailable` is required",
                ));
            }
            (Some(_), false) => {
                return Err(FieldError::new(
                    at,
                    "Invalid value: exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
                ));
            }
            (Some(exactly), true) => exact_request(exactly, &format!("{at}.exactly"), cel)?,
            (None, false) => {
                let mut sub_names = BTreeSet::new();
                for (j, sub) in subs.iter().enumerate() {
                    let at = format!("{at}.firstAvailable[{j}]");
                    dns_label(&sub.name, &format!("{at}.name"))?;
                    if !sub_names.insert(sub.name.as_str()) {
                        return Err(FieldError::new(
                            format!("{at}.name"),
                            format!("Duplicate value: {:?}", sub.name),
                        ));
                    }
                    references.insert(format!("{}/{}", request.name, sub.name));
                    class_name(&sub.device_class_name, &format!("{at}.deviceClassName"))?;
                    selectors(sub.selectors.as_deref(), &format!("{at}.selectors"), cel)?;
                    mode_and_count(sub.allocation_mode.as_deref(), sub.count, &at)?;
                }
            }
        }
    }
    for (i, constraint) in claim.constraints.iter().flatten().enumerate() {
        let at = format!("{path}.constraints[{i}]");
        request_refs(constraint.requests.as_deref(), &references, &at)?;
        if constraint.match_attribute.is_none() && constraint.distinct_attribute.is_none() {
            return Err(FieldError::new(
                at,
                "Required value: exactly one of \"matchAttribute\" or \"distinctAttribute\" is required",
            ));
        }
    }
    for (i, config) in claim.config.iter().flatten().enumerate() {
        let at = format!("{path}.config[{i}]");
        request_refs(config.requests.as_deref(), &references, &at)?;
        if config.opaque.is_none() {
            return Err(FieldError::new(format!("{at}.opaque"), "Required value"));
        }
    }
    Ok(())
}

fn exact_request(
    request: &ExactDeviceRequest,
    at: &str,
    cel: &SelectorCache,
) -> Result<(), FieldError> {
    class_name(&request.device_class_name, &format!("{at}.deviceClassName"))?;
    selectors(
        request.selectors.as_deref(),
        &format!("{at}.selectors"),
        cel,
    )?;
    mode_and_count(request.allocation_mode.as_deref(), request.count, at)
}

fn request_refs(
    refs: Option<&[String]>,
    known: &BTreeSet<String>,
    at: &str,
) -> Result<(), FieldError> {
    for (k, name) in refs.unwrap_or_default().iter().enumerate() {
        if !known.contains(name) {
            return Err(FieldError::new(
                format!("{at}.requests[{k}]"),
                format!(
                    "Invalid value: {name:?}: must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks a DeviceClass spec.
pub fn class_spec(spec: Option<&DeviceClassSpec>, cel: &SelectorCache) -> Result<(), FieldError> {
    let Some(spec) = spec else { return Ok(()) };
    selectors(spec.selectors.as_deref(), "spec.selectors", cel)?;
    for (i, config) in spec.config.iter().flatten().enumerate() {
        if config.opaque.is_none() {
            return Err(FieldError::new(
                format!("spec.config[{i}].opaque"),
                "Required value",
            ));
        }
    }
    Ok(())
}

fn selectors(
    selectors: Option<&[DeviceSelector]>,
    at: &str,
    cel: &SelectorCache,
) -> Result<(), FieldError> {
    for (i, selector) in selectors.unwrap_or_default().iter().enumerate() {
        let Some(expression) = selector.cel.as_ref().map(|c| c.expression.as_str()) else {
            return Err(FieldError::new(format!("{at}[{i}].cel"), "Required value"));
        };
        let field = format!("{at}[{i}].cel.expression");
        if expression.is_empty() {
            return Err(FieldError::new(field, "Required value"));
        }
        // The API server compiles selectors when a claim or class is created.
        if let Err(CelError::Compile(message) | CelError::Runtime(message)) =
            &*cel.get_or_compile(expression)
        {
            let first = message.lines().next().unwrap_or("");
            return Err(FieldError::new(field, format!("does not compile: {first}")));
        }
    }
    Ok(())
}

fn mode_and_count(mode: Option<&str>, count: Option<i64>, at: &str) -> Result<(), FieldError> {
    let count = count.unwrap_or(0);
    match mode.unwrap_or("") {
        "All" if count != 0 => Err(FieldError::new(
            format!("{at}.count"),
            format!("Invalid value: {count}: must not be specified when allocationMode is 'All'"),
        )),
        "All" => Ok(()),
        "ExactCount" if count <= 0 => Err(FieldError::new(
            format!("{at}.count"),
            format!("Invalid value: {count}: must be greater than zero"),
        )),
        "ExactCount" => Ok(()),
        other => Err(FieldError::new(
            format!("{at}.allocationMode"),
            format!("Unsupported value: {other:?}: supported values: \"All\", \"ExactCount\""),
        )),
    }
}

fn class_name(name: &str, at: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(at, "Required value"));
    }
    dns_subdomain(name, at)
}

/// RFC 1123 label: what request names must be.
fn dns_label(name: &str, at: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(at, "Required value"));
    }
    if name.len() > 63 || !label_chars(name) {
        return Err(FieldError::new(
            at,
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
            ),
        ));
    }
    Ok(())
}

fn label_chars(label: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !label.is_empty()
        && label.chars().all(|c| alnum(c) || c == '-')
        && label.starts_with(alnum)
        && label.ends_with(alnum)
}

/// RFC 1123 subdomain: what object names (and device class names) must be.
pub fn dns_subdomain(name: &str, at: &str) -> Result<(), FieldError> {
    if name.len() > 253 || !name.split('.').all(label_chars) {
        return Err(FieldError::new(
            at,
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(requests: serde_json::Value) -> ResourceClaimSpec {
        let mut spec: ResourceClaimSpec =
            serde_json::from_value(json!({"devices": {"requests": requests}})).unwrap();
        super::super::convert::default_claim_spec(&mut spec);
        spec
    }

    fn check(requests: serde_json::Value) -> Result<(), FieldError> {
        claim_spec(Some(&spec(requests)), "spec", &SelectorCache::new())
    }

    #[test]
    fn valid_requests_pass() {
        check(
            json!([{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}]),
        )
        .unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let err = check(json!([{"name": "gpu", "exactly": {"deviceClassName": "c", "count": -1}}]))
            .unwrap_err();
        assert_eq!(err.field, "spec.devices.requests[0].exactly.count");
        let err = check(json!([{"name": "gpu"}])).unwrap_err();
        assert_eq!(err.field, "spec.devices.requests[0]");
        let err = check(json!([{"name": "GPU", "exactly": {"deviceClassName": "c"}}])).unwrap_err();
        assert_eq!(err.field, "spec.devices.requests[0].name");
        let err = check(json!([{"name": "gpu", "exactly": {"deviceClassName": "c",
            "selectors": [{"cel": {"expression": "device.driver =="}}]}}]))
        .unwrap_err();
        assert_eq!(
            err.field,
            "spec.devices.requests[0].exactly.selectors[0].cel.expression"
        );
        assert!(err.message.starts_with("does not compile: "), "{err:?}");
        assert!(!err.message.contains('\n'));
        let err = check(json!([{"name": "gpu", "firstAvailable": [
            {"name": "a", "deviceClassName": "c", "allocationMode": "Some"}]}]))
        .unwrap_err();
        assert_eq!(
            err.field,
            "spec.devices.requests[0].firstAvailable[0].allocationMode"
        );
    }
}
