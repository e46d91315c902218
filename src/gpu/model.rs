//! The device model: what a node's GPUs are, independent of how they were discovered.
//!
//! Both backends (NVML and the simulator) produce a [`NodeInventory`]; everything downstream
//! (slices, prepare) reads only these types.
use serde::{Deserialize, Serialize};

/// Everything discovery found on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    /// Kernel driver version, e.g. `580.95.05`.
    pub driver_version: String,
    /// CUDA driver API version the driver supports.
    pub cuda_driver_version: Version2,
    /// Full GPUs, ordered by minor number.
    pub gpus: Vec<Gpu>,
    /// The GPUs' PCI functions as sysfs shows them (passthrough), those NVML does not see
    /// (bound to `vfio-pci`) included.
    #[serde(default)]
    pub pci: super::pci::PciView,
}

/// A `major.minor` pair (compute capability, CUDA driver version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version2 {
    pub major: u32,
    pub minor: u32,
}

impl Version2 {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The semver form DRA attributes use (`9.0` → `9.0.0`).
    pub fn semver(&self) -> String {
        format!("{}.{}.0", self.major, self.minor)
    }
}

/// NVML's device architecture (`nvmlDeviceArchitecture_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
    Unknown,
}

impl Architecture {
    /// The string NVIDIA's driver publishes (go-nvlib `GetArchitectureAsString`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Kepler => "Kepler",
            Self::Maxwell => "Maxwell",
            Self::Pascal => "Pascal",
            Self::Volta => "Volta",
            Self::Turing => "Turing",
            Self::Ampere => "Ampere",
            Self::Ada => "Ada Lovelace",
            Self::Hopper => "Hopper",
            Self::Blackwell => "Blackwell",
            Self::Unknown => "Unknown",
        }
    }

    /// NVML's numeric value.
    pub fn nvml_value(&self) -> u32 {
        match self {
            Self::Kepler => 2,
            Self::Maxwell => 3,
            Self::Pascal => 4,
            Self::Volta => 5,
            Self::Turing => 6,
            Self::Ampere => 7,
            Self::Ada => 8,
            Self::Hopper => 9,
            Self::Blackwell => 10,
            Self::Unknown => 0xFFFF_FFFF,
        }
    }

    pub fn from_nvml_value(value: u32) -> Self {
        match value {
            2 => Self::Kepler,
            3 => Self::Maxwell,
            4 => Self::Pascal,
            5 => Self::Volta,
            6 => Self::Turing,
            7 => Self::Ampere,
            8 => Self::Ada,
            9 => Self::Hopper,
            10 => Self::Blackwell,
            _ => Self::Unknown,
        }
    }

    /// Hopper and newer toggle MIG mode without a GPU reset.
    pub fn toggles_mig_without_reset(&self) -> bool {
        matches!(self, Self::Hopper | Self::Blackwell)
    }
}

/// `nvmlDeviceAddressingModeType_t`: how the GPU addresses system-allocated memory (`malloc`,
/// `mmap`), published as the `addressingMode` attribute under go-nvlib's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AddressingMode {
    /// Supported by the platform but inactive.
    None,
    /// Heterogeneous Memory Management: the driver mirrors the CPU's page tables.
    Hmm,
    /// Address Translation Services: the GPU walks the CPU's page tables (NVLink-C2C to Grace).
    Ats,
}

impl AddressingMode {
    /// NVML's `NVML_DEVICE_ADDRESSING_MODE_*` value.
    pub fn from_nvml(value: u32) -> Option<Self> {
        match value {
            0 => Some(Self::None),
            1 => Some(Self::Hmm),
            2 => Some(Self::Ats),
            _ => None,
        }
    }

    pub fn to_nvml(self) -> u32 {
        match self {
            Self::None => 0,
            Self::Hmm => 1,
            Self::Ats => 2,
        }
    }

    /// The attribute value NVIDIA's driver publishes (go-nvlib's `GetAddressingModeAsString`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Hmm => "HMM",
            Self::Ats => "ATS",
        }
    }
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// NVML enumeration index.
    pub index: u32,
    /// `/dev/nvidia<minor>`; device names use it (`gpu-<minor>`).
    pub minor: u32,
    pub uuid: String,
    pub product_name: String,
    /// go-nvlib brand string, e.g. `Nvidia`, `Tesla`.
    pub brand: String,
    pub architecture: Architecture,
    pub cuda_compute_capability: Version2,
    /// `None` on unified memory (GB10): NVML reports no framebuffer, and the GPU is published
    /// without a `memory` capacity, as NVIDIA's driver publishes it.
    pub memory_bytes: Option<u64>,
    /// Lower-case `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// `pci<domain>:<bus>` of the root complex, when known.
    pub pcie_root: Option<String>,
    pub numa_node: Option<i64>,
    /// How the GPU reaches system-allocated memory (`nvmlDeviceGetAddressingMode`); `None` where
    /// NVML does not support the query (drivers before R580, GPUs before Turing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addressing_mode: Option<AddressingMode>,
    /// `None` when the GPU is not MIG-capable.
    pub mig: Option<MigInfo>,
}

/// MIG capability and state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInfo {
    pub mode: MigMode,
    /// Number of memory slices placements are expressed in (8 on A100/H100/H200, 4 on A30).
    pub memory_slices: u32,
    /// GPU-instance profiles this GPU offers, ordered by unique profile id descending then enum
    /// (the `nvidia-smi mig -lgip` order).
    pub profiles: Vec<GiProfile>,
    /// MIG devices (GPU instance + compute instance) that exist now, ordered by (GI id, CI id).
    pub instances: Vec<MigInstance>,
}

impl MigInfo {
    pub fn profile_by_id(&self, id: u32) -> Option<&GiProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigMode {
    pub current: bool,
    pub pending: bool,
}

/// A GPU-instance profile, as `nvmlDeviceGetGpuInstanceProfileInfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiProfile {
    /// Canonical name, e.g. `3g.40gb`, `1g.10gb+me` (go-nvlib's derivation).
    pub name: String,
    /// `NVML_GPU_INSTANCE_PROFILE_*` constant: the input of the profile-info call.
    pub profile_enum: u32,
    /// Per-GPU unique profile id: the input of placement and create calls.
    pub id: u32,
    /// Compute slices.
    pub slice_count: u32,
    pub instance_count: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub p2p_supported: bool,
    /// Valid placements, in memory slices.
    pub placements: Vec<Placement>,
}

impl GiProfile {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * 1024 * 1024
    }
}

/// A GPU-instance placement in memory slices (`nvmlGpuInstancePlacement_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

impl Placement {
    pub fn end(&self) -> u32 {
        self.start + self.size
    }

    pub fn overlaps(&self, other: &Placement) -> bool {
        self.start < other.end() && other.start < self.end()
    }

    /// The memory slices this placement occupies.
    pub fn slices(&self) -> std::ops::Range<u32> {
        self.start..self.end()
    }
}

/// A MIG device that exists: one GPU instance with one compute instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// Unique GI profile id.
    pub profile_id: u32,
    pub placement: Placement,
    /// `MIG-…`.
    pub uuid: String,
}

/// Who may run CUDA work on a full GPU (NVML compute mode).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ComputeMode {
    /// Any number of processes, time-sliced.
    #[default]
    Default,
    /// One process at a time (what an MPS control daemon needs).
    ExclusiveProcess,
    /// No CUDA work at all.
    Prohibited,
}

/// What time-slicing changes on a full GPU, and what unpreparing puts back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharingSettings {
    pub compute_mode: ComputeMode,
    /// `nvidia-smi compute-policy --set-timeslice` value (0 default … 3 long); `None` where the
    /// backend cannot read it back (NVML has no call for it), which unprepare restores as 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice: Option<u32>,
}

/// Where a GPU sits in a multi-node NVLink fabric (`nvmlDeviceGetGpuFabricInfo`): GPUs of one
/// NVLink domain (an NVL72 rack) share the cluster UUID, and memory is shared over NVLink only
/// within one clique of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FabricInfo {
    pub cluster_uuid: String,
    pub clique_id: u32,
    pub state: FabricState,
}

impl FabricInfo {
    /// NVIDIA's clique name: `<cluster UUID>.<clique id>`.
    pub fn clique(&self) -> String {
        format!("{}.{}", self.cluster_uuid, self.clique_id)
    }
}

/// `nvmlGpuFabricState_t`: the GPU's registration with the fabric manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FabricState {
    NotSupported,
    NotStarted,
    InProgress,
    Completed,
}

impl FabricState {
    pub fn from_nvml(raw: u8) -> Option<Self> {
        match raw {
            0 => Some(Self::NotSupported),
            1 => Some(Self::NotStarted),
            2 => Some(Self::InProgress),
            3 => Some(Self::Completed),
            _ => None,
        }
    }

    pub fn to_nvml(self) -> u8 {
        self as u8
    }
}
