//! Nothing blocks the node agent's async workers: while a MIG carve takes two seconds (a slow
//! GPU, as real ones can be), kubelet's registration and health calls, the gRPC health probe and
//! `/healthz` keep answering at once, on the runtime `gpu-dra run` uses; claims on other GPUs
//! prepare beside the carve, claims on the same GPU wait their turn.

mod common;
use common::{claim, claim_ref};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_dra::gpu::sim::SimNode;
use gpu_dra::gpu::{
    GpuControl, GpuError, GpuInstanceInfo, MigMode, NodeInventory, Placement, SharingSettings,
};
use gpu_dra::metrics::{Metrics, MetricsServer};
use gpu_dra::plugin::proto::{dra_v1, health_v1, registration};
use gpu_dra::plugin::{PluginConfig, PluginServer};
use gpu_dra::prepare::NodeDriver;
use gpu_dra::prepare::claims::MemoryClaims;
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};

const CARVE: Duration = Duration::from_secs(2);
/// Far below the carve: an answer this fast was not queued behind it. (Typically ~1 ms.)
const PROMPT: Duration = Duration::from_millis(250);

/// The simulator with slow GPU-instance creation that counts how many creations overlap, per GPU
/// and in all.
struct SlowGpus {
    sim: SimNode,
    carve: Duration,
    carving: Mutex<BTreeMap<u32, usize>>,
    most_on_one_gpu: Mutex<usize>,
    most_in_all: Mutex<usize>,
    created: Mutex<usize>,
}

impl SlowGpus {
    fn new(sim: SimNode, carve: Duration) -> Self {
        Self {
            sim,
            carve,
            carving: Mutex::new(BTreeMap::new()),
            most_on_one_gpu: Mutex::new(0),
            most_in_all: Mutex::new(0),
            created: Mutex::new(0),
        }
    }

    fn count(&self, minor: u32, delta: isize) {
        let mut carving = self.carving.lock().expect("lock");
        let now = carving.entry(minor).or_default();
        *now = now.checked_add_signed(delta).expect("count");
        let on_gpu = *now;
        let in_all: usize = carving.values().sum();
        let mut most = self.most_on_one_gpu.lock().expect("lock");
        *most = (*most).max(on_gpu);
        let mut most = self.most_in_all.lock().expect("lock");
        *most = (*most).max(in_all);
    }
}

impl GpuControl for SlowGpus {
    fn inventory(&self) -> Result<NodeInventory, GpuError> {
        self.sim.inventory()
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        GpuControl::set_mig_mode(&self.sim, minor, enabled)
    }
    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        self.count(minor, 1);
        std::thread::sleep(self.carve);
        self.count(minor, -1);
        *self.created.lock().expect("lock") += 1;
        GpuControl::create_gpu_instance(&self.sim, minor, profile_id, placement)
    }
    fn create_compute_instance(&self, minor: u32, gi: u32) -> Result<(u32, String), GpuError> {
        GpuControl::create_compute_instance(&self.sim, minor, gi)
    }
    fn destroy_compute_instance(&self, minor: u32, gi: u32, ci: u32) -> Result<(), GpuError> {
        GpuControl::destroy_compute_instance(&self.sim, minor, gi, ci)
    }
    fn destroy_gpu_instance(&self, minor: u32, gi: u32) -> Result<(), GpuError> {
        GpuControl::destroy_gpu_instance(&self.sim, minor, gi)
    }
    fn gpu_instances(&self, minor: u32) -> Result<Vec<GpuInstanceInfo>, GpuError> {
        GpuControl::gpu_instances(&self.sim, minor)
    }
    fn sharing_settings(&self, minor: u32) -> Result<SharingSettings, GpuError> {
        GpuControl::sharing_settings(&self.sim, minor)
    }
    fn set_sharing_settings(&self, minor: u32, settings: SharingSettings) -> Result<(), GpuError> {
        GpuControl::set_sharing_settings(&self.sim, minor, settings)
    }
    fn probe(&self, minor: u32) -> Result<gpu_dra::gpu::events::GpuProbe, GpuError> {
        GpuControl::probe(&self.sim, minor)
    }
    fn event_source(&self) -> Result<Box<dyn gpu_dra::gpu::events::GpuEventSource>, GpuError> {
        GpuControl::event_source(&self.sim)
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

/// A node of simulated GPUs whose carves take `carve`, opened as the driver opens it.
fn slow_node(spec: &str, carve: Duration) -> (tempfile::TempDir, Arc<SlowGpus>, DeviceState) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = Arc::new(SlowGpus::new(
        SimNode::new(
            spec.parse().expect("spec"),
            "n1",
            Some(dir.path().join("hw.json")),
        ),
        carve,
    ));
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
    let (dir, _gpus, state) = slow_node("sim:1xH100-SXM5-80GB", CARVE);
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

// Claims on different GPUs prepare side by side; claims on the same GPU, and the same claim
// asked for twice, take turns.

/// Carves in the side-by-side test: long enough to tell overlapping from queued.
const SIDE_CARVE: Duration = Duration::from_secs(1);

#[test]
fn claims_on_different_gpus_prepare_side_by_side() {
    gpu_dra::node::runtime()
        .expect("runtime")
        .block_on(side_by_side());
}

async fn side_by_side() {
    let (dir, gpus, state) = slow_node("sim:3xH100-SXM5-80GB", SIDE_CARVE);
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

    let started = Instant::now();
    // Each as its own kubelet call, as kubelet prepares different pods; "first-on-0" twice.
    let calls = ["first-on-0", "on-1", "first-on-0", "whole-2", "second-on-0"];
    let mut tasks = Vec::new();
    for (i, name) in calls.into_iter().enumerate() {
        let driver = driver.clone();
        tasks.push(tokio::spawn(async move {
            // Start in this order, a moment apart.
            tokio::time::sleep(Duration::from_millis(20 * i as u64)).await;
            let results = driver.prepare(vec![claim_ref(name)]).await;
            (name, started.elapsed(), results)
        }));
    }
    let mut done = BTreeMap::new();
    let mut devices: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for task in tasks {
        let (name, took, results) = task.await.expect("task");
        let [(_, result)] = <[_; 1]>::try_from(results).expect("one result");
        let prepared = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        devices.entry(name).or_default().push(prepared);
        done.entry(name).or_insert(Vec::new()).push(took);
    }
    eprintln!("finished after: {done:?}");

    assert!(
        done["whole-2"][0] < SIDE_CARVE / 2,
        "a whole GPU waited for carves on other GPUs: {done:?}"
    );
    assert!(
        done["on-1"][0] < SIDE_CARVE * 2,
        "GPU 1 was carved after GPU 0, not beside it: {done:?}"
    );
    assert!(
        done["second-on-0"][0] >= SIDE_CARVE * 2,
        "two carves on GPU 0 overlapped: {done:?}"
    );
    assert_eq!(*gpus.most_on_one_gpu.lock().expect("lock"), 1);
    assert_eq!(*gpus.most_in_all.lock().expect("lock"), 2);
    // The claim asked for twice was carved once and reported the same devices both times.
    assert_eq!(*gpus.created.lock().expect("lock"), 3);
    assert_eq!(devices["first-on-0"][0], devices["first-on-0"][1]);
    assert!(
        done["first-on-0"][1] < SIDE_CARVE * 2,
        "asking again for a prepared claim waited for another claim's carve: {done:?}"
    );

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
