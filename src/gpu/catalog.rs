//! GPU models the simulator knows, with values from real `nvidia-smi` / NVML output
//! (../shared/reference/mig-nvml.md §1.4; one driver release per product, see §1.5).
//! Each model cites its sources; a value no published output shows is marked DERIVED, with how.
//!
//! ## go-nvml's mock servers
//!
//! NVIDIA's Go bindings mock eight of these GPUs (`github.com/NVIDIA/go-nvml/pkg/nvml/mock`,
//! v0.13.4-1); `tests/nvml_mocks.rs` compares what they report with this catalog, field by field.
//! Where they differ, this catalog keeps the sourced value, because the mocks simplify:
//! - MIG profile ids: the mocks use the `NVML_GPU_INSTANCE_PROFILE_*` enum as the id; NVML
//!   returns the profile's own id (`nvidia-smi mig -lgip` ID column), which device names carry.
//! - Placements: the mocks size them in compute slices (3g: 3, 7g: 7) and put the double-memory
//!   1g at every slice; `nvidia-smi mig -lgipp` counts memory slices (3g/4g {0,4}:4, 7g {0}:8,
//!   1g double memory {0,2,4,6}:2), the rule our allocator and carves follow.
//! - MIG memory, SMs and engines: the mocks derive them from a 1g row (multiples, GiB fractions);
//!   the rows below are `nvidia-smi mig -lgip` output (B200 3g/4g/7g DERIVED, as noted there).
//! - GPU memory: the mocks report the nominal size; NVML's total is the usable framebuffer.
//! - Names and PCI ids (A30, H200, B200, and "Mock NVIDIA A100-SXM4-40GB"): ours are what
//!   `nvidia-smi` and pci.ids show; the mocks' H200 0x2333 and B200 0x2B00 are no such parts.
//!
//! The A100 PCIe mocks have no model here (the SXM4 parts carry the same MIG geometry).
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
    /// `nvmlDeviceGetMemoryInfo_v2().total`, in MiB; `0` for unified memory (GB10), where NVML
    /// reports no framebuffer (both memory-info calls return NOT_SUPPORTED).
    pub memory_mib: u64,
    /// `pciDeviceId` (device << 16 | vendor).
    pub pci_device_id: u32,
    pub mig: Option<MigTable>,
}

impl SimModel {
    /// What NVML reports as the GPU's memory: `None` on unified memory.
    pub fn memory_bytes(&self) -> Option<u64> {
        (self.memory_mib > 0).then_some(self.memory_mib << 20)
    }

    /// What `nvmlDeviceGetAddressingMode` reports (Turing and newer, R580 drivers): ATS where
    /// NVLink-C2C ties the GPU to a Grace CPU (GH200, GB200, GB10); elsewhere `None`, what a real
    /// H200 on driver 580.159.04 answered (HMM on hosts whose kernel mirrors page tables for it).
    pub fn addressing_mode(&self) -> Option<super::model::AddressingMode> {
        use super::model::AddressingMode;
        Some(
            if ["GH200", "GB200", "GB10"]
                .iter()
                .any(|grace| self.key.starts_with(grace))
            {
                AddressingMode::Ats
            } else {
                AddressingMode::None
            },
        )
    }
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
/// `NVML_BRAND_NVIDIA_RTX` (professional RTX boards, e.g. RTX A6000, RTX PRO 6000).
pub const BRAND_NVIDIA_RTX: u32 = 13;
/// `NVML_BRAND_NVIDIA`.
pub const BRAND_NVIDIA: u32 = 14;

/// The go-nvlib string of an NVML brand constant (`GetBrandAsString`).
pub fn brand_name(brand: u32) -> &'static str {
    match brand {
        1 => "Quadro",
        BRAND_TESLA => "Tesla",
        3 => "NVS",
        4 => "Grid",
        5 => "GeForce",
        6 => "Titan",
        7 => "NvidiaVApps",
        8 => "NvidiaVPC",
        9 => "NvidiaVCS",
        10 => "NvidiaVWS",
        11 => "NvidiaCloudGaming",
        12 => "QuadroRTX",
        BRAND_NVIDIA_RTX => "NvidiaRTX",
        BRAND_NVIDIA => "Nvidia",
        15 => "GeForceRTX",
        16 => "TitanRTX",
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
/// RTX PRO 6000 Blackwell: 12 placement units, a quarter of the GPU is 3 of them.
const TWELVE_1G: &[u32] = &[0, 3, 6, 9];
const TWELVE_2G: &[u32] = &[0, 6];

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

// H200 141GB, driver 580.159.04: read through NVML on a real H200 (MIG mode off, 2026-12-04;
// `tests/real_gpus.rs` holds that reading): every row, memory, engine count and placement.
static H200_141GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 16384, [16, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 33280, [32, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 71424, [60, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 71424, [64, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 143360, [132, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 16384, [16, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 33280, [26, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// H100 PCIe 80GB, driver 570.169: a public `nvidia-smi mig -lgip` transcript of a Scaleway
// H100 PCIe (total 81559 MiB): every memory, SM and engine value. The memory sizes equal the SXM5
// part's; the SMs are the PCIe part's 114. Placements: NVIDIA's MIG guide gives one H100 80GB
// table for "PCIe and SXM5"; the 8-slice `-lgipp` of the other H100s is assumed (not published
// for PCIe).
static H100_PCIE_80GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 9984, [14, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 20096, [30, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 40448, [46, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 40448, [62, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 81152, [114, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 9984, [14, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 20096, [14, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// H100 NVL 94GB, driver 560.35.03: a public Azure `nvidia-smi mig -lgip` + `-lgipp` transcript
// (total 95830 MiB; MIG devices 11008/22144/47488 MiB), same GiB as NVIDIA/gpu-operator#900.
// Every value sourced.
static H100_NVL_94GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 11008, [16, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 22144, [32, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 47488, [60, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 47488, [64, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 95360, [132, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 11008, [16, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 22144, [26, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// H20 96GB: no H20 `-lgip` output is published, so every row is DERIVED.
// - Profile names (1g.12gb, 1g.12gb+me, 1g.24gb, 2g.24gb, 3g.48gb, 4g.48gb, 7g.96gb): NVIDIA vGPU
//   docs (MIG-backed vGPU for H20 SXM5 96GB) and mig-parted (H20 0x2329 in the H100-96GB group).
// - Ids 19/20/15/14/9/5/0 and the 8-slice placements: as on every Hopper part with output.
// - Memory: the GH200 480GB's real `-lgip` (same 97871 MiB framebuffer; 11.00/23.00/46.50/93.00
//   GiB, kf-cuanschutz/NVIDIA_Grace_Hopper_benchmarking_logs_).
// - SMs: H100 SXM5's per row x 78/132 (H20 has 78 SMs), rounded down to an even count (SMs come in
//   TPC pairs); 7g = all 78. Engines: Hopper's (CE/DEC/JPEG = slices, 7g 8 CE, OFA on 7g/+me).
static H20_96GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 11264, [8, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 23552, [18, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 47616, [34, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 47616, [36, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 95232, [78, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 11264, [8, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 23552, [14, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// GH200 96GB HBM3 (the GH200 480GB superchip's GPU): the GH200 480GB's real `nvidia-smi mig
// -lgip` (kf-cuanschutz/NVIDIA_Grace_Hopper_benchmarking_logs_) gives the memory, 11.00 / 23.00 /
// 46.50 / 93.00 GiB, and the names (1g.12gb, 1g.12gb+me, 1g.24gb, 2g.24gb, 3g.48gb, 4g.48gb,
// 7g.96gb, also mig-parted's 0x2342 group and NVIDIA's DRA demo). The GPU is an H100 die with
// all 132 SMs (OpenCL reports 132 compute units), so SMs and engines per row are H100 SXM5's
// (DERIVED: no published output has those columns for GH200).
static GH200_96GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 11264, [16, 1, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 23552, [32, 2, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 47616, [60, 3, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 47616, [64, 4, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 95232, [132, 8, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 11264, [16, 1, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 23552, [26, 1, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// B200 180GB. Sourced (`nvidia-smi mig -lgip`, NVIDIA/mig-parted#166 = gpu-operator#1242): the
// 1g, 1g+me, 1g.45gb and 2g rows, 22.00/44.25 GiB (mig-parted#187 shows 20.50 GiB for 1g on a
// March 2025 driver; the newer GB200 output of mig-parted#227 is back at 22.00, so 22.00 is used).
// No published output has the 3g/4g/7g rows; they are DERIVED:
// - ids 9/5/0 and placements {0,4}:4, {0}:4, {0}:8: the 8-slice geometry of every other part;
// - copy engines 6/8/16 and 7g OFA 1: NVIDIA's MIG guide table (its 2g row says 3 CE / 1 NVDEC,
//   real output says 4 / 2, so only the guide's 3g/4g/7g values are taken);
// - NVDEC/JPEG = compute slices (B200 has 7 of each; real 1g/2g rows show 1/1 and 2/2);
// - SMs: 4g = 2 x 2g (true of every measured 8-slice part), 3g = 4g x 60/64 (Hopper's measured
//   3g:4g) rounded down to an even count, 7g = all 148 SMs (the guide says "Full"; 148 from CUDA);
// - memory: 7g = 99.5% of the 183359 MiB total rounded to 256 MiB (right for H100's 81152; a
//   real H200 gives 143360, 256 MiB above the rule), 3g/4g = 7g/2 - 256 MiB (H100/H100 NVL are
//   within 128 MiB of that; H200 is 7g/2 - 256). So these rows may be off by about 256 MiB.
static B200_180GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 22528, [18, 2, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 45312, [36, 4, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 91008, [66, 6, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 91008, [72, 8, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 182528, [148, 16, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 22528, [18, 2, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 45312, [30, 2, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// GB200 (186 GB). Sourced (`nvidia-smi mig -lgip`, NVIDIA/mig-parted#227, Aug 2025; the older
// driver of gpu-operator#1303 named 1g "1g.24gb" at 20.00 GiB): 1g/1g+me 22.00 GiB, 1g.47gb and
// 2g.47gb 45.50 GiB, SMs 18/32/38, CE 2/2/4, NVDEC and JPEG 1/1/2. Names of the other rows
// (3g.93gb, 4g.93gb, 7g.186gb): mig-parted's default config for 0x2941. The 3g/4g/7g numbers are
// DERIVED exactly as for B200 (SMs from 76 = 2 x 38 and the 152 SMs CUDA reports; memory from the
// 189471 MiB total).
static GB200_186GB: &[ProfileRow] = &[
    row(0, 19, 1, 7, 22528, [18, 2, 1, 0, 1, 0], 1, EIGHT_1G),
    row(1, 14, 2, 3, 46592, [38, 4, 2, 0, 2, 0], 2, EIGHT_2G),
    row(2, 9, 3, 2, 93952, [70, 6, 3, 0, 3, 0], 4, EIGHT_HALVES),
    row(3, 5, 4, 1, 93952, [76, 8, 4, 0, 4, 0], 4, ZERO),
    row(4, 0, 7, 1, 188416, [152, 16, 7, 0, 7, 1], 8, ZERO),
    row(7, 20, 1, 1, 22528, [18, 2, 1, 0, 1, 1], 1, EIGHT_1G),
    row(9, 15, 1, 4, 46592, [32, 2, 1, 0, 1, 0], 2, EIGHT_EVEN),
];

// RTX PRO 6000 Blackwell Server Edition: a public `nvidia-smi mig -lgip` + `-lgipp` transcript
// of an 8-GPU Server Edition node (total 97887 MiB; a 1g.24gb MIG device has 24192 MiB), with the
// same ids, SMs and engines as GoogleCloudPlatform/container-engine-accelerators#564 and
// bigstack-oss/cubecos#312. Every value sourced: 23.62/47.38/95.12 GiB; placements are in 12
// units, {0,3,6,9}:3, {0,6}:6, {0}:12. Profile enums from the suffixes: +gfx 0xA/0xB/0xC,
// -me 0xD/0xE, +me.all 0xF/0x10 (nvml.h). Rows are [SM, CE, DEC, ENC, JPEG, OFA] as elsewhere.
static RTX_PRO_6000_96GB: &[ProfileRow] = &[
    row(0x0, 14, 1, 4, 24192, [46, 1, 1, 1, 1, 0], 3, TWELVE_1G),
    row(0x1, 5, 2, 2, 48512, [94, 2, 2, 2, 2, 0], 6, TWELVE_2G),
    row(0x3, 0, 4, 1, 97408, [188, 4, 4, 4, 4, 1], 12, ZERO),
    row(0x7, 21, 1, 1, 24192, [46, 1, 1, 1, 1, 1], 3, TWELVE_1G),
    row(0xA, 47, 1, 4, 24192, [46, 1, 1, 1, 1, 0], 3, TWELVE_1G),
    row(0xB, 35, 2, 2, 48512, [94, 2, 2, 2, 2, 0], 6, TWELVE_2G),
    row(0xC, 32, 4, 1, 97408, [188, 4, 4, 4, 4, 1], 12, ZERO),
    row(0xD, 67, 1, 4, 24192, [46, 1, 0, 0, 0, 0], 3, TWELVE_1G),
    row(0xE, 66, 2, 2, 48512, [94, 2, 0, 0, 0, 0], 6, TWELVE_2G),
    row(0xF, 65, 1, 1, 24192, [46, 1, 4, 4, 4, 1], 3, TWELVE_1G),
    row(0x10, 64, 2, 1, 48512, [94, 2, 4, 4, 4, 1], 6, TWELVE_2G),
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
    // Name and 81559 MiB: `nvidia-smi` of H100 PCIe nodes (e.g. driver 570.169); PCI 0x2331
    // (pci.ids, mig-parted's H100-80GB filter).
    SimModel {
        key: "H100-PCIE-80GB",
        product_name: "NVIDIA H100 PCIe",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Hopper,
        compute_capability: Version2::new(9, 0),
        memory_mib: 81559,
        pci_device_id: 0x2331_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: H100_PCIE_80GB,
        }),
    },
    // Name and 95830 MiB: `nvidia-smi` of H100 NVL nodes (driver 560.35.03); PCI 0x2321 (pci.ids
    // "H100L 94GB", mig-parted's H100 NVL filter).
    SimModel {
        key: "H100-NVL-94GB",
        product_name: "NVIDIA H100 NVL",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Hopper,
        compute_capability: Version2::new(9, 0),
        memory_mib: 95830,
        pci_device_id: 0x2321_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: H100_NVL_94GB,
        }),
    },
    // Name and 97871 MiB: `nvidia-smi` of H20 nodes; PCI 0x2329 (pci.ids "H20", mig-parted's H20
    // filter). MIG table derived, see H20_96GB.
    SimModel {
        key: "H20-96GB",
        product_name: "NVIDIA H20",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Hopper,
        compute_capability: Version2::new(9, 0),
        memory_mib: 97871,
        pci_device_id: 0x2329_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: H20_96GB,
        }),
    },
    // Grace Hopper: name as NVML and OpenCL report it on GH200 480GB systems, 97871 MiB (see
    // GH200_96GB), PCI 0x2342 (pci.ids "GH200 120GB / 480GB", mig-parted's filter); NVLink-C2C
    // to the Grace CPU, so ATS addressing and the nvgrace VFIO variant.
    SimModel {
        key: "GH200-96GB",
        product_name: "NVIDIA GH200 480GB",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Hopper,
        compute_capability: Version2::new(9, 0),
        memory_mib: 97871,
        pci_device_id: 0x2342_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: GH200_96GB,
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
    // Name and 183359 MiB: `nvidia-smi` of HGX B200 nodes on driver 580.95.05 (NVIDIA/TensorRT-LLM
    // #10278); CC 10.0 from CUDA; PCI 0x2901 (pci.ids, mig-parted's B200 filter).
    SimModel {
        key: "B200-SXM6-180GB",
        product_name: "NVIDIA B200",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Blackwell,
        compute_capability: Version2::new(10, 0),
        memory_mib: 183359,
        pci_device_id: 0x2901_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: B200_180GB,
        }),
    },
    // Name and 189471 MiB: `nvidia-smi` of GB200 NVL nodes; CC 10.0 from CUDA (e.g.
    // sgl-project/sglang#11208); PCI 0x2941 (pci.ids "HGX GB200", mig-parted's GB200 filter).
    SimModel {
        key: "GB200-186GB",
        product_name: "NVIDIA GB200",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Blackwell,
        compute_capability: Version2::new(10, 0),
        memory_mib: 189471,
        pci_device_id: 0x2941_10DE,
        mig: Some(MigTable {
            memory_slices: 8,
            profiles: GB200_186GB,
        }),
    },
    // DGX Spark and other GB10 systems: name from `nvidia-smi`; CC 12.1 (sm_121); unified
    // LPDDR5X shared with the Grace CPU, so NVML reports no framebuffer (`Memory-Usage: Not
    // Supported`, a documented DGX Spark known issue); PCI 0x2E12, in the 0x2E00–0x2E3F range
    // the Linux kernel's DGX Spark iGPU quirk covers (NVIDIA/NV-Kernels#396); no MIG.
    SimModel {
        key: "GB10",
        product_name: "NVIDIA GB10",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Blackwell,
        compute_capability: Version2::new(12, 1),
        memory_mib: 0,
        pci_device_id: 0x2E12_10DE,
        mig: None,
    },
    // Name and 97887 MiB: `nvidia-smi -L` / `--query-gpu` of Server Edition nodes; CC 12.0 from
    // CUDA; PCI 0x2BB5 (pci.ids, mig-parted, bottlerocket-kernel-kit#300). Brand NVIDIA_RTX is
    // inferred (professional RTX boards such as the RTX A6000 report "NVIDIA RTX"; no published
    // `nvidia-smi -q` of this board was found). 12 placement units, 4 compute slices.
    SimModel {
        key: "RTX-PRO-6000-BSE-96GB",
        product_name: "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        brand: BRAND_NVIDIA_RTX,
        architecture: Architecture::Blackwell,
        compute_capability: Version2::new(12, 0),
        memory_mib: 97887,
        pci_device_id: 0x2BB5_10DE,
        mig: Some(MigTable {
            memory_slices: 12,
            profiles: RTX_PRO_6000_96GB,
        }),
    },
    // Name, 46068 MiB and PCI 0x26B9: `nvidia-smi --query-gpu` of L40S nodes (driver 595.71.05,
    // akash-network/provider-configs#99). Brand as L4's (inferred). Not MIG-capable.
    SimModel {
        key: "L40S",
        product_name: "NVIDIA L40S",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Ada,
        compute_capability: Version2::new(8, 9),
        memory_mib: 46068,
        pci_device_id: 0x26B9_10DE,
        mig: None,
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
    // Name and 23028 MiB (ECC on; 24564 MiB with ECC off): `nvidia-smi` of A10 nodes; PCI 0x2236
    // (pci.ids). Brand as L4's (inferred). Not MIG-capable.
    SimModel {
        key: "A10",
        product_name: "NVIDIA A10",
        brand: BRAND_NVIDIA,
        architecture: Architecture::Ampere,
        compute_capability: Version2::new(8, 6),
        memory_mib: 23028,
        pci_device_id: 0x2236_10DE,
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
        assert_eq!(names("H100-PCIE-80GB"), names("H100-SXM5-80GB"));
        assert_eq!(
            names("H100-NVL-94GB"),
            [
                "1g.12gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb",
                "1g.12gb+me",
                "1g.24gb"
            ]
        );
        assert_eq!(
            names("H20-96GB"),
            [
                "1g.12gb",
                "2g.24gb",
                "3g.48gb",
                "4g.48gb",
                "7g.96gb",
                "1g.12gb+me",
                "1g.24gb"
            ]
        );
        assert_eq!(
            names("B200-SXM6-180GB"),
            [
                "1g.23gb",
                "2g.45gb",
                "3g.90gb",
                "4g.90gb",
                "7g.180gb",
                "1g.23gb+me",
                "1g.45gb"
            ]
        );
        assert_eq!(
            names("GB200-186GB"),
            [
                "1g.23gb",
                "2g.47gb",
                "3g.93gb",
                "4g.93gb",
                "7g.186gb",
                "1g.23gb+me",
                "1g.47gb"
            ]
        );
        assert_eq!(
            names("RTX-PRO-6000-BSE-96GB"),
            [
                "1g.24gb",
                "2g.48gb",
                "4g.96gb",
                "1g.24gb+me",
                "1g.24gb+gfx",
                "2g.48gb+gfx",
                "4g.96gb+gfx",
                "1g.24gb-me",
                "2g.48gb-me",
                "1g.24gb+me.all",
                "2g.48gb+me.all"
            ]
        );
    }

    #[test]
    fn keys_are_unique_and_lookups_ignore_case() {
        for (i, m) in MODELS.iter().enumerate() {
            assert!(
                MODELS[..i]
                    .iter()
                    .all(|o| !o.key.eq_ignore_ascii_case(m.key)),
                "duplicate key {}",
                m.key
            );
            assert!(std::ptr::eq(model(&m.key.to_lowercase()).unwrap(), m));
            // The vendor half of pciDeviceId is NVIDIA's.
            assert_eq!(m.pci_device_id & 0xFFFF, 0x10DE, "{}", m.key);
            assert_ne!(brand_name(m.brand), "Unknown", "{}", m.key);
        }
    }

    #[test]
    fn profile_rows_are_consistent() {
        for m in MODELS {
            let Some(mig) = &m.mig else { continue };
            let full = mig
                .profiles
                .iter()
                .find(|p| p.placement_size == mig.memory_slices)
                .unwrap_or_else(|| panic!("{}: no full-GPU profile", m.key));
            for p in mig.profiles {
                let what = format!("{} profile {}", m.key, p.id);
                assert_eq!(
                    Some(p.slice_count),
                    crate::gpu::mig::gi_profile_slices(p.profile_enum),
                    "{what}: slices"
                );
                assert!(p.memory_mib < m.memory_mib, "{what}: memory");
                assert!(p.memory_mib <= full.memory_mib, "{what}: memory");
                assert!(p.multiprocessors <= full.multiprocessors, "{what}: SMs");
                assert!(p.copy_engines <= full.copy_engines, "{what}: CEs");
                // Unique ids and enums within a product.
                assert_eq!(
                    mig.profiles.iter().filter(|o| o.id == p.id).count(),
                    1,
                    "{what}: id"
                );
                assert_eq!(
                    mig.profiles
                        .iter()
                        .filter(|o| o.profile_enum == p.profile_enum)
                        .count(),
                    1,
                    "{what}: enum"
                );
            }
        }
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
                    assert_eq!(start % p.placement_size, 0, "{} {} aligned", m.key, p.id);
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
