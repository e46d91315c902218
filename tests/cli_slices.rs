//! `gpu-dra slices` and `gpu-dra sim` as a user runs them: separate processes sharing the
//! simulator's state file.
use std::process::{Command, Output};

fn gpu_dra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("GPU_DRA_GPUS")
        .output()
        .expect("runs")
}

fn stdout(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn device_names(list: &serde_json::Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().expect("name").to_string())
        .collect()
}

/// A simulated node of two H100s, node `n1`, whose hardware lives in `state`.
fn two_h100s(state: &str) -> [&str; 6] {
    [
        "--gpus",
        "sim:2xH100-SXM5-80GB",
        "--node-name",
        "n1",
        "--sim-state",
        state,
    ]
}

#[test]
fn prints_a_v1_list_of_one_pool() {
    let list = stdout(&gpu_dra(&[
        "slices",
        "--gpus",
        "sim:8xH100-SXM5-80GB",
        "--mig",
        "static",
        "--node-name",
        "n1",
        "-o",
        "json",
    ]));
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    let item = &list["items"][0];
    assert_eq!(item["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(item["kind"], "ResourceSlice");
    assert_eq!(item["spec"]["pool"]["name"], "n1");
    assert_eq!(
        device_names(&list),
        (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>()
    );
}

#[test]
fn yaml_is_the_default_and_parses_back() {
    let out = gpu_dra(&["slices", "--gpus", "sim:1xT4", "--node-name", "n1"]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_yaml_ng::from_slice(&out.stdout).expect("YAML");
    assert_eq!(
        doc["items"][0]["spec"]["devices"][0]["attributes"]["productName"]["string"],
        "Tesla T4"
    );
}

#[test]
fn mig_instances_made_in_one_process_show_in_another() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8");
    let common = two_h100s(state);
    let sim = |extra: &[&str]| {
        let mut args = vec!["sim"];
        args.extend(common);
        args.extend(extra);
        let out = gpu_dra(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sim(&["mig-mode", "--gpu", "1", "--enabled", "true"]);
    sim(&[
        "create",
        "--gpu",
        "1",
        "--profile",
        "3g.40gb",
        "--start",
        "4",
    ]);
    sim(&["create", "--gpu", "1", "--profile", "1g.10gb"]);
    let mut args = vec!["slices", "-o", "json", "--mig", "static"];
    args.extend(common);
    let list = stdout(&gpu_dra(&args));
    assert_eq!(
        device_names(&list),
        ["gpu-0", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-3g40gb-9-4"]
    );
    // Under the default policy GPU 0 is dynamic, while GPU 1 keeps the MIG devices someone
    // else made (static): they are never offered for carving over.
    let mut args = vec!["slices", "-o", "json"];
    args.extend(common);
    let names = device_names(&stdout(&gpu_dra(&args)));
    assert_eq!(names.len(), 26 + 2);
    assert!(names.contains(&"gpu-0-mig-7g80gb-0-0".to_string()));
    assert!(!names.iter().any(|n| n.starts_with("gpu-1-mig-7g80gb")));
    // The occupied placement is refused by the "hardware" in a third process.
    let mut args = vec!["sim"];
    args.extend(common);
    args.extend([
        "create",
        "--gpu",
        "1",
        "--profile",
        "4g.40gb",
        "--start",
        "0",
    ]);
    let out = gpu_dra(&args);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("insufficient resources"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_specs_fail_clearly() {
    for (spec, needle) in [
        ("sim:8xH999", "unknown model \"H999\""),
        ("sim:", "no GPUs"),
        ("gpus", "expected `nvml` or `sim:"),
        ("sim:8H100-SXM5-80GB", "not <N>x<MODEL>"),
    ] {
        let out = gpu_dra(&["slices", "--gpus", spec, "--node-name", "n1"]);
        assert!(!out.status.success(), "{spec} must fail");
        assert!(
            out.stdout.is_empty(),
            "nothing printed on stdout for {spec}"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--gpus") && err.contains(needle),
            "{spec}: {err}"
        );
    }
    let out = gpu_dra(&["slices", "--gpus", "sim:1xT4", "--node-name", "Bad_Node"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"Bad_Node\" is not a DNS subdomain"), "{err}");
}

/// `gpu-dra slices --passthrough` says, per GPU, whether it is offered to virtual machines and
/// why not, as the node agent logs at start.
#[test]
fn slices_with_passthrough_say_why_a_gpu_is_not_offered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8 path");
    let node = two_h100s(state);
    let mut mig = vec!["sim"];
    mig.extend(node);
    mig.extend(["mig-mode", "--gpu", "1", "--enabled", "true"]);
    assert!(gpu_dra(&mig).status.success(), "MIG mode on");
    let mut args = vec!["slices", "--passthrough", "--mig", "off", "-o", "json"];
    args.extend(node);
    let out = gpu_dra(&args);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = |device: &str| {
        err.lines()
            .find(|l| l.contains(&format!("device={device}")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("gpu-vfio-0").contains("GPU offered to virtual machines"),
        "{err}"
    );
    let refused = line("gpu-vfio-1");
    assert!(
        refused.contains("GPU not offered to virtual machines") && refused.contains("MIG"),
        "{err}"
    );
    // Static MIG: the GPU in MIG mode off is published whole, and offered; the other is not.
    let mut args = vec!["slices", "--passthrough", "--mig", "static", "-o", "json"];
    args.extend(node);
    let out = gpu_dra(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    let list = stdout(&out);
    let vfio: Vec<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .flat_map(|slice| {
            slice["spec"]["devices"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| {
            d["name"]
                .as_str()
                .filter(|n| n.starts_with("gpu-vfio-"))
                .map(String::from)
        })
        .collect();
    assert_eq!(vfio, ["gpu-vfio-0"], "{err}");
    assert!(
        err.contains("its MIG devices are offered (static MIG)"),
        "{err}"
    );
}

/// `gpu-dra usage` reads what the per-claim metrics would: each GPU's memory in use,
/// utilization and compute processes (the simulator's, started with `gpu-dra sim process`).
#[test]
fn usage_reports_memory_utilization_and_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8 path");
    let node = two_h100s(state);
    let mut start = vec!["sim"];
    start.extend(node);
    start.extend([
        "process",
        "--gpu",
        "1",
        "--pid",
        "4242",
        "--memory-mib",
        "2048",
        "--sm-percent",
        "60",
    ]);
    assert!(gpu_dra(&start).status.success(), "sim process");
    let mut args = vec!["usage"];
    args.extend(node);
    let report = stdout(&gpu_dra(&args));
    let gpus = report["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["device"], "gpu-0");
    assert_eq!(gpus[0]["processes"], serde_json::json!([]));
    assert_eq!(gpus[1]["utilizationPercent"], 60);
    let processes = gpus[1]["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0]["pid"], 4242);
    assert_eq!(processes[0]["memoryUsedBytes"], 2048u64 << 20);
    assert!(
        gpus[1]["memoryUsedBytes"].as_u64().expect("memory") >= 2048 << 20,
        "{report}"
    );
}

/// `gpu-dra health` reads what the driver's watcher would: every GPU registered for fault events,
/// its liveness and recovery action; a fault during the wait and a lost GPU fail it, and say so.
#[test]
fn health_reports_registration_faults_and_lost_gpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("hw.json");
    let state = state.to_str().expect("utf-8 path");
    let node = two_h100s(state);
    let health = |wait: &str| {
        let mut args = vec!["health", "--wait", wait];
        args.extend(node);
        gpu_dra(&args)
    };

    let healthy = stdout(&health("100ms"));
    let gpus = healthy["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2);
    for gpu in gpus {
        assert_eq!(gpu["faultEvents"], "registered", "{gpu}");
        assert_eq!(gpu["lost"], false, "{gpu}");
        assert_eq!(gpu["recoveryAction"], "None", "{gpu}");
    }
    assert_eq!(healthy["events"], serde_json::json!([]));

    // An XID raised while `health` waits is reported, and fails it.
    let faulted = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| health("3s"));
        std::thread::sleep(std::time::Duration::from_millis(800));
        let mut inject = vec!["sim"];
        inject.extend(node);
        inject.extend(["inject", "--gpu", "1", "--xid", "48"]);
        assert!(gpu_dra(&inject).status.success(), "inject");
        waiting.join().expect("health thread")
    });
    assert_eq!(faulted.status.code(), Some(1), "a fault fails the check");
    let report: serde_json::Value = serde_json::from_slice(&faulted.stdout).expect("JSON");
    let events = report["events"].as_array().expect("events");
    assert!(
        events
            .iter()
            .any(|e| e["minor"] == 1 && e["kind"]["code"] == 48),
        "XID 48 on GPU 1 in {events:?}"
    );

    // A GPU that stops answering is lost, and not watched.
    let mut lose = vec!["sim"];
    lose.extend(node);
    lose.extend(["inject", "--gpu", "0", "--lost"]);
    assert!(gpu_dra(&lose).status.success(), "lose");
    let lost = health("100ms");
    assert_eq!(lost.status.code(), Some(1), "a lost GPU fails the check");
    let report: serde_json::Value = serde_json::from_slice(&lost.stdout).expect("JSON");
    let gpu0 = report["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["device"] == "gpu-0")
        .cloned();
    assert!(
        gpu0.as_ref().is_some_and(|g| g["lost"] == true),
        "gpu-0 lost in {report}"
    );
}

/// `gpu-dra templates` is `gpu-dra slices` of the model less each GPU's own UUIDs: in both
/// forms, for every device, with the same flags.
#[test]
fn templates_are_the_published_slices_less_the_gpus_uuids() {
    let model = "sim:2xH100-SXM5-80GB";
    let published = stdout(&gpu_dra(&[
        "slices",
        "--gpus",
        model,
        "--node-name",
        "n1",
        "--mig",
        "dynamic",
        "-o",
        "json",
    ]));
    let as_slices = stdout(&gpu_dra(&[
        "templates",
        "--gpus",
        model,
        "--node-name",
        "n1",
        "--mig",
        "dynamic",
        "--form",
        "slices",
        "-o",
        "json",
    ]));
    let mut stripped = published.clone();
    for slice in stripped["items"].as_array_mut().expect("items") {
        // `get_mut`: indexing would add `devices: null` to the counter sets' slice.
        let devices = slice["spec"]
            .get_mut("devices")
            .and_then(|d| d.as_array_mut());
        for device in devices.into_iter().flatten() {
            let attributes = device["attributes"].as_object_mut().expect("attributes");
            // A GPU has its UUID; a MIG placement not yet made, its GPU's.
            let removed = [attributes.remove("uuid"), attributes.remove("parentUUID")];
            assert!(removed.iter().any(Option::is_some), "{device}");
        }
    }
    assert_eq!(as_slices, stripped);

    let karpenter = stdout(&gpu_dra(&[
        "templates",
        "--gpus",
        model,
        "--mig",
        "dynamic",
        "-o",
        "json",
    ]));
    let templates = karpenter["resourceSliceTemplates"]
        .as_array()
        .expect("templates");
    assert_eq!(
        templates.len(),
        published["items"].as_array().expect("items").len()
    );
    let names: Vec<String> = templates
        .iter()
        .flat_map(|t| t["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().expect("name").to_string())
        .collect();
    assert_eq!(names, device_names(&published));
    assert_eq!(templates[0]["pool"], "template");
    let bindings = karpenter["attributeBindings"].as_array().expect("bindings");
    assert_eq!(bindings.len(), 2, "one per GPU: {bindings:?}");
    assert_eq!(bindings[0]["attribute"], "gpu.nvidia.com/parentUUID");
}
