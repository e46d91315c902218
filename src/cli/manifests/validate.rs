//! The API server's create-time checks on claim and class specs and on object metadata
//! (k8s.io/kubernetes v1.37 `pkg/apis/resource/validation`, with the limits its declarative
//! validation adds): request names, one of `exactly` or `firstAvailable`, device class names,
//! allocation mode and count, selectors that compile in the API server's CEL environment within
//! its length and cost limits, tolerations, quantities, constraint/config references to
//! requests, opaque configs, list sizes, labels and annotations; and the name formats the other
//! checks share (`validate_slice`, `taint_rules`). Messages follow `field.Error`'s wording; the
//! first error found is returned. A list longer than its limit is reported before its items, as
//! the API server stops there.
//!
//! `e2e/upstream-tables.sh validation` holds these to Kubernetes' own validation tables and to
//! kube-apiserver's create path on randomly changed objects.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{LazyLock, Mutex};

use dra_cel::{CelError, CostFeatures, MAX_COST, MAX_EXPRESSION_LENGTH, names};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClassSpec, DeviceSelector, DeviceTaint, DeviceToleration,
    ExactDeviceRequest, OpaqueDeviceConfiguration, ResourceClaimSpec,
};

use super::convert::FieldError;

/// `DeviceRequestsMaxSize` (also the limit on a constraint's or config's request references).
const MAX_REQUESTS: usize = 32;
const MAX_CONSTRAINTS: usize = 32;
const MAX_CONFIGS: usize = 32;
const MAX_SELECTORS: usize = 32;
const MAX_SUBREQUESTS: usize = 8;
/// `OpaqueParametersMaxLength` (bytes of the parameters' JSON).
const MAX_PARAMETERS: usize = 10 * 1024;
/// `TotalAnnotationSizeLimitB`.
const MAX_ANNOTATIONS: usize = 256 * 1024;
/// What a taint's effect (and a toleration's) may be.
const TAINT_EFFECTS: &str = "\"NoExecute\", \"NoSchedule\", \"None\"";
/// `DriverNameMaxLength`.
const MAX_DRIVER_NAME: usize = 63;

/// The API server's feature gates its checks depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiGates {
    /// DRAConsumableCapacity: `device.allowMultipleAllocations` in selectors; a constraint
    /// without an attribute is reported on the constraint; devices' request policies.
    pub consumable_capacity: bool,
    /// DRAListTypeAttributes: attribute values are `dyn` in the CEL environment; list values.
    pub list_type_attributes: bool,
    /// DRANodeAllocatableResources: devices' `nodeAllocatableResources`.
    pub node_allocatable_resources: bool,
    /// DRAPartitionableDevicesType: slices' `partitionTypeAttribute`.
    pub partitionable_devices_type: bool,
    /// DRAOptionalNodeOperations: slices' `skipNodeOperations`.
    pub optional_node_operations: bool,
    /// DRAFractionalCapacityRange: request policies' options told apart as decimals.
    pub fractional_capacity_range: bool,
}

impl Default for ApiGates {
    /// Kubernetes 1.37's defaults.
    fn default() -> Self {
        ApiGates {
            consumable_capacity: true,
            list_type_attributes: false,
            node_allocatable_resources: false,
            partitionable_devices_type: false,
            optional_node_operations: false,
            fractional_capacity_range: false,
        }
    }
}

impl ApiGates {
    /// From `--feature-gates` (kube-scheduler's syntax, taken as the cluster's) over 1.37's
    /// defaults.
    pub fn parse(spec: &str) -> Result<Self, dra_allocator::gates::GateError> {
        let enabled = dra_allocator::gates::parse(spec)?;
        let on = |name: &str| enabled.get(name).copied().unwrap_or(false);
        Ok(ApiGates {
            consumable_capacity: on("DRAConsumableCapacity"),
            list_type_attributes: on("DRAListTypeAttributes"),
            node_allocatable_resources: on("DRANodeAllocatableResources"),
            partitionable_devices_type: on("DRAPartitionableDevicesType"),
            optional_node_operations: on("DRAOptionalNodeOperations"),
            fractional_capacity_range: on("DRAFractionalCapacityRange"),
        })
    }
}

/// Checks a claim spec found at `path` (`spec`, or `spec.spec` in a template).
pub fn claim_spec(
    spec: Option<&ResourceClaimSpec>,
    path: &str,
    gates: ApiGates,
) -> Result<(), FieldError> {
    match spec.and_then(|s| s.devices.as_ref()) {
        Some(devices) => device_claim(devices, &format!("{path}.devices"), gates),
        None => Ok(()),
    }
}

/// `Too many` for a list longer than `max`.
pub fn at_most<T>(list: Option<&[T]>, max: usize, at: &str) -> Result<(), FieldError> {
    let n = list.map_or(0, <[T]>::len);
    if n > max {
        return Err(FieldError::new(
            at,
            format!("Too many: {n}: must have at most {max} items"),
        ));
    }
    Ok(())
}

fn device_claim(claim: &DeviceClaim, path: &str, gates: ApiGates) -> Result<(), FieldError> {
    let requests = claim.requests.as_deref().unwrap_or_default();
    at_most(Some(requests), MAX_REQUESTS, &format!("{path}.requests"))?;
    at_most(
        claim.constraints.as_deref(),
        MAX_CONSTRAINTS,
        &format!("{path}.constraints"),
    )?;
    at_most(
        claim.config.as_deref(),
        MAX_CONFIGS,
        &format!("{path}.config"),
    )?;
    let mut names = BTreeSet::new();
    // `request` and `request/subrequest`, the names constraints and config may use.
    let mut references = BTreeSet::new();
    for (i, request) in requests.iter().enumerate() {
        let at = format!("{path}.requests[{i}]");
        dns_label(&request.name, &format!("{at}.name"))?;
        if !names.insert(request.name.as_str()) {
            return Err(FieldError::new(
                at,
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
                    "Invalid value: null: exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
                ));
            }
            (Some(exactly), true) => exact_request(exactly, &format!("{at}.exactly"), gates)?,
            (None, false) => {
                at_most(Some(subs), MAX_SUBREQUESTS, &format!("{at}.firstAvailable"))?;
                let mut sub_names = BTreeSet::new();
                for (j, sub) in subs.iter().enumerate() {
                    let at = format!("{at}.firstAvailable[{j}]");
                    dns_label(&sub.name, &format!("{at}.name"))?;
                    if !sub_names.insert(sub.name.as_str()) {
                        return Err(FieldError::new(
                            at,
                            format!("Duplicate value: {:?}", sub.name),
                        ));
                    }
                    references.insert(format!("{}/{}", request.name, sub.name));
                    class_name(&sub.device_class_name, &format!("{at}.deviceClassName"))?;
                    selectors(sub.selectors.as_deref(), &format!("{at}.selectors"), gates)?;
                    mode_and_count(sub.allocation_mode.as_deref(), sub.count, &at)?;
                    capacity_requests(sub.capacity.as_ref(), &at)?;
                    tolerations(sub.tolerations.as_deref(), &format!("{at}.tolerations"))?;
                }
            }
        }
    }
    for (i, constraint) in claim.constraints.iter().flatten().enumerate() {
        let at = format!("{path}.constraints[{i}]");
        request_refs(constraint.requests.as_deref(), &references, &at)?;
        let attribute = match (&constraint.match_attribute, &constraint.distinct_attribute) {
            (Some(name), _) => Some((name, "matchAttribute")),
            (None, Some(name)) => Some((name, "distinctAttribute")),
            (None, None) => None,
        };
        match attribute {
            Some((name, field)) => fully_qualified_name(name, &format!("{at}.{field}"))?,
            None if gates.consumable_capacity => {
                return Err(FieldError::new(
                    at,
                    "Required value: exactly one of \"matchAttribute\" or \"distinctAttribute\" is required, but multiple fields are set",
                ));
            }
            None => {
                return Err(FieldError::new(
                    format!("{at}.matchAttribute"),
                    "Required value",
                ));
            }
        }
    }
    for (i, config) in claim.config.iter().flatten().enumerate() {
        let at = format!("{path}.config[{i}]");
        request_refs(config.requests.as_deref(), &references, &at)?;
        opaque(config.opaque.as_ref(), &format!("{at}.opaque"))?;
    }
    Ok(())
}

fn exact_request(
    request: &ExactDeviceRequest,
    at: &str,
    gates: ApiGates,
) -> Result<(), FieldError> {
    class_name(&request.device_class_name, &format!("{at}.deviceClassName"))?;
    selectors(
        request.selectors.as_deref(),
        &format!("{at}.selectors"),
        gates,
    )?;
    mode_and_count(request.allocation_mode.as_deref(), request.count, at)?;
    capacity_requests(request.capacity.as_ref(), at)?;
    tolerations(request.tolerations.as_deref(), &format!("{at}.tolerations"))
}

/// A request's `capacity.requests`: quantities.
fn capacity_requests(
    capacity: Option<&k8s_openapi::api::resource::v1::CapacityRequirements>,
    at: &str,
) -> Result<(), FieldError> {
    for (name, q) in capacity
        .and_then(|c| c.requests.as_ref())
        .into_iter()
        .flatten()
    {
        quantity(q, &format!("{at}.capacity.requests[{name}]"))?;
    }
    Ok(())
}

fn request_refs(
    refs: Option<&[String]>,
    known: &BTreeSet<String>,
    at: &str,
) -> Result<(), FieldError> {
    let at = format!("{at}.requests");
    at_most(refs, MAX_REQUESTS, &at)?;
    let mut seen = BTreeSet::new();
    for (k, name) in refs.unwrap_or_default().iter().enumerate() {
        let field = format!("{at}[{k}]");
        let invalid = || {
            FieldError::new(
                &field,
                format!(
                    "Invalid value: {name:?}: must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"
                ),
            )
        };
        let segments: Vec<&str> = name.split('/').collect();
        if segments.len() > 2 {
            return Err(invalid());
        }
        for segment in segments {
            dns_label(segment, &field)?;
        }
        if !known.contains(name) {
            return Err(invalid());
        }
        if !seen.insert(name) {
            return Err(FieldError::new(field, format!("Duplicate value: {name:?}")));
        }
    }
    Ok(())
}

/// `validateDeviceToleration` (a request's tolerations have no limit on their number; a
/// device's taints do).
fn tolerations(list: Option<&[DeviceToleration]>, at: &str) -> Result<(), FieldError> {
    for (i, t) in list.unwrap_or_default().iter().enumerate() {
        let at = format!("{at}[{i}]");
        if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty()) {
            invalid_if(names::qualified_name(key), key, &format!("{at}.key"))?;
        }
        let value = t.value.as_deref().unwrap_or("");
        match t.operator.as_deref().unwrap_or("") {
            "Exists" if !value.is_empty() => {
                return Err(FieldError::new(
                    format!("{at}.value"),
                    format!("Invalid value: {value:?}: must be empty for operator `Exists`"),
                ));
            }
            "Exists" => {}
            "Equal" => invalid_if(names::label_value(value), value, &format!("{at}.value"))?,
            "" => return Err(FieldError::new(format!("{at}.operator"), "Required value")),
            other => {
                return Err(FieldError::new(
                    format!("{at}.operator"),
                    format!(
                        "Unsupported value: {other:?}: supported values: \"Equal\", \"Exists\""
                    ),
                ));
            }
        }
        match t.effect.as_deref().unwrap_or("") {
            "" | "NoSchedule" | "NoExecute" | "None" => {}
            other => {
                return Err(FieldError::new(
                    format!("{at}.effect"),
                    format!("Unsupported value: {other:?}: supported values: {TAINT_EFFECTS}"),
                ));
            }
        }
    }
    Ok(())
}

/// An opaque config: a driver name and parameters that are a JSON object within the limit.
fn opaque(config: Option<&OpaqueDeviceConfiguration>, at: &str) -> Result<(), FieldError> {
    let Some(config) = config else {
        return Err(FieldError::new(at, "Required value"));
    };
    driver_name(&config.driver, &format!("{at}.driver"))?;
    let at = format!("{at}.parameters");
    let parameters = &config.parameters.0;
    if parameters.is_null() {
        return Err(FieldError::new(at, "Required value"));
    }
    // kubectl sends parameters as compact JSON; that is what the limit measures.
    let length = serde_json::to_string(parameters).map_or(0, |s| s.len());
    if length > MAX_PARAMETERS {
        return Err(FieldError::new(
            at,
            format!("Too long: may not be more than {MAX_PARAMETERS} bytes"),
        ));
    }
    if !parameters.is_object() {
        return Err(FieldError::new(
            at,
            "Invalid value: \"<value omitted>\": must be a valid JSON object",
        ));
    }
    Ok(())
}

/// `ValidateCSIDriverName`, which DRA driver names share.
pub fn driver_name(name: &str, at: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(at, "Required value"));
    }
    if name.len() > MAX_DRIVER_NAME {
        return Err(FieldError::new(
            at,
            format!("Too long: may not be more than {MAX_DRIVER_NAME} bytes"),
        ));
    }
    invalid_if(names::dns1123_subdomain(&name.to_lowercase()), name, at)
}

/// A `matchAttribute`/`distinctAttribute`: `<domain>/<C identifier>`.
fn fully_qualified_name(name: &str, at: &str) -> Result<(), FieldError> {
    let invalid = |message: &str| {
        Err(FieldError::new(
            at,
            format!("Invalid value: {name:?}: {message}"),
        ))
    };
    // The API server lets names with more than one slash through (a known gap it keeps for
    // objects already stored).
    if name.matches('/').count() > 1 {
        return Ok(());
    }
    let Some((domain, id)) = name.split_once('/') else {
        return invalid("a fully qualified name must be a domain and a name separated by a slash");
    };
    if domain.is_empty() {
        return invalid("the domain must not be empty");
    }
    driver_name(domain, at)?;
    if id.is_empty() {
        return invalid("the name must not be empty");
    }
    if id.len() > 32 {
        return Err(FieldError::new(
            at,
            "Too long: may not be more than 32 bytes",
        ));
    }
    c_identifier(id, at)
}

/// `IsCIdentifier`: what the name part of attribute and capacity names must be.
pub fn c_identifier(id: &str, at: &str) -> Result<(), FieldError> {
    let valid = id.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(FieldError::new(
            at,
            format!(
                "Invalid value: {id:?}: a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')"
            ),
        ));
    }
    Ok(())
}

/// A quantity as the API server's decoder reads it (`resource.ParseQuantity`).
pub fn quantity(
    q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    at: &str,
) -> Result<(), FieldError> {
    match k8s_quantity::Quantity::parse(&q.0) {
        Ok(_) => Ok(()),
        Err(_) => Err(FieldError::new(
            at,
            format!(
                "Invalid value: {:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                q.0
            ),
        )),
    }
}

/// The first of a format's messages, as `Invalid value`.
pub fn invalid_if(messages: Vec<String>, value: &str, at: &str) -> Result<(), FieldError> {
    match messages.into_iter().next() {
        Some(message) => Err(FieldError::new(
            at,
            format!("Invalid value: {value:?}: {message}"),
        )),
        None => Ok(()),
    }
}

/// Checks a DeviceClass spec.
pub fn class_spec(spec: Option<&DeviceClassSpec>, gates: ApiGates) -> Result<(), FieldError> {
    let Some(spec) = spec else { return Ok(()) };
    at_most(spec.selectors.as_deref(), MAX_SELECTORS, "spec.selectors")?;
    selectors(spec.selectors.as_deref(), "spec.selectors", gates)?;
    at_most(spec.config.as_deref(), MAX_CONFIGS, "spec.config")?;
    for (i, config) in spec.config.iter().flatten().enumerate() {
        opaque(config.opaque.as_ref(), &format!("spec.config[{i}].opaque"))?;
    }
    if let Some(name) = &spec.extended_resource_name
        && !is_extended_resource_name(name)
    {
        return Err(FieldError::new(
            "spec.extendedResourceName",
            format!("Invalid value: {name:?}: must be a valid extended resource name"),
        ));
    }
    Ok(())
}

/// `IsExtendedResourceName`: a domain-prefixed name outside `kubernetes.io`, which is still a
/// qualified name as a quota's `requests.<name>`.
fn is_extended_resource_name(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    !native
        && !name.starts_with("requests.")
        && names::qualified_name(&format!("requests.{name}")).is_empty()
}

/// Labels and annotations (`metadata.labels`, `metadata.annotations` under `at`).
pub fn labels_and_annotations(
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
    at: &str,
) -> Result<(), FieldError> {
    let labels_at = format!("{at}.labels");
    for (key, value) in labels.into_iter().flatten() {
        invalid_if(names::qualified_name(key), key, &labels_at)?;
        invalid_if(names::label_value(value), value, &labels_at)?;
    }
    let annotations_at = format!("{at}.annotations");
    let mut size = 0;
    for (key, value) in annotations.into_iter().flatten() {
        // Case does not matter in annotation keys.
        invalid_if(
            names::qualified_name(&key.to_lowercase()),
            key,
            &annotations_at,
        )?;
        size += key.len() + value.len();
    }
    if size > MAX_ANNOTATIONS {
        return Err(FieldError::new(
            annotations_at,
            format!("Too long: may not be more than {MAX_ANNOTATIONS} bytes"),
        ));
    }
    Ok(())
}

/// Selectors as the API server compiles them on create: its environment (attribute values are
/// `any` without DRAListTypeAttributes), the length limit and the estimated cost limit.
fn selectors(
    selectors: Option<&[DeviceSelector]>,
    at: &str,
    gates: ApiGates,
) -> Result<(), FieldError> {
    at_most(selectors, MAX_SELECTORS, at)?;
    for (i, selector) in selectors.unwrap_or_default().iter().enumerate() {
        let Some(expression) = selector.cel.as_ref().map(|c| c.expression.as_str()) else {
            return Err(FieldError::new(format!("{at}[{i}].cel"), "Required value"));
        };
        let field = format!("{at}[{i}].cel.expression");
        if expression.is_empty() {
            return Err(FieldError::new(field, "Required value"));
        }
        if expression.len() > MAX_EXPRESSION_LENGTH {
            return Err(FieldError::new(
                field,
                format!("Too long: may not be more than {MAX_EXPRESSION_LENGTH} bytes"),
            ));
        }
        let features = CostFeatures {
            list_type_attributes: gates.list_type_attributes,
            consumable_capacity: gates.consumable_capacity,
        };
        match selector_cost(expression, features) {
            Err(CelError::Compile(message) | CelError::Runtime(message)) => {
                let first = message.lines().next().unwrap_or("");
                return Err(FieldError::new(field, format!("does not compile: {first}")));
            }
            Ok(cost) if cost > MAX_COST => {
                return Err(FieldError::new(
                    field,
                    "Forbidden: too complex, exceeds cost limit",
                ));
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// [`dra_cel::estimate_cost_with`], once per expression and gates in this process: inputs often
/// repeat a selector in many claims, and estimating is the costly part of these checks.
fn selector_cost(expression: &str, features: CostFeatures) -> Result<u64, CelError> {
    type Estimates = HashMap<(String, CostFeatures), Result<u64, CelError>>;
    static ESTIMATES: LazyLock<Mutex<Estimates>> = LazyLock::new(Mutex::default);
    let key = (expression.to_string(), features);
    if let Some(known) = ESTIMATES.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return known;
    }
    let estimate = dra_cel::estimate_cost_with(expression, features);
    if let Ok(mut known) = ESTIMATES.lock() {
        known.insert(key, estimate.clone());
    }
    estimate
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

/// RFC 1123 label: what request and device names must be.
pub fn dns_label(name: &str, at: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(at, "Required value"));
    }
    invalid_if(names::dns1123_label(name), name, at)
}

/// `validatePoolName`: at most 253 bytes, RFC 1123 subdomains separated by `/`.
pub fn pool_name(name: &str, at: &str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err(FieldError::new(at, "Required value"));
    }
    if name.len() > 253 {
        return Err(FieldError::new(
            at,
            "Too long: may not be more than 253 bytes",
        ));
    }
    name.split('/').try_for_each(|part| dns_subdomain(part, at))
}

/// `validateDeviceTaint` on create: a label key, a label value, a known effect.
pub fn taint(taint: &DeviceTaint, at: &str) -> Result<(), FieldError> {
    let key_at = format!("{at}.key");
    if taint.key.is_empty() {
        return Err(FieldError::new(key_at, "Required value"));
    }
    invalid_if(names::qualified_name(&taint.key), &taint.key, &key_at)?;
    if let Some(value) = taint.value.as_deref().filter(|v| !v.is_empty()) {
        invalid_if(names::label_value(value), value, &format!("{at}.value"))?;
    }
    match taint.effect.as_str() {
        "" => Err(FieldError::new(format!("{at}.effect"), "Required value")),
        "NoSchedule" | "NoExecute" | "None" => Ok(()),
        other => Err(FieldError::new(
            format!("{at}.effect"),
            format!("Unsupported value: {other:?}: supported values: {TAINT_EFFECTS}"),
        )),
    }
}

/// RFC 1123 subdomain: what object names (and device class names) must be.
pub fn dns_subdomain(name: &str, at: &str) -> Result<(), FieldError> {
    invalid_if(names::dns1123_subdomain(name), name, at)
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
        claim_spec(Some(&spec(requests)), "spec", ApiGates::default())
    }

    #[test]
    fn extended_resource_names_as_the_api_server_checks_them() {
        for good in ["example.com/gpu", "nvidia.com/gpu"] {
            assert!(is_extended_resource_name(good), "{good}");
        }
        for bad in [
            "example.com",
            "kubernetes.io/gpu",
            "requests.example.com/gpu",
            "example.com/a/b",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }

    #[test]
    fn metadata_labels_and_annotations_are_checked() {
        let map = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(labels_and_annotations(Some(&map("a/b", "c")), Some(&map("X/Y", "")), "m").is_ok());
        let err = labels_and_annotations(Some(&map("a", "spaces not allowed")), None, "metadata")
            .unwrap_err();
        assert_eq!(err.field, "metadata.labels");
        let err = labels_and_annotations(None, Some(&map("!@#", "")), "metadata").unwrap_err();
        assert_eq!(err.field, "metadata.annotations");
        let big = map("a", &"x".repeat(MAX_ANNOTATIONS));
        let err = labels_and_annotations(None, Some(&big), "metadata").unwrap_err();
        assert!(err.message.starts_with("Too long"), "{err:?}");
    }

    #[test]
    fn opaque_parameters_limit_counts_compact_json() {
        let config = |parameters: serde_json::Value| OpaqueDeviceConfiguration {
            driver: "gpu.nvidia.com".into(),
            parameters: k8s_openapi::apimachinery::pkg::runtime::RawExtension(parameters),
        };
        // {"s":"..."} is 8 bytes around the string.
        let at_limit = json!({"s": "x".repeat(MAX_PARAMETERS - 8)});
        assert!(opaque(Some(&config(at_limit)), "c").is_ok());
        let over = json!({"s": "x".repeat(MAX_PARAMETERS - 7)});
        assert!(
            opaque(Some(&config(over)), "c")
                .unwrap_err()
                .message
                .starts_with("Too long")
        );
        let err = opaque(Some(&config(json!("text"))), "c").unwrap_err();
        assert_eq!(err.field, "c.parameters");
        let err = opaque(Some(&config(json!(null))), "c").unwrap_err();
        assert_eq!(err.message, "Required value");
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
