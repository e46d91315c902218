//! Health events never wait for the node's operations, and a flood of application XIDs costs the
//! node nothing. The monitor runs here as `gpu-dra run` runs it (its own task, NVML-style events
//! from a thread, the driver's state), over simulated GPUs whose GPU instance creates the test
//! holds at a gate; events are fed through a scripted event source so that the test controls
//! exactly what arrives and when, and nothing here depends on timing. In-process, below the
//! gRPC layer: `e2e/health.sh` checks taints end to end on the control plane, and `e2e/pods.sh`
//! the eviction on the real node with the image installed by the chart.
mod common;
#[path = "common/scripted.rs"]
mod scripted;
use common::{claim, claim_ref};
use scripted::{Scripted, start_monitor};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_dra::gpu::events::{GpuEvent, GpuEventKind};
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::health::HealthChange;
use gpu_dra::health::monitor::HealthSink;
use gpu_dra::plugin::DeviceHealth;
use gpu_dra::prepare::NodeDriver;
use gpu_dra::prepare::claims::MemoryClaims;
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use gpu_dra::slices::{self, SliceOptions};
use k8s_openapi::api::resource::v1::DeviceTaint;

/// The devices' taints, as the monitor hands them to the slices.
type TaintMap = BTreeMap<String, Vec<DeviceTaint>>;

/// Records every taint change with when it came, and counts the events the monitor saw.
#[derive(Default)]
struct Taints(Mutex<Vec<(Instant, TaintMap)>>, AtomicUsize);

impl HealthSink for Taints {
    fn taints_changed(&self, taints: TaintMap) {
        self.0
            .lock()
            .expect("taints")
            .push((Instant::now(), taints));
    }
    fn changed(&self, _change: &HealthChange) {}
    fn event_seen(&self, _event: &GpuEvent) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
    fn device_health(&self, _health: &[DeviceHealth]) {}
}

impl Taints {
    /// When a taint on `device` was first published.
    fn first_on(&self, device: &str) -> Option<Instant> {
        self.0
            .lock()
            .expect("taints")
            .iter()
            .find(|(_, taints)| taints.contains_key(device))
            .map(|(at, _)| *at)
    }
}

struct Node {
    _dir: tempfile::TempDir,
    gpus: Arc<Scripted>,
    driver: Arc<Driver>,
    claims: Arc<MemoryClaims>,
    events: std::sync::mpsc::Sender<GpuEvent>,
    taints: Arc<Taints>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

/// Two H100s (whose GPU instance creates the test can hold), the driver, and the monitor running
/// with periodic probes and rescans far away (only events drive it).
async fn start() -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gpus, events) = Scripted::new(SimNode::new(
        "sim:2xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.path().join("hw.json")),
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
    let options = SliceOptions {
        modes: Some(state.modes().clone()),
        ..SliceOptions::new("gpu.nvidia.com", "n1")
    };
    let published = slices::build(&state.inventory(), &options).expect("slices");
    let claims = Arc::new(MemoryClaims::default());
    claims.insert(claim("carve-0", "gpu-0-mig-1g10gb-19-0"));
    claims.insert(claim("whole-1", "gpu-1"));
    let driver = Arc::new(Driver::new(state, claims.clone()));
    let taints = Arc::new(Taints::default());
    let shutdown = start_monitor(
        gpus.clone(),
        driver.clone(),
        published,
        dir.path().join("state"),
        taints.clone(),
    )
    .await;
    Node {
        _dir: dir,
        gpus,
        driver,
        claims,
        events,
        taints,
        shutdown,
    }
}

impl Node {
    /// Waits (up to the scripted deadline) until `device` is tainted.
    async fn wait_tainted(&self, device: &str, why: &str) {
        let deadline = Instant::now() + scripted::DEADLINE;
        while self.taints.first_on(device).is_none() {
            if Instant::now() > deadline {
                self.gpus.fail(format!("{device} not tainted: {why}"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn xid(minor: u32, code: u64) -> GpuEvent {
    GpuEvent {
        minor,
        kind: GpuEventKind::Xid { code },
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

/// XID 79 arrives on the GPU a carve is working on: its taint is published while the carve is
/// held inside its GPU instance create, which the test lets go only after the taint (the rescan
/// the fault asks for waits for nobody; it once held every GPU and so published the taint only
/// after the carve, which here would never end: the test fails at its deadline instead).
#[test]
fn a_fault_during_a_slow_carve_is_tainted_at_once() {
    gpu_dra::node::runtime().expect("runtime").block_on(async {
        let node = start().await;
        node.gpus.hold_creates();
        let driver = node.driver.clone();
        let carving = tokio::spawn(async move { driver.prepare(vec![claim_ref("carve-0")]).await });
        node.gpus
            .wait_carving(0, 1, "the carve never reached its GPU instance create")
            .await;
        let deadline = Instant::now() + scripted::DEADLINE;
        let sent = Instant::now();
        node.events.send(xid(0, 79)).expect("send");
        let tainted = loop {
            if let Some(at) = node.taints.first_on("gpu-0") {
                break at;
            }
            if Instant::now() > deadline {
                node.gpus
                    .fail("XID 79 on GPU 0 not tainted while a carve is held on it".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        eprintln!("tainted {:?} after the event", tainted - sent);
        assert!(
            !carving.is_finished(),
            "the carve ended while held in its GPU instance create"
        );
        node.gpus.open_all();
        let [(_, prepared)] = <[_; 1]>::try_from(carving.await.expect("prepare")).expect("one");
        prepared.expect("the carve finished");
        let _ = node.shutdown.send(true);
    });
}

/// An admin makes a MIG device behind the driver's back (`nvidia-smi mig -cgi ... -C`): NVML's
/// MIG-config-change event makes the monitor read that GPU again at once, with the periodic
/// rescan an hour away; the event is no fault (no taint, no probe).
#[test]
fn a_mig_device_made_by_an_admin_is_read_at_its_event() {
    gpu_dra::node::runtime().expect("runtime").block_on(async {
        let node = start().await;
        let probes = node.gpus.probes.load(Ordering::SeqCst);
        let instances = |minor: usize| {
            let driver = node.driver.clone();
            async move {
                driver
                    .with_state(|s| s.inventory())
                    .await
                    .gpus
                    .get(minor)
                    .and_then(|g| g.mig.as_ref())
                    .map_or(0, |m| m.instances.len())
            }
        };
        assert_eq!(instances(1).await, 0, "GPU 1 starts without MIG devices");
        // MIG mode on, then 1g.10gb (profile 19) at memory slice 0, as the admin's tool does.
        let mode = node.gpus.sim.set_mig_mode(1, true).expect("MIG mode");
        assert!(mode.current, "MIG mode pending: {mode:?}");
        let placement = gpu_dra::gpu::Placement { start: 0, size: 1 };
        let gi = node
            .gpus
            .sim
            .create_gpu_instance(1, 19, placement)
            .expect("admin's GPU instance");
        node.gpus
            .sim
            .create_compute_instance(1, gi)
            .expect("admin's compute instance");
        // The simulator raised the events NVML would; the scripted source delivers them here.
        let raised: Vec<GpuEvent> = node
            .gpus
            .sim
            .state()
            .expect("state")
            .events
            .iter()
            .map(|e| e.event)
            .collect();
        assert_eq!(
            raised,
            vec![GpuEvent {
                minor: 1,
                kind: GpuEventKind::MigConfigChange,
                gpu_instance_id: None,
                compute_instance_id: None,
            }],
            "one MIG-config-change event per GPU is kept (the newest)"
        );
        for event in raised {
            node.events.send(event).expect("send");
        }
        let deadline = Instant::now() + scripted::DEADLINE;
        while instances(1).await != 1 {
            if Instant::now() > deadline {
                node.gpus
                    .fail("the admin's MIG device was not read after its event".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(instances(0).await, 0, "GPU 0 changed");
        assert_eq!(
            node.gpus.probes.load(Ordering::SeqCst),
            probes,
            "a MIG change made the monitor probe"
        );
        assert!(node.taints.first_on("gpu-1").is_none(), "gpu-1 tainted");
        let _ = node.shutdown.send(true);
    });
}

/// A tenant raising XID 13 (illegal memory access) in a loop: thousands of events while claims are
/// prepared and unprepared. Every event reaches the monitor and is counted, and nothing else
/// happens: no probe, no rescan, no taint, and every prepare and unprepare succeeds. What the storm
/// does to prepare latency is measured in `cargo bench --bench prepare` (its storm rows), not
/// timed here.
#[test]
fn an_xid_13_storm_costs_prepares_nothing() {
    gpu_dra::node::runtime().expect("runtime").block_on(async {
        let node = start().await;
        let cycle = || async {
            let [(_, prepared)] =
                <[_; 1]>::try_from(node.driver.prepare(vec![claim_ref("whole-1")]).await)
                    .expect("one");
            prepared.expect("prepare");
            let [(_, unprepared)] =
                <[_; 1]>::try_from(node.driver.unprepare(vec![claim_ref("whole-1")]).await)
                    .expect("one");
            unprepared.expect("unprepare");
        };
        // Whole-GPU cycles read no inventory, so any read from here on is the monitor's.
        let (probes, inventories) = (
            node.gpus.probes.load(Ordering::SeqCst),
            node.gpus.inventories.load(Ordering::SeqCst),
        );
        let seen_before = node.taints.1.load(Ordering::SeqCst);
        let events = node.events.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let storm = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sent = 0usize;
                // Bursts until the cycles are done, and at least 2,000 events.
                while sent < 2_000 || !stop.load(Ordering::SeqCst) {
                    for _ in 0..50 {
                        events.send(xid(sent as u32 % 2, 13)).expect("send");
                        sent += 1;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                sent
            })
        };
        let mut cycles = 0;
        while cycles < 30 || !storm.is_finished() && cycles < 10_000 {
            cycle().await;
            cycles += 1;
            if cycles == 30 {
                stop.store(true, Ordering::SeqCst);
            }
        }
        let sent = storm.join().expect("storm");
        assert!(sent >= 2_000, "{sent} events");
        let deadline = Instant::now() + Duration::from_secs(60);
        while node.taints.1.load(Ordering::SeqCst) - seen_before < sent {
            assert!(
                Instant::now() < deadline,
                "the monitor saw {} of {sent} events",
                node.taints.1.load(Ordering::SeqCst) - seen_before
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!("{cycles} prepare+unprepare cycles during a storm of {sent} XID 13 events");
        assert_eq!(
            node.taints.1.load(Ordering::SeqCst) - seen_before,
            sent,
            "events counted twice"
        );
        assert_eq!(
            node.gpus.probes.load(Ordering::SeqCst),
            probes,
            "ignored XIDs made the monitor probe GPUs"
        );
        assert_eq!(
            node.gpus.inventories.load(Ordering::SeqCst),
            inventories,
            "ignored XIDs made the monitor rescan"
        );
        for device in ["gpu-0", "gpu-1"] {
            assert!(node.taints.first_on(device).is_none(), "{device} tainted");
        }
        let _ = node.shutdown.send(true);
    });
}

/// A claim whose carve hangs inside its GPU (a stuck GPU): kubelet's deadline cancels the call
/// and kubelet calls again, 20 times. Each retry joins the first call (it will answer with its
/// result) instead of parking another of the runtime's 8 blocking threads behind it, and an
/// unprepare of the claim meanwhile is answered at once ("busy, retry later"); claims on other
/// GPUs still prepare, and a fault on another GPU is still tainted, all with the carve held. Then
/// every blocking thread is taken by legitimate work (seven claims waiting on GPU 0, a carve held
/// on GPU 1), and a fault is still probed and tainted: probes run on a thread of their own. On a
/// driver that parks retries, the other claim never prepares; on one that probes on the blocking
/// threads, the last taint never comes: both fail at the deadline.
#[test]
fn a_stuck_claim_retried_twenty_times_starves_nothing() {
    gpu_dra::node::runtime().expect("runtime").block_on(async {
        let node = start().await;
        node.gpus.hold_creates();
        let prepare = |name: &str| {
            let driver = node.driver.clone();
            let name = name.to_string();
            tokio::spawn(async move { driver.prepare(vec![claim_ref(&name)]).await })
        };
        let mut waiting = vec![prepare("carve-0")];
        node.gpus
            .wait_carving(0, 1, "the carve never reached its GPU instance create")
            .await;
        for _ in 1..=20 {
            waiting.push(prepare("carve-0"));
        }
        let busy = node
            .gpus
            .answers(
                "an unprepare of the stuck claim",
                node.driver.unprepare(vec![claim_ref("carve-0")]),
            )
            .await;
        let [(_, answer)] = <[_; 1]>::try_from(busy).expect("one result");
        let error = answer.expect_err("the stuck claim cannot be unprepared while it prepares");
        assert!(
            error.contains("busy, retry later") && error.contains("default/carve-0"),
            "{error}"
        );
        assert_eq!(
            node.driver.claims_in_flight(),
            1,
            "only the first call runs"
        );
        assert!(waiting.iter().all(|w| !w.is_finished()), "the retries wait");
        let other = node
            .gpus
            .answers(
                "a claim on another GPU",
                node.driver.prepare(vec![claim_ref("whole-1")]),
            )
            .await;
        for (claim, result) in other {
            result.unwrap_or_else(|e| panic!("prepare {claim}: {e}"));
        }
        node.events.send(xid(1, 79)).expect("send");
        node.wait_tainted("gpu-1", "XID 79 while a stuck claim is retried")
            .await;

        // Every blocking thread taken: six more claims wait for GPU 0, a carve is held on GPU 1.
        let unprepared = node.driver.unprepare(vec![claim_ref("whole-1")]).await;
        for (claim, result) in unprepared {
            result.unwrap_or_else(|e| panic!("unprepare {claim}: {e}"));
        }
        for start in 1..=6 {
            let name = format!("wait-{start}");
            node.claims
                .insert(claim(&name, &format!("gpu-0-mig-1g10gb-19-{start}")));
            let driver = node.driver.clone();
            waiting.push(tokio::spawn(async move {
                driver.prepare(vec![claim_ref(&name)]).await
            }));
        }
        node.claims
            .insert(claim("carve-1", "gpu-1-mig-1g10gb-19-0"));
        let driver = node.driver.clone();
        waiting.push(tokio::spawn(async move {
            driver.prepare(vec![claim_ref("carve-1")]).await
        }));
        node.gpus
            .wait_carving(
                1,
                1,
                "the carve on GPU 1 never reached its GPU instance create",
            )
            .await;
        let deadline = Instant::now() + scripted::DEADLINE;
        while node.driver.claims_in_flight() < 8 {
            if Instant::now() > deadline {
                node.gpus.fail("eight claims never ran at once".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        node.events.send(xid(0, 79)).expect("send");
        node.wait_tainted("gpu-0", "XID 79 with every blocking thread taken")
            .await;
        assert!(
            waiting.iter().all(|w| !w.is_finished()),
            "the held work ended"
        );
        node.gpus.open_all();
        let mut carve_0 = Vec::new();
        for call in waiting {
            for (claim, result) in call.await.expect("prepare task") {
                let devices = result.unwrap_or_else(|e| panic!("prepare {claim}: {e}"));
                if claim.name == "carve-0" {
                    carve_0.push(devices);
                }
            }
        }
        assert_eq!(
            carve_0.len(),
            21,
            "the first call and its 20 retries answered"
        );
        assert!(
            carve_0.iter().all(|d| d == &carve_0[0]),
            "every retry answered with the first call's devices"
        );
        assert_eq!(node.gpus.gates().created, 8, "carve-0 was carved once");
        let _ = node.shutdown.send(true);
    });
}
