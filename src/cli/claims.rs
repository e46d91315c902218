//! `gpu-dra match` and `gpu-dra explain`: allocate what users `kubectl apply` (ResourceClaims,
//! ResourceClaimTemplates, DeviceClasses in resource.k8s.io v1beta1/v1beta2/v1, Pods and
//! workloads; see [`super::manifests`]) offline exactly as kube-scheduler would, pod by pod, and
//! explain the outcome device by device.
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use dra_allocator::explain::{self, Decision, Explanation, Problem};
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo, Outcome};
use dra_cel::SelectorCache;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimStatus, ResourceSlice,
};

mod live_workload;

use super::CliError;
use super::manifests::convert::{self, Kind};
use super::manifests::placement::FleetNode;
use super::manifests::{self, Manifests, Plan, Unit, claim_key};
use super::slices::{OutputFormat, write_document};
use crate::gpu::{self, DiscoveryConfig, GpuSource};
use crate::slices::{self, SliceOptions};

/// Inputs shared by `match` and `explain`.
#[derive(Debug, Clone, Args)]
pub struct ClaimInputs {
    /// ResourceSlices (resource.k8s.io v1, v1beta2 or v1beta1): a YAML/JSON file or directory,
    /// or `sim:<N>x<MODEL>[,...]` for the slices a simulated node publishes (`NODE=sim:...` for a
    /// node of that name). Repeat for more.
    #[arg(long = "slices", value_name = "FILE|DIR|sim:SPEC")]
    pub slices: Vec<String>,
    /// `sim:` slices also offer each GPU to virtual machines (`gpu-vfio-<index>`), as a driver
    /// run with `--passthrough` publishes them.
    #[arg(long)]
    pub passthrough: bool,
    /// `sim:` nodes also publish their IMEX channel (`compute-domain.nvidia.com` channel-0), as
    /// a driver run with `--compute-domains` does: for ComputeDomains' channel claims.
    #[arg(long)]
    pub compute_domains: bool,
    /// DeviceClasses (v1, v1beta2 or v1beta1): YAML/JSON files or directories. Repeat for more.
    #[arg(long = "classes", value_name = "FILE|DIR")]
    pub classes: Vec<PathBuf>,
    /// What to allocate for, as `kubectl apply -f` takes it (file, directory or `-` for stdin;
    /// repeat for more): multi-document YAML or JSON, `kind: List`, with Pods, Deployments,
    /// ReplicaSets, StatefulSets, DaemonSets, Jobs, CronJobs, ResourceClaimTemplates,
    /// ResourceClaims and DeviceClasses (the last two kinds in resource.k8s.io v1, v1beta2 or
    /// v1beta1), and DeviceTaintRules (v1, v1beta2 or v1alpha3; their taints apply to the devices
    /// they select, as the scheduler applies them). Pods get their claims as kube-controller-manager makes them; claims no pod
    /// uses are allocated too; DeviceClasses join --classes; other kinds are skipped.
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub filenames: Vec<String>,
    /// Allocate every replica of a workload in turn, each with claims of its own from its
    /// templates (claims named by several pods are allocated once). Without it one pod stands
    /// for each workload.
    #[arg(long)]
    pub replicas: bool,
    /// Node to allocate on when the slices name no node or only it (also the node name of
    /// `sim:` slices). Slices that name several nodes (`--slices NODE=sim:...`, a cluster's
    /// slices) are a fleet: each pod goes to the first node, by name, where it fits.
    #[arg(long, default_value = "sim-node")]
    pub node: String,
    /// Extra node labels `k=v,...` for slices that select nodes by label.
    #[arg(long, value_name = "K=V,...")]
    pub node_labels: Option<String>,
    /// kube-scheduler feature gates `A=true,B=false,...` on top of the 1.37 defaults: allocate
    /// as a scheduler started with them would (DRA gates only; e.g. the e2e cluster's
    /// K8S_FEATURE_GATES). The node's kubelet is taken to run with them too.
    #[arg(long, value_name = "GATE=BOOL,...", default_value = "")]
    pub feature_gates: String,
    /// Claims that are already allocated (status.allocation set): their devices are in use.
    /// DeviceTaintRules may come with them (e.g. `kubectl get resourceclaims,devicetaintrules -A
    /// -o yaml`).
    #[arg(long = "allocated", value_name = "FILE|DIR")]
    pub allocated: Vec<PathBuf>,
    /// Driver name of `sim:` slices.
    #[arg(long, default_value = slices::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// How long one pod's allocation may search before giving up, as kube-scheduler's
    /// DynamicResources `filterTimeout` (its default 10s; `0` searches without limit).
    #[arg(long, default_value = "10s", value_parser = super::duration::parse)]
    pub filter_timeout: std::time::Duration,
    /// The ResourceClaim(s) of one pod, allocated together; the same as `-f CLAIM.yaml`.
    #[arg(value_name = "CLAIM.yaml")]
    pub claim: Option<PathBuf>,
}

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

/// Everything loaded and ready to allocate.
pub(super) struct Loaded {
    pub allocator: Allocator,
    pub node: NodeInfo,
    /// Node objects given (-f, --allocated): their labels and taints filter pods.
    pub node_objects: Vec<k8s_openapi::api::core::v1::Node>,
    pub plan: Plan,
    pub state: AllocatedState,
    pub features: Features,
}

pub(super) fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(e.to_string())
}

fn simulated_slices(
    spec: &str,
    node: &str,
    driver: &str,
    passthrough: bool,
) -> Result<Vec<ResourceSlice>, CliError> {
    let source: GpuSource = spec.parse()?;
    let inventory = gpu::discover(&DiscoveryConfig::new(source, node))?;
    let options = SliceOptions {
        passthrough,
        ..SliceOptions::new(driver, node)
    };
    Ok(slices::build(&inventory, &options)?)
}

/// Reads the positional claim file and the `-f` sources, and plans the pods' claims. Notes
/// (skipped kinds, replica counts) go to stderr.
fn read_inputs(
    inputs: &ClaimInputs,
    gates: &Gates,
    classes: &[DeviceClass],
    docs: Vec<manifests::Doc>,
) -> Result<(Manifests, Plan), CliError> {
    if inputs.claim.is_none() && inputs.filenames.is_empty() && docs.is_empty() {
        return Err(usage(
            "nothing to allocate: give -f FILE|DIR|- (Pods, workloads, ResourceClaims, ...) or CLAIM.yaml",
        ));
    }
    let mut m = Manifests::with_gates(gates.api);
    if let Some(claim) = &inputs.claim {
        m.add_sources(&[claim.display().to_string()], Some(Kind::ResourceClaim))
            .map_err(usage)?;
    }
    m.add_sources(&inputs.filenames, None).map_err(usage)?;
    m.add_documents(docs).map_err(usage)?;
    manifests::driver_config::check(&m, &inputs.driver_name).map_err(usage)?;
    manifests::derived::check(&m, &gates.scheduler).map_err(usage)?;
    let plan = manifests::plan(&m, inputs.replicas, classes).map_err(usage)?;
    for note in m.notes.iter().chain(&plan.notes) {
        eprintln!("note: {note}");
    }
    Ok((m, plan))
}

/// `--feature-gates` (kube-scheduler's, taken as the cluster's), parsed once: what the
/// allocator follows and what the API server's create-time checks follow.
struct Gates {
    scheduler: Features,
    api: manifests::validate::ApiGates,
}

fn feature_gates(inputs: &ClaimInputs) -> Result<Gates, CliError> {
    let bad = |e: dra_allocator::gates::GateError| usage(format!("--feature-gates: {e}"));
    Ok(Gates {
        scheduler: Features::from_feature_gates(&inputs.feature_gates).map_err(bad)?,
        api: manifests::validate::ApiGates::parse(&inputs.feature_gates).map_err(bad)?,
    })
}

pub(super) fn load(inputs: &ClaimInputs) -> Result<Loaded, CliError> {
    load_with(inputs, None)
}

/// [`load`], on a live cluster's objects too: its slices, classes, rules, nodes and allocated
/// claims join the inputs', and its documents (a live pod) join `-f`.
pub(super) fn load_with(
    inputs: &ClaimInputs,
    cluster: Option<super::live::Snapshot>,
) -> Result<Loaded, CliError> {
    let cel = Arc::new(SelectorCache::new());
    let gates = feature_gates(inputs)?;
    let features = gates.scheduler;
    let mut cluster = cluster.unwrap_or_else(|| super::live::Snapshot {
        classes: vec![],
        slices: vec![],
        taint_rules: vec![],
        allocated: vec![],
        nodes: vec![],
        docs: vec![],
    });
    let mut all_slices = std::mem::take(&mut cluster.slices);
    for source in &inputs.slices {
        // `NODE=sim:SPEC`: a simulated node of its own (a fleet is several).
        let (node, spec) = match source.split_once("=sim:") {
            Some((node, spec)) if !node.is_empty() => (node, format!("sim:{spec}")),
            _ => (inputs.node.as_str(), source.clone()),
        };
        if spec.starts_with("sim:") {
            all_slices.extend(simulated_slices(
                &spec,
                node,
                &inputs.driver_name,
                inputs.passthrough,
            )?);
            if inputs.compute_domains {
                all_slices.extend(crate::compute_domain::node::channel_slices(node, None));
            }
        } else {
            let mut files = Manifests::with_gates(gates.api);
            files
                .add_typed(&[PathBuf::from(source)], Kind::ResourceSlice)
                .map_err(usage)?;
            all_slices.extend(files.slices.into_iter().map(|e| e.object));
        }
    }
    let mut stock = Manifests::with_gates(gates.api);
    stock
        .add_typed(&inputs.classes, Kind::DeviceClass)
        .map_err(usage)?;
    let mut stock_classes: Vec<DeviceClass> =
        stock.classes.iter().map(|e| e.object.clone()).collect();
    stock_classes.extend(cluster.classes.iter().cloned());
    let (m, plan) = read_inputs(
        inputs,
        &gates,
        &stock_classes,
        std::mem::take(&mut cluster.docs),
    )?;
    // Workloads Kueue holds are an answer (none of their pods runs), not an empty input.
    if plan.units.is_empty() && plan.held.is_empty() {
        return Err(usage(
            "nothing to allocate: no ResourceClaim, no pod asks for one (spec.resourceClaims), and no container asks for an extended resource a DeviceClass backs",
        ));
    }
    all_slices.extend(m.slices.into_iter().map(|e| e.object));
    if all_slices.is_empty() {
        return Err(usage(
            "no ResourceSlices: give --slices FILE|DIR|sim:SPEC (or ResourceSlices with -f)",
        ));
    }
    // DeviceClasses from -f come first: the scheduler's lister takes the first of a name, and
    // the class a user applies replaces the stock one.
    let own: BTreeSet<String> = m
        .classes
        .iter()
        .filter_map(|e| e.object.metadata.name.clone())
        .collect();
    let mut classes: Vec<DeviceClass> = m.classes.into_iter().map(|e| e.object).collect();
    for entry in stock.classes {
        match &entry.object.metadata.name {
            Some(name) if own.contains(name) => {
                eprintln!("note: DeviceClass {name} from -f replaces the one in --classes");
            }
            _ => classes.push(entry.object),
        }
    }
    for class in cluster.classes {
        match &class.metadata.name {
            Some(name) if own.contains(name) => {
                eprintln!("note: DeviceClass {name} from -f replaces the cluster's");
            }
            _ => classes.push(class),
        }
    }
    check_classes(&plan, &classes)?;
    let mut held = Manifests::with_gates(gates.api);
    held.add_typed(&inputs.allocated, Kind::ResourceClaim)
        .map_err(usage)?;
    let rules: Vec<_> = m
        .taint_rules
        .iter()
        .chain(&held.taint_rules)
        .map(|e| e.object.clone())
        .chain(cluster.taint_rules)
        .collect();
    for note in manifests::taint_rules::apply(&rules, &mut all_slices) {
        eprintln!("note: {note}");
    }
    let mut state = AllocatedState::new();
    for entry in &held.claims {
        let claim = &entry.object;
        let name = dra_allocator::claim_name(claim);
        let Some(allocation) = manifests::allocation_of(claim) else {
            return Err(usage(format!(
                "--allocated claim {name} ({}) has no status.allocation",
                entry.origin
            )));
        };
        state.mark(&name, allocation, &features).map_err(usage)?;
    }
    for claim in &cluster.allocated {
        if let Some(allocation) = manifests::allocation_of(claim) {
            state
                .mark(&claim_key(claim), allocation, &features)
                .map_err(|e| usage(format!("claim {} in the cluster: {e}", claim_key(claim))))?;
        }
    }
    let mut node = NodeInfo::named(&inputs.node);
    // A kubelet with DRAOptionalNodeOperations declares it (nodedeclaredfeatures).
    if features.optional_node_operations {
        node.declared_features
            .push(dra_allocator::OPTIONAL_NODE_OPERATIONS.to_string());
    }
    for pair in inputs
        .node_labels
        .iter()
        .flat_map(|l| l.split(','))
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| usage(format!("--node-labels: {pair:?} is not k=v")))?;
        node.labels.insert(k.to_string(), v.to_string());
    }
    let node_objects = m
        .nodes
        .iter()
        .chain(&held.nodes)
        .map(|e| e.object.clone())
        .chain(cluster.nodes)
        .collect();
    Ok(Loaded {
        allocator: Allocator::shared(features, Arc::new(all_slices), Arc::new(classes), cel)
            .with_filter_timeout(Some(inputs.filter_timeout)),
        node,
        node_objects,
        plan,
        state,
        features,
    })
}

/// Every device class a claim to allocate names must exist: the scheduler would abort each
/// attempt with "could not retrieve device class".
fn check_classes(plan: &Plan, classes: &[DeviceClass]) -> Result<(), CliError> {
    let known: BTreeSet<&str> = classes
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    for claim in plan.units.iter().flat_map(|u| &u.claims) {
        let (object, spec) = describe(plan, claim);
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.as_deref())
            .unwrap_or_default();
        for (i, request) in requests.iter().enumerate() {
            let at = format!("{spec}.devices.requests[{i}]");
            let mut wanted = Vec::new();
            if let Some(exactly) = &request.exactly {
                wanted.push((format!("{at}.exactly"), &exactly.device_class_name));
            }
            for (j, sub) in request.first_available.iter().flatten().enumerate() {
                wanted.push((format!("{at}.firstAvailable[{j}]"), &sub.device_class_name));
            }
            for (field, class) in wanted {
                if known.contains(class.as_str()) {
                    continue;
                }
                let why = if known.is_empty() {
                    "no DeviceClasses were given (--classes DIR, or DeviceClasses with -f)"
                        .to_string()
                } else {
                    format!(
                        "the DeviceClasses given are {}",
                        known.iter().copied().collect::<Vec<_>>().join(", ")
                    )
                };
                return Err(usage(format!(
                    "{object}: {field}.deviceClassName: DeviceClass {class:?} not found; {why}"
                )));
            }
        }
    }
    Ok(())
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

/// The nodes pods go to, in name order: every node the slices name and every Node object given
/// (a fleet); `--node` alone when the slices name no node or only it and no Node is given. A
/// Node object's labels and taints are the node's; a node only slices name has `--node-labels`.
pub(super) fn fleet(loaded: &Loaded) -> Vec<FleetNode> {
    let mut named: BTreeSet<String> = loaded
        .allocator
        .slices()
        .iter()
        .filter_map(|s| s.spec.node_name.clone())
        .collect();
    named.extend(
        loaded
            .node_objects
            .iter()
            .filter_map(|n| n.metadata.name.clone()),
    );
    if named.is_empty() {
        return vec![FleetNode::named(loaded.node.clone())];
    }
    named
        .into_iter()
        .map(|name| {
            match loaded
                .node_objects
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
            {
                Some(object) => {
                    let mut node = FleetNode::from_node(object);
                    for feature in &loaded.node.declared_features {
                        if !node.info.declared_features.contains(feature) {
                            node.info.declared_features.push(feature.clone());
                        }
                    }
                    node
                }
                None => {
                    let mut info = loaded.node.clone();
                    info.labels
                        .insert("kubernetes.io/hostname".to_string(), name.clone());
                    info.name = name;
                    FleetNode::named(info)
                }
            }
        })
        .collect()
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
