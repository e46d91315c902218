//! The kubelet plugin against `kubelet-sim`, which speaks the kubelet side with the upstream Go
//! stubs (k8s.io/kubelet): registration must choose v1.DRAPlugin, and prepare/unprepare over v1
//! and v1beta1 must return exactly what the driver said.
//!
//! Needs `KUBELET_SIM` = path to the binary
//! (`cd e2e/harness && go build -o /tmp/kubelet-sim ./cmd/kubelet-sim`). Plain `cargo test` lists
//! the tests as ignored; `cargo test -- --include-ignored` (e2e/run-tests) runs them, and without
//! the binary they fail.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpu_dra::plugin::{KubeletRegistration, PluginConfig, PluginServer};
use gpu_dra::prepare::{ClaimRef, NodeDriver, PrepareResult, PreparedDevice, UnprepareResult};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.nvidia.com";

/// Claims whose UID starts with `fail-` fail; the others get one device each: `gpu-<claim name>`,
/// with a share id so the test can see v1 carry it and v1beta1 drop it.
struct ScriptedDriver;

fn prepared_device(claim: &ClaimRef) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpus".into()],
        pool_name: "node-a".into(),
        device_name: format!("gpu-{}", claim.name),
        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={}-gpu", claim.uid)],
        share_id: Some(format!("share-{}", claim.name)),
    }
}

/// Answers each claim with `success(claim)`, or an error naming `verb` for `fail-` claims.
fn answer<T>(
    claims: Vec<ClaimRef>,
    verb: &str,
    success: impl Fn(&ClaimRef) -> T,
) -> Vec<(ClaimRef, Result<T, String>)> {
    claims
        .into_iter()
        .map(|claim| {
            let result = match claim.uid.starts_with("fail-") {
                true => Err(format!("cannot {verb} {}", claim.name)),
                false => Ok(success(&claim)),
            };
            (claim, result)
        })
        .collect()
}

#[tonic::async_trait]
impl NodeDriver for ScriptedDriver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, PrepareResult)> {
        answer(claims, "prepare", |claim| vec![prepared_device(claim)])
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> Vec<(ClaimRef, UnprepareResult)> {
        answer(claims, "unprepare", |_| ())
    }
}

/// The kubelet-sim binary; a test that needs it is ignored by plain `cargo test` (e2e/run-tests
/// builds it and runs the ignored tests), and fails when run without it.
fn kubelet_sim() -> PathBuf {
    match std::env::var_os("KUBELET_SIM") {
        Some(path) => PathBuf::from(path),
        None => panic!(
            "KUBELET_SIM is not set: build it with \
             `cd e2e/harness && go build -o /tmp/kubelet-sim ./cmd/kubelet-sim` and set KUBELET_SIM=/tmp/kubelet-sim"
        ),
    }
}

/// Runs kubelet-sim and returns its JSON report; panics with its stderr when it fails.
async fn run_sim(sim: &Path, registration_socket: &Path, args: &[&str]) -> Value {
    let output = tokio::process::Command::new(sim)
        .arg("--registration-socket")
        .arg(registration_socket)
        .args(["--expect-name", DRIVER])
        .args(args)
        .output()
        .await
        .expect("run kubelet-sim");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "kubelet-sim {args:?} failed: {}\n{stderr}",
        output.status
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("kubelet-sim output is not JSON ({e}): {stderr}"))
}

async fn start(dir: &Path, advertise_health: bool) -> PluginServer {
    let mut config = PluginConfig::new(
        DRIVER,
        dir.join("plugins_registry"),
        dir.join("plugins").join(DRIVER),
        Arc::new(ScriptedDriver),
    );
    config.advertise_health = advertise_health;
    PluginServer::start(config).await.expect("start plugin")
}

const CLAIMS: [&str; 4] = [
    "--claim",
    "default/train/uid-train",
    "--claim",
    "default/broken/fail-1",
];

/// What kubelet-sim reports for [`CLAIMS`], in request order.
fn expected_claims(share_id: Value, error_verb: &str, with_devices: bool) -> Value {
    let mut train =
        json!({"namespace": "default", "name": "train", "uid": "uid-train", "error": ""});
    if with_devices {
        train["devices"] = json!([{
            "request_names": ["gpus"],
            "pool_name": "node-a",
            "device_name": "gpu-train",
            "cdi_device_ids": ["k8s.gpu.nvidia.com/claim=uid-train-gpu"],
            "share_id": share_id,
        }]);
    }
    let broken = json!({"namespace": "default", "name": "broken", "uid": "fail-1", "error": format!("cannot {error_verb} broken")});
    json!([train, broken])
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs KUBELET_SIM, the Go kubelet-sim on the upstream stubs (e2e/run-tests builds it and runs ignored tests)"]
async fn kubelet_sim_registers_and_prepares_over_v1_and_v1beta1() {
    let sim = kubelet_sim();
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), false).await;
    let reg = server.registration_socket_path().to_path_buf();

    let report = run_sim(&sim, &reg, &["register"]).await;
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["type"], "DRAPlugin");
    assert_eq!(report["name"], DRIVER);
    assert_eq!(
        report["endpoint"],
        server.dra_socket_path().to_str().unwrap()
    );
    assert_eq!(
        report["supported_versions"],
        json!(["v1.DRAPlugin", "v1beta1.DRAPlugin"])
    );
    assert_eq!(report["version"], "v1.DRAPlugin", "kubelet must pick v1");
    assert_eq!(report["registered"], true);
    assert_eq!(
        *server.registration().borrow(),
        KubeletRegistration::Registered
    );

    let mut args = vec!["prepare"];
    args.extend(CLAIMS);
    let report = run_sim(&sim, &reg, &args).await;
    assert_eq!(report["api"], "v1", "{report}");
    assert_eq!(
        report["claims"],
        expected_claims(json!("share-train"), "prepare", true),
        "{report}"
    );
    assert!(report.get("unexpected_claims").is_none(), "{report}");

    args.extend(["--api", "v1beta1"]);
    let report = run_sim(&sim, &reg, &args).await;
    assert_eq!(report["api"], "v1beta1", "{report}");
    assert_eq!(
        report["claims"],
        expected_claims(Value::Null, "prepare", true),
        "{report}"
    );

    for api in ["v1", "v1beta1"] {
        let mut args = vec!["unprepare", "--api", api];
        args.extend(CLAIMS);
        let report = run_sim(&sim, &reg, &args).await;
        assert_eq!(report["api"], api, "{report}");
        assert_eq!(
            report["claims"],
            expected_claims(Value::Null, "unprepare", false),
            "{report}"
        );
    }

    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs KUBELET_SIM, the Go kubelet-sim on the upstream stubs (e2e/run-tests builds it and runs ignored tests)"]
async fn kubelet_sim_picks_the_v1_health_service_when_advertised() {
    let sim = kubelet_sim();
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), true).await;
    let report = run_sim(&sim, server.registration_socket_path(), &["register"]).await;
    assert_eq!(report["version"], "v1.DRAPlugin", "{report}");
    assert_eq!(report["health_service"], "v1.DRAResourceHealth", "{report}");
    server.shutdown().await.unwrap();
}
