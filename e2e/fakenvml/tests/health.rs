//! GPU health through the real NVML code path: the NVML backend, loaded against the fake
//! libnvidia-ml, must see the faults the simulator raises (`SimNode::inject`) as NVML events and
//! probe answers, exactly as the simulation backend reports them.
mod common;
use common::fake_library;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpu_dra::gpu::events::{GpuEvent, GpuEventKind, GpuEventSource, GpuProbe, RecoveryAction};
use gpu_dra::gpu::nvml::NvmlBackend;
use gpu_dra::gpu::sim::{SimFault, SimNode};
use gpu_dra::gpu::{GpuControl, GpuError, MigFailure, Placement};

/// The fake reads its configuration from the environment, which is per process.
static ENV: Mutex<()> = Mutex::new(());

/// Points the fake at a simulated node; the caller holds `ENV`.
fn configure(spec: &str, node: &str, state: &Path) -> SimNode {
    // SAFETY: the caller holds the ENV lock, which serialises every reader and writer of these
    // variables in this process.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", spec);
        std::env::set_var("FAKE_NVML_NODE", node);
        std::env::set_var("FAKE_NVML_STATE", state);
    }
    let sim = SimNode::new(spec.parse().expect("spec"), node, Some(state.to_path_buf()));
    sim.inventory().expect("create the state");
    sim
}

fn open() -> NvmlBackend {
    NvmlBackend::open(Some(&fake_library()), "/nonexistent".into()).expect("NVML init")
}

fn xid(code: u64) -> SimFault {
    SimFault::Xid {
        code,
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

/// Waits until `count` events came (or 5 s passed).
fn collect(source: &mut dyn GpuEventSource, count: usize) -> Vec<GpuEvent> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = Vec::new();
    while events.len() < count && Instant::now() < deadline {
        events.extend(source.wait(Duration::from_millis(200)).expect("wait"));
    }
    events
}

#[test]
fn nvml_events_are_the_faults_the_simulator_raises() {
    const SPEC: &str = "sim:2xH100-SXM5-80GB";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(SPEC, "h1", &dir.path().join("s.json"));
    sim.set_mig_mode(0, true).expect("MIG on");
    let gi = sim
        .create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
        .expect("3g@4");
    let (ci, _) = sim.create_compute_instance(0, gi).expect("ci");
    // Raised before the set exists: a new set does not see it.
    sim.inject(1, xid(13)).expect("inject");

    let nvml = open();
    let mut source = nvml.event_source().expect("register events");
    assert_eq!(
        source.wait(Duration::from_millis(100)).expect("wait"),
        vec![],
        "events from before the set"
    );

    sim.inject(1, xid(79)).expect("XID 79");
    sim.inject(
        0,
        SimFault::Xid {
            code: 31,
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(ci),
        },
    )
    .expect("XID 31 on the MIG device");
    sim.inject(
        0,
        SimFault::EccDoubleBit {
            gpu_instance_id: Some(gi),
        },
    )
    .expect("DBE");
    let expected = vec![
        GpuEvent {
            minor: 1,
            kind: GpuEventKind::Xid { code: 79 },
            gpu_instance_id: None,
            compute_instance_id: None,
        },
        GpuEvent {
            minor: 0,
            kind: GpuEventKind::Xid { code: 31 },
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(ci),
        },
        GpuEvent {
            minor: 0,
            kind: GpuEventKind::DoubleBitEcc,
            gpu_instance_id: Some(gi),
            compute_instance_id: None,
        },
    ];
    assert_eq!(collect(source.as_mut(), 3), expected);

    // The simulation backend's own event source says the same.
    let mut sim_source = GpuControl::event_source(&sim).expect("sim events");
    sim.inject(0, xid(43)).expect("XID 43");
    assert_eq!(collect(source.as_mut(), 1), collect(sim_source.as_mut(), 1));

    // Nothing more: the wait lasts its timeout and returns nothing.
    let started = Instant::now();
    let events = source.wait(Duration::from_millis(300)).expect("wait");
    let waited = started.elapsed();
    assert_eq!(events, vec![]);
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "waited {waited:?}"
    );
    drop(source);
}

#[test]
fn probes_see_lost_gpus_and_recovery_actions_until_reset() {
    const SPEC: &str = "sim:2xA100-SXM4-40GB";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("calls.log");
    let sim = configure(SPEC, "h2", &dir.path().join("s.json"));
    // SAFETY: serialised by ENV.
    unsafe { std::env::set_var("FAKE_NVML_CALL_LOG", &log) };
    let nvml = open();
    // SAFETY: serialised by ENV; the fake read it at init, and other tests must not log.
    unsafe { std::env::remove_var("FAKE_NVML_CALL_LOG") };
    let both = |minor: u32| {
        let through_nvml = GpuControl::probe(&nvml, minor).expect("NVML probe");
        assert_eq!(
            through_nvml,
            sim.probe(minor).expect("sim probe"),
            "GPU {minor}"
        );
        through_nvml
    };

    assert_eq!(both(0), GpuProbe::HEALTHY);
    assert_eq!(both(1), GpuProbe::HEALTHY);
    // A probe asks about its GPU only, and nothing about MIG (no cache, no enumeration).
    std::fs::write(&log, "").expect("truncate the call log");
    both(1);
    assert_eq!(
        std::fs::read_to_string(&log).expect("call log"),
        "nvmlDeviceGetTemperature 1\nnvmlDeviceGetFieldValues 1\n"
    );

    sim.inject(1, xid(79)).expect("XID 79");
    let lost_needing_reset = GpuProbe {
        lost: true,
        recovery_action: Some(RecoveryAction::GpuReset),
    };
    assert_eq!(both(1), lost_needing_reset);
    assert_eq!(both(0), GpuProbe::HEALTHY);

    sim.inject(
        0,
        SimFault::EccDoubleBit {
            gpu_instance_id: None,
        },
    )
    .expect("DBE");
    assert_eq!(
        both(0),
        GpuProbe {
            lost: false,
            recovery_action: Some(RecoveryAction::GpuReset),
        }
    );

    sim.inject(0, SimFault::Reset).expect("reset 0");
    sim.inject(1, SimFault::Reset).expect("reset 1");
    assert_eq!(both(0), GpuProbe::HEALTHY);
    assert_eq!(both(1), GpuProbe::HEALTHY);

    // Off the bus without an event: no recovery action asked, but lost.
    sim.inject(0, SimFault::Lost).expect("lost");
    assert_eq!(
        both(0),
        GpuProbe {
            lost: true,
            recovery_action: Some(RecoveryAction::None),
        }
    );
    // The MIG lifecycle on a lost GPU fails as on the simulator.
    let lost = |err: GpuError| {
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    minor: 0,
                    failure: MigFailure::Lost,
                    ..
                }
            ),
            "{err}"
        );
    };
    lost(nvml.set_mig_mode(0, true).expect_err("lost"));
    lost(sim.set_mig_mode(0, true).expect_err("lost"));
    lost(
        nvml.create_gpu_instance(0, 9, Placement { start: 4, size: 4 })
            .expect_err("lost"),
    );
    sim.inject(0, SimFault::Reset).expect("reset");
    assert_eq!(both(0), GpuProbe::HEALTHY);

    let err = GpuControl::probe(&nvml, 7).expect_err("no GPU 7");
    assert!(err.to_string().contains("no GPU"), "{err}");
}

#[test]
fn a_lost_gpu_is_left_out_of_the_event_set() {
    const SPEC: &str = "sim:2xA100-SXM4-40GB";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(SPEC, "h3", &dir.path().join("s.json"));
    let nvml = open();
    nvml.inventory().expect("inventory");
    sim.inject(1, SimFault::Lost).expect("lost");

    let mut source = GpuControl::event_source(&nvml).expect("the other GPU registers");
    sim.inject(1, xid(48)).expect("XID on the lost GPU");
    sim.inject(0, xid(94)).expect("XID on the healthy GPU");
    assert_eq!(
        collect(source.as_mut(), 1),
        vec![GpuEvent {
            minor: 0,
            kind: GpuEventKind::Xid { code: 94 },
            gpu_instance_id: None,
            compute_instance_id: None,
        }]
    );
    assert_eq!(
        source.wait(Duration::from_millis(300)).expect("wait"),
        vec![]
    );
}

/// The fake's NVML ABI as nvml-wrapper reads it: supported types, per-device registration with
/// the types asked for only, one event per wait with the device handle and XID, `Timeout`, and
/// the recovery-action field.
#[test]
fn nvml_wrapper_reads_the_fake_events_and_fields() {
    use nvml_wrapper::Nvml;
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;
    use nvml_wrapper::structs::device::FieldId;
    use nvml_wrapper_sys::bindings::field_id::{
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR,
    };

    const SPEC: &str = "sim:2xH100-SXM5-80GB";
    let _guard = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = configure(SPEC, "h4", &dir.path().join("s.json"));
    let nvml = Nvml::builder()
        .lib_path(fake_library().as_os_str())
        .init()
        .expect("NVML init");
    let gpu0 = nvml.device_by_index(0).expect("GPU 0");
    let gpu1 = nvml.device_by_index(1).expect("GPU 1");
    // An H100 is MIG-capable: it reports MIG configuration changes too.
    assert_eq!(
        gpu0.supported_event_types().expect("supported"),
        EventTypes::CRITICAL_XID_ERROR
            | EventTypes::DOUBLE_BIT_ECC_ERROR
            | EventTypes::SINGLE_BIT_ECC_ERROR
            | EventTypes::MIG_CONFIG_CHANGE
    );
    let refused = gpu1
        .register_events(
            EventTypes::PSTATE_CHANGE,
            nvml.create_event_set().expect("set"),
        )
        .expect_err("P-state events are not simulated");
    assert!(
        matches!(refused.error, NvmlError::NotSupported),
        "{refused:?}"
    );

    let set = gpu0
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().expect("set"),
        )
        .expect("register");
    sim.inject(1, xid(48)).expect("XID on the unregistered GPU");
    sim.inject(
        0,
        SimFault::EccDoubleBit {
            gpu_instance_id: None,
        },
    )
    .expect("DBE, not registered");
    sim.inject(0, xid(94)).expect("XID 94");
    sim.inject(0, xid(95)).expect("XID 95");
    for code in [94, 95] {
        let event = set.wait(2_000).expect("an event");
        assert_eq!(event.event_type, EventTypes::CRITICAL_XID_ERROR);
        assert_eq!(event.event_data, Some(XidError::Value(code)));
        assert_eq!(
            event.device.uuid().expect("uuid"),
            gpu0.uuid().expect("uuid")
        );
    }
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    set.release_events().expect("free");

    // A GPU instance made by someone else (here: the simulator, as `nvidia-smi mig -cgi` would)
    // is a MIG-config-change event on its GPU's set.
    let set = gpu0
        .register_events(
            EventTypes::MIG_CONFIG_CHANGE,
            nvml.create_event_set().expect("set"),
        )
        .expect("register MIG changes");
    sim.set_mig_mode(0, true).expect("MIG mode");
    sim.create_gpu_instance(0, 19, gpu_dra::gpu::Placement { start: 0, size: 1 })
        .expect("GPU instance");
    let event = set.wait(2_000).expect("a MIG event");
    assert_eq!(event.event_type, EventTypes::MIG_CONFIG_CHANGE);
    assert_eq!(
        event.device.uuid().expect("uuid"),
        gpu0.uuid().expect("uuid")
    );
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    set.release_events().expect("free");

    let fields = gpu0
        .field_values_for(&[
            FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION),
            FieldId(NVML_FI_DEV_PCIE_COUNT_FATAL_ERROR),
        ])
        .expect("field values");
    let values: Vec<_> = fields
        .into_iter()
        .map(|f| f.expect("known value type").value)
        .collect();
    assert!(
        matches!(
            values.as_slice(),
            [Ok(SampleValue::U32(1)), Err(NvmlError::NotSupported)]
        ),
        "{values:?}"
    );
}
