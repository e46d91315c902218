//! What `match` and `explain` (and `capacity`) allocate from: the inputs they share read into
//! an allocator, the node and its allocated state, the plan of pods' claims, and the fleet.
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo};
use dra_cel::SelectorCache;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};

use super::describe;
use crate::cli::CliError;
use crate::cli::manifests::convert::Kind;
use crate::cli::manifests::placement::FleetNode;
use crate::cli::manifests::{self, Manifests, Plan, claim_key};
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
    #[arg(long, default_value = "10s", value_parser = crate::cli::duration::parse)]
    pub filter_timeout: std::time::Duration,
    /// The ResourceClaim(s) of one pod, allocated together; the same as `-f CLAIM.yaml`.
    #[arg(value_name = "CLAIM.yaml")]
    pub claim: Option<PathBuf>,
}

/// Everything loaded and ready to allocate.
pub(crate) struct Loaded {
    pub allocator: Allocator,
    pub node: NodeInfo,
    /// Node objects given (-f, --allocated): their labels and taints filter pods.
    pub node_objects: Vec<k8s_openapi::api::core::v1::Node>,
    pub plan: Plan,
    pub state: AllocatedState,
    pub features: Features,
}

pub(crate) fn usage(e: impl std::fmt::Display) -> CliError {
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
pub(super) fn read_inputs(
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
pub(super) struct Gates {
    pub(super) scheduler: Features,
    pub(super) api: manifests::validate::ApiGates,
}

pub(super) fn feature_gates(inputs: &ClaimInputs) -> Result<Gates, CliError> {
    let bad = |e: dra_allocator::gates::GateError| usage(format!("--feature-gates: {e}"));
    Ok(Gates {
        scheduler: Features::from_feature_gates(&inputs.feature_gates).map_err(bad)?,
        api: manifests::validate::ApiGates::parse(&inputs.feature_gates).map_err(bad)?,
    })
}

pub(crate) fn load(inputs: &ClaimInputs) -> Result<Loaded, CliError> {
    load_with(inputs, None)
}

/// [`load`], on a live cluster's objects too: its slices, classes, rules, nodes and allocated
/// claims join the inputs', and its documents (a live pod) join `-f`.
pub(crate) fn load_with(
    inputs: &ClaimInputs,
    cluster: Option<crate::cli::live::Snapshot>,
) -> Result<Loaded, CliError> {
    let cel = Arc::new(SelectorCache::new());
    let gates = feature_gates(inputs)?;
    let features = gates.scheduler;
    let mut cluster = cluster.unwrap_or_else(|| crate::cli::live::Snapshot {
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

/// The nodes pods go to, in name order: every node the slices name and every Node object given
/// (a fleet); `--node` alone when the slices name no node or only it and no Node is given. A
/// Node object's labels and taints are the node's; a node only slices name has `--node-labels`.
pub(crate) fn fleet(loaded: &Loaded) -> Vec<FleetNode> {
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
