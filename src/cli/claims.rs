//! `gpu-dra match` and `gpu-dra explain`: allocate what users `kubectl apply` (ResourceClaims,
//! ResourceClaimTemplates, DeviceClasses in resource.k8s.io v1beta1/v1beta2/v1, Pods and
//! workloads; see [`super::manifests`]) offline exactly as kube-scheduler would, pod by pod, and
//! explain the outcome device by device.
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use dra_allocator::explain::{self, Decision, Explanation, Problem};
use dra_allocator::{AllocatedState, Allocator, Features, Outcome};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimStatus};

mod live_workload;
mod load;

use super::CliError;
use super::manifests::convert::{self, Kind};
use super::manifests::placement::FleetNode;
use super::manifests::{self, Manifests, Plan, Unit, claim_key};
use super::slices::{OutputFormat, write_document};

pub use load::ClaimInputs;
pub(super) use load::{Loaded, fleet, load, load_with, usage};
use load::{feature_gates, read_inputs};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpu-dra match --slices sim:1xT4,1xH100-SXM5-80GB \
    --classes deviceclasses/ claim.yaml\n  gpu-dra match --slices sim:4xH100-SXM5-80GB \
    --classes deviceclasses/ -f training.yaml --replicas\n  gpu-dra match --print-v1 -f \
    v1beta1-claims.yaml\n\nExit status: 0 everything allocated; 1 nothing could be allocated \
    (explanation on stderr); 3 partly: the pods that fit are printed (stdout), the others \
    explained (stderr); 2 bad input."
)]
pub struct MatchArgs {
    #[command(flatten)]
    pub inputs: ClaimInputs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: OutputFormat,
    /// Allocate nothing: print the resource.k8s.io objects read (-f, CLAIM.yaml) as the API
    /// server returns them in v1 (converted from v1beta1/v1beta2, defaults applied), then the
    /// claims made for pods from templates, as a List. Needs no --slices or --classes.
    #[arg(long)]
    pub print_v1: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  gpu-dra explain --slices sim:1xT4,1xH100-SXM5-80GB \
    --classes deviceclasses/ claim.yaml\n  gpu-dra explain --slices sim:1xH100-SXM5-80GB \
    --classes deviceclasses/ -f deployment.yaml --replicas\n  gpu-dra explain pod/trainer -n ml   \
    (a live cluster: why is it Pending, or which devices it got; also `kubectl gpu-dra explain` \
    with gpu-dra installed as kubectl-gpu_dra)\n\nExit status (offline): 0 every pod fits; 1 none \
    does; 3 some do; 2 bad input."
)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub inputs: ClaimInputs,
    /// Live cluster (`explain pod/NAME` or `explain resourceclaim/NAME`): the namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Live cluster: kubeconfig (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "KUBECONFIG_PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// The object a claim's spec is written in and the path of that spec.
fn describe(plan: &Plan, claim: &ResourceClaim) -> (String, &'static str) {
    let key = claim_key(claim);
    match plan.provenance.get(&key) {
        Some(p) => (p.object.clone(), p.spec_path),
        None => (format!("ResourceClaim {key}"), "spec"),
    }
}

/// One line per request that no device on the node can ever satisfy, whatever else is
/// allocated: its class and selectors rule out every device (or all but too few).
fn never_fits(plan: &Plan, explanation: &Explanation, claims: &[ResourceClaim]) -> Vec<String> {
    if explanation.allocated() {
        return Vec::new();
    }
    // Devices the request could ever get: none of its selectors rules them out.
    let possible = |name: &str, report: &dra_allocator::explain::ClaimReport| {
        let r = report.requests.iter().find(|r| r.name == name)?;
        if r.error.is_some() {
            return None;
        }
        let fit = r
            .devices
            .iter()
            .filter(|d| {
                !d.problems.iter().any(|p| {
                    matches!(
                        p,
                        Problem::Selector { .. } | Problem::NotOnNode | Problem::NodeOperations(_)
                    )
                })
            })
            .count();
        Some((fit, r.devices.len()))
    };
    let mut out = Vec::new();
    for claim in claims {
        let key = claim_key(claim);
        let Some(report) = explanation.claims.iter().find(|c| c.claim == key) else {
            continue;
        };
        let (object, spec) = describe(plan, claim);
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_deref())
            .unwrap_or_default();
        for (i, request) in requests.iter().enumerate() {
            let at = format!("{spec}.devices.requests[{i}]");
            let node = &explanation.node;
            if let Some(exactly) = &request.exactly {
                let Some((fit, total)) = possible(&request.name, report) else {
                    continue;
                };
                let all = exactly.allocation_mode.as_deref() == Some("All");
                let count = usize::try_from(exactly.count.unwrap_or(1)).unwrap_or(usize::MAX);
                if fit == 0 {
                    out.push(format!(
                        "{object}: {at}.exactly: request {:?} never fits on node {node}: its class and selectors rule out all {total} devices",
                        request.name
                    ));
                } else if !all && fit < count {
                    out.push(format!(
                        "{object}: {at}.exactly.count: request {:?} never fits on node {node}: it asks for {count} devices and only {fit} pass its class and selectors",
                        request.name
                    ));
                }
                continue;
            }
            let subs = request.first_available.as_deref().unwrap_or_default();
            let never = subs.iter().all(|sub| {
                let name = format!("{}/{}", request.name, sub.name);
                let count = usize::try_from(sub.count.unwrap_or(1)).unwrap_or(usize::MAX);
                let all = sub.allocation_mode.as_deref() == Some("All");
                possible(&name, report).is_some_and(|(fit, _)| fit == 0 || (!all && fit < count))
            });
            if !subs.is_empty() && never {
                out.push(format!(
                    "{object}: {at}.firstAvailable: request {:?} never fits on node {node}: the class and selectors of each of its {} subrequests rule out the devices it needs",
                    request.name,
                    subs.len()
                ));
            }
        }
    }
    out
}

/// The node a claim of the pod already holds it to (shared with a pod placed before), and the
/// nodes that admit the pod: its node filters pass and, when held, only that node.
fn admitting<'a>(
    nodes: &'a [FleetNode],
    unit: &Unit,
    claim_node: &'a HashMap<String, String>,
) -> (Option<&'a String>, Vec<&'a FleetNode>) {
    let bound = unit
        .claims
        .iter()
        .find_map(|c| claim_node.get(&claim_key(c)));
    let admitted = nodes
        .iter()
        .filter(|n| unit.placement.admits(n).is_ok())
        .filter(|n| bound.is_none_or(|b| *b == n.info.name))
        .collect();
    (bound, admitted)
}

/// Per node, why it does not admit the pod: its node filters, or a claim of the pod allocated
/// on another node (`bound`).
fn not_admitted(nodes: &[FleetNode], unit: &Unit, bound: Option<&String>) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|node| match bound.filter(|b| **b != node.info.name) {
            Some(b) => Some(format!(
                "  node {}: a claim of the pod is allocated on node {b}",
                node.info.name
            )),
            None => unit
                .placement
                .admits(node)
                .err()
                .map(|why| format!("  node {}: {why}", node.info.name)),
        })
        .collect()
}

/// The first of `nodes` (in order) where all of a pod's `claims` fit, and their allocations; a
/// pod without claims fits the first.
pub(super) fn first_fit(
    allocator: &Allocator,
    nodes: &[&FleetNode],
    claims: &[ResourceClaim],
    state: &AllocatedState,
) -> Option<(
    String,
    Vec<k8s_openapi::api::resource::v1::AllocationResult>,
)> {
    nodes.iter().find_map(|node| {
        if claims.is_empty() {
            return Some((node.info.name.clone(), vec![]));
        }
        match allocator.allocate(&node.info, claims, state) {
            Ok(Outcome::Allocated(results)) => Some((node.info.name.clone(), results)),
            _ => None,
        }
    })
}

/// How many of a workload's pods were placed.
struct Tally {
    object: String,
    placed: u64,
    total: u64,
    gang: Option<manifests::controllers::Gang>,
    /// A gang short of its minimum: its placed pods' devices were given back.
    given_back: bool,
}

impl Tally {
    /// All at once, N of M, or (a gang short of its minimum) none.
    fn verdict(&self) -> String {
        let Tally {
            object,
            placed,
            total,
            ..
        } = self;
        match &self.gang {
            Some(gang) if self.given_back => format!(
                "{object}: none of its {total} pods binds: a gang of at least {} ({}) and only {placed} fit; its devices stay free for others",
                gang.min_count, gang.by
            ),
            Some(gang) if placed < total => format!(
                "{object}: {placed} of {total} pods placed, at least {} as a gang ({}): it starts with {placed}",
                gang.min_count, gang.by
            ),
            _ if placed == total => {
                format!("{object}: all {total} pods placed: it starts all at once")
            }
            _ => format!(
                "{object}: {placed} of {total} pods placed, {} would wait: it does not start all at once (all-or-nothing scheduling, e.g. Kueue or Volcano, would hold it back)",
                total - placed
            ),
        }
    }
}

/// What placing a gang changes, kept to undo it.
struct GangSnapshot {
    state: AllocatedState,
    done: HashSet<String>,
    out: usize,
    claim_node: HashMap<String, String>,
    plugin_used: HashMap<(String, String), f64>,
}

/// Whether `node`'s device plugins have what the pod asks for beyond DRA (`unserved`), after
/// what pods placed earlier use.
fn plugins_serve(
    node: &FleetNode,
    unserved: &[(String, String)],
    used: &HashMap<(String, String), f64>,
) -> bool {
    unserved.iter().all(|(resource, quantity)| {
        let have = node
            .allocatable
            .get(resource)
            .and_then(|q| k8s_quantity::Quantity::parse(q).ok())
            .map_or(0.0, |q| q.as_approximate_float());
        let taken = used
            .get(&(node.info.name.clone(), resource.clone()))
            .copied()
            .unwrap_or(0.0);
        have - taken >= quantity.parse::<f64>().unwrap_or(f64::MAX)
    })
}

/// The claims of `unit` not yet allocated by an earlier pod.
fn pending(unit: &Unit, done: &HashSet<String>) -> Vec<ResourceClaim> {
    unit.claims
        .iter()
        .filter(|c| !done.contains(&claim_key(c)))
        .cloned()
        .collect()
}

fn print_v1(args: &MatchArgs) -> Result<ExitCode, CliError> {
    let gates = feature_gates(&args.inputs)?;
    let mut stock = Manifests::with_gates(gates.api);
    stock
        .add_typed(&args.inputs.classes, Kind::DeviceClass)
        .map_err(usage)?;
    let stock_classes: Vec<DeviceClass> = stock.classes.into_iter().map(|e| e.object).collect();
    let (m, plan) = read_inputs(&args.inputs, &gates, &stock_classes, vec![])?;
    let encode = |e: serde_json::Error| CliError::Encode(e.to_string());
    let mut items: Vec<serde_json::Value> = m
        .v1_objects()
        .map_err(encode)?
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    for claim in &plan.generated {
        items.push(serde_json::to_value(claim).map_err(encode)?);
    }
    items.iter_mut().for_each(convert::omit_empty);
    let document = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    write_document(&document, args.output)?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_match(args: MatchArgs) -> Result<ExitCode, CliError> {
    if args.print_v1 {
        return print_v1(&args);
    }
    let loaded = load(&args.inputs)?;
    let mut state = loaded.state.clone();
    let mut done = HashSet::new();
    let mut out = Vec::new();
    let mut failed = false;
    let nodes = fleet(&loaded);
    if nodes.len() > 1 {
        eprintln!(
            "note: a fleet of {} nodes: each pod goes to the first node, by name, that the scheduler's node filters admit it on (nodeName, nodeSelector, required node affinity, taints, cordon) and where all its claims fit",
            nodes.len()
        );
    }
    let gangs = args.inputs.replicas;
    let mut tallies: Vec<Tally> = Vec::new();
    // Where each allocated claim went: a pod sharing it must go there too.
    let mut claim_node: HashMap<String, String> = HashMap::new();
    // Extended resources device plugins serve, used per node.
    let mut plugin_used: HashMap<(String, String), f64> = HashMap::new();
    // Before a gang's first pod: what to go back to if it does not bind.
    let mut gang_start: Option<(String, GangSnapshot)> = None;
    let units = &loaded.plan.units;
    // Pod by pod, as the scheduler would place them: each allocation uses up its devices.
    for (i, unit) in units.iter().enumerate() {
        let object = unit
            .group
            .as_ref()
            .map(|g| g.object.clone())
            .or_else(|| unit.workload.as_ref().map(|(w, _)| w.clone()));
        let gang = unit
            .group
            .as_ref()
            .and_then(|g| g.gang.as_ref())
            .filter(|_| gangs);
        if gang.is_some() && gang_start.as_ref().map(|(o, _)| o) != object.as_ref() {
            gang_start = Some((
                object.clone().unwrap_or_default(),
                GangSnapshot {
                    state: state.clone(),
                    done: done.clone(),
                    out: out.len(),
                    claim_node: claim_node.clone(),
                    plugin_used: plugin_used.clone(),
                },
            ));
        }
        let claims = pending(unit, &done);
        if claims.is_empty() && unit.group.is_none() && unit.unserved.is_empty() {
            continue;
        }
        let (bound, admitted) = admitting(&nodes, unit, &claim_node);
        let served: Vec<&FleetNode> = admitted
            .iter()
            .copied()
            .filter(|n| plugins_serve(n, &unit.unserved, &plugin_used))
            .collect();
        let outcome = first_fit(&loaded.allocator, &served, &claims, &state);
        if let (Some(object), Some(total)) = (
            &object,
            unit.group
                .as_ref()
                .map(|g| g.pods)
                .or(unit.workload.as_ref().map(|(_, t)| *t)),
        ) {
            match tallies.iter_mut().find(|t| &t.object == object) {
                Some(t) => t.placed += u64::from(outcome.is_some()),
                None => tallies.push(Tally {
                    object: object.clone(),
                    placed: u64::from(outcome.is_some()),
                    total,
                    gang: gang.cloned(),
                    given_back: false,
                }),
            }
        }
        match outcome {
            Some((node, results)) => {
                for (resource, quantity) in &unit.unserved {
                    *plugin_used
                        .entry((node.clone(), resource.clone()))
                        .or_default() += quantity.parse::<f64>().unwrap_or(0.0);
                }
                for (mut claim, allocation) in claims.into_iter().zip(results) {
                    let key = claim_key(&claim);
                    state
                        .mark(&key, &allocation, &loaded.features)
                        .map_err(usage)?;
                    done.insert(key.clone());
                    claim_node.insert(key, node.clone());
                    let status = claim
                        .status
                        .get_or_insert_with(ResourceClaimStatus::default);
                    status.allocation = Some(allocation);
                    let mut value = serde_json::to_value(&claim)
                        .map_err(|e| CliError::Encode(e.to_string()))?;
                    convert::omit_empty(&mut value);
                    out.push(value);
                }
            }
            None => {
                failed = true;
                if let Some(title) = &unit.title {
                    eprintln!("{title}:");
                }
                let Some(first) = admitted.first() else {
                    eprintln!("no node admits the pod, before any device is looked at:");
                    for line in not_admitted(&nodes, unit, bound) {
                        eprintln!("{line}");
                    }
                    continue;
                };
                if served.is_empty() {
                    let names: Vec<&str> = unit.unserved.iter().map(|(r, _)| r.as_str()).collect();
                    eprintln!(
                        "0/{} nodes are available: {} Insufficient {}: no DeviceClass names it as its extendedResourceName and no node's allocatable (a device plugin) has enough; the pod stays Pending",
                        nodes.len(),
                        admitted.len(),
                        names.join(", ")
                    );
                    continue;
                }
                let first = served.first().unwrap_or(first);
                if let Some(b) = bound {
                    eprintln!(
                        "a claim of the pod is allocated on node {b} (shared with a pod placed before): the pod goes there or nowhere"
                    );
                }
                let explanation = explain::explain(&loaded.allocator, &first.info, &claims, &state);
                if nodes.len() > 1 {
                    eprintln!(
                        "no node of the {} fits ({} admit the pod); explained on node {}:",
                        nodes.len(),
                        admitted.len(),
                        first.info.name
                    );
                }
                for line in never_fits(&loaded.plan, &explanation, &claims) {
                    eprintln!("{line}");
                }
                eprint!("{}", short_explanation(&explanation));
            }
        }
        // The gang's last pod: all of it binds, or none (its devices stay free for others).
        let next = units.get(i + 1).and_then(|u| u.group.as_ref());
        if gang.is_some()
            && next.map(|g| &g.object) != object.as_ref()
            && let Some((gang_object, snapshot)) = gang_start.take()
            && let Some(tally) = tallies.iter_mut().find(|t| t.object == gang_object)
            && tally
                .gang
                .as_ref()
                .is_some_and(|g| tally.placed < g.min_count)
        {
            state = snapshot.state;
            done = snapshot.done;
            out.truncate(snapshot.out);
            claim_node = snapshot.claim_node;
            plugin_used = snapshot.plugin_used;
            tally.given_back = true;
            failed = true;
        }
    }
    // With every replica placed in turn: does the whole workload start at once?
    if args.inputs.replicas {
        for tally in &tallies {
            eprintln!("note: {}", tally.verdict());
        }
    }
    // A workload Kueue would not admit runs none of its pods (said in the notes above).
    failed |= !loaded.plan.held.is_empty();
    if failed && out.is_empty() {
        return Ok(ExitCode::from(1));
    }
    let document = if out.len() == 1 {
        out.remove(0)
    } else {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": out})
    };
    write_document(&document, args.output)?;
    Ok(if failed {
        ExitCode::from(PARTIAL)
    } else {
        ExitCode::SUCCESS
    })
}

/// Exit status of `match` and `explain` when some pods fit and others do not.
const PARTIAL: u8 = 3;

/// The verdict plus, per request, the devices that came closest.
fn short_explanation(e: &Explanation) -> String {
    let full = e.render();
    let mut lines = full.lines();
    let mut out = String::new();
    if let Some(first) = lines.next() {
        out.push_str(first);
        out.push('\n');
    }
    // Keep request summaries and the near misses; device-by-device detail is for `explain`.
    let mut in_near = false;
    for line in lines {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with("Claim ")
            || trimmed.starts_with("Request ")
            || trimmed.starts_with("pool ")
        {
            in_near = false;
            out.push_str(line);
            out.push('\n');
        } else if trimmed.starts_with("Would fit instead") {
            in_near = true;
            out.push_str(line);
            out.push('\n');
        } else if (in_near && indent >= 6) || indent <= 2 && !trimmed.is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("Run `gpu-dra explain` with the same arguments for every device.\n");
    out
}

pub fn run_explain(args: ExplainArgs) -> Result<ExitCode, CliError> {
    // `pod/NAME` or `resourceclaim/NAME` that is not a file: ask the cluster.
    if let Some(target) = args
        .inputs
        .claim
        .as_ref()
        .filter(|path| !path.exists())
        .and_then(|path| super::live::LiveTarget::parse(&path.to_string_lossy()))
    {
        if let super::live::LiveTarget::Workload(kind, name) = &target {
            return live_workload::explain(&args, kind, name);
        }
        let only_node = (args.inputs.node != "sim-node").then_some(args.inputs.node.as_str());
        // The cluster's scheduler gates are not visible through the API: the user names them.
        let features = Features::from_feature_gates(&args.inputs.feature_gates)
            .map_err(|e| usage(format!("--feature-gates: {e}")))?;
        return super::live::run(
            &target,
            &args.namespace,
            args.kubeconfig.as_deref(),
            only_node,
            features,
        );
    }
    explain_loaded(&load(&args.inputs)?)
}

/// Each pod (or the claims no pod uses) of the inputs in turn, each with what the ones before
/// it took.
fn explain_loaded(loaded: &Loaded) -> Result<ExitCode, CliError> {
    let mut state = loaded.state.clone();
    let mut done = HashSet::new();
    let (mut allocated, mut refused) = (0, 0);
    let units = &loaded.plan.units;
    // One claim file explains as it always did; pods get a heading each.
    let headed = units.len() > 1 || units.iter().any(|u| u.title.is_some());
    for (i, unit) in units.iter().enumerate() {
        if headed {
            if i > 0 {
                println!();
            }
            println!(
                "{}:",
                unit.title
                    .as_deref()
                    .unwrap_or("ResourceClaims no pod uses")
            );
        }
        if !unit.unserved.is_empty() {
            let names: Vec<&str> = unit.unserved.iter().map(|(r, _)| r.as_str()).collect();
            println!(
                "  Insufficient {}: no DeviceClass names it as its extendedResourceName; only a node whose device plugin serves it takes the pod",
                names.join(", ")
            );
        }
        let claims = pending(unit, &done);
        if unit.claims.is_empty() {
            println!("  no claims: nothing to allocate (a pod of its workload all the same)");
            continue;
        }
        if claims.is_empty() {
            println!("  its claims are allocated already (by an earlier pod)");
            continue;
        }
        let explanation = explain::explain(&loaded.allocator, &loaded.node, &claims, &state);
        for line in never_fits(&loaded.plan, &explanation, &claims) {
            println!("{line}");
        }
        print!("{}", explanation.render());
        match &explanation.decision {
            Decision::Allocated(results) => {
                for (claim, allocation) in claims.iter().zip(results) {
                    let key = claim_key(claim);
                    state
                        .mark(&key, allocation, &loaded.features)
                        .map_err(usage)?;
                    done.insert(key);
                }
                allocated += 1;
            }
            _ => refused += 1,
        }
    }
    // A workload Kueue holds runs none of its pods (the notes above say why).
    refused += loaded.plan.held.len();
    Ok(match (allocated, refused) {
        (_, 0) => ExitCode::SUCCESS,
        (0, _) => ExitCode::from(1),
        _ => ExitCode::from(PARTIAL),
    })
}
