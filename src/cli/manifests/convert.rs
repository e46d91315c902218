//! resource.k8s.io objects in any version the API server serves (v1beta1, v1beta2, v1) turned
//! into the v1 object the API server would store and return, following k8s.io/kubernetes v1.37
//! `pkg/apis/resource/{v1beta1,v1beta2,v1}` (conversion.go, defaults.go, zz_generated.*):
//!
//! 1. strict decoding in the object's own version: an unknown field is an error, as with
//!    `kubectl apply` (server-side strict field validation);
//! 2. that version's defaults (v1beta1 only differs: it defaults a request's allocation mode and
//!    count only when the request names a device class);
//! 3. conversion: v1beta2 and v1 have the same fields; v1beta1 keeps the exact-request fields
//!    inline in the request (`exactly` in v1) and wraps slice devices in `basic`, and has a plain
//!    string/bool `nodeName`/`allNodes` in slice specs (pointers in v1);
//! 4. v1's defaults (allocation mode `ExactCount`, count 1, toleration operator `Equal`), which
//!    the API server applies when it reads the stored object.
//!
//! Not reproduced: the `timeAdded` the API server stamps on device taints without one (the
//! current time, which allocation does not look at).
use k8s_openapi::api::resource::{v1, v1beta1, v1beta2};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub const GROUP: &str = "resource.k8s.io";

/// A version of resource.k8s.io that holds claims, templates, classes and slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1beta1,
    V1beta2,
    V1,
}

impl Version {
    /// From an `apiVersion` (`resource.k8s.io/v1beta1`, ...); `None` for anything else.
    pub fn parse(api_version: &str) -> Option<Self> {
        match api_version.strip_prefix("resource.k8s.io/")? {
            "v1beta1" => Some(Self::V1beta1),
            "v1beta2" => Some(Self::V1beta2),
            "v1" => Some(Self::V1),
            _ => None,
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1beta1 => "resource.k8s.io/v1beta1",
            Self::V1beta2 => "resource.k8s.io/v1beta2",
            Self::V1 => "resource.k8s.io/v1",
        }
    }
}

/// The resource.k8s.io kinds this module converts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ResourceClaim,
    ResourceClaimTemplate,
    DeviceClass,
    ResourceSlice,
}

impl Kind {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "ResourceClaim" => Some(Self::ResourceClaim),
            "ResourceClaimTemplate" => Some(Self::ResourceClaimTemplate),
            "DeviceClass" => Some(Self::DeviceClass),
            "ResourceSlice" => Some(Self::ResourceSlice),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::ResourceClaim => "ResourceClaim",
            Self::ResourceClaimTemplate => "ResourceClaimTemplate",
            Self::DeviceClass => "DeviceClass",
            Self::ResourceSlice => "ResourceSlice",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(self, Self::ResourceClaim | Self::ResourceClaimTemplate)
    }
}

/// A problem at one field of one object (`spec.devices.requests[0].exactly.count`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path as the API server writes it; empty for the whole object.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// One converted object.
#[derive(Debug, Clone)]
pub enum V1Object {
    Claim(Box<v1::ResourceClaim>),
    Template(Box<v1::ResourceClaimTemplate>),
    Class(Box<v1::DeviceClass>),
    Slice(Box<v1::ResourceSlice>),
}

/// Decodes `doc` (a `kind` object of `version`) and returns it as the v1 object the API server
/// would return, defaults applied.
pub fn to_v1(kind: Kind, version: Version, doc: &Value) -> Result<V1Object, FieldError> {
    Ok(match kind {
        Kind::ResourceClaim => {
            let mut claim: v1::ResourceClaim = match version {
                Version::V1 => decode(doc)?,
                Version::V1beta2 => relabel::<v1beta2::ResourceClaim, _>(doc, |_| {})?,
                Version::V1beta1 => relabel::<v1beta1::ResourceClaim, _>(doc, |json| {
                    if let Some(requests) = requests_mut(json, &["spec", "devices", "requests"]) {
                        requests.iter_mut().for_each(v1beta1_request_to_v1);
                    }
                })?,
            };
            if let Some(spec) = &mut claim.spec {
                default_claim_spec(spec);
            }
            default_claim_status(claim.status.as_mut());
            V1Object::Claim(Box::new(claim))
        }
        Kind::ResourceClaimTemplate => {
            let mut template: v1::ResourceClaimTemplate = match version {
                Version::V1 => decode(doc)?,
                Version::V1beta2 => relabel::<v1beta2::ResourceClaimTemplate, _>(doc, |_| {})?,
                Version::V1beta1 => relabel::<v1beta1::ResourceClaimTemplate, _>(doc, |json| {
                    if let Some(requests) =
                        requests_mut(json, &["spec", "spec", "devices", "requests"])
                    {
                        requests.iter_mut().for_each(v1beta1_request_to_v1);
                    }
                })?,
            };
            if let Some(spec) = template.spec.as_mut() {
                // The embedded ObjectMeta is a struct in Go: the API server returns `{}`.
                spec.metadata.get_or_insert_with(Default::default);
                if let Some(claim_spec) = spec.spec.as_mut() {
                    default_claim_spec(claim_spec);
                }
            }
            V1Object::Template(Box::new(template))
        }
        // DeviceClass has the same fields in all three versions and no defaults.
        Kind::DeviceClass => V1Object::Class(Box::new(match version {
            Version::V1 => decode(doc)?,
            Version::V1beta2 => relabel::<v1beta2::DeviceClass, _>(doc, |_| {})?,
            Version::V1beta1 => relabel::<v1beta1::DeviceClass, _>(doc, |_| {})?,
        })),
        Kind::ResourceSlice => V1Object::Slice(Box::new({
            let filled = with_omitted_slice_values(doc);
            let doc = filled.as_ref().unwrap_or(doc);
            match version {
                Version::V1 => decode(doc)?,
                Version::V1beta2 => relabel::<v1beta2::ResourceSlice, _>(doc, |_| {})?,
                Version::V1beta1 => relabel::<v1beta1::ResourceSlice, _>(doc, v1beta1_slice_to_v1)?,
            }
        })),
    })
}

/// Decodes `doc` strictly as `S` (an older version), applies `convert` to its canonical JSON,
/// and decodes the result as the v1 type `T`.
fn relabel<S, T>(doc: &Value, convert: impl FnOnce(&mut Value)) -> Result<T, FieldError>
where
    S: DeserializeOwned + Serialize,
    T: DeserializeOwned + Serialize + k8s_openapi::Resource,
{
    let (_, mut json) = decode_canonical::<S>(doc)?;
    convert(&mut json);
    if let Value::Object(map) = &mut json {
        map.insert("apiVersion".into(), Value::from(T::API_VERSION));
    }
    decode::<T>(&json)
}

fn requests_mut<'a>(json: &'a mut Value, path: &[&str]) -> Option<&'a mut Vec<Value>> {
    let mut at = json;
    for key in path {
        at = at.get_mut(*key)?;
    }
    at.as_array_mut()
}

/// The fields of a v1beta1 `DeviceRequest` that v1 moved into `exactly`.
const EXACT_FIELDS: [&str; 8] = [
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
    "derivedAttributes",
];

fn str_field<'a>(map: &'a Map<String, Value>, key: &str) -> &'a str {
    map.get(key).and_then(Value::as_str).unwrap_or("")
}

fn int_field(map: &Map<String, Value>, key: &str) -> i64 {
    map.get(key).and_then(Value::as_i64).unwrap_or(0)
}

/// `SetDefaults_DeviceSubRequest` / `SetDefaults_ExactDeviceRequest`: mode `ExactCount`,
/// count 1 when exact and unset.
fn default_mode_and_count(map: &mut Map<String, Value>) {
    if str_field(map, "allocationMode").is_empty() {
        map.insert("allocationMode".into(), Value::from("ExactCount"));
    }
    if str_field(map, "allocationMode") == "ExactCount" && int_field(map, "count") == 0 {
        map.insert("count".into(), Value::from(1));
    }
}

/// The generated defaulter's toleration rule: operator `Equal` when empty.
fn default_tolerations_json(map: &mut Map<String, Value>) {
    for toleration in map
        .get_mut("tolerations")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Value::Object(t) = toleration
            && str_field(t, "operator").is_empty()
        {
            t.insert("operator".into(), Value::from("Equal"));
        }
    }
}

/// v1beta1 defaults for one request, then `Convert_v1beta1_DeviceRequest_To_resource_DeviceRequest`.
fn v1beta1_request_to_v1(request: &mut Value) {
    let Value::Object(req) = request else { return };
    // SetDefaults_DeviceRequest: a request without a class uses firstAvailable, and defaulting
    // its mode would make it invalid.
    if !str_field(req, "deviceClassName").is_empty() {
        default_mode_and_count(req);
    }
    default_tolerations_json(req);
    for sub in req
        .get_mut("firstAvailable")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Value::Object(sub) = sub {
            default_mode_and_count(sub);
            default_tolerations_json(sub);
        }
    }
    // hasAnyMainRequestFieldsSet: strings and counts count when non-zero, lists and pointers
    // when present (an empty `selectors: []` is set).
    let any_set = !str_field(req, "deviceClassName").is_empty()
        || req.contains_key("selectors")
        || !str_field(req, "allocationMode").is_empty()
        || int_field(req, "count") != 0
        || req.contains_key("adminAccess")
        || req.contains_key("tolerations")
        || req.contains_key("capacity")
        || req.contains_key("derivedAttributes");
    let mut exactly = Map::new();
    for key in EXACT_FIELDS {
        if let Some(value) = req.remove(key) {
            exactly.insert(key.to_string(), value);
        }
    }
    if !any_set {
        return;
    }
    // Zero values the Go structs leave out (omitempty): an empty mode, a zero count, and the
    // tolerations list the conversion rebuilds by appending (empty stays nil).
    if str_field(&exactly, "allocationMode").is_empty() {
        exactly.remove("allocationMode");
    }
    if int_field(&exactly, "count") == 0 {
        exactly.remove("count");
    }
    if exactly
        .get("tolerations")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        exactly.remove("tolerations");
    }
    exactly
        .entry("deviceClassName")
        .or_insert_with(|| Value::from(""));
    req.insert("exactly".into(), Value::Object(exactly));
}

/// `Convert_v1beta1_ResourceSliceSpec_To_resource_ResourceSliceSpec` and
/// `Convert_v1beta1_Device_To_resource_Device`.
fn v1beta1_slice_to_v1(json: &mut Value) {
    let Some(Value::Object(spec)) = json.get_mut("spec") else {
        return;
    };
    if str_field(spec, "nodeName").is_empty() {
        spec.remove("nodeName");
    }
    if spec.get("allNodes").and_then(Value::as_bool) != Some(true) {
        spec.remove("allNodes");
    }
    for device in spec
        .get_mut("devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let Value::Object(device) = device else {
            continue;
        };
        let Some(Value::Object(basic)) = device.remove("basic") else {
            continue;
        };
        for (key, value) in basic {
            // Empty attribute and capacity maps are not copied (`len(...) > 0`).
            let empty_map = value.as_object().is_some_and(Map::is_empty);
            if empty_map && (key == "attributes" || key == "capacity") {
                continue;
            }
            device.insert(key, value);
        }
    }
}

fn default_mode_and_count_typed(mode: &mut Option<String>, count: &mut Option<i64>) {
    if mode.as_deref().unwrap_or("").is_empty() {
        *mode = Some("ExactCount".into());
    }
    if mode.as_deref() == Some("ExactCount") && count.unwrap_or(0) == 0 {
        *count = Some(1);
    }
}

fn default_tolerations(tolerations: Option<&mut Vec<v1::DeviceToleration>>) {
    for t in tolerations.into_iter().flatten() {
        if t.operator.as_deref().unwrap_or("").is_empty() {
            t.operator = Some("Equal".into());
        }
    }
}

/// v1 `SetObjectDefaults_ResourceClaim` (spec part); templates get the same.
pub fn default_claim_spec(spec: &mut v1::ResourceClaimSpec) {
    let requests = spec
        .devices
        .as_mut()
        .and_then(|d| d.requests.as_mut())
        .into_iter()
        .flatten();
    for request in requests {
        if let Some(exactly) = &mut request.exactly {
            default_mode_and_count_typed(&mut exactly.allocation_mode, &mut exactly.count);
            default_tolerations(exactly.tolerations.as_mut());
        }
        for sub in request.first_available.iter_mut().flatten() {
            default_mode_and_count_typed(&mut sub.allocation_mode, &mut sub.count);
            default_tolerations(sub.tolerations.as_mut());
        }
    }
}

fn default_claim_status(status: Option<&mut v1::ResourceClaimStatus>) {
    let results = status
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
        .into_iter()
        .flatten();
    for result in results {
        default_tolerations(result.tolerations.as_mut());
    }
}

/// Drops what Go's `omitempty` leaves out of the API server's JSON and k8s-openapi keeps: empty
/// lists (all of them in these types, except a claim's `devices.requests` and a node selector's
/// `nodeSelectorTerms`) and empty `labels`/`annotations`. Empty structs stay (`metadata: {}`).
pub fn omit_empty(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let requests_kept = map.contains_key("requests") && is_device_claim(map);
            map.retain(|key, v| match v {
                Value::Array(items) if items.is_empty() => {
                    key == "nodeSelectorTerms" || (key == "requests" && requests_kept)
                }
                Value::Object(m) if m.is_empty() => key != "labels" && key != "annotations",
                _ => true,
            });
            map.values_mut().for_each(omit_empty);
        }
        Value::Array(items) => items.iter_mut().for_each(omit_empty),
        _ => {}
    }
}

/// A `DeviceClaim` (`requests`, `constraints`, `config`), whose `requests` has no omitempty.
fn is_device_claim(map: &Map<String, Value>) -> bool {
    map.keys()
        .all(|k| matches!(k.as_str(), "requests" | "constraints" | "config"))
        && map.get("requests").is_some_and(Value::is_array)
}

/// Decodes `doc` as `T`, strictly: a type error names its field, and so does a field `T` does
/// not have (one set to null is let through, as before). A null where `T` needs a value is read as
/// Go reads it (see [`with_go_zero_values`]).
pub fn decode<T: DeserializeOwned>(doc: &Value) -> Result<T, FieldError> {
    let zeroed = with_go_zero_values::<T>(doc);
    let doc = zeroed.as_ref().unwrap_or(doc);
    let mut unknown: Option<Vec<Step>> = None;
    // Straight from the tree, noting what `T` ignores; only a document that does not decode is
    // laid out line by line to name its field.
    let decoded = serde_ignored::deserialize(doc, |path| {
        if unknown.is_none() {
            let steps = steps_of(&path);
            if !at(doc, &steps).is_some_and(Value::is_null) {
                unknown = Some(steps);
            }
        }
    });
    let value: T = match decoded {
        Ok(value) => value,
        Err(_) => {
            let (text, paths) = located_text(doc);
            serde_json::from_str(&text).map_err(|e| serde_error(&e, &paths))?
        }
    };
    match unknown {
        Some(steps) => Err(FieldError::new(path_of(&steps), "unknown field")),
        None => Ok(value),
    }
}

/// Go's decoder reads `null` as the zero value of what is expected there (an empty struct, `""`,
/// 0, false, an empty list, quantity 0), so kube-apiserver validates a null list item as an empty
/// one. k8s-openapi refuses a null where it needs a value (a list item, a map's value): `doc`
/// with each such null replaced by that zero value, or `None` when nothing was replaced.
fn with_go_zero_values<T: DeserializeOwned>(doc: &Value) -> Option<Value> {
    let nulls = count_nulls(doc);
    if nulls == 0 {
        return None;
    }
    let mut zeroed = doc.clone();
    let mut changed = false;
    // Each round replaces the first null the decoder stops at.
    for _ in 0..nulls {
        let Err(error) = serde_path_to_error::deserialize::<_, T>(&zeroed) else {
            break;
        };
        let message = error.inner().to_string();
        let Some(expected) = message.strip_prefix("invalid type: null, expected ") else {
            break;
        };
        let zero = go_zero_value(expected);
        match slot_mut(&mut zeroed, error.path()) {
            Some(slot) if slot.is_null() => *slot = zero,
            _ => break,
        }
        changed = true;
    }
    changed.then_some(zeroed)
}

fn count_nulls(value: &Value) -> usize {
    match value {
        Value::Null => 1,
        Value::Array(items) => items.iter().map(count_nulls).sum(),
        Value::Object(map) => map.values().map(count_nulls).sum(),
        _ => 0,
    }
}

/// Go's zero value for what serde says it expected (`a string`, `i64`, `Quantity`, a struct's
/// name...).
fn go_zero_value(expected: &str) -> Value {
    match expected {
        "Quantity" => Value::from("0"),
        "a string" | "a character" => Value::from(""),
        "a boolean" => Value::from(false),
        "a sequence" => Value::Array(Vec::new()),
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" | "isize" | "usize" => {
            Value::from(0)
        }
        "f32" | "f64" => Value::from(0.0),
        // A struct (named by its type) or a map.
        _ => Value::Object(Map::new()),
    }
}

/// The value at a path serde_path_to_error reports.
fn slot_mut<'a>(doc: &'a mut Value, path: &serde_path_to_error::Path) -> Option<&'a mut Value> {
    path.iter().try_fold(doc, |value, segment| match segment {
        serde_path_to_error::Segment::Seq { index } => value.get_mut(*index),
        serde_path_to_error::Segment::Map { key } => value.get_mut(key.as_str()),
        _ => None,
    })
}

/// A device capacity's or counter's `value` is a plain `resource.Quantity` in Go: left out, or
/// null, kube-apiserver reads 0. k8s-openapi would read `""`, which the API server refuses when it
/// is written, so a ResourceSlice's omitted values are filled in before decoding: `doc` with them,
/// or `None` when none is omitted.
fn with_omitted_slice_values(doc: &Value) -> Option<Value> {
    /// Each entry of the map at `map` (a name → capacity or counter) gets `value: "0"` if it
    /// has none.
    fn fill(map: Option<&mut Value>, changed: &mut bool) {
        let Some(Value::Object(entries)) = map else {
            return;
        };
        for entry in entries.values_mut() {
            if let Value::Object(fields) = entry
                && fields.get("value").is_none_or(Value::is_null)
            {
                fields.insert("value".into(), Value::from("0"));
                *changed = true;
            }
        }
    }
    fn fill_counters(consumption: Option<&mut Value>, changed: &mut bool) {
        if let Some(Value::Array(items)) = consumption {
            for item in items {
                fill(item.get_mut("counters"), changed);
            }
        }
    }
    // Most slices omit nothing: look first, so that a fleet's slices are not all copied.
    if !omits_slice_values(doc) {
        return None;
    }
    let mut filled = doc.clone();
    let mut changed = false;
    let spec = filled.get_mut("spec");
    if let Some(spec) = spec {
        fill_counters(spec.get_mut("sharedCounters"), &mut changed);
        if let Some(Value::Array(devices)) = spec.get_mut("devices") {
            for device in devices {
                // v1beta1 keeps them under `basic`.
                let device = match device.get("basic") {
                    Some(Value::Object(_)) => device.get_mut("basic"),
                    _ => Some(device),
                };
                if let Some(device) = device {
                    fill(device.get_mut("capacity"), &mut changed);
                    fill_counters(device.get_mut("consumesCounters"), &mut changed);
                }
            }
        }
    }
    changed.then_some(filled)
}

/// Whether [`with_omitted_slice_values`] has anything to fill in `doc`.
fn omits_slice_values(doc: &Value) -> bool {
    fn omits(map: Option<&Value>) -> bool {
        let Some(Value::Object(entries)) = map else {
            return false;
        };
        entries.values().any(|entry| {
            matches!(entry, Value::Object(fields) if fields.get("value").is_none_or(Value::is_null))
        })
    }
    fn omits_counters(consumption: Option<&Value>) -> bool {
        matches!(consumption, Some(Value::Array(items)) if items.iter().any(|item| omits(item.get("counters"))))
    }
    let Some(spec) = doc.get("spec") else {
        return false;
    };
    if omits_counters(spec.get("sharedCounters")) {
        return true;
    }
    let Some(Value::Array(devices)) = spec.get("devices") else {
        return false;
    };
    devices.iter().any(|device| {
        let device = match device.get("basic") {
            Some(basic @ Value::Object(_)) => basic,
            _ => device,
        };
        omits(device.get("capacity")) || omits_counters(device.get("consumesCounters"))
    })
}

/// As [`decode`], with the value's canonical JSON (what an older version converts from).
pub fn decode_canonical<T: DeserializeOwned + Serialize>(
    doc: &Value,
) -> Result<(T, Value), FieldError> {
    let value: T = decode(doc)?;
    let canonical = serde_json::to_value(&value).map_err(|e| FieldError::new("", e.to_string()))?;
    Ok((value, canonical))
}

/// A serde error as a field error: the line serde stopped at names the field.
fn serde_error(e: &serde_json::Error, paths: &[String]) -> FieldError {
    let path = e
        .line()
        .checked_sub(1)
        .and_then(|l| paths.get(l))
        .cloned()
        .unwrap_or_default();
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full);
    // serde reports a missing field at the end of its object.
    if let Some(name) = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'))
    {
        return FieldError::new(child(&path, name), "Required value");
    }
    FieldError::new(path, message.to_string())
}

/// `doc` as JSON text with one scalar, key or bracket per line, and the field path of each line.
fn located_text(doc: &Value) -> (String, Vec<String>) {
    let mut lines = Vec::new();
    emit(doc, "", String::new(), true, &mut lines);
    let mut text = String::new();
    let mut paths = Vec::with_capacity(lines.len());
    for (line, path) in lines {
        text.push_str(&line);
        text.push('\n');
        paths.push(path);
    }
    (text, paths)
}

fn emit(v: &Value, path: &str, prefix: String, last: bool, out: &mut Vec<(String, String)>) {
    let comma = if last { "" } else { "," };
    match v {
        Value::Object(map) if !map.is_empty() => {
            out.push((format!("{prefix}{{"), path.to_string()));
            let n = map.len();
            for (i, (key, value)) in map.iter().enumerate() {
                let key_text = Value::from(key.as_str()).to_string();
                emit(
                    value,
                    &child(path, key),
                    format!("{key_text}: "),
                    i + 1 == n,
                    out,
                );
            }
            out.push((format!("}}{comma}"), path.to_string()));
        }
        Value::Array(items) if !items.is_empty() => {
            out.push((format!("{prefix}["), path.to_string()));
            let n = items.len();
            for (i, value) in items.iter().enumerate() {
                emit(
                    value,
                    &format!("{path}[{i}]"),
                    String::new(),
                    i + 1 == n,
                    out,
                );
            }
            out.push((format!("]{comma}"), path.to_string()));
        }
        scalar => out.push((format!("{prefix}{scalar}{comma}"), path.to_string())),
    }
}

/// `path.key`, or `path[key]` for map keys that are not plain names (`gpu.nvidia.com/memory`).
pub fn child(path: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (plain, path.is_empty()) {
        (true, true) => key.to_string(),
        (true, false) => format!("{path}.{key}"),
        (false, _) => format!("{path}[{key}]"),
    }
}

/// A step down a document: a key, or an index into a list.
enum Step {
    Key(String),
    Index(usize),
}

/// The steps of a path serde_ignored reports, from the document down.
fn steps_of(path: &serde_ignored::Path) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut at = path;
    loop {
        at = match at {
            serde_ignored::Path::Root => break,
            serde_ignored::Path::Seq { parent, index } => {
                steps.push(Step::Index(*index));
                parent
            }
            serde_ignored::Path::Map { parent, key } => {
                steps.push(Step::Key(key.clone()));
                parent
            }
            serde_ignored::Path::Some { parent }
            | serde_ignored::Path::NewtypeStruct { parent }
            | serde_ignored::Path::NewtypeVariant { parent } => parent,
        };
    }
    steps.reverse();
    steps
}

/// The value at `steps` in `doc`.
fn at<'a>(doc: &'a Value, steps: &[Step]) -> Option<&'a Value> {
    steps.iter().try_fold(doc, |value, step| match step {
        Step::Key(key) => value.get(key.as_str()),
        Step::Index(n) => value.get(*n),
    })
}

/// `steps` as a field path: `spec.devices.requests[0].name`.
fn path_of(steps: &[Step]) -> String {
    steps.iter().fold(String::new(), |path, step| match step {
        Step::Key(key) => child(&path, key),
        Step::Index(n) => format!("{path}[{n}]"),
    })
}

#[cfg(test)]
mod tests;
