//! Nothing blocks the node agent's async workers: while a MIG carve takes two seconds (a slow
//! GPU, as real ones can be), kubelet's registration and health calls, the gRPC health probe and
//! `/healthz` keep answering at once, on the runtime `gpu-dra run` uses.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra::gpu::sim::SimNode;
use gpu_dra::gpu::{GpuControl, GpuError, GpuInstanceInfo, MigMode, NodeInventory, Placement};
use gpu_dra::metrics::{Metrics, MetricsServer};
use gpu_dra::plugin::proto::{dra_v1, health_v1, registration};
use gpu_dra::plugin::{PluginConfig, PluginServer};
use gpu_dra::prepare::claims::MemoryClaims;
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};

const CARVE: Duration = Duration::from_secs(2);
/// Far below the carve: an answer this fast was not queued behind it. (Typically ~1 ms.)
const PROMPT: Duration = Duration::from_millis(250);

/// The simulator with a GPU-instance creation as slow as a busy real GPU's.
struct SlowGpus(SimNode);

impl GpuControl for SlowGpus {
    fn inventory(&self) -> Result<NodeInventory, GpuError> {
        self.0.inventory()
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        GpuControl::set_mig_mode(&self.0, minor, enabled)
    }
    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        std::thread::sleep(CARVE);
        GpuControl::create_gpu_instance(&self.0, minor, profile_id, placement)
    }
    fn create_compute_instance(&self, minor: u32, gi: u32) -> Result<(u32, String), GpuError> {
        GpuControl::create_compute_instance(&self.0, minor, gi)
    }
    fn destroy_compute_instance(&self, minor: u32, gi: u32, ci: u32) -> Result<(), GpuError> {
        GpuControl::destroy_compute_instance(&self.0, minor, gi, ci)
    }
    fn destroy_gpu_instance(&self, minor: u32, gi: u32) -> Result<(), GpuError> {
        GpuControl::destroy_gpu_instance(&self.0, minor, gi)
    }
    fn gpu_instances(&self, minor: u32) -> Result<Vec<GpuInstanceInfo>, GpuError> {
        GpuControl::gpu_instances(&self.0, minor)
    }
}

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

/// Runs `call` and returns how long it took.
async fn timed<F: std::future::Future<Output = ()>>(call: F) -> Duration {
    let started = Instant::now();
    call.await;
    started.elapsed()
}

#[test]
fn kubelet_and_probes_answer_while_a_slow_carve_runs() {
    gpu_dra::node::runtime()
        .expect("runtime")
        .block_on(answers_during_a_slow_carve());
}

async fn answers_during_a_slow_carve() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = Arc::new(SlowGpus(SimNode::new(
        "sim:1xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.path().join("hw.json")),
    )));
    let config = DriverConfig {
        driver_name: "gpu.nvidia.com".into(),
        mig_policy: gpu_dra::gpu::mig::MigPolicy::Auto,
        node_name: "n1".into(),
        cdi_root: dir.path().join("cdi"),
        state_dir: dir.path().join("state"),
        dev_root: None,
    };
    let (state, _) = DeviceState::open(config, gpus).expect("open");
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
        let started = Instant::now();
        let response = dra
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![dra_v1::Claim {
                    namespace: "default".into(),
                    name: "slice".into(),
                    uid: "uid-slice".into(),
                }],
            })
            .await
            .expect("prepare")
            .into_inner();
        (started.elapsed(), response)
    });
    // Let the prepare reach the slow GPU.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut registration = registration::registration_client::RegistrationClient::new(
        connect(plugin.registration_socket_path()).await,
    );
    let mut health = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        connect(plugin.dra_socket_path()).await,
    );
    let mut probe =
        tonic_health::pb::health_client::HealthClient::new(connect(plugin.dra_socket_path()).await);
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let answers = [
            timed(async {
                registration
                    .get_info(registration::InfoRequest {})
                    .await
                    .expect("GetInfo");
            })
            .await,
            timed(async {
                health
                    .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                    .await
                    .expect("health stream");
            })
            .await,
            timed(async {
                probe
                    .check(tonic_health::pb::HealthCheckRequest::default())
                    .await
                    .expect("gRPC health");
            })
            .await,
            timed(async {
                assert!(
                    http_get(metrics_addr, "/healthz")
                        .await
                        .starts_with("HTTP/1.1 200")
                );
            })
            .await,
        ];
        slowest = answers.into_iter().fold(slowest, Duration::max);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !carve.is_finished(),
        "the measurements ran while the carve was still going"
    );
    let (took, response) = carve.await.expect("prepare task");
    assert_eq!(response.claims["uid-slice"].error, "");
    assert!(took >= CARVE, "the carve really was slow ({took:?})");
    assert!(
        slowest < PROMPT,
        "kubelet and probe calls took up to {slowest:?} while a {CARVE:?} carve ran"
    );
    eprintln!("slowest answer during a {CARVE:?} carve: {slowest:?}");
    plugin.shutdown().await.expect("shutdown");
}
