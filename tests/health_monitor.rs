//! Health events never wait for the node's operations, and a flood of application XIDs costs the
//! node nothing. The monitor runs here as `gpu-dra run` runs it (its own task, NVML-style events
//! from a thread, the driver's state), over simulated GPUs whose GPU instance creates take
//! seconds; events are fed through a scripted event source so that the test controls exactly what
//! arrives and when. `e2e/health.sh` checks taints end to end on the control plane.
mod common;
use common::{claim, claim_ref};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use gpu_dra::gpu::events::{GpuEvent, GpuEventKind, GpuEventSource, GpuProbe};
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::gpu::{
    GpuControl, GpuError, GpuInstanceInfo, MigMode, NodeInventory, Placement, SharingSettings,
};
use gpu_dra::health::monitor::{HealthMonitor, HealthSink};
use gpu_dra::health::{HealthBook, HealthChange, HealthConfig};
use gpu_dra::plugin::{DeviceHealth, HealthReporter};
use gpu_dra::prepare::NodeDriver;
use gpu_dra::prepare::claims::MemoryClaims;
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use gpu_dra::slices::{self, SliceOptions};
use k8s_openapi::api::resource::v1::DeviceTaint;

/// The simulator, with events the test sends and counts of what the monitor asks of the GPUs.
struct Scripted {
    sim: SimNode,
    events: Mutex<Option<mpsc::Receiver<GpuEvent>>>,
    probes: AtomicUsize,
    inventories: AtomicUsize,
}

struct ScriptedEvents(mpsc::Receiver<GpuEvent>);

impl GpuEventSource for ScriptedEvents {
    fn watched(&self) -> Vec<u32> {
        // Scripted: every event comes from the test, none from a registration.
        Vec::new()
    }

    fn wait(&mut self, timeout: Duration) -> Result<Vec<GpuEvent>, GpuError> {
        let mut events = Vec::new();
        if let Ok(event) = self.0.recv_timeout(timeout) {
            events.push(event);
            while events.len() < 64 {
                match self.0.try_recv() {
                    Ok(event) => events.push(event),
                    Err(_) => break,
                }
            }
        }
        Ok(events)
    }
}

impl GpuControl for Scripted {
    fn inventory(&self) -> Result<NodeInventory, GpuError> {
        self.inventories.fetch_add(1, Ordering::SeqCst);
        self.sim.inventory()
    }
    fn set_mig_mode(&self, minor: u32, enabled: bool) -> Result<MigMode, GpuError> {
        self.sim.set_mig_mode(minor, enabled)
    }
    fn create_gpu_instance(
        &self,
        minor: u32,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, GpuError> {
        self.sim.create_gpu_instance(minor, profile_id, placement)
    }
    fn create_compute_instance(&self, minor: u32, gi: u32) -> Result<(u32, String), GpuError> {
        self.sim.create_compute_instance(minor, gi)
    }
    fn destroy_compute_instance(&self, minor: u32, gi: u32, ci: u32) -> Result<(), GpuError> {
        self.sim.destroy_compute_instance(minor, gi, ci)
    }
    fn destroy_gpu_instance(&self, minor: u32, gi: u32) -> Result<(), GpuError> {
        self.sim.destroy_gpu_instance(minor, gi)
    }
    fn gpu_instances(&self, minor: u32) -> Result<Vec<GpuInstanceInfo>, GpuError> {
        GpuControl::gpu_instances(&self.sim, minor)
    }
    fn sharing_settings(&self, minor: u32) -> Result<SharingSettings, GpuError> {
        self.sim.sharing_settings(minor)
    }
    fn set_sharing_settings(&self, minor: u32, settings: SharingSettings) -> Result<(), GpuError> {
        self.sim.set_sharing_settings(minor, settings)
    }
    fn probe(&self, minor: u32) -> Result<GpuProbe, GpuError> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        self.sim.probe(minor)
    }
    fn event_source(&self) -> Result<Box<dyn GpuEventSource>, GpuError> {
        let events = self
            .events
            .lock()
            .expect("events")
            .take()
            .expect("one event source");
        Ok(Box::new(ScriptedEvents(events)))
    }
}

/// The devices' taints, as the monitor hands them to the slices.
type TaintMap = BTreeMap<String, Vec<DeviceTaint>>;

/// Records every taint change with when it came.
#[derive(Default)]
struct Taints(Mutex<Vec<(Instant, TaintMap)>>);

impl HealthSink for Taints {
    fn taints_changed(&self, taints: TaintMap) {
        self.0
            .lock()
            .expect("taints")
            .push((Instant::now(), taints));
    }
    fn changed(&self, _change: &HealthChange) {}
    fn event_seen(&self, _event: &GpuEvent) {}
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
    events: mpsc::Sender<GpuEvent>,
    taints: Arc<Taints>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

/// Two H100s whose carves take `carve`, the driver, and the monitor running with periodic probes
/// and rescans far away (only events drive it).
async fn start(carve: Duration) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let (events, received) = mpsc::channel();
    let gpus = Arc::new(Scripted {
        sim: SimNode::new(
            "sim:2xH100-SXM5-80GB".parse().expect("spec"),
            "n1",
            Some(dir.path().join("hw.json")),
        )
        .with_mig_delay(carve),
        events: Mutex::new(Some(received)),
        probes: AtomicUsize::new(0),
        inventories: AtomicUsize::new(0),
    });
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
    let (_desired_tx, desired) = tokio::sync::watch::channel(Arc::new(published));
    let claims = Arc::new(MemoryClaims::default());
    claims.insert(claim("carve-0", "gpu-0-mig-1g10gb-19-0"));
    claims.insert(claim("whole-1", "gpu-1"));
    let driver = Arc::new(Driver::new(state, claims));
    let taints = Arc::new(Taints::default());
    let health = HealthConfig {
        probe_interval: Duration::from_secs(3600),
        rescan_interval: Duration::from_secs(3600),
        ..HealthConfig::default()
    };
    let monitor = HealthMonitor {
        config: health,
        control: gpus.clone(),
        driver: driver.clone(),
        book: HealthBook::default(),
        startup_changes: Vec::new(),
        state_dir: dir.path().join("state"),
        pool: "n1".into(),
        reporter: HealthReporter::new(),
        desired,
        sink: taints.clone(),
    };
    let (shutdown, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        // Keeps the desired slices' sender alive as long as the monitor runs.
        let _desired_tx = _desired_tx;
        monitor.run(stop).await
    });
    // The first probe round (at start) is over before the test counts anything.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Node {
        _dir: dir,
        gpus,
        driver,
        events,
        taints,
        shutdown,
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

/// XID 79 arrives on the GPU a 4 s carve is working on: its taint is published within 2 s, while
/// the carve still runs (the rescan the fault asks for waits for nobody; it once held every GPU
/// and so published the taint only after the carve).
#[test]
fn a_fault_during_a_slow_carve_is_tainted_at_once() {
    let carve = Duration::from_secs(4);
    gpu_dra::node::runtime().expect("runtime").block_on(async {
        let node = start(carve).await;
        let driver = node.driver.clone();
        let carving = tokio::spawn(async move { driver.prepare(vec![claim_ref("carve-0")]).await });
        // The carve is under way.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let sent = Instant::now();
        node.events.send(xid(0, 79)).expect("send");
        let deadline = sent + Duration::from_secs(2);
        let tainted = loop {
            if let Some(at) = node.taints.first_on("gpu-0") {
                break at;
            }
            assert!(
                Instant::now() < deadline,
                "XID 79 on GPU 0 not tainted within 2 s while a carve runs on it"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        eprintln!("tainted {:?} after the event", tainted - sent);
        assert!(
            !carving.is_finished(),
            "the taint came while the carve was still running"
        );
        let [(_, prepared)] = <[_; 1]>::try_from(carving.await.expect("prepare")).expect("one");
        prepared.expect("the carve finished");
        let _ = node.shutdown.send(true);
    });
}

/// A tenant raising XID 13 (illegal memory access) in a loop: thousands of events while claims are
/// prepared and unprepared. The monitor neither probes nor rescans for them, and prepares take
/// no longer than on a quiet node (within 2×).
#[test]
fn an_xid_13_storm_costs_prepares_nothing() {
    gpu_dra::node::runtime().expect("runtime").block_on(async {
        let node = start(Duration::ZERO).await;
        let cycle = || async {
            let started = Instant::now();
            let [(_, prepared)] =
                <[_; 1]>::try_from(node.driver.prepare(vec![claim_ref("whole-1")]).await)
                    .expect("one");
            prepared.expect("prepare");
            let [(_, unprepared)] =
                <[_; 1]>::try_from(node.driver.unprepare(vec![claim_ref("whole-1")]).await)
                    .expect("one");
            unprepared.expect("unprepare");
            started.elapsed()
        };
        const CYCLES: usize = 30;
        let mut quiet = Vec::new();
        for _ in 0..CYCLES {
            quiet.push(cycle().await);
        }
        let (probes, inventories) = (
            node.gpus.probes.load(Ordering::SeqCst),
            node.gpus.inventories.load(Ordering::SeqCst),
        );
        let events = node.events.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let storm = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sent = 0u32;
                // Bursts until the cycles are done, and at least 2,000 events.
                while sent < 2_000 || !stop.load(Ordering::SeqCst) {
                    for _ in 0..50 {
                        events.send(xid(sent % 2, 13)).expect("send");
                        sent += 1;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                sent
            })
        };
        let mut stormy = Vec::new();
        for _ in 0..CYCLES {
            stormy.push(cycle().await);
        }
        stop.store(true, Ordering::SeqCst);
        let sent = storm.join().expect("storm");
        assert!(sent >= 2_000, "{sent} events");
        // Let the monitor drain what is still queued.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let median = |times: &mut Vec<Duration>| {
            times.sort();
            times[times.len() / 2]
        };
        let (quiet, stormy) = (median(&mut quiet), median(&mut stormy));
        eprintln!(
            "prepare+unprepare median: quiet {quiet:?}, during a storm of {sent} XID 13 events {stormy:?}"
        );
        assert_eq!(
            node.gpus.probes.load(Ordering::SeqCst),
            probes,
            "ignored XIDs made the monitor probe GPUs"
        );
        // The cycles themselves read the inventory (a whole GPU needs none); nothing else may.
        assert_eq!(
            node.gpus.inventories.load(Ordering::SeqCst),
            inventories,
            "ignored XIDs made the monitor rescan"
        );
        assert!(node.taints.first_on("gpu-0").is_none(), "nothing tainted");
        assert!(
            stormy <= quiet * 2 + Duration::from_millis(2),
            "prepares slowed from {quiet:?} to {stormy:?} during the storm"
        );
        let _ = node.shutdown.send(true);
    });
}
