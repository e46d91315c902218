//! The kubelet's path is concurrent: kubelet calls NodePrepareResources once per pod, and those
//! calls run side by side through the plugin's gRPC socket, kept apart only by the claims and GPUs
//! they hold; a claim whose API reads are slow delays only its own pod. In rolling-update mode
//! (the chart's default, `seamlessUpgrade: true`) that holds while the instance is alone; only
//! while a second instance runs are operations serialized under the node lock, and a prepare
//! cancelled by kubelet's deadline keeps that lock until its work is done.
//!
//! These run the driver in-process behind its real gRPC sockets (the kubelet's view), with
//! simulated GPUs whose GPU instance creates the test holds inside the GPU and lets go one by one
//! (`tests/common/scripted.rs`), and a claim read the test holds likewise: "side by side" is seen
//! as carves inside their GPUs at once, "does not wait" as an answer that comes while what it
//! must not wait for is still held, so a machine's load cannot fail these tests. "Take turns" is
//! seen as never two carves at once, after giving a wrong driver half a second to start a second
//! one. `e2e/bench-kubelet.sh` measures latencies through the real kubelet with the image
//! installed by the chart.
mod common;
#[path = "common/scripted.rs"]
mod scripted;
use common::{claim, claim_ref};
use scripted::Scripted;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_dra::gpu::GpuControl;
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

/// How long a wrong driver is given to start a second carve where operations must take turns.
const TURN: Duration = Duration::from_millis(500);

/// The node's hardware, kept in `dir` so that several driver instances share it, with GPU
/// instance creates held until the test releases them.
fn node(dir: &Path) -> Arc<Scripted> {
    let (gpus, _events) = Scripted::new(SimNode::new(
        "sim:4xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.join("hw.json")),
    ));
    gpus.hold_creates();
    gpus
}

fn open_state(dir: &Path, gpus: &Arc<Scripted>) -> DeviceState {
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
    DeviceState::open(config, gpus.clone()).expect("open").0
}

/// GPU instances on GPU 0, as the hardware has them.
fn instances_on_gpu0(gpus: &Scripted) -> usize {
    gpus.gpu_instances(0).expect("GPU 0").len()
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

/// Answers like `inner`, but a read of the claim named `slow` waits until `release` is notified
/// (an API server that is slow for one claim, for as long as the test likes).
struct SlowReads {
    inner: Arc<MemoryClaims>,
    release: Arc<tokio::sync::Semaphore>,
}

#[tonic::async_trait]
impl ClaimSource for SlowReads {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        if name == "slow" {
            let _read = self.release.acquire().await.map_err(|e| e.to_string())?;
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
/// on a connection of its own; each task ends when its call was answered (and fails unless the
/// claim was prepared with one device).
async fn prepare_at_once(socket: &Path, names: &[&str]) -> Vec<tokio::task::JoinHandle<()>> {
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
        }));
    }
    calls
}

/// Waits for each call to be answered; `what` says what it must not be waiting for.
async fn answered(gpus: &Scripted, calls: Vec<tokio::task::JoinHandle<()>>, what: &str) {
    for call in calls {
        gpus.answers(what, call).await.expect("call");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    gpu_dra::node::runtime().expect("runtime")
}

/// Three pods, each a MIG claim on its own GPU, prepared at once through the plugin socket: the
/// three carves are inside their GPUs at once, and all three pods are answered while a fourth
/// pod's claim read from the API server is still held.
#[test]
fn pods_on_different_gpus_prepare_side_by_side_through_the_socket() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let gpus = node(dir.path());
        let slow_read = Arc::new(tokio::sync::Semaphore::new(0));
        let driver = Driver::new(
            open_state(dir.path(), &gpus),
            Arc::new(SlowReads {
                inner: claims(),
                release: slow_read.clone(),
            }),
        );
        let plugin = serve(dir.path(), Arc::new(driver)).await;
        let mut calls = prepare_at_once(
            plugin.dra_socket_path(),
            &["mig-0", "mig-1", "mig-2", "slow"],
        )
        .await;
        let slow = calls.pop().expect("the slow call");
        for minor in 0..3 {
            gpus.wait_carving(
                minor,
                1,
                "carves on different GPUs are serialized, or wait for the slow claim read",
            )
            .await;
        }
        for minor in 0..3 {
            gpus.release(minor);
        }
        answered(
            &gpus,
            calls,
            "a pod's prepare, for another pod's claim read",
        )
        .await;
        assert!(!slow.is_finished(), "the slow claim was answered unread");
        slow_read.add_permits(1);
        gpus.wait_carving(3, 1, "the slow claim, once read, is carved")
            .await;
        gpus.release(3);
        answered(&gpus, vec![slow], "the slow claim").await;
        assert_eq!(gpus.gates().most_in_all, 3);
    });
}

/// The chart's default (rolling-update mode: a node lock and a presence file) changes nothing
/// while this instance is alone; while a second instance runs, operations take turns.
#[test]
fn rolling_update_mode_serializes_only_while_another_instance_runs() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let gpus = node(dir.path());
        let plugin_dir = dir.path().join("plugin");
        std::fs::create_dir_all(&plugin_dir).expect("plugin dir");
        let instances = plugin_dir.join(lock::INSTANCES_DIR);
        let driver = Driver::new(open_state(dir.path(), &gpus), claims()).with_node_lock(
            NodeLock::open(&plugin_dir.join(lock::SERIALIZE_LOCK)).expect("lock"),
            Presence::register(&instances, "this-pod").expect("presence"),
        );
        let driver = Arc::new(driver);
        let plugin = serve(dir.path(), driver.clone()).await;
        let alone = prepare_at_once(plugin.dra_socket_path(), &["mig-0", "mig-1"]).await;
        gpus.wait_carving(0, 1, "alone: mig-0's carve").await;
        gpus.wait_carving(1, 1, "alone on the node, carves on two GPUs overlap")
            .await;
        gpus.release(0);
        gpus.release(1);
        answered(&gpus, alone, "alone").await;

        // The new pod of a rolling update registers: from now on one operation at a time.
        let other = Presence::register(&instances, "next-pod").expect("presence");
        gpus.gates().most_in_all = 0;
        let both = prepare_at_once(plugin.dra_socket_path(), &["mig-2", "slow"]).await;
        let carving = || gpus.carving(2) + gpus.carving(3);
        // One of the two starts; which one is the node's choice.
        tokio::select! {
            () = gpus.wait_carving(2, 1, "with another instance: no carve started") => {}
            () = gpus.wait_carving(3, 1, "with another instance: no carve started") => {}
        }
        tokio::time::sleep(TURN).await;
        assert_eq!(
            carving(),
            1,
            "while two instances run, operations are serialized"
        );
        let (first, second) = if gpus.carving(2) == 1 { (2, 3) } else { (3, 2) };
        gpus.release(first);
        gpus.wait_carving(second, 1, "the second operation, after the first")
            .await;
        gpus.release(second);
        answered(&gpus, both, "with another instance").await;
        assert_eq!(gpus.gates().most_in_all, 1, "never two carves at once");

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
        gpus.wait_carving(0, 1, "alone again: mig-0's carve").await;
        gpus.wait_carving(1, 1, "alone again, carves overlap").await;
        gpus.release(0);
        gpus.release(1);
        answered(&gpus, again, "alone again").await;
        assert!(
            !instances.join("next-pod.lock").exists(),
            "the gone instance's presence file was removed"
        );
    });
}

/// Kubelet's deadline cancels a prepare in the middle of its carve; kubelet then calls the other
/// instance of a rolling update for the same claim. The second instance must wait for the first
/// one's carve (the node lock belongs to the work, not to the cancelled call) and then find the
/// claim prepared, instead of rolling back an instance still being built and carving another
/// (which, with one carve released, would never finish).
#[test]
fn a_cancelled_prepare_keeps_the_node_lock_until_its_work_is_done() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let gpus = node(dir.path());
        let plugin_dir = dir.path().join("plugin");
        std::fs::create_dir_all(&plugin_dir).expect("plugin dir");
        let instances = plugin_dir.join(lock::INSTANCES_DIR);
        let lock_path = plugin_dir.join(lock::SERIALIZE_LOCK);
        let claims = claims();
        let old = Arc::new(
            Driver::new(open_state(dir.path(), &gpus), claims.clone()).with_node_lock(
                NodeLock::open(&lock_path).expect("lock"),
                Presence::register(&instances, "old-pod").expect("presence"),
            ),
        );
        // The new instance starts while the old one runs (in-process here: flock treats each
        // open file description as its own holder, as for two processes).
        let new = Arc::new(
            Driver::new(open_state(dir.path(), &gpus), claims.clone()).with_node_lock(
                NodeLock::open(&lock_path).expect("lock"),
                Presence::register(&instances, "new-pod").expect("presence"),
            ),
        );

        // Kubelet gives up on the old instance's call while its carve is inside the GPU.
        tokio::select! {
            _ = old.prepare(vec![claim_ref("mig-0")]) => {
                gpus.fail("the first call ended while its carve was held".into())
            }
            () = gpus.wait_carving(0, 1, "the first call's carve") => {}
        }
        let retried = {
            let new = new.clone();
            tokio::spawn(async move { new.prepare(vec![claim_ref("mig-0")]).await })
        };
        tokio::time::sleep(TURN).await;
        assert!(
            !retried.is_finished(),
            "the retry ran while the cancelled carve still held the node"
        );
        assert_eq!(gpus.carving(0), 1, "the retry started a carve of its own");
        gpus.release(0);
        let retried = gpus
            .answers("the retry, once the cancelled carve is done", retried)
            .await
            .expect("retry task");
        let [(_, result)] = <[_; 1]>::try_from(retried).expect("one result");
        let devices = result.expect("the retried prepare succeeds");

        // One carve, recorded once; both instances agree.
        assert_eq!(
            instances_on_gpu0(&gpus),
            1,
            "exactly one GPU instance was carved"
        );
        assert_eq!(gpus.gates().created, 1);
        let checkpoint = new.with_state(|s| s.checkpoint()).await;
        let entry = &checkpoint.claims["uid-mig-0"];
        assert!(entry.is_completed());
        assert_eq!(devices.len(), 1);
        // The old instance, asked again, adopts the new one's checkpoint and agrees.
        let again = old.prepare(vec![claim_ref("mig-0")]).await;
        let [(_, again)] = <[_; 1]>::try_from(again).expect("one result");
        assert_eq!(again.expect("prepared"), devices);
        assert_eq!(
            instances_on_gpu0(&gpus),
            1,
            "asking the old instance again carved nothing"
        );
    });
}

/// A driver instance of a rolling update on the node in `dir` (registered as `name`).
fn instance(
    dir: &Path,
    gpus: &Arc<Scripted>,
    claims: &Arc<MemoryClaims>,
    name: &str,
) -> Arc<Driver> {
    let plugin_dir = dir.join("plugin");
    std::fs::create_dir_all(&plugin_dir).expect("plugin dir");
    Arc::new(
        Driver::new(open_state(dir, gpus), claims.clone()).with_node_lock(
            NodeLock::open(&plugin_dir.join(lock::SERIALIZE_LOCK)).expect("lock"),
            Presence::register(&plugin_dir.join(lock::INSTANCES_DIR), name).expect("presence"),
        ),
    )
}

/// Prepares one claim on `driver` whose carve on GPU `minor` the test lets go at once.
async fn prepare_carving(driver: &Arc<Driver>, gpus: &Scripted, name: &str, minor: u32) {
    let call = {
        let driver = driver.clone();
        let name = name.to_string();
        tokio::spawn(async move { driver.prepare(vec![claim_ref(&name)]).await })
    };
    gpus.wait_carving(minor, 1, &format!("{name}'s carve"))
        .await;
    gpus.release(minor);
    let answered = gpus
        .answers(&format!("{name}'s prepare"), call)
        .await
        .expect("prepare task");
    for (claim, result) in answered {
        result.unwrap_or_else(|e| panic!("prepare {claim}: {e}"));
    }
}

/// The new pod of an upgrade prepares a claim and goes away (a crash-looping image, `kubectl
/// rollout undo`) while the old pod does nothing. The old pod's next operations must start from
/// what the new one wrote: its next prepare must not write the old book over the new pod's
/// claim, and its unprepare of that claim must destroy the claim's MIG device. Here the two
/// instances run in-process (flock treats each open file description as its own holder, as for
/// two processes) and are called below the socket; `e2e/rolling-update.sh` runs the same story
/// with the image installed by the chart, through the real kubelet.
#[test]
fn an_instance_that_prepared_and_died_unseen_is_read_before_the_next_operation() {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let gpus = node(dir.path());
        let claims = claims();
        let old = instance(dir.path(), &gpus, &claims, "old-pod");
        prepare_carving(&old, &gpus, "mig-0", 0).await;

        // Between two of the old pod's operations, the new pod starts, prepares and dies.
        let new = instance(dir.path(), &gpus, &claims, "new-pod");
        prepare_carving(&new, &gpus, "mig-1", 1).await;
        drop(new);
        assert_eq!(gpus.gpu_instances(1).expect("GPU 1").len(), 1);

        prepare_carving(&old, &gpus, "mig-2", 2).await;
        let on_disk = open_state(dir.path(), &gpus).checkpoint();
        for uid in ["uid-mig-0", "uid-mig-1", "uid-mig-2"] {
            assert!(
                on_disk.claims.get(uid).is_some_and(|c| c.is_completed()),
                "{uid} is recorded on disk: {:?}",
                on_disk.claims.keys().collect::<Vec<_>>()
            );
        }
        let unprepared = old.unprepare(vec![claim_ref("mig-1")]).await;
        for (claim, result) in unprepared {
            result.unwrap_or_else(|e| panic!("unprepare {claim}: {e}"));
        }
        assert!(
            gpus.gpu_instances(1).expect("GPU 1").is_empty(),
            "the old pod destroyed the MIG device the new pod carved"
        );
        assert!(
            !dir.path()
                .join("plugin")
                .join(lock::INSTANCES_DIR)
                .join("new-pod.lock")
                .exists(),
            "the gone instance is forgotten once its state was read"
        );
    });
}
