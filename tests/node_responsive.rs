//! Nothing blocks the node agent's async workers: while a MIG carve is held inside its GPU
//! instance create (a slow GPU, as real ones can be; here the test holds it for as long as it
//! likes), kubelet's registration and health calls, the gRPC health probe and `/healthz` answer,
//! on the runtime `gpu-dra run` uses; claims on other GPUs prepare beside the carve, claims on
//! the same GPU wait their turn. Each "answers while held" is checked with the carve still held,
//! so a call that waited for it could never answer: no timing decides the outcome.
//!
//! In-process, not the shipped image: the first test calls the driver through its real plugin
//! and registration sockets (kubelet's view over gRPC); the side-by-side test calls `Driver`
//! below the gRPC layer. Through the real kubelet with the image installed by the chart:
//! `e2e/pods.sh` and `e2e/bench-kubelet.sh`.

mod common;
#[path = "common/scripted.rs"]
mod scripted;
use common::{claim, claim_ref};
use scripted::Scripted;
use std::path::Path;
use std::sync::Arc;

use gpu_dra::gpu::GpuControl;
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::metrics::{Metrics, MetricsServer};
use gpu_dra::plugin::proto::{dra_v1, health_v1, registration};
use gpu_dra::plugin::{PluginConfig, PluginServer};
use gpu_dra::prepare::NodeDriver;
use gpu_dra::prepare::claims::MemoryClaims;
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};

fn mig_claim() -> k8s_openapi::api::resource::v1::ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "slice", "namespace": "default", "uid": "uid-slice"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [{
            "request": "mig", "driver": "gpu.nvidia.com", "pool": "n1",
            "device": "gpu-0-mig-1g10gb-19-0"
        }]}}}
    }))
    .expect("claim")
}

async fn connect(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", socket.display()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
}

/// A node of simulated GPUs whose carves the test holds, opened as the driver opens it.
fn held_node(spec: &str) -> (tempfile::TempDir, Arc<Scripted>, DeviceState) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gpus, _events) = Scripted::new(SimNode::new(
        spec.parse().expect("spec"),
        "n1",
        Some(dir.path().join("hw.json")),
    ));
    gpus.hold_creates();
    let config = DriverConfig {
        driver_name: "gpu.nvidia.com".into(),
        mig_policy: gpu_dra::gpu::mig::MigPolicy::Auto,
        node_name: "n1".into(),
        cdi_root: dir.path().join("cdi"),
        state_dir: dir.path().join("state"),
        dev_root: None,
        consumable: Default::default(),
        passthrough: false,
        driver_root: None,
    };
    let (state, _) = DeviceState::open(config, gpus.clone()).expect("open");
    (dir, gpus, state)
}

#[test]
fn kubelet_and_probes_answer_while_a_slow_carve_runs() {
    gpu_dra::node::runtime()
        .expect("runtime")
        .block_on(answers_during_a_slow_carve());
}

async fn answers_during_a_slow_carve() {
    let (dir, gpus, state) = held_node("sim:1xH100-SXM5-80GB");
    let claims = Arc::new(MemoryClaims::default());
    claims.insert(mig_claim());
    let driver = Arc::new(Driver::new(state, claims));
    let mut plugin_config = PluginConfig::new(
        "gpu.nvidia.com",
        dir.path().join("registry"),
        dir.path().join("plugin"),
        driver,
    );
    plugin_config.advertise_health = true;
    let plugin = PluginServer::start(plugin_config).await.expect("plugin");
    let metrics_server = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let metrics_addr = metrics_server.local_addr();
    let (_stop, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(metrics_server.serve(Arc::new(Metrics::new()), stop));

    let mut dra =
        dra_v1::dra_plugin_client::DraPluginClient::new(connect(plugin.dra_socket_path()).await);
    let carve = tokio::spawn(async move {
        dra.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "default".into(),
                name: "slice".into(),
                uid: "uid-slice".into(),
            }],
        })
        .await
        .expect("prepare")
        .into_inner()
    });
    gpus.wait_carving(0, 1, "the prepare never reached its GPU instance create")
        .await;

    let mut registration = registration::registration_client::RegistrationClient::new(
        connect(plugin.registration_socket_path()).await,
    );
    let mut health = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        connect(plugin.dra_socket_path()).await,
    );
    let mut probe =
        tonic_health::pb::health_client::HealthClient::new(connect(plugin.dra_socket_path()).await);
    for _ in 0..5 {
        gpus.answers("kubelet's GetInfo", async {
            registration
                .get_info(registration::InfoRequest {})
                .await
                .expect("GetInfo");
        })
        .await;
        gpus.answers("kubelet's health stream", async {
            health
                .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                .await
                .expect("health stream");
        })
        .await;
        gpus.answers("the gRPC health probe", async {
            probe
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .expect("gRPC health");
        })
        .await;
        let healthz = gpus
            .answers("/healthz", http_get(metrics_addr, "/healthz"))
            .await;
        assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    }
    assert!(
        !carve.is_finished(),
        "the carve ended while held in its GPU instance create"
    );
    gpus.release(0);
    let response = carve.await.expect("prepare task");
    assert_eq!(response.claims["uid-slice"].error, "");
    assert_eq!(gpus.gates().created, 1);
    plugin.shutdown().await.expect("shutdown");
}

// Claims on different GPUs prepare side by side; claims on the same GPU, and the same claim
// asked for twice, take turns.

#[test]
fn claims_on_different_gpus_prepare_side_by_side() {
    gpu_dra::node::runtime()
        .expect("runtime")
        .block_on(side_by_side());
}

async fn side_by_side() {
    let (dir, gpus, state) = held_node("sim:3xH100-SXM5-80GB");
    let claims = Arc::new(MemoryClaims::default());
    let wanted = [
        ("first-on-0", "gpu-0-mig-1g10gb-19-0"),
        ("second-on-0", "gpu-0-mig-1g10gb-19-1"),
        ("on-1", "gpu-1-mig-1g10gb-19-0"),
        ("whole-2", "gpu-2"),
    ];
    for (name, device) in wanted {
        claims.insert(claim(name, device));
    }
    let driver = Arc::new(Driver::new(state, claims));
    // Each as its own kubelet call, as kubelet prepares different pods.
    let prepare = |name: &'static str| {
        let driver = driver.clone();
        tokio::spawn(async move {
            let results = driver.prepare(vec![claim_ref(name)]).await;
            let [(_, result)] = <[_; 1]>::try_from(results).expect("one result");
            result.unwrap_or_else(|e| panic!("{name}: {e}"))
        })
    };

    // GPU 0's carve is held; GPU 1's carve starts beside it.
    let first_on_0 = prepare("first-on-0");
    gpus.wait_carving(0, 1, "first-on-0 never reached its GPU instance create")
        .await;
    let on_1 = prepare("on-1");
    gpus.wait_carving(1, 1, "GPU 1 is not carved beside GPU 0")
        .await;
    // A whole GPU needs no carve and waits for none.
    let whole_2 = gpus.answers("whole-2", prepare("whole-2")).await;
    let whole_2 = whole_2.expect("whole-2");
    // The same claim asked for again, and a second claim on GPU 0, while first-on-0 is held.
    let first_again = prepare("first-on-0");
    let second_on_0 = prepare("second-on-0");
    // first-on-0 finishes; asking for it again must not wait for second-on-0's carve, which
    // now starts on GPU 0 and is held.
    gpus.release(0);
    let first = first_on_0.await.expect("first-on-0");
    gpus.wait_carving(0, 1, "second-on-0 never reached its GPU instance create")
        .await;
    let again = gpus
        .answers("first-on-0 asked for again", first_again)
        .await
        .expect("first-on-0 again");
    assert_eq!(first, again, "the claim asked for twice got other devices");
    assert!(!second_on_0.is_finished(), "second-on-0 ended while held");
    gpus.release(0);
    gpus.release(1);
    let (second, on_1) = (
        second_on_0.await.expect("second-on-0"),
        on_1.await.expect("on-1"),
    );
    assert!(!first.is_empty() && !second.is_empty() && !on_1.is_empty());
    assert!(!whole_2.is_empty());
    {
        let gates = gpus.gates();
        assert_eq!(gates.most_on_one_gpu, 1, "two carves on GPU 0 overlapped");
        assert_eq!(
            gates.most_in_all, 2,
            "GPUs 0 and 1 were not carved side by side"
        );
        // The claim asked for twice was carved once.
        assert_eq!(gates.created, 3);
    }

    let checkpoint = driver.with_state(|s| s.checkpoint()).await;
    assert_eq!(checkpoint.claims.len(), 4);
    assert!(checkpoint.claims.values().all(|c| c.is_completed()));
    let instances = |minor| gpus.gpu_instances(minor).expect("instances").len();
    assert_eq!((instances(0), instances(1)), (2, 1));

    // Unprepare everything at once, in one call and in separate ones.
    let (together, alone) = tokio::join!(
        driver.unprepare(vec![claim_ref("first-on-0"), claim_ref("on-1")]),
        driver.unprepare(vec![claim_ref("second-on-0")]),
    );
    let whole = driver.unprepare(vec![claim_ref("whole-2")]).await;
    for (claim, result) in together.into_iter().chain(alone).chain(whole) {
        result.unwrap_or_else(|e| panic!("unprepare {claim}: {e}"));
    }
    assert!(
        driver
            .with_state(|s| s.checkpoint())
            .await
            .claims
            .is_empty()
    );
    assert_eq!((instances(0), instances(1)), (0, 0));
    let specs = std::fs::read_dir(dir.path().join("cdi"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(specs, 0, "every CDI spec removed");
}
