//! `gpu-dra explain pod/NAME` and `explain resourceclaim/NAME` on a live cluster: "why is my pod
//! Pending?" answered from what the scheduler sees — the pod's claims, the DeviceClasses, every
//! ResourceSlice and every allocated claim — node by node, with the offline explainer.
//! Read-only: it gets and lists, and a missing permission is an error naming it. A workload
//! (`job/NAME`, `podgroup/NAME`, ...) is read by [`workload`].
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;

use dra_allocator::explain;
use dra_allocator::{AllocatedState, Allocator, Features, NodeInfo};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams};

use super::CliError;
use super::manifests::claim_key;

pub mod workload;

/// What to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveTarget {
    Pod(String),
    Claim(String),
    /// A workload object whose pods (or Kueue's verdict) answer: `job/NAME`, `podgroup/NAME`.
    Workload(&'static workload::WorkloadKind, String),
}

impl LiveTarget {
    /// `pod/NAME` (also `pods/`, `po/`), `resourceclaim/NAME` (also `resourceclaims/`) or a
    /// workload (`job/`, `jobset/`, `mpijob/`, `leaderworkerset/`, `podgroup/`); `None` for
    /// anything else (a file path).
    pub fn parse(text: &str) -> Option<Self> {
        let (kind, name) = text.split_once('/')?;
        if name.is_empty() || name.contains('/') {
            return None;
        }
        match kind {
            "pod" | "pods" | "po" => Some(Self::Pod(name.to_string())),
            "resourceclaim" | "resourceclaims" | "resourceclaims.resource.k8s.io" => {
                Some(Self::Claim(name.to_string()))
            }
            other => workload::kind_named(other).map(|k| Self::Workload(k, name.to_string())),
        }
    }
}

/// What the command needs to read; named in the error when one is refused.
const NEEDS: &str = "get/list on pods, resourceclaims, resourceclaimtemplates, deviceclasses, resourceslices, devicetaintrules and nodes (for a workload also get on it and its podgroups, and list on Kueue's workloads and get on its localqueues where Kueue is installed)";

fn api_error(what: &str, error: kube::Error) -> CliError {
    match &error {
        kube::Error::Api(status) if status.code == 403 => CliError::Usage(format!(
            "cannot {what}: forbidden ({}); gpu-dra explain needs {NEEDS}",
            status.message
        )),
        kube::Error::Api(status) if status.code == 404 => {
            CliError::Usage(format!("cannot {what}: not found"))
        }
        _ => CliError::Usage(format!("cannot {what}: {error}")),
    }
}

/// The cluster as the scheduler sees it.
struct ClusterView {
    classes: Vec<DeviceClass>,
    slices: Vec<ResourceSlice>,
    taint_rules: Vec<k8s_openapi::api::resource::v1::DeviceTaintRule>,
    claims: Vec<ResourceClaim>,
    nodes: Vec<Node>,
}

async fn list<K>(api: Api<K>, what: &str) -> Result<Vec<K>, CliError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error(&format!("list {what}"), e))?
        .items)
}

async fn view(client: &kube::Client) -> Result<ClusterView, CliError> {
    Ok(ClusterView {
        classes: list(Api::all(client.clone()), "deviceclasses").await?,
        slices: list(Api::all(client.clone()), "resourceslices").await?,
        // Not served where the DRADeviceTaintRules gate is off: then no rule applies.
        taint_rules: match Api::all(client.clone()).list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(status)) if status.code == 404 => vec![],
            Err(e) => return Err(api_error("list devicetaintrules", e)),
        },
        claims: list(Api::all(client.clone()), "resourceclaims (all namespaces)").await?,
        nodes: list(Api::all(client.clone()), "nodes").await?,
    })
}

/// The cluster's objects for the offline tools run on it (`gpu-dra capacity --cluster`,
/// `capacity pod/NAME`): everything the scheduler reads, and the pod to count as documents.
pub struct Snapshot {
    pub classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub taint_rules: Vec<k8s_openapi::api::resource::v1::DeviceTaintRule>,
    /// Claims with an allocation: their devices are in use.
    pub allocated: Vec<ResourceClaim>,
    pub nodes: Vec<Node>,
    /// `pod/NAME`: the pod as a new one (no status, no node), its templates and named claims.
    pub docs: Vec<super::manifests::Doc>,
}

impl Snapshot {
    /// The cluster as read, with `docs` to allocate for: only allocated claims are kept (their
    /// devices are in use); the others are for the inputs to allocate.
    fn from_view(view: ClusterView, docs: Vec<super::manifests::Doc>) -> Self {
        Self {
            classes: view.classes,
            slices: view.slices,
            taint_rules: view.taint_rules,
            allocated: view
                .claims
                .into_iter()
                .filter(|c| super::manifests::allocation_of(c).is_some())
                .collect(),
            nodes: view.nodes,
            docs,
        }
    }
}

/// Reads the cluster (and the pod `pod` in `namespace`, when given).
pub fn snapshot(
    kubeconfig: Option<&Path>,
    namespace: &str,
    pod: Option<&str>,
) -> Result<Snapshot, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = crate::node::kube_client(kubeconfig, &crate::kubeapi::ApiTimeouts::default())
            .await
            .map_err(|e| CliError::Node(Box::new(e)))?;
        let mut docs = Vec::new();
        if let Some(name) = pod {
            docs = pod_documents(&client, namespace, name).await?;
        }
        Ok(Snapshot::from_view(view(&client).await?, docs))
    })
}

/// A live pod as a manifest of a new copy of it: no status, not bound to a node; with the
/// templates and claims it names.
async fn pod_documents(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Vec<super::manifests::Doc>, CliError> {
    let encode = |e: serde_json::Error| CliError::Encode(e.to_string());
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods
        .get(name)
        .await
        .map_err(|e| api_error(&format!("get pod {namespace}/{name}"), e))?;
    let mut values = Vec::new();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    let entries = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default();
    for (index, entry) in entries.iter().enumerate() {
        let field = format!("pod {namespace}/{name}: spec.resourceClaims[{index}]");
        let mut value = if let Some(claim) = &entry.resource_claim_name {
            let object = claims.get(claim).await.map_err(|e| {
                api_error(
                    &format!("get resourceclaim {namespace}/{claim} ({field})"),
                    e,
                )
            })?;
            serde_json::to_value(object).map_err(encode)?
        } else if let Some(template) = &entry.resource_claim_template_name {
            let object = templates.get(template).await.map_err(|e| {
                api_error(
                    &format!("get resourceclaimtemplate {namespace}/{template} ({field})"),
                    e,
                )
            })?;
            serde_json::to_value(object).map_err(encode)?
        } else {
            continue;
        };
        // The v1 the client read; the manifests reader wants the kind and version written.
        value["apiVersion"] = "resource.k8s.io/v1".into();
        value["kind"] = if entry.resource_claim_name.is_some() {
            "ResourceClaim"
        } else {
            "ResourceClaimTemplate"
        }
        .into();
        values.push(value);
    }
    let mut value = serde_json::to_value(&pod).map_err(encode)?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "Pod".into();
    if let Some(object) = value.as_object_mut() {
        object.remove("status");
    }
    if let Some(spec) = value.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.remove("nodeName");
    }
    values.push(value);
    Ok(values
        .into_iter()
        .enumerate()
        .map(|(document, value)| super::manifests::Doc {
            value,
            origin: super::manifests::Origin {
                file: format!("pod {namespace}/{name} in the cluster").into(),
                document,
                item: None,
            },
        })
        .collect())
}

/// The pod's claims: by name, or generated from a template (looked up through the pod's status;
/// when kube-controller-manager has not made it yet, built from the template as it would be).
async fn claims_of_pod(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    notes: &mut Vec<String>,
) -> Result<Vec<ResourceClaim>, CliError> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    let generated: BTreeMap<String, Option<String>> = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.resource_claim_name.clone()))
        .collect();
    let mut out = Vec::new();
    let entries = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .cloned()
        .unwrap_or_default();
    // The claim the scheduler made for the pod's extended resources, once it made it.
    if let Some(name) = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.clone())
    {
        out.push(claims.get(&name).await.map_err(|e| {
            api_error(
                &format!(
                    "get resourceclaim {namespace}/{name} (status.extendedResourceClaimStatus)"
                ),
                e,
            )
        })?);
    }
    for (index, entry) in entries.iter().enumerate() {
        let field = format!("pod {namespace}/{pod_name}: spec.resourceClaims[{index}]");
        let name = match (
            &entry.resource_claim_name,
            &entry.resource_claim_template_name,
        ) {
            (Some(name), _) => Some(name.clone()),
            (None, Some(_)) => generated.get(&entry.name).cloned().flatten(),
            (None, None) => {
                return Err(CliError::Usage(format!(
                    "{field}: neither resourceClaimName nor resourceClaimTemplateName"
                )));
            }
        };
        match name {
            Some(name) => out.push(claims.get(&name).await.map_err(|e| {
                api_error(
                    &format!("get resourceclaim {namespace}/{name} ({field})"),
                    e,
                )
            })?),
            None => {
                let template_name = entry
                    .resource_claim_template_name
                    .clone()
                    .unwrap_or_default();
                let template = templates.get(&template_name).await.map_err(|e| {
                    api_error(
                        &format!("get resourceclaimtemplate {namespace}/{template_name} ({field})"),
                        e,
                    )
                })?;
                notes.push(format!(
                    "claim {:?} of the pod is not created yet (kube-controller-manager makes it from template {template_name}); explaining the template's claim",
                    entry.name
                ));
                if template.spec.is_none() {
                    return Err(CliError::Usage(format!(
                        "resourceclaimtemplate {namespace}/{template_name}: spec is missing"
                    )));
                }
                let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
                out.push(super::manifests::claim_from_template(
                    &pod_name,
                    &pod_uid,
                    namespace,
                    &entry.name,
                    &template,
                ));
            }
        }
    }
    Ok(out)
}

/// Prints where the claims' devices are, when every claim is allocated.
fn report_allocated(claims: &[ResourceClaim], scheduled_on: Option<&str>) -> Option<String> {
    let mut out = String::new();
    for claim in claims {
        let allocation = claim.status.as_ref()?.allocation.as_ref()?;
        let devices: Vec<String> = allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
            .map(|r| {
                format!(
                    "{} ({}/{}, request {})",
                    r.device, r.driver, r.pool, r.request
                )
            })
            .collect();
        out.push_str(&format!(
            "Claim {} is allocated: {}\n",
            claim_key(claim),
            devices.join(", ")
        ));
    }
    if let Some(node) = scheduled_on {
        out.push_str(&format!("The pod is scheduled on node {node}.\n"));
    }
    Some(out)
}

/// Explains `target` in `namespace`. `only_node` limits the nodes looked at.
pub fn run(
    target: &LiveTarget,
    namespace: &str,
    kubeconfig: Option<&Path>,
    only_node: Option<&str>,
    features: Features,
) -> Result<ExitCode, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(
        target, namespace, kubeconfig, only_node, features,
    ))
}

async fn run_async(
    target: &LiveTarget,
    namespace: &str,
    kubeconfig: Option<&Path>,
    only_node: Option<&str>,
    features: Features,
) -> Result<ExitCode, CliError> {
    let client = crate::node::kube_client(kubeconfig, &crate::kubeapi::ApiTimeouts::default())
        .await
        .map_err(|e| CliError::Node(Box::new(e)))?;
    let mut notes = Vec::new();
    let mut extended_containers = Vec::new();
    let mut extended_pod: Option<(String, String)> = None;
    // The scheduler's node filters (node selection, taints, cordons) for a pod's nodes.
    let mut placement = super::manifests::placement::PodPlacement::default();
    let (claims, scheduled_on, title) = match target {
        LiveTarget::Pod(name) => {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let pod = pods
                .get(name)
                .await
                .map_err(|e| api_error(&format!("get pod {namespace}/{name}"), e))?;
            let claims = claims_of_pod(&client, namespace, &pod, &mut notes).await?;
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let spec_value =
                serde_json::to_value(&pod.spec).map_err(|e| CliError::Encode(e.to_string()))?;
            placement =
                super::manifests::placement::PodPlacement::from_spec(Some(&spec_value), "spec")
                    .map_err(|e| {
                        CliError::Usage(format!(
                            "pod {namespace}/{name}: {}: {}",
                            e.field, e.message
                        ))
                    })?;
            // Not made yet: the scheduler makes it per node, in the search (see below).
            let made = pod
                .status
                .as_ref()
                .is_some_and(|s| s.extended_resource_claim_status.is_some());
            if !made {
                let spec =
                    serde_json::to_value(&pod.spec).map_err(|e| CliError::Encode(e.to_string()))?;
                extended_containers =
                    crate::cli::manifests::extended::containers(Some(&spec), "spec").map_err(
                        |e| {
                            CliError::Usage(format!(
                                "pod {namespace}/{name}: {}: {}",
                                e.field, e.message
                            ))
                        },
                    )?;
                extended_pod = Some((name.clone(), pod.metadata.uid.clone().unwrap_or_default()));
            }
            (claims, node, format!("Pod {namespace}/{name}"))
        }
        // `gpu-dra explain` reads a workload through [`workload::read`], never here.
        LiveTarget::Workload(kind, name) => {
            return Err(CliError::Usage(format!(
                "{}/{name}: a workload is explained through its pods (workload::read)",
                kind.kind
            )));
        }
        LiveTarget::Claim(name) => {
            let api: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
            let claim = api
                .get(name)
                .await
                .map_err(|e| api_error(&format!("get resourceclaim {namespace}/{name}"), e))?;
            (
                vec![claim],
                None,
                format!("ResourceClaim {namespace}/{name}"),
            )
        }
    };
    for note in &notes {
        eprintln!("note: {note}");
    }
    let view = view(&client).await?;
    let extended_classes = crate::cli::manifests::extended::class_mapping(view.classes.iter());
    let asks_extended =
        !crate::cli::manifests::extended::requests(&extended_containers, &extended_classes, |_| {
            false
        })
        .is_empty();
    if claims.is_empty() && !asks_extended {
        return Err(CliError::Usage(format!(
            "{title}: no claims (spec.resourceClaims) and no extended resource a DeviceClass backs; it asks for no devices"
        )));
    }
    if !asks_extended && let Some(report) = report_allocated(&claims, scheduled_on.as_deref()) {
        print!("{title}: allocated.\n{report}");
        return Ok(ExitCode::SUCCESS);
    }
    let own: BTreeSet<String> = claims.iter().map(claim_key).collect();
    let mut state = AllocatedState::new();
    for claim in &view.claims {
        if own.contains(&claim_key(claim)) {
            continue;
        }
        if let Some(allocation) = super::manifests::allocation_of(claim) {
            state
                .mark(&claim_key(claim), allocation, &features)
                .map_err(|e| CliError::Usage(format!("claim {}: {e}", claim_key(claim))))?;
        }
    }
    // Partly allocated: the allocated claims' devices are fixed; explain the rest as the
    // scheduler would (it allocates a pod's claims together, so this is rare).
    let pending: Vec<ResourceClaim> = claims
        .iter()
        .filter(|c| super::manifests::allocation_of(c).is_none())
        .cloned()
        .collect();
    let mut slices = view.slices;
    for note in crate::cli::manifests::taint_rules::apply(&view.taint_rules, &mut slices) {
        eprintln!("note: {note}");
    }
    let allocator = Allocator::new(features, slices, view.classes);
    let mut fleet: Vec<super::manifests::placement::FleetNode> = view
        .nodes
        .iter()
        .map(super::manifests::placement::FleetNode::from_node)
        .filter(|n| only_node.is_none_or(|only| n.info.name == only))
        .collect();
    fleet.sort_by(|a, b| a.info.name.cmp(&b.info.name));
    // Nodes the pod may not go to, whatever their devices: one line each.
    let mut refused = Vec::new();
    let mut nodes: Vec<NodeInfo> = Vec::new();
    for node in fleet {
        match placement.admits(&node) {
            Ok(()) => nodes.push(node.info),
            Err(why) => refused.push((node.info.name, why)),
        }
    }
    if nodes.is_empty() && refused.is_empty() {
        return Err(CliError::Usage(match only_node {
            Some(node) => format!("--node {node}: no such node"),
            None => "the cluster has no nodes".into(),
        }));
    }
    let mut explanations = Vec::new();
    for node in &nodes {
        // The scheduler's claim for the extended resources this node's device plugins do not
        // serve (its allocatable has none of them), allocated with the pod's own.
        let mut pending = pending.clone();
        if let Some((pod, pod_uid)) = &extended_pod {
            let allocatable = view
                .nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(node.name.as_str()))
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.allocatable.clone())
                .unwrap_or_default();
            let requests = crate::cli::manifests::extended::requests(
                &extended_containers,
                &extended_classes,
                |resource| {
                    allocatable.get(resource).is_some_and(|q| {
                        k8s_quantity::Quantity::parse(&q.0)
                            .is_ok_and(|v| v.as_approximate_float() > 0.0)
                    })
                },
            );
            if !requests.is_empty() {
                pending.push(crate::cli::manifests::extended::claim(
                    pod,
                    pod_uid,
                    namespace,
                    format!("{pod}-extended-resources"),
                    requests,
                ));
            }
        }
        explanations.push(explain::explain(&allocator, node, &pending, &state));
    }
    println!(
        "{title}: {} claim(s) to allocate, {} node(s) looked at.",
        pending.len(),
        nodes.len() + refused.len()
    );
    for (node, why) in &refused {
        println!("  node {node}: the pod may not go there: {why}");
    }
    for explanation in &explanations {
        let verdict = explanation.render();
        let first = verdict.lines().next().unwrap_or("");
        println!("  node {}: {first}", explanation.node);
    }
    // In detail: the node that fits, else every node (one with the user's devices is what the
    // reader is after; nodes without any matching slice say so in one line).
    let fits = explanations.iter().find(|e| e.allocated());
    println!();
    match fits {
        Some(explanation) => print!("{}", explanation.render()),
        None => {
            for explanation in &explanations {
                print!("{}", explanation.render());
                println!();
            }
        }
    }
    Ok(if fits.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_like_kubectl_names() {
        assert_eq!(
            LiveTarget::parse("pod/p"),
            Some(LiveTarget::Pod("p".into()))
        );
        assert_eq!(LiveTarget::parse("po/p"), Some(LiveTarget::Pod("p".into())));
        assert!(matches!(
            LiveTarget::parse("jobs.batch/train"),
            Some(LiveTarget::Workload(kind, name)) if kind.kind == "Job" && name == "train"
        ));
        assert!(LiveTarget::parse("deployment/web").is_none());
        assert_eq!(
            LiveTarget::parse("resourceclaims/c"),
            Some(LiveTarget::Claim("c".into()))
        );
        assert_eq!(LiveTarget::parse("claim.yaml"), None);
        assert_eq!(LiveTarget::parse("dir/claim.yaml"), None);
        assert_eq!(LiveTarget::parse("pod/"), None);
        assert_eq!(LiveTarget::parse("deployments/d"), None);
    }
}
