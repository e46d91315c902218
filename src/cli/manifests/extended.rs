//! Extended resources backed by DRA (KEP-5004, GA in Kubernetes 1.37): a pod that asks for
//! `nvidia.com/gpu: 1` (a DeviceClass's `extendedResourceName`) or
//! `deviceclass.resource.kubernetes.io/<class>: 1` in its containers' resources gets a claim that
//! kube-scheduler makes for it, allocated with the pod's own claims in one step. Made here as the
//! 1.37 scheduler's DynamicResources plugin makes it (`createDeviceRequests`): one request per
//! (container, resource), init containers first, named `container-<i>-request-<j>` (`j`: the
//! resource's place among the container's sorted request names, cpu and memory included),
//! `ExactCount` of the integer quantity, requests sorted by name; generateName
//! `<pod>-extended-resources-`, annotation `resource.kubernetes.io/extended-resource-claim`.
//!
//! A node whose allocatable has the resource (a device plugin) serves it itself: the scheduler
//! leaves it out of that node's claim ([`requests`]'s `served_by_node`).
use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::convert::FieldError;

/// The implicit extended resource name of every DeviceClass.
pub const CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";
/// Marks the claim the scheduler made for a pod's extended resources.
pub const CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";

/// One container's resource requests (limits fill the requests they lack, as the API server
/// defaults them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerResources {
    pub name: String,
    /// An init container (they run one at a time: the pod needs the largest, not the sum).
    pub init: bool,
    pub requests: BTreeMap<String, String>,
}

/// The init containers, then the containers, of a pod spec.
pub fn containers(
    spec: Option<&Value>,
    spec_field: &str,
) -> Result<Vec<ContainerResources>, FieldError> {
    let mut out = Vec::new();
    for list in ["initContainers", "containers"] {
        let Some(items) = spec.and_then(|s| s.get(list)).and_then(Value::as_array) else {
            continue;
        };
        for (i, container) in items.iter().enumerate() {
            let at = format!("{spec_field}.{list}[{i}].resources");
            let quantities = |key: &str| -> Result<BTreeMap<String, String>, FieldError> {
                let Some(map) = container.get("resources").and_then(|r| r.get(key)) else {
                    return Ok(BTreeMap::new());
                };
                let Value::Object(map) = map else {
                    return Err(FieldError::new(format!("{at}.{key}"), "must be a map"));
                };
                map.iter()
                    .map(|(name, v)| {
                        let text = match v {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            other => {
                                return Err(FieldError::new(
                                    format!("{at}.{key}[{name}]"),
                                    format!("Invalid value: {other}: must be a quantity"),
                                ));
                            }
                        };
                        Ok((name.clone(), text))
                    })
                    .collect()
            };
            let mut requests = quantities("requests")?;
            for (name, limit) in quantities("limits")? {
                requests.entry(name).or_insert(limit);
            }
            out.push(ContainerResources {
                name: container
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                init: list == "initContainers",
                requests,
            });
        }
    }
    Ok(out)
}

/// Extended resource name → DeviceClass: every class under its implicit name, and under its
/// `extendedResourceName`, where several classes with one name resolve to the newest
/// (`creationTimestamp`), ties to the lowest name.
pub fn class_mapping<'a>(
    classes: impl IntoIterator<Item = &'a DeviceClass>,
) -> BTreeMap<String, String> {
    let mut explicit: BTreeMap<String, (Option<String>, String)> = BTreeMap::new();
    let mut mapping = BTreeMap::new();
    for class in classes {
        let Some(name) = class.metadata.name.clone() else {
            continue;
        };
        mapping.insert(format!("{CLASS_PREFIX}{name}"), name.clone());
        let Some(resource) = class
            .spec
            .as_ref()
            .and_then(|s| s.extended_resource_name.clone())
        else {
            continue;
        };
        let created = class
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string());
        let better =
            |(c, n): &(Option<String>, String)| created > *c || (created == *c && name < *n);
        match explicit.get(&resource) {
            Some(current) if !better(current) => {}
            _ => {
                explicit.insert(resource, (created, name));
            }
        }
    }
    mapping.extend(explicit.into_iter().map(|(r, (_, n))| (r, n)));
    mapping
}

/// The requests of a pod's extended-resource claim on a node that does not serve the resources
/// `served_by_node` says it does. Quantities that are not whole numbers, or zero, make none.
pub fn requests(
    containers: &[ContainerResources],
    mapping: &BTreeMap<String, String>,
    served_by_node: impl Fn(&str) -> bool,
) -> Vec<DeviceRequest> {
    let mut out = Vec::new();
    for (i, container) in containers.iter().enumerate() {
        // Sorted keys: BTreeMap order is the scheduler's sort of the names.
        for (j, (resource, quantity)) in container.requests.iter().enumerate() {
            let Some(class) = mapping.get(resource) else {
                continue;
            };
            if served_by_node(resource) {
                continue;
            }
            let Some(count) = whole_number(quantity) else {
                continue;
            };
            out.push(DeviceRequest {
                name: format!("container-{i}-request-{j}"),
                exactly: Some(ExactDeviceRequest {
                    device_class_name: class.clone(),
                    allocation_mode: Some("ExactCount".into()),
                    count: Some(count),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The extended resources the pod asks for that no DeviceClass backs, with the pod's request
/// of each (the larger of its containers' sum and any one init container's, as the scheduler
/// counts them). Only a node whose allocatable has them (a device plugin) takes the pod; other
/// nodes fail it as "Insufficient".
pub fn unserved(
    containers: &[ContainerResources],
    mapping: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut totals: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for container in containers {
        let init = container.init;
        for (resource, quantity) in &container.requests {
            if !is_extended(resource) || mapping.contains_key(resource) {
                continue;
            }
            let Ok(q) = k8s_quantity::Quantity::parse(quantity) else {
                continue;
            };
            let value = q.as_approximate_float();
            let (sum, init_max) = totals.entry(resource).or_default();
            if init {
                *init_max = init_max.max(value);
            } else {
                *sum += value;
            }
        }
    }
    totals
        .into_iter()
        .filter_map(|(resource, (sum, init_max))| {
            let value = sum.max(init_max);
            (value > 0.0).then(|| (resource.to_string(), value.to_string()))
        })
        .collect()
}

/// An extended resource name (`IsExtendedResourceName`): domain-qualified, not in the
/// `kubernetes.io` domain, not a quota `requests.` name.
pub fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// A quantity's value when it is a positive whole number (`AsInt64`).
fn whole_number(quantity: &str) -> Option<i64> {
    let value = k8s_quantity::Quantity::parse(quantity)
        .ok()?
        .as_approximate_float();
    (value >= 1.0 && value.fract() == 0.0 && value <= i64::MAX as f64).then_some(value as i64)
}

/// The claim itself, as the scheduler writes it for pod `pod` (named as the API server would
/// name it from `generateName`, by `name`).
pub fn claim(
    pod: &str,
    pod_uid: &str,
    namespace: &str,
    name: String,
    requests: Vec<DeviceRequest>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name),
            generate_name: Some(format!("{pod}-extended-resources-")),
            namespace: Some(namespace.to_string()),
            annotations: Some(BTreeMap::from([(
                CLAIM_ANNOTATION.to_string(),
                "true".to_string(),
            )])),
            owner_references: Some(vec![super::pod_owner(pod, pod_uid, Some(true))]),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(requests),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, resource: Option<&str>, created: Option<&str>) -> DeviceClass {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"extendedResourceName": resource}
        }))
        .expect("class")
    }

    #[test]
    fn classes_are_known_by_both_names_and_the_newest_wins_a_shared_name() {
        let classes = [
            class(
                "gpu.nvidia.com",
                Some("nvidia.com/gpu"),
                Some("2026-01-01T00:00:00Z"),
            ),
            class(
                "b.example.com",
                Some("nvidia.com/gpu"),
                Some("2026-06-01T00:00:00Z"),
            ),
            class("a.example.com", Some("example.com/tpu"), None),
            class("c.example.com", Some("example.com/tpu"), None),
        ];
        let mapping = class_mapping(&classes);
        assert_eq!(mapping["nvidia.com/gpu"], "b.example.com");
        assert_eq!(
            mapping["example.com/tpu"], "a.example.com",
            "ties: lowest name"
        );
        assert_eq!(
            mapping["deviceclass.resource.kubernetes.io/gpu.nvidia.com"],
            "gpu.nvidia.com"
        );
    }

    #[test]
    fn one_request_per_container_and_resource_named_by_sorted_position() {
        let spec = json!({
            "initContainers": [{"name": "warmup", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "containers": [
                {"name": "main", "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": "2", "deviceclass.resource.kubernetes.io/mig.nvidia.com": 1}}},
                {"name": "sidecar", "resources": {"requests": {"nvidia.com/gpu": "0.5"}}}
            ]
        });
        let containers = containers(Some(&spec), "spec").expect("containers");
        assert_eq!(containers.len(), 3);
        let mapping = class_mapping(&[
            class("gpu.nvidia.com", Some("nvidia.com/gpu"), None),
            class("mig.nvidia.com", None, None),
        ]);
        let requests = requests(&containers, &mapping, |_| false);
        let summary: Vec<(String, String, i64)> = requests
            .iter()
            .map(|r| {
                let e = r.exactly.as_ref().expect("exactly");
                (
                    r.name.clone(),
                    e.device_class_name.clone(),
                    e.count.unwrap_or_default(),
                )
            })
            .collect();
        // main's sorted names: cpu, deviceclass.resource.kubernetes.io/mig.nvidia.com, memory,
        // nvidia.com/gpu. The sidecar's 0.5 is no whole number: no request.
        assert_eq!(
            summary,
            [
                (
                    "container-0-request-0".to_string(),
                    "gpu.nvidia.com".to_string(),
                    1
                ),
                (
                    "container-1-request-1".to_string(),
                    "mig.nvidia.com".to_string(),
                    1
                ),
                (
                    "container-1-request-3".to_string(),
                    "gpu.nvidia.com".to_string(),
                    2
                ),
            ]
        );
        // A node with a device plugin for nvidia.com/gpu serves that itself.
        let on_plugin_node = super::requests(&containers, &mapping, |r| r == "nvidia.com/gpu");
        assert_eq!(on_plugin_node.len(), 1);
        assert_eq!(on_plugin_node[0].name, "container-1-request-1");
    }
}
