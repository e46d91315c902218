//! NVIDIA's own demo specs (`tests/fixtures/manifests/nvidia-demo/`: kubernetes-sigs/
//! dra-driver-nvidia-gpu `demo/specs` verbatim) through `gpu-dra match` on simulated nodes with
//! the stock DeviceClasses: each allocates what NVIDIA's README says it does, and the stale ones
//! (API versions no longer served, a DeviceClass NVIDIA's chart no longer ships, an attribute no
//! driver publishes) fail as the API server or kube-scheduler fails them, naming what.
//!
//! This is offline allocation through our copy of the scheduler's allocator, not pods: the
//! scenarios themselves run as pods on the real node in `e2e/pods.sh`.
#![cfg(feature = "tools")]
mod common;
use common::{gpu_dra, repo, text};
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn spec(path: &str) -> String {
    repo(&format!("tests/fixtures/manifests/nvidia-demo/{path}"))
}

/// `gpu-dra match` of one spec file on `slices` (`sim:...` or a file), stock classes.
fn match_spec(slices: &str, file: &str, extra: &[&str]) -> Output {
    let classes = repo("deviceclasses");
    let file = spec(file);
    let mut args = vec![
        "match",
        "--slices",
        slices,
        "--classes",
        &classes,
        "-f",
        &file,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    gpu_dra(&args)
}

/// `gpu-dra slices` of `gpus` with `--consumable-shares shares` (and `extra` flags), written into
/// `dir`; its path.
fn shared_slices(dir: &Path, gpus: &str, shares: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "slices",
        "--gpus",
        gpus,
        "--node-name",
        "node-shared",
        "--consumable-shares",
        shares,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = gpu_dra(&args);
    assert!(out.status.success(), "{shares}: {}", text(&out.stderr));
    let path = dir.join(format!("{shares}{}.json", extra.join("")));
    std::fs::write(&path, &out.stdout).expect("write");
    path.to_str().expect("utf-8").to_string()
}

/// One allocated claim: its name, `(request, device)` per result, each result's consumed
/// capacity, and the sharing strategy of each opaque config it carries.
#[derive(Debug)]
struct Allocated {
    name: String,
    devices: Vec<(String, String)>,
    consumed: Vec<Value>,
    strategies: Vec<String>,
}

fn allocated(out: &Output) -> Vec<Allocated> {
    assert!(
        out.status.success(),
        "exit {:?}\nstderr: {}",
        out.status.code(),
        text(&out.stderr)
    );
    let value: Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    let items = if value["kind"] == "List" {
        value["items"].as_array().cloned().unwrap_or_default()
    } else {
        vec![value]
    };
    items
        .iter()
        .map(|claim| {
            let devices = &claim["status"]["allocation"]["devices"];
            let results = devices["results"].as_array().cloned().unwrap_or_default();
            Allocated {
                name: claim["metadata"]["name"].as_str().unwrap_or("").into(),
                devices: results
                    .iter()
                    .map(|r| {
                        (
                            r["request"].as_str().unwrap_or("").into(),
                            r["device"].as_str().unwrap_or("").into(),
                        )
                    })
                    .collect(),
                consumed: results
                    .iter()
                    .map(|r| r["consumedCapacity"].clone())
                    .collect(),
                strategies: devices["config"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|c| c["opaque"]["parameters"]["sharing"]["strategy"].as_str())
                    .map(String::from)
                    .collect(),
            }
        })
        .collect()
}

fn devices_of(claim: &Allocated) -> Vec<&str> {
    claim.devices.iter().map(|(_, d)| d.as_str()).collect()
}

/// The quickstart specs in both API versions NVIDIA ships them in: GPUs of their own per pod,
/// one GPU shared by a pod's containers or by two pods, time-slicing and MPS configs handed to
/// the driver with the allocation.
#[test]
fn quickstart_specs_allocate_as_nvidias_readme_says() {
    let node = "sim:2xH100-SXM5-80GB";
    for version in ["v1", "v1beta1"] {
        let quickstart = |name: &str| {
            allocated(&match_spec(
                node,
                &format!("quickstart/{version}/{name}"),
                &[],
            ))
        };
        // gpu-test1: two pods, one container each, each its own GPU.
        let claims = quickstart("gpu-test1.yaml");
        assert_eq!(claims.len(), 2, "{version}: {claims:?}");
        assert_eq!(devices_of(&claims[0]), ["gpu-0"], "{version}");
        assert_eq!(devices_of(&claims[1]), ["gpu-1"], "{version}");

        // gpu-test2: one pod, two containers sharing one claim's GPU.
        let claims = quickstart("gpu-test2.yaml");
        assert_eq!(claims.len(), 1, "{version}: {claims:?}");
        assert_eq!(devices_of(&claims[0]), ["gpu-0"], "{version}");

        // gpu-test3: one global claim two pods share.
        let claims = quickstart("gpu-test3.yaml");
        assert_eq!(claims.len(), 1, "{version}: {claims:?}");
        assert_eq!(claims[0].name, "single-gpu", "{version}");

        // gpu-test5: two GPUs in one claim, one time-sliced, one shared through MPS.
        let claims = quickstart("gpu-test5.yaml");
        assert_eq!(claims.len(), 1, "{version}: {claims:?}");
        assert_eq!(
            claims[0].devices,
            [
                ("ts-gpu".to_string(), "gpu-0".to_string()),
                ("mps-gpu".to_string(), "gpu-1".to_string())
            ],
            "{version}"
        );
        assert_eq!(claims[0].strategies, ["TimeSlicing", "MPS"], "{version}");

        // gpu-test-mps: two containers of one pod on one GPU through MPS.
        let claims = quickstart("gpu-test-mps.yaml");
        assert_eq!(claims.len(), 1, "{version}: {claims:?}");
        assert_eq!(claims[0].strategies, ["MPS"], "{version}");
    }

    // gpu-test7: two claims of one pod, distinct GPUs; gpu-test8: one claim of two GPUs.
    let claims = allocated(&match_spec(node, "quickstart/gpu-test7.yaml", &[]));
    assert_eq!(claims.len(), 2, "{claims:?}");
    assert_ne!(devices_of(&claims[0]), devices_of(&claims[1]));
    let claims = allocated(&match_spec(node, "quickstart/gpu-test8.yaml", &[]));
    assert_eq!(devices_of(&claims[0]), ["gpu-0", "gpu-1"]);
}

/// gpu-test4: four MIG devices (1g.5gb twice, 2g.10gb, 3g.20gb) of one A100-40GB, held together
/// by `matchAttribute: gpu.nvidia.com/parentUUID`, on A100s an admin put in MIG mode.
#[test]
fn gpu_test4_gets_four_mig_devices_of_one_a100() {
    let dir = tempfile::tempdir().expect("tmp");
    let state = dir.path().join("sim.json");
    let state = state.to_str().expect("utf-8");
    let node = [
        "--gpus",
        "sim:2xA100-SXM4-40GB",
        "--node-name",
        "node-a100",
        "--sim-state",
        state,
    ];
    for gpu in ["0", "1"] {
        for step in [
            &["mig-mode", "--gpu", gpu, "--enabled", "true"][..],
            &["reset", "--gpu", gpu][..],
        ] {
            let mut args = vec!["sim"];
            args.extend_from_slice(&node);
            args.extend_from_slice(step);
            let out = gpu_dra(&args);
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
    }
    let mut args = vec!["slices"];
    args.extend_from_slice(&node);
    args.extend_from_slice(&["-o", "json"]);
    let out = gpu_dra(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let slices = dir.path().join("slices.json");
    std::fs::write(&slices, &out.stdout).expect("write");
    let slices = slices.to_str().expect("utf-8");

    // Without MIG mode the same spec cannot fit: no A100 offers MIG devices then.
    let out = match_spec("sim:2xA100-SXM4-40GB", "quickstart/v1/gpu-test4.yaml", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    for version in ["v1", "v1beta1"] {
        let claims = allocated(&match_spec(
            slices,
            &format!("quickstart/{version}/gpu-test4.yaml"),
            &[],
        ));
        assert_eq!(claims.len(), 1, "{version}: {claims:?}");
        let devices = devices_of(&claims[0]);
        let profiles: Vec<&str> = devices
            .iter()
            .map(|d| d.split('-').nth(3).unwrap_or(""))
            .collect();
        assert_eq!(
            profiles,
            ["1g5gb", "1g5gb", "2g10gb", "3g20gb"],
            "{version}: {devices:?}"
        );
        assert!(
            devices.iter().all(|d| d.starts_with("gpu-0-mig-")),
            "{version}: one parent GPU: {devices:?}"
        );
    }
}

/// Consumable shares (`--consumable-shares memory|unlimited|4`, NVIDIA's values): every replica
/// of each demo Deployment lands on the same GPU, consuming what the demo says.
#[test]
fn consumable_share_demos_put_every_replica_on_one_gpu() {
    let dir = tempfile::tempdir().expect("tmp");
    for (shares, file, replicas, consumed) in [
        (
            "memory",
            "consumable-shares/memory-sharing.yaml",
            2,
            serde_json::json!({"memory": "4Gi"}),
        ),
        (
            "unlimited",
            "consumable-shares/unlimited-sharing.yaml",
            2,
            serde_json::json!({"memory": "0"}),
        ),
        (
            "4",
            "consumable-shares/integer-sharing.yaml",
            4,
            serde_json::json!({"memory": "0", "shares": "1"}),
        ),
    ] {
        let slices = shared_slices(
            dir.path(),
            "sim:2xH100-SXM5-80GB",
            shares,
            &["--mig", "off"],
        );
        let claims = allocated(&match_spec(&slices, file, &["--replicas"]));
        assert_eq!(claims.len(), replicas, "{shares}: {claims:?}");
        for claim in &claims {
            assert_eq!(devices_of(claim), ["gpu-0"], "{shares}: {claim:?}");
            assert_eq!(
                claim.consumed,
                std::slice::from_ref(&consumed),
                "{shares}: {claim:?}"
            );
        }
    }
    // Without shares a GPU is one claim's: the second replica takes the other GPU.
    let claims = allocated(&match_spec(
        "sim:2xH100-SXM5-80GB",
        "consumable-shares/unlimited-sharing.yaml",
        &["--replicas"],
    ));
    assert_eq!(devices_of(&claims[0]), ["gpu-0"]);
    assert_eq!(devices_of(&claims[1]), ["gpu-1"]);
}

/// Extended resources (KEP-5004): `nvidia.com/gpu: 1` through the stock class, and the demo's
/// own DeviceClass for `nvidia.com/mig-1g.12gb` on the GH200s it was written for.
#[test]
fn extended_resource_demos_get_a_gpu_and_a_gh200_mig_device() {
    let claims = allocated(&match_spec(
        "sim:2xH100-SXM5-80GB",
        "extended-resources/gpu-full.yaml",
        &[],
    ));
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].devices[0].0, "container-0-request-0");
    assert_eq!(devices_of(&claims[0]), ["gpu-0"]);

    let claims = allocated(&match_spec(
        "sim:2xGH200-96GB",
        "extended-resources/mig-1g-12gb.yaml",
        &[],
    ));
    assert_eq!(claims.len(), 1, "{claims:?}");
    let device = devices_of(&claims[0])[0];
    assert!(device.starts_with("gpu-0-mig-1g12gb-19-"), "{device}");
    // An H100 has no 1g.12gb profile.
    let out = match_spec(
        "sim:2xH100-SXM5-80GB",
        "extended-resources/mig-1g-12gb.yaml",
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

/// The demo specs NVIDIA's driver no longer serves either fail before anything is allocated
/// (exit 2), each naming the object and what is wrong; gpu-test6's selector reads an attribute
/// (`index`) that no driver publishes, which kube-scheduler reports as a CEL runtime error.
#[test]
fn stale_demo_specs_fail_as_kubernetes_fails_them() {
    for (file, expected) in [
        (
            "selectors/claims.yaml",
            "ResourceClaimTemplate kubecon-demo/inference-gpu",
        ),
        (
            "mig+mps/sharing-demo-claims.yaml",
            "apiVersion: \"resource.k8s.io/v1alpha2\" does not serve ResourceClaim;",
        ),
        (
            "quickstart/v1beta1/gpu-test-vfiopci.yaml",
            "apiVersion: \"resource.k8s.io/v1alpha3\" does not serve ResourceClaimTemplate;",
        ),
        (
            "quickstart/v1/imex-test1.yaml",
            "spec.devices.requests[0].exactly.deviceClassName: DeviceClass \"imex.nvidia.com\" not found",
        ),
    ] {
        let out = match_spec("sim:2xH100-SXM5-80GB", file, &[]);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(expected),
            "{file}: {}",
            text(&out.stderr)
        );
    }

    for version in ["v1", "v1beta1"] {
        let out = match_spec(
            "sim:2xA100-SXM4-40GB",
            &format!("quickstart/{version}/gpu-test6.yaml"),
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("kube-scheduler aborts with an error")
                && stderr.contains("CEL runtime error: no such key: index"),
            "{version}: {stderr}"
        );
    }
}

/// kube-scheduler passes opaque configs through unread; the node driver would refuse a bad one
/// at prepare. `match` decodes them as prepare does, so gpu-test5 with an out-of-range MPS
/// setting, an unknown strategy or another API version fails before anything is allocated,
/// naming object and field.
#[test]
fn a_bad_opaque_config_fails_match_naming_its_field() {
    let dir = tempfile::tempdir().expect("tmp");
    let original = std::fs::read_to_string(spec("quickstart/v1/gpu-test5.yaml")).expect("read");
    for (from, to, expected) in [
        (
            "defaultActiveThreadPercentage: 50",
            "defaultActiveThreadPercentage: 150",
            "spec.spec.devices.config[1].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: 150 is not between 0 and 100",
        ),
        (
            "strategy: MPS",
            "strategy: Mps",
            "spec.spec.devices.config[1].opaque.parameters.sharing.strategy: unknown variant `Mps`, expected `TimeSlicing` or `MPS`",
        ),
        (
            "apiVersion: resource.nvidia.com/v1beta1\n            kind: GpuConfig\n            sharing:\n              strategy: TimeSlicing",
            "apiVersion: gpu.nvidia.com/v1beta1\n            kind: GpuConfig\n            sharing:\n              strategy: TimeSlicing",
            "spec.spec.devices.config[0].opaque.parameters.apiVersion: \"gpu.nvidia.com/v1beta1\" is not supported",
        ),
    ] {
        assert!(original.contains(from), "{from}");
        let file = dir.path().join("gpu-test5.yaml");
        std::fs::write(&file, original.replacen(from, to, 1)).expect("write");
        let classes = repo("deviceclasses");
        let out = gpu_dra(&[
            "match",
            "--slices",
            "sim:2xH100-SXM5-80GB",
            "--classes",
            &classes,
            "-f",
            file.to_str().expect("utf-8"),
        ]);
        assert_eq!(out.status.code(), Some(2), "{to}: {}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("ResourceClaimTemplate gpu-test5/multiple-gpus (")
                && stderr.contains(expected),
            "{to}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing allocated: {to}");
    }
}

/// Specs of NVIDIA's own end-to-end suite (`tests/bats/specs`) on two H100s (dynamic MIG): each
/// allocates what its test expects, the CEL no-match spec fits nothing, and the opaque config with
/// an unknown field fails with the words that suite looks for in NVIDIA's driver's log.
#[test]
fn nvidias_bats_specs_allocate_as_its_tests_expect() {
    let node = "sim:2xH100-SXM5-80GB";
    let bats = |name: &str| allocated(&match_spec(node, &format!("bats/{name}.yaml"), &[]));
    let all_devices = |claims: &[Allocated]| -> Vec<String> {
        claims
            .iter()
            .flat_map(|c| devices_of(c).into_iter().map(String::from))
            .collect()
    };

    // One GPU for two containers; one shared claim for two pods; own GPUs for two pods and for
    // two claims of one pod.
    assert_eq!(all_devices(&bats("gpu-1pod-2cnt-1gpu")), ["gpu-0"]);
    assert_eq!(all_devices(&bats("gpu-2pods-1gpu")), ["gpu-0"]);
    assert_eq!(all_devices(&bats("gpu-2pods-2gpus")), ["gpu-0", "gpu-1"]);
    assert_eq!(
        all_devices(&bats("gpu-two-claims-one-pod")),
        ["gpu-0", "gpu-1"]
    );
    assert_eq!(all_devices(&bats("rc-shared-gpu")), ["gpu-0"]);
    // Sharing configs reach the driver with the allocation.
    assert_eq!(bats("gpu-timeslicing")[0].strategies, ["TimeSlicing"]);
    assert_eq!(bats("gpu-mps")[0].strategies, ["MPS"]);
    assert_eq!(bats("gpu-simple-mig-ts")[0].strategies, ["TimeSlicing"]);
    // MIG devices, by profile and by SM count: any one; and two of one pod (fewer than 30 SMs,
    // more than 50) on one GPU, the other left whole.
    for spec in ["gpu-anymig", "gpu-simple-mig"] {
        let devices = all_devices(&bats(spec));
        assert!(
            devices.len() == 1 && devices[0].starts_with("gpu-0-mig-"),
            "{spec}: {devices:?}"
        );
    }
    let two = all_devices(&bats("gpu-multiple-mig"));
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(
        two.iter().all(|d| d.starts_with("gpu-0-mig-")),
        "one GPU for both: {two:?}"
    );

    let out = match_spec(node, "bats/gpu-cel-nomatch.yaml", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));

    // Consumable shares: both pods share gpu-0 on a node publishing shares, else each gets a GPU.
    let dir = tempfile::tempdir().expect("tmp");
    for (shares, spec) in [
        ("4", "gpu-consumable-shares-integer"),
        ("memory", "gpu-consumable-shares-memory"),
    ] {
        let slices = shared_slices(dir.path(), node, shares, &[]);
        let claims = allocated(&match_spec(&slices, &format!("bats/{spec}.yaml"), &[]));
        assert_eq!(all_devices(&claims), ["gpu-0", "gpu-0"], "{spec}");
    }

    let out = match_spec(
        node,
        "bats/rc-opaque-cfg-unknown-field.yaml",
        &["--compute-domains"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ResourceClaim default/batssuite-rc-bad-opaque-config (")
            && stderr.contains("spec.devices.config[0].opaque.parameters: strict decoding error: unknown field \"unexpectedField\""),
        "{stderr}"
    );
}

/// NVIDIA's share tests on dynamic-MIG H100s, through Kubernetes' own allocator (the Go oracle,
/// pod by pod, as kube-scheduler): the same devices as `gpu-dra match`, both pods on gpu-0.
/// Needs ALLOC_ORACLE (e2e/run-tests builds it and runs the ignored tests).
#[test]
#[ignore = "needs the Go allocator oracle (ALLOC_ORACLE)"]
fn kubernetes_allocator_shares_a_dynamic_mig_gpu_as_we_do() {
    let oracle = std::env::var_os("ALLOC_ORACLE")
        .filter(|p| !p.is_empty())
        .expect("ALLOC_ORACLE is not set (e2e/run-tests sets it)");
    let dir = tempfile::tempdir().expect("tmp");
    let classes = dir.path().join("classes.json");
    let items: Vec<Value> = std::fs::read_dir(repo("deviceclasses"))
        .expect("deviceclasses")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| serde_yaml_ng::from_str(&std::fs::read_to_string(p).expect("read")).expect("yaml"))
        .collect();
    std::fs::write(
        &classes,
        serde_json::to_vec(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        .expect("json"),
    )
    .expect("write");
    for (shares, name) in [
        ("4", "gpu-consumable-shares-integer"),
        ("memory", "gpu-consumable-shares-memory"),
        ("unlimited", "gpu-consumable-shares-memory"),
    ] {
        let slices = shared_slices(
            dir.path(),
            "sim:2xH100-SXM5-80GB",
            shares,
            &["--mig", "dynamic"],
        );
        let slices = slices.as_str();
        let file = format!("bats/{name}.yaml");
        // The pods' claims as kube-controller-manager makes them, unallocated.
        let classes_dir = repo("deviceclasses");
        let printed = gpu_dra(&[
            "match",
            "--slices",
            slices,
            "--classes",
            &classes_dir,
            "-f",
            &spec(&file),
            "--print-v1",
            "-o",
            "json",
        ]);
        assert!(printed.status.success(), "{}", text(&printed.stderr));
        let printed: Value = serde_json::from_slice(&printed.stdout).expect("json");
        let claims: Vec<Value> = printed["items"]
            .as_array()
            .expect("a List")
            .iter()
            .filter(|o| o["kind"] == "ResourceClaim")
            .cloned()
            .collect();
        assert_eq!(claims.len(), 2, "{shares}: {printed}");
        let claims_file = dir.path().join("claims.json");
        std::fs::write(
            &claims_file,
            serde_json::to_vec(
                &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": claims}),
            )
            .expect("json"),
        )
        .expect("write");
        let theirs = Command::new(&oracle)
            .args(["--slices", slices, "--node", "node-shared", "--claims"])
            .arg(&claims_file)
            .arg("--classes")
            .arg(&classes)
            .output()
            .expect("alloc-oracle runs");
        assert!(theirs.status.success(), "{}", text(&theirs.stderr));
        let theirs: Value = serde_json::from_slice(&theirs.stdout).expect("oracle JSON");
        let their_devices: Vec<&str> = theirs["claims"]
            .as_array()
            .expect("claims")
            .iter()
            .map(|c| {
                c["allocation"]["devices"]["results"][0]["device"]
                    .as_str()
                    .unwrap_or("none")
            })
            .collect();
        let ours = allocated(&match_spec(slices, &file, &["--node", "node-shared"]));
        let our_devices: Vec<&str> = ours.iter().flat_map(devices_of).collect();
        assert_eq!(their_devices, our_devices, "{shares}: {name}");
        assert_eq!(our_devices, ["gpu-0", "gpu-0"], "{shares}: {name}");
    }
}
