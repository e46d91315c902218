//! Allocates one pod's claims on one node, from one JSON document on stdin, and prints what
//! kube-scheduler's allocator would return. It is how Kubernetes' own allocator test table
//! (`e2e/upstream-tables.sh`) runs against this crate: the Go side builds the objects, this
//! side allocates.
//!
//! ```text
//! cargo run -p dra-allocator --example allocate_json < request.json
//! ```
//!
//! Input (field names of `structured.Features` as in Go; absent ones are off):
//!
//! ```json
//! {"features": {"PrioritizedList": true},
//!  "allocated": {"devices": [{"driver": "d", "pool": "p", "device": "x"}],
//!                "shares": [{"driver": "d", "pool": "p", "device": "y", "shareID": "…"}],
//!                "consumedCapacity": [{"driver": "d", "pool": "p", "device": "y",
//!                                      "capacity": {"memory": "1Gi"}}]},
//!  "classes": [DeviceClass…], "slices": [ResourceSlice…], "node": Node,
//!  "claims": [ResourceClaim…], "timeoutSeconds": 10, "explain": true}
//! ```
//!
//! Output: `{"results": [AllocationResult…]}` (one per claim), `{"unsatisfiable": true,
//! "reason": "…"}` (no reason when the node is simply filtered out), `{"timedOut": true,
//! "error": "…"}` or `{"error": "…"}` (the scheduler aborts the attempt with this text); each
//! with `channel` (the Go implementation reproduced: `incubating` or `experimental`) and
//! `allocateOneInvocations` (how often the search stepped, Go's `NumAllocateOneInvocations`);
//! with `explain`, also `explanation` (what `gpu-dra explain` prints for these inputs) and
//! `explainAgrees` (whether it reached the same decision).
//! Bad input exits with status 2 and a message naming the field.
use std::collections::BTreeMap;
use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use dra_allocator::{AllocatedState, Allocator, DeviceId, Features, NodeInfo, Outcome, explain};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_quantity::Quantity;
use serde_json::{Value, json};

fn main() -> ExitCode {
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("allocate_json: stdin: {e}");
        return ExitCode::from(2);
    }
    match run(&text) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("allocate_json: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(text: &str) -> Result<Value, String> {
    let input: Value = serde_json::from_str(text).map_err(|e| format!("input: {e}"))?;
    let features = features(&input["features"])?;
    let classes: Vec<DeviceClass> = list(&input, "classes")?;
    let slices: Vec<ResourceSlice> = list(&input, "slices")?;
    let claims: Vec<ResourceClaim> = list(&input, "claims")?;
    let node = node(&input["node"])?;
    let state = allocated(&input["allocated"])?;
    let timeout = match &input["timeoutSeconds"] {
        Value::Null => None,
        v => Some(Duration::from_secs_f64(
            v.as_f64()
                .filter(|s| *s >= 0.0)
                .ok_or("timeoutSeconds: not a non-negative number")?,
        )),
    };
    // `explain` (what `gpu-dra explain` prints) on the same inputs, from an allocator of its
    // own so the search counts below stay the allocation's: it must reach the same decision.
    let explained = input["explain"].as_bool().unwrap_or(false).then(|| {
        let allocator =
            Allocator::new(features, slices.clone(), classes.clone()).with_filter_timeout(timeout);
        explain::explain(&allocator, &node, &claims, &state)
    });
    let allocator = Allocator::new(features, slices, classes).with_filter_timeout(timeout);
    let outcome = allocator.allocate(&node, &claims, &state);
    let mut answer = match outcome.clone() {
        Ok(Outcome::Allocated(results)) => json!({ "results": results }),
        Ok(Outcome::Unsatisfiable { reason }) => json!({ "unsatisfiable": true, "reason": reason }),
        Err(e) => {
            let error = e.to_string();
            json!({ "timedOut": error.ends_with("timed out trying to allocate devices"), "error": error })
        }
    };
    if let Some(explanation) = explained {
        let agrees = match (&explanation.decision, &outcome) {
            (explain::Decision::Allocated(a), Ok(Outcome::Allocated(b))) => a == b,
            (explain::Decision::Unsatisfiable(a), Ok(Outcome::Unsatisfiable { reason: b })) => {
                a == b
            }
            (explain::Decision::Error(a), Err(b)) => *a == b.0,
            _ => false,
        };
        answer["explanation"] = json!(explanation.render());
        answer["explainAgrees"] = json!(agrees);
    }
    answer["channel"] = json!(allocator.channel());
    answer["allocateOneInvocations"] = json!(allocator.allocate_one_invocations());
    Ok(answer)
}

fn list<T: serde::de::DeserializeOwned>(input: &Value, field: &str) -> Result<Vec<T>, String> {
    match &input[field] {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                serde_json::from_value(v.clone()).map_err(|e| format!("{field}[{i}]: {e}"))
            })
            .collect(),
        _ => Err(format!("{field}: not a list")),
    }
}

/// `structured.Features` by Go field name.
fn features(value: &Value) -> Result<Features, String> {
    let mut f = Features {
        admin_access: false,
        compatibility_groups: false,
        consumable_capacity: false,
        derived_attributes: false,
        device_binding_and_status: false,
        device_taints: false,
        fractional_capacity_range: false,
        list_type_attributes: false,
        optional_node_operations: false,
        partitionable_devices: false,
        prioritized_list: false,
    };
    let Some(fields) = value.as_object() else {
        return match value {
            Value::Null => Ok(f),
            _ => Err("features: not an object".into()),
        };
    };
    for (name, on) in fields {
        let on = on
            .as_bool()
            .ok_or_else(|| format!("features.{name}: not a bool"))?;
        let switch = match name.as_str() {
            "AdminAccess" => &mut f.admin_access,
            "CompatibilityGroups" => &mut f.compatibility_groups,
            "ConsumableCapacity" => &mut f.consumable_capacity,
            "DerivedAttributes" => &mut f.derived_attributes,
            "DeviceBindingAndStatus" => &mut f.device_binding_and_status,
            "DeviceTaints" => &mut f.device_taints,
            "FractionalCapacityRange" => &mut f.fractional_capacity_range,
            "ListTypeAttributes" => &mut f.list_type_attributes,
            "OptionalNodeOperations" => &mut f.optional_node_operations,
            "PartitionableDevices" => &mut f.partitionable_devices,
            "PrioritizedList" => &mut f.prioritized_list,
            _ => return Err(format!("features.{name}: unknown feature")),
        };
        *switch = on;
    }
    Ok(f)
}

/// The parts of a core/v1 Node the allocator reads.
fn node(value: &Value) -> Result<NodeInfo, String> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .ok_or("node.metadata.name: missing")?;
    let labels = match value.pointer("/metadata/labels") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| format!("node.metadata.labels: {e}"))?
        }
    };
    let declared_features = match value.pointer("/status/declaredFeatures") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| format!("node.status.declaredFeatures: {e}"))?,
    };
    Ok(NodeInfo {
        name: name.to_string(),
        labels,
        declared_features,
    })
}

fn device_id(value: &Value, at: &str) -> Result<DeviceId, String> {
    let field = |f: &str| {
        value[f]
            .as_str()
            .ok_or_else(|| format!("{at}.{f}: missing"))
    };
    Ok(DeviceId::new(
        field("driver")?,
        field("pool")?,
        field("device")?,
    ))
}

fn entries<'v>(value: &'v Value, at: &str) -> Result<&'v [Value], String> {
    match value {
        Value::Null => Ok(&[]),
        Value::Array(items) => Ok(items),
        _ => Err(format!("{at}: not a list")),
    }
}

/// The scheduler's `AllocatedState`: devices in use, shares taken, capacity consumed.
fn allocated(value: &Value) -> Result<AllocatedState, String> {
    let mut state = AllocatedState::new();
    for (i, d) in entries(&value["devices"], "allocated.devices")?
        .iter()
        .enumerate()
    {
        state
            .devices
            .insert(device_id(d, &format!("allocated.devices[{i}]"))?);
    }
    for (i, s) in entries(&value["shares"], "allocated.shares")?
        .iter()
        .enumerate()
    {
        let at = format!("allocated.shares[{i}]");
        let share = s["shareID"]
            .as_str()
            .ok_or_else(|| format!("{at}.shareID: missing"))?;
        state
            .shares
            .entry(device_id(s, &at)?)
            .or_default()
            .insert(share.to_string());
    }
    for (i, c) in entries(&value["consumedCapacity"], "allocated.consumedCapacity")?
        .iter()
        .enumerate()
    {
        let at = format!("allocated.consumedCapacity[{i}]");
        let id = device_id(c, &at)?;
        let capacity = c["capacity"]
            .as_object()
            .ok_or_else(|| format!("{at}.capacity: not an object"))?;
        let entry = state.consumed_capacity.entry(id).or_default();
        for (name, q) in capacity {
            let text = q
                .as_str()
                .ok_or_else(|| format!("{at}.capacity.{name}: not a quantity string"))?;
            let q = Quantity::parse(text).map_err(|e| format!("{at}.capacity.{name}: {e}"))?;
            entry.insert(name.clone(), q);
        }
    }
    Ok(state)
}
