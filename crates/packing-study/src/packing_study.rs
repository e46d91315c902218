//! `gpu-dra-packing-study`: how many MIG requests find no room when the scheduler takes the first
//! fitting device, with our best-fit device order against plain name order.
//!
//! One random trace (seeded) of arrivals with lifetimes is replayed twice on the same simulated
//! node, through our copy of kube-scheduler's allocator: each arrival is a claim for one MIG
//! profile; after every change the driver's slices are rebuilt, as the driver republishes when
//! MIG instances come and go. Only the device order differs between the two runs.
//!
//! Beside them, the limits: the replay without fragmentation (`repack`), the hindsight optimum
//! (`hindsight`) and, on nodes of one or two GPUs, the exact best order (`online`).
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo, Outcome};
use dra_cel::SelectorCache;
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceSelector,
    ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{hindsight, online, repack};
use gpu_dra::cli::CliError;
use gpu_dra::gpu::mig::{GpuMode, parse_mig_device_name};
use gpu_dra::gpu::sim::{SimNode, SimSpec};
use gpu_dra::gpu::{MigInstance, NodeInventory};
use gpu_dra::slices::{self, DeviceOrder, SliceOptions};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpu-dra-packing-study --events 10000 --seed 1\n  \
gpu-dra-packing-study --mean-lifetime 15,20,25,30 --seed 1-5 --mix all\n\n\
Named mixes (profiles by shape, so they resolve on every MIG model: 1g.10gb is the 1-slice \
profile with an eighth of the memory, 1g.20gb the one with a quarter, ...):\n  \
default    1g.10gb=35,1g.20gb=10,2g.20gb=20,3g.40gb=20,4g.40gb=8,7g.80gb=7\n  \
inference  small slices: 1g.10gb=50,1g.20gb=20,2g.20gb=18,3g.40gb=8,4g.40gb=2,7g.80gb=2\n  \
training   big slices: 1g.10gb=10,2g.20gb=10,3g.40gb=30,4g.40gb=20,7g.80gb=30\n  \
whole-gpus the default mix with whole GPUs (gpu=15)\n  \
all        the four above"
)]
pub struct PackingStudyArgs {
    /// The simulated node.
    #[arg(long, default_value = "sim:8xH100-SXM5-80GB", value_parser = parse_spec)]
    pub gpus: SimSpec,
    /// Number of events (arrivals and departures together).
    #[arg(long, default_value_t = 10_000)]
    pub events: usize,
    /// Seed(s) of the random trace: N, A-B or N,M,...
    #[arg(long, default_value = "1")]
    pub seed: String,
    /// Profile mix: a named mix (default, inference, training, whole-gpus, all) or
    /// NAME=WEIGHT,... with MIG profile names and `gpu` for a whole GPU. Repeat for several.
    #[arg(long, default_value = "default")]
    pub mix: Vec<String>,
    /// Mean lifetime(s) of a request, in arrivals: N or N,M,...
    #[arg(long, default_value = "15")]
    pub mean_lifetime: String,
    /// In a sweep, how many arrivals of each run also go through the allocator (which must take
    /// the device the publication order says); a single run checks them all.
    #[arg(long, default_value_t = 300)]
    pub checked: usize,
    /// Print the trace (one line per arrival: index, request, index it departs at) instead of
    /// replaying it: for replays elsewhere (e2e/fleet-replay.sh). One mix, lifetime and seed.
    #[arg(long)]
    pub print_trace: bool,
    /// Also solve the exact best order on a node of two identical GPUs (half a million states:
    /// about 20 s per mix and lifetime in a release build). One-GPU nodes are always solved.
    #[arg(long)]
    pub best_order_pairs: bool,
    /// Also solve the exact best order on a node of several identical GPUs with few states each
    /// (an A30; an H100 under a mix without 1g.10gb), in continuous time (arrivals at rate 1,
    /// requests leaving at rate 1/lifetime), beside ours in the same model and name order
    /// simulated in it over 100 × --events arrivals. Up to 3 million node states (six A30s:
    /// 736,281; a minute or two per mix and lifetime in a release build).
    #[arg(long)]
    pub best_order_many: bool,
    /// Also bound the best order from below on a node of identical MIG-capable GPUs of any
    /// size (8×H100 with the default mix included), in the same continuous-time model: the node
    /// that re-places its instances freely and may turn requests away, solved over counts of
    /// live instances (`crates/packing-study/src/online/repacked.rs`); beside name order and
    /// ours simulated over 100 × --events arrivals. About 10 s per mix and lifetime for 8×H100
    /// in a release build.
    #[arg(long)]
    pub best_order_bound: bool,
    /// With --best-order-bound, also the second floor: a linear program over one GPU's states
    /// and the node's totals, solved by cutting planes and checked exactly against every node
    /// state (`crates/packing-study/src/online/bound.rs`); the higher floor is reported. Lower
    /// than the first everywhere measured, and about a minute per mix and lifetime for 8×H100.
    #[arg(long)]
    pub additive_bound: bool,
}

fn parse_spec(s: &str) -> Result<SimSpec, String> {
    s.parse().map_err(|e: gpu_dra::gpu::GpuError| e.to_string())
}

/// The request a mix entry stands for.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Wanted {
    /// A MIG device of this profile.
    Profile(String),
    /// A whole GPU (class gpu.nvidia.com).
    WholeGpu,
}

impl Wanted {
    fn label(&self) -> &str {
        match self {
            Self::Profile(name) => name,
            Self::WholeGpu => WHOLE_GPU,
        }
    }
}

const WHOLE_GPU: &str = "gpu";

/// A mix: its name as given and its weighted requests.
#[derive(Debug, Clone)]
pub(super) struct Mix {
    pub(super) name: String,
    pub(super) entries: Vec<(Wanted, f64)>,
}

impl Mix {
    fn describe(&self) -> String {
        self.entries
            .iter()
            .map(|(w, weight)| format!("{}={weight}", w.label()))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Named mixes by profile shape: `SLICES:EIGHTHS=WEIGHT` is the plain profile with that many
/// compute slices and eighths of the GPU's memory; `gpu=WEIGHT` a whole GPU.
const NAMED_MIXES: &[(&str, &str)] = &[
    ("default", "1:1=35,1:2=10,2:2=20,3:4=20,4:4=8,7:8=7"),
    ("inference", "1:1=50,1:2=20,2:2=18,3:4=8,4:4=2,7:8=2"),
    ("training", "1:1=10,2:2=10,3:4=30,4:4=20,7:8=30"),
    (
        "whole-gpus",
        "1:1=35,1:2=10,2:2=20,3:4=20,4:4=8,7:8=7,gpu=15",
    ),
];

/// Plain (no `+me`/`-me`/`+gfx`) profiles of the node's first MIG-capable GPU by shape.
fn profile_of_shape(base: &NodeInventory, slices: u32, eighths: u32) -> Option<String> {
    let mig = base.gpus.iter().find_map(|g| g.mig.as_ref())?;
    let full = mig.profiles.iter().map(|p| p.memory_mib).max()?;
    mig.profiles
        .iter()
        .filter(|p| !p.name.contains(['+', '-']))
        .filter(|p| p.slice_count == slices)
        .find(|p| full > 0 && ((8 * p.memory_mib) as f64 / full as f64).round() as u32 == eighths)
        .map(|p| p.name.clone())
}

fn resolve_mixes(args: &PackingStudyArgs, base: &NodeInventory) -> Result<Vec<Mix>, CliError> {
    let known: Vec<String> = base
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig
                .iter()
                .flat_map(|m| m.profiles.iter().map(|p| p.name.clone()))
        })
        .collect();
    let mut mixes = Vec::new();
    for given in &args.mix {
        let names: Vec<&str> = match given.as_str() {
            "all" => NAMED_MIXES.iter().map(|(n, _)| *n).collect(),
            other => vec![other],
        };
        for name in names {
            if let Some((_, shapes)) = NAMED_MIXES.iter().find(|(n, _)| *n == name) {
                let mut entries = Vec::new();
                for entry in shapes.split(',') {
                    let (shape, weight) = entry.split_once('=').unwrap_or((entry, "0"));
                    let weight: f64 = weight.parse().unwrap_or(0.0);
                    if shape == WHOLE_GPU {
                        entries.push((Wanted::WholeGpu, weight));
                        continue;
                    }
                    let (slices, eighths) = shape.split_once(':').unwrap_or((shape, "0"));
                    let (slices, eighths) =
                        (slices.parse().unwrap_or(0), eighths.parse().unwrap_or(0));
                    let profile = profile_of_shape(base, slices, eighths).ok_or_else(|| {
                        CliError::Usage(format!(
                            "--mix {name}: sim:{} has no {slices}-slice MIG profile with {eighths}/8 of the memory; give the mix as NAME=WEIGHT,...",
                            args.gpus
                        ))
                    })?;
                    entries.push((Wanted::Profile(profile), weight));
                }
                mixes.push(Mix {
                    name: name.to_string(),
                    entries,
                });
                continue;
            }
            if !name.contains('=') {
                return Err(CliError::Usage(format!(
                    "--mix: {name:?} is neither a named mix (default, inference, training, whole-gpus, all) nor NAME=WEIGHT,..."
                )));
            }
            let mut entries = Vec::new();
            for part in name.split(',') {
                let (profile, weight) = part.split_once('=').ok_or_else(|| {
                    CliError::Usage(format!("--mix: {part:?} is not NAME=WEIGHT"))
                })?;
                let profile = profile.trim();
                let weight: f64 = weight
                    .parse()
                    .ok()
                    .filter(|w: &f64| *w >= 0.0 && w.is_finite())
                    .ok_or_else(|| {
                        CliError::Usage(format!(
                            "--mix: weight {weight:?} of {profile:?} is not a number ≥ 0"
                        ))
                    })?;
                let wanted = if profile == WHOLE_GPU {
                    Wanted::WholeGpu
                } else if known.iter().any(|k| k == profile) {
                    Wanted::Profile(profile.to_string())
                } else {
                    return Err(CliError::Usage(format!(
                        "--mix: {profile:?} is not a MIG profile of sim:{} (nor `gpu`, a whole GPU)",
                        args.gpus
                    )));
                };
                entries.push((wanted, weight));
            }
            if entries.iter().all(|(_, w)| *w == 0.0) {
                return Err(CliError::Usage(format!("--mix {name}: every weight is 0")));
            }
            mixes.push(Mix {
                name: name.to_string(),
                entries,
            });
        }
    }
    Ok(mixes)
}

/// `N`, `A-B` or `N,M,...`.
fn parse_seeds(s: &str) -> Result<Vec<u64>, CliError> {
    let bad = || CliError::Usage(format!("--seed {s:?}: want N, A-B or N,M,..."));
    if let Some((a, b)) = s.split_once('-') {
        let (a, b): (u64, u64) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b || b - a >= 1000 {
            return Err(bad());
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(|p| p.trim().parse().map_err(|_| bad()))
        .collect()
}

fn parse_lifetimes(s: &str) -> Result<Vec<f64>, CliError> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .ok()
                .filter(|l| l.is_finite() && *l > 0.0 && *l <= 1e6)
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "--mean-lifetime {s:?}: {p:?} is not a number of arrivals > 0"
                    ))
                })
        })
        .collect()
}

/// xorshift64*: a small deterministic generator, so the trace is the same everywhere.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(super) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub(super) struct Arrival {
    pub(super) wanted: Wanted,
    /// Event index at which the request leaves (if it was placed).
    pub(super) leaves_at: usize,
}

/// One request drawn from `mix` by weight (`total`: the weights' sum).
pub(super) fn draw<'a>(mix: &'a [(Wanted, f64)], total: f64, rng: &mut Rng) -> Option<&'a Wanted> {
    let mut pick = rng.unit() * total;
    mix.iter()
        .find(|(_, w)| {
            pick -= w;
            pick < 0.0
        })
        .or(mix.last())
        .map(|(wanted, _)| wanted)
}

/// Arrivals at each event index; an event with no arrival is a departure slot.
pub(super) fn trace(events: usize, seed: u64, mean_lifetime: f64, mix: &Mix) -> Vec<Arrival> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let total: f64 = mix.entries.iter().map(|(_, w)| w).sum();
    (0..events)
        .map(|i| {
            let wanted = draw(&mix.entries, total, &mut rng).map_or(Wanted::WholeGpu, Clone::clone);
            // Exponential lifetimes keep the node around full occupancy.
            let lifetime = (-rng.unit().max(1e-12).ln() * mean_lifetime).ceil() as usize;
            Arrival {
                wanted,
                leaves_at: i + lifetime.max(1),
            }
        })
        .collect()
}

fn class(name: &str, device_type: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!(
                        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{device_type}'"
                    ),
                }),
            }]),
            ..Default::default()
        }),
    }
}

fn claim(index: usize, wanted: &Wanted) -> ResourceClaim {
    let (class, selectors) = match wanted {
        Wanted::WholeGpu => ("gpu.nvidia.com", None),
        Wanted::Profile(profile) => (
            "mig.nvidia.com",
            Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!(
                        "device.attributes['gpu.nvidia.com'].profile == '{profile}'"
                    ),
                }),
            }]),
        ),
    };
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!("c{index}")),
            namespace: Some("study".into()),
            uid: Some(format!("uid-{index}")),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "req".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.into(),
                        selectors,
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

/// The inventory as the driver sees it with these devices carved.
fn with_instances(base: &NodeInventory, live: &BTreeMap<usize, String>) -> NodeInventory {
    let mut inventory = base.clone();
    for (index, device) in live {
        let Some(name) = parse_mig_device_name(device) else {
            continue;
        };
        let Some(gpu) = inventory
            .gpus
            .iter_mut()
            .find(|g| g.minor == name.parent_minor)
        else {
            continue;
        };
        let Some(mig) = gpu.mig.as_mut() else {
            continue;
        };
        let Some(placement) = mig
            .profile_by_id(name.profile_id)
            .and_then(|p| p.placements.iter().find(|pl| pl.start == name.start))
            .copied()
        else {
            continue;
        };
        mig.mode.current = true;
        mig.instances.push(MigInstance {
            gpu_instance_id: *index as u32,
            compute_instance_id: 0,
            profile_id: name.profile_id,
            placement,
            uuid: String::new(),
        });
    }
    inventory
}

/// What a replay ends with.
#[derive(Debug, Default)]
struct Replayed {
    /// Failed arrivals per profile.
    failed: BTreeMap<String, usize>,
    /// Failed arrivals no GPU had room for even with its live instances placed anew: capacity,
    /// which no placement policy could have avoided at that point.
    capacity: usize,
}

/// Whether some GPU could take the request beside its live instances if they could all be
/// placed anew (MIG's placement rules, `fit_together`).
fn fits_after_replacing(
    base: &NodeInventory,
    live: &BTreeMap<usize, String>,
    wanted: &Wanted,
) -> bool {
    base.gpus.iter().any(|gpu| {
        let Some(mig) = gpu.mig.as_ref() else {
            return false;
        };
        let mut ids: Vec<u32> = live
            .values()
            .filter_map(|device| parse_mig_device_name(device))
            .filter(|name| name.parent_minor == gpu.minor)
            .map(|name| name.profile_id)
            .collect();
        // A whole GPU taken by a live request leaves no room at all.
        if live
            .values()
            .any(|d| d == &gpu_dra::gpu::mig::gpu_device_name(gpu.minor))
        {
            return false;
        }
        match wanted {
            Wanted::WholeGpu => ids.is_empty(),
            Wanted::Profile(profile) => {
                let Some(wanted) = mig.profiles.iter().find(|p| &p.name == profile) else {
                    return false;
                };
                ids.push(wanted.id);
                gpu_dra::gpu::mig::fit_together(&mig.profiles, &ids)
            }
        }
    })
}

/// The device the scheduler's first fit takes for this request from the pool as published,
/// read from the publication order directly (no ResourceSlice objects, no CEL): for sweeps of
/// many republishes. [`allocate`] checks it against the allocator.
fn first_fit(
    inventory: &NodeInventory,
    options: &SliceOptions,
    live: &BTreeMap<usize, String>,
    wanted: &Wanted,
) -> Option<String> {
    let whole_taken = |minor: u32| {
        let name = gpu_dra::gpu::mig::gpu_device_name(minor);
        live.values().any(|d| *d == name)
    };
    match wanted {
        Wanted::WholeGpu => {
            let mut names: Vec<String> = inventory
                .gpus
                .iter()
                .filter(|g| g.mig.as_ref().is_some_and(|m| m.instances.is_empty()))
                .filter(|g| !whole_taken(g.minor))
                .map(|g| gpu_dra::gpu::mig::gpu_device_name(g.minor))
                .collect();
            if options.order == DeviceOrder::Name {
                names.sort();
            }
            names.into_iter().next()
        }
        Wanted::Profile(profile) => slices::placement_order(inventory, options)
            .into_iter()
            .filter(|c| &c.profile.name == profile && !whole_taken(c.gpu.minor))
            .find(gpu_dra::slices::packing::fits_now)
            .map(|c| {
                gpu_dra::gpu::mig::mig_device_name(
                    c.gpu.minor,
                    &c.profile.name,
                    c.profile.id,
                    c.placement.start,
                )
            }),
    }
}

/// The device our copy of kube-scheduler's allocator takes for this request from the pool's
/// ResourceSlices, with the live requests' devices allocated.
fn allocate(
    inventory: &NodeInventory,
    options: &SliceOptions,
    live: &BTreeMap<usize, String>,
    index: usize,
    wanted: &Wanted,
    compiler: &Arc<SelectorCache>,
) -> Result<Option<String>, CliError> {
    let node = NodeInfo::named("study-node");
    let classes = Arc::new(vec![
        class("mig.nvidia.com", "mig"),
        class("gpu.nvidia.com", "gpu"),
    ]);
    let features = Features::KUBERNETES_1_37;
    let slices = slices::build(inventory, options)?;
    let allocator = Allocator::shared(features, Arc::new(slices), classes, compiler.clone());
    let mut state = AllocatedState::new();
    for (live_index, device) in live {
        let allocation = k8s_openapi::api::resource::v1::AllocationResult {
            devices: Some(k8s_openapi::api::resource::v1::DeviceAllocationResult {
                results: Some(vec![
                    k8s_openapi::api::resource::v1::DeviceRequestAllocationResult {
                        request: "req".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool: "study-node".into(),
                        device: device.clone(),
                        ..Default::default()
                    },
                ]),
                config: None,
            }),
            ..Default::default()
        };
        state
            .mark(&format!("c{live_index}"), &allocation, &features)
            .map_err(|e| CliError::Usage(e.to_string()))?;
    }
    match allocator.allocate(&node, &[claim(index, wanted)], &state) {
        Ok(Outcome::Allocated(results)) => Ok(results
            .first()
            .and_then(|r| r.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .and_then(|r| r.first())
            .map(|r| r.device.clone())),
        Ok(Outcome::Unsatisfiable { .. }) => Ok(None),
        Err(e) => Err(CliError::Usage(format!("allocation failed: {e}"))),
    }
}

/// The study node's slice options: every MIG-capable GPU dynamic, in `order`.
fn study_options(base: &NodeInventory, order: DeviceOrder) -> SliceOptions {
    let modes: BTreeMap<u32, GpuMode> = base
        .gpus
        .iter()
        .filter(|g| g.mig.is_some())
        .map(|g| (g.minor, GpuMode::Dynamic))
        .collect();
    SliceOptions {
        modes: Some(modes),
        order,
        ..SliceOptions::new("gpu.nvidia.com", "study-node")
    }
}

/// Replays the trace with one device order. The first `checked` arrivals also go through the
/// allocator, which must take the same device as [`first_fit`].
fn replay(
    base: &NodeInventory,
    arrivals: &[Arrival],
    order: DeviceOrder,
    compiler: &Arc<SelectorCache>,
    checked: usize,
) -> Result<Replayed, CliError> {
    let options = study_options(base, order);
    let mut live: BTreeMap<usize, String> = BTreeMap::new();
    let mut replayed = Replayed::default();
    for (i, arrival) in arrivals.iter().enumerate() {
        live.retain(|index, _| arrivals[*index].leaves_at > i);
        let inventory = with_instances(base, &live);
        let device = first_fit(&inventory, &options, &live, &arrival.wanted);
        if i < checked {
            let by_allocator = allocate(&inventory, &options, &live, i, &arrival.wanted, compiler)?;
            if by_allocator != device {
                return Err(CliError::Usage(format!(
                    "arrival {i} ({}): the allocator took {by_allocator:?}, the publication order says {device:?}",
                    arrival.wanted.label()
                )));
            }
        }
        match device {
            Some(device) => {
                live.insert(i, device);
            }
            None => {
                *replayed
                    .failed
                    .entry(arrival.wanted.label().to_string())
                    .or_default() += 1;
                if !fits_after_replacing(base, &live, &arrival.wanted) {
                    replayed.capacity += 1;
                }
            }
        }
    }
    Ok(replayed)
}

/// Most node states the hindsight optimum keeps at one step before it gives up.
const HINDSIGHT_STATES: usize = 100_000;

/// Most states of one GPU the exact best order is solved over.
const ONLINE_STATES: usize = 50_000;

/// One replay pair: a mix, a lifetime, a seed.
struct Run {
    mix: usize,
    lifetime: usize,
    seed: u64,
    arrivals: usize,
    by_name: Replayed,
    ours: Replayed,
    /// The hindsight optimum's failures, where the node and trace were small enough.
    optimum: Option<usize>,
    /// Failures of the replay with live instances re-placed freely before every arrival.
    unfragmented: Option<usize>,
}

impl Run {
    fn failed(r: &Replayed) -> usize {
        r.failed.values().sum()
    }
}

/// Mean and 95% confidence half-width (Student's t) of a sample.
fn mean_ci(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    const T95: [f64; 10] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23];
    let t = T95.get(n - 2).copied().unwrap_or(1.96);
    (mean, t * (var / n as f64).sqrt())
}

pub fn run(args: PackingStudyArgs) -> Result<ExitCode, CliError> {
    let base = SimNode::new(args.gpus.clone(), "study-node", None).inventory()?;
    if base.gpus.iter().all(|g| g.mig.is_none()) {
        return Err(CliError::Usage(format!(
            "--gpus sim:{}: no MIG-capable GPU",
            args.gpus
        )));
    }
    if args.best_order_pairs
        && !matches!(base.gpus.as_slice(), [a, b] if a.mig.is_some() && a.mig == b.mig)
    {
        return Err(CliError::Usage(format!(
            "--best-order-pairs: --gpus sim:{} is not a node of two identical MIG-capable GPUs",
            args.gpus
        )));
    }
    if args.additive_bound && !args.best_order_bound {
        return Err(CliError::Usage(
            "--additive-bound: a second floor for --best-order-bound, which is not set".into(),
        ));
    }
    if (args.best_order_many || args.best_order_bound)
        && !base
            .gpus
            .iter()
            .all(|g| g.mig.is_some() && g.mig == base.gpus[0].mig)
    {
        return Err(CliError::Usage(format!(
            "--best-order-{}: --gpus sim:{} is not a node of identical MIG-capable GPUs",
            if args.best_order_many {
                "many"
            } else {
                "bound"
            },
            args.gpus
        )));
    }
    let mixes = resolve_mixes(&args, &base)?;
    let seeds = parse_seeds(&args.seed)?;
    let lifetimes = parse_lifetimes(&args.mean_lifetime)?;
    if args.events == 0 {
        return Err(CliError::Usage("--events: want at least 1".into()));
    }
    if args.print_trace {
        let ([mix], [lifetime], [seed]) =
            (mixes.as_slice(), lifetimes.as_slice(), seeds.as_slice())
        else {
            return Err(CliError::Usage(
                "--print-trace: give one mix, one --mean-lifetime and one --seed".into(),
            ));
        };
        for (i, arrival) in trace(args.events, *seed, *lifetime, mix).iter().enumerate() {
            println!("{i} {} {}", arrival.wanted.label(), arrival.leaves_at);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut jobs = Vec::new();
    for mix in 0..mixes.len() {
        for lifetime in 0..lifetimes.len() {
            for seed in &seeds {
                jobs.push((mix, lifetime, *seed));
            }
        }
    }
    // A single run goes through the allocator all the way; a sweep checks the first arrivals
    // of each run against it.
    let checked = if jobs.len() == 1 {
        usize::MAX
    } else {
        args.checked
    };
    let compiler = Arc::new(SelectorCache::default());
    let started = std::time::Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let results: Vec<Result<Run, CliError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(mix, lifetime, seed)) = jobs.get(at) else {
                            break;
                        };
                        let arrivals = trace(args.events, seed, lifetimes[lifetime], &mixes[mix]);
                        let run = replay(&base, &arrivals, DeviceOrder::Name, &compiler, checked)
                            .and_then(|by_name| {
                                let ours = replay(
                                    &base,
                                    &arrivals,
                                    DeviceOrder::Packed,
                                    &compiler,
                                    checked,
                                )?;
                                let optimum =
                                    hindsight::optimum(&base, &arrivals, HINDSIGHT_STATES);
                                let unfragmented = repack::fragmentation_free(&base, &arrivals);
                                Ok(Run {
                                    mix,
                                    lifetime,
                                    seed,
                                    arrivals: arrivals.len(),
                                    by_name,
                                    ours,
                                    optimum,
                                    unfragmented,
                                })
                            });
                        done.push(run);
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut runs = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    if runs.len() != jobs.len() {
        return Err(CliError::Usage("a replay thread panicked".into()));
    }
    runs.sort_by_key(|r| (r.mix, r.lifetime, r.seed));
    // On nodes of one or two GPUs, the exact long-run rates and the best order's (no seeds
    // involved).
    let first_fit_in = |live: &BTreeMap<usize, String>, wanted: &Wanted, order: DeviceOrder| {
        first_fit(
            &with_instances(&base, live),
            &study_options(&base, order),
            live,
            wanted,
        )
    };
    let exact: Vec<Vec<Option<online::Rates>>> = mixes
        .iter()
        .map(|mix| {
            lifetimes
                .iter()
                .map(|l| {
                    if base.gpus.len() == 2 && !args.best_order_pairs {
                        return None;
                    }
                    online::rates(&base, &mix.entries, *l, ONLINE_STATES, &first_fit_in)
                })
                .collect()
        })
        .collect();
    if let [run] = runs.as_slice() {
        print_one(
            &args,
            &mixes[run.mix],
            lifetimes[run.lifetime],
            run,
            exact[run.mix][run.lifetime],
        );
    } else {
        for (m, mix) in mixes.iter().enumerate() {
            print_table(
                &args,
                mix,
                &seeds,
                &lifetimes,
                runs.iter().filter(|r| r.mix == m),
                &exact[m],
            );
        }
    }
    if args.best_order_many {
        for mix in &mixes {
            print_many(
                &base.gpus,
                mix,
                &lifetimes,
                args.events.saturating_mul(MANY_SIMULATED_PER_EVENT),
            );
        }
    }
    if args.best_order_bound {
        for mix in &mixes {
            print_bound(
                &base.gpus,
                mix,
                &lifetimes,
                args.events.saturating_mul(MANY_SIMULATED_PER_EVENT),
                args.additive_bound,
            )?;
        }
    }
    println!("  ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

/// The lower bound on the best order (`online::bound`) beside name order and ours, simulated,
/// in continuous time.
fn print_bound(
    gpus: &[gpu_dra::gpu::Gpu],
    mix: &Mix,
    lifetimes: &[f64],
    simulated: usize,
    additive: bool,
) -> Result<(), CliError> {
    println!(
        "  mix {} in continuous time, the best order bounded from below (name order and ours simulated over {simulated} arrivals):",
        mix.name
    );
    for lifetime in lifetimes {
        let started = std::time::Instant::now();
        let refused = |e: online::BoundError| {
            CliError::Usage(format!("--best-order-bound: mean lifetime {lifetime}: {e}"))
        };
        let repacked = online::repacked_bound(gpus, &mix.entries, *lifetime).map_err(refused)?;
        let mut floor = repacked.best_at_least;
        let mut second = String::new();
        if additive {
            let bound = online::best_order_bound(gpus, &mix.entries, *lifetime).map_err(refused)?;
            // Both floors stand on their own; the higher one says more.
            floor = floor.max(bound.best_at_least);
            second = format!(
                "; values that add up over GPUs: {:.3}%, could prove at most {:.3}%, {} values for {} GPU states, {} rounds, {} node states as cuts",
                100.0 * bound.best_at_least,
                100.0 * bound.could_prove,
                bound.value_classes,
                bound.gpu_states,
                bound.rounds,
                bound.cuts,
            );
        }
        let (by_name, ours) = online::many_simulated(gpus, &mix.entries, *lifetime, simulated);
        let percent = |rate: f64| format!("{:.3}%", 100.0 * rate);
        let most_below_name = if by_name > 0.0 {
            1.0 - floor / by_name
        } else {
            0.0
        };
        println!(
            "    mean lifetime {lifetime}: name order {}, ours {}; no order fails fewer than {} (re-placing instances freely: {}, {} count states, {} iterations{second}; {:.0} s); ours at most {} above the best order; the best order at most {:.1}% below name order{}",
            percent(by_name),
            percent(ours),
            percent(floor),
            percent(repacked.best_at_least),
            repacked.states,
            repacked.iterations,
            started.elapsed().as_secs_f64(),
            if floor > 0.0 {
                format!("{:.1}%", 100.0 * (ours / floor - 1.0))
            } else {
                "–".into()
            },
            100.0 * most_below_name,
            if most_below_name < 0.3 {
                " (30% fewer is out of reach for any order)"
            } else {
                ""
            },
        );
        println!(
            "      goal: {}",
            verdict(by_name, ours, floor, Limit::ProvenFloor)
        );
    }
    Ok(())
}

/// Most node states `--best-order-many` solves.
const MANY_STATES: usize = 3_000_000;

/// Arrivals name order is simulated over in the continuous-time model, per arrival of a run.
const MANY_SIMULATED_PER_EVENT: usize = 100;

/// The exact best order and ours on a node of identical GPUs, in continuous time
/// (`online::many`).
fn print_many(gpus: &[gpu_dra::gpu::Gpu], mix: &Mix, lifetimes: &[f64], simulated: usize) {
    println!(
        "  mix {} in continuous time, every node state solved (name order, and ours with the GPUs' minors, simulated over {simulated} arrivals):",
        mix.name
    );
    for lifetime in lifetimes {
        match online::many_rates(gpus, &mix.entries, *lifetime, MANY_STATES) {
            None => println!(
                "    mean lifetime {lifetime}: more than {MANY_STATES} node states, not solved"
            ),
            Some(rates) => {
                let (by_name, ours_simulated) =
                    online::many_simulated(gpus, &mix.entries, *lifetime, simulated);
                let below = |rate: f64| {
                    if by_name > 0.0 {
                        format!("{:.1}%", 100.0 * (1.0 - rate / by_name))
                    } else {
                        "–".into()
                    }
                };
                println!(
                    "    mean lifetime {lifetime}: {} states; name order {:.3}%, ours {:.3}% (simulated {:.3}%), the best order {:.3}% (ours {} above it); below name order: ours {}, the best order {}",
                    rates.states,
                    100.0 * by_name,
                    100.0 * rates.ours,
                    100.0 * ours_simulated,
                    100.0 * rates.best,
                    if rates.best > 0.0 {
                        format!("{:.1}%", 100.0 * (rates.ours / rates.best - 1.0))
                    } else {
                        "–".into()
                    },
                    below(rates.ours),
                    below(rates.best),
                );
            }
        }
    }
}

fn print_one(
    args: &PackingStudyArgs,
    mix: &Mix,
    lifetime: f64,
    run: &Run,
    exact: Option<online::Rates>,
) {
    let n = run.arrivals;
    let share = |failed: usize| 100.0 * failed as f64 / n as f64;
    let per_profile = |m: &BTreeMap<String, usize>| {
        mix.entries
            .iter()
            .map(|(w, _)| format!("{}:{}", w.label(), m.get(w.label()).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (by_name, ours) = (Run::failed(&run.by_name), Run::failed(&run.ours));
    println!(
        "packing study: sim:{} · {n} arrivals (each departs after its lifetime) · seed {} · mean lifetime {lifetime} · mix {} ({})",
        args.gpus,
        run.seed,
        mix.name,
        mix.describe()
    );
    println!(
        "  name order (NVIDIA's):  {by_name:>6} failed ({:.2}%)  {}",
        share(by_name),
        per_profile(&run.by_name.failed)
    );
    println!(
        "  best-fit order (ours):  {ours:>6} failed ({:.2}%)  {}",
        share(ours),
        per_profile(&run.ours.failed)
    );
    if by_name > 0 {
        let (a, b) = (by_name as f64, ours as f64);
        println!("  → {:.1}% fewer failed placements", 100.0 * (a - b) / a);
    }
    // The bound: of our failures, those no GPU had room for even with its live instances
    // placed anew. The rest were fragmentation.
    let bound = run.ours.capacity;
    println!(
        "  capacity bound (ours):  {bound:>6} failed ({:.2}%)  {} of our failures ({:.1}%) were fragmentation; name order: {} of {}",
        share(bound),
        ours - bound,
        if ours > 0 {
            100.0 * (ours - bound) as f64 / ours as f64
        } else {
            0.0
        },
        by_name - run.by_name.capacity,
        by_name
    );
    match run.optimum {
        Some(best) => println!(
            "  hindsight optimum:      {best:>6} failed ({:.2}%)  the fewest any placement could have had, knowing the future, without moving an instance",
            share(best)
        ),
        None => println!(
            "  hindsight optimum:  not computed (over {HINDSIGHT_STATES} node states at one step: a smaller node or trace)"
        ),
    }
    match run.unfragmented {
        Some(free) => println!(
            "  no fragmentation:       {free:>6} failed ({:.2}%)  the same trace with live instances re-placed freely, on any GPU, before every arrival",
            share(free)
        ),
        None => println!("  no fragmentation:   not computed"),
    }
    let verdict = match (exact, run.unfragmented) {
        (Some(exact), _) => {
            print_exact(&exact);
            verdict(exact.by_name, exact.ours, exact.best, Limit::BestOrder)
        }
        (None, Some(free)) => verdict(
            by_name as f64,
            ours as f64,
            free as f64,
            Limit::NoFragmentation,
        ),
        (None, None) => verdict(by_name as f64, ours as f64, bound as f64, Limit::Capacity),
    };
    println!("  verdict: {verdict}");
}

/// The limit a load's verdict is measured against: the best order where it is solved exactly
/// (one or two GPUs), the proven floor under it (`--best-order-bound`), else the replay without
/// fragmentation, else our failures that were capacity.
#[derive(Debug, Clone, Copy)]
enum Limit {
    BestOrder,
    ProvenFloor,
    NoFragmentation,
    Capacity,
}

impl Limit {
    fn name(self) -> &'static str {
        match self {
            Self::BestOrder => "the best order",
            Self::ProvenFloor => "the proven floor",
            Self::NoFragmentation => "no fragmentation",
            Self::Capacity => "the capacity bound",
        }
    }

    /// Whether no order can fail fewer than this limit. The other two are measures, not
    /// bounds: without fragmentation a node accepts what later blocks it (it can fail more than
    /// an order does), and the capacity bound counts only our own run's failures.
    fn proven(self) -> bool {
        matches!(self, Self::BestOrder | Self::ProvenFloor)
    }
}

/// The goal for a load: 30% fewer failures than name order, or within 10% of the limit
/// where the limit itself is less than 30% below name order. Rates or counts alike.
fn verdict(by_name: f64, ours: f64, limit: f64, which: Limit) -> String {
    let limit_name = which.name();
    if by_name <= 0.0 {
        return if ours <= 0.0 {
            "no failures in either order".into()
        } else {
            format!("name order failed none, ours {ours}")
        };
    }
    let fewer = (by_name - ours) / by_name;
    let room = (by_name - limit) / by_name;
    let above = if limit > 0.0 {
        (ours - limit) / limit
    } else if ours <= 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    if fewer >= 0.30 {
        format!("met: {:.0}% fewer than name order", 100.0 * fewer)
    } else if !which.proven() {
        format!(
            "not shown: {:.0}% fewer than name order, {:+.1}% against {limit_name}, which no order is proven to reach (--best-order-bound proves a floor)",
            100.0 * fewer,
            100.0 * above
        )
    } else if room < 0.30 {
        let reach = if room >= 0.0 {
            format!("{:.0}% below name order", 100.0 * room)
        } else {
            "no better than name order".into()
        };
        if above <= 0.10 {
            format!(
                "met: {:+.1}% against {limit_name} (30% fewer is out of reach: {limit_name} is {reach})",
                100.0 * above
            )
        } else {
            format!(
                "not met: {:.1}% above {limit_name} (30% fewer is out of reach: {limit_name} is {reach})",
                100.0 * above
            )
        }
    } else {
        format!(
            "not met: {:.0}% fewer than name order, {:.1}% above {limit_name}",
            100.0 * fewer,
            100.0 * above
        )
    }
}

/// The exact long-run rates of a node of one or two GPUs.
fn print_exact(exact: &online::Rates) {
    println!(
        "  exact long-run rates (every state solved): name order {:.2}%, ours {:.2}%, the best order {:.2}% (ours {:.1}% above it)",
        100.0 * exact.by_name,
        100.0 * exact.ours,
        100.0 * exact.best,
        if exact.best > 0.0 {
            100.0 * (exact.ours - exact.best) / exact.best
        } else {
            0.0
        }
    );
}

fn print_table<'a>(
    args: &PackingStudyArgs,
    mix: &Mix,
    seeds: &[u64],
    lifetimes: &[f64],
    runs: impl Iterator<Item = &'a Run>,
    exact: &[Option<online::Rates>],
) {
    let runs: Vec<&Run> = runs.collect();
    println!(
        "packing study: sim:{} · {} arrivals · seeds {} · mix {} ({})",
        args.gpus,
        args.events,
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(","),
        mix.name,
        mix.describe()
    );
    println!(
        "  failed placements in % of arrivals, mean ± 95% confidence over {} seed(s); the limit: the best order where solved exactly (one or two GPUs), else no fragmentation",
        seeds.len()
    );
    println!(
        "  | mean lifetime | name order | ours | capacity bound | no fragmentation | hindsight optimum | fewer than name | ours above the limit | goal |"
    );
    println!("  |---|---|---|---|---|---|---|---|---|");
    for (l, lifetime) in lifetimes.iter().enumerate() {
        let rows: Vec<&&Run> = runs.iter().filter(|r| r.lifetime == l).collect();
        let pct = |f: &dyn Fn(&Run) -> usize| -> Vec<f64> {
            rows.iter()
                .map(|r| 100.0 * f(r) as f64 / r.arrivals.max(1) as f64)
                .collect()
        };
        let fmt = |(m, ci): (f64, f64)| format!("{m:.2} ± {ci:.2}");
        let name = mean_ci(&pct(&|r| Run::failed(&r.by_name)));
        let ours = mean_ci(&pct(&|r| Run::failed(&r.ours)));
        let bound = mean_ci(&pct(&|r| r.ours.capacity));
        let optimum = if rows.iter().all(|r| r.optimum.is_some()) {
            fmt(mean_ci(&pct(&|r| r.optimum.unwrap_or(0))))
        } else {
            "–".into()
        };
        let unfragmented = if rows.iter().all(|r| r.unfragmented.is_some()) {
            fmt(mean_ci(&pct(&|r| r.unfragmented.unwrap_or(0))))
        } else {
            "–".into()
        };
        let fewer: Vec<f64> = rows
            .iter()
            .filter(|r| Run::failed(&r.by_name) > 0)
            .map(|r| {
                let n = Run::failed(&r.by_name) as f64;
                100.0 * (n - Run::failed(&r.ours) as f64) / n
            })
            .collect();
        let sum = |f: &dyn Fn(&Run) -> usize| rows.iter().map(|r| f(r)).sum::<usize>() as f64;
        let unfragmented_all = rows.iter().all(|r| r.unfragmented.is_some());
        let (which, limit_of): (Limit, &dyn Fn(&Run) -> usize) = if unfragmented_all {
            (Limit::NoFragmentation, &|r: &Run| {
                r.unfragmented.unwrap_or(0)
            })
        } else {
            (Limit::Capacity, &|r: &Run| r.ours.capacity)
        };
        let above: Vec<f64> = rows
            .iter()
            .filter(|r| limit_of(r) > 0)
            .map(|r| {
                let b = limit_of(r) as f64;
                100.0 * (Run::failed(&r.ours) as f64 - b) / b
            })
            .collect();
        let goal = match exact.get(l).copied().flatten() {
            Some(e) => verdict(e.by_name, e.ours, e.best, Limit::BestOrder),
            None => verdict(
                sum(&|r| Run::failed(&r.by_name)),
                sum(&|r| Run::failed(&r.ours)),
                sum(limit_of),
                which,
            ),
        };
        println!(
            "  | {lifetime} | {} | {} | {} | {unfragmented} | {optimum} | {} | {} | {} |",
            fmt(name),
            fmt(ours),
            fmt(bound),
            if fewer.is_empty() {
                "–".into()
            } else {
                format!("{}%", fmt(mean_ci(&fewer)))
            },
            match exact.get(l).copied().flatten() {
                Some(e) if e.best > 0.0 =>
                    format!("{:.1}% (exact)", 100.0 * (e.ours - e.best) / e.best),
                _ if above.is_empty() => "–".into(),
                _ => format!("{}%", fmt(mean_ci(&above))),
            },
            goal
        );
    }
    for (lifetime, exact) in lifetimes.iter().zip(exact) {
        if let Some(exact) = exact {
            print!("  mean lifetime {lifetime}:");
            print_exact(exact);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_goal_is_met_only_against_a_proven_limit() {
        // 30% fewer than name order is met whatever the limit.
        assert!(verdict(10.0, 6.9, 6.0, Limit::NoFragmentation).starts_with("met: 31% fewer"));
        // Within 10% of a limit less than 30% below name order: met only if the limit is proven.
        assert!(
            verdict(10.0, 8.5, 8.0, Limit::ProvenFloor)
                .starts_with("met: +6.2% against the proven floor"),
            "{}",
            verdict(10.0, 8.5, 8.0, Limit::ProvenFloor)
        );
        assert!(verdict(10.0, 8.5, 8.0, Limit::BestOrder).starts_with("met: "));
        for unproven in [Limit::NoFragmentation, Limit::Capacity] {
            let said = verdict(10.0, 8.5, 8.0, unproven);
            assert!(said.starts_with("not shown: 15% fewer"), "{said}");
        }
        // More than 10% above a proven floor that leaves less than 30%: not met, and why.
        let said = verdict(10.0, 9.0, 7.5, Limit::ProvenFloor);
        assert!(
            said.starts_with("not met: 20.0% above the proven floor (30% fewer is out of reach"),
            "{said}"
        );
        // The floor leaves 30% within reach, and ours is short of it.
        let said = verdict(10.0, 8.0, 5.0, Limit::ProvenFloor);
        assert!(
            said.starts_with("not met: 20% fewer than name order"),
            "{said}"
        );
    }
}
