//! MIG operations on different GPUs overlap through the real NVML code path (the NVML backend
//! loaded against the fake libnvidia-ml, whose GPU instance creates and destroys wait at a gate
//! the test holds shut): a carve on one GPU waits for no carve on another, and reading another
//! GPU's inventory does not wait for it either. Overlap is seen as two calls inside the fake at
//! once, not timed, so the machine's load cannot decide the outcome.
mod common;
use common::{claim, claim_ref, config, fake_library};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_dra::gpu::mig::mig_device_name;
use gpu_dra::gpu::nvml::NvmlBackend;
use gpu_dra::gpu::sim::{SimNode, write_fake_sysfs};
use gpu_dra::prepare::state::DeviceState;

/// The fake reads its configuration from the environment, which is per process.
static ENV: Mutex<()> = Mutex::new(());

const SPEC: &str = "sim:2xH100-SXM5-80GB";
/// Only for a backend that is wrong: how long to wait for what a correct one does at once
/// before failing (a serialising backend would otherwise hang at the shut gate).
const DEADLINE: Duration = Duration::from_secs(60);

/// The fake's `FAKE_NVML_MIG_GATE`: GPU instance creates and destroys mark that they entered
/// and wait until the gate is open.
struct Gate(PathBuf);

impl Gate {
    fn new(dir: &Path) -> Gate {
        let gate = Gate(dir.join("mig-gate"));
        std::fs::create_dir_all(&gate.0).expect("gate directory");
        gate
    }

    fn shut(&self) {
        let _ = std::fs::remove_file(self.0.join("open"));
    }

    fn open(&self) {
        std::fs::write(self.0.join("open"), b"").expect("open the gate");
    }

    /// Creates and destroys that have reached the gate so far.
    fn entered(&self) -> usize {
        std::fs::read_dir(&self.0)
            .expect("gate directory")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("entered-"))
            })
            .count()
    }

    /// Waits until `count` calls have entered in all; on the deadline opens the gate (so the
    /// callers end) and fails with `why`.
    fn wait_entered(&self, count: usize, why: &str) {
        let deadline = Instant::now() + DEADLINE;
        while self.entered() < count {
            if Instant::now() > deadline {
                self.open();
                panic!(
                    "{why}: {} of {count} MIG calls reached the gate",
                    self.entered()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Points the fake at a simulated node whose MIG calls wait at `gate`; the caller holds `ENV`.
fn configure(node: &str, state: &Path, gate: &Gate) -> SimNode {
    // SAFETY: the caller holds the ENV lock, which serialises every reader and writer of these
    // variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", node);
        std::env::set_var("FAKE_NVML_STATE", state);
        std::env::set_var("FAKE_NVML_MIG_GATE", &gate.0);
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
    let gate = Gate::new(dir.path());
    let sim = configure(NODE, &dir.path().join("hw.json"), &gate);
    let nvml = open(dir.path());
    let (state, _) =
        DeviceState::open(config(dir.path(), NODE), nvml.clone()).expect("open the device state");
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );
    assert_eq!(gate.entered(), 0, "no MIG call before the first prepare");

    // One 1g.10gb carve on each GPU, from two threads at once: both GI creates must be inside
    // the fake together, which a backend that serialises them never lets happen.
    gate.shut();
    std::thread::scope(|s| {
        let carves: Vec<_> = [(0, "a"), (1, "b")]
            .into_iter()
            .map(|(minor, uid)| {
                let state = &state;
                s.spawn(move || {
                    state
                        .prepare(&claim_ref(uid), &claim(uid, NODE, &small_slice(minor, 0)))
                        .unwrap_or_else(|e| panic!("prepare on GPU {minor}: {e}"))
                })
            })
            .collect();
        gate.wait_entered(2, "carves on GPUs 0 and 1 are serialised, not overlapping");
        assert!(
            carves.iter().all(|c| !c.is_finished()),
            "a carve ended while its GI create was held"
        );
        gate.open();
        for carve in carves {
            carve.join().expect("carve thread");
        }
    });
    let inventory = nvml.inventory().expect("inventory");
    assert_eq!(inventory, sim.inventory().expect("sim"));
    for gpu in &inventory.gpus {
        let instances = &gpu.mig.as_ref().expect("MIG").instances;
        assert_eq!(instances.len(), 1, "GPU {}: {instances:?}", gpu.minor);
    }

    // While GPU 0's carve is held inside its GI create, GPU 1's inventory answers.
    let gpu_1 = BTreeSet::from([1]);
    let before = nvml.inventory_of(&gpu_1).expect("inventory of GPU 1");
    assert_eq!(before.gpus.len(), 1);
    assert_eq!(before.gpus[0].minor, 1);
    gate.shut();
    std::thread::scope(|s| {
        let carve = s.spawn(|| {
            state
                .prepare(&claim_ref("c"), &claim("c", NODE, &small_slice(0, 1)))
                .expect("second carve on GPU 0")
        });
        gate.wait_entered(3, "the second carve on GPU 0 never reached its GI create");
        let read = s.spawn(|| nvml.inventory_of(&gpu_1));
        let deadline = Instant::now() + DEADLINE;
        while !read.is_finished() {
            if Instant::now() > deadline {
                gate.open();
                panic!("inventory_of({{1}}) waits for the carve on GPU 0");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !carve.is_finished(),
            "the carve ended while held at the gate"
        );
        let during = read
            .join()
            .expect("inventory thread")
            .expect("inventory of GPU 1 during a carve");
        assert_eq!(during, before, "GPU 1 is unchanged");
        gate.open();
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

    // Unprepares (GI destroys) on the two GPUs overlap too.
    gate.shut();
    std::thread::scope(|s| {
        let drops: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|uid| {
                let state = &state;
                s.spawn(move || {
                    state
                        .unprepare(uid)
                        .unwrap_or_else(|e| panic!("unprepare {uid}: {e}"))
                })
            })
            .collect();
        gate.wait_entered(5, "unprepares on GPUs 0 and 1 are serialised");
        gate.open();
        for d in drops {
            d.join().expect("unprepare thread");
        }
    });
    state.unprepare("c").expect("unprepare c");
    assert_eq!(
        gate.entered(),
        6,
        "one GI create or destroy per carve and per unprepare"
    );
    assert_eq!(
        nvml.inventory().expect("inventory"),
        sim.inventory().expect("sim")
    );
}
