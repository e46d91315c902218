//! `gpu-dra match -f` and `explain -f` on what users `kubectl apply`: multi-document manifests
//! with workloads and resource.k8s.io objects in v1beta1, v1beta2 and v1
//! (tests/fixtures/manifests/*/training.yaml hold the same objects in each version).
#![cfg(feature = "tools")]
mod common;
use common::{gpu_dra, repo, text};
use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1beta2"];

fn fixture(version: &str) -> String {
    repo(&format!("tests/fixtures/manifests/{version}/training.yaml"))
}

/// `match` (or `explain`) on `gpus` with the stock classes and `extra` arguments.
fn run(command: &str, gpus: &str, extra: &[&str]) -> Output {
    let classes = repo("deviceclasses");
    let slices = format!("sim:{gpus}");
    let mut args = vec![command, "--slices", &slices, "--classes", &classes];
    args.extend_from_slice(extra);
    gpu_dra(&args)
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "exit {:?}\nstderr: {}",
        out.status.code(),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// `name → [request=device, ...]` of each allocated claim, in output order.
fn allocations(list: &Value) -> Vec<(String, Vec<String>)> {
    list["items"]
        .as_array()
        .expect("a List")
        .iter()
        .map(|claim| {
            let results = claim["status"]["allocation"]["devices"]["results"]
                .as_array()
                .expect("results")
                .iter()
                .map(|r| {
                    format!(
                        "{}={}",
                        r["request"].as_str().unwrap_or(""),
                        r["device"].as_str().unwrap_or("")
                    )
                })
                .collect();
            (
                claim["metadata"]["name"].as_str().unwrap_or("").to_string(),
                results,
            )
        })
        .collect()
}

/// stderr without the `note:` lines.
fn errors(out: &Output) -> Vec<String> {
    text(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("note: "))
        .map(str::to_string)
        .collect()
}

fn item<'a>(list: &'a Value, kind: &str, name: &str) -> &'a Value {
    list["items"]
        .as_array()
        .expect("a List")
        .iter()
        .find(|i| i["kind"] == kind && i["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {list}"))
}

#[test]
fn all_three_versions_convert_to_the_same_v1_objects() {
    let printed: Vec<Value> = VERSIONS
        .iter()
        .map(|v| {
            json(&gpu_dra(&[
                "match",
                "--print-v1",
                "-o",
                "json",
                "-f",
                &fixture(v),
            ]))
        })
        .collect();
    assert_eq!(printed[0], printed[1], "v1beta1 differs from v1");
    assert_eq!(printed[0], printed[2], "v1beta2 differs from v1");
    let list = &printed[0];
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    // The class, two templates, the claim, then one claim per pod template reference.
    assert_eq!(
        kinds,
        [
            "DeviceClass",
            "ResourceClaimTemplate",
            "ResourceClaimTemplate",
            "ResourceClaim",
            "ResourceClaim",
            "ResourceClaim",
            "ResourceClaim"
        ]
    );
    for i in list["items"].as_array().unwrap() {
        assert_eq!(i["apiVersion"], "resource.k8s.io/v1");
    }
    // Defaults as the API server applies them.
    assert_eq!(
        item(list, "ResourceClaim", "notebook-gpu")["spec"]["devices"]["requests"][0],
        serde_json::json!({"name": "gpu", "exactly": {
            "deviceClassName": "h100.example.com", "allocationMode": "ExactCount", "count": 1}})
    );
    let one_gpu = &item(list, "ResourceClaimTemplate", "one-gpu")["spec"]["spec"]["devices"]["requests"]
        [0]["exactly"];
    assert_eq!(one_gpu["tolerations"][0]["operator"], "Equal");
    assert_eq!(one_gpu["count"], 1);
    let mig =
        &item(list, "ResourceClaimTemplate", "small-mig")["spec"]["spec"]["devices"]["requests"][0];
    assert_eq!(mig.get("exactly"), None);
    assert_eq!(mig["firstAvailable"][0]["allocationMode"], "ExactCount");
}

#[test]
fn generated_claims_look_like_the_controllers() {
    let list = json(&gpu_dra(&[
        "match",
        "--print-v1",
        "-o",
        "json",
        "-f",
        &fixture("v1"),
    ]));
    let generated: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["metadata"]["ownerReferences"].is_array())
        .collect();
    assert_eq!(generated.len(), 3, "trainer, eval and nightly: {list}");
    for claim in &generated {
        let owner = &claim["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Pod");
        assert_eq!(owner["controller"], true);
        let pod = owner["name"].as_str().unwrap();
        let pod_claim = claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"]
            .as_str()
            .unwrap();
        let generate_name = format!("{pod}-{pod_claim}-");
        assert_eq!(claim["metadata"]["generateName"], generate_name.as_str());
        let name = claim["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with(&generate_name) && name.len() == generate_name.len() + 5);
        assert_eq!(claim["metadata"]["namespace"], "ml");
    }
    let trainer = generated
        .iter()
        .find(|c| {
            c["metadata"]["ownerReferences"][0]["name"]
                .as_str()
                .unwrap()
                .starts_with("trainer-")
        })
        .expect("the trainer pod's claim");
    assert_eq!(
        trainer["metadata"]["labels"]["team"], "ml",
        "template labels"
    );
    assert_eq!(
        trainer["spec"],
        item(&list, "ResourceClaimTemplate", "one-gpu")["spec"]["spec"]
    );
    // The same inputs always give the same names.
    let again = json(&gpu_dra(&[
        "match",
        "--print-v1",
        "-o",
        "json",
        "-f",
        &fixture("v1"),
    ]));
    assert_eq!(list, again);
}

#[test]
fn all_three_versions_allocate_the_same_devices() {
    let results: Vec<_> = VERSIONS
        .iter()
        .map(|v| {
            allocations(&json(&run(
                "match",
                "4xH100-SXM5-80GB",
                &["-o", "json", "-f", &fixture(v)],
            )))
        })
        .collect();
    assert_eq!(results[0], results[1], "v1beta1 allocates differently");
    assert_eq!(results[0], results[2], "v1beta2 allocates differently");
    let names: Vec<&str> = results[0].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 4, "{results:?}");
    assert!(names[0].starts_with("trainer-"), "{names:?}");
    assert!(names[1].starts_with("eval-"), "{names:?}");
    assert!(names[2].starts_with("nightly-"), "{names:?}");
    assert_eq!(names[3], "notebook-gpu");
    // Whole GPUs for the trainer, the nightly job and the notebook; a 1g.10gb MIG device for
    // the eval job (its first choice).
    let devices: Vec<&str> = results[0]
        .iter()
        .flat_map(|(_, r)| r.iter().map(String::as_str))
        .collect();
    assert_eq!(devices[0], "gpu=gpu-0");
    assert!(devices[1].starts_with("mig/one-g=gpu-") && devices[1].contains("-mig-1g10gb-"));
    assert_eq!(devices[2], "gpu=gpu-2");
    assert_eq!(devices[3], "gpu=gpu-3");
}

#[test]
fn replicas_place_every_pod_with_claims_of_its_own() {
    let out = run(
        "match",
        "5xH100-SXM5-80GB",
        &["-o", "json", "--replicas", "-f", &fixture("v1beta1")],
    );
    let stderr = text(&out.stderr);
    let results = allocations(&json(&out));
    assert!(
        stderr.contains("note: Deployment ml/trainer: 2 replicas, allocating each in turn"),
        "{stderr}"
    );
    let trainers: Vec<_> = results
        .iter()
        .filter(|(n, _)| n.starts_with("trainer-"))
        .collect();
    assert_eq!(trainers.len(), 2, "{results:?}");
    assert_ne!(
        trainers[0].0, trainers[1].0,
        "each replica has its own claim"
    );
    assert_ne!(trainers[0].1, trainers[1].1, "and its own GPU");
    assert_eq!(results.len(), 5, "{results:?}");
    // Four GPUs cannot hold two trainers, the nightly job, the notebook and a MIG device: what
    // fits is printed, the notebook explained, and the exit status says "partly" (3).
    let out = run(
        "match",
        "4xH100-SXM5-80GB",
        &["--replicas", "-o", "json", "-f", &fixture("v1")],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Pod ml/notebook:"), "{stderr}");
    assert!(stderr.contains("once ml/trainer-"), "{stderr}");
    let fitted: Vec<String> = allocations(&serde_json::from_slice(&out.stdout).expect("JSON"))
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(fitted.len(), 4, "{fitted:?}");
    assert!(
        fitted.iter().all(|n| !n.starts_with("notebook")),
        "{fitted:?}"
    );
    // explain says the same: some fit.
    let out = run(
        "explain",
        "4xH100-SXM5-80GB",
        &["--replicas", "-f", &fixture("v1")],
    );
    assert_eq!(out.status.code(), Some(3));
    // Without --replicas one pod stands for the Deployment, and everything fits.
    let out = run("match", "4xH100-SXM5-80GB", &["-f", &fixture("v1")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(
            "note: Deployment ml/trainer: 2 replicas, allocating one pod's claims; --replicas places them all"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_claim_named_by_two_pods_is_allocated_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("two-pods.yaml");
    let manifest = std::fs::read_to_string(fixture("v1")).expect("fixture");
    let second_pod = manifest
        .split("\n---\n")
        .last()
        .expect("the notebook pod")
        .replace("name: notebook\n", "name: notebook-2\n");
    std::fs::write(&path, format!("{manifest}\n---\n{second_pod}")).expect("write");
    let out = run(
        "match",
        "4xH100-SXM5-80GB",
        &["-o", "json", "-f", &path.display().to_string()],
    );
    let results = allocations(&json(&out));
    let shared: Vec<_> = results
        .iter()
        .filter(|(n, _)| n == "notebook-gpu")
        .collect();
    assert_eq!(shared.len(), 1, "{results:?}");
    let out = run(
        "explain",
        "4xH100-SXM5-80GB",
        &["-f", &path.display().to_string()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(
        report
            .contains("Pod ml/notebook-2:\n  its claims are allocated already (by an earlier pod)"),
        "{report}"
    );
}

#[test]
fn other_kinds_are_skipped_with_a_note() {
    let out = run("match", "4xH100-SXM5-80GB", &["-f", &fixture("v1beta2")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let file = fixture("v1beta2");
    for skipped in [
        format!(
            "note: skipped Namespace ml ({file}, document 1): not a Pod, workload or DRA object"
        ),
        format!(
            "note: skipped ConfigMap settings ({file}, document 2): not a Pod, workload or DRA object"
        ),
    ] {
        assert!(stderr.contains(&skipped), "{stderr}");
    }
}

#[test]
fn explain_heads_each_pod() {
    let out = run("explain", "4xH100-SXM5-80GB", &["-f", &fixture("v1beta1")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    for heading in [
        "Pod ml/trainer-",
        "of Deployment ml/trainer:",
        "of Job ml/eval:",
        "of CronJob ml/nightly:",
        "Pod ml/notebook:",
    ] {
        assert!(report.contains(heading), "no {heading:?} in:\n{report}");
    }
    assert!(
        report.contains("Request gpu (class h100.example.com)"),
        "{report}"
    );
}

#[test]
fn lists_json_and_stdin_are_read() {
    let list = json(&gpu_dra(&[
        "match",
        "--print-v1",
        "-o",
        "json",
        "-f",
        &fixture("v1beta1"),
    ]));
    // The converted objects, fed back as one JSON List on stdin, convert to themselves.
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(["match", "--print-v1", "-o", "json", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let input = serde_json::json!({"apiVersion": "v1", "kind": "List", "items":
        list["items"].as_array().unwrap().iter().filter(|i| i["metadata"].get("ownerReferences").is_none()).collect::<Vec<_>>()});
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("runs");
    let again = json(&out);
    assert_eq!(again["items"], input["items"]);
}

/// Writes `text` to a file and runs `match` on it; returns the one error line (exit 2).
fn error_of(file_text: &str) -> (String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("manifest.yaml");
    std::fs::write(&path, file_text).expect("write");
    let file = path.display().to_string();
    let out = run("match", "4xH100-SXM5-80GB", &["-f", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let errors = errors(&out);
    assert_eq!(errors.len(), 1, "one line: {errors:?}");
    (errors[0].clone(), file)
}

fn replaced(version: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(fixture(version)).expect("fixture");
    assert_eq!(
        text.matches(from).count(),
        1,
        "{from:?} once in the {version} fixture"
    );
    text.replacen(from, to, 1)
}

#[test]
fn unknown_fields_name_object_document_and_field() {
    // v1 has no inline deviceClassName; v1beta1 has no `exactly`.
    let (line, file) = error_of(&replaced(
        "v1",
        "      exactly:\n        deviceClassName: h100.example.com\n",
        "      deviceClassName: h100.example.com\n      exactly:\n",
    ));
    assert_eq!(
        line,
        format!(
            "error: ResourceClaim ml/notebook-gpu ({file}, document 6): spec.devices.requests[0].deviceClassName: unknown field"
        )
    );
    let (line, file) = error_of(&replaced(
        "v1beta1",
        "    - name: gpu\n      deviceClassName: h100.example.com\n",
        "    - name: gpu\n      exactly: {deviceClassName: h100.example.com}\n",
    ));
    assert_eq!(
        line,
        format!(
            "error: ResourceClaim ml/notebook-gpu ({file}, document 6): spec.devices.requests[0].exactly: unknown field"
        )
    );
}

#[test]
fn invalid_values_name_object_and_field() {
    let (line, file) = error_of(&replaced(
        "v1",
        "        allocationMode: ExactCount\n        count: 1\n",
        "        allocationMode: ExactCount\n        count: -1\n",
    ));
    assert_eq!(
        line,
        format!(
            "error: ResourceClaim ml/notebook-gpu ({file}, document 6): spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"
        )
    );
    let (line, _) = error_of(&replaced(
        "v1",
        "        allocationMode: ExactCount\n        count: 1\n",
        "        allocationMode: ExactCount\n        count: one\n",
    ));
    assert!(
        line.contains("ResourceClaim ml/notebook-gpu")
            && line
                .contains("spec.devices.requests[0].exactly.count: invalid type: string \"one\""),
        "{line}"
    );
    let (line, _) = error_of(&replaced(
        "v1beta2",
        "          count: 1\n",
        "          allocationMode: Some\n",
    ));
    assert!(
        line.contains("ResourceClaimTemplate ml/small-mig")
            && line.contains("spec.spec.devices.requests[0].firstAvailable[1].allocationMode: Unsupported value: \"Some\""),
        "{line}"
    );
    let (line, file) = error_of(&replaced(
        "v1",
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n",
        "apiVersion: resource.k8s.io/v1alpha3\nkind: ResourceClaim\n",
    ));
    assert_eq!(
        line,
        format!(
            "error: ResourceClaim ml/notebook-gpu ({file}, document 6): apiVersion: \"resource.k8s.io/v1alpha3\" does not serve ResourceClaim; use resource.k8s.io/v1 (or v1beta2, v1beta1)"
        )
    );
}

#[test]
fn a_missing_claim_or_template_names_the_pod_and_field() {
    let (line, file) = error_of(&replaced(
        "v1",
        "    resourceClaimName: notebook-gpu\n",
        "    resourceClaimName: notebook-gpus\n",
    ));
    assert_eq!(
        line,
        format!(
            "error: Pod ml/notebook ({file}, document 10): spec.resourceClaims[0].resourceClaimName: ResourceClaim ml/notebook-gpus is not in the inputs (give it with -f)"
        )
    );
    let (line, file) = error_of(&replaced(
        "v1beta1",
        "            resourceClaimTemplateName: one-gpu\n",
        "            resourceClaimTemplateName: one-gpu-typo\n",
    ));
    assert_eq!(
        line,
        format!(
            "error: CronJob ml/nightly ({file}, document 9): spec.jobTemplate.spec.template.spec.resourceClaims[0].resourceClaimTemplateName: ResourceClaimTemplate ml/one-gpu-typo is not in the inputs (give it with -f)"
        )
    );
}

#[test]
fn an_unknown_device_class_names_the_template_and_field() {
    let (line, file) = error_of(&replaced(
        "v1beta1",
        "        deviceClassName: gpu.nvidia.com\n",
        "        deviceClassName: gpu.nvidia.co\n",
    ));
    assert!(
        line.starts_with(&format!(
            "error: ResourceClaimTemplate ml/one-gpu ({file}, document 4), claim gpu of pod trainer-"
        )),
        "{line}"
    );
    assert!(
        line.ends_with(": spec.spec.devices.requests[0].exactly.deviceClassName: DeviceClass \"gpu.nvidia.co\" not found; the DeviceClasses given are compute-domain-daemon.nvidia.com, compute-domain-default-channel.nvidia.com, gpu.nvidia.com, h100.example.com, mig.nvidia.com, vfio.gpu.nvidia.com"),
        "{line}"
    );
}

#[test]
fn a_selector_that_does_not_compile_names_the_field() {
    let (line, file) = error_of(&replaced(
        "v1beta2",
        ".compareTo(quantity('40Gi')) >= 0",
        ".compareTo(quantity('40Gi')) >=",
    ));
    assert!(
        line.starts_with(&format!(
            "error: ResourceClaimTemplate ml/one-gpu ({file}, document 4): spec.spec.devices.requests[0].exactly.selectors[0].cel.expression: does not compile: "
        )),
        "{line}"
    );
    let (line, _) = error_of(&replaced(
        "v1",
        "startsWith('NVIDIA H100')",
        "startsWith('NVIDIA H100'",
    ));
    assert!(
        line.contains("DeviceClass h100.example.com (")
            && line.contains("): spec.selectors[1].cel.expression: does not compile: "),
        "{line}"
    );
}

#[test]
fn a_claim_that_can_never_fit_says_so_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.yaml");
    std::fs::write(
        &path,
        replaced("v1beta1", "quantity('40Gi')", "quantity('200Gi')"),
    )
    .expect("write");
    let file = path.display().to_string();
    let out = run("match", "4xH100-SXM5-80GB", &["-f", &file]);
    // The other pods fit: partly (3).
    assert_eq!(out.status.code(), Some(3));
    let stderr = text(&out.stderr);
    let never: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("never fits"))
        .collect();
    assert_eq!(never.len(), 2, "trainer and nightly: {stderr}");
    assert!(
        never[0].starts_with(&format!(
            "ResourceClaimTemplate ml/one-gpu ({file}, document 4), claim gpu of pod trainer-"
        )),
        "{}",
        never[0]
    );
    assert!(
        never[0].ends_with(": spec.spec.devices.requests[0].exactly: request \"gpu\" never fits on node sim-node: its class and selectors rule out all 104 devices"),
        "{}",
        never[0]
    );
    // Too many devices for what matches.
    std::fs::write(
        &path,
        replaced(
            "v1",
            "        allocationMode: ExactCount\n        count: 1\n",
            "        allocationMode: ExactCount\n        count: 5\n",
        ),
    )
    .expect("write");
    let out = run("explain", "4xH100-SXM5-80GB", &["-f", &file]);
    // The notebook never fits; the other pods do.
    assert_eq!(out.status.code(), Some(3));
    let report = text(&out.stdout);
    assert!(
        report.contains(&format!("ResourceClaim ml/notebook-gpu ({file}, document 6): spec.devices.requests[0].exactly.count: request \"gpu\" never fits on node sim-node: it asks for 5 devices and only 4 pass its class and selectors")),
        "{report}"
    );
}

#[test]
fn nothing_to_allocate_is_a_usage_error() {
    let out = run("match", "1xT4", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("give -f FILE|DIR|-"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn v1beta1_corners_convert_as_the_api_server_does() {
    // e2e/convert.sh checks these against kube-apiserver; here, the shapes that matter.
    let list = json(&gpu_dra(&[
        "match",
        "--print-v1",
        "-o",
        "json",
        "-f",
        &repo("tests/fixtures/manifests/v1beta1/conversion-cases.yaml"),
    ]));
    let request = |name: &str, i: usize| {
        item(&list, "ResourceClaim", name)["spec"]["devices"]["requests"][i].clone()
    };
    assert_eq!(
        request("all-gpus", 0)["exactly"],
        serde_json::json!({"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"})
    );
    // An empty selector list makes an exact request, and goes (omitempty) once converted.
    assert_eq!(
        request("empty-selectors", 0)["exactly"],
        serde_json::json!({"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount",
            "count": 2, "adminAccess": false})
    );
    let first = request("pair", 0);
    assert_eq!(first["exactly"]["capacity"]["requests"]["memory"], "10Gi");
    assert_eq!(first["exactly"]["tolerations"][0]["operator"], "Exists");
    assert_eq!(first["exactly"]["tolerations"][1]["operator"], "Equal");
    let second = request("pair", 1);
    assert_eq!(second.get("exactly"), None);
    assert_eq!(
        second["firstAvailable"][0]["tolerations"][0]["operator"],
        "Equal"
    );
    assert_eq!(second["firstAvailable"][1]["count"], 1);
    let slice = &item(
        &list,
        "ResourceSlice",
        "conversion-node-1-conversion.example.com",
    )["spec"];
    assert_eq!(slice.get("nodeName"), None);
    assert_eq!(slice["allNodes"], true);
    assert_eq!(
        slice["devices"][0],
        serde_json::json!({"name": "dev-0", "attributes": {"model": {"string": "X1"},
            "cores": {"int": 8}}, "capacity": {"memory": {"value": "16Gi"}}})
    );
    assert_eq!(
        slice["devices"][1].get("attributes"),
        None,
        "an empty map is not copied"
    );
}

#[test]
fn v1beta1_slices_and_classes_allocate_like_v1_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slices = gpu_dra(&[
        "slices",
        "--gpus",
        "sim:4xH100-SXM5-80GB",
        "--node-name",
        "sim-node",
        "-o",
        "json",
    ]);
    let mut list: Value = serde_json::from_slice(&slices.stdout).expect("slices");
    // The v1beta1 form: everything but the name of a device under `basic`.
    for slice in list["items"].as_array_mut().expect("items") {
        slice["apiVersion"] = "resource.k8s.io/v1beta1".into();
        for device in slice["spec"]["devices"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let map = device.as_object_mut().expect("device");
            let name = map.remove("name").expect("name");
            let basic = Value::Object(std::mem::take(map));
            map.insert("name".into(), name);
            map.insert("basic".into(), basic);
        }
    }
    let slices_file = dir.path().join("slices.json");
    std::fs::write(&slices_file, list.to_string()).expect("write");
    let classes_dir = dir.path().join("classes");
    std::fs::create_dir(&classes_dir).expect("mkdir");
    for class in ["gpu.nvidia.com", "mig.nvidia.com"] {
        let text = std::fs::read_to_string(repo(&format!("deviceclasses/{class}.yaml")))
            .expect("class")
            .replace("resource.k8s.io/v1\n", "resource.k8s.io/v1beta1\n");
        assert!(text.contains("v1beta1"));
        std::fs::write(classes_dir.join(format!("{class}.yaml")), text).expect("write");
    }
    let old = allocations(&json(&gpu_dra(&[
        "match",
        "-o",
        "json",
        "--slices",
        &slices_file.display().to_string(),
        "--classes",
        &classes_dir.display().to_string(),
        "-f",
        &fixture("v1beta1"),
    ])));
    let new = allocations(&json(&run(
        "match",
        "4xH100-SXM5-80GB",
        &["-o", "json", "-f", &fixture("v1")],
    )));
    assert_eq!(old, new);
}

/// KubeVirt's VirtualMachineInstances and VirtualMachines are read as pods are: their
/// virt-launcher pod gets claims made from their templates; a halted VM runs none.
#[test]
fn kubevirt_vms_get_their_launcher_pods_claims() {
    let file = repo("tests/fixtures/manifests/kubevirt/vm-gpu.yaml");
    let out = run(
        "match",
        "2xH100-SXM5-80GB",
        &["-f", &file, "--replicas", "--passthrough", "-o", "json"],
    );
    let list = json(&out);
    let allocated = allocations(&list);
    assert_eq!(allocated.len(), 2, "{allocated:?}");
    for (name, results) in &allocated {
        assert!(
            name.starts_with("virt-launcher-vm-dra-gpu-")
                || name.starts_with("virt-launcher-vm-running-"),
            "{name}"
        );
        assert!(
            name.contains("-dra-gpu-claim-") || name.contains("-gpu-"),
            "{name}"
        );
        assert_eq!(results.len(), 1);
        assert!(results[0].starts_with("dra-gpu=gpu-vfio-"), "{results:?}");
    }
    let notes = text(&out.stderr);
    assert!(
        notes.contains("VirtualMachine default/vm-halted: halted (spec.runStrategy or spec.running): no VMI runs; nothing to allocate"),
        "{notes}"
    );

    let explained = run(
        "explain",
        "2xH100-SXM5-80GB",
        &["-f", &file, "--passthrough"],
    );
    let explanation = text(&explained.stdout);
    assert!(
        explanation.contains("(virt-launcher of VirtualMachineInstance default/vm-dra-gpu)"),
        "{explanation}"
    );
}

#[test]
fn kubevirt_device_references_are_checked() {
    let vmi = |devices: &str| {
        format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: vmi\nspec:\n  resourceClaims:\n  - name: gpu\n    resourceClaimName: shared\n  domain:\n    devices:\n{devices}"
        )
    };
    let (error, file) = error_of(&vmi(
        "      gpus:\n      - name: g\n        claimName: other\n        requestName: gpu\n",
    ));
    assert_eq!(
        error,
        format!(
            "error: VirtualMachineInstance default/vmi ({file}, document 1): spec.domain.devices.gpus[0].claimName: Invalid value: \"other\": no spec.resourceClaims entry has this name"
        )
    );
    let (error, _) = error_of(&vmi(
        "      hostDevices:\n      - name: h\n        claimName: gpu\n",
    ));
    assert!(error.ends_with("spec.domain.devices.hostDevices[0].requestName: Required value: a device taken from a claim names its request"), "{error}");
    let (error, _) = error_of(&vmi(
        "      gpus:\n      - name: g\n        deviceName: nvidia.com/GH100\n        claimName: gpu\n        requestName: gpu\n",
    ));
    assert!(error.ends_with("spec.domain.devices.gpus[0]: Invalid value: deviceName and claimName are mutually exclusive"), "{error}");
    let (error, _) = error_of(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: vm\nspec:\n  runStrategy: Sometimes\n  template:\n    spec: {}\n",
    );
    assert!(
        error.contains("spec.runStrategy: Unsupported value: \"Sometimes\""),
        "{error}"
    );
    let (error, _) = error_of(
        "apiVersion: kubevirt.io/v1beta1\nkind: VirtualMachineInstance\nmetadata:\n  name: vmi\nspec: {}\n",
    );
    assert!(error.contains("apiVersion: \"kubevirt.io/v1beta1\" does not serve VirtualMachineInstance; use kubevirt.io/v1"), "{error}");
}

/// NVIDIA's two VFIO demo specs, verbatim, on a node published with `--passthrough`: each gets a
/// `gpu-vfio-<index>` device, the config variant with its VfioDeviceConfig; without
/// `--passthrough` nothing fits. The config variant's Pod is in another namespace than its
/// template upstream: named as such, and allocated once the namespace is mended.
#[test]
fn nvidias_vfio_specs_allocate_gpus_for_virtual_machines() {
    let plain = repo("tests/fixtures/manifests/nvidia-vfio/gpu-test-vfiopci.yaml");
    let out = run(
        "match",
        "2xH100-SXM5-80GB",
        &["-f", &plain, "--passthrough", "-o", "json"],
    );
    let allocated = allocations(&as_list(json(&out)));
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    assert_eq!(allocated[0].1, ["gpu=gpu-vfio-0"]);

    let without = run("match", "2xH100-SXM5-80GB", &["-f", &plain]);
    assert_eq!(without.status.code(), Some(1), "{}", text(&without.stderr));

    let config = repo("tests/fixtures/manifests/nvidia-vfio/gpu-test-vfio-config.yaml");
    let out = run(
        "match",
        "2xH100-SXM5-80GB",
        &["-f", &config, "--passthrough"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(
            "ResourceClaimTemplate gpu-test-vfiopci/single-gpu-full-vfioconfig is not in the inputs"
        ),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir().expect("tmp");
    let mended = dir.path().join("mended.yaml");
    let content = std::fs::read_to_string(&config).expect("read");
    std::fs::write(
        &mended,
        content.replace("namespace: gpu-test-vfiopci", "namespace: gpu-test-vfio"),
    )
    .expect("write");
    let out = run(
        "match",
        "2xH100-SXM5-80GB",
        &[
            "-f",
            mended.to_str().expect("utf-8"),
            "--passthrough",
            "-o",
            "json",
        ],
    );
    let list = as_list(json(&out));
    let allocated = allocations(&list);
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    assert_eq!(allocated[0].1, ["gpu=gpu-vfio-0"]);
    let config = &list["items"][0]["status"]["allocation"]["devices"]["config"][0];
    assert_eq!(
        config["opaque"]["parameters"]["kind"], "VfioDeviceConfig",
        "{config}"
    );
}

/// One claim is printed as itself, several as a List: always a List.
fn as_list(value: Value) -> Value {
    if value["kind"] == "List" {
        value
    } else {
        serde_json::json!({"kind": "List", "items": [value]})
    }
}

/// A DeviceTaintRule in the same file takes gpu-0 out: the pod that tolerates its taint gets it,
/// the other one does not fit (exit 3: partly), and both say which rule tainted what.
#[test]
fn device_taint_rules_apply_with_the_requests_tolerations() {
    let file = repo("tests/fixtures/manifests/taints/maintenance.yaml");
    let out = run("match", "1xT4", &["-f", &file, "-o", "json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let allocated = allocations(&as_list(serde_json::from_slice(&out.stdout).expect("json")));
    assert_eq!(allocated.len(), 1, "{allocated:?}");
    assert!(
        allocated[0].0.starts_with("diagnostics-gpu-"),
        "{allocated:?}"
    );
    assert_eq!(allocated[0].1, ["gpu=gpu-0"]);
    let notes = text(&out.stderr);
    assert!(
        notes.contains("note: DeviceTaintRule gpu-0-maintenance taints sim-node/gpu-0 with example.com/maintenance=planned:NoSchedule"),
        "{notes}"
    );
    assert!(notes.contains("Pod default/training:"), "{notes}");

    let explained = run("explain", "1xT4", &["-f", &file]);
    let explanation = text(&explained.stdout);
    assert!(
        explanation.contains("taint example.com/maintenance=planned:NoSchedule is not tolerated"),
        "{explanation}"
    );

    // The same rule beside --allocated claims (a dump of the cluster) applies too.
    let dir = tempfile::tempdir().expect("tmp");
    let content = std::fs::read_to_string(&file).expect("read");
    let (rule, rest) = content.split_once("---\n").expect("documents");
    let rules = dir.path().join("rules.yaml");
    let pods = dir.path().join("pods.yaml");
    std::fs::write(&rules, rule).expect("write");
    std::fs::write(&pods, rest).expect("write");
    let out = run(
        "match",
        "1xT4",
        &[
            "-f",
            pods.to_str().expect("utf-8"),
            "--allocated",
            rules.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

/// Pods that ask for `nvidia.com/gpu` (the class's `extendedResourceName`) or a class's implicit
/// name, with no claim, get the claim kube-scheduler makes for them, allocated with their own
/// claims (e2e/explain.sh checks the prediction against the real scheduler).
#[test]
fn extended_resources_get_the_schedulers_claim() {
    let file = repo("e2e/pods/extended-resource.yaml");
    let out = run("match", "2xH100-SXM5-80GB", &["-f", &file, "-o", "json"]);
    let claim = json(&out);
    assert_eq!(
        claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"],
        "true"
    );
    assert_eq!(
        claim["metadata"]["generateName"],
        "ext-gpu-extended-resources-"
    );
    assert_eq!(claim["metadata"]["ownerReferences"][0]["name"], "ext-gpu");
    let request = &claim["spec"]["devices"]["requests"][0];
    assert_eq!(request["name"], "container-0-request-0");
    assert_eq!(request["exactly"]["deviceClassName"], "gpu.nvidia.com");
    assert_eq!(
        claim["status"]["allocation"]["devices"]["results"][0]["device"],
        "gpu-0"
    );

    // Mixed with a claim of its own, a MIG device by the class's implicit name, two GPUs.
    let dir = tempfile::tempdir().expect("tmp");
    let mixed = dir.path().join("mixed.yaml");
    std::fs::write(
        &mixed,
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: own}\nspec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.nvidia.com}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: mixed}\nspec:\n  resourceClaims:\n  - {name: own, resourceClaimName: own}\n  containers:\n  - name: a\n    resources:\n      claims: [{name: own}]\n      limits: {nvidia.com/gpu: 2, memory: 1Gi}\n  - name: b\n    resources:\n      limits: {deviceclass.resource.kubernetes.io/mig.nvidia.com: 1}\n",
    )
    .expect("write");
    let out = run(
        "match",
        "4xH100-SXM5-80GB",
        &["-f", mixed.to_str().expect("utf-8"), "-o", "json"],
    );
    let allocated = allocations(&json(&out));
    assert_eq!(allocated.len(), 2, "{allocated:?}");
    assert_eq!(allocated[0].0, "own");
    assert!(
        allocated[1].0.starts_with("mixed-extended-resources-"),
        "{allocated:?}"
    );
    let extended = &allocated[1].1;
    assert_eq!(extended.len(), 3, "{extended:?}");
    // memory sorts before nvidia.com/gpu: index 1 in container 0; container 1's only request.
    assert!(
        extended[0].starts_with("container-0-request-1=gpu-"),
        "{extended:?}"
    );
    assert!(
        extended[1].starts_with("container-0-request-1=gpu-"),
        "{extended:?}"
    );
    assert!(
        extended[2].starts_with("container-1-request-0=gpu-"),
        "{extended:?}"
    );
    assert!(extended[2].contains("-mig-"), "{extended:?}");
}

/// `capacity`: copies of a pod placed one after another on each node alone until one does not
/// fit; per node, the count and what stopped it; claims already allocated count.
/// A fleet's slices in one List file (as `kubectl get resourceslices -o json` writes them) are
/// read on several threads and its nodes counted on several threads: the answer, node by node
/// and in node order, is the one for the same fleet given as simulated nodes.
#[test]
fn capacity_on_a_listed_fleet_equals_the_simulated_fleet() {
    let dir = tempfile::tempdir().expect("tmp");
    let pod = temp_manifest(
        &dir,
        "gpu-pod.yaml",
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: big}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly:\n          deviceClassName: gpu.nvidia.com\n          selectors:\n          - cel: {expression: \"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('20Gi')) > 0\"}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: trainer}\nspec:\n  containers:\n  - name: c\n    resources: {claims: [{name: gpu}]}\n  resourceClaims:\n  - {name: gpu, resourceClaimTemplateName: big}\n",
    );
    // Three kinds of node, interleaved, so each thread's share mixes them.
    let specs = ["sim:2xH100-SXM5-80GB", "sim:1xT4", "sim:1xL40S"];
    let nodes: Vec<(String, &str)> = (0..48)
        .map(|i| (format!("node-{i:02}"), specs[i % specs.len()]))
        .collect();
    let mut items = Vec::new();
    for (node, spec) in &nodes {
        let out = gpu_dra(&["slices", "--gpus", spec, "--node-name", node, "-o", "json"]);
        let list = json(&out);
        items.extend(list["items"].as_array().expect("items").iter().cloned());
    }
    assert!(items.len() >= 64, "enough slices for two reading threads");
    let listed = dir.path().join("fleet.json");
    std::fs::write(
        &listed,
        serde_json::to_string_pretty(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        .expect("json"),
    )
    .expect("write");
    let from_list = json(&gpu_dra(&[
        "capacity",
        "--slices",
        listed.to_str().expect("utf-8"),
        "--classes",
        &repo("deviceclasses"),
        "-f",
        &pod,
        "-o",
        "json",
    ]));
    let pairs: Vec<(&str, &str)> = nodes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let simulated = json(&on_fleet("capacity", &pairs, &["-f", &pod, "-o", "json"]));
    assert_eq!(from_list["nodes"], simulated["nodes"]);
    let fits: Vec<u64> = from_list["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["fits"].as_u64().expect("fits"))
        .collect();
    // Two H100s, no T4 (16 GB), one L40S (48 GB), node after node.
    let expected: Vec<u64> = (0..48).map(|i| [2, 0, 1][i % 3]).collect();
    assert_eq!(fits, expected, "{from_list}");
    assert_eq!(from_list["total"], 16 * 3);
}

#[test]
fn capacity_counts_more_copies_per_node_and_says_what_runs_out() {
    let dir = tempfile::tempdir().expect("tmp");
    let pod = temp_manifest(
        &dir,
        "mig-pod.yaml",
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: mig-3g}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: mig\n        exactly:\n          deviceClassName: mig.nvidia.com\n          selectors:\n          - cel: {expression: \"device.attributes['gpu.nvidia.com'].profile == '3g.40gb'\"}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: trainer}\nspec:\n  containers:\n  - name: c\n    resources: {claims: [{name: mig}]}\n  resourceClaims:\n  - {name: mig, resourceClaimTemplateName: mig-3g}\n",
    );
    let pod = pod.as_str();
    let classes = repo("deviceclasses");
    let out = on_fleet(
        "capacity",
        &[("node-a", "sim:2xH100-SXM5-80GB"), ("node-b", "sim:1xT4")],
        &["-f", pod, "-o", "json"],
    );
    let report = json(&out);
    assert_eq!(report["total"], 4, "{report}");
    let nodes = report["nodes"].as_array().expect("nodes");
    assert_eq!(nodes[0]["node"], "node-a");
    assert_eq!(nodes[0]["fits"], 4, "two 3g.40gb placements per H100");
    assert!(
        nodes[0]["stops"]
            .as_str()
            .expect("stops")
            .contains("devices in use"),
        "{report}"
    );
    assert_eq!(nodes[1]["fits"], 0);
    assert!(
        nodes[1]["stops"]
            .as_str()
            .expect("stops")
            .contains("ruled out by selectors"),
        "{report}"
    );

    // One copy already allocated (as `match` allocates it): one fewer fits.
    let placed = gpu_dra(&[
        "match",
        "--slices",
        "node-a=sim:2xH100-SXM5-80GB",
        "--node",
        "node-a",
        "--classes",
        &classes,
        "-f",
        pod,
        "-o",
        "json",
    ]);
    let allocated = dir.path().join("allocated.json");
    std::fs::write(&allocated, &placed.stdout).expect("write");
    let out = on_fleet(
        "capacity",
        &[("node-a", "sim:2xH100-SXM5-80GB"), ("node-b", "sim:1xT4")],
        &["-f", pod, "--allocated", allocated.to_str().expect("utf-8")],
    );
    let text = text(&out.stdout);
    assert!(
        text.starts_with("Pod default/trainer: 3 more copies fit on 2 node(s)."),
        "{text}"
    );
    assert!(
        text.contains("  node node-a: 3; then: request mig: devices in use"),
        "{text}"
    );

    // -n names a live pod's namespace: offline it would be ignored, so it is refused.
    let refused = on_fleet(
        "capacity",
        &[("node-a", "sim:1xT4")],
        &["-n", "ml", "-f", pod],
    );
    assert_eq!(refused.status.code(), Some(2));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("-n/--namespace"), "{why}");

    // Extended resources: one T4 per copy.
    let file = repo("e2e/pods/extended-resource.yaml");
    let out = gpu_dra(&[
        "capacity",
        "--slices",
        "sim:3xT4",
        "--classes",
        &classes,
        "-f",
        &file,
        "-o",
        "json",
    ]);
    assert_eq!(json(&out)["total"], 3);
}

/// Slices of several nodes are a fleet: each pod goes to the first node, by name, where it fits;
/// with `--replicas` a Job is told whether all its pods start at once.
#[test]
fn a_fleet_places_pods_across_nodes_and_says_whether_a_job_starts_at_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let job = temp_manifest(
        &dir,
        "job.yaml",
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: one-gpu}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly: {deviceClassName: gpu.nvidia.com}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: train}\nspec:\n  parallelism: 3\n  completions: 3\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: c\n        resources: {claims: [{name: gpu}]}\n      resourceClaims:\n      - {name: gpu, resourceClaimTemplateName: one-gpu}\n",
    );
    let job = job.as_str();
    let two = on_fleet(
        "match",
        &[("node-a", "sim:1xT4"), ("node-b", "sim:1xT4")],
        &["-f", job, "--replicas", "-o", "json"],
    );
    assert_eq!(two.status.code(), Some(3), "{}", text(&two.stderr));
    let list: Value = serde_json::from_slice(&two.stdout).expect("json");
    let nodes: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|c| {
            c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
                ["values"][0]
                .as_str()
                .expect("node")
        })
        .collect();
    assert_eq!(nodes, ["node-a", "node-b"]);
    let notes = text(&two.stderr);
    assert!(notes.contains("note: a fleet of 2 nodes"), "{notes}");
    assert!(
        notes.contains("note: Job default/train: 2 of 3 pods placed, 1 would wait: it does not start all at once"),
        "{notes}"
    );
    let three = on_fleet(
        "match",
        &[
            ("node-a", "sim:1xT4"),
            ("node-b", "sim:1xT4"),
            ("node-c", "sim:1xT4"),
        ],
        &["-f", job, "--replicas", "-o", "json"],
    );
    assert!(three.status.success(), "{}", text(&three.stderr));
    assert!(
        text(&three.stderr)
            .contains("note: Job default/train: all 3 pods placed: it starts all at once"),
        "{}",
        text(&three.stderr)
    );
}

/// Writes a manifest into `dir`; returns its path.
fn temp_manifest(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write");
    path.to_str().expect("utf-8").to_string()
}

/// `gpu-dra COMMAND` on a fleet (`--slices NODE=SPEC` for each node) with the stock
/// DeviceClasses, then `more`.
fn on_fleet(command: &str, nodes: &[(&str, &str)], more: &[&str]) -> Output {
    let mut args = vec![command.to_string()];
    for (node, spec) in nodes {
        args.push("--slices".to_string());
        args.push(format!("{node}={spec}"));
    }
    args.push("--classes".to_string());
    args.push(repo("deviceclasses"));
    args.extend(more.iter().map(|a| a.to_string()));
    gpu_dra(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Node objects given with the pods filter where each pod may go, as the scheduler's node
/// filters do: a taint the pod does not tolerate, a cordon, a nodeSelector.
#[test]
fn node_objects_filter_where_pods_go() {
    let dir = tempfile::tempdir().expect("tmp");
    let nodes = "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec:\n  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-b, labels: {pool: t4}}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-c}\nspec: {unschedulable: true}\n";
    let template = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: one-gpu}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly: {deviceClassName: gpu.nvidia.com}\n";
    let job = |name: &str, extra: &str| {
        format!(
            "{template}---\napiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  parallelism: 3\n  template:\n    spec:\n      restartPolicy: Never\n{extra}      containers:\n      - name: c\n        resources: {{claims: [{{name: gpu}}]}}\n      resourceClaims:\n      - {{name: gpu, resourceClaimTemplateName: one-gpu}}\n---\n{nodes}"
        )
    };
    let run_with = |command: &str, file: &str, more: &[&str]| {
        let mut args = vec!["-f", file];
        args.extend(more);
        on_fleet(
            command,
            &[
                ("node-a", "sim:1xT4"),
                ("node-b", "sim:1xT4"),
                ("node-c", "sim:1xT4"),
            ],
            &args,
        )
    };

    let plain = temp_manifest(&dir, "plain.yaml", &job("plain", ""));
    let out = run_with("match", &plain, &["--replicas", "-o", "json"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Job default/plain: 1 of 3 pods placed, 2 would wait"),
        "{}",
        text(&out.stderr)
    );
    let capacity = run_with("capacity", &plain, &["-o", "json"]);
    let report = json(&capacity);
    assert_eq!(report["total"], 1, "{report}");
    let stops: Vec<&str> = report["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["stops"].as_str().unwrap_or(""))
        .collect();
    assert!(
        stops[0].contains("taint nvidia.com/gpu=present:NoSchedule"),
        "{report}"
    );
    assert!(stops[2].contains("cordoned"), "{report}");

    let tolerant = temp_manifest(
        &dir,
        "tolerant.yaml",
        &job(
            "tolerant",
            "      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]\n",
        ),
    );
    let out = run_with("match", &tolerant, &["--replicas", "-o", "json"]);
    assert!(
        text(&out.stderr).contains("Job default/tolerant: 2 of 3 pods placed"),
        "{}",
        text(&out.stderr)
    );

    let elsewhere = temp_manifest(
        &dir,
        "elsewhere.yaml",
        &job("elsewhere", "      nodeSelector: {pool: a100}\n"),
    );
    let out = run_with("match", &elsewhere, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let why = text(&out.stderr);
    assert!(why.contains("no node admits the pod"), "{why}");
    assert!(
        why.contains("node node-b: nodeSelector pool=a100: the node has pool=t4"),
        "{why}"
    );
}

/// NVIDIA's nvbandwidth job: its ComputeDomain becomes the channel template the controller
/// makes, its MPIJob the operator's launcher and workers; with `--replicas` every worker gets
/// channel 0 of a node of its own (one channel per node) and its two GPUs there, and the
/// launcher (no devices, a pod of the job all the same) the control-plane node it asks for.
#[test]
fn nvidias_compute_domain_job_places_one_worker_per_node() {
    let job = repo("e2e/pods/nvidia/nvbandwidth-test-job.yaml");
    let dir = tempfile::tempdir().expect("tmp");
    let control_plane = temp_manifest(
        &dir,
        "cp.yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: cp, labels: {node-role.kubernetes.io/control-plane: ''}}\n",
    );
    let four = [
        ("n1", "sim:4xGB200-186GB"),
        ("n2", "sim:4xGB200-186GB"),
        ("n3", "sim:4xGB200-186GB"),
        ("n4", "sim:4xGB200-186GB"),
    ];
    let out = on_fleet(
        "match",
        &four,
        &[
            "-f",
            &job,
            "-f",
            &control_plane,
            "--compute-domains",
            "--replicas",
            "-o",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list = json(&out);
    let mut nodes: Vec<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|c| {
            c["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("compute-domain-channel"))
        })
        .flat_map(|c| {
            c["status"]["allocation"]["devices"]["results"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|r| {
            format!(
                "{}/{}",
                r["pool"].as_str().unwrap_or(""),
                r["device"].as_str().unwrap_or("")
            )
        })
        .collect();
    nodes.sort();
    assert_eq!(
        nodes,
        [
            "n1/channel-0",
            "n2/channel-0",
            "n3/channel-0",
            "n4/channel-0"
        ],
        "{list}"
    );
    let claim = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|c| {
            c["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains("compute-domain-channel"))
        })
        .expect("a channel claim");
    let config = &claim["spec"]["devices"]["config"][0]["opaque"];
    assert_eq!(config["driver"], "compute-domain.nvidia.com", "{claim}");
    assert_eq!(
        config["parameters"]["kind"], "ComputeDomainChannelConfig",
        "{claim}"
    );
    assert!(
        text(&out.stderr).contains("MPIJob default/nvbandwidth-test: all 5 pods placed"),
        "{}",
        text(&out.stderr)
    );

    // Two nodes hold two workers: channel 0 is one per node.
    let out = on_fleet(
        "match",
        &four[..2],
        &[
            "-f",
            &job,
            "-f",
            &control_plane,
            "--compute-domains",
            "--replicas",
            "-o",
            "json",
        ],
    );
    assert!(
        text(&out.stderr)
            .contains("MPIJob default/nvbandwidth-test: 3 of 5 pods placed, 2 would wait"),
        "{}",
        text(&out.stderr)
    );
}

/// A ComputeDomain the CRD would refuse is refused naming the field.
#[test]
fn bad_compute_domains_name_the_field() {
    let dir = tempfile::tempdir().expect("tmp");
    for (spec, field) in [
        ("numNodes: 2", "spec.channel"),
        (
            "channel: {resourceClaimTemplate: {name: t}, allocationMode: Some}",
            "spec.channel.allocationMode",
        ),
        (
            "numNodes: -1\n  channel: {resourceClaimTemplate: {name: t}}",
            "spec.numNodes",
        ),
        ("channel: {resourceClaimTemplate: {}}", "spec"),
    ] {
        let file = temp_manifest(
            &dir,
            "cd.yaml",
            &format!(
                "apiVersion: resource.nvidia.com/v1beta1\nkind: ComputeDomain\nmetadata: {{name: cd}}\nspec:\n  {spec}\n"
            ),
        );
        let out = on_fleet(
            "match",
            &[("n1", "sim:1xGB200-186GB")],
            &["-f", &file, "--compute-domains"],
        );
        assert_eq!(out.status.code(), Some(2), "{spec}: {}", text(&out.stderr));
        let said = text(&out.stderr);
        assert!(
            said.contains("ComputeDomain default/cd") && said.contains(field),
            "{spec}: {said}"
        );
    }
}
