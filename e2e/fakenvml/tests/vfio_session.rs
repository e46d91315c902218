//! The NVML session on the real code path, as the kernel sees it: the fake `libnvidia-ml` holds
//! every GPU it enumerated open while its session lives (the simulated kernel's unbind waits for
//! such holders), and enumerates at init, so a GPU given back to `nvidia` is seen by the next
//! session only. The backend closes its session (and gives back its event set) for an unbind,
//! and opens a new one after.
mod common;

use std::time::Duration;

use common::fake_library;
use gpu_dra::gpu::GpuControl;
use gpu_dra::gpu::nvml::NvmlBackend;
use gpu_dra::gpu::sim::{PciDriver, SimNode};

const SPEC: &str = "sim:2xH100-SXM5-80GB";
const SESSION: &str = "libnvidia-ml (NVML session)";

/// The GPUs each holder has open, as the simulated kernel records them.
fn held(sim: &SimNode) -> Vec<(u32, Vec<String>)> {
    (0..2)
        .map(|minor| {
            let holders = sim.holders(minor).expect("holders");
            (minor, holders.into_iter().map(|h| h.name).collect())
        })
        .collect()
}

#[test]
fn the_session_closes_for_an_unbind_and_the_next_one_sees_a_gpu_given_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("s.json");
    // SAFETY: the only test in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", SPEC);
        std::env::set_var("FAKE_NVML_NODE", "n1");
        std::env::set_var("FAKE_NVML_STATE", &state);
    }
    let sim = SimNode::new(SPEC.parse().expect("spec"), "n1", Some(state));
    let nvml = NvmlBackend::open(Some(&fake_library()), "/nonexistent".into()).expect("NVML init");
    let session = || vec![SESSION.to_string()];
    assert_eq!(held(&sim), [(0, session()), (1, session())]);

    // The event thread, as the health monitor runs it: it gives its set back for a close.
    let mut events = GpuControl::event_source(&nvml).expect("events");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                events.wait(Duration::from_millis(100)).expect("wait");
            }
            events.watched()
        })
    };

    // Closed, the GPUs are not held: the unbind goes through at once.
    let closed = nvml.close_session(Duration::from_secs(5)).expect("close");
    assert_eq!(held(&sim), [(0, vec![]), (1, vec![])]);
    sim.bind_driver(1, PciDriver::VfioPci).expect("unbind");
    assert!(sim.state().expect("state").stuck_unbinds.is_empty());
    drop(closed);

    // The next session sees GPU 0 only, and holds it.
    let minors = |nvml: &NvmlBackend| -> Vec<u32> {
        nvml.inventory()
            .expect("inventory")
            .gpus
            .iter()
            .map(|g| g.minor)
            .collect()
    };
    assert_eq!(minors(&nvml), [0]);
    assert_eq!(held(&sim), [(0, session()), (1, vec![])]);

    // Back on nvidia while the session lives: NVML enumerated at init and does not see it...
    sim.bind_driver(1, PciDriver::Nvidia).expect("rebind");
    nvml.invalidate_all();
    assert_eq!(minors(&nvml), [0], "a session sees the GPUs of its init");
    // ...until the session is closed and opened again, as the driver does around the rebind.
    drop(nvml.close_session(Duration::from_secs(5)).expect("close"));
    assert_eq!(minors(&nvml), [0, 1]);
    assert_eq!(held(&sim), [(0, session()), (1, session())]);

    // The event set was registered again on the new session: both GPUs.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(waiter.join().expect("event thread"), [0, 1]);

    // Persistence mode through NVML is the simulated kernel's.
    nvml.set_persistence_mode(0, true).expect("persistence on");
    assert!(sim.persistence(0).expect("read"));
    assert!(nvml.persistence_mode(0).expect("read through NVML"));
    let holders = sim.holders(0).expect("holders");
    assert!(
        holders
            .iter()
            .any(|h| h.pid.is_none() && h.name == "persistence mode")
    );
    nvml.set_persistence_mode(0, false)
        .expect("persistence off");

    // A backend's end closes its session.
    drop(nvml);
    assert_eq!(held(&sim), [(0, vec![]), (1, vec![])]);
}
