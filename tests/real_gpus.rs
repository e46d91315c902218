//! The simulator against readings of real GPUs (`tests/fixtures/real/`, each folder's README
//! says how it was read). What a simulated GPU of the same model publishes must equal what
//! gpu-dra published through the real NVML, except what belongs to one machine (UUIDs, PCI
//! address and root, NUMA node, driver and CUDA versions); and the MIG profiles must be the ones
//! NVML itself reported, read by a script that shares no code with gpu-dra.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use gpu_dra::gpu::catalog;
use serde_json::Value;

const GPU_DRA: &str = env!("CARGO_BIN_EXE_gpu-dra");

/// Attributes that describe one machine, not the model.
const PER_MACHINE: [&str; 7] = [
    "uuid",
    "parentUUID",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
    "resource.kubernetes.io/numaNode",
];

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real")
        .join(name)
}

/// Devices by name, per-machine attributes dropped.
fn devices(list: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for slice in list["items"].as_array().expect("items") {
        for device in slice["spec"]["devices"].as_array().into_iter().flatten() {
            let mut device = device.clone();
            if let Some(attributes) = device["attributes"].as_object_mut() {
                for key in PER_MACHINE {
                    attributes.remove(key);
                }
            }
            let name = device["name"].as_str().expect("name").to_string();
            out.insert(name, device);
        }
    }
    out
}

fn shared_counters(list: &Value) -> Vec<Value> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|s| s["spec"].get("sharedCounters").cloned())
        .collect()
}

fn simulated_slices(model: &str, node: &str) -> Value {
    let out = Command::new(GPU_DRA)
        .args([
            "slices",
            "--gpus",
            &format!("sim:1x{model}"),
            "--node-name",
            node,
            "-o",
            "json",
        ])
        .output()
        .expect("run gpu-dra slices");
    assert!(
        out.status.success(),
        "gpu-dra slices: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("slices JSON")
}

#[test]
fn a_simulated_h200_publishes_what_a_real_h200_published() {
    let real = read_json(&fixture("h200-580.159.04/slices.json"));
    let simulated = simulated_slices("H200-SXM5-141GB", "gpu-check");
    let (real_devices, sim_devices) = (devices(&real), devices(&simulated));
    assert_eq!(
        real_devices.keys().collect::<Vec<_>>(),
        sim_devices.keys().collect::<Vec<_>>(),
        "device names"
    );
    // 1 GPU + 25 placements: 7 × 1g.18gb, 7 × 1g.18gb+me, 4 × 1g.35gb, 3 × 2g.35gb, 2 × 3g.71gb,
    // 1 × 4g.71gb, 1 × 7g.141gb.
    assert_eq!(real_devices.len(), 26);
    for (name, device) in &real_devices {
        assert_eq!(
            &sim_devices[name], device,
            "{name}: simulated (left) vs real (right)"
        );
    }
    assert_eq!(shared_counters(&simulated), shared_counters(&real));
}

#[test]
fn the_h200_catalog_holds_the_profiles_nvml_reported() {
    let reading = read_json(&fixture("h200-580.159.04/nvml-profiles.json"));
    let gpu = &reading.as_array().expect("one entry per GPU")[0];
    assert_eq!(
        gpu["migMode"],
        serde_json::json!([0, 0]),
        "read with MIG mode off"
    );
    let model = catalog::model("H200-SXM5-141GB").expect("H200 model");
    let table = model.mig.as_ref().expect("MIG capable");
    let mut seen = 0;
    for profile in gpu["profiles"].as_array().expect("profiles") {
        let profile_enum = profile["profile"].as_u64().expect("profile") as u32;
        let row = table
            .profiles
            .iter()
            .find(|r| r.profile_enum == profile_enum);
        let Some(id) = profile["id"].as_u64() else {
            // NVML refused this profile: the catalog must not offer it either.
            assert!(
                row.is_none(),
                "profile {profile_enum}: NVML refused it, the catalog has it"
            );
            continue;
        };
        let row =
            row.unwrap_or_else(|| panic!("profile {profile_enum} (id {id}): not in the catalog"));
        seen += 1;
        assert_eq!(u64::from(row.id), id, "profile {profile_enum} id");
        // NVML's field for each of the row's numbers.
        let numbers = [
            ("sliceCount", u64::from(row.slice_count)),
            ("instanceCount", u64::from(row.instance_count)),
            ("memorySizeMB", row.memory_mib),
            ("multiprocessorCount", u64::from(row.multiprocessors)),
            ("copyEngineCount", u64::from(row.copy_engines)),
            ("decoderCount", u64::from(row.decoders)),
            ("encoderCount", u64::from(row.encoders)),
            ("jpegCount", u64::from(row.jpeg_engines)),
            ("ofaCount", u64::from(row.ofa_engines)),
        ];
        for (field, ours) in numbers {
            assert_eq!(Some(ours), profile[field].as_u64(), "id {id} {field}");
        }
        let placements: Vec<(u64, u64)> = profile["placements"]
            .as_array()
            .expect("placements")
            .iter()
            .map(|p| (p[0].as_u64().expect("start"), p[1].as_u64().expect("size")))
            .collect();
        let ours: Vec<(u64, u64)> = row
            .placement_starts
            .iter()
            .map(|s| (u64::from(*s), u64::from(row.placement_size)))
            .collect();
        assert_eq!(ours, placements, "id {id} placements");
    }
    assert_eq!(
        seen,
        table.profiles.len(),
        "every catalog profile was reported"
    );
}
