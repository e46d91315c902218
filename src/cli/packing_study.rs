//! `gpu-dra packing-study`: how many MIG requests find no room when the scheduler takes the first
//! fitting device, with our best-fit device order against plain name order.
//!
//! One random trace (seeded) of arrivals with lifetimes is replayed twice on the same simulated
//! node, through our copy of kube-scheduler's allocator: each arrival is a claim for one MIG
//! profile; after every change the driver's slices are rebuilt, as the driver republishes when
//! MIG instances come and go. Only the device order differs between the two runs.
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

use super::CliError;
use crate::gpu::mig::{GpuMode, parse_mig_device_name};
use crate::gpu::sim::{SimNode, SimSpec};
use crate::gpu::{MigInstance, NodeInventory};
use crate::slices::{self, DeviceOrder, SliceOptions};

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  gpu-dra packing-study --gpus sim:8xH100-SXM5-80GB --events 10000 --seed 1"
)]
pub struct PackingStudyArgs {
    /// The simulated node.
    #[arg(long, default_value = "sim:8xH100-SXM5-80GB", value_parser = parse_spec)]
    pub gpus: SimSpec,
    /// Number of events (arrivals and departures together).
    #[arg(long, default_value_t = 10_000)]
    pub events: usize,
    /// Seed of the random trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Profile mix as NAME=WEIGHT,... (default: a typical inference/training mix).
    #[arg(
        long,
        default_value = "1g.10gb=35,1g.20gb=10,2g.20gb=20,3g.40gb=20,4g.40gb=8,7g.80gb=7"
    )]
    pub mix: String,
    /// Mean lifetime of a request, in arrivals.
    #[arg(long, default_value_t = 15.0)]
    pub mean_lifetime: f64,
}

fn parse_spec(s: &str) -> Result<SimSpec, String> {
    s.parse().map_err(|e: crate::gpu::GpuError| e.to_string())
}

/// xorshift64*: a small deterministic generator, so the trace is the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Arrival {
    profile: String,
    /// Event index at which the request leaves (if it was placed).
    leaves_at: usize,
}

/// Arrivals at each event index; an event with no arrival is a departure slot.
fn trace(args: &PackingStudyArgs, mix: &[(String, f64)]) -> Vec<Arrival> {
    let mut rng = Rng(args.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let total: f64 = mix.iter().map(|(_, w)| w).sum();
    (0..args.events)
        .map(|i| {
            let mut pick = rng.unit() * total;
            let profile = mix
                .iter()
                .find(|(_, w)| {
                    pick -= w;
                    pick < 0.0
                })
                .map_or_else(|| mix[0].0.clone(), |(p, _)| p.clone());
            // Exponential lifetimes keep the node around full occupancy.
            let lifetime = (-rng.unit().max(1e-12).ln() * args.mean_lifetime).ceil() as usize;
            Arrival {
                profile,
                leaves_at: i + lifetime.max(1),
            }
        })
        .collect()
}

fn mig_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some("mig.nvidia.com".into()), ..Default::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
                        .into(),
                }),
            }]),
            ..Default::default()
        }),
    }
}

fn claim(index: usize, profile: &str) -> ResourceClaim {
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
                    name: "mig".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: "mig.nvidia.com".into(),
                        selectors: Some(vec![DeviceSelector {
                            cel: Some(CELDeviceSelector {
                                expression: format!(
                                    "device.attributes['gpu.nvidia.com'].profile == '{profile}'"
                                ),
                            }),
                        }]),
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

/// Whether some GPU could take `profile` beside its live instances if they could all be placed
/// anew (MIG's placement rules, `fit_together`).
fn fits_after_replacing(
    base: &NodeInventory,
    live: &BTreeMap<usize, String>,
    profile: &str,
) -> bool {
    base.gpus.iter().any(|gpu| {
        let Some(mig) = gpu.mig.as_ref() else {
            return false;
        };
        let Some(wanted) = mig.profiles.iter().find(|p| p.name == profile) else {
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
            .any(|d| d == &crate::gpu::mig::gpu_device_name(gpu.minor))
        {
            return false;
        }
        ids.push(wanted.id);
        crate::gpu::mig::fit_together(&mig.profiles, &ids)
    })
}

/// Replays the trace with one device order.
fn replay(
    base: &NodeInventory,
    arrivals: &[Arrival],
    order: DeviceOrder,
    compiler: &Arc<SelectorCache>,
) -> Result<Replayed, CliError> {
    let node = NodeInfo::named("study-node");
    let classes = Arc::new(vec![mig_class()]);
    let modes: BTreeMap<u32, GpuMode> = base
        .gpus
        .iter()
        .map(|g| (g.minor, GpuMode::Dynamic))
        .collect();
    let options = SliceOptions {
        modes: Some(modes),
        order,
        ..SliceOptions::new("gpu.nvidia.com", "study-node")
    };
    let features = Features::KUBERNETES_1_37;
    let mut live: BTreeMap<usize, String> = BTreeMap::new();
    let mut replayed = Replayed::default();
    for (i, arrival) in arrivals.iter().enumerate() {
        live.retain(|index, _| arrivals[*index].leaves_at > i);
        let inventory = with_instances(base, &live);
        let slices = slices::build(&inventory, &options)?;
        let allocator = Allocator::shared(
            features,
            Arc::new(slices),
            classes.clone(),
            compiler.clone(),
        );
        let mut state = AllocatedState::new();
        for (index, device) in &live {
            let allocation = k8s_openapi::api::resource::v1::AllocationResult {
                devices: Some(k8s_openapi::api::resource::v1::DeviceAllocationResult {
                    results: Some(vec![
                        k8s_openapi::api::resource::v1::DeviceRequestAllocationResult {
                            request: "mig".into(),
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
                .mark(&format!("c{index}"), &allocation, &features)
                .map_err(|e| CliError::Usage(e.to_string()))?;
        }
        match allocator.allocate(&node, &[claim(i, &arrival.profile)], &state) {
            Ok(Outcome::Allocated(results)) => {
                let device = results
                    .first()
                    .and_then(|r| r.devices.as_ref())
                    .and_then(|d| d.results.as_ref())
                    .and_then(|r| r.first())
                    .map(|r| r.device.clone())
                    .unwrap_or_default();
                live.insert(i, device);
            }
            Ok(Outcome::Unsatisfiable { .. }) => {
                *replayed.failed.entry(arrival.profile.clone()).or_default() += 1;
                if !fits_after_replacing(base, &live, &arrival.profile) {
                    replayed.capacity += 1;
                }
            }
            Err(e) => return Err(CliError::Usage(format!("allocation failed: {e}"))),
        }
    }
    Ok(replayed)
}

pub fn run(args: PackingStudyArgs) -> Result<ExitCode, CliError> {
    let mix: Vec<(String, f64)> = args
        .mix
        .split(',')
        .map(|part| {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| CliError::Usage(format!("--mix: {part:?} is not NAME=WEIGHT")))?;
            let weight: f64 = weight
                .parse()
                .ok()
                .filter(|w: &f64| *w >= 0.0)
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "--mix: weight {weight:?} of {name:?} is not a number ≥ 0"
                    ))
                })?;
            Ok((name.trim().to_string(), weight))
        })
        .collect::<Result<_, CliError>>()?;
    let base = SimNode::new(args.gpus.clone(), "study-node", None).inventory()?;
    let known: Vec<String> = base
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig
                .iter()
                .flat_map(|m| m.profiles.iter().map(|p| p.name.clone()))
        })
        .collect();
    if known.is_empty() {
        return Err(CliError::Usage(format!(
            "--gpus sim:{}: no MIG-capable GPU",
            args.gpus
        )));
    }
    for (name, _) in &mix {
        if !known.contains(name) {
            return Err(CliError::Usage(format!(
                "--mix: {name:?} is not a MIG profile of sim:{}",
                args.gpus
            )));
        }
    }
    let arrivals = trace(&args, &mix);
    let compiler = Arc::new(SelectorCache::default());
    let started = std::time::Instant::now();
    let by_name_run = replay(&base, &arrivals, DeviceOrder::Name, &compiler)?;
    let packed_run = replay(&base, &arrivals, DeviceOrder::Packed, &compiler)?;
    let (by_name, packed) = (&by_name_run.failed, &packed_run.failed);
    let n = arrivals.len();
    let total = |m: &BTreeMap<String, usize>| m.values().sum::<usize>();
    let share = |failed: usize| 100.0 * failed as f64 / n as f64;
    let per_profile = |m: &BTreeMap<String, usize>| {
        mix.iter()
            .map(|(p, _)| format!("{p}:{}", m.get(p).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "packing study: sim:{} · {n} arrivals (each departs after its lifetime) · seed {} · mean lifetime {} · mix {}",
        args.gpus, args.seed, args.mean_lifetime, args.mix
    );
    println!(
        "  name order (NVIDIA's):  {:>6} failed ({:.2}%)  {}",
        total(by_name),
        share(total(by_name)),
        per_profile(by_name)
    );
    println!(
        "  best-fit order (ours):  {:>6} failed ({:.2}%)  {}",
        total(packed),
        share(total(packed)),
        per_profile(packed)
    );
    if total(by_name) > 0 {
        let (a, b) = (total(by_name) as f64, total(packed) as f64);
        println!("  → {:.1}% fewer failed placements", 100.0 * (a - b) / a);
    }
    // The bound: of our failures, those no GPU had room for even with its live instances
    // placed anew. The rest were fragmentation.
    let ours = total(packed);
    println!(
        "  capacity bound (ours):  {:>6} failed ({:.2}%)  {} of our failures ({:.1}%) were fragmentation; name order: {} of {}",
        packed_run.capacity,
        share(packed_run.capacity),
        ours - packed_run.capacity,
        if ours > 0 {
            100.0 * (ours - packed_run.capacity) as f64 / ours as f64
        } else {
            0.0
        },
        total(by_name) - by_name_run.capacity,
        total(by_name)
    );
    println!("  ({:.1} s)", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}
