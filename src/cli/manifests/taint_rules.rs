//! DeviceTaintRules (KEP-5055, GA in Kubernetes 1.37): taints an admin puts on devices without
//! touching their slices. Read in every version the 1.37 API server serves (`resource.k8s.io/v1`,
//! `v1beta2`, `v1alpha3`: the same fields since the selector lost `deviceClassName` and
//! `selectors` in 1.35) and applied as kube-scheduler's device tracker applies them: each rule's
//! taint appended after the device's own, on every device its selector matches (`driver`,
//! `pool`, `device`; an unset field matches any, an unset selector every device).
use k8s_openapi::api::resource::{v1, v1alpha3, v1beta2};
use serde_json::Value;

use super::convert::{FieldError, decode, decode_canonical};
use super::validate;

/// The `apiVersion`s that serve DeviceTaintRule.
pub const API_VERSIONS: [&str; 3] = [
    "resource.k8s.io/v1",
    "resource.k8s.io/v1beta2",
    "resource.k8s.io/v1alpha3",
];

/// Decodes a DeviceTaintRule of `api_version` strictly and returns it as v1.
pub fn to_v1(api_version: &str, doc: &Value) -> Result<v1::DeviceTaintRule, FieldError> {
    let relabeled = |mut json: Value| -> Result<v1::DeviceTaintRule, FieldError> {
        if let Value::Object(map) = &mut json {
            map.insert("apiVersion".into(), Value::from("resource.k8s.io/v1"));
        }
        decode::<v1::DeviceTaintRule>(&json)
    };
    let rule = match api_version {
        "resource.k8s.io/v1" => decode::<v1::DeviceTaintRule>(doc)?,
        "resource.k8s.io/v1beta2" => {
            relabeled(decode_canonical::<v1beta2::DeviceTaintRule>(doc)?.1)?
        }
        "resource.k8s.io/v1alpha3" => {
            relabeled(decode_canonical::<v1alpha3::DeviceTaintRule>(doc)?.1)?
        }
        other => {
            return Err(FieldError::new(
                "apiVersion",
                format!(
                    "{other:?} does not serve DeviceTaintRule; use {}",
                    API_VERSIONS.join(", ")
                ),
            ));
        }
    };
    validate(&rule)?;
    Ok(rule)
}

/// What the API server's validation refuses in a rule's selector and taint.
fn validate(rule: &v1::DeviceTaintRule) -> Result<(), FieldError> {
    if let Some(selector) = &rule.spec.device_selector {
        let at = "spec.deviceSelector";
        if let Some(driver) = &selector.driver {
            validate::driver_name(driver, &format!("{at}.driver"))?;
        }
        if let Some(pool) = &selector.pool {
            validate::pool_name(pool, &format!("{at}.pool"))?;
        }
        if let Some(device) = &selector.device {
            validate::dns_label(device, &format!("{at}.device"))?;
        }
    }
    validate::taint(&rule.spec.taint, "spec.taint")
}

fn matches(
    selector: Option<&v1::DeviceTaintSelector>,
    driver: &str,
    pool: &str,
    device: &str,
) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    is(&selector.driver, driver) && is(&selector.pool, pool) && is(&selector.device, device)
}

/// Appends each rule's taint to the devices it selects; returns one line per rule saying which
/// devices it tainted.
pub fn apply(rules: &[v1::DeviceTaintRule], slices: &mut [v1::ResourceSlice]) -> Vec<String> {
    let mut notes = Vec::new();
    for rule in rules {
        let name = rule.metadata.name.as_deref().unwrap_or("<no name>");
        let taint = &rule.spec.taint;
        let mut tainted = Vec::new();
        for slice in slices.iter_mut() {
            let (driver, pool) = (slice.spec.driver.clone(), slice.spec.pool.name.clone());
            for device in slice.spec.devices.iter_mut().flatten() {
                if matches(
                    rule.spec.device_selector.as_ref(),
                    &driver,
                    &pool,
                    &device.name,
                ) {
                    device
                        .taints
                        .get_or_insert_with(Vec::new)
                        .push(taint.clone());
                    tainted.push(format!("{pool}/{}", device.name));
                }
            }
        }
        let value = taint
            .value
            .as_deref()
            .map(|v| format!("={v}"))
            .unwrap_or_default();
        notes.push(match tainted.len() {
            0 => format!(
                "DeviceTaintRule {name} ({}{value}:{}) selects no device",
                taint.key, taint.effect
            ),
            n if n <= 8 => format!(
                "DeviceTaintRule {name} taints {} with {}{value}:{}",
                tainted.join(", "),
                taint.key,
                taint.effect
            ),
            n => format!(
                "DeviceTaintRule {name} taints {n} devices ({}, ...) with {}{value}:{}",
                tainted[..3].join(", "),
                taint.key,
                taint.effect
            ),
        });
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(api_version: &str, selector: Value, taint: Value) -> Value {
        json!({"apiVersion": api_version, "kind": "DeviceTaintRule", "metadata": {"name": "maint"},
            "spec": {"deviceSelector": selector, "taint": taint}})
    }

    fn slice(devices: &[&str]) -> v1::ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-a",
                "devices": devices.iter().map(|d| json!({"name": d})).collect::<Vec<_>>()}
        }))
        .expect("slice")
    }

    #[test]
    fn every_served_version_reads_the_same_rule_and_taints_the_selected_device() {
        for version in API_VERSIONS {
            let doc = rule(
                version,
                json!({"driver": "gpu.nvidia.com", "device": "gpu-1"}),
                json!({"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}),
            );
            let rule = to_v1(version, &doc).unwrap_or_else(|e| panic!("{version}: {e:?}"));
            let mut slices = [slice(&["gpu-0", "gpu-1"])];
            // The device's own taint stays first.
            slices[0].spec.devices.as_mut().expect("devices")[1].taints = Some(vec![
                serde_json::from_value(json!({"key": "own", "effect": "None"})).expect("taint"),
            ]);
            let notes = apply(&[rule], &mut slices);
            let devices = slices[0].spec.devices.as_ref().expect("devices");
            assert_eq!(devices[0].taints, None, "{version}");
            let keys: Vec<&str> = devices[1]
                .taints
                .iter()
                .flatten()
                .map(|t| t.key.as_str())
                .collect();
            assert_eq!(keys, ["own", "example.com/maintenance"], "{version}");
            assert_eq!(
                notes,
                [
                    "DeviceTaintRule maint taints node-a/gpu-1 with example.com/maintenance=planned:NoSchedule"
                ]
            );
        }
    }

    #[test]
    fn an_unset_selector_taints_every_device() {
        let doc = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "all"}, "spec": {"taint": {"key": "drain", "effect": "NoExecute"}}});
        let rule = to_v1("resource.k8s.io/v1", &doc).expect("rule");
        let mut slices = [slice(&["gpu-0", "gpu-1"])];
        apply(&[rule], &mut slices);
        assert!(
            slices[0]
                .spec
                .devices
                .iter()
                .flatten()
                .all(|d| d.taints.as_ref().is_some_and(|t| t.len() == 1))
        );
    }

    #[test]
    fn bad_rules_name_the_field() {
        let cases = [
            (
                rule(
                    "resource.k8s.io/v1",
                    json!({}),
                    json!({"key": "k", "effect": "Sometimes"}),
                ),
                "spec.taint.effect",
            ),
            (
                rule(
                    "resource.k8s.io/v1",
                    json!({}),
                    json!({"key": "bad key", "effect": "None"}),
                ),
                "spec.taint.key",
            ),
            (
                rule(
                    "resource.k8s.io/v1",
                    json!({}),
                    json!({"key": "k", "value": "-x", "effect": "None"}),
                ),
                "spec.taint.value",
            ),
            // Removed from the selector in Kubernetes 1.35.
            (
                rule(
                    "resource.k8s.io/v1alpha3",
                    json!({"deviceClassName": "gpu.nvidia.com"}),
                    json!({"key": "k", "effect": "None"}),
                ),
                "spec.deviceSelector.deviceClassName",
            ),
            (
                rule("resource.k8s.io/v1", json!({}), json!({"effect": "None"})),
                "key",
            ),
        ];
        for (doc, field) in cases {
            let version = doc["apiVersion"].as_str().expect("version").to_string();
            let error = to_v1(&version, &doc).expect_err("refused");
            assert!(
                error.field.contains(field) || error.message.contains(field),
                "{field}: {error:?}"
            );
        }
        let error = to_v1("resource.k8s.io/v1beta1", &json!({})).expect_err("not served");
        assert_eq!(error.field, "apiVersion");
    }
}
