//! Tests of the device model's parts read off the simulator ([`super::sim`]): PCI scanning of
//! the sysfs it renders ([`super::pci`]) and MIG placement rules on its profiles
//! ([`super::mig`]). Here rather than in those modules because the simulator is built from
//! them: a test there importing it would make an import circle.
use std::fs;

use super::mig::fit_together;
use super::pci::{VfioAliases, bind, scan, vfio_driver};
use super::sim::{
    PciDriver, SimNode, render_sysfs, sim_iommu_group, sim_pci_location, sim_vfio_aliases,
};

fn sim_aliases() -> VfioAliases {
    sim_vfio_aliases().clone()
}

#[test]
fn scan_finds_gpus_in_bus_order_with_driver_group_and_bars() {
    let dir = tempfile::tempdir().expect("tmp");
    let gpus: Vec<(u32, PciDriver)> = vec![
        (0, PciDriver::Nvidia),
        (1, PciDriver::VfioPci),
        (9, PciDriver::Nvidia),
    ];
    render_sysfs(dir.path(), &gpus, |_| Some(0x2330_10DE)).expect("sysfs");
    let view = scan(dir.path(), &sim_aliases()).expect("scan");
    assert!(view.iommu);
    assert!(!view.iommufd);
    let ids: Vec<(&str, u32)> = view
        .gpus
        .iter()
        .map(|g| (g.bus_id.as_str(), g.index))
        .collect();
    // Index 9 is in PCI domain 1: last in bus-id order, and numbered by position.
    assert_eq!(
        ids,
        [
            ("0000:18:00.0", 0),
            ("0000:2a:00.0", 1),
            ("0001:2a:00.0", 2)
        ]
    );
    let second = &view.gpus[1];
    assert_eq!(second.driver.as_deref(), Some("vfio-pci"));
    assert_eq!(second.device_id, 0x2330);
    assert_eq!(second.iommu_group, Some(sim_iommu_group(1)));
    assert_eq!(
        second.pcie_root.as_deref(),
        Some(sim_pci_location(1).1.as_str())
    );
    assert_eq!(second.numa_node, Some(0));
    assert_eq!(second.vfio_cdev.as_deref(), Some("vfio1"));
    assert_eq!(view.gpus[0].vfio_cdev, None);
    assert!(second.addressable_memory.is_power_of_two());
    assert_eq!(second.group_blocker(), None);
}

/// The simulator's PCI view is what scanning its sysfs finds, bindings included.
#[test]
fn the_simulators_view_is_what_its_sysfs_shows() {
    let node = SimNode::new(
        "sim:2xH100-SXM5-80GB,1xT4,1xGB200-186GB"
            .parse()
            .expect("spec"),
        "n1",
        None,
    );
    node.bind_driver(2, PciDriver::VfioPci).expect("bind");
    node.bind_driver(3, PciDriver::VfioPci).expect("bind");
    let dir = tempfile::tempdir().expect("tmp");
    node.write_sysfs(dir.path()).expect("sysfs");
    let inventory = node.inventory().expect("inventory");
    assert_eq!(
        scan(dir.path(), &sim_aliases()).expect("scan"),
        inventory.pci
    );
    // The GB200 went to its variant driver, the T4 to vfio-pci.
    let drivers: Vec<Option<&str>> = inventory
        .pci
        .gpus
        .iter()
        .map(|g| g.driver.as_deref())
        .collect();
    assert_eq!(
        drivers,
        [
            Some("nvidia"),
            Some("nvidia"),
            Some("vfio-pci"),
            Some("nvgrace_gpu_vfio_pci")
        ]
    );
    assert_eq!(inventory.pci.gpus[2].driver.as_deref(), Some("vfio-pci"));
}

#[test]
fn a_group_peer_bound_to_another_driver_blocks_passthrough() {
    let dir = tempfile::tempdir().expect("tmp");
    render_sysfs(dir.path(), &[(0, PciDriver::Nvidia)], |_| None).expect("sysfs");
    // The GPU's audio function, bound to the sound driver, in the same group.
    let group = dir.path().join(format!(
        "kernel/iommu_groups/{}/devices",
        sim_iommu_group(0)
    ));
    let audio = dir.path().join("devices/audio");
    fs::create_dir_all(&audio).expect("mkdir");
    fs::write(audio.join("class"), "0x040300\n").expect("class");
    fs::create_dir_all(dir.path().join("bus/pci/drivers/snd_hda_intel")).expect("mkdir");
    std::os::unix::fs::symlink(
        dir.path().join("bus/pci/drivers/snd_hda_intel"),
        audio.join("driver"),
    )
    .expect("link");
    std::os::unix::fs::symlink(&audio, group.join("0000:18:00.1")).expect("link");
    let view = scan(dir.path(), &sim_aliases()).expect("scan");
    let reason = view.gpus[0].group_blocker().expect("blocked");
    assert!(reason.contains("0000:18:00.1"), "{reason}");
    assert!(reason.contains("snd_hda_intel"), "{reason}");
}

#[test]
fn bind_writes_the_kernel_protocol_and_checks_the_result() {
    let dir = tempfile::tempdir().expect("tmp");
    render_sysfs(dir.path(), &[(0, PciDriver::Nvidia)], |_| None).expect("sysfs");
    // Static files: nothing moves the link, so the check fails and says so.
    let error = bind(dir.path(), "0000:18:00.0", "vfio-pci").expect_err("not rebound");
    assert!(
        error.to_string().contains("still bound to nvidia"),
        "{error}"
    );
    let function = dir.path().join("bus/pci/devices/0000:18:00.0");
    assert_eq!(
        fs::read_to_string(function.join("driver_override")).expect("override"),
        "vfio-pci"
    );
    let unbind = dir.path().join("bus/pci/drivers/nvidia/unbind");
    assert_eq!(fs::read_to_string(unbind).expect("unbind"), "0000:18:00.0");
    let probe = dir.path().join("bus/pci/drivers_probe");
    assert_eq!(fs::read_to_string(probe).expect("probe"), "0000:18:00.0");
    // Already bound: nothing written.
    bind(dir.path(), "0000:18:00.0", "nvidia").expect("already nvidia");
    assert!(bind(dir.path(), "0000:99:00.0", "nvidia").is_err());
}

#[test]
fn a_modules_driver_folder_may_use_dashes() {
    let dir = tempfile::tempdir().expect("tmp");
    let drivers = dir.path().join("bus/pci/drivers");
    let aliases = sim_aliases();
    let gb200 = super::sim::sim_modalias(0x2941_10DE);
    // Nothing loaded: the names the kernel would register, not loaded.
    assert_eq!(
        vfio_driver(dir.path(), &aliases, Some(&gb200)),
        ("nvgrace_gpu_vfio_pci".to_string(), false)
    );
    assert_eq!(
        vfio_driver(dir.path(), &aliases, None),
        ("vfio-pci".to_string(), false)
    );
    // vfio_pci registers as vfio-pci; a variant registering with dashes is found so too.
    std::fs::create_dir_all(drivers.join("vfio-pci")).expect("mkdir");
    std::fs::create_dir_all(drivers.join("nvgrace-gpu-vfio-pci")).expect("mkdir");
    assert_eq!(
        vfio_driver(dir.path(), &aliases, None),
        ("vfio-pci".to_string(), true)
    );
    assert_eq!(
        vfio_driver(dir.path(), &aliases, Some(&gb200)),
        ("nvgrace-gpu-vfio-pci".to_string(), true)
    );
}

#[test]
fn instances_fit_together_only_under_the_mig_rules() {
    let node = SimNode::new("sim:1xH100-SXM5-80GB".parse().expect("spec"), "n", None);
    let inventory = node.inventory().expect("inventory");
    let profiles = &inventory.gpus[0].mig.as_ref().expect("MIG").profiles;
    let id = |name: &str| {
        profiles
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.id)
            .expect("profile")
    };
    let (one, three, four, seven) = (id("1g.10gb"), id("3g.40gb"), id("4g.40gb"), id("7g.80gb"));
    assert!(fit_together(profiles, &[seven]));
    assert!(!fit_together(profiles, &[seven, one]));
    assert!(fit_together(profiles, &[four, three]));
    assert!(fit_together(profiles, &[one; 7]));
    // Seven 1g.10gb fit, an eighth does not (the instance count), nor two 4g.40gb.
    assert!(!fit_together(profiles, &[one; 8]));
    assert!(!fit_together(profiles, &[four, four]));
    assert!(fit_together(profiles, &[three, three]));
    assert!(fit_together(profiles, &[four, one, one, one]));
    assert!(!fit_together(profiles, &[three, three, one]));
}
