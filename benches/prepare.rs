//! Prepare latency as the driver sees a kubelet call: `Driver::prepare` for one claim at a time
//! (claim lookup, plan, CDI spec and checkpoint written with fsync), on a simulated 8×H100 node
//! with real files in a temporary directory. Prints p50/p99/max over 1,000 claims for whole GPUs
//! and for dynamic MIG placements (carved and destroyed), and unprepare latency; with the fake
//! `nvidia-cuda-mps-control` built (`cargo build --release -p fakenvml`) and as root, also for MPS
//! claims (the daemon started and stopped). Last, whole-GPU prepare and unprepare with the health
//! monitor running, on a quiet node and during a storm of XID 13 events (a tenant's illegal memory
//! accesses, which the monitor counts and ignores), 50 every 2 ms.
//!
//! Run: `cargo bench --bench prepare`
#[path = "../tests/common/scripted.rs"]
mod scripted;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_dra::gpu::GpuControl;
use gpu_dra::gpu::events::{GpuEvent, GpuEventKind};
use gpu_dra::health::HealthChange;
use gpu_dra::health::monitor::HealthSink;
use gpu_dra::plugin::DeviceHealth;
use k8s_openapi::api::resource::v1::DeviceTaint;
use scripted::{Scripted, start_monitor};

use gpu_dra::gpu::sim::SimNode;
use gpu_dra::prepare::claims::MemoryClaims;
use gpu_dra::prepare::driver::Driver;
use gpu_dra::prepare::state::{DeviceState, DriverConfig};
use gpu_dra::prepare::{ClaimRef, NodeDriver};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const CLAIMS: usize = 1000;

fn claim(uid: &str, device: &str) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(uid.to_string()),
            namespace: Some("bench".into()),
            uid: Some(uid.to_string()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![DeviceRequestAllocationResult {
                        request: "gpu".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool: "bench-node".into(),
                        device: device.into(),
                        ..Default::default()
                    }]),
                    config: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what:<36} n={:<5} p50={:>8.3} ms  p99={:>8.3} ms  max={:>8.3} ms",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
    );
}

/// A driver on a simulated 8×H100 node under `dir`, with a fake driver root so that every spec
/// mounts the driver's files as on a real node; `mps_control` is copied in as the MPS control
/// binary.
fn bench_driver(
    dir: &std::path::Path,
    mps_control: Option<&std::path::Path>,
) -> (Driver, Arc<MemoryClaims>) {
    bench_driver_on(dir, mps_control, Arc::new(bench_node(dir)))
}

fn bench_node(dir: &std::path::Path) -> SimNode {
    SimNode::new(
        "8xH100-SXM5-80GB".parse().expect("spec"),
        "bench-node",
        Some(dir.join("hw.json")),
    )
}

fn bench_driver_on(
    dir: &std::path::Path,
    mps_control: Option<&std::path::Path>,
    sim: Arc<dyn GpuControl>,
) -> (Driver, Arc<MemoryClaims>) {
    let driver_root = dir.join("driver-root");
    gpu_dra::prepare::driver_files::write_fake_driver_root(
        &driver_root,
        gpu_dra::gpu::catalog::SIM_DRIVER_VERSION,
    )
    .expect("driver root");
    if let Some(control) = mps_control {
        std::fs::copy(control, driver_root.join("usr/bin/nvidia-cuda-mps-control"))
            .expect("control binary");
    }
    let config = DriverConfig {
        driver_name: "gpu.nvidia.com".into(),
        mig_policy: gpu_dra::gpu::mig::MigPolicy::Auto,
        node_name: "bench-node".into(),
        cdi_root: dir.join("cdi"),
        state_dir: dir.join("state"),
        dev_root: None,
        consumable: Default::default(),
        passthrough: false,
        driver_root: Some(gpu_dra::prepare::driver_files::DriverRoot {
            here: driver_root.clone(),
            host: driver_root,
            hook: None,
            firmware: Default::default(),
        }),
    };
    let (state, _) = DeviceState::open(config, sim).expect("open");
    let claims = Arc::new(MemoryClaims::default());
    (Driver::new(state, claims.clone()), claims)
}

/// Prepares and then unprepares one claim (already in the claim source); returns both latencies.
fn round_trip(
    runtime: &tokio::runtime::Runtime,
    driver: &Driver,
    uid: String,
) -> (Duration, Duration) {
    runtime.block_on(timed_round_trip(driver, uid))
}

async fn timed_round_trip(driver: &Driver, uid: String) -> (Duration, Duration) {
    let claim_ref = ClaimRef {
        namespace: "bench".into(),
        name: uid.clone(),
        uid,
    };
    let started = Instant::now();
    let result = driver.prepare(vec![claim_ref.clone()]).await;
    let prepare = started.elapsed();
    assert!(result[0].1.is_ok(), "{:?}", result[0].1);
    let started = Instant::now();
    let result = driver.unprepare(vec![claim_ref]).await;
    let unprepare = started.elapsed();
    assert!(result[0].1.is_ok(), "{:?}", result[0].1);
    (prepare, unprepare)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, claims) = bench_driver(dir.path(), None);

    for (label, device_of) in [
        (
            "prepare whole GPU",
            Box::new(|i: usize| format!("gpu-{}", i % 8)) as Box<dyn Fn(usize) -> String>,
        ),
        (
            "prepare MIG 1g.10gb (carve)",
            Box::new(|i: usize| format!("gpu-{}-mig-1g10gb-19-{}", i % 8, (i / 8) % 7)),
        ),
    ] {
        let mut prepare = Vec::with_capacity(CLAIMS);
        let mut unprepare = Vec::with_capacity(CLAIMS);
        for i in 0..CLAIMS {
            let uid = format!("{}-{i}", label.len());
            claims.insert(claim(&uid, &device_of(i)));
            let (p, u) = round_trip(&runtime, &driver, uid);
            prepare.push(p);
            unprepare.push(u);
        }
        report(label, prepare);
        report(&label.replace("prepare", "unprepare"), unprepare);
    }
    mps(&runtime);
    xid_storm();
}

/// MPS claims on whole GPUs: prepare starts the claim's control daemon (and waits for it to
/// answer), unprepare stops it. Needs a control binary (the fake one from e2e/fakenvml, or
/// `GPU_DRA_MPS_CONTROL`) and root (the daemon's shm is a tmpfs mount).
fn mps(runtime: &tokio::runtime::Runtime) {
    const MPS_CLAIMS: usize = 200;
    let control = std::env::var_os("GPU_DRA_MPS_CONTROL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("target/release/nvidia-cuda-mps-control")
        });
    if !control.is_file() || !rustix::process::geteuid().is_root() {
        println!(
            "prepare MPS: not run (needs root and {}: cargo build --release -p fakenvml)",
            control.display()
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, claims) = bench_driver(dir.path(), Some(&control));
    let mut prepare = Vec::with_capacity(MPS_CLAIMS);
    let mut unprepare = Vec::with_capacity(MPS_CLAIMS);
    for i in 0..MPS_CLAIMS {
        let uid = format!("mps-{i}");
        let mut c = claim(&uid, &format!("gpu-{}", i % 8));
        if let Some(devices) = c
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
        {
            devices.config = Some(vec![
                k8s_openapi::api::resource::v1::DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: None,
                    opaque: Some(k8s_openapi::api::resource::v1::OpaqueDeviceConfiguration {
                        driver: "gpu.nvidia.com".into(),
                        parameters: k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                            serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "GpuConfig", "sharing": {"strategy": "MPS",
                                "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                              "defaultPinnedDeviceMemoryLimit": "10Gi"}}}),
                        ),
                    }),
                },
            ]);
        }
        claims.insert(c);
        let (p, u) = round_trip(runtime, &driver, uid);
        prepare.push(p);
        unprepare.push(u);
    }
    report("prepare MPS whole GPU (fake daemon)", prepare);
    report("unprepare MPS whole GPU", unprepare);
}

/// Counts the events the monitor saw; faults are not expected here.
#[derive(Default)]
struct Seen(AtomicUsize);

impl HealthSink for Seen {
    fn taints_changed(&self, _taints: std::collections::BTreeMap<String, Vec<DeviceTaint>>) {}
    fn changed(&self, change: &HealthChange) {
        panic!("a fault during the XID 13 storm: {change:?}");
    }
    fn event_seen(&self, _event: &GpuEvent) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn device_health(&self, _health: &[DeviceHealth]) {}
}

/// Whole-GPU prepare and unprepare with the health monitor running (on the multi-threaded
/// runtime `gpu-dra run` uses), quiet and then during an XID 13 storm.
fn xid_storm() {
    let runtime = gpu_dra::node::runtime().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (gpus, events) = Scripted::new(bench_node(dir.path()));
    let (driver, claims) = bench_driver_on(dir.path(), None, gpus.clone());
    let driver = Arc::new(driver);
    let published = {
        let state = driver.state();
        let options = gpu_dra::slices::SliceOptions {
            modes: Some(state.modes().clone()),
            ..gpu_dra::slices::SliceOptions::new("gpu.nvidia.com", "bench-node")
        };
        gpu_dra::slices::build(&state.inventory(), &options).expect("slices")
    };
    let seen = Arc::new(Seen::default());
    runtime.block_on(async {
        let shutdown = start_monitor(
            gpus,
            driver.clone(),
            published,
            dir.path().join("state"),
            seen.clone(),
        )
        .await;
        let run = async |label: &str| {
            let mut prepare = Vec::with_capacity(CLAIMS);
            let mut unprepare = Vec::with_capacity(CLAIMS);
            for i in 0..CLAIMS {
                let uid = format!("{label}-{i}");
                claims.insert(claim(&uid, &format!("gpu-{}", i % 8)));
                let (p, u) = timed_round_trip(&driver, uid).await;
                prepare.push(p);
                unprepare.push(u);
            }
            report(&format!("prepare whole GPU, {label}"), prepare);
            report(&format!("unprepare whole GPU, {label}"), unprepare);
        };
        run("monitor, quiet").await;
        let stop = Arc::new(AtomicBool::new(false));
        let storm = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sent = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..50 {
                        let event = GpuEvent {
                            minor: (sent % 8) as u32,
                            kind: GpuEventKind::Xid { code: 13 },
                            gpu_instance_id: None,
                            compute_instance_id: None,
                        };
                        if events.send(event).is_err() {
                            return sent;
                        }
                        sent += 1;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                sent
            })
        };
        run("XID 13 storm").await;
        stop.store(true, Ordering::Relaxed);
        let sent = storm.join().expect("storm thread");
        println!(
            "  (storm: {sent} events sent, {} seen by the monitor so far)",
            seen.0.load(Ordering::Relaxed)
        );
        let _ = shutdown.send(true);
    });
}
