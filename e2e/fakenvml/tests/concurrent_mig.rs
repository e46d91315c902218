//! MIG operations on different GPUs overlap through the real NVML code path (the NVML backend
//! loaded against the fake libnvidia-ml, whose GPU instance creates and destroys take 1 s here):
//! a carve on one GPU waits for no carve on another, and reading another GPU's inventory does not
//! wait for it either.
mod common;
use common::{claim, claim_ref, config, fake_library};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use gpu_dra::gpu::mig::mig_device_name;
use gpu_dra::gpu::nvml::NvmlBackend;
use gpu_dra::gpu::sim::{SimNode, write_fake_sysfs};
use gpu_dra::prepare::state::DeviceState;

/// The fake reads its configuration from the environment, which is per process.
static ENV: Mutex<()> = Mutex::new(());

const SPEC: &str = "sim:2xH100-SXM5-80GB";
const MIG_DELAY: Duration = Duration::from_secs(1);

/// Points the fake at a simulated node with slow MIG calls; the caller holds `ENV`.
fn configure(node: &str, state: &Path) -> SimNode {
    // SAFETY: the caller holds the ENV lock, which serialises every reader and writer of these
    // variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", node);
        std::env::set_var("FAKE_NVML_STATE", state);
        std::env::set_var("FAKE_NVML_MIG_DELAY_MS", MIG_DELAY.as_millis().to_string());
    }
    let sim = SimNode::new(SPEC.parse().expect("spec"), node, Some(state.to_path_buf()));
    sim.inventory().expect("create the state");
    sim
}

fn open(dir: &Path) -> Arc<NvmlBackend> {
    let sysfs = dir.join("sys");
    write_fake_sysfs(&sysfs, &SPEC.parse().expect("spec")).expect("sysfs links");
    Arc::new(
        NvmlBackend::open(Some(&fake_library()), sysfs)
            .expect("NVML init")
            .with_pci_scan(true),
    )
}

/// 1g.10gb of an H100 at `placement`.
fn small_slice(minor: u32, placement: u32) -> String {
    mig_device_name(minor, "1g.10gb", 19, placement)
}

#[test]
fn carves_on_two_gpus_overlap_and_another_gpus_inventory_does_not_wait() {
    const NODE: &str = "c1";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(NODE, &dir.path().join("hw.json"));
    let nvml = open(dir.path());
    let (state, _) =
        DeviceState::open(config(dir.path(), NODE), nvml.clone()).expect("open the device state");
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );

    // One 1g.10gb carve on each GPU, from two threads at once: each takes the 1 s GI create.
    let start = Barrier::new(2);
    let took = std::thread::scope(|s| {
        let carves: Vec<_> = [(0, "a"), (1, "b")]
            .into_iter()
            .map(|(minor, uid)| {
                let (state, start) = (&state, &start);
                s.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    state
                        .prepare(&claim_ref(uid), &claim(uid, NODE, &small_slice(minor, 0)))
                        .unwrap_or_else(|e| panic!("prepare on GPU {minor}: {e}"));
                    began.elapsed()
                })
            })
            .collect();
        carves
            .into_iter()
            .map(|c| c.join().expect("carve thread"))
            .collect::<Vec<_>>()
    });
    for took in &took {
        assert!(*took >= MIG_DELAY, "a carve took {took:?}: no MIG delay?");
        assert!(
            *took < Duration::from_millis(1800),
            "carves on GPUs 0 and 1 took {took:?}: serialised, not overlapping"
        );
    }
    let inventory = nvml.inventory().expect("inventory");
    assert_eq!(inventory, sim.inventory().expect("sim"));
    for gpu in &inventory.gpus {
        let instances = &gpu.mig.as_ref().expect("MIG").instances;
        assert_eq!(instances.len(), 1, "GPU {}: {instances:?}", gpu.minor);
    }

    // While GPU 0 is carved again, GPU 1's inventory answers at once.
    let gpu_1 = BTreeSet::from([1]);
    let before = nvml.inventory_of(&gpu_1).expect("inventory of GPU 1");
    assert_eq!(before.gpus.len(), 1);
    assert_eq!(before.gpus[0].minor, 1);
    std::thread::scope(|s| {
        let carve = s.spawn(|| {
            state
                .prepare(&claim_ref("c"), &claim("c", NODE, &small_slice(0, 1)))
                .expect("second carve on GPU 0")
        });
        // Well into the GI create's delay.
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !carve.is_finished(),
            "the carve ended before it could be raced"
        );
        let began = Instant::now();
        let during = nvml
            .inventory_of(&gpu_1)
            .expect("inventory of GPU 1 during a carve");
        let waited = began.elapsed();
        assert!(
            !carve.is_finished(),
            "the carve on GPU 0 ended first: inventory_of waited for it ({waited:?})"
        );
        assert!(
            waited < Duration::from_millis(200),
            "inventory_of({{1}}) took {waited:?} during a carve on GPU 0"
        );
        assert_eq!(during, before, "GPU 1 is unchanged");
        carve.join().expect("carve thread");
    });
    // The full inventory sees the second carve once it is done.
    let after = nvml.inventory().expect("inventory");
    assert_eq!(after, sim.inventory().expect("sim"));
    assert_eq!(
        after.gpus[0].mig.as_ref().expect("MIG").instances.len(),
        2,
        "GPU 0 carved twice"
    );

    // Unprepares (GI destroys, 1 s each) overlap too.
    let took = std::thread::scope(|s| {
        let drops: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|uid| {
                let state = &state;
                s.spawn(move || {
                    let began = Instant::now();
                    state
                        .unprepare(uid)
                        .unwrap_or_else(|e| panic!("unprepare {uid}: {e}"));
                    began.elapsed()
                })
            })
            .collect();
        drops
            .into_iter()
            .map(|d| d.join().expect("unprepare thread"))
            .collect::<Vec<_>>()
    });
    for took in &took {
        assert!(
            *took < Duration::from_millis(1800),
            "unprepares on GPUs 0 and 1 took {took:?}: serialised"
        );
    }
    state.unprepare("c").expect("unprepare c");
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );
}
