//! Kueue's admission (v0.17) of the workloads `match` reads: ClusterQueues' nominal quotas,
//! LocalQueues, and the Configuration's `resources.deviceClassMappings` (Kueue's
//! `DynamicResourceAllocation` feature). A workload queued by the `kueue.x-k8s.io/queue-name`
//! label is admitted, in input order, when its whole usage fits what its ClusterQueue has left:
//! every pod's container requests (init containers: the largest), and, with device class
//! mappings, each request's `exactly.count` per mapped DeviceClass for claims made from
//! templates. What Kueue refuses with DRA (a named claim, CEL selectors, firstAvailable,
//! allocationMode All, constraints, config, an unmapped class) makes the workload inadmissible,
//! as Kueue marks it. Within a ClusterQueue Kueue takes workloads by priority (a
//! WorkloadPriorityClass named by the `kueue.x-k8s.io/priority-class` label, else the pods'
//! PriorityClass, else the global default class, else 0), then by creation time; objects
//! without `metadata.creationTimestamp` (files) come after those with one, in input order.
//! Cohorts (borrowing) and flavors that steer pods to nodes are refused: they are not predicted.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use serde_json::Value;

use super::convert::FieldError;

const GROUP: &str = "kueue.x-k8s.io/";
const CONFIG_VERSIONS: [&str; 2] = [
    "config.kueue.x-k8s.io/v1beta1",
    "config.kueue.x-k8s.io/v1beta2",
];

/// Whether `kind` at `api_version` is a Kueue object this module reads.
pub fn handles(kind: &str, api_version: &str) -> bool {
    match kind {
        "ClusterQueue" | "LocalQueue" | "ResourceFlavor" | "WorkloadPriorityClass" => {
            api_version.starts_with(GROUP)
        }
        "Configuration" => CONFIG_VERSIONS.contains(&api_version),
        // Read for Kueue's order only; kube-scheduler's own use of priority is not modelled.
        "PriorityClass" => api_version == "scheduling.k8s.io/v1",
        _ => false,
    }
}

#[derive(Debug, Clone, Default)]
pub struct Kueue {
    /// ClusterQueue → resource → nominal quota (all flavors together).
    pub cluster_queues: BTreeMap<String, BTreeMap<String, f64>>,
    /// `namespace/name` → ClusterQueue.
    pub local_queues: BTreeMap<String, String>,
    /// DeviceClass → quota name; `None` without a Configuration (Kueue's DRA feature off: claims
    /// are not counted).
    pub device_classes: Option<BTreeMap<String, String>>,
    /// ClusterQueues with `queueingStrategy: StrictFIFO`: a workload held by quota holds every
    /// later one of the queue.
    pub strict_fifo: BTreeSet<String>,
    /// ClusterQueues stopped by `stopPolicy` (Hold, HoldAndDrain): nothing is admitted.
    pub stopped: BTreeMap<String, String>,
    /// WorkloadPriorityClass → value.
    pub workload_priority_classes: BTreeMap<String, i32>,
    /// PriorityClass → value, and the global default one (the lowest, if several say so).
    pub priority_classes: BTreeMap<String, i32>,
    pub default_priority: Option<(String, i32)>,
}

/// The WorkloadPriorityClass a Kueue-managed object names.
pub fn priority_class_label(value: &Value) -> Option<&str> {
    value
        .pointer("/metadata/labels")
        .and_then(|l| l.get(PRIORITY_CLASS_LABEL))
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
}

const PRIORITY_CLASS_LABEL: &str = "kueue.x-k8s.io/priority-class";

fn priority_value(value: &Value) -> Result<i32, FieldError> {
    value
        .get("value")
        .and_then(Value::as_i64)
        .and_then(|v| i32::try_from(v).ok())
        .ok_or_else(|| FieldError::new("value", "Required value: a 32-bit integer"))
}

fn quantity(value: &Value, field: &str) -> Result<f64, FieldError> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => {
            return Err(FieldError::new(
                field,
                format!("Invalid value: {other}: must be a quantity"),
            ));
        }
    };
    k8s_quantity::Quantity::parse(&text)
        .map(|q| q.as_approximate_float())
        .map_err(|e| FieldError::new(field, format!("Invalid value: {text:?}: {e}")))
}

/// Whether a field says anything: not null, and not an empty list or object (nor one whose
/// lists are all empty, as `admissionChecksStrategy: {admissionChecks: []}`).
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => fields.values().any(is_set),
        _ => true,
    }
}

fn name_of(value: &Value) -> Result<String, FieldError> {
    value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| FieldError::new("metadata.name", "Required value"))
}

impl Kueue {
    pub fn is_empty(&self) -> bool {
        self.cluster_queues.is_empty() && self.local_queues.is_empty()
    }

    pub fn add(&mut self, kind: &str, value: &Value) -> Result<(), FieldError> {
        match kind {
            "ClusterQueue" => self.add_cluster_queue(value),
            "LocalQueue" => {
                let name = name_of(value)?;
                let namespace = value
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .unwrap_or(super::DEFAULT_NAMESPACE);
                let cluster_queue = value
                    .pointer("/spec/clusterQueue")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| FieldError::new("spec.clusterQueue", "Required value"))?;
                self.local_queues
                    .insert(format!("{namespace}/{name}"), cluster_queue.to_string());
                Ok(())
            }
            "WorkloadPriorityClass" => {
                let name = name_of(value)?;
                self.workload_priority_classes
                    .insert(name, priority_value(value)?);
                Ok(())
            }
            "PriorityClass" => {
                let name = name_of(value)?;
                let priority = priority_value(value)?;
                if value.get("globalDefault").and_then(Value::as_bool) == Some(true)
                    && self
                        .default_priority
                        .as_ref()
                        .is_none_or(|(_, lowest)| priority < *lowest)
                {
                    self.default_priority = Some((name.clone(), priority));
                }
                self.priority_classes.insert(name, priority);
                Ok(())
            }
            "ResourceFlavor" => {
                for field in ["nodeLabels", "nodeTaints", "tolerations", "topologyName"] {
                    if value
                        .pointer(&format!("/spec/{field}"))
                        .is_some_and(|v| !v.is_null() && v != &Value::Object(Default::default()))
                    {
                        return Err(FieldError::new(
                            format!("spec.{field}"),
                            "a flavor that steers pods to nodes is not predicted (only flavors without nodeLabels, nodeTaints, tolerations or topology)",
                        ));
                    }
                }
                Ok(())
            }
            _ => self.add_configuration(value),
        }
    }

    fn add_cluster_queue(&mut self, value: &Value) -> Result<(), FieldError> {
        let name = name_of(value)?;
        for field in ["cohort", "cohortName"] {
            if value
                .pointer(&format!("/spec/{field}"))
                .and_then(Value::as_str)
                .is_some_and(|c| !c.is_empty())
            {
                return Err(FieldError::new(
                    format!("spec.{field}"),
                    "borrowing within a cohort is not predicted",
                ));
            }
        }
        // Which namespaces' LocalQueues it serves depends on namespace labels the inputs lack.
        if value
            .pointer("/spec/namespaceSelector")
            .is_some_and(|v| !v.is_null() && v != &Value::Object(Default::default()))
        {
            return Err(FieldError::new(
                "spec.namespaceSelector",
                "a selector other than {} (every namespace) is not predicted",
            ));
        }
        // Admission checks wait for controllers (provisioning, MultiKueue) the inputs lack.
        for field in ["admissionChecks", "admissionChecksStrategy"] {
            if value.pointer(&format!("/spec/{field}")).is_some_and(is_set) {
                return Err(FieldError::new(
                    format!("spec.{field}"),
                    "admission checks are not predicted",
                ));
            }
        }
        match value
            .pointer("/spec/queueingStrategy")
            .and_then(Value::as_str)
        {
            None | Some("BestEffortFIFO") => {}
            Some("StrictFIFO") => {
                self.strict_fifo.insert(name.clone());
            }
            Some(other) => {
                return Err(FieldError::new(
                    "spec.queueingStrategy",
                    format!(
                        "Unsupported value: {other:?}: supported values: \"BestEffortFIFO\", \"StrictFIFO\""
                    ),
                ));
            }
        }
        match value.pointer("/spec/stopPolicy").and_then(Value::as_str) {
            None | Some("None") => {}
            Some(policy @ ("Hold" | "HoldAndDrain")) => {
                self.stopped.insert(name.clone(), policy.to_string());
            }
            Some(other) => {
                return Err(FieldError::new(
                    "spec.stopPolicy",
                    format!(
                        "Unsupported value: {other:?}: supported values: \"None\", \"Hold\", \"HoldAndDrain\""
                    ),
                ));
            }
        }
        let mut quota: BTreeMap<String, f64> = BTreeMap::new();
        let groups = value
            .pointer("/spec/resourceGroups")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (g, group) in groups.iter().enumerate() {
            for resource in group
                .get("coveredResources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                quota.entry(resource.to_string()).or_insert(0.0);
            }
            let flavors = group.get("flavors").and_then(Value::as_array);
            for (f, flavor) in flavors.into_iter().flatten().enumerate() {
                let resources = flavor.get("resources").and_then(Value::as_array);
                for (r, resource) in resources.into_iter().flatten().enumerate() {
                    let at = format!("spec.resourceGroups[{g}].flavors[{f}].resources[{r}]");
                    let resource_name = resource
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| FieldError::new(format!("{at}.name"), "Required value"))?;
                    let nominal = resource.get("nominalQuota").ok_or_else(|| {
                        FieldError::new(format!("{at}.nominalQuota"), "Required value")
                    })?;
                    *quota.entry(resource_name.to_string()).or_default() +=
                        quantity(nominal, &format!("{at}.nominalQuota"))?;
                }
            }
        }
        self.cluster_queues.insert(name, quota);
        Ok(())
    }

    fn add_configuration(&mut self, value: &Value) -> Result<(), FieldError> {
        let mut mappings = BTreeMap::new();
        let entries = value
            .pointer("/resources/deviceClassMappings")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("resources.deviceClassMappings[{i}]");
            let name = entry
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| FieldError::new(format!("{at}.name"), "Required value"))?;
            for class in entry
                .get("deviceClassNames")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if mappings
                    .insert(class.to_string(), name.to_string())
                    .is_some()
                {
                    return Err(FieldError::new(
                        format!("{at}.deviceClassNames"),
                        format!("Duplicate value: DeviceClass {class:?} maps to one name only"),
                    ));
                }
            }
        }
        self.device_classes = Some(mappings);
        Ok(())
    }
}

/// Quota used per resource, or why Kueue refuses the workload.
pub type Usage = Result<BTreeMap<String, f64>, String>;

/// A queued workload: its object, its LocalQueue (`namespace/name`), what it uses, and what
/// orders it in its queue.
pub struct Queued {
    pub object: String,
    pub queue: String,
    pub usage: Usage,
    /// The `kueue.x-k8s.io/priority-class` label, and the first pod set's `priorityClassName`.
    pub workload_priority_class: Option<String>,
    pub pod_priority_class: Option<String>,
    /// `metadata.creationTimestamp` (RFC 3339, as the API server writes it).
    pub created: Option<String>,
}

impl Kueue {
    /// The priority Kueue gives a workload, or why it makes no Workload for it.
    fn priority(&self, queued: &Queued) -> Result<i32, String> {
        if let Some(class) = &queued.workload_priority_class {
            return self
                .workload_priority_classes
                .get(class)
                .copied()
                .ok_or_else(|| format!("WorkloadPriorityClass {class} is not in the inputs: Kueue makes no Workload without it"));
        }
        match &queued.pod_priority_class {
            Some(class) => self.priority_classes.get(class).copied().ok_or_else(|| {
                format!(
                    "PriorityClass {class} is not in the inputs: Kueue makes no Workload without it"
                )
            }),
            None => Ok(self.default_priority.as_ref().map_or(0, |(_, v)| *v)),
        }
    }
}

/// What one pod uses of a queue's quota, or why Kueue will not admit it.
pub fn pod_usage(
    containers: &[super::extended::ContainerResources],
    claims: &[(&super::PodClaim, Option<&ResourceClaimTemplate>)],
    device_classes: Option<&BTreeMap<String, String>>,
) -> Usage {
    let mut usage: BTreeMap<String, f64> = BTreeMap::new();
    let mut init: BTreeMap<String, f64> = BTreeMap::new();
    for container in containers {
        for (resource, text) in &container.requests {
            let value = k8s_quantity::Quantity::parse(text)
                .map(|q| q.as_approximate_float())
                .unwrap_or(0.0);
            if container.init {
                let max = init.entry(resource.clone()).or_default();
                *max = max.max(value);
            } else {
                *usage.entry(resource.clone()).or_default() += value;
            }
        }
    }
    for (resource, value) in init {
        let used = usage.entry(resource).or_default();
        *used = used.max(value);
    }
    let Some(classes) = device_classes else {
        return Ok(usage);
    };
    for (claim, template) in claims {
        let Some(template) = template else {
            return Err(format!(
                "claim {:?} names a ResourceClaim: Kueue's DynamicResourceAllocation counts claims from templates only",
                claim.name
            ));
        };
        let devices = template
            .spec
            .as_ref()
            .and_then(|s| s.spec.as_ref())
            .and_then(|s| s.devices.as_ref());
        let Some(devices) = devices else { continue };
        if devices.constraints.as_ref().is_some_and(|c| !c.is_empty())
            || devices.config.as_ref().is_some_and(|c| !c.is_empty())
        {
            return Err(format!(
                "claim {:?}: Kueue does not admit claims with constraints or config",
                claim.name
            ));
        }
        for request in devices.requests.iter().flatten() {
            let Some(exactly) = &request.exactly else {
                return Err(format!(
                    "claim {:?} request {:?}: Kueue does not admit firstAvailable",
                    claim.name, request.name
                ));
            };
            if exactly.selectors.as_ref().is_some_and(|s| !s.is_empty()) {
                return Err(format!(
                    "claim {:?} request {:?}: Kueue does not admit CEL selectors in claims (put them in a DeviceClass of their own)",
                    claim.name, request.name
                ));
            }
            if exactly.allocation_mode.as_deref() == Some("All")
                || exactly.admin_access == Some(true)
            {
                return Err(format!(
                    "claim {:?} request {:?}: Kueue does not admit allocationMode All or adminAccess",
                    claim.name, request.name
                ));
            }
            let Some(name) = classes.get(&exactly.device_class_name) else {
                return Err(format!(
                    "claim {:?} request {:?}: DeviceClass {:?} is in no deviceClassMappings entry",
                    claim.name, request.name, exactly.device_class_name
                ));
            };
            *usage.entry(name.clone()).or_default() += exactly.count.unwrap_or(1) as f64;
        }
    }
    Ok(usage)
}

/// Admission in Kueue's order: priority, then creation time, then input order. Returns, per
/// object not admitted, why.
pub fn admit(kueue: &Kueue, workloads: &[Queued]) -> BTreeMap<String, String> {
    let mut left = kueue.cluster_queues.clone();
    let mut held = BTreeMap::new();
    // StrictFIFO ClusterQueue → the workload held by quota at its head.
    let mut blocked: BTreeMap<&str, &str> = BTreeMap::new();
    let mut ordered = Vec::new();
    for queued in workloads {
        match kueue.priority(queued) {
            Ok(priority) => ordered.push((priority, queued)),
            Err(why) => {
                held.insert(queued.object.clone(), why);
            }
        }
    }
    // Stable: equal keys keep input order. A timestamp sorts before none (made later).
    ordered.sort_by(|(pa, a), (pb, b)| {
        pb.cmp(pa).then_with(|| match (&a.created, &b.created) {
            (Some(x), Some(y)) => x.cmp(y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        })
    });
    for (
        _,
        Queued {
            object,
            queue,
            usage,
            ..
        },
    ) in ordered
    {
        let usage = match usage {
            Ok(usage) => usage,
            Err(why) => {
                held.insert(object.clone(), format!("inadmissible: {why}"));
                continue;
            }
        };
        let Some(cluster_queue) = kueue.local_queues.get(queue) else {
            held.insert(
                object.clone(),
                format!("LocalQueue {queue} is not in the inputs: Kueue leaves it pending"),
            );
            continue;
        };
        let Some(remaining) = left.get_mut(cluster_queue) else {
            held.insert(
                object.clone(),
                format!(
                    "ClusterQueue {cluster_queue} (of LocalQueue {queue}) is not in the inputs"
                ),
            );
            continue;
        };
        if let Some(policy) = kueue.stopped.get(cluster_queue) {
            held.insert(
                object.clone(),
                format!("ClusterQueue {cluster_queue} is stopped (stopPolicy {policy})"),
            );
            continue;
        }
        if let Some(head) = blocked.get(cluster_queue.as_str()) {
            held.insert(
                object.clone(),
                format!("waiting behind {head}: ClusterQueue {cluster_queue} is StrictFIFO"),
            );
            continue;
        }
        let short = usage.iter().find_map(|(resource, need)| {
            if *need <= 0.0 {
                return None;
            }
            match remaining.get(resource) {
                None => Some(format!(
                    "ClusterQueue {cluster_queue} does not cover {resource} (needs {need})"
                )),
                Some(have) if have + 1e-9 < *need => Some(format!(
                    "ClusterQueue {cluster_queue}: {resource} needs {need}, {have} of {} left",
                    kueue.cluster_queues[cluster_queue][resource]
                )),
                Some(_) => None,
            }
        });
        match short {
            Some(why) => {
                held.insert(object.clone(), format!("quota: {why}"));
                if kueue.strict_fifo.contains(cluster_queue) {
                    blocked.insert(cluster_queue, object);
                }
            }
            None => {
                for (resource, need) in usage {
                    if let Some(have) = remaining.get_mut(resource) {
                        *have -= need;
                    }
                }
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quotas_sum_over_flavors_and_admission_runs_in_order() {
        let mut kueue = Kueue::default();
        kueue
            .add(
                "ClusterQueue",
                &json!({"metadata": {"name": "cq"}, "spec": {"resourceGroups": [{
                    "coveredResources": ["cpu", "nvidia.com/gpu"],
                    "flavors": [
                        {"name": "a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]},
                        {"name": "b", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "2"}, {"name": "cpu", "nominalQuota": "500m"}]},
                    ]}]}}),
            )
            .expect("queue");
        kueue
            .add(
                "LocalQueue",
                &json!({"metadata": {"name": "q", "namespace": "ml"}, "spec": {"clusterQueue": "cq"}}),
            )
            .expect("local queue");
        assert_eq!(kueue.cluster_queues["cq"]["nvidia.com/gpu"], 4.0);
        let gpus = |n: f64| Ok(BTreeMap::from([("nvidia.com/gpu".to_string(), n)]));
        let queued = |object: &str, usage: Usage| Queued {
            object: object.into(),
            queue: "ml/q".into(),
            usage,
            workload_priority_class: None,
            pod_priority_class: None,
            created: None,
        };
        let held = admit(
            &kueue,
            &[
                queued("a", gpus(3.0)),
                queued("b", gpus(2.0)),
                queued("c", gpus(1.0)),
                queued("d", Ok(BTreeMap::from([("memory".to_string(), 1.0)]))),
                queued("e", Err("refused".into())),
            ],
        );
        assert_eq!(held.keys().collect::<Vec<_>>(), ["b", "d", "e"]);
        assert!(held["b"].contains("needs 2, 1 of 4 left"), "{held:?}");
        assert!(held["d"].contains("does not cover memory"), "{held:?}");
        let cohort = Kueue::default().add(
            "ClusterQueue",
            &json!({"metadata": {"name": "x"}, "spec": {"cohortName": "c"}}),
        );
        assert_eq!(cohort.expect_err("cohort").field, "spec.cohortName");
    }

    #[test]
    fn a_strict_fifo_queue_holds_everything_behind_a_workload_quota_holds() {
        let kueue_with = |spec: serde_json::Value| {
            let mut kueue = Kueue::default();
            let mut spec = spec;
            spec["resourceGroups"] = json!([{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                {"name": "a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]);
            kueue
                .add(
                    "ClusterQueue",
                    &json!({"metadata": {"name": "cq"}, "spec": spec}),
                )
                .expect("queue");
            kueue
                .add(
                    "LocalQueue",
                    &json!({"metadata": {"name": "q"}, "spec": {"clusterQueue": "cq"}}),
                )
                .expect("local queue");
            kueue
        };
        let gpus = |n: f64| Ok(BTreeMap::from([("nvidia.com/gpu".to_string(), n)]));
        let queued = |object: &str, usage: Usage| Queued {
            object: object.into(),
            queue: "default/q".into(),
            usage,
            workload_priority_class: None,
            pod_priority_class: None,
            created: None,
        };
        let workloads = [
            queued("refused", Err("CEL selectors".into())),
            queued("big", gpus(3.0)),
            queued("too-big", gpus(2.0)),
            queued("small", gpus(1.0)),
        ];
        // BestEffortFIFO (the default): a later workload that fits is admitted.
        let held = admit(&kueue_with(json!({})), &workloads);
        assert_eq!(held.keys().collect::<Vec<_>>(), ["refused", "too-big"]);
        // StrictFIFO: the held one blocks the rest; an inadmissible one never queued does not.
        let strict = admit(
            &kueue_with(json!({"queueingStrategy": "StrictFIFO"})),
            &workloads,
        );
        assert_eq!(
            strict.keys().collect::<Vec<_>>(),
            ["refused", "small", "too-big"]
        );
        assert!(
            strict["small"].contains("waiting behind too-big"),
            "{strict:?}"
        );
        let stopped = admit(&kueue_with(json!({"stopPolicy": "Hold"})), &workloads);
        assert!(
            stopped["big"].contains("stopped (stopPolicy Hold)"),
            "{stopped:?}"
        );
        let mut kueue = Kueue::default();
        for (spec, field) in [
            (json!({"queueingStrategy": "LIFO"}), "spec.queueingStrategy"),
            (json!({"stopPolicy": "Pause"}), "spec.stopPolicy"),
            (json!({"admissionChecks": ["prov"]}), "spec.admissionChecks"),
            (
                json!({"admissionChecksStrategy": {"admissionChecks": [{"name": "prov"}]}}),
                "spec.admissionChecksStrategy",
            ),
        ] {
            let error = kueue
                .add(
                    "ClusterQueue",
                    &json!({"metadata": {"name": "x"}, "spec": spec}),
                )
                .expect_err("refused");
            assert_eq!(error.field, field);
        }
        assert!(
            kueue
                .add(
                    "ClusterQueue",
                    &json!({"metadata": {"name": "y"}, "spec": {"admissionChecksStrategy": {"admissionChecks": []}}})
                )
                .is_ok()
        );
    }

    #[test]
    fn a_queue_takes_higher_priority_first_then_the_earlier_made() {
        let mut kueue = Kueue::default();
        for (kind, object) in [
            (
                "ClusterQueue",
                json!({"metadata": {"name": "cq"}, "spec": {"resourceGroups": [{
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": "a", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}}),
            ),
            (
                "LocalQueue",
                json!({"metadata": {"name": "q"}, "spec": {"clusterQueue": "cq"}}),
            ),
            (
                "WorkloadPriorityClass",
                json!({"metadata": {"name": "urgent"}, "value": 1000}),
            ),
            (
                "PriorityClass",
                json!({"metadata": {"name": "low"}, "value": -5}),
            ),
        ] {
            kueue.add(kind, &object).expect(kind);
        }
        let two_gpus = || Ok(BTreeMap::from([("nvidia.com/gpu".to_string(), 2.0)]));
        let queued =
            |object: &str, wpc: Option<&str>, pc: Option<&str>, created: Option<&str>| Queued {
                object: object.into(),
                queue: "default/q".into(),
                usage: two_gpus(),
                workload_priority_class: wpc.map(str::to_string),
                pod_priority_class: pc.map(str::to_string),
                created: created.map(str::to_string),
            };
        // Input order would admit "first"; Kueue takes the urgent one.
        let held = admit(
            &kueue,
            &[
                queued("first", None, None, None),
                queued("urgent", Some("urgent"), None, None),
            ],
        );
        assert_eq!(held.keys().collect::<Vec<_>>(), ["first"], "{held:?}");
        // Equal priority: the earlier creationTimestamp; one without comes after.
        let held = admit(
            &kueue,
            &[
                queued("unmade", None, None, None),
                queued("later", None, None, Some("2026-12-07T10:00:05Z")),
                queued("earlier", None, None, Some("2026-12-07T10:00:01Z")),
            ],
        );
        assert_eq!(
            held.keys().collect::<Vec<_>>(),
            ["later", "unmade"],
            "{held:?}"
        );
        // A negative PriorityClass goes behind the default 0, whatever the input order.
        let held = admit(
            &kueue,
            &[
                queued("low", None, Some("low"), None),
                queued("plain", None, None, None),
            ],
        );
        assert_eq!(held.keys().collect::<Vec<_>>(), ["low"], "{held:?}");
        // A class the inputs lack: Kueue cannot make the Workload.
        let held = admit(&kueue, &[queued("x", Some("missing"), None, None)]);
        assert!(
            held["x"].contains("WorkloadPriorityClass missing is not in the inputs"),
            "{held:?}"
        );
        // A global default class gives unlabelled workloads its value.
        kueue
            .add(
                "PriorityClass",
                &json!({"metadata": {"name": "normal"}, "value": 10, "globalDefault": true}),
            )
            .expect("default");
        let held = admit(
            &kueue,
            &[
                queued("low", None, Some("low"), Some("2026-12-07T10:00:00Z")),
                queued("plain", None, None, Some("2026-12-07T10:00:09Z")),
            ],
        );
        assert_eq!(held.keys().collect::<Vec<_>>(), ["low"], "{held:?}");
        assert_eq!(
            kueue
                .add(
                    "WorkloadPriorityClass",
                    &json!({"metadata": {"name": "v"}, "value": "high"})
                )
                .expect_err("value")
                .field,
            "value"
        );
    }

    #[test]
    fn a_pod_uses_its_containers_sum_and_its_largest_init_container() {
        let container = |init: bool, cpu: &str| super::super::extended::ContainerResources {
            name: "c".into(),
            init,
            requests: BTreeMap::from([("cpu".to_string(), cpu.to_string())]),
        };
        let usage = pod_usage(
            &[
                container(true, "3"),
                container(false, "1"),
                container(false, "1"),
            ],
            &[],
            None,
        )
        .expect("usage");
        assert_eq!(usage["cpu"], 3.0);
    }
}
