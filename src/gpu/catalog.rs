//! GPU models the simulator knows, with values from real `nvidia-smi` / NVML output
//! (../shared/reference/mig-nvml.md §1.4; one driver release per product, see §1.5).
use super::model::{Architecture, Version2};

/// A simulated product.
#[derive(Debug)]
pub struct SimModel {
    /// Name used in `sim:` specs, e.g. `H100-SXM5-80GB`.
    pub key: &'static str,
    /// What `nvmlDeviceGetName` returns.
    pub product_name: &'static str,
    /// NVML brand constant (`NVML_BRAND_*`).
    pub brand: u32,
    pub architecture: Architecture,
    pub compute_capability: Version2,
    /// `nvmlDeviceGetMemoryInfo_v2().total`, in MiB.
    pub memory_mib: u64,
    /// `pciDeviceId` (device << 16 | vendor).
    pub pci_device_id: u32,
    pub mig: Option<MigTable>,
}

/// The MIG geometry of a product.
#[derive(Debug)]
pub struct MigTable {
    pub memory_slices: u32,
    pub profiles: &'static [ProfileRow],
}

/// One `nvidia-smi mig -lgip` row plus its `-lgipp` placements.
#[derive(Debug)]
pub struct ProfileRow {
    pub profile_enum: u32,
    pub id: u32,
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    /// Placement size in memory slices.
    pub placement_size: u32,
    pub placement_starts: &'static [u32],
}

/// `NVML_BRAND_TESLA`.
pub const BRAND_TESLA: u32 = 2;
/// `NVML_BRAND_NVIDIA`.
pub const BRAND_NVIDIA: u32 = 14;

/// The go-nvlib string of an NVML brand constant.
pub fn brand_name(brand: u32) -> &'static str {
    match brand {
        1 => "Quadro",
        BRAND_TESLA => "Tesla",
        3 => "NVS",
        4 => "Grid",
        5 => "GeForce",
        6 => "Titan",
        BRAND_NVIDIA => "Nvidia",
        _ => "Unknown",
    }
}

/// Driver release every simulated node reports.
pub const SIM_DRIVER_VERSION: &str = "580.95.05";
/// CUDA driver version as NVML encodes it (1000 × major + 10 × minor).
pub const SIM_CUDA_DRIVER_VERSION: i32 = 13000;

#[allow(clippy::too_many_arguments)]
const fn row(
    profile_enum: u32,
    id: u32,
    slice_count: u32,
    instance_count: u32,
    memory_mib: u64,
    engines: [u32; 6],
    placement_size: u32,
    placement_starts: &'static [u32],
) -> ProfileRow {
    let [
        multiprocessors,
        copy_engines,
        decoders,
        encoders,
        jpeg_engines,
        ofa_engines,
    ] = engines;
    ProfileRow {
        profile_enum,
        id,
        slice_count,
        instance_count,
        memory_mib,
        multiprocessors,
        copy_engines,
        decoders,
        encoders,
        jpeg_engines,
        ofa_engines,
        placement_size,
        placement_starts,
    }
}

const EIGHT_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const EIGHT_EVEN: &[u32] = &[0, 2, 4, 6];
const EIGHT_2G: &[u32] = &[0, 2, 4];
const EIGHT_HALVES: &[u32] = &[0, 4];
const ZERO: &[u32] = &[0];

// Engine arrays are [SM, CE, DEC, ENC, JPEG, OFA].
static A100_40GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 4864, [14, 1, 0, 0, 0, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 9856, [28, 2, 1, 0, 0, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 19968, [42, 3, 2, 0, 0, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 19968, [56, 4, 2, 0, 0, 0], 4, ZERO),
    row(4, 0, 7, 1, 40192, [98, 7, 5, 0, 1, 1], 8, ZERO),
    row(7, 20, 1, 1, 4864, [14, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 9856, [14, 1, 1, 0, 0, 0], 2, EIGHT_EVEN),
];

static A100_80GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 9728, [14, 1, 0, 0, 0, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 19968, [28, 2, 1, 0, 0, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 40192, [42, 3, 2, 0, 0, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 40192, [56, 4, 2, 0, 0, 0], 4, ZERO),
    row(4, 0, 7, 1, 80640, [98, 7, 5, 0, 1, 1], 8, ZERO),
    row(7, 20, 1, 1, 9728, [14, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 19968, [14, 1, 1, 0, 0, 0], 2, EIGHT_EVEN),
];

static A30_24GB: &[ProfileRow] = &[
    row(0, 14, 1, 4, 5952, [14, 1, 1, 0, 0, 0], 1, &[0, 1, 2, 3]),
    row(1, 5, 2, 2, 11968, [28, 2, 2, 0, 0, 0], 2, &[0, 2]),
    row(3, 0, 4, 1, 24000, [56, 4, 4, 0, 1, 1], 4, ZERO),
    row(7, 21, 1, 1, 5952, [14, 1, 1, 0, 1, 1], 1, &[0, 1, 2, 3]),
    row(8, 6, 2, 1, 11968, [28, 2, 2, 0, 1, 1], 2, &[0, 2]),
];

static H100_80GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 9984, [16, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 20096, [32, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 40448, [60, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 40448, [64, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 81152, [132, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 9984, [16, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 20096, [26, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

static H200_141GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 16384, [16, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 33024, [32, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 71168, [60, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 71168, [64, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 143104, [132, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 16384, [16, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 33024, [26, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

/// Every simulated model.
pub static MODELS: &[SimModel] = &[
    SimModel {
        key: "A100-SXM4-40GB",
        product_name: "NVIDIA A100-SXM4-40GB",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Ampere,
        compute_capability: Version2::new(8, 0),
        memory_mib: 40960,
        pci_device_id: 0x20B0_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: A100_40GB,
        }),
    },
    SimModel {
        key: "A100-SXM4-80GB",
        product_name: "NVIDIA A100-SXM4-80GB",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Ampere,
        compute_capability: Version2::new(8, 0),
        memory_mib: 81920,
        pci_device_id: 0x20B2_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: A100_80GB,
        }),
    },
    SimModel {
        key: "A30-24GB",
        product_name: "NVIDIA A30",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Ampere,
        compute_capability: Version2::new(8, 0),
        memory_mib: 24576,
        pci_device_id: 0x20B7_10DE,
        mig: Some(MigTable {
            memory_slices: 4,
            profiles: A30_24GB,
        }),
    },
    SimModel {
        key: "H100-SXM5-80GB",
        product_name: "NVIDIA H100 80GB HBM3",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Hopper,
        compute_capability: Version2::new(9, 0),
        memory_mib: 81559,
        pci_device_id: 0x2330_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: H100_80GB,
        }),
    },
    SimModel {
        key: "H200-SXM5-141GB",
        product_name: "NVIDIA H200",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Hopper,
        compute_capability: Version2::new(9, 0),
        memory_mib: 143771,
        pci_device_id: 0x2335_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: H200_141GB,
        }),
    },
    SimModel {
        key: "L4",
        product_name: "NVIDIA L4",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Ada,
        compute_capability: Version2::new(8, 9),
        memory_mib: 23034,
        pci_device_id: 0x27B8_10DE,
        mig: None,
    },
    SimModel {
        key: "T4",
        product_name: "Tesla T4",
        brand: BRAND_TESLA,
        architecture: Architecture::Turing,
        compute_capability: Version2::new(7, 5),
        memory_mib: 15360,
        pci_device_id: 0x1EB8_10DE,
        mig: None,
    },
];

/// Looks a model up by its spec key (case-insensitive).
pub fn model(key: &str) -> Option<&'static SimModel> {
    MODELS.iter().find(|m| m.key.eq_ignore_ascii_case(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::mig::profile_name;

    fn names(key: &str) -> Vec<String> {
        let m = model(key).expect("model exists");
        let bytes = m.memory_mib << 20;
        m.mig
            .as_ref()
            .expect("MIG model")
            .profiles
            .iter()
            .map(|p| profile_name(p.profile_enum, p.memory_mib, bytes).expect("named"))
            .collect()
    }

    #[test]
    fn derived_profile_names_match_nvidia_smi() {
        assert_eq!(
            names("A100-SXM4-40GB"),
            [
                "1g.5gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb",
                "1g.5gb+me",
                "1g.10gb"
            ]
        );
        assert_eq!(
            names("A100-SXM4-80GB"),
            [
                "1g.10gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
                "1g.10gb+me",
                "1g.20gb"
            ]
        );
        assert_eq!(
            names("A30-24GB"),
            ["1g.6gb", "2g.12gb", "4g.24gb", "1g.6gb+me", "2g.12gb+me"]
        );
        assert_eq!(
            names("H100-SXM5-80GB"),
            [
                "1g.10gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb",
                "1g.10gb+me",
                "1g.20gb"
            ]
        );
        assert_eq!(
            names("H200-SXM5-141GB"),
            [
                "1g.18gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb",
                "1g.18gb+me",
                "1g.35gb"
            ]
        );
    }

    #[test]
    fn placements_fit_memory_slices_and_instance_counts() {
        for m in MODELS {
            let Some(mig) = &m.mig else { continue };
            for p in mig.profiles {
                for &start in p.placement_starts {
                    assert!(
                        start + p.placement_size <= mig.memory_slices,
                        "{} {}",
                        m.key,
                        p.id
                    );
                    assert_eq!(
                        start % p.placement_size.min(4),
                        0,
                        "{} {} aligned",
                        m.key,
                        p.id
                    );
                }
                // A profile never has more instances than placements.
                assert!(
                    p.instance_count as usize <= p.placement_starts.len(),
                    "{} {}",
                    m.key,
                    p.id
                );
            }
        }
    }
}
