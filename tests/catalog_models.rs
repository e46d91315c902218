//! The simulator's GPU catalog, checked per model: product facts as NVML reports them, MIG
//! profile names as `nvidia-smi` prints them, a placement geometry the driver can publish, and
//! dynamic MIG end to end (`gpu-dra slices`, carving in the simulator; the packing study's run
//! on these models is in `crates/packing-study/tests/study.rs`).
use std::collections::BTreeMap;
use std::process::{Command, Output};

use gpu_dra::gpu::catalog::{self, MODELS, SimModel};
use gpu_dra::gpu::mig::parse_mig_device_name;
use gpu_dra::gpu::sim::{SimNode, SimSpec, sim_profiles};
use gpu_dra::gpu::{Architecture, GpuError, MigFailure, Placement, Version2};

fn model(key: &str) -> &'static SimModel {
    catalog::model(key).unwrap_or_else(|| panic!("no model {key}"))
}

/// The models this file was written for: today's data-center GPUs.
const NEW_MIG_MODELS: [&str; 7] = [
    "B200-SXM6-180GB",
    "GB200-186GB",
    "H100-PCIE-80GB",
    "H100-NVL-94GB",
    "H20-96GB",
    "GH200-96GB",
    "RTX-PRO-6000-BSE-96GB",
];

#[test]
fn product_facts_are_what_nvml_reports() {
    // (key, nvmlDeviceGetName, go-nvlib brand, architecture, CC, MiB, pciDeviceId, memory slices)
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        Architecture,
        (u32, u32),
        u64,
        u32,
        Option<u32>,
    );
    let expected: [Row; 10] = [
        (
            "B200-SXM6-180GB",
            "NVIDIA B200",
            "Nvidia",
            Architecture::Blackwell,
            (10, 0),
            183359,
            0x2901_10DE,
            Some(8),
        ),
        (
            "GB200-186GB",
            "NVIDIA GB200",
            "Nvidia",
            Architecture::Blackwell,
            (10, 0),
            189471,
            0x2941_10DE,
            Some(8),
        ),
        (
            "H100-PCIE-80GB",
            "NVIDIA H100 PCIe",
            "Nvidia",
            Architecture::Hopper,
            (9, 0),
            81559,
            0x2331_10DE,
            Some(8),
        ),
        (
            "H100-NVL-94GB",
            "NVIDIA H100 NVL",
            "Nvidia",
            Architecture::Hopper,
            (9, 0),
            95830,
            0x2321_10DE,
            Some(8),
        ),
        (
            "H20-96GB",
            "NVIDIA H20",
            "Nvidia",
            Architecture::Hopper,
            (9, 0),
            97871,
            0x2329_10DE,
            Some(8),
        ),
        (
            "GH200-96GB",
            "NVIDIA GH200 480GB",
            "Nvidia",
            Architecture::Hopper,
            (9, 0),
            97871,
            0x2342_10DE,
            Some(8),
        ),
        (
            "RTX-PRO-6000-BSE-96GB",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "NvidiaRTX",
            Architecture::Blackwell,
            (12, 0),
            97887,
            0x2BB5_10DE,
            Some(12),
        ),
        (
            "L40S",
            "NVIDIA L40S",
            "Nvidia",
            Architecture::Ada,
            (8, 9),
            46068,
            0x26B9_10DE,
            None,
        ),
        (
            "A10",
            "NVIDIA A10",
            "Nvidia",
            Architecture::Ampere,
            (8, 6),
            23028,
            0x2236_10DE,
            None,
        ),
        // Unified memory: NVML reports no framebuffer (0 in the catalog).
        (
            "GB10",
            "NVIDIA GB10",
            "Nvidia",
            Architecture::Blackwell,
            (12, 1),
            0,
            0x2E12_10DE,
            None,
        ),
    ];
    for (key, name, brand, arch, (major, minor), mib, pci, slices) in expected {
        let m = model(key);
        assert_eq!(m.product_name, name, "{key}");
        assert_eq!(catalog::brand_name(m.brand), brand, "{key}");
        assert_eq!(m.architecture, arch, "{key}");
        assert_eq!(m.compute_capability, Version2::new(major, minor), "{key}");
        assert_eq!(m.memory_mib, mib, "{key}");
        assert_eq!(m.pci_device_id, pci, "{key}");
        assert_eq!(m.mig.as_ref().map(|t| t.memory_slices), slices, "{key}");
    }
}

/// Profile names as the simulator publishes them (go-nvlib's derivation from the catalog).
fn published_names(key: &str) -> Vec<String> {
    let mut names: Vec<String> = sim_profiles(model(key))
        .into_iter()
        .map(|p| p.name)
        .collect();
    names.sort();
    names
}

fn sorted(names: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn profile_names_match_nvidias() {
    // NVIDIA's MIG user guide ("Supported MIG Profiles") and real `nvidia-smi mig -lgip` output.
    let expected: [(&str, &[&str]); 7] = [
        (
            "B200-SXM6-180GB",
            &[
                "1g.23gb",
                "1g.23gb+me",
                "1g.45gb",
                "2g.45gb",
                "3g.90gb",
                "4g.90gb",
                "7g.180gb",
            ],
        ),
        (
            "GB200-186GB",
            &[
                "1g.23gb",
                "1g.23gb+me",
                "1g.47gb",
                "2g.47gb",
                "3g.93gb",
                "4g.93gb",
                "7g.186gb",
            ],
        ),
        (
            "H100-PCIE-80GB",
            &[
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
            ],
        ),
        (
            "H100-NVL-94GB",
            &[
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb",
            ],
        ),
        (
            "H20-96GB",
            &[
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.48gb",
                "4g.48gb",
                "7g.96gb",
            ],
        ),
        (
            "GH200-96GB",
            &[
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.48gb",
                "4g.48gb",
                "7g.96gb",
            ],
        ),
        (
            "RTX-PRO-6000-BSE-96GB",
            &[
                "1g.24gb",
                "1g.24gb+me",
                "1g.24gb+gfx",
                "1g.24gb+me.all",
                "1g.24gb-me",
                "2g.48gb",
                "2g.48gb+gfx",
                "2g.48gb+me.all",
                "2g.48gb-me",
                "4g.96gb",
                "4g.96gb+gfx",
            ],
        ),
    ];
    for (key, names) in expected {
        assert_eq!(published_names(key), sorted(names), "{key}");
    }
}

#[test]
fn unique_profile_ids_are_nvidias() {
    let ids = |key: &str| -> BTreeMap<String, u32> {
        sim_profiles(model(key))
            .into_iter()
            .map(|p| (p.name, p.id))
            .collect()
    };
    // 8-slice parts: 1g=19, 1g+me=20, 1g double memory=15, 2g=14, 3g=9, 4g=5, 7g=0.
    for key in NEW_MIG_MODELS.iter().filter(|k| !k.starts_with("RTX")) {
        let mut got: Vec<u32> = ids(key).into_values().collect();
        got.sort();
        assert_eq!(got, [0, 5, 9, 14, 15, 19, 20], "{key}");
    }
    let rtx = ids("RTX-PRO-6000-BSE-96GB");
    for (name, id) in [
        ("1g.24gb", 14),
        ("1g.24gb+me", 21),
        ("1g.24gb+gfx", 47),
        ("1g.24gb+me.all", 65),
        ("1g.24gb-me", 67),
        ("2g.48gb", 5),
        ("2g.48gb+gfx", 35),
        ("2g.48gb+me.all", 64),
        ("2g.48gb-me", 66),
        ("4g.96gb", 0),
        ("4g.96gb+gfx", 32),
    ] {
        assert_eq!(rtx.get(name), Some(&id), "RTX PRO 6000 {name}");
    }
}

/// The largest number of pairwise disjoint placements among `starts` of `size`.
fn max_disjoint(starts: &[u32], size: u32) -> u32 {
    let mut end = 0;
    let mut n = 0;
    let mut sorted = starts.to_vec();
    sorted.sort();
    for start in sorted {
        if start >= end {
            n += 1;
            end = start + size;
        }
    }
    n
}

#[test]
fn placements_fit_and_instance_counts_follow_them() {
    for m in MODELS {
        let Some(mig) = &m.mig else { continue };
        for p in mig.profiles {
            let what = format!("{} profile {}", m.key, p.id);
            assert!(!p.placement_starts.is_empty(), "{what}: no placement");
            let mut starts = p.placement_starts.to_vec();
            starts.dedup();
            assert_eq!(starts.len(), p.placement_starts.len(), "{what}: duplicates");
            for &start in p.placement_starts {
                assert!(
                    start + p.placement_size <= mig.memory_slices,
                    "{what}: {start}:{} past {} memory slices",
                    p.placement_size,
                    mig.memory_slices
                );
                assert_eq!(start % p.placement_size, 0, "{what}: {start} unaligned");
            }
            // Every placement of a profile is a distinct region, so a full set of them never
            // overlaps: instance count is what the disjoint placements allow, or 1 for profiles
            // that own shared engines (+me, +me.all).
            let disjoint = max_disjoint(p.placement_starts, p.placement_size);
            assert!(
                p.instance_count == disjoint || p.instance_count == 1,
                "{what}: {} instances, {disjoint} disjoint placements",
                p.instance_count
            );
            // A profile's size in memory slices follows its memory: bigger never holds less.
            for q in mig.profiles {
                if q.placement_size > p.placement_size {
                    assert!(q.memory_mib >= p.memory_mib, "{what} vs {}", q.id);
                }
            }
        }
        // The whole GPU is one placement of the full-size profile.
        assert!(
            mig.profiles
                .iter()
                .any(|p| p.placement_size == mig.memory_slices && p.placement_starts == [0]),
            "{}: no full-GPU profile",
            m.key
        );
    }
}

/// Every set of pairwise disjoint placements the instance counts allow, as (profile index, start).
fn layouts(
    mig: &catalog::MigTable,
    from: usize,
    chosen: &mut Vec<(usize, u32)>,
    out: &mut Vec<Vec<(usize, u32)>>,
) {
    out.push(chosen.clone());
    let all: Vec<(usize, u32)> = mig
        .profiles
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.placement_starts.iter().map(move |&s| (i, s)))
        .collect();
    for (k, &(i, start)) in all.iter().enumerate().skip(from) {
        let p = &mig.profiles[i];
        let here = Placement {
            start,
            size: p.placement_size,
        };
        let overlaps = chosen.iter().any(|&(j, s)| {
            Placement {
                start: s,
                size: mig.profiles[j].placement_size,
            }
            .overlaps(&here)
        });
        let used = chosen.iter().filter(|&&(j, _)| j == i).count() as u32;
        if overlaps || used >= p.instance_count {
            continue;
        }
        chosen.push((i, start));
        layouts(mig, k + 1, chosen, out);
        chosen.pop();
    }
}

#[test]
fn every_layout_the_hardware_allows_fits_the_published_counters() {
    // The driver publishes per GPU one counter per dimension holding the largest profile's value;
    // each placement consumes its own. A layout the hardware accepts must not be refused for
    // memory or SMs, or the scheduler would leave valid MIG devices unusable.
    for m in MODELS {
        let Some(mig) = &m.mig else { continue };
        let max_mem = mig.profiles.iter().map(|p| p.memory_mib).max().unwrap();
        let max_sm = mig
            .profiles
            .iter()
            .map(|p| p.multiprocessors)
            .max()
            .unwrap();
        let mut all = Vec::new();
        layouts(mig, 0, &mut Vec::new(), &mut all);
        assert!(all.len() > mig.profiles.len(), "{}", m.key);
        for layout in all {
            let mem: u64 = layout
                .iter()
                .map(|&(i, _)| mig.profiles[i].memory_mib)
                .sum();
            let sm: u32 = layout
                .iter()
                .map(|&(i, _)| mig.profiles[i].multiprocessors)
                .sum();
            let ids: Vec<(u32, u32)> = layout
                .iter()
                .map(|&(i, s)| (mig.profiles[i].id, s))
                .collect();
            assert!(mem <= max_mem, "{}: {ids:?} needs {mem} MiB", m.key);
            assert!(sm <= max_sm, "{}: {ids:?} needs {sm} SMs", m.key);
        }
    }
}

fn gpu_dra(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpu-dra"))
        .args(args)
        .env_remove("GPU_DRA_GPUS")
        .output()
        .expect("runs")
}

fn slices_json(key: &str) -> serde_json::Value {
    let spec = format!("sim:8x{key}");
    let out = gpu_dra(&["slices", "--gpus", &spec, "--node-name", "n1", "-o", "json"]);
    assert!(
        out.status.success(),
        "{key}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn dynamic_mig_publishes_whole_gpus_and_every_placement() {
    for key in NEW_MIG_MODELS {
        let m = model(key);
        let mig = m.mig.as_ref().expect("MIG model");
        let list = slices_json(key);
        let items = list["items"].as_array().expect("items");
        let devices: Vec<&serde_json::Value> = items
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
            .collect();
        let placements: usize = mig.profiles.iter().map(|p| p.placement_starts.len()).sum();
        assert_eq!(devices.len(), 8 * (1 + placements), "{key}");
        // One counter set per GPU with a counter per memory slice.
        let counter_sets: Vec<&serde_json::Value> = items
            .iter()
            .flat_map(|s| s["spec"]["sharedCounters"].as_array().into_iter().flatten())
            .collect();
        assert_eq!(counter_sets.len(), 8, "{key}");
        for set in &counter_sets {
            let counters = set["counters"].as_object().expect("counters");
            let slices = counters
                .keys()
                .filter(|k| k.starts_with("memory-slice-"))
                .count();
            assert_eq!(slices as u32, mig.memory_slices, "{key}");
        }
        let names = published_names(key);
        for device in devices {
            let name = device["name"].as_str().expect("name");
            let attrs = &device["attributes"];
            assert_eq!(attrs["productName"]["string"], m.product_name, "{name}");
            let Some(parsed) = parse_mig_device_name(name) else {
                assert_eq!(attrs["type"]["string"], "gpu", "{name}");
                continue;
            };
            assert_eq!(attrs["type"]["string"], "mig", "{name}");
            let profile = attrs["profile"]["string"].as_str().expect("profile");
            assert!(names.iter().any(|n| n == profile), "{name}: {profile}");
            let row = mig
                .profiles
                .iter()
                .find(|p| p.id == parsed.profile_id)
                .unwrap_or_else(|| panic!("{name}: unknown profile id"));
            assert!(row.placement_starts.contains(&parsed.start), "{name}");
            // The device consumes exactly the memory slices of its placement.
            let consumed: Vec<u32> = device["consumesCounters"][0]["counters"]
                .as_object()
                .expect("counters")
                .keys()
                .filter_map(|k| k.strip_prefix("memory-slice-"))
                .map(|i| i.parse().expect("index"))
                .collect();
            let mut consumed = consumed;
            consumed.sort();
            let expected: Vec<u32> = (parsed.start..parsed.start + row.placement_size).collect();
            assert_eq!(consumed, expected, "{name}");
        }
    }
    for key in ["L40S", "A10"] {
        let list = slices_json(key);
        let devices: Vec<String> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .map(|d| d["name"].as_str().expect("name").to_string())
            .collect();
        assert_eq!(
            devices,
            (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>(),
            "{key}"
        );
    }
}

#[test]
fn the_simulator_carves_every_new_model_full() {
    for key in NEW_MIG_MODELS {
        let mig = model(key).mig.as_ref().expect("MIG model");
        let spec: SimSpec = format!("sim:1x{key}").parse().expect("spec");
        let node = SimNode::new(spec, "n1", None);
        // Hopper and Blackwell switch MIG mode without a reset.
        assert!(node.set_mig_mode(0, true).expect("MIG on").current, "{key}");
        // The smallest plain profile at every placement: 7 on 8-slice parts, 4 on the RTX PRO.
        let small = mig
            .profiles
            .iter()
            .filter(|p| p.profile_enum == 0)
            .min_by_key(|p| p.placement_size)
            .expect("1g profile");
        for &start in small.placement_starts {
            let placement = Placement {
                start,
                size: small.placement_size,
            };
            let gi = node
                .create_gpu_instance(0, small.id, placement)
                .unwrap_or_else(|e| panic!("{key} {start}: {e}"));
            node.create_compute_instance(0, gi).expect("CI");
        }
        let inventory = node.inventory().expect("inventory");
        let instances = &inventory.gpus[0].mig.as_ref().expect("mig").instances;
        assert_eq!(instances.len() as u32, small.instance_count, "{key}");
        // The whole GPU is taken now: the full-size profile finds no room.
        let full = mig
            .profiles
            .iter()
            .find(|p| p.placement_size == mig.memory_slices)
            .expect("full profile");
        let err = node
            .create_gpu_instance(
                0,
                full.id,
                Placement {
                    start: 0,
                    size: full.placement_size,
                },
            )
            .expect_err("occupied");
        assert!(
            matches!(
                err,
                GpuError::Mig {
                    failure: MigFailure::InsufficientResources,
                    ..
                }
            ),
            "{key}: {err}"
        );
    }
}
