//! The kubelet's path is concurrent: kubelet calls NodePrepareResources once per pod, and those
//! calls run side by side through the plugin's gRPC socket, kept apart only by the claims and GPUs
//! they hold; a claim whose API reads are slow delays only its own pod. In rolling-update mode
//! (the chart's default, `seamlessUpgrade: true`) that holds while the instance is alone; only
//! while a second instance runs are operations serialized under the node lock, and a prepare
//! cancelled by kubelet's deadline keeps that lock until its work is done.
//!
//! These run the driver in-process behind its real gRPC sockets (the kubelet's view), with
//! simulated GPUs whose GPU instance creates take `CARVE` (`SimNode::with_mig_delay`, as
//! `gpu-dra run --sim-mig-delay` does). `e2e/bench-kubelet.sh` measures the same through the real
//! kubelet with the image installed by the chart.
mod common;
use common::{claim, claim_ref};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_dra::gpu::sim::SimNode;
use gpu_dra::plugin::proto::dra_v1;
use gpu_dra::plugin::{PluginConfig, PluginServer};
use gpu_dra::prepare::claims::{ClaimSource, MemoryClaims};
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::lock::{self, NodeLock, Presence};
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use gpu_dra::prepare::{ClaimRef, NodeDriver};
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use tonic::transport::{Channel, Endpoint};

/// Long enough to tell carves that overlap from carves that queue.
const CARVE: Duration = Duration::from_secs(1);

/// The node's hardware, kept in `dir` so that several driver instances share it.
fn sim(dir: &Path) -> SimNode {
    SimNode::new(
        "sim:4xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.join("hw.json")),
    )
    .with_mig_delay(CARVE)
}

fn open_state(dir: &Path) -> DeviceState {
    let config = DriverConfig {
        driver_name: "gpu.nvidia.com".into(),
        mig_policy: gpu_dra::gpu::mig::MigPolicy::Auto,
        node_name: "n1".into(),
        cdi_root: dir.join("cdi"),
        state_dir: dir.join("state"),
        dev_root: None,
        consumable: Default::default(),
        passthrough: false,
        driver_root: None,
    };
    DeviceState::open(config, Arc::new(sim(dir)))
        .expect("open")
        .0
}

/// A MIG claim on each GPU, and one whole GPU.
fn claims() -> Arc<MemoryClaims> {
    let claims = Arc::new(MemoryClaims::default());
    for minor in 0..3 {
        claims.insert(claim(
            &format!("mig-{minor}"),
            &format!("gpu-{minor}-mig-1g10gb-19-0"),
        ));
    }
    claims.insert(claim("slow", "gpu-3-mig-1g10gb-19-0"));
    claims
}

/// Answers like `inner`, but reads of the claim named `slow` take `delay` (an API server that
/// is slow for one claim).
struct SlowReads {
    inner: Arc<MemoryClaims>,
    delay: Duration,
}

#[tonic::async_trait]
impl ClaimSource for SlowReads {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        if name == "slow" {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.get(namespace, name).await
    }

    async fn set_device_status(
        &self,
        namespace: &str,
        name: &str,
        devices: Vec<AllocatedDeviceStatus>,
    ) -> Result<(), String> {
        self.inner.set_device_status(namespace, name, devices).await
    }

    async fn warn(&self, claim: &ClaimRef, reason: &str, note: &str) -> Result<(), String> {
        self.inner.warn(claim, reason, note).await
    }
}

async fn serve(dir: &Path, driver: Arc<Driver>) -> PluginServer {
    let config = PluginConfig::new(
        "gpu.nvidia.com",
        dir.join("registry"),
        dir.join("plugin"),
        driver,
    );
    PluginServer::start(config).await.expect("plugin")
}

async fn connect(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", socket.display()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// Sends one NodePrepareResources call per claim at once, as kubelet does for as many pods, each
/// on a connection of its own; returns when each call was answered, in `names` order.
async fn prepare_at_once(socket: &Path, names: &[&str]) -> Vec<Duration> {
    let started = Instant::now();
    let mut calls = Vec::new();
    for name in names {
        let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(connect(socket).await);
        let name = name.to_string();
        calls.push(tokio::spawn(async move {
            let response = client
                .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                    claims: vec![dra_v1::Claim {
                        namespace: "default".into(),
                        name: name.clone(),
                        uid: format!("uid-{name}"),
                    }],
                })
                .await
                .expect("NodePrepareResources")
                .into_inner();
            let answer = &response.claims[&format!("uid-{name}")];
            assert!(answer.error.is_empty(), "{name}: {}", answer.error);
            assert_eq!(answer.devices.len(), 1, "{name}");
            started.elapsed()
        }));
    }
    let mut done = Vec::new();
    for call in calls {
        done.push(call.await.expect("call"));
    }
    done
}

fn runtime() -> tokio::runtime::Runtime {
    gpu_dra::node::runtime().expect("runtime")
}

/// Three pods, each a MIG claim on its own GPU, prepared at once through the plugin socket: the
/// three carves overlap (about one carve in all, not three). A fourth pod whose claim takes 3 s
/// to read from the API server does not hold the others up.
#[test]
fn pods_on_different_gpus_prepare_side_by_side_through_the_socket() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let driver = Driver::new(
            open_state(dir.path()),
            Arc::new(SlowReads {
                inner: claims(),
                delay: 3 * CARVE,
            }),
        );
        let plugin = serve(dir.path(), Arc::new(driver)).await;
        let done =
            prepare_at_once(plugin.dra_socket_path(), &["mig-0", "mig-1", "mig-2", "slow"]).await;
        eprintln!("answered after {done:?}");
        for (name, took) in ["mig-0", "mig-1", "mig-2"].iter().zip(&done) {
            assert!(
                *took < CARVE * 2,
                "{name} took {took:?}: carves on different GPUs were serialized, or waited for the slow claim read"
            );
        }
        assert!(done[3] >= 3 * CARVE, "the slow claim's read was slow");
        assert!(done[3] < 5 * CARVE, "and only that: {done:?}");
    });
}

/// The chart's default (rolling-update mode: a node lock and a presence file) changes nothing
/// while this instance is alone; while a second instance runs, operations take turns.
#[test]
fn rolling_update_mode_serializes_only_while_another_instance_runs() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let plugin_dir = dir.path().join("plugin");
        std::fs::create_dir_all(&plugin_dir).expect("plugin dir");
        let instances = plugin_dir.join(lock::INSTANCES_DIR);
        let driver = Driver::new(open_state(dir.path()), claims()).with_node_lock(
            NodeLock::open(&plugin_dir.join(lock::SERIALIZE_LOCK)).expect("lock"),
            Presence::register(&instances, "this-pod").expect("presence"),
        );
        let driver = Arc::new(driver);
        let plugin = serve(dir.path(), driver.clone()).await;
        let alone = prepare_at_once(plugin.dra_socket_path(), &["mig-0", "mig-1"]).await;
        eprintln!("alone: answered after {alone:?}");
        assert!(
            alone.iter().all(|took| *took < CARVE * 2),
            "alone on the node, carves on two GPUs overlap: {alone:?}"
        );

        // The new pod of a rolling update registers: from now on one operation at a time.
        let other = Presence::register(&instances, "next-pod").expect("presence");
        let both = prepare_at_once(plugin.dra_socket_path(), &["mig-2", "slow"]).await;
        eprintln!("with another instance: answered after {both:?}");
        let last = both.iter().max().copied().unwrap_or_default();
        assert!(
            last >= CARVE * 2,
            "while two instances run, operations are serialized: {both:?}"
        );

        // It is gone again (its process exited): side by side once more.
        drop(other);
        let unprepared = tokio::join!(
            driver.unprepare(vec![claim_ref("mig-0")]),
            driver.unprepare(vec![claim_ref("mig-1")]),
        );
        for (claim, result) in unprepared.0.into_iter().chain(unprepared.1) {
            result.unwrap_or_else(|e| panic!("unprepare {claim}: {e}"));
        }
        let again = prepare_at_once(plugin.dra_socket_path(), &["mig-0", "mig-1"]).await;
        assert!(
            again.iter().all(|took| *took < CARVE * 2),
            "alone again, carves overlap: {again:?}"
        );
        assert!(
            !instances.join("next-pod.lock").exists(),
            "the gone instance's presence file was removed"
        );
    });
}

/// Kubelet's deadline cancels a prepare in the middle of its carve; kubelet then calls the other
/// instance of a rolling update for the same claim. The second instance must wait for the first
/// one's carve (the node lock belongs to the work, not to the cancelled call) and then find the
/// claim prepared, instead of rolling back an instance still being built and carving another.
#[test]
fn a_cancelled_prepare_keeps_the_node_lock_until_its_work_is_done() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let plugin_dir = dir.path().join("plugin");
        std::fs::create_dir_all(&plugin_dir).expect("plugin dir");
        let instances = plugin_dir.join(lock::INSTANCES_DIR);
        let lock_path = plugin_dir.join(lock::SERIALIZE_LOCK);
        let claims = claims();
        let old = Driver::new(open_state(dir.path()), claims.clone()).with_node_lock(
            NodeLock::open(&lock_path).expect("lock"),
            Presence::register(&instances, "old-pod").expect("presence"),
        );
        // The new instance starts while the old one runs (in-process here: flock treats each
        // open file description as its own holder, as for two processes).
        let new = Driver::new(open_state(dir.path()), claims.clone()).with_node_lock(
            NodeLock::open(&lock_path).expect("lock"),
            Presence::register(&instances, "new-pod").expect("presence"),
        );

        let started = Instant::now();
        let cancelled =
            tokio::time::timeout(CARVE / 5, old.prepare(vec![claim_ref("mig-0")])).await;
        assert!(cancelled.is_err(), "the first call was cancelled mid-carve");
        let retried = new.prepare(vec![claim_ref("mig-0")]).await;
        let took = started.elapsed();
        let [(_, result)] = <[_; 1]>::try_from(retried).expect("one result");
        let devices = result.expect("the retried prepare succeeds");
        assert!(
            took >= CARVE,
            "the retry ran while the cancelled carve still held the node ({took:?})"
        );

        // One carve, recorded once; both instances agree.
        let instances_on_gpu0 = sim(dir.path())
            .state()
            .expect("sim state")
            .gpus
            .iter()
            .find(|g| g.minor == 0)
            .map(|g| g.gpu_instances.len())
            .unwrap_or_default();
        assert_eq!(instances_on_gpu0, 1, "exactly one GPU instance was carved");
        let checkpoint = new.with_state(|s| s.checkpoint()).await;
        let entry = &checkpoint.claims["uid-mig-0"];
        assert!(entry.is_completed());
        assert_eq!(devices.len(), 1);
        // The old instance, asked again, adopts the new one's checkpoint and agrees.
        let again = old.prepare(vec![claim_ref("mig-0")]).await;
        let [(_, again)] = <[_; 1]>::try_from(again).expect("one result");
        assert_eq!(again.expect("prepared"), devices);
        let instances_on_gpu0 = sim(dir.path())
            .state()
            .expect("sim state")
            .gpus
            .iter()
            .find(|g| g.minor == 0)
            .map(|g| g.gpu_instances.len())
            .unwrap_or_default();
        assert_eq!(
            instances_on_gpu0, 1,
            "asking the old instance again carved nothing"
        );
    });
}
