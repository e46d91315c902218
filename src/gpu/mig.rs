//! MIG rules shared by every backend: profile names, device names, GI profile constants.
//!
//! Names follow go-nvlib and NVIDIA's DRA driver so users' selectors keep matching.

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: profile-info calls are made for constants below it.
pub const GPU_INSTANCE_PROFILE_COUNT: u32 = 0x12;

/// Compute slices of a GPU-instance profile constant (go-nvlib `mig_profile.go`).
pub fn gi_profile_slices(profile_enum: u32) -> Option<u32> {
    match profile_enum {
        0x0 | 0x7 | 0x9 | 0xA | 0xD | 0xF => Some(1),
        0x1 | 0x8 | 0xB | 0xE | 0x10 => Some(2),
        0x2 | 0x11 => Some(3),
        0x3 | 0xC => Some(4),
        0x6 => Some(6),
        0x4 => Some(7),
        0x5 => Some(8),
        _ => None,
    }
}

/// Name suffix of a GPU-instance profile constant (`+me`, `+gfx`, ...).
pub fn gi_profile_suffix(profile_enum: u32) -> &'static str {
    match profile_enum {
        0x7 | 0x8 => "+me",
        0xF | 0x10 => "+me.all",
        0xA | 0xB | 0xC | 0x11 => "+gfx",
        0xD | 0xE => "-me",
        _ => "",
    }
}

/// Memory size in GB as go-nvlib rounds it for profile names: the fraction of device memory
/// rounded up to eighths, times the device memory in whole GiB (rounded up).
pub fn profile_memory_gb(memory_mib: u64, device_memory_bytes: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    if device_memory_bytes == 0 {
        return 0;
    }
    let fraction = (memory_mib as f64 * (1u64 << 20) as f64) / device_memory_bytes as f64;
    let eighths = (fraction * 8.0).ceil() / 8.0;
    let device_gb = device_memory_bytes.div_ceil(GIB) as f64;
    (eighths * device_gb).round() as u64
}

/// Canonical GPU-instance profile name with a full-size compute instance, e.g. `3g.40gb`.
pub fn profile_name(
    profile_enum: u32,
    memory_mib: u64,
    device_memory_bytes: u64,
) -> Option<String> {
    let slices = gi_profile_slices(profile_enum)?;
    Some(format!(
        "{slices}g.{}gb{}",
        profile_memory_gb(memory_mib, device_memory_bytes),
        gi_profile_suffix(profile_enum)
    ))
}

/// Full GPU device name: `gpu-<minor>`.
pub fn gpu_device_name(minor: u32) -> String {
    format!("gpu-{minor}")
}

/// MIG device name: `gpu-<minor>-mig-<profile without dots>-<giProfileId>-<start>`, made a
/// valid DNS label the way NVIDIA's driver does (`1g.10gb+me` → `1g10gb-me`).
pub fn mig_device_name(parent_minor: u32, profile: &str, profile_id: u32, start: u32) -> String {
    format!(
        "gpu-{parent_minor}-mig-{}-{profile_id}-{start}",
        dns_compliant(&profile.replace('.', ""))
    )
}

/// The parts encoded in a MIG device name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDeviceName {
    pub parent_minor: u32,
    pub profile: String,
    pub profile_id: u32,
    pub start: u32,
}

/// Parses a name made by [`mig_device_name`]; `None` for anything else.
pub fn parse_mig_device_name(name: &str) -> Option<MigDeviceName> {
    let rest = name.strip_prefix("gpu-")?;
    let (minor, rest) = rest.split_once("-mig-")?;
    let (rest, start) = rest.rsplit_once('-')?;
    let (profile, profile_id) = rest.rsplit_once('-')?;
    if profile.is_empty() {
        return None;
    }
    Some(MigDeviceName {
        parent_minor: parse_decimal(minor)?,
        profile: profile.to_string(),
        profile_id: parse_decimal(profile_id)?,
        start: parse_decimal(start)?,
    })
}

fn parse_decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Lower-case, characters outside `[a-z0-9-]` replaced by `-`, no leading/trailing `-`.
pub fn dns_compliant(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    mapped.trim_matches('-').to_string()
}

/// `/dev/nvidia-caps/nvidia-cap<N>` minor of a GPU instance's access capability
/// (`/proc/driver/nvidia-caps/mig-minors`: 15 GIs × (1 + 8 CIs) per GPU after `config` and `monitor`).
pub fn gi_access_cap_minor(gpu_minor: u32, gpu_instance_id: u32) -> u32 {
    3 + 135 * gpu_minor + 9 * gpu_instance_id
}

/// Capability minor of a compute instance's access file.
pub fn ci_access_cap_minor(gpu_minor: u32, gpu_instance_id: u32, compute_instance_id: u32) -> u32 {
    gi_access_cap_minor(gpu_minor, gpu_instance_id) + 1 + compute_instance_id
}

/// How MIG-capable GPUs are offered (`--mig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigPolicy {
    /// Dynamic on Hopper and newer and on GPUs already in MIG mode, unless a GPU holds MIG
    /// devices this driver did not create: those GPUs stay static, so nobody's partitions are
    /// destroyed by default.
    #[default]
    Auto,
    /// Every MIG-capable GPU that can be partitioned now is dynamic; MIG devices this driver did
    /// not create are destroyed at start.
    Dynamic,
    /// Only MIG devices that exist are offered (created by an admin or mig-parted).
    Static,
    /// No MIG devices; GPUs in MIG mode are not offered at all.
    Off,
}

impl std::str::FromStr for MigPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "dynamic" => Ok(Self::Dynamic),
            "static" => Ok(Self::Static),
            "off" => Ok(Self::Off),
            other => Err(format!(
                "{other:?} is not a MIG policy; use auto, dynamic, static or off"
            )),
        }
    }
}

/// How one GPU is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GpuMode {
    /// The whole GPU only (not MIG-capable, MIG off, or `--mig off`).
    Whole,
    /// Existing MIG devices (or the whole GPU when MIG mode is off).
    Static,
    /// A counter set, the whole GPU when MIG mode can be toggled, and every profile placement,
    /// carved at prepare.
    Dynamic,
    /// Nothing can be offered (MIG mode on with `--mig off`).
    Unusable,
}

/// Chooses each GPU's mode. `foreign(minor)` says whether the GPU holds MIG devices this driver
/// did not create.
pub fn choose_modes(
    gpus: &[super::Gpu],
    policy: MigPolicy,
    foreign: impl Fn(u32) -> bool,
) -> std::collections::BTreeMap<u32, GpuMode> {
    gpus.iter()
        .map(|gpu| {
            let mig_on = gpu.mig.as_ref().is_some_and(|m| m.mode.current);
            let partitionable =
                gpu.mig.is_some() && (mig_on || gpu.architecture.toggles_mig_without_reset());
            let mode = match policy {
                _ if gpu.mig.is_none() => GpuMode::Whole,
                MigPolicy::Off if mig_on => GpuMode::Unusable,
                MigPolicy::Off => GpuMode::Whole,
                MigPolicy::Static => GpuMode::Static,
                MigPolicy::Dynamic if partitionable => GpuMode::Dynamic,
                MigPolicy::Auto if partitionable && !foreign(gpu.minor) => GpuMode::Dynamic,
                MigPolicy::Dynamic | MigPolicy::Auto => GpuMode::Static,
            };
            (gpu.minor, mode)
        })
        .collect()
}

/// Whether GPU instances of these profile ids (unique ids of `profiles`) fit on one GPU together
/// under the MIG rules (each at one of its profile's placements, no two overlapping, at most
/// `instance_count` of a profile), wherever they are now: a placement failure with this true
/// was fragmentation, not capacity. Exact (depth-first over placements, biggest first).
pub fn fit_together(profiles: &[super::model::GiProfile], instances: &[u32]) -> bool {
    let mut wanted: Vec<&super::model::GiProfile> = Vec::with_capacity(instances.len());
    for id in instances {
        match profiles.iter().find(|p| p.id == *id) {
            Some(profile) => wanted.push(profile),
            None => return false,
        }
    }
    for profile in profiles {
        let count = wanted.iter().filter(|w| w.id == profile.id).count();
        if count > profile.instance_count as usize {
            return false;
        }
    }
    wanted.sort_by_key(|p| std::cmp::Reverse(p.placements.first().map(|pl| pl.size).unwrap_or(0)));
    fn place(wanted: &[&super::model::GiProfile], used: u64, min_start: u32) -> bool {
        let Some((first, rest)) = wanted.split_first() else {
            return true;
        };
        // Instances of one profile are interchangeable: try starts in increasing order only.
        let same_as_next = rest.first().is_some_and(|next| next.id == first.id);
        first.placements.iter().any(|placement| {
            if placement.start < min_start
                || placement.size == 0
                || placement.start + placement.size > 64
            {
                return false;
            }
            let bits = ((1u64 << placement.size) - 1) << placement.start;
            used & bits == 0
                && place(
                    rest,
                    used | bits,
                    if same_as_next { placement.start + 1 } else { 0 },
                )
        })
    }
    place(&wanted, 0, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100_BYTES: u64 = 81559 * 1024 * 1024;

    /// go-nvlib's own table (`TestGetMigMemorySizeGB`, v0.12.0): on 24, 40 and 80 GiB devices,
    /// every size in 1/32 GiB steps is named after the memory-slice boundary at or above it.
    #[test]
    fn memory_sizes_match_go_nvlibs_table() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let mut cases = 0;
        for total in [24 * GIB, 40 * GIB, 80 * GIB] {
            let slice = total / 8;
            let mut size = GIB / 32;
            while size <= total {
                let expected = (1..=8)
                    .map(|k| k * slice)
                    .find(|&boundary| size <= boundary)
                    .map(|boundary| boundary / GIB);
                assert_eq!(
                    Some(profile_memory_gb(size / MIB, total)),
                    expected,
                    "{} MiB on a {} GiB device",
                    size / MIB,
                    total / GIB
                );
                cases += 1;
                size += GIB / 32;
            }
        }
        assert_eq!(cases, (24 + 40 + 80) * 32);
    }

    #[test]
    fn names_follow_go_nvlib_rounding() {
        assert_eq!(
            profile_name(0, 9984, H100_BYTES).as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(
            profile_name(7, 9984, H100_BYTES).as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(
            profile_name(9, 20096, H100_BYTES).as_deref(),
            Some("1g.20gb")
        );
        assert_eq!(
            profile_name(2, 40448, H100_BYTES).as_deref(),
            Some("3g.40gb")
        );
        assert_eq!(
            profile_name(4, 81152, H100_BYTES).as_deref(),
            Some("7g.80gb")
        );
        // H200: 70.5 rounds half away from zero, like Go's math.Round.
        let h200 = 143771 * 1024 * 1024;
        assert_eq!(profile_name(2, 71424, h200).as_deref(), Some("3g.71gb"));
        assert_eq!(profile_name(0, 16384, h200).as_deref(), Some("1g.18gb"));
        assert_eq!(profile_name(0x12, 1, h200), None);
    }

    #[test]
    fn mig_names_are_dns_labels_and_round_trip() {
        let name = mig_device_name(3, "1g.10gb+me", 20, 6);
        assert_eq!(name, "gpu-3-mig-1g10gb-me-20-6");
        let parsed = parse_mig_device_name(&name).expect("parses");
        assert_eq!(
            parsed,
            MigDeviceName {
                parent_minor: 3,
                profile: "1g10gb-me".into(),
                profile_id: 20,
                start: 6
            }
        );
        assert_eq!(parse_mig_device_name("gpu-3"), None);
        assert_eq!(parse_mig_device_name("gpu-x-mig-3g40gb-9-0"), None);
        assert_eq!(parse_mig_device_name("gpu-0-mig--9-0"), None);
    }

    #[test]
    fn cap_minors_match_published_points() {
        assert_eq!(gi_access_cap_minor(0, 0), 3);
        assert_eq!(ci_access_cap_minor(0, 0, 0), 4);
        assert_eq!(ci_access_cap_minor(3, 3, 3), 439);
        assert_eq!(ci_access_cap_minor(6, 11, 7), 920);
        assert_eq!(ci_access_cap_minor(31, 14, 7), 4322);
    }
}
