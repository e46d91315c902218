//! Unit tests of the slice builder on simulated nodes: the attributes and capacities of full GPUs
//! and MIG devices, modes per policy and architecture, consumable shares, chunking and names.
use super::*;
use crate::gpu::sim::SimNode;
use crate::gpu::{DiscoveryConfig, GpuSource, Placement};

fn inventory(spec: &str) -> NodeInventory {
    let source: GpuSource = spec.parse().expect("spec");
    crate::gpu::discover(&DiscoveryConfig {
        sysfs_root: "/nonexistent".into(),
        ..DiscoveryConfig::new(source, "n1")
    })
    .expect("discover")
}

/// The capacities of a device published for several claims whose `memory` is not taken
/// unless asked for (`unlimited` and N shares).
fn shared_capacity(device: &Device) -> &BTreeMap<String, DeviceCapacity> {
    assert_eq!(
        device.allow_multiple_allocations,
        Some(true),
        "{}",
        device.name
    );
    let caps = device.capacity.as_ref().expect("capacity");
    let policy = caps["memory"].request_policy.as_ref().expect("policy");
    assert_eq!(
        policy.default.as_ref().map(|q| q.0.as_str()),
        Some("0"),
        "{}",
        device.name
    );
    caps
}

#[test]
fn consumable_shares_publish_full_gpus_for_several_claims() {
    use consumable::ConsumableShares;
    let inv = inventory("sim:1xH100-SXM5-80GB");
    let publish = |consumable| {
        content(
            &inv,
            &SliceOptions {
                consumable,
                ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
            },
        )
        .devices
    };
    let off = publish(ConsumableShares::Off);
    assert!(off.iter().all(|d| d.allow_multiple_allocations.is_none()));

    let memory = publish(ConsumableShares::Memory);
    let gpu = &memory[0];
    assert_eq!(gpu.name, "gpu-0");
    assert_eq!(gpu.allow_multiple_allocations, Some(true));
    let cap = &gpu.capacity.as_ref().expect("capacity")["memory"];
    let policy = cap.request_policy.as_ref().expect("policy");
    assert_eq!(cap.value.0, "81559Mi");
    assert_eq!(
        policy.default.as_ref().map(|q| q.0.as_str()),
        Some("81559Mi")
    );
    let range = policy.valid_range.as_ref().expect("range");
    assert_eq!(
        (
            range.min.0.as_str(),
            range.step.as_ref().map(|q| q.0.as_str())
        ),
        ("1Mi", Some("1Mi"))
    );
    // Placements are shared by memory too (the first claim carves, the last destroys)...
    assert!(memory[1..].iter().all(|d| {
        d.allow_multiple_allocations == Some(true)
            && d.capacity
                .as_ref()
                .is_some_and(|c| !c.contains_key("shares"))
    }),);

    // N shares: every device (full GPU and MIG, as NVIDIA's driver does) gets `shares`, and
    // `memory` may be asked for but is not taken by default.
    for device in &publish(ConsumableShares::Shares(4)) {
        let caps = shared_capacity(device);
        assert_eq!(caps["shares"].value.0, "4");
    }
    // `unlimited`: memory by default none, no shares, so any number of claims fit.
    for device in &publish(ConsumableShares::Unlimited) {
        let caps = shared_capacity(device);
        assert!(!caps.contains_key("shares"), "{}", device.name);
        let range = caps["memory"]
            .request_policy
            .as_ref()
            .and_then(|p| p.valid_range.as_ref());
        assert_eq!(range.map(|r| r.min.0.as_str()), Some("0"));
    }
    // What the API server would say about them, before they leave.
    for consumable in [
        ConsumableShares::Memory,
        ConsumableShares::Shares(4),
        ConsumableShares::Unlimited,
    ] {
        let options = SliceOptions {
            consumable,
            ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
        };
        assert!(build(&inv, &options).is_ok(), "{consumable}");
    }
}

fn attr<'a>(device: &'a Device, name: &str) -> &'a DeviceAttribute {
    device
        .attributes
        .as_ref()
        .and_then(|a| a.get(name))
        .unwrap_or_else(|| panic!("{} lacks {name}", device.name))
}

#[test]
fn quantities_print_like_kubernetes() {
    assert_eq!(binary_si(0), "0");
    assert_eq!(binary_si(132), "132");
    assert_eq!(binary_si(1024), "1Ki");
    assert_eq!(binary_si(81559 << 20), "81559Mi");
    assert_eq!(binary_si(80 << 30), "80Gi");
    assert_eq!(binary_si(1500), "1500");
}

#[test]
fn driver_versions_become_semver() {
    assert_eq!(semver_of("580.95.05"), "580.95.5");
    assert_eq!(semver_of("550.54.15"), "550.54.15");
    assert_eq!(semver_of("560.28"), "560.28.0");
}

#[test]
fn h100_node_has_eight_full_gpus_with_nvidia_attributes() {
    let options = SliceOptions {
        mig_policy: MigPolicy::Static,
        ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
    };
    let slices = build(&inventory("sim:8xH100-SXM5-80GB"), &options).expect("valid");
    assert_eq!(slices.len(), 1);
    let spec = &slices[0].spec;
    assert_eq!(spec.driver, "gpu.nvidia.com");
    assert_eq!(spec.pool.name, "n1");
    assert_eq!(spec.pool.resource_slice_count, 1);
    assert_eq!(spec.node_name.as_deref(), Some("n1"));
    let devices = spec.devices.as_ref().expect("devices");
    let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    let d = &devices[0];
    assert_eq!(attr(d, "type").string.as_deref(), Some("gpu"));
    assert_eq!(
        attr(d, "productName").string.as_deref(),
        Some("NVIDIA H100 80GB HBM3")
    );
    assert_eq!(attr(d, "architecture").string.as_deref(), Some("Hopper"));
    assert_eq!(attr(d, "brand").string.as_deref(), Some("Nvidia"));
    assert_eq!(
        attr(d, "cudaComputeCapability").version.as_deref(),
        Some("9.0.0")
    );
    assert_eq!(
        attr(d, "driverVersion").version.as_deref(),
        Some("580.95.5")
    );
    assert_eq!(
        attr(d, "cudaDriverVersion").version.as_deref(),
        Some("13.0.0")
    );
    assert_eq!(
        attr(d, "resource.kubernetes.io/pciBusID").string.as_deref(),
        Some("0000:18:00.0")
    );
    assert_eq!(
        attr(d, "resource.kubernetes.io/pcieRoot").string.as_deref(),
        Some("pci0000:15")
    );
    assert_eq!(attr(d, "resource.kubernetes.io/numaNode").int, Some(0));
    assert!(
        attr(d, "uuid")
            .string
            .as_deref()
            .is_some_and(|u| u.starts_with("GPU-"))
    );
    assert_eq!(
        d.capacity
            .as_ref()
            .and_then(|c| c.get("memory"))
            .map(|c| c.value.0.as_str()),
        Some("81559Mi")
    );
    assert_eq!(
        attr(&devices[7], "resource.kubernetes.io/numaNode").int,
        Some(1)
    );
    // No coherent CPU memory on this platform: NVML answers `None` (as a real H200 did),
    // published under go-nvlib's name.
    assert!(
        devices
            .iter()
            .all(|d| attr(d, "addressingMode").string.as_deref() == Some("None"))
    );
}

#[test]
fn unified_memory_gpus_are_published_without_a_memory_capacity() {
    let spark = inventory("sim:1xGB10");
    let devices = content(&spark, &SliceOptions::new(DEFAULT_DRIVER_NAME, "spark")).devices;
    assert_eq!(devices.len(), 1);
    let gpu = &devices[0];
    assert_eq!(gpu.name, "gpu-0");
    assert_eq!(
        attr(gpu, "productName").string.as_deref(),
        Some("NVIDIA GB10")
    );
    assert_eq!(
        attr(gpu, "cudaComputeCapability").version.as_deref(),
        Some("12.1.0")
    );
    assert_eq!(attr(gpu, "addressingMode").string.as_deref(), Some("ATS"));
    assert_eq!(gpu.capacity, None);
    // Consumable shares divide memory; a GPU that reports none stays exclusive.
    for mode in [
        consumable::ConsumableShares::Memory,
        consumable::ConsumableShares::Shares(4),
    ] {
        let options = SliceOptions {
            consumable: mode,
            ..SliceOptions::new(DEFAULT_DRIVER_NAME, "spark")
        };
        let shared = content(&spark, &options).devices;
        assert_eq!(shared[0].allow_multiple_allocations, None, "{mode}");
        assert_eq!(shared[0].capacity, None, "{mode}");
    }
}

#[test]
fn grace_attached_gpus_and_their_mig_devices_publish_their_addressing_mode() {
    let options = SliceOptions::new(DEFAULT_DRIVER_NAME, "n1");
    let slices = build(&inventory("sim:2xGB200-186GB"), &options).expect("valid");
    let devices: Vec<&Device> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    assert!(devices.iter().any(|d| d.name.contains("-mig-")));
    for d in devices {
        assert_eq!(
            attr(d, "addressingMode").string.as_deref(),
            Some("ATS"),
            "{}",
            d.name
        );
    }
}

#[test]
fn mixed_fleet_and_static_mig_instances() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = SimNode::new(
        "2xA100-SXM4-40GB,1xT4".parse().expect("spec"),
        "n1",
        Some(dir.path().join("s.json")),
    );
    node.set_mig_mode(1, true).expect("enable");
    node.reset_gpu(1).expect("reset");
    let gi = node
        .create_gpu_instance(1, 9, Placement { start: 4, size: 4 })
        .expect("3g");
    let (_, uuid) = node.create_compute_instance(1, gi).expect("ci");
    let gi = node
        .create_gpu_instance(1, 19, Placement { start: 0, size: 1 })
        .expect("1g");
    node.create_compute_instance(1, gi).expect("ci");
    let slices = build(
        &node.inventory().expect("inventory"),
        &SliceOptions::new("gpu.nvidia.com", "n1"),
    )
    .expect("valid");
    let devices = slices[0].spec.devices.as_ref().expect("devices");
    let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0",
            "gpu-1-mig-1g5gb-19-0",
            "gpu-1-mig-3g20gb-9-4",
            "gpu-2"
        ]
    );
    let mig = &devices[2];
    assert_eq!(attr(mig, "type").string.as_deref(), Some("mig"));
    assert_eq!(attr(mig, "profile").string.as_deref(), Some("3g.20gb"));
    assert_eq!(attr(mig, "uuid").string.as_deref(), Some(uuid.as_str()));
    assert_eq!(
        attr(mig, "parentUUID").string,
        Some(crate::gpu::sim::gpu_uuid("n1", 1))
    );
    assert_eq!(
        attr(mig, "productName").string.as_deref(),
        Some("NVIDIA A100-SXM4-40GB")
    );
    let cap = |name: &str| {
        mig.capacity
            .as_ref()
            .and_then(|c| c.get(name))
            .map(|c| c.value.0.clone())
    };
    assert_eq!(cap("multiprocessors").as_deref(), Some("42"));
    assert_eq!(cap("copyEngines").as_deref(), Some("3"));
    assert_eq!(cap("decoders").as_deref(), Some("2"));
    assert_eq!(cap("memory").as_deref(), Some("19968Mi"));
    // 3g.20gb at 4 on an 8-slice A100 holds memory slices 4–7.
    let slices_held: Vec<&str> = mig
        .capacity
        .iter()
        .flat_map(|c| c.keys())
        .filter(|k| k.starts_with("memorySlice"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        slices_held,
        [
            "memorySlice4",
            "memorySlice5",
            "memorySlice6",
            "memorySlice7"
        ]
    );
    assert_eq!(cap("memorySlice4").as_deref(), Some("1"));
    assert_eq!(
        attr(&devices[3], "productName").string.as_deref(),
        Some("Tesla T4")
    );
    assert_eq!(
        attr(&devices[3], "architecture").string.as_deref(),
        Some("Turing")
    );
}

#[test]
fn large_fleets_split_into_counted_slices() {
    let slices = build(
        &inventory("sim:160xL4"),
        &SliceOptions::new("gpu.nvidia.com", "big"),
    )
    .expect("valid");
    assert_eq!(slices.len(), 2);
    let sizes: Vec<_> = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes, [128, 32]);
    for s in &slices {
        assert_eq!(s.spec.pool.resource_slice_count, 2);
        assert_eq!(s.spec.pool.name, "big");
    }
    assert_ne!(slices[0].metadata.name, slices[1].metadata.name);
    assert_eq!(
        slices[1].spec.devices.as_ref().expect("devices")[0].name,
        "gpu-128"
    );
}

#[test]
fn long_node_names_give_valid_slice_names() {
    let node = "n".repeat(250);
    let name = slice_name(&SliceOptions::new("gpu.nvidia.com", &node), 3);
    assert!(name.len() <= 253, "{}", name.len());
    assert_ne!(
        name,
        slice_name(&SliceOptions::new("gpu.nvidia.com", &node), 4)
    );
}

fn consumed(device: &Device) -> BTreeMap<String, String> {
    device
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| {
            c.counters
                .iter()
                .map(|(k, v)| (k.clone(), v.value.0.clone()))
        })
        .collect()
}

#[test]
fn hopper_gpus_are_dynamic_by_default_with_counters_and_placements() {
    let slices = build(
        &inventory("sim:8xH100-SXM5-80GB"),
        &SliceOptions::new(DEFAULT_DRIVER_NAME, "n1"),
    )
    .expect("valid");
    // One counter slice, then 8 whole GPUs + 8 × 25 placements in slices of at most 64.
    let shapes: Vec<(usize, usize)> = slices
        .iter()
        .map(|s| {
            (
                s.spec.shared_counters.as_ref().map_or(0, Vec::len),
                s.spec.devices.as_ref().map_or(0, Vec::len),
            )
        })
        .collect();
    assert_eq!(shapes, [(8, 0), (0, 64), (0, 64), (0, 64), (0, 16)]);
    let names: Vec<_> = slices
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "name order is publication order");
    let set = &slices[0].spec.shared_counters.as_ref().expect("sets")[0];
    assert_eq!(set.name, "gpu-0-counter-set");
    let value = |k: &str| set.counters.get(k).map(|c| c.value.0.clone());
    assert_eq!(value("multiprocessors").as_deref(), Some("132"));
    assert_eq!(value("memory").as_deref(), Some("81152Mi"));
    assert_eq!(value("memory-slice-7").as_deref(), Some("1"));
    assert_eq!(set.counters.len(), 15);
    let devices: Vec<&Device> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .collect();
    assert_eq!(devices.len(), 208);
    assert_eq!(devices[0].name, "gpu-0");
    assert_eq!(
        consumed(devices[0]).len(),
        14,
        "the whole GPU consumes every non-zero counter"
    );
    let p = devices
        .iter()
        .find(|d| d.name == "gpu-3-mig-3g40gb-9-4")
        .expect("placement device");
    assert_eq!(attr(p, "type").string.as_deref(), Some("mig"));
    assert_eq!(attr(p, "profile").string.as_deref(), Some("3g.40gb"));
    assert!(
        p.attributes
            .as_ref()
            .is_some_and(|a| !a.contains_key("uuid")),
        "no UUID before it exists"
    );
    let c = consumed(p);
    assert_eq!(c.get("multiprocessors").map(String::as_str), Some("60"));
    assert_eq!(c.get("memory").map(String::as_str), Some("40448Mi"));
    let slices_used: Vec<_> = c
        .keys()
        .filter(|k| k.starts_with("memory-slice-"))
        .cloned()
        .collect();
    assert_eq!(
        slices_used,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );
    assert_eq!(
        p.consumes_counters.as_ref().expect("consumes")[0].counter_set,
        "gpu-3-counter-set"
    );
}

#[test]
fn modes_per_policy_and_architecture() {
    // Ampere with MIG off cannot be partitioned without a reset: whole GPU only.
    let a100 = inventory("sim:1xA100-SXM4-40GB");
    assert_eq!(devices(&a100).len(), 1);
    let off = SliceOptions {
        mig_policy: MigPolicy::Off,
        ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
    };
    let h100 = inventory("sim:1xH100-SXM5-80GB");
    assert_eq!(content(&h100, &off).devices.len(), 1);
    let name_order = SliceOptions {
        order: DeviceOrder::Name,
        ..SliceOptions::new(DEFAULT_DRIVER_NAME, "n1")
    };
    let names: Vec<String> = content(&h100, &name_order)
        .devices
        .into_iter()
        .map(|d| d.name)
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    // Packed order puts a 1g at the top slot before the bottom ones.
    let packed: Vec<String> = devices(&h100).into_iter().map(|d| d.name).collect();
    let pos = |n: &str| packed.iter().position(|d| d == n).expect(n);
    assert!(pos("gpu-0-mig-1g10gb-19-6") < pos("gpu-0-mig-1g10gb-19-0"));
}

#[test]
fn ampere_in_mig_mode_is_dynamic_without_the_whole_gpu() {
    let node = SimNode::new("1xA100-SXM4-80GB".parse().expect("spec"), "n1", None);
    node.set_mig_mode(0, true).expect("mode");
    node.reset_gpu(0).expect("reset");
    let names: Vec<String> = devices(&node.inventory().expect("inv"))
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert!(!names.contains(&"gpu-0".to_string()));
    assert_eq!(names.len(), 25);
}
