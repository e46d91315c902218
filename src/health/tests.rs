use std::time::Duration;

use super::*;
use crate::gpu::events::GpuEventSource;
use crate::gpu::sim::{SimFault, SimNode};

fn node_with_mig(dir: &Path) -> SimNode {
    let node = SimNode::new(
        "sim:2xH100-SXM5-80GB".parse().expect("spec"),
        "n1",
        Some(dir.join("hw.json")),
    );
    node.set_mig_mode(1, true).expect("MIG on");
    let gi = node
        .create_gpu_instance(1, 19, crate::gpu::Placement { start: 2, size: 1 })
        .expect("GI");
    node.create_compute_instance(1, gi).expect("CI");
    node
}

fn xid(minor: u32, code: u64) -> GpuEvent {
    GpuEvent {
        minor,
        kind: GpuEventKind::Xid { code },
        gpu_instance_id: None,
        compute_instance_id: None,
    }
}

fn config() -> HealthConfig {
    HealthConfig {
        recovery_after: Duration::from_secs(60),
        ..HealthConfig::default()
    }
}

const RESET_ASKED: GpuProbe = GpuProbe {
    lost: false,
    recovery_action: Some(RecoveryAction::GpuReset),
};

#[test]
fn flags_parse_and_refuse_with_the_reason() {
    let effects: TaintEffects = "reset=NoExecute, lost=NoExecute".parse().expect("parses");
    assert_eq!(effects.recoverable, TaintEffect::NoSchedule);
    assert_eq!(effects.reset, TaintEffect::NoExecute);
    assert_eq!(effects.to_string().parse::<TaintEffects>(), Ok(effects));
    let err = "xid=NoExecute"
        .parse::<TaintEffects>()
        .expect_err("no such class");
    assert!(err.contains("recoverable, reset, lost"), "{err}");
    let err = "lost=Evict"
        .parse::<TaintEffects>()
        .expect_err("no such effect");
    assert!(err.contains("None, NoSchedule, NoExecute"), "{err}");
    assert_eq!(
        parse_xids("13, 31,").expect("parses"),
        BTreeSet::from([13, 31])
    );
    assert!(
        parse_xids("13,x")
            .expect_err("not a number")
            .contains("\"x\"")
    );
    assert_eq!(
        parse_xids(&default_ignored_xids()).expect("parses"),
        BTreeSet::from(APPLICATION_XIDS)
    );
}

#[test]
fn an_xid_taints_every_device_of_its_gpu_and_a_mig_event_only_its_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_with_mig(dir.path());
    let inventory = node.inventory().expect("inventory");
    let mut book = HealthBook::default();
    let devices = [
        "gpu-0",
        "gpu-0-mig-1g10gb-19-0",
        "gpu-1",
        "gpu-1-mig-1g10gb-19-2",
        "gpu-1-mig-1g10gb-19-3",
        "gpu-10",
    ];
    let change = book.raise(&xid(0, 79), Some(RESET_ASKED), &inventory, &config(), 100);
    assert!(matches!(change, Some(HealthChange::Raised(_))));
    let taints = book.taints(devices);
    assert_eq!(
        taints.keys().collect::<Vec<_>>(),
        ["gpu-0", "gpu-0-mig-1g10gb-19-0"],
        "gpu-10 is another GPU"
    );
    let taint = &taints["gpu-0"][0];
    assert_eq!(
        (
            taint.key.as_str(),
            taint.value.as_deref(),
            taint.effect.as_str()
        ),
        (XID_TAINT, Some("79"), "NoSchedule")
    );
    assert_eq!(
        taint.time_added.as_ref().map(|t| t.0.as_second()),
        Some(100)
    );

    // XID 31 is the application's: nothing. The same XID again: nothing new.
    assert_eq!(
        book.raise(&xid(1, 31), None, &inventory, &config(), 101),
        None
    );
    assert_eq!(
        book.raise(&xid(0, 79), Some(RESET_ASKED), &inventory, &config(), 102),
        None
    );
    assert_eq!(book.faults[0].last_seen, 102);

    let gi = inventory.gpus[1].mig.as_ref().expect("mig").instances[0].gpu_instance_id;
    let on_mig = GpuEvent {
        gpu_instance_id: Some(gi),
        compute_instance_id: Some(0),
        ..xid(1, 94)
    };
    book.raise(&on_mig, None, &inventory, &config(), 103);
    let taints = book.taints(devices);
    assert!(taints.contains_key("gpu-1-mig-1g10gb-19-2"));
    assert!(!taints.contains_key("gpu-1") && !taints.contains_key("gpu-1-mig-1g10gb-19-3"));
}

#[test]
fn recovery_follows_the_fault_class() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_with_mig(dir.path());
    let inventory = node.inventory().expect("inventory");
    let config = HealthConfig {
        effects: "lost=NoExecute".parse().expect("effects"),
        ..config()
    };
    let mut book = HealthBook::default();
    // A recoverable XID clears after the quiet period with a good probe, not before.
    book.raise(&xid(0, 8), Some(GpuProbe::HEALTHY), &inventory, &config, 0);
    assert!(book.probe(0, GpuProbe::HEALTHY, &config, 59).is_empty());
    let cleared = book.probe(0, GpuProbe::HEALTHY, &config, 60);
    assert!(matches!(&cleared[..], [HealthChange::Cleared(f, _)] if f.key == XID_TAINT));

    // A reset fault stays while the driver asks for a reset, however long, and clears after.
    book.raise(&xid(0, 48), Some(RESET_ASKED), &inventory, &config, 0);
    assert!(book.probe(0, RESET_ASKED, &config, 10_000).is_empty());
    assert_eq!(book.probe(0, GpuProbe::HEALTHY, &config, 10_001).len(), 1);
    assert!(book.faults.is_empty());

    // Lost: tainted NoExecute by the probe; back means reset, which also clears XID 79.
    book.raise(&xid(0, 79), None, &inventory, &config, 0);
    let lost = GpuProbe {
        lost: true,
        recovery_action: None,
    };
    let raised = book.probe(0, lost, &config, 1);
    assert!(matches!(&raised[..], [HealthChange::Raised(f)] if f.key == LOST_TAINT));
    assert_eq!(book.taints(["gpu-0"])["gpu-0"].len(), 2);
    assert_eq!(
        book.taints(["gpu-0"])["gpu-0"][0].effect,
        "NoExecute",
        "gpu-lost sorts first"
    );
    assert!(book.probe(0, lost, &config, 2).is_empty(), "raised once");
    let back = book.probe(0, GpuProbe::HEALTHY, &config, 3);
    assert_eq!(back.len(), 2, "{back:?}");
    assert!(book.faults.is_empty());

    // A driver without recovery actions: a reset fault waits for a loss and return (or reboot).
    book.raise(&xid(0, 48), None, &inventory, &config, 0);
    let unknown = GpuProbe {
        lost: false,
        recovery_action: None,
    };
    assert!(book.probe(0, unknown, &config, 100_000).is_empty());

    // The driver asking for a reset with no event seen (e.g. while the plugin was down).
    let mut book = HealthBook::default();
    let raised = book.probe(1, RESET_ASKED, &config, 5);
    assert!(matches!(&raised[..], [HealthChange::Raised(f)] if f.key == RESET_TAINT));
    assert!(book.probe(1, RESET_ASKED, &config, 6).is_empty());
    assert_eq!(book.probe(1, GpuProbe::HEALTHY, &config, 7).len(), 1);
}

#[test]
fn the_book_survives_a_restart_but_not_a_reboot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_with_mig(dir.path());
    let inventory = node.inventory().expect("inventory");
    let mut book = HealthBook::load(dir.path(), "boot-1").expect("empty");
    book.raise(&xid(0, 79), Some(RESET_ASKED), &inventory, &config(), 100);
    book.save(dir.path()).expect("save");
    assert_eq!(HealthBook::load(dir.path(), "boot-1").expect("load"), book);
    assert!(
        HealthBook::load(dir.path(), "boot-2")
            .expect("load")
            .faults
            .is_empty(),
        "a reboot resets the GPUs"
    );
    std::fs::write(HealthBook::path(dir.path()), b"{").expect("corrupt");
    let err = HealthBook::load(dir.path(), "boot-1").expect_err("corrupt");
    assert!(err.to_string().contains("health.json"), "{err}");
}

#[test]
fn simulated_faults_arrive_as_events_and_probes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = node_with_mig(dir.path());
    let mut events = node.event_source().expect("events");
    assert!(
        events
            .wait(Duration::from_millis(50))
            .expect("wait")
            .is_empty()
    );
    node.inject(
        0,
        SimFault::Xid {
            code: 79,
            gpu_instance_id: None,
            compute_instance_id: None,
        },
    )
    .expect("inject");
    node.inject(
        1,
        SimFault::EccDoubleBit {
            gpu_instance_id: None,
        },
    )
    .expect("inject");
    let seen = events.wait(Duration::from_secs(2)).expect("wait");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0], xid(0, 79));
    assert_eq!(seen[1].kind, GpuEventKind::DoubleBitEcc);
    assert!(node.probe(0).expect("probe").lost, "XID 79 is off the bus");
    assert_eq!(node.probe(1).expect("probe"), RESET_ASKED);
    let err = node
        .create_gpu_instance(0, 19, crate::gpu::Placement { start: 0, size: 1 })
        .expect_err("lost");
    assert!(err.to_string().contains("GPU is lost"), "{err}");
    node.inject(1, SimFault::Reset).expect("reset");
    assert_eq!(node.probe(1).expect("probe"), GpuProbe::HEALTHY);
    assert!(
        node.inventory().expect("inventory").gpus[1]
            .mig
            .as_ref()
            .is_some_and(|m| m.instances.is_empty() && m.mode.current),
        "a reset destroys MIG instances and keeps MIG mode"
    );
}
