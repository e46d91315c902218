//! A simulated node whose GPU events come from the test (or bench) instead of NVML, with counts
//! of what the health monitor asks of the GPUs, GPU instance creates the test can hold inside the
//! GPU (so "X does not wait for a carve" is checked with the carve held, not timed), and the
//! monitor started on it as `gpu-dra run` starts it. Shared by `tests/health_monitor.rs`,
//! `tests/node_responsive.rs` and `benches/prepare.rs`.
//!
//! Each user takes what it needs of it.
#![allow(dead_code)]
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use gpu_dra::gpu::events::{GpuEvent, GpuEventSource, GpuProbe};
use gpu_dra::gpu::sim::SimNode;
use gpu_dra::gpu::{
    GpuControl, GpuError, GpuInstanceInfo, MigMode, NodeInventory, Placement, SharingSettings,
};
use gpu_dra::health::monitor::{HealthMonitor, HealthSink};
use gpu_dra::health::{HealthBook, HealthConfig};
use gpu_dra::plugin::HealthReporter;
use gpu_dra::prepare::driver::Driver;
use k8s_openapi::api::resource::v1::ResourceSlice;

/// Only for a driver that is wrong: how long to wait for what a correct one does while a carve is
/// held, before failing (it would otherwise wait for ever).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// What the held GPUs have seen and may do.
#[derive(Default)]
pub struct Gates {
    /// GPU instance creates inside the GPU now, per GPU.
    pub carving: BTreeMap<u32, usize>,
    /// Creates each GPU may still finish.
    pub permits: BTreeMap<u32, usize>,
    /// Every create may finish (the test is over or failing).
    pub open: bool,
    pub most_on_one_gpu: usize,
    pub most_in_all: usize,
    pub created: usize,
}

/// The simulator, with events the caller sends and counts of what the monitor asks of the GPUs.
pub struct Scripted {
    pub sim: SimNode,
    events: Mutex<Option<mpsc::Receiver<GpuEvent>>>,
    pub probes: AtomicUsize,
    pub inventories: AtomicUsize,
    gates: Mutex<Gates>,
    changed: Condvar,
}

impl Scripted {
    /// `sim` with its events sent through the returned sender.
    pub fn new(sim: SimNode) -> (Arc<Scripted>, mpsc::Sender<GpuEvent>) {
        let (events, received) = mpsc::channel();
        let gpus = Arc::new(Scripted {
            sim,
            events: Mutex::new(Some(received)),
            probes: AtomicUsize::new(0),
            inventories: AtomicUsize::new(0),
            gates: Mutex::new(Gates {
                open: true,
                ..Gates::default()
            }),
            changed: Condvar::new(),
        });
        (gpus, events)
    }

    pub fn gates(&self) -> std::sync::MutexGuard<'_, Gates> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets one create on `minor` finish.
    pub fn release(&self, minor: u32) {
        *self.gates().permits.entry(minor).or_default() += 1;
        self.changed.notify_all();
    }

    pub fn open_all(&self) {
        self.gates().open = true;
        self.changed.notify_all();
    }

    pub fn carving(&self, minor: u32) -> usize {
        self.gates().carving.get(&minor).copied().unwrap_or(0)
    }

    /// Fails (letting every create go, so nothing hangs) with `why`.
    pub fn fail(&self, why: String) -> ! {
        self.open_all();
        panic!("{why}");
    }

    /// Waits until `minor` has `count` creates inside it.
    pub async fn wait_carving(&self, minor: u32, count: usize, why: &str) {
        let deadline = Instant::now() + DEADLINE;
        while self.carving(minor) < count {
            if Instant::now() > deadline {
                self.fail(format!(
                    "{why}: {} creates on GPU {minor}",
                    self.carving(minor)
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `call` must end while the creates are held; fails at the deadline otherwise.
    pub async fn answers<T>(&self, what: &str, call: impl std::future::Future<Output = T>) -> T {
        match tokio::time::timeout(DEADLINE, call).await {
            Ok(answer) => answer,
            Err(_) => self.fail(format!("{what} waited for a held carve")),
        }
    }

    /// From now on GPU instance creates wait inside the GPU until [`Scripted::release`]d.
    pub fn hold_creates(&self) {
        self.gates().open = false;
    }
}

struct ScriptedEvents(mpsc::Receiver<GpuEvent>);

impl GpuEventSource for ScriptedEvents {
    fn watched(&self) -> Vec<u32> {
        // Scripted: every event comes from the caller, none from a registration.
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
        let mut gates = self.gates();
        *gates.carving.entry(minor).or_default() += 1;
        let on_gpu = gates.carving[&minor];
        let in_all = gates.carving.values().sum();
        gates.most_on_one_gpu = gates.most_on_one_gpu.max(on_gpu);
        gates.most_in_all = gates.most_in_all.max(in_all);
        let mut gates = self
            .changed
            .wait_while(gates, |g| {
                !g.open && g.permits.get(&minor).copied().unwrap_or(0) == 0
            })
            .unwrap_or_else(|p| p.into_inner());
        if let Some(permits) = gates.permits.get_mut(&minor).filter(|p| **p > 0) {
            *permits -= 1;
        }
        *gates.carving.entry(minor).or_default() -= 1;
        gates.created += 1;
        drop(gates);
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

/// Starts the health monitor on `gpus` for `driver`, publishing to `sink`, with periodic probes
/// and rescans an hour apart (only events drive it); the returned sender stops it. Returns once
/// the probe round every start makes has asked each GPU.
pub async fn start_monitor(
    gpus: Arc<Scripted>,
    driver: Arc<Driver>,
    published: Vec<ResourceSlice>,
    state_dir: std::path::PathBuf,
    sink: Arc<dyn HealthSink>,
) -> tokio::sync::watch::Sender<bool> {
    let (desired_tx, desired) = tokio::sync::watch::channel(Arc::new(published));
    let config = HealthConfig {
        probe_interval: Duration::from_secs(3600),
        rescan_interval: Duration::from_secs(3600),
        ..HealthConfig::default()
    };
    let monitor = HealthMonitor {
        config,
        control: gpus.clone(),
        driver,
        book: HealthBook::default(),
        startup_changes: Vec::new(),
        state_dir,
        pool: "n1".into(),
        reporter: HealthReporter::new(),
        desired,
        sink,
        published: Default::default(),
        reported: None,
    };
    let (shutdown, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        // Keeps the desired slices' sender alive as long as the monitor runs.
        let _desired_tx = desired_tx;
        monitor.run(stop).await
    });
    // The round asks every GPU once; counts taken after it see only what events cause.
    let gpu_count = gpus.sim.inventory().map_or(0, |i| i.gpus.len());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while gpus.probes.load(Ordering::SeqCst) < gpu_count {
        assert!(
            std::time::Instant::now() < deadline,
            "the monitor's first probe round did not run"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown
}
