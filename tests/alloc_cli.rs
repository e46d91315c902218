//! `gpu-dra match` and `gpu-dra explain` as a person runs them.
mod common;
use common::{gpu_dra, repo, text};
use std::process::Output;

fn example(command: &str, extra: &[&str]) -> Output {
    let classes = repo("deviceclasses");
    let claim = repo("e2e/alloc-fixtures/claim-40gi.yaml");
    let mut args = vec![
        command,
        "--slices",
        "sim:1xT4,1xH100-SXM5-80GB",
        "--classes",
        &classes,
    ];
    args.extend_from_slice(extra);
    args.push(&claim);
    gpu_dra(&args)
}

/// The issue's done-when example: the H100 (gpu-1), never the T4.
#[test]
fn match_allocates_the_h100_not_the_t4() {
    let out = example("match", &["-o", "json"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let claim: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON claim");
    let results = &claim["status"]["allocation"]["devices"]["results"];
    assert_eq!(
        results,
        &serde_json::json!([{
            "request": "gpu", "driver": "gpu.nvidia.com", "pool": "sim-node", "device": "gpu-1"
        }])
    );
    assert_eq!(
        claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        serde_json::json!(["sim-node"])
    );
    assert_eq!(claim["metadata"]["name"], "big-gpu");
}

#[test]
fn explain_says_why_the_t4_was_passed_over() {
    let out = example("explain", &[]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report = text(&out.stdout);
    let t4 = report
        .lines()
        .find(|l| l.contains("gpu.nvidia.com/sim-node/gpu-0"))
        .unwrap_or_else(|| panic!("no line for the T4:\n{report}"));
    assert!(
        t4.contains("Tesla T4") && t4.contains("passed over"),
        "{t4}"
    );
    assert!(t4.contains("memory 15Gi < 40Gi"), "{t4}");
    let h100 = report
        .lines()
        .find(|l| l.contains("gpu.nvidia.com/sim-node/gpu-1 "))
        .unwrap_or_else(|| panic!("no line for the H100:\n{report}"));
    assert!(h100.ends_with("allocated"), "{h100}");
}

#[test]
fn unsatisfiable_claims_exit_1_with_the_reason_on_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let claim = dir.path().join("claim.yaml");
    let fixture =
        std::fs::read_to_string(repo("e2e/alloc-fixtures/claim-40gi.yaml")).expect("fixture");
    std::fs::write(&claim, fixture.replace("40Gi", "100Gi")).expect("write");
    let classes = repo("deviceclasses");
    let claim = claim.display().to_string();
    let out = gpu_dra(&[
        "match",
        "--slices",
        "sim:1xT4,1xH100-SXM5-80GB",
        "--classes",
        &classes,
        &claim,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("cannot be allocated"), "{stderr}");
    assert!(stderr.contains("memory 81559Mi < 100Gi"), "{stderr}");
}

/// A device already allocated to another claim (passed with --allocated) is skipped and
/// `explain` names the holder.
#[test]
fn allocated_claims_take_their_devices() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = example("match", &["-o", "json"]);
    assert!(first.status.success());
    let held = dir.path().join("held.json");
    std::fs::write(&held, &first.stdout).expect("write");
    let held = held.display().to_string();
    let out = example("explain", &["--allocated", &held]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let report = text(&out.stdout);
    assert!(
        report.contains("already allocated to default/big-gpu"),
        "{report}"
    );
    assert!(
        report.contains("once default/big-gpu releases it"),
        "{report}"
    );
}

#[test]
fn slices_from_files_and_classes_as_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let slices = gpu_dra(&[
        "slices",
        "--gpus",
        "sim:2xA100-SXM4-80GB",
        "--node-name",
        "n1",
        "-o",
        "json",
    ]);
    assert!(slices.status.success(), "{}", text(&slices.stderr));
    let slices_file = dir.path().join("slices.json");
    std::fs::write(&slices_file, &slices.stdout).expect("write");
    let classes_file = dir.path().join("classes.yaml");
    let classes =
        std::fs::read_to_string(repo("deviceclasses/gpu.nvidia.com.yaml")).expect("class");
    std::fs::write(
        &classes_file,
        format!(
            "apiVersion: v1\nkind: List\nitems:\n- {}",
            classes.replace('\n', "\n  ")
        ),
    )
    .expect("write");
    let out = gpu_dra(&[
        "match",
        "--slices",
        &slices_file.display().to_string(),
        "--classes",
        &classes_file.display().to_string(),
        "--node",
        "n1",
        &repo("e2e/alloc-fixtures/claim-40gi.yaml"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("device: gpu-0") && stdout.contains("pool: n1"),
        "{stdout}"
    );
}

#[test]
fn bad_input_is_a_usage_error() {
    let out = gpu_dra(&[
        "match",
        "--slices",
        "/nonexistent.yaml",
        "/nonexistent-claim.yaml",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("/nonexistent.yaml"));
}

/// `--feature-gates` takes kube-scheduler's syntax; the e2e cluster's gates are accepted and
/// a gate the allocator does not know is a usage error naming it.
#[test]
fn feature_gates_as_the_scheduler_takes_them() {
    let gates = include_str!("../e2e/versions.env")
        .lines()
        .find_map(|l| l.strip_prefix("K8S_FEATURE_GATES="))
        .expect("K8S_FEATURE_GATES")
        .trim();
    let out = example("match", &["-o", "json", "--feature-gates", gates]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let out = example("match", &["--feature-gates", "NoSuchGate=true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--feature-gates: unrecognized feature gate: NoSuchGate"),
        "stderr: {}",
        text(&out.stderr)
    );
    // Every allocator gate of kube-scheduler 1.37 is reproduced, derived attributes too.
    let out = example("match", &["--feature-gates", "DRADerivedAttributes=true"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
}

/// DRADerivedAttributes (alpha): with the gate, two GPUs whose derived value (here: whether
/// they are H100s) agrees are taken together; without it the scheduler refuses the request.
#[test]
fn derived_attributes_decide_constraints_with_their_gate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let claim_path = dir.path().join("claim.yaml");
    std::fs::write(
        &claim_path,
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: same-kind, namespace: default}
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.nvidia.com
        count: 2
        derivedAttributes:
        - name: derived/h100
          expression: device.attributes['gpu.nvidia.com'].productName.contains('H100')
    constraints:
    - matchAttribute: derived/h100
      requests: [gpus]
"#,
    )
    .expect("write");
    let classes = repo("deviceclasses");
    let run = |gates: &str| {
        gpu_dra(&[
            "match",
            "--slices",
            "sim:1xT4,2xH100-SXM5-80GB",
            "--classes",
            &classes,
            "--feature-gates",
            gates,
            "-o",
            "json",
            claim_path.to_str().expect("utf-8 path"),
        ])
    };
    let out = run("DRADerivedAttributes=true");
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let claim: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON claim");
    let devices: Vec<&str> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["device"].as_str())
        .collect();
    // The T4 (gpu-0) first in name order would pair with an H100 without the constraint.
    assert_eq!(devices, ["gpu-1", "gpu-2"]);
    let out = run("DRADerivedAttributes=false");
    assert_eq!(out.status.code(), Some(1), "stdout: {}", text(&out.stdout));
    assert!(
        text(&out.stderr)
            .contains("cannot handle request with derived attributes, the feature is disabled"),
        "stderr: {}",
        text(&out.stderr)
    );
    // The API server's create-time rules, with the gate: a derived attribute no constraint
    // uses, and one whose expression is no scalar, are refused naming the field.
    let fixture = std::fs::read_to_string(&claim_path).expect("read");
    for (edit, field, reason) in [
        (
            fixture.replace(
                "matchAttribute: derived/h100",
                "matchAttribute: derived/other",
            ),
            "spec.devices.requests[0].exactly.derivedAttributes[0].name",
            "must be referenced by at least one matchAttribute or distinctAttribute constraint",
        ),
        (
            fixture.replace(
                "expression: device.attributes['gpu.nvidia.com'].productName.contains('H100')",
                "expression: device.attributes",
            ),
            "spec.devices.requests[0].exactly.derivedAttributes[0].expression",
            "must evaluate to a primitive scalar (string, integer, boolean, semver)",
        ),
    ] {
        std::fs::write(&claim_path, edit).expect("write");
        let out = run("DRADerivedAttributes=true");
        assert_eq!(out.status.code(), Some(2), "stdout: {}", text(&out.stdout));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(field) && stderr.contains(reason) && stderr.contains("same-kind"),
            "stderr: {stderr}"
        );
    }
}
