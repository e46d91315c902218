//! NVIDIA's own NVML mock servers (`github.com/NVIDIA/go-nvml/pkg/nvml/mock`, described by
//! `e2e/nvml-mocks`) against the simulator's catalog (`src/gpu/catalog.rs`): two independent
//! descriptions of the same GPUs. Every field that differs is either fixed or explained below
//! (and in the catalog, next to the value, with the source our value comes from); an explanation
//! that no longer matches a difference fails the test too, so the table stays true.
mod differential;

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpu_dra::gpu::Architecture;
use gpu_dra::gpu::catalog::{self, SimModel};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MockModel {
    mock: String,
    name: String,
    brand: u32,
    architecture: u32,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    compute_capability: String,
    pci_device_id: u32,
    mig_profiles: Vec<MockProfile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MockProfile {
    profile: u32,
    id: u32,
    slice_count: u32,
    instance_count: u32,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    multiprocessors: u32,
    copy_engines: u32,
    decoders: u32,
    encoders: u32,
    jpegs: u32,
    ofas: u32,
    placements: Vec<MockPlacement>,
}

#[derive(Deserialize)]
struct MockPlacement {
    start: u32,
    size: u32,
}

/// Which of our models each mock describes; `None`: not simulated (with the reason).
const SAME_GPU: &[(&str, Result<&str, &str>)] = &[
    (
        "A100_PCIE_40GB",
        Err(
            "not simulated: the PCIe A100s share the SXM4 parts' MIG geometry; the catalog models the SXM4 boards DGX A100 nodes carry",
        ),
    ),
    ("A100_PCIE_80GB", Err("not simulated: as A100_PCIE_40GB")),
    ("A100_SXM4_40GB", Ok("A100-SXM4-40GB")),
    ("A100_SXM4_80GB", Ok("A100-SXM4-80GB")),
    ("A30_PCIE_24GB", Ok("A30-24GB")),
    ("H100_SXM5_80GB", Ok("H100-SXM5-80GB")),
    ("H200_SXM5_141GB", Ok("H200-SXM5-141GB")),
    ("B200_SXM5_180GB", Ok("B200-SXM6-180GB")),
];

/// `(mock, field, why ours stands)`, both as globs (`*`: any text); the sources are those cited
/// in `src/gpu/catalog.rs` (its "go-nvml's mock servers" section).
const EXPLAINED: &[(&str, &str, &str)] = &[
    (
        "*",
        "profile * id",
        "the mock's id is the NVML_GPU_INSTANCE_PROFILE_* enum; NVML answers the profile's own id (`nvidia-smi mig -lgip` ID: 1g 19, 1g+me 20, 1g double memory 15, 2g 14, 3g 9, 4g 5, 7g 0), which MIG device names carry",
    ),
    (
        "*",
        "profile * memoryMiB",
        "the mock rounds MIG memory to fractions of the nominal size; ours are `nvidia-smi mig -lgip`'s values",
    ),
    (
        "*",
        "profile * placements",
        "the mock sizes placements by compute slices (3g: 3, 7g: 7) and puts the double-memory 1g at every slice; `nvidia-smi mig -lgipp` gives memory-slice placements (3g/4g {0,4}:4, 7g {0}:8, 1g double memory {0,2,4,6}:2)",
    ),
    (
        "*",
        "profile * multiprocessors",
        "SMs per `nvidia-smi mig -lgip` (Hopper 3g 60, 7g 132, 1g double memory 26); the mock multiplies a 1g's",
    ),
    (
        "*",
        "profile * copyEngines",
        "copy engines per `nvidia-smi mig -lgip` and NVIDIA's MIG guide (Hopper/Blackwell 7g 8/16)",
    ),
    (
        "*",
        "profile * decoders",
        "NVDECs per `nvidia-smi mig -lgip` (A100 1g none, A30 1g one, Hopper one per compute slice)",
    ),
    (
        "*",
        "profile * jpegs",
        "NVJPGs per `nvidia-smi mig -lgip` (Hopper and Blackwell: one per compute slice)",
    ),
    (
        "*",
        "profile * ofas",
        "OFA per `nvidia-smi mig -lgip`: only the 7g and +me profiles have it",
    ),
    (
        "B200*",
        "profile * encoders",
        "B200 has no NVENC: every real B200 row shows ENC 0",
    ),
    (
        "*",
        "memoryMiB",
        "NVML's total is the usable framebuffer `nvidia-smi` shows (H100 81559, H200 143771, B200 183359 MiB); the mock reports the nominal size",
    ),
    (
        "A100_SXM4_40GB",
        "name",
        "the mock's name for this one is \"Mock NVIDIA A100-SXM4-40GB\"; NVML's has no \"Mock\"",
    ),
    (
        "A30*",
        "name",
        "NVML names it \"NVIDIA A30\" (`nvidia-smi -L`); the mock adds the form factor",
    ),
    (
        "H200*",
        "name",
        "`nvidia-smi` on HGX H200 nodes names it \"NVIDIA H200\"",
    ),
    (
        "B200*",
        "name",
        "`nvidia-smi` on HGX B200 nodes names it \"NVIDIA B200\"",
    ),
    (
        "H200*",
        "pciDeviceId",
        "0x2335 is the H200 SXM 141GB in pci.ids and mig-parted; the mock's 0x2333 is not",
    ),
    (
        "B200*",
        "pciDeviceId",
        "0x2901 is the B200 in pci.ids and mig-parted; the mock's 0x2B00 is not",
    ),
];

/// `NVML_DEVICE_ARCH_*`.
fn nvml_architecture(architecture: Architecture) -> u32 {
    match architecture {
        Architecture::Kepler => 2,
        Architecture::Maxwell => 3,
        Architecture::Pascal => 4,
        Architecture::Volta => 5,
        Architecture::Turing => 6,
        Architecture::Ampere => 7,
        Architecture::Ada => 8,
        Architecture::Hopper => 9,
        Architecture::Blackwell => 10,
        Architecture::Unknown => 0xffff_ffff,
    }
}

/// Every field of one mock and our model of the same GPU, as `field -> (ours, theirs)`.
fn fields(ours: &SimModel, theirs: &MockModel) -> BTreeMap<String, (String, String)> {
    let mut fields = BTreeMap::new();
    let mut put = |name: String, a: String, b: String| {
        fields.insert(name, (a, b));
    };
    put("name".into(), ours.product_name.into(), theirs.name.clone());
    put(
        "brand".into(),
        ours.brand.to_string(),
        theirs.brand.to_string(),
    );
    put(
        "architecture".into(),
        nvml_architecture(ours.architecture).to_string(),
        theirs.architecture.to_string(),
    );
    put(
        "memoryMiB".into(),
        ours.memory_mib.to_string(),
        theirs.memory_mib.to_string(),
    );
    put(
        "computeCapability".into(),
        format!(
            "{}.{}",
            ours.compute_capability.major, ours.compute_capability.minor
        ),
        theirs.compute_capability.clone(),
    );
    put(
        "pciDeviceId".into(),
        format!("{:#x}", ours.pci_device_id),
        format!("{:#x}", theirs.pci_device_id),
    );
    let our_profiles: BTreeMap<u32, _> = ours
        .mig
        .iter()
        .flat_map(|m| m.profiles.iter())
        .map(|p| (p.profile_enum, p))
        .collect();
    let their_profiles: BTreeMap<u32, _> =
        theirs.mig_profiles.iter().map(|p| (p.profile, p)).collect();
    let all: std::collections::BTreeSet<u32> = our_profiles
        .keys()
        .chain(their_profiles.keys())
        .copied()
        .collect();
    for profile in all {
        let field = |name: &str| format!("profile {profile} {name}");
        match (our_profiles.get(&profile), their_profiles.get(&profile)) {
            (Some(a), Some(b)) => {
                for (name, x, y) in [
                    ("id", a.id, b.id),
                    ("sliceCount", a.slice_count, b.slice_count),
                    ("instanceCount", a.instance_count, b.instance_count),
                    ("multiprocessors", a.multiprocessors, b.multiprocessors),
                    ("copyEngines", a.copy_engines, b.copy_engines),
                    ("decoders", a.decoders, b.decoders),
                    ("encoders", a.encoders, b.encoders),
                    ("jpegs", a.jpeg_engines, b.jpegs),
                    ("ofas", a.ofa_engines, b.ofas),
                ] {
                    put(field(name), x.to_string(), y.to_string());
                }
                put(
                    field("memoryMiB"),
                    a.memory_mib.to_string(),
                    b.memory_mib.to_string(),
                );
                put(
                    field("placements"),
                    format!("{:?} x{}", a.placement_starts, a.placement_size),
                    format!(
                        "{:?} x{}",
                        b.placements.iter().map(|p| p.start).collect::<Vec<_>>(),
                        b.placements
                            .iter()
                            .map(|p| p.size)
                            .max()
                            .unwrap_or_default()
                    ),
                );
            }
            (a, b) => put(
                field("present"),
                a.is_some().to_string(),
                b.is_some().to_string(),
            ),
        }
    }
    fields
}

#[test]
#[ignore = "needs NVML_MOCKS, NVIDIA's mock servers described by e2e/nvml-mocks (e2e/build-k8s.sh builds it; e2e/run-tests runs ignored tests)"]
fn nvidias_nvml_mocks_agree_with_the_simulator_or_the_difference_is_explained() {
    let tool = PathBuf::from(std::env::var_os("NVML_MOCKS").expect(
        "NVML_MOCKS is not set: e2e/build-k8s.sh nvml-mocks builds it (e2e/run-tests sets it)",
    ));
    let out = std::process::Command::new(&tool)
        .output()
        .expect("run nvml-mocks");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mocks: Vec<MockModel> = serde_json::from_slice(&out.stdout).expect("nvml-mocks JSON");
    assert!(mocks.len() >= 8, "go-nvml mocks {} GPUs", mocks.len());

    let mut explanations = differential::Explanations::new(EXPLAINED);
    let (mut compared, mut models) = (0, 0);
    for theirs in &mocks {
        let same = SAME_GPU
            .iter()
            .find(|(m, _)| *m == theirs.mock)
            .unwrap_or_else(|| {
                panic!(
                    "go-nvml mocks {}, which SAME_GPU does not list",
                    theirs.mock
                )
            });
        let Ok(key) = same.1 else { continue };
        let ours = catalog::model(key).unwrap_or_else(|| panic!("no model {key}"));
        models += 1;
        for (field, (a, b)) in fields(ours, theirs) {
            compared += 1;
            if a == b {
                continue;
            }
            explanations.difference(
                &theirs.mock,
                &field,
                format!("{} {field}: ours {a}, go-nvml {b}", theirs.mock),
            );
        }
    }
    explanations.assert_all_explained();
    differential::report(&format!(
        "NVML mocks vs simulator: {models} GPU models, {compared} fields compared, 0 mismatches ({} differences explained in tests/nvml_mocks.rs)",
        explanations.differences
    ));
}
