//! Unit tests of conversion to v1: strict decoding with fields named by path, Go zero values,
//! defaults per version, omitempty lists and qualified keys in paths.
use super::*;
use serde_json::json;

fn claim(version: &str, requests: Value) -> Value {
    json!({
        "apiVersion": version, "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": requests}},
    })
}

fn v1_spec(obj: V1Object) -> Value {
    match obj {
        V1Object::Claim(c) => serde_json::to_value(c.spec).unwrap(),
        other => panic!("not a claim: {other:?}"),
    }
}

#[test]
fn v1beta1_exact_fields_move_under_exactly_with_defaults() {
    let doc = claim(
        "resource.k8s.io/v1beta1",
        json!([{"name": "gpu", "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": "true"}}],
            "tolerations": [{"key": "k", "effect": "NoSchedule"}]}]),
    );
    let spec = v1_spec(to_v1(Kind::ResourceClaim, Version::V1beta1, &doc).unwrap());
    assert_eq!(
        spec,
        json!({"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": "true"}}],
            "tolerations": [{"key": "k", "effect": "NoSchedule", "operator": "Equal"}],
        }}]}})
    );
}

#[test]
fn v1beta1_first_available_stays_without_exactly() {
    let doc = claim(
        "resource.k8s.io/v1beta1",
        json!([{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com"},
            {"name": "all", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
        ]}]),
    );
    let spec = v1_spec(to_v1(Kind::ResourceClaim, Version::V1beta1, &doc).unwrap());
    assert_eq!(
        spec,
        json!({"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1},
            {"name": "all", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
        ]}]}})
    );
}

#[test]
fn v1beta1_request_with_only_a_count_gets_an_empty_class() {
    // Not defaulted in v1beta1 (no class), defaulted as v1 once converted; validation
    // then names the missing class.
    let doc = claim(
        "resource.k8s.io/v1beta1",
        json!([{"name": "gpu", "count": 2}]),
    );
    let spec = v1_spec(to_v1(Kind::ResourceClaim, Version::V1beta1, &doc).unwrap());
    assert_eq!(
        spec["devices"]["requests"][0]["exactly"],
        json!({"deviceClassName": "", "count": 2, "allocationMode": "ExactCount"})
    );
}

#[test]
fn v1beta2_is_v1_with_defaults() {
    let requests =
        json!([{"name": "gpu", "exactly": {"deviceClassName": "c", "allocationMode": "All"}}]);
    let a = v1_spec(
        to_v1(
            Kind::ResourceClaim,
            Version::V1beta2,
            &claim("resource.k8s.io/v1beta2", requests.clone()),
        )
        .unwrap(),
    );
    let b = v1_spec(
        to_v1(
            Kind::ResourceClaim,
            Version::V1,
            &claim("resource.k8s.io/v1", requests),
        )
        .unwrap(),
    );
    assert_eq!(a, b);
    assert_eq!(a["devices"]["requests"][0]["exactly"].get("count"), None);
}

#[test]
fn unknown_fields_are_named_by_path() {
    let doc = claim(
        "resource.k8s.io/v1",
        json!([{"name": "gpu", "deviceClassName": "c"}]),
    );
    let err = to_v1(Kind::ResourceClaim, Version::V1, &doc).unwrap_err();
    assert_eq!(err.field, "spec.devices.requests[0].deviceClassName");
    assert_eq!(err.message, "unknown field");
    let doc = claim(
        "resource.k8s.io/v1beta1",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "c"}}]),
    );
    let err = to_v1(Kind::ResourceClaim, Version::V1beta1, &doc).unwrap_err();
    assert_eq!(err.field, "spec.devices.requests[0].exactly");
}

#[test]
fn unknown_fields_set_to_null_pass_and_deep_ones_are_named() {
    let doc = claim(
        "resource.k8s.io/v1",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "c", "colour": null}}]),
    );
    assert!(to_v1(Kind::ResourceClaim, Version::V1, &doc).is_ok());
    let doc = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": "d", "nodeName": "n",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}, {"name": "gpu-1",
                "attributes": {"a.b/c": {"string": "x", "colour": "red"}}}]},
    });
    let err = to_v1(Kind::ResourceSlice, Version::V1, &doc).unwrap_err();
    assert_eq!(err.field, "spec.devices[1].attributes[a.b/c].colour");
    assert_eq!(err.message, "unknown field");
}

#[test]
fn nulls_are_read_as_go_zero_values() {
    // A null list item is an empty one (validated as such later), a null quantity 0, a null
    // string "".
    let doc = claim(
        "resource.k8s.io/v1",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "c",
            "selectors": [null, {"cel": {"expression": "true"}}],
            "capacity": {"requests": {"memory": null}}}}, null]),
    );
    let spec = v1_spec(to_v1(Kind::ResourceClaim, Version::V1, &doc).unwrap());
    let requests = &spec["devices"]["requests"];
    assert_eq!(requests[0]["exactly"]["selectors"][0], json!({}));
    assert_eq!(
        requests[0]["exactly"]["selectors"][1]["cel"]["expression"],
        "true"
    );
    assert_eq!(
        requests[0]["exactly"]["capacity"]["requests"]["memory"],
        "0"
    );
    assert_eq!(requests[1]["name"], "");
    let mut doc = claim("resource.k8s.io/v1beta1", json!([{"name": "gpu"}]));
    doc["spec"]["devices"]["constraints"] = json!([{"requests": ["gpu", null]}]);
    let spec = v1_spec(to_v1(Kind::ResourceClaim, Version::V1beta1, &doc).unwrap());
    assert_eq!(
        spec["devices"]["constraints"][0]["requests"],
        json!(["gpu", ""])
    );
}

#[test]
fn a_slices_omitted_capacity_and_counter_values_are_zero_and_an_empty_one_is_not() {
    let slice = |capacity: Value| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "s"},
            "spec": {"driver": "d", "nodeName": "n",
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "sharedCounters": [{"name": "set", "counters": {"mem": {}}}],
                "devices": [{"name": "gpu-0", "capacity": capacity,
                    "consumesCounters": [{"counterSet": "set",
                        "counters": {"mem": {"value": null}}}]}]},
        })
    };
    let decoded = |doc: &Value| match to_v1(Kind::ResourceSlice, Version::V1, doc).unwrap() {
        V1Object::Slice(s) => serde_json::to_value(s.spec).unwrap(),
        other => panic!("not a slice: {other:?}"),
    };
    // A capacity may be named `capacity` (or `counters`): only the value is filled in.
    let spec = decoded(&slice(json!({"memory": {},
        "capacity": {"value": "1", "requestPolicy": {"default": "1"}}})));
    assert_eq!(spec["devices"][0]["capacity"]["memory"]["value"], "0");
    assert_eq!(
        spec["devices"][0]["capacity"]["capacity"],
        json!({"value": "1", "requestPolicy": {"default": "1"}})
    );
    assert_eq!(spec["sharedCounters"][0]["counters"]["mem"]["value"], "0");
    assert_eq!(
        spec["devices"][0]["consumesCounters"][0]["counters"]["mem"]["value"],
        "0"
    );
    // Written as "", the value stays "" (the API server refuses it; validation says so).
    let spec = decoded(&slice(json!({"memory": {"value": ""}})));
    assert_eq!(spec["devices"][0]["capacity"]["memory"]["value"], "");
}

#[test]
fn type_errors_are_named_by_path() {
    let doc = claim(
        "resource.k8s.io/v1",
        json!([{"name": "gpu", "exactly": {"deviceClassName": "c", "count": "two"}}]),
    );
    let err = to_v1(Kind::ResourceClaim, Version::V1, &doc).unwrap_err();
    assert_eq!(err.field, "spec.devices.requests[0].exactly.count");
    assert!(err.message.contains("invalid type"), "{err:?}");
}

#[test]
fn v1beta1_slices_flatten_basic_devices() {
    let doc = json!({
        "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {"driver": "d", "nodeName": "n", "allNodes": false,
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "basic": {
                "attributes": {"type": {"string": "gpu"}},
                "capacity": {"memory": {"value": "80Gi"}}}}]},
    });
    let V1Object::Slice(slice) = to_v1(Kind::ResourceSlice, Version::V1beta1, &doc).unwrap() else {
        panic!("not a slice")
    };
    let spec = serde_json::to_value(&slice.spec).unwrap();
    assert_eq!(spec.get("allNodes"), None);
    assert_eq!(spec["nodeName"], "n");
    assert_eq!(
        spec["devices"][0],
        json!({"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
            "capacity": {"memory": {"value": "80Gi"}}})
    );
}

#[test]
fn empty_lists_go_as_with_omitempty() {
    let mut v = json!({"devices": {"requests": [], "constraints": []},
        "exactly": {"selectors": [], "deviceClassName": "c"},
        "metadata": {"labels": {}, "annotations": {"a": "b"}},
        "spec": {}, "nodeSelector": {"nodeSelectorTerms": []}});
    omit_empty(&mut v);
    assert_eq!(
        v,
        json!({"devices": {"requests": []}, "exactly": {"deviceClassName": "c"},
            "metadata": {"annotations": {"a": "b"}}, "spec": {},
            "nodeSelector": {"nodeSelectorTerms": []}})
    );
}

#[test]
fn child_paths_bracket_qualified_keys() {
    assert_eq!(child("", "spec"), "spec");
    assert_eq!(child("a", "b"), "a.b");
    assert_eq!(
        child("attributes", "gpu.nvidia.com/x"),
        "attributes[gpu.nvidia.com/x]"
    );
}
