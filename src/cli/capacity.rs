//! `gpu-dra capacity`: how many more copies of a pod fit right now, per node, and what runs out
//! first. Copies are allocated one after the other as kube-scheduler would place them (each with
//! claims of its own from the pod's templates, and its extended-resource claim; claims the pod
//! names are shared by every copy), on each node alone, until one does not fit; the explanation
//! of that one says what ran out: devices in use, shared counters (MIG memory slices, engines),
//! consumable capacity, taints, or devices no selector admits.
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use dra_allocator::Outcome;
use dra_allocator::explain::{self, Problem};
use k8s_openapi::api::resource::v1::ResourceClaim;

mod workload;

use super::CliError;
use super::claims::{ClaimInputs, load, load_with, usage};
use super::manifests::claim_key;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpu-dra capacity --slices sim:8xH100-SXM5-80GB \
    --classes deviceclasses/ -f mig-pod.yaml\n  gpu-dra capacity --slices node-a=sim:8xH100-SXM5-80GB \
    --slices node-b=sim:4xL40S --classes deviceclasses/ --allocated running-claims.yaml -f pod.yaml -o json\n  \
    gpu-dra capacity --cluster -f pod.yaml   (the live cluster's slices, classes, rules, nodes and \
    allocated claims)\n  gpu-dra capacity pod/trainer -n ml   (more copies of a pod of the cluster)\n\n\
    Nodes: every node the slices name and every Node object given (its labels and taints filter \
    the pod as the scheduler's node filters do). Nodes where a device plugin serves an extended \
    resource the pod asks for are counted as if DRA served it.\n\n\
    Exit status: 0 at least one more copy fits somewhere; 1 none does; 2 bad input."
)]
pub struct CapacityArgs {
    #[command(flatten)]
    pub inputs: ClaimInputs,
    /// Count on the live cluster: its ResourceSlices, DeviceClasses, DeviceTaintRules, Nodes and
    /// allocated claims (besides any given). Implied by a `pod/NAME` argument.
    #[arg(long)]
    pub cluster: bool,
    /// Live cluster: the namespace of `pod/NAME` (default `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Live cluster: kubeconfig (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "KUBECONFIG_PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Stop counting a node at this many copies.
    #[arg(long, default_value_t = 256)]
    pub max: usize,
    /// `text` or `json`.
    #[arg(short = 'o', long, default_value = "text")]
    pub output: String,
}

/// One node's answer.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    pub node: String,
    /// More copies that fit on this node alone.
    pub fits: usize,
    /// Whether counting stopped at `--max` (more may fit).
    pub at_max: bool,
    /// What stops the next copy, one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stops: Option<String>,
}

/// Fewer nodes are counted faster than a thread starts.
const NODES_PER_THREAD: usize = 16;

/// What counting on any node needs.
struct Counting<'a> {
    unit: &'a super::manifests::Unit,
    generated: &'a BTreeSet<String>,
    busy_pools: &'a BTreeSet<&'a str>,
    state: &'a dra_allocator::AllocatedState,
    features: &'a dra_allocator::Features,
    max: usize,
}

/// How many more copies fit on each of `nodes`, in order.
fn count_nodes(
    ctx: &Counting<'_>,
    allocator: &mut dra_allocator::Allocator,
    nodes: &[super::manifests::placement::FleetNode],
) -> Result<Vec<NodeCapacity>, CliError> {
    // Nodes with the same devices and nothing allocated give the same answer: counted once.
    let mut by_layout: BTreeMap<String, (usize, Option<String>)> = BTreeMap::new();
    let mut answers = Vec::new();
    for node in nodes {
        count_node(ctx, allocator, node, &mut by_layout, &mut answers)?;
        allocator.release_node(&node.info);
    }
    Ok(answers)
}

fn count_node(
    ctx: &Counting<'_>,
    allocator: &dra_allocator::Allocator,
    node: &super::manifests::placement::FleetNode,
    by_layout: &mut BTreeMap<String, (usize, Option<String>)>,
    answers: &mut Vec<NodeCapacity>,
) -> Result<(), CliError> {
    let name = &node.info.name;
    if let Err(why) = ctx.unit.placement.admits(node) {
        answers.push(NodeCapacity {
            node: name.clone(),
            fits: 0,
            at_max: false,
            stops: Some(format!("the pod may not go there: {why}")),
        });
        return Ok(());
    }
    if let Some((resource, _)) = ctx
        .unit
        .unserved
        .iter()
        .find(|(resource, _)| !node.allocatable.contains_key(resource))
    {
        answers.push(NodeCapacity {
            node: name.clone(),
            fits: 0,
            at_max: false,
            stops: Some(format!(
                "Insufficient {resource}: no DeviceClass names it as its extendedResourceName and the node's allocatable (a device plugin) does not have it"
            )),
        });
        return Ok(());
    }
    let own: Vec<&k8s_openapi::api::resource::v1::ResourceSlice> = allocator
        .slices()
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(name.as_str()))
        .collect();
    let idle = !own
        .iter()
        .any(|s| ctx.busy_pools.contains(s.spec.pool.name.as_str()));
    let layout = idle
        .then(|| {
            // Written straight to text: through a `Value` this was a fifth of the time on
            // 1,000 nodes. A slice that cannot be written is not compared (counted alone).
            let mut parts: Vec<String> = own
                .iter()
                .map(|s| {
                    serde_json::to_string(&(
                        &s.spec.driver,
                        &s.spec.devices,
                        &s.spec.shared_counters,
                    ))
                })
                .collect::<Result<_, _>>()
                .ok()?;
            parts.sort();
            Some(parts.join("\n"))
        })
        .flatten()
        .filter(|_| !own.is_empty());
    if let Some((fits, stops)) = layout.as_ref().and_then(|l| by_layout.get(l)) {
        answers.push(NodeCapacity {
            node: name.clone(),
            fits: *fits,
            at_max: *fits >= ctx.max,
            stops: stops.clone(),
        });
        return Ok(());
    }
    let mut state = ctx.state.clone();
    let mut fits = 0;
    let mut stops = None;
    let mut shared_done = false;
    while fits < ctx.max {
        // After the first copy, the named claims it allocated are every copy's.
        let wanted: Vec<ResourceClaim> = ctx
            .unit
            .claims
            .iter()
            // An allocated claim (a live pod's named one) holds its devices already.
            .filter(|c| super::manifests::allocation_of(c).is_none())
            .filter(|c| !shared_done || ctx.generated.contains(&claim_key(c)))
            .cloned()
            .collect();
        let claims = copy(&wanted, ctx.generated, fits);
        if shared_done && claims.is_empty() {
            stops = Some(
                "every copy shares the pod's named claims: no copy needs more devices".to_string(),
            );
            fits = ctx.max;
            break;
        }
        match allocator.allocate(&node.info, &claims, &state) {
            Ok(Outcome::Allocated(results)) => {
                for (claim, allocation) in claims.iter().zip(results) {
                    state
                        .mark(&claim_key(claim), &allocation, ctx.features)
                        .map_err(usage)?;
                }
                shared_done = true;
                fits += 1;
            }
            Ok(Outcome::Unsatisfiable { .. }) | Err(_) => {
                let explanation = explain::explain(allocator, &node.info, &claims, &state);
                stops = Some(stopper(&explanation));
                break;
            }
        }
    }
    if let Some(layout) = layout {
        by_layout.insert(layout, (fits, stops.clone()));
    }
    answers.push(NodeCapacity {
        node: name.clone(),
        fits,
        at_max: fits >= ctx.max,
        stops,
    });
    Ok(())
}

/// Copy `k` of a pod's claims: generated claims (from templates, extended resources) get a name
/// and UID of their own; the claims the pod names are the same object in every copy.
fn copy(claims: &[ResourceClaim], generated: &BTreeSet<String>, k: usize) -> Vec<ResourceClaim> {
    claims.iter().map(|c| copy_claim(c, generated, k)).collect()
}

fn copy_claim(claim: &ResourceClaim, generated: &BTreeSet<String>, k: usize) -> ResourceClaim {
    let mut claim = claim.clone();
    if k > 0 && generated.contains(&claim_key(&claim)) {
        let name = claim.metadata.name.clone().unwrap_or_default();
        claim.metadata.name = Some(format!("{name}-{k}"));
        claim.metadata.uid = claim.metadata.uid.as_ref().map(|u| format!("{u}-{k}"));
    }
    claim
}

/// What stops a copy, from the explanation of its failed allocation: the most common reason
/// among the devices its first blocked request looked at.
fn stopper(explanation: &explain::Explanation) -> String {
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut request = None;
    for claim in &explanation.claims {
        for r in &claim.requests {
            if r.devices.iter().any(|d| d.chosen) {
                continue;
            }
            if let Some(error) = &r.error {
                return format!("request {}: {error}", r.name);
            }
            request.get_or_insert(r.name.clone());
            for device in &r.devices {
                for problem in &device.problems {
                    let kind = match problem {
                        Problem::InUse { .. } => "devices in use",
                        Problem::Counters { .. } => "shared counters used up (MIG slices, engines)",
                        Problem::Capacity(_) => "consumable capacity used up",
                        Problem::Taint(_) => "taints not tolerated",
                        Problem::Selector { .. } => "ruled out by selectors",
                        Problem::NotOnNode => "not on this node",
                        Problem::NodeOperations(_) => "node operations",
                        Problem::Compatibility { .. } => "compatibility groups",
                    };
                    *counts.entry(kind).or_default() += 1;
                }
            }
            break;
        }
    }
    let Some(request) = request else {
        return explanation
            .render()
            .lines()
            .next()
            .unwrap_or("does not fit")
            .trim()
            .to_string();
    };
    let mut reasons: Vec<(&str, usize)> = counts.into_iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    if reasons.is_empty() {
        return format!("request {request}: no device matches");
    }
    let listed: Vec<String> = reasons
        .iter()
        .filter(|(kind, _)| *kind != "ruled out by selectors" || reasons.len() == 1)
        .map(|(kind, n)| format!("{kind} ({n} devices)"))
        .collect();
    format!("request {request}: {}", listed.join(", "))
}

pub fn run(args: CapacityArgs) -> Result<ExitCode, CliError> {
    if !matches!(args.output.as_str(), "text" | "json") {
        return Err(usage(format!("-o {:?}: use text or json", args.output)));
    }
    let started = Instant::now();
    // `pod/NAME`: a pod of the cluster, counted on the cluster.
    let live_pod = args
        .inputs
        .claim
        .as_ref()
        .filter(|path| !path.exists())
        .and_then(|path| super::live::LiveTarget::parse(&path.to_string_lossy()));
    let mut loaded = match live_pod {
        Some(super::live::LiveTarget::Claim(_) | super::live::LiveTarget::Workload(..)) => {
            return Err(usage(
                "gpu-dra capacity counts copies of a pod: give pod/NAME or -f POD.yaml",
            ));
        }
        Some(super::live::LiveTarget::Pod(name)) => {
            let mut inputs = args.inputs.clone();
            inputs.claim = None;
            let namespace = args.namespace.as_deref().unwrap_or("default");
            let snapshot =
                super::live::snapshot(args.kubeconfig.as_deref(), namespace, Some(&name))?;
            load_with(&inputs, Some(snapshot))?
        }
        None if args.namespace.is_some() => {
            return Err(usage(
                "-n/--namespace: the namespace of a pod/NAME argument; the pods of -f name their own",
            ));
        }
        None if args.cluster => {
            let snapshot = super::live::snapshot(args.kubeconfig.as_deref(), "default", None)?;
            load_with(&args.inputs, Some(snapshot))?
        }
        None => load(&args.inputs)?,
    };
    if args.inputs.replicas
        && let Some((object, units, needed)) = workload::group_units(&loaded)
    {
        let answer = workload::count(&loaded, object, &units, needed, args.max)?;
        return report_workload(&answer, &args.output, started.elapsed());
    }
    let Some(unit) = loaded
        .plan
        .units
        .iter()
        .find(|u| u.title.is_some())
        .or_else(|| loaded.plan.units.first())
    else {
        return Err(usage("nothing to count: give one pod or workload with -f"));
    };
    if loaded.plan.units.len() > 1 {
        eprintln!(
            "note: counting copies of {} only (the first of {} pods in the inputs)",
            unit.title.as_deref().unwrap_or("the claims"),
            loaded.plan.units.len()
        );
    }
    let generated: BTreeSet<String> = loaded.plan.generated.iter().map(claim_key).collect();
    // Every node the slices name; slices for all nodes (or by selector) count on each.
    let nodes = super::claims::fleet(&loaded);
    // Pools anything is allocated from: a node using one is counted on its own.
    let busy_pools: BTreeSet<&str> = loaded
        .state
        .holders
        .keys()
        .chain(loaded.state.shares.keys())
        .map(|id| id.pool.as_str())
        .collect();
    let ctx = Counting {
        unit,
        generated: &generated,
        busy_pools: &busy_pools,
        state: &loaded.state,
        features: &loaded.features,
        max: args.max,
    };
    // Nodes are counted on as many threads as there are cores, each with an allocator of its
    // own over the same slices, in contiguous shares so the answers keep the nodes' order.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(nodes.len().div_ceil(NODES_PER_THREAD))
        .max(1);
    let answers = if threads == 1 {
        count_nodes(&ctx, &mut loaded.allocator, &nodes)?
    } else {
        let inputs = loaded.allocator.inputs();
        let share = nodes.len().div_ceil(threads);
        let ctx = &ctx;
        let shares: Vec<Result<Vec<NodeCapacity>, String>> = std::thread::scope(|scope| {
            let running: Vec<_> = nodes
                .chunks(share)
                .map(|share| {
                    let inputs = inputs.clone();
                    // The error as text: a CliError need not cross threads.
                    scope.spawn(move || {
                        count_nodes(ctx, &mut inputs.build(), share).map_err(|e| e.to_string())
                    })
                })
                .collect();
            running
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let mut answers = Vec::with_capacity(nodes.len());
        for share in shares {
            answers.extend(share.map_err(usage)?);
        }
        answers
    };
    let total: usize = answers.iter().map(|a| a.fits).sum();
    let elapsed = started.elapsed();
    let title = unit.title.clone().unwrap_or_else(|| "the claims".into());
    let mut out = std::io::stdout().lock();
    if args.output == "json" {
        let document = serde_json::json!({
            "pod": title,
            "total": total,
            "nodes": answers,
            "seconds": elapsed.as_secs_f64(),
        });
        let text =
            serde_json::to_string_pretty(&document).map_err(|e| CliError::Encode(e.to_string()))?;
        writeln!(out, "{text}")?;
    } else {
        writeln!(
            out,
            "{title}: {total} more cop{} fit on {} node(s).",
            if total == 1 { "y" } else { "ies" },
            answers.len()
        )?;
        for a in &answers {
            let more = if a.at_max { "+ (--max)" } else { "" };
            match &a.stops {
                Some(stops) if !a.at_max => {
                    writeln!(out, "  node {}: {}{more}; then: {stops}", a.node, a.fits)?
                }
                _ => writeln!(out, "  node {}: {}{more}", a.node, a.fits)?,
            }
        }
        eprintln!("note: counted in {:.2}s", elapsed.as_secs_f64());
    }
    // The process ends next: freeing a fleet's slices piece by piece took seconds at 1,000 nodes.
    std::mem::forget(loaded);
    Ok(if total > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn report_workload(
    answer: &workload::WorkloadCapacity,
    output: &str,
    elapsed: std::time::Duration,
) -> Result<ExitCode, CliError> {
    let mut out = std::io::stdout().lock();
    if output == "json" {
        let mut document =
            serde_json::to_value(answer).map_err(|e| CliError::Encode(e.to_string()))?;
        document["seconds"] = elapsed.as_secs_f64().into();
        let text =
            serde_json::to_string_pretty(&document).map_err(|e| CliError::Encode(e.to_string()))?;
        writeln!(out, "{text}")?;
    } else {
        let more = if answer.at_max { "+ (--max)" } else { "" };
        let rule = if answer.needed < answer.pods {
            format!(
                "at least {} of its {} pods, a gang",
                answer.needed, answer.pods
            )
        } else {
            format!("all its {} pods", answer.pods)
        };
        writeln!(
            out,
            "{}: {}{more} more cop{} fit on the fleet ({rule} each).",
            answer.workload,
            answer.fits,
            if answer.fits == 1 { "y" } else { "ies" }
        )?;
        if let Some(stops) = answer.stops.as_ref().filter(|_| !answer.at_max) {
            writeln!(out, "  then: {stops}")?;
        }
        eprintln!("note: counted in {:.2}s", elapsed.as_secs_f64());
    }
    Ok(if answer.fits > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
