//! The health monitor task of `gpu-dra run`: NVML events (on a thread of their own, since
//! waiting on an event set blocks) and a periodic probe of every GPU feed the [`HealthBook`];
//! each change goes out as device taints, kubelet's health stream, a Node event, metrics and a
//! log line. A periodic rescan re-discovers the hardware so that devices someone else made or
//! removed are republished without a restart.
//!
//! Nothing here waits for the node's operations: a fault is published as a taint first; the
//! rescan it asks for (of its GPU only) runs on a task of its own, coalesced with any other
//! request, and skips GPUs a prepare or unprepare holds. Events come through a bounded queue and
//! are handled in batches; an ignored XID costs a counter and nothing else.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use tokio::sync::{mpsc, watch};

use super::{HealthBook, HealthChange, HealthConfig};
use crate::gpu::GpuControl;
use crate::gpu::events::{GpuEvent, GpuProbe};
use crate::plugin::{DeviceHealth, DeviceHealthStatus, HealthReporter};
use crate::prepare::driver::Driver;

/// Where the monitor's conclusions go.
pub trait HealthSink: Send + Sync {
    /// The devices' taints are now these (devices without faults are absent).
    fn taints_changed(&self, taints: BTreeMap<String, Vec<DeviceTaint>>);
    /// A fault was raised or cleared (Node event, metrics).
    fn changed(&self, change: &HealthChange);
    /// An event arrived, ignored or not (the XID counter).
    fn event_seen(&self, event: &GpuEvent);
    /// Every published device's health, after each probe round.
    fn device_health(&self, health: &[DeviceHealth]);
}

pub struct HealthMonitor {
    pub config: HealthConfig,
    pub control: Arc<dyn GpuControl>,
    pub driver: Arc<Driver>,
    pub book: HealthBook,
    /// What the probes at start changed in `book` (logged, reported and saved once running).
    pub startup_changes: Vec<HealthChange>,
    pub state_dir: PathBuf,
    pub pool: String,
    pub reporter: HealthReporter,
    /// The slices being published: which devices exist.
    pub desired: watch::Receiver<Arc<Vec<ResourceSlice>>>,
    pub sink: Arc<dyn HealthSink>,
    /// The device names of the last `desired` snapshot read: every probe round needs them and
    /// the slices change rarely, so they are collected once per snapshot.
    pub published: PublishedDevices,
    /// What the last health report was made of: a round that finds the same only refreshes the
    /// reports' time, instead of rebuilding an entry per device (hundreds with dynamic MIG).
    pub reported: Option<ReportInputs>,
}

/// The inputs of one health report (see `HealthMonitor::reported`).
#[derive(PartialEq)]
pub struct ReportInputs {
    published: Arc<[String]>,
    faults: Vec<super::Fault>,
    vanished: BTreeSet<String>,
}

/// Device names of one snapshot of the published slices (see `HealthMonitor::published`).
#[derive(Default)]
pub struct PublishedDevices(std::sync::Mutex<Option<NamesOfSnapshot>>);

/// A snapshot of the published slices and its device names.
type NamesOfSnapshot = (Arc<Vec<ResourceSlice>>, Arc<[String]>);

pub(crate) fn now_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Events waiting for the monitor; past this the event thread waits (NVML keeps queuing).
const EVENT_QUEUE: usize = 1024;
/// Most events handled before the taints are published.
const EVENT_BATCH: usize = 256;

/// Reads events on a thread until the receiver is gone.
fn spawn_event_thread(control: &Arc<dyn GpuControl>) -> Option<mpsc::Receiver<GpuEvent>> {
    let mut source = match control.event_source() {
        Ok(source) => source,
        Err(error) => {
            tracing::error!(%error, "cannot register for GPU events; faults are found by the periodic probe only");
            return None;
        }
    };
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    let spawned = std::thread::Builder::new()
        .name("gpu-events".into())
        .spawn(move || {
            while !tx.is_closed() {
                match source.wait(Duration::from_secs(1)) {
                    Ok(events) => {
                        for event in events {
                            if tx.blocking_send(event).is_err() {
                                return;
                            }
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "waiting for GPU events failed; retrying");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        });
    match spawned {
        Ok(_) => Some(rx),
        Err(error) => {
            tracing::error!(%error, "cannot start the GPU event thread");
            None
        }
    }
}

/// GPUs to probe (by minor), and where their answers go, in the same order: a round of probes
/// is one request, so the probe thread wakes once per round, not once per GPU.
type ProbeRequest = (
    Vec<u32>,
    tokio::sync::oneshot::Sender<Vec<Result<GpuProbe, crate::gpu::GpuError>>>,
);

/// Probes GPUs on a thread of their own, not on the runtime's blocking threads: those may all
/// be taken by prepares waiting on a stuck GPU, and a fault must still be found then.
struct Prober {
    requests: Option<std::sync::mpsc::Sender<ProbeRequest>>,
}

impl Prober {
    fn start(control: Arc<dyn GpuControl>) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<ProbeRequest>();
        let spawned = std::thread::Builder::new()
            .name("gpu-probes".into())
            .spawn(move || {
                // Ends when the monitor (the sender) is gone.
                for (minors, answer) in rx {
                    let _ = answer.send(minors.into_iter().map(|m| control.probe(m)).collect());
                }
            });
        match spawned {
            Ok(_) => Self { requests: Some(tx) },
            Err(error) => {
                tracing::error!(%error, "cannot start the GPU probe thread; GPUs are not probed");
                Self { requests: None }
            }
        }
    }

    async fn probe(&self, minor: u32) -> Option<GpuProbe> {
        self.probe_each(vec![minor])
            .await
            .into_iter()
            .next()
            .and_then(|(_, probe)| probe)
    }

    /// Probes the GPUs in one round; each GPU with its probe, `None` where it failed (logged).
    async fn probe_each(&self, minors: Vec<u32>) -> Vec<(u32, Option<GpuProbe>)> {
        let Some(requests) = self.requests.as_ref() else {
            return minors.into_iter().map(|m| (m, None)).collect();
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        if requests.send((minors.clone(), tx)).is_err() {
            tracing::warn!(gpus = ?minors, "the GPU probe thread is gone");
            return minors.into_iter().map(|m| (m, None)).collect();
        }
        let Ok(answers) = rx.await else {
            tracing::warn!(gpus = ?minors, "GPU probes did not finish");
            return minors.into_iter().map(|m| (m, None)).collect();
        };
        minors
            .into_iter()
            .zip(answers)
            .map(|(minor, answer)| match answer {
                Ok(probe) => (minor, Some(probe)),
                Err(error) => {
                    tracing::warn!(gpu = minor, %error, "cannot probe GPU");
                    (minor, None)
                }
            })
            .collect()
    }
}

/// What to discover again: the GPUs named, or all of them.
#[derive(Debug, Default)]
struct RescanRequest {
    all: bool,
    gpus: BTreeSet<u32>,
}

/// Rescans on a task of their own: requests made while one runs are merged into the next.
#[derive(Clone)]
struct Rescans {
    pending: Arc<std::sync::Mutex<RescanRequest>>,
    wake: Arc<tokio::sync::Notify>,
}

impl Rescans {
    fn start(driver: Arc<Driver>, mut shutdown: watch::Receiver<bool>) -> Self {
        let rescans = Self {
            pending: Arc::default(),
            wake: Arc::default(),
        };
        let worker = rescans.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = worker.wake.notified() => {}
                    _ = shutdown.changed() => break,
                }
                let request = std::mem::take(&mut *worker.lock());
                let only = (!request.all).then_some(request.gpus);
                match driver.rescan(only).await {
                    Ok(true) => tracing::info!("hardware changed; republishing"),
                    Ok(false) => {}
                    Err(error) => {
                        tracing::warn!(%error, "hardware rescan failed; keeping the last view")
                    }
                }
            }
        });
        rescans
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RescanRequest> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gpus(&self, gpus: impl IntoIterator<Item = u32>) {
        let mut pending = self.lock();
        let before = pending.gpus.len();
        pending.gpus.extend(gpus);
        let asked = pending.gpus.len() > before;
        drop(pending);
        if asked {
            self.wake.notify_one();
        }
    }

    fn all(&self) {
        self.lock().all = true;
        self.wake.notify_one();
    }
}

impl HealthMonitor {
    /// Runs until `shutdown` turns true.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut events = spawn_event_thread(&self.control);
        let prober = Prober::start(self.control.clone());
        let rescans = Rescans::start(self.driver.clone(), shutdown.clone());
        let mut probe = tokio::time::interval(self.config.probe_interval);
        let mut rescan = tokio::time::interval(self.config.rescan_interval);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.reset();
        let mut desired = self.desired.clone();
        let mut last_taints = None;
        let startup_changes = std::mem::take(&mut self.startup_changes);
        if !startup_changes.is_empty() {
            self.record(startup_changes);
        }
        loop {
            tokio::select! {
                event = recv(&mut events) => match event {
                    Some(first) => {
                        let mut batch = vec![first];
                        if let Some(queue) = events.as_mut() {
                            while batch.len() < EVENT_BATCH {
                                match queue.try_recv() {
                                    Ok(event) => batch.push(event),
                                    Err(_) => break,
                                }
                            }
                        }
                        // MIG devices made or destroyed: read those GPUs again, nothing else.
                        let (mig_changed, faults): (Vec<_>, Vec<_>) =
                            batch.into_iter().partition(|e| !e.kind.is_fault());
                        rescans.gpus(mig_changed.iter().map(|e| e.minor));
                        let faulted = if faults.is_empty() {
                            BTreeSet::new()
                        } else {
                            self.on_events(&prober, faults).await
                        };
                        if !faulted.is_empty() {
                            // The taint goes out now; the rescan (a fault may come with hardware
                            // changes: a GPU lost, instances gone) follows on its own task.
                            self.publish(&mut last_taints);
                            rescans.gpus(faulted);
                        }
                    }
                    None => events = None,
                },
                _ = probe.tick() => {
                    let changed = self.probe_all(&prober).await;
                    self.publish(&mut last_taints);
                    // A GPU back from a reset may have lost its MIG instances.
                    rescans.gpus(changed);
                }
                _ = rescan.tick() => rescans.all(),
                // New devices (a GPU back, a MIG device made) get the taints they have.
                changed = desired.changed() => match changed {
                    Ok(()) => self.publish(&mut last_taints),
                    Err(_) => break,
                },
                _ = shutdown.changed() => break,
            }
        }
    }

    /// Handles a batch of events; returns the GPUs whose health changed.
    async fn on_events(&mut self, prober: &Prober, events: Vec<GpuEvent>) -> BTreeSet<u32> {
        let mut changes = Vec::new();
        let mut probes = BTreeMap::new();
        for event in events {
            self.sink.event_seen(&event);
            if let crate::gpu::events::GpuEventKind::Xid { code } = event.kind
                && self.config.ignored_xids.contains(&code)
            {
                // An application's own error (XID 13, 31, 43...): counted, nothing else, so a
                // tenant who raises them in a loop costs the node nothing.
                continue;
            }
            let probe = match probes.get(&event.minor) {
                Some(probe) => *probe,
                None => {
                    let probe = prober.probe(event.minor).await;
                    probes.insert(event.minor, probe);
                    probe
                }
            };
            let inventory = self.driver.with_state(|s| s.inventory()).await;
            match self
                .book
                .raise(&event, probe, &inventory, &self.config, now_seconds())
            {
                Some(change) => changes.push(change),
                None => tracing::debug!(?event, "GPU event changes nothing (already known)"),
            }
        }
        let faulted = changes.iter().map(HealthChange::minor).collect();
        if !changes.is_empty() {
            self.record(changes);
        }
        faulted
    }

    /// Probes every GPU; returns those whose health changed.
    async fn probe_all(&mut self, prober: &Prober) -> BTreeSet<u32> {
        let minors = self.driver.with_state(|s| s.gpu_minors()).await;
        self.book.retain_gpus(&minors);
        let now = now_seconds();
        let mut changes = Vec::new();
        for (minor, probe) in prober.probe_each(minors.into_iter().collect()).await {
            if let Some(probe) = probe {
                changes.extend(self.book.probe(minor, probe, &self.config, now));
            }
        }
        let changed = changes.iter().map(HealthChange::minor).collect();
        if !changes.is_empty() {
            self.record(changes);
        }
        self.report_stream();
        changed
    }

    /// Logs, reports and persists changes.
    fn record(&mut self, changes: Vec<HealthChange>) {
        for change in &changes {
            match change {
                HealthChange::Raised(fault) => tracing::warn!(
                    device = %change.describe(),
                    taint = %fault.key,
                    value = fault.value.as_deref().unwrap_or(""),
                    effect = fault.effect.as_str(),
                    "device unhealthy"
                ),
                HealthChange::Cleared(..) => {
                    tracing::info!(device = %change.describe(), "device healthy again")
                }
            }
            self.sink.changed(change);
        }
        if let Err(error) = self.book.save(&self.state_dir) {
            tracing::error!(%error, "cannot persist device health; a restart may forget faults");
        }
        self.report_stream();
    }

    fn published_devices(&self) -> Arc<[String]> {
        let slices = Arc::clone(&self.desired.borrow());
        let mut memo = self.published.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, names)) = memo.as_ref()
            && Arc::ptr_eq(seen, &slices)
        {
            return Arc::clone(names);
        }
        let names: Arc<[String]> = slices
            .iter()
            .filter_map(|s| s.spec.devices.as_ref())
            .flatten()
            .map(|d| d.name.clone())
            .collect();
        *memo = Some((slices, Arc::clone(&names)));
        names
    }

    /// Sends the taints when they changed.
    fn publish(&self, last: &mut Option<BTreeMap<String, Vec<DeviceTaint>>>) {
        let devices = self.published_devices();
        let taints = self.book.taints(devices.iter().map(String::as_str));
        if last.as_ref() != Some(&taints) {
            *last = Some(taints.clone());
            self.sink.taints_changed(taints);
        }
    }

    /// Kubelet's health stream: every published device, and prepared devices that vanished.
    /// Sent every round (kubelet shows Unknown past the timeout), rebuilt only when its inputs
    /// changed.
    fn report_stream(&mut self) {
        let devices = self.published_devices();
        let now = SystemTime::now();
        let prepared = self.driver.state().prepared_devices(&self.pool);
        let published: BTreeSet<&str> = devices.iter().map(String::as_str).collect();
        let vanished: BTreeSet<String> = prepared
            .into_iter()
            .filter(|d| !published.contains(d.as_str()))
            .collect();
        drop(published);
        let inputs = ReportInputs {
            published: Arc::clone(&devices),
            faults: self.book.faults.clone(),
            vanished,
        };
        if self.reported.as_ref().is_some_and(|last| {
            Arc::ptr_eq(&last.published, &inputs.published)
                && last.faults == inputs.faults
                && last.vanished == inputs.vanished
        }) {
            self.reporter.refresh(now);
            return;
        }
        let vanished = inputs.vanished.clone();
        self.reported = Some(inputs);
        let timeout = Some(self.config.probe_interval * 3);
        let entry = |device: &str, status, message: String| DeviceHealth {
            pool_name: self.pool.clone(),
            device_name: device.to_string(),
            status,
            message,
            last_updated: now,
            health_check_timeout: timeout,
        };
        let mut health: Vec<DeviceHealth> = devices
            .iter()
            .map(|device| {
                let reasons: Vec<String> = self
                    .book
                    .faults_of(device)
                    .map(|f| f.reason.clone())
                    .collect();
                if reasons.is_empty() {
                    entry(device, DeviceHealthStatus::Healthy, String::new())
                } else {
                    entry(device, DeviceHealthStatus::Unhealthy, reasons.join("; "))
                }
            })
            .collect();
        for device in vanished {
            let reasons: Vec<String> = self
                .book
                .faults_of(&device)
                .map(|f| f.reason.clone())
                .collect();
            let message = if reasons.is_empty() {
                "prepared, but no longer on the node".to_string()
            } else {
                reasons.join("; ")
            };
            health.push(entry(&device, DeviceHealthStatus::Unhealthy, message));
        }
        self.sink.device_health(&health);
        self.reporter.replace_all(health);
    }
}

async fn recv(events: &mut Option<mpsc::Receiver<GpuEvent>>) -> Option<GpuEvent> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
