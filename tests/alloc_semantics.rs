//! The allocator's decisions on small hand-made nodes. The expected answers are
//! kube-scheduler 1.37's (single-claim cases cross-checked with the Go `alloc-oracle`; the
//! differential suite covers the same rules on generated inputs).
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo, Outcome};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const NODE: &str = "node-a";

fn gpu(name: &str, memory: &str, numa: i64) -> Value {
    json!({
        "name": name,
        "attributes": {"type": {"string": "gpu"}, "resource.kubernetes.io/numaNode": {"int": numa}},
        "capacity": {"memory": {"value": memory}},
    })
}

fn slice(name: &str, pool: &str, devices: Vec<Value>) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": NODE,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }
    })
}

fn classes() -> Vec<DeviceClass> {
    serde_json::from_value(json!([
        {"metadata": {"name": "gpu"}, "spec": {
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
            "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}}]}},
        {"metadata": {"name": "mig"}, "spec": {
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}},
        {"metadata": {"name": "any"}, "spec": {}},
    ]))
    .expect("classes")
}

fn claim(name: &str, devices: Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": devices},
    }))
    .expect("claim")
}

fn allocator(slices: Vec<Value>) -> Allocator {
    let slices: Vec<ResourceSlice> = serde_json::from_value(Value::Array(slices)).expect("slices");
    Allocator::new(Features::default(), slices, classes())
}

fn allocate(alloc: &Allocator, claims: &[ResourceClaim], state: &AllocatedState) -> Outcome {
    alloc
        .allocate(&NodeInfo::named(NODE), claims, state)
        .expect("no fatal error")
}

/// "request=device,..." of one allocation.
fn picked(result: &AllocationResult) -> String {
    result
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| format!("{}={}", r.request, r.device))
        .collect::<Vec<_>>()
        .join(",")
}

fn only(outcome: Outcome) -> AllocationResult {
    match outcome {
        Outcome::Allocated(mut r) => r.remove(0),
        other => panic!("not allocated: {other:?}"),
    }
}

fn exact(name: &str, class: &str, extra: Value) -> Value {
    let mut body = json!({"deviceClassName": class});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    json!({"name": name, "exactly": body})
}

#[test]
fn backtracks_to_satisfy_a_numa_constraint() {
    let alloc = allocator(vec![slice(
        "s",
        NODE,
        vec![
            gpu("gpu-0", "40Gi", 0),
            gpu("gpu-1", "80Gi", 1),
            gpu("gpu-2", "80Gi", 1),
        ],
    )]);
    let c = claim(
        "pair",
        json!({
            "requests": [exact("a", "gpu", json!({})), exact("b", "gpu", json!({}))],
            "constraints": [{"requests": ["a", "b"], "matchAttribute": "resource.kubernetes.io/numaNode"}],
        }),
    );
    let result = only(allocate(&alloc, &[c], &AllocatedState::new()));
    assert_eq!(picked(&result), "a=gpu-1,b=gpu-2");
}

#[test]
fn pools_are_searched_by_name_and_in_use_devices_skipped() {
    let alloc = allocator(vec![
        slice("z", "zzz-pool", vec![gpu("gpu-0", "80Gi", 0)]),
        slice(
            "a",
            "aaa-pool",
            vec![gpu("gpu-0", "80Gi", 0), gpu("gpu-1", "80Gi", 0)],
        ),
    ]);
    let features = Features::default();
    let mut state = AllocatedState::new();
    let mut order = Vec::new();
    for i in 0..4 {
        let c = claim(
            &format!("c{i}"),
            json!({"requests": [exact("r", "gpu", json!({}))]}),
        );
        match allocate(&alloc, &[c], &state) {
            Outcome::Allocated(results) => {
                let r = &results[0];
                let d = &r.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
                order.push(format!("{}/{}", d.pool, d.device));
                state.mark("c", r, &features).unwrap();
            }
            Outcome::Unsatisfiable { reason } => {
                assert_eq!(reason, None);
                order.push("-".into());
            }
        }
    }
    assert_eq!(
        order,
        ["aaa-pool/gpu-0", "aaa-pool/gpu-1", "zzz-pool/gpu-0", "-"]
    );
}

#[test]
fn first_available_falls_back_and_names_the_subrequest() {
    let alloc = allocator(vec![slice("s", NODE, vec![gpu("gpu-0", "40Gi", 0)])]);
    let c = claim(
        "fa",
        json!({
            "requests": [{"name": "r", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu", "count": 2},
                {"name": "small", "deviceClassName": "gpu"},
            ]}],
            "config": [{"requests": ["r/small"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}],
        }),
    );
    let result = only(allocate(&alloc, &[c], &AllocatedState::new()));
    assert_eq!(picked(&result), "r/small=gpu-0");
    let config = serde_json::to_value(&result.devices.as_ref().unwrap().config).unwrap();
    // The class config names the chosen subrequest; both configs cover every request.
    assert_eq!(
        config,
        json!([
            {"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}}},
            {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}},
        ])
    );
}

/// One pool in two slices: counter set gpu-0 with `slices` counters `slice-N` of 1 each, and
/// the devices drawing on them.
fn gpu_with_counter_slices(slices: usize, devices: Vec<Value>) -> Vec<Value> {
    let mut counters = serde_json::Map::new();
    for s in 0..slices {
        counters.insert(format!("slice-{s}"), json!({"value": "1"}));
    }
    let mut counter_slice = slice("counters", NODE, vec![]);
    let spec = &mut counter_slice["spec"];
    spec.as_object_mut().expect("spec").remove("devices");
    spec["sharedCounters"] = json!([{"name": "gpu-0", "counters": counters}]);
    spec["pool"]["resourceSliceCount"] = json!(2);
    let mut device_slice = slice("devices", NODE, devices);
    device_slice["spec"]["pool"]["resourceSliceCount"] = json!(2);
    vec![counter_slice, device_slice]
}

/// MIG placements of one GPU share its counters: once the whole GPU is taken no
/// placement fits, and two overlapping placements cannot both be taken.
#[test]
fn shared_counters_block_overlapping_partitions() {
    let counters = |slices: &[usize]| {
        let mut m = serde_json::Map::new();
        for s in slices {
            m.insert(format!("slice-{s}"), json!({"value": "1"}));
        }
        json!([{"counterSet": "gpu-0", "counters": m}])
    };
    let mut whole = gpu("gpu-0", "80Gi", 0);
    whole["consumesCounters"] = counters(&[0, 1]);
    let mut low = gpu("gpu-0-mig-0", "40Gi", 0);
    low["attributes"]["type"] = json!({"string": "mig"});
    low["consumesCounters"] = counters(&[0]);
    let mut high = low.clone();
    high["name"] = json!("gpu-0-mig-1");
    high["consumesCounters"] = counters(&[1]);
    let alloc = allocator(gpu_with_counter_slices(2, vec![whole, low, high]));

    let two_migs = claim(
        "two",
        json!({"requests": [exact("m", "mig", json!({"count": 2}))]}),
    );
    assert_eq!(
        picked(&only(allocate(&alloc, &[two_migs], &AllocatedState::new()))),
        "m=gpu-0-mig-0,m=gpu-0-mig-1"
    );

    let mut state = AllocatedState::new();
    let whole_gpu = claim("whole", json!({"requests": [exact("g", "gpu", json!({}))]}));
    let result = only(allocate(&alloc, &[whole_gpu], &state));
    state.mark("whole", &result, &Features::default()).unwrap();
    let one_mig = claim("one", json!({"requests": [exact("m", "mig", json!({}))]}));
    assert_eq!(
        allocate(&alloc, &[one_mig], &state),
        Outcome::Unsatisfiable { reason: None }
    );
}

#[test]
fn taints_need_tolerations_and_admin_access_ignores_use() {
    let mut tainted = gpu("gpu-0", "80Gi", 0);
    tainted["taints"] = json!([{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]);
    let alloc = allocator(vec![slice("s", NODE, vec![tainted])]);
    let plain = claim("plain", json!({"requests": [exact("r", "gpu", json!({}))]}));
    assert_eq!(
        allocate(&alloc, &[plain], &AllocatedState::new()),
        Outcome::Unsatisfiable { reason: None }
    );

    let tolerant = claim(
        "tolerant",
        json!({"requests": [exact("r", "gpu", json!({
        "tolerations": [{"key": "maintenance", "operator": "Exists"}]}))]}),
    );
    let result = only(allocate(
        &alloc,
        std::slice::from_ref(&tolerant),
        &AllocatedState::new(),
    ));
    let r = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(
        serde_json::to_value(&r.tolerations).unwrap(),
        json!([{"key": "maintenance", "operator": "Exists"}])
    );

    let mut state = AllocatedState::new();
    state
        .mark("tolerant", &result, &Features::default())
        .unwrap();
    let admin = claim(
        "admin",
        json!({"requests": [exact("r", "gpu", json!({
        "adminAccess": true, "tolerations": [{"operator": "Exists"}]}))]}),
    );
    let result = only(allocate(&alloc, &[admin], &state));
    let r = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!((r.device.as_str(), r.admin_access), ("gpu-0", Some(true)));
}

#[test]
fn shares_of_a_device_consume_its_capacity() {
    let shared = json!({
        "name": "shared-0",
        "allowMultipleAllocations": true,
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
            "default": "10Gi", "validRange": {"min": "10Gi", "step": "10Gi"}}}},
    });
    let alloc = allocator(vec![slice("s", NODE, vec![shared])]);
    let features = Features::default();
    let mut state = AllocatedState::new();
    let mut consumed = Vec::new();
    for i in 0..4 {
        let c = claim(
            &format!("c{i}"),
            json!({"requests": [exact("r", "gpu", json!({
            "capacity": {"requests": {"memory": "25Gi"}}}))]}),
        );
        match allocate(&alloc, &[c], &state) {
            Outcome::Allocated(results) => {
                let r = &results[0]
                    .devices
                    .as_ref()
                    .unwrap()
                    .results
                    .as_ref()
                    .unwrap()[0];
                assert!(r.share_id.is_some());
                consumed.push(r.consumed_capacity.as_ref().unwrap()["memory"].0.clone());
                state.mark("c", &results[0], &features).unwrap();
            }
            Outcome::Unsatisfiable { .. } => consumed.push("-".into()),
        }
    }
    // 25Gi rounds up to the 10Gi step: 30Gi each, two fit into 80Gi.
    assert_eq!(consumed, ["30Gi", "30Gi", "-", "-"]);
}

#[test]
fn all_mode_takes_every_match_and_fails_on_incomplete_pools() {
    let alloc = allocator(vec![slice(
        "s",
        NODE,
        vec![gpu("gpu-0", "80Gi", 0), gpu("gpu-1", "40Gi", 0)],
    )]);
    let all = claim(
        "all",
        json!({"requests": [exact("r", "gpu", json!({"allocationMode": "All"}))]}),
    );
    assert_eq!(
        picked(&only(allocate(
            &alloc,
            std::slice::from_ref(&all),
            &AllocatedState::new()
        ))),
        "r=gpu-0,r=gpu-1"
    );

    let mut partial = slice("half", "half", vec![gpu("h-0", "80Gi", 0)]);
    partial["spec"]["pool"]["resourceSliceCount"] = json!(2);
    let alloc = allocator(vec![
        slice("s", NODE, vec![gpu("gpu-0", "80Gi", 0)]),
        partial,
    ]);
    let err = alloc
        .allocate(&NodeInfo::named(NODE), &[all], &AllocatedState::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "claim default/all, request r: asks for all devices, but resource pool gpu.nvidia.com/half is currently being updated"
    );
}

#[test]
fn invalid_pools_are_reported_when_nothing_fits() {
    // A complete pool (both slices announce two) with a device name published twice: invalid.
    let two = |name: &str| {
        let mut s = slice(name, "dup", vec![gpu("same", "80Gi", 0)]);
        s["spec"]["pool"]["resourceSliceCount"] = json!(2);
        s
    };
    let alloc = allocator(vec![two("a"), two("b")]);
    let c = claim("c", json!({"requests": [exact("r", "gpu", json!({}))]}));
    let outcome = allocate(&alloc, &[c], &AllocatedState::new());
    assert_eq!(
        outcome,
        Outcome::Unsatisfiable {
            reason: Some("invalid resource pools were encountered".into())
        }
    );
    // The same devices in an incomplete pool (one slice of two) are not an invalid pool: the node
    // is filtered out without a reason.
    let alloc = allocator(vec![two("a")]);
    let c = claim("c", json!({"requests": [exact("r", "gpu", json!({}))]}));
    let outcome = allocate(&alloc, &[c], &AllocatedState::new());
    assert_eq!(outcome, Outcome::Unsatisfiable { reason: None });
}

#[test]
fn cel_errors_abort_with_the_schedulers_text() {
    let alloc = allocator(vec![slice("s", NODE, vec![gpu("gpu-0", "80Gi", 0)])]);
    let c = claim(
        "bad",
        json!({"requests": [exact("r", "any", json!({
        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}))]}),
    );
    let err = alloc
        .allocate(&NodeInfo::named(NODE), &[c], &AllocatedState::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "claim default/bad: selector #0 on device gpu.nvidia.com/node-a/gpu-0: CEL runtime error: \
         no such key: profile. consider using CEL optional chaining (.? followed by orValue()) or \
         guarding the check with has() for optional fields"
    );
    let missing = claim(
        "missing",
        json!({"requests": [exact("r", "nope", json!({}))]}),
    );
    let err = alloc
        .allocate(&NodeInfo::named(NODE), &[missing], &AllocatedState::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "claim default/missing, request r: could not retrieve device class nope: deviceclasses.resource.k8s.io \"nope\" not found"
    );
}

/// Several claims of one pod are allocated together: the second claim's constraint forces
/// the first claim off the first device.
#[test]
fn claims_of_one_pod_are_allocated_together() {
    let alloc = allocator(vec![slice(
        "s",
        NODE,
        vec![gpu("gpu-0", "80Gi", 0), gpu("gpu-1", "80Gi", 1)],
    )]);
    let first = claim("first", json!({"requests": [exact("r", "gpu", json!({}))]}));
    let second = claim(
        "second",
        json!({"requests": [exact("r", "gpu", json!({
        "selectors": [{"cel": {"expression": "device.attributes['resource.kubernetes.io'].numaNode == 0"}}]}))]}),
    );
    match allocate(&alloc, &[first, second], &AllocatedState::new()) {
        Outcome::Allocated(results) => {
            assert_eq!(picked(&results[0]), "r=gpu-1");
            assert_eq!(picked(&results[1]), "r=gpu-0");
        }
        other => panic!("{other:?}"),
    }
}

/// A search the scheduler cannot finish (30 distinct NUMA nodes wanted among 60 GPUs on 29)
/// gives up after the filter timeout with kube-scheduler's error instead of running for ever.
#[test]
fn a_search_past_the_filter_timeout_fails_with_the_schedulers_error() {
    let devices = (0..60)
        .map(|i| gpu(&format!("gpu-{i}"), "80Gi", i % 29))
        .collect();
    let slices: Vec<ResourceSlice> =
        serde_json::from_value(json!([slice("s", "p", devices)])).expect("slices");
    let alloc = Allocator::new(Features::default(), slices, classes())
        .with_filter_timeout(Some(std::time::Duration::from_millis(200)));
    let c = claim(
        "distinct",
        json!({
            "requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 30}}],
            "constraints": [{"distinctAttribute": "resource.kubernetes.io/numaNode"}],
        }),
    );
    let started = std::time::Instant::now();
    let err = alloc
        .allocate(&NodeInfo::named(NODE), &[c], &AllocatedState::new())
        .expect_err("the search times out");
    assert_eq!(
        err.to_string(),
        format!("node {NODE}: timed out trying to allocate devices")
    );
    // Liveness, not speed: the exhaustive search would take years.
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// Asserts the claim does not fit on the node and returns `gpu-dra explain`'s account of it.
fn refused_and_explained(
    alloc: &Allocator,
    node: &NodeInfo,
    claim: &ResourceClaim,
    state: &AllocatedState,
) -> String {
    let claims = std::slice::from_ref(claim);
    let refused = alloc.allocate(node, claims, state).expect("ok");
    assert!(
        matches!(refused, Outcome::Unsatisfiable { .. }),
        "{refused:?}"
    );
    dra_allocator::explain::explain(alloc, node, claims, state).render()
}

/// The e2e cluster's gates (alpha ones included) switch on the experimental allocator's rules.
fn gated(slices: Vec<Value>) -> Allocator {
    let gates = "DRAListTypeAttributes=true,DRAOptionalNodeOperations=true,\
                 DRADeviceCompatibilityGroups=true";
    let features = Features::from_feature_gates(gates).expect("gates");
    let slices: Vec<ResourceSlice> = serde_json::from_value(Value::Array(slices)).expect("slices");
    Allocator::new(features, slices, classes())
}

fn with_attr(mut device: Value, name: &str, value: Value) -> Value {
    device["attributes"][name] = value;
    device
}

#[test]
fn list_attributes_match_by_common_elements_with_the_gate() {
    let slices = || {
        vec![slice(
            "s",
            NODE,
            vec![
                with_attr(
                    gpu("gpu-0", "80Gi", 0),
                    "links",
                    json!({"strings": ["x", "y"]}),
                ),
                with_attr(gpu("gpu-1", "80Gi", 0), "links", json!({"strings": ["z"]})),
                with_attr(gpu("gpu-2", "80Gi", 0), "links", json!({"string": "y"})),
            ],
        )]
    };
    let c = claim(
        "pair",
        json!({
            "requests": [exact("a", "gpu", json!({"count": 2}))],
            "constraints": [{"matchAttribute": "gpu.nvidia.com/links"}],
        }),
    );
    let state = AllocatedState::new();
    // Without the gate lists never match (and a scalar only equals scalars).
    let plain = allocate(&allocator(slices()), std::slice::from_ref(&c), &state);
    assert!(matches!(plain, Outcome::Unsatisfiable { .. }), "{plain:?}");
    let node = NodeInfo::named(NODE);
    let with = gated(slices()).allocate(&node, &[c], &state).expect("ok");
    assert_eq!(picked(&only(with)), "a=gpu-0,a=gpu-2");
}

#[test]
fn skip_node_operations_need_the_gate_and_a_declaring_node() {
    let mut s = slice("s", NODE, vec![gpu("gpu-0", "80Gi", 0)]);
    s["spec"]["skipNodeOperations"] = json!(["NodePrepareResources"]);
    let c = claim("one", json!({"requests": [exact("a", "gpu", json!({}))]}));
    let state = AllocatedState::new();
    // The default (incubating) allocator does not look at the field.
    let plain = only(allocate(
        &allocator(vec![s.clone()]),
        std::slice::from_ref(&c),
        &state,
    ));
    assert_eq!(
        plain.devices.unwrap().results.unwrap()[0].skip_node_operations,
        None
    );
    let alloc = gated(vec![s]);
    let mut node = NodeInfo::named(NODE);
    let why = refused_and_explained(&alloc, &node, &c, &state);
    assert!(
        why.contains("does not declare DRAOptionalNodeOperations"),
        "{why}"
    );
    node.declared_features
        .push(dra_allocator::OPTIONAL_NODE_OPERATIONS.to_string());
    let taken = only(alloc.allocate(&node, &[c], &state).expect("ok"));
    let result = &taken.devices.unwrap().results.unwrap()[0];
    assert_eq!(
        result.skip_node_operations,
        Some(vec!["NodePrepareResources".to_string()])
    );
}

#[test]
fn compatibility_groups_keep_apart_what_cannot_share_a_gpu_and_explain_says_why() {
    let mig = |name: &str, slice: usize, groups: &[&str]| {
        let mut d = gpu(name, "10Gi", 0);
        d["attributes"]["type"] = json!({"string": "mig"});
        d["consumesCounters"] = json!([{
            "counterSet": "gpu-0",
            "counters": {format!("slice-{slice}"): {"value": "1"}},
            "compatibilityGroups": groups,
        }]);
        d
    };
    let alloc = gated(gpu_with_counter_slices(
        3,
        vec![
            mig("gpu-0-mig-a", 0, &["timeslice"]),
            mig("gpu-0-mig-b", 1, &["mps"]),
            mig("gpu-0-mig-c", 2, &["mps", "timeslice"]),
        ],
    ));
    let node = NodeInfo::named(NODE);

    let mut state = AllocatedState::new();
    let first = claim("first", json!({"requests": [exact("m", "mig", json!({}))]}));
    let result = only(alloc.allocate(&node, &[first], &state).expect("ok"));
    assert_eq!(picked(&result), "m=gpu-0-mig-a");
    state.mark("first", &result, alloc.features()).unwrap();

    // Next to a "timeslice" device only devices sharing that group fit: c, not b.
    let two = claim(
        "two",
        json!({"requests": [exact("m", "mig", json!({"count": 2}))]}),
    );
    let why = refused_and_explained(&alloc, &node, &two, &state);
    assert!(
        why.contains(
            "gpu-0-mig-b (mig): passed over: compatibility groups: counter set gpu-0 takes devices in group timeslice next to allocated gpu-0-mig-a; this device is in group mps"
        ),
        "{why}"
    );
    assert!(why.contains("gpu-0-mig-c (mig): qualifies"), "{why}");
    assert!(
        why.contains(
            "gpu-0-mig-b once gpu-0-mig-a no longer shares its counter set (compatibility groups)"
        ),
        "{why}"
    );
    let one = claim("one", json!({"requests": [exact("m", "mig", json!({}))]}));
    let result = only(alloc.allocate(&node, &[one], &state).expect("ok"));
    assert_eq!(picked(&result), "m=gpu-0-mig-c");
}
