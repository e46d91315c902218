//! Which nodes a pod may go to before devices are looked at: kube-scheduler's `NodeName`,
//! `NodeUnschedulable`, `NodeAffinity` (`nodeSelector` and required node affinity) and
//! `TaintToleration` filters, on the Node objects given (`-f`, or a live cluster's).
use std::collections::BTreeMap;

use dra_allocator::NodeInfo;
use k8s_openapi::api::core::v1::{Node, NodeSelector, Taint, Toleration};
use serde_json::Value;

use super::convert::FieldError;

/// The taint the node lifecycle controller puts on a cordoned node; `NodeUnschedulable`
/// admits pods that tolerate it.
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// What of a pod's spec decides where it may run.
#[derive(Debug, Clone, Default)]
pub struct PodPlacement {
    /// `spec.nodeName`: bound already (or asked for one node).
    pub node_name: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    /// `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub required_affinity: Option<NodeSelector>,
    pub tolerations: Vec<Toleration>,
}

/// A node as the filters see it.
#[derive(Debug, Clone)]
pub struct FleetNode {
    pub info: NodeInfo,
    pub taints: Vec<Taint>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `status.allocatable`: extended resources a device plugin serves, among others.
    pub allocatable: std::collections::BTreeMap<String, String>,
}

impl FleetNode {
    /// A node only slices name: its hostname label and nothing else is known.
    pub fn named(info: NodeInfo) -> Self {
        Self {
            info,
            taints: vec![],
            unschedulable: false,
            allocatable: Default::default(),
        }
    }

    pub fn from_node(node: &Node) -> Self {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut info = NodeInfo::named(&name);
        if let Some(labels) = &node.metadata.labels {
            info.labels.extend(labels.clone());
        }
        if let Some(declared) = node
            .status
            .as_ref()
            .and_then(|s| s.declared_features.as_ref())
        {
            info.declared_features = declared.clone();
        }
        let spec = node.spec.as_ref();
        Self {
            info,
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            allocatable: node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| a.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
                .unwrap_or_default(),
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    spec: Option<&Value>,
    path: &[&str],
    field: String,
) -> Result<Option<T>, FieldError> {
    let Some(value) = spec.and_then(|spec| path.iter().try_fold(spec, |v, key| v.get(*key))) else {
        return Ok(None);
    };
    if value.is_null() {
        return Ok(None);
    }
    serde_json::from_value(value.clone())
        .map(Some)
        .map_err(|e| FieldError::new(field, e.to_string()))
}

impl PodPlacement {
    /// From a pod spec at `spec_field` (`spec`, `spec.template.spec`, ...).
    pub fn from_spec(spec: Option<&Value>, spec_field: &str) -> Result<Self, FieldError> {
        let at = |f: &str| format!("{spec_field}.{f}");
        Ok(Self {
            node_name: decode::<String>(spec, &["nodeName"], at("nodeName"))?
                .filter(|n| !n.is_empty()),
            node_selector: decode(spec, &["nodeSelector"], at("nodeSelector"))?.unwrap_or_default(),
            required_affinity: decode(
                spec,
                &[
                    "affinity",
                    "nodeAffinity",
                    "requiredDuringSchedulingIgnoredDuringExecution",
                ],
                at("affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"),
            )?,
            tolerations: decode(spec, &["tolerations"], at("tolerations"))?.unwrap_or_default(),
        })
    }

    /// Whether the scheduler's filters admit the pod on `node`; `Err` says which one refuses
    /// and why, in one line.
    pub fn admits(&self, node: &FleetNode) -> Result<(), String> {
        let name = &node.info.name;
        if let Some(wanted) = &self.node_name
            && wanted != name
        {
            return Err(format!("the pod's spec.nodeName is {wanted}"));
        }
        for (key, value) in &self.node_selector {
            if node.info.labels.get(key) != Some(value) {
                return Err(match node.info.labels.get(key) {
                    Some(has) => format!("nodeSelector {key}={value}: the node has {key}={has}"),
                    None => format!("nodeSelector {key}={value}: the node has no label {key}"),
                });
            }
        }
        if let Some(selector) = &self.required_affinity {
            match dra_allocator::node_selector_matches(&node.info, selector) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(
                        "the pod's required node affinity does not match the node's labels".into(),
                    );
                }
                Err(e) => return Err(format!("the pod's required node affinity: {e}")),
            }
        }
        if node.unschedulable
            && !self
                .tolerations
                .iter()
                .any(|t| tolerates(t, UNSCHEDULABLE_TAINT, None, "NoSchedule"))
        {
            return Err("the node is cordoned (spec.unschedulable)".into());
        }
        // Only these two effects keep a pod off a node at scheduling; PreferNoSchedule scores.
        if let Some(taint) = node.taints.iter().find(|taint| {
            matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
                && !self
                    .tolerations
                    .iter()
                    .any(|t| tolerates(t, &taint.key, taint.value.as_deref(), &taint.effect))
        }) {
            return Err(format!(
                "taint {}{}:{} on the node, and the pod has no toleration for it",
                taint.key,
                taint
                    .value
                    .as_deref()
                    .map(|v| format!("={v}"))
                    .unwrap_or_default(),
                taint.effect
            ));
        }
        Ok(())
    }
}

/// core/v1 `Toleration.ToleratesTaint`: effect (empty tolerates all), key (empty with `Exists`
/// tolerates every key), then `Equal` (the default) or `Exists`.
fn tolerates(t: &Toleration, key: &str, value: Option<&str>, effect: &str) -> bool {
    if t.effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != effect)
    {
        return false;
    }
    let key_wanted = t.key.as_deref().unwrap_or("");
    if !key_wanted.is_empty() && key_wanted != key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "" | "Equal" => {
            key_wanted == key && t.value.as_deref().unwrap_or("") == value.unwrap_or("")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(value: Value) -> FleetNode {
        FleetNode::from_node(&serde_json::from_value(value).expect("node"))
    }

    fn placement(spec: Value) -> PodPlacement {
        PodPlacement::from_spec(Some(&spec), "spec").expect("spec")
    }

    #[test]
    fn node_selectors_affinity_taints_and_cordons_filter_as_the_scheduler_does() {
        let gpu = node(json!({
            "metadata": {"name": "a", "labels": {"pool": "h100"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        }));
        let cordoned = node(json!({"metadata": {"name": "b"}, "spec": {"unschedulable": true}}));
        let plain = placement(json!({}));
        assert!(
            plain
                .admits(&gpu)
                .unwrap_err()
                .contains("taint nvidia.com/gpu=present:NoSchedule")
        );
        assert!(plain.admits(&cordoned).unwrap_err().contains("cordoned"));
        let tolerant = placement(json!({
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }));
        assert_eq!(tolerant.admits(&gpu), Ok(()));
        // The value must match with Equal; an empty key with Exists tolerates everything.
        let wrong_value =
            placement(json!({"tolerations": [{"key": "nvidia.com/gpu", "value": "x"}]}));
        assert!(wrong_value.admits(&gpu).is_err());
        let everything = placement(json!({"tolerations": [{"operator": "Exists"}]}));
        assert_eq!(everything.admits(&gpu), Ok(()));
        assert_eq!(everything.admits(&cordoned), Ok(()));
        let elsewhere = placement(json!({"nodeSelector": {"pool": "a100"}}));
        assert!(
            elsewhere
                .admits(&gpu)
                .unwrap_err()
                .contains("pool=a100: the node has pool=h100")
        );
        let affinity = placement(json!({
            "tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100"]}]}]
            }}},
        }));
        assert!(affinity.admits(&gpu).unwrap_err().contains("affinity"));
        let pinned = placement(json!({"nodeName": "b", "tolerations": [{"operator": "Exists"}]}));
        assert!(pinned.admits(&gpu).unwrap_err().contains("nodeName is b"));
        assert_eq!(pinned.admits(&cordoned), Ok(()));
    }

    #[test]
    fn a_malformed_field_is_named() {
        let e = PodPlacement::from_spec(Some(&json!({"tolerations": "x"})), "spec.template.spec")
            .unwrap_err();
        assert_eq!(e.field, "spec.template.spec.tolerations");
    }
}
