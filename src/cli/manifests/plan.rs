//! The plan: pods' claims made as kube-controller-manager makes them (shared named claims,
//! one per pod from templates), grouped into units allocated together, with Kueue admission
//! and gangs (PodGroups, MPIJobs) kept together.
use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::names::{generated_name, name_chars, truncate, uid};
use super::{
    ClaimRef, Entry, Group, ManifestError, Manifests, POD_CLAIM_NAME_ANNOTATION, PodClaim,
    Replicas, Workload,
};
use super::{controllers, extended, kueue, placement, pod_group};

/// Where a claim's spec is written, for messages that name a field of it.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// `ResourceClaim default/x (f.yaml, document 2)`, or the template it was made from.
    pub object: String,
    /// `spec`, or `spec.spec` in a template.
    pub spec_path: &'static str,
}

/// The claims of one pod, allocated together (or claims no pod uses).
#[derive(Debug, Clone)]
pub struct Unit {
    /// `Pod default/p`, ...; `None` for the claims no pod uses.
    pub title: Option<String>,
    /// The workload the pod is a replica of (`Job default/j`), and how many replicas it has.
    pub workload: Option<(String, u64)>,
    /// The object whose pods it is one of, across templates, and whether they bind as a gang.
    pub group: Option<Group>,
    /// Extended resources the pod asks for that no DeviceClass backs: only a node whose
    /// allocatable has them (a device plugin) takes the pod.
    pub unserved: Vec<(String, String)>,
    pub claims: Vec<ResourceClaim>,
    /// Where the pod may go (none for claims no pod uses: any node).
    pub placement: placement::PodPlacement,
}

/// What to allocate, in input order.
#[derive(Debug, Default)]
pub struct Plan {
    pub units: Vec<Unit>,
    /// Replica counts and pods without claims, one line each.
    pub notes: Vec<String>,
    /// The claims made from templates, in unit order.
    pub generated: Vec<ResourceClaim>,
    /// Per claim (`namespace/name`).
    pub provenance: HashMap<String, Provenance>,
    /// Workloads Kueue would not admit (their pods are not placed).
    pub held: Vec<String>,
}

/// The claim's `status.allocation`, if it is allocated.
pub fn allocation_of(
    claim: &ResourceClaim,
) -> Option<&k8s_openapi::api::resource::v1::AllocationResult> {
    claim.status.as_ref()?.allocation.as_ref()
}

pub fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or(""),
        claim.metadata.name.as_deref().unwrap_or("")
    )
}

/// Indexes objects by `namespace/name`; a second definition is an error.
fn index<'a, T>(
    entries: &'a [Entry<T>],
    kind: &str,
    meta: impl Fn(&T) -> &ObjectMeta,
) -> Result<BTreeMap<String, &'a Entry<T>>, ManifestError> {
    let mut out: BTreeMap<String, &Entry<T>> = BTreeMap::new();
    for entry in entries {
        let m = meta(&entry.object);
        let key = format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or("")
        );
        if let Some(first) = out.get(&key) {
            return Err(ManifestError::Field {
                object: format!("{kind} {key}"),
                origin: entry.origin.clone(),
                field: "metadata.name".into(),
                message: format!("Duplicate value: already defined in {}", first.origin),
            });
        }
        out.insert(key, entry);
    }
    Ok(out)
}

/// The controller reference to pod `pod` a claim made for it carries.
pub(crate) fn pod_owner(
    pod: &str,
    pod_uid: &str,
    block_owner_deletion: Option<bool>,
) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.to_string(),
        uid: pod_uid.to_string(),
        controller: Some(true),
        block_owner_deletion,
    }
}

/// A claim made from `template` for pod claim `pod_claim` of pod `pod`, as the resourceclaim
/// controller makes it (`handleClaim`) and the API server names it.
pub(crate) fn claim_from_template(
    pod: &str,
    pod_uid: &str,
    namespace: &str,
    pod_claim: &str,
    template: &ResourceClaimTemplate,
) -> ResourceClaim {
    let mut generate_name = format!("{pod}-{pod_claim}-");
    // Both parts are cut in proportion, so a long pod name does not swallow the claim name.
    const MAX_BASE_LEN: usize = 57;
    if generate_name.len() > MAX_BASE_LEN {
        let len = generate_name.len();
        generate_name = format!(
            "{}-{}",
            truncate(pod, pod.len() * MAX_BASE_LEN / len),
            truncate(pod_claim, pod_claim.len() * MAX_BASE_LEN / len)
        );
    }
    let name = generated_name(&generate_name, &format!("{namespace}/{pod}/{pod_claim}"));
    let template_meta = template.spec.as_ref().and_then(|s| s.metadata.as_ref());
    let mut annotations = template_meta
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    annotations.insert(POD_CLAIM_NAME_ANNOTATION.into(), pod_claim.into());
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            generate_name: Some(generate_name),
            namespace: Some(namespace.to_string()),
            uid: Some(uid(&format!("ResourceClaim/{namespace}/{name}"))),
            annotations: Some(annotations),
            labels: template_meta.and_then(|m| m.labels.clone()),
            owner_references: Some(vec![pod_owner(pod, pod_uid, None)]),
            ..Default::default()
        },
        spec: template.spec.as_ref().and_then(|s| s.spec.clone()),
        status: None,
    }
}

/// The name replica `replica` of a workload's pods gets, in the style of its controller.
fn pod_name(w: &Workload, replica: u64) -> String {
    if let Some(name) = w
        .pod_names
        .as_ref()
        .and_then(|names| names.get(usize::try_from(replica).ok()?))
    {
        return name.clone();
    }
    let seed = format!("{}/{}/{}", w.kind, w.namespace, w.name);
    let suffix = name_chars(&format!("{seed}/{replica}"), 5);
    match w.kind {
        "Pod" => w.name.clone(),
        "StatefulSet" => format!("{}-{replica}", w.name),
        // KubeVirt's launcher pod of the VMI (a VM's VMI has the VM's name).
        "VirtualMachineInstance" | "VirtualMachine" => format!("virt-launcher-{}-{suffix}", w.name),
        // Pods of the Deployment's ReplicaSet `<name>-<pod-template-hash>`.
        "Deployment" => format!("{}-{}-{suffix}", w.name, name_chars(&seed, 10)),
        // Pods of the CronJob's Job `<name>-<scheduled minute>`.
        "CronJob" => {
            let minute = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, seed.as_bytes()).as_u128()
                % 90_000_000
                + 10_000_000;
            format!("{}-{minute}-{suffix}", w.name)
        }
        _ => format!("{}-{suffix}", w.name),
    }
}

fn replica_note(w: &Workload, all: bool) -> Option<String> {
    let what = w.describe();
    let n = w.replicas.count();
    let (count, unit) = match w.replicas {
        Replicas::Replicas(_) if w.kind == "Pod" || w.kind == "VirtualMachineInstance" => {
            return None;
        }
        Replicas::Replicas(0) if w.kind == "VirtualMachine" => {
            return Some(if all {
                format!(
                    "{what}: halted (spec.runStrategy or spec.running): no VMI runs; nothing to allocate"
                )
            } else {
                format!(
                    "{what}: halted (spec.runStrategy or spec.running): no VMI runs; allocating its claims anyway"
                )
            });
        }
        Replicas::Replicas(1) | Replicas::Parallel(1) => return None,
        Replicas::Replicas(n) => (n, "replicas"),
        Replicas::Parallel(n) => (n, "pods at once (parallelism)"),
        Replicas::PerNode => {
            return Some(format!(
                "{what}: one pod per node; allocating the one on this node"
            ));
        }
    };
    Some(match (all, n) {
        (true, 0) => format!("{what}: {count} {unit}; nothing to allocate"),
        (false, 0) => format!("{what}: {count} {unit}; allocating one pod's claims anyway"),
        (true, _) => format!("{what}: {count} {unit}, allocating each in turn"),
        (false, _) => format!(
            "{what}: {count} {unit}, allocating one pod's claims; --replicas places them all"
        ),
    })
}

/// Builds the pods' claims and orders everything to allocate. With `all_replicas`, every
/// replica of a workload is a pod of its own; otherwise one pod stands for the workload.
/// `classes`: DeviceClasses besides the inputs' own (`--classes`; an input's class of the same
/// name replaces one), for the extended resources they back.
pub fn plan(
    m: &Manifests,
    all_replicas: bool,
    classes: &[DeviceClass],
) -> Result<Plan, ManifestError> {
    let own: HashSet<&str> = m
        .classes
        .iter()
        .filter_map(|e| e.object.metadata.name.as_deref())
        .collect();
    let extended_classes = extended::class_mapping(
        m.classes.iter().map(|e| &e.object).chain(
            classes
                .iter()
                .filter(|c| !own.contains(c.metadata.name.as_deref().unwrap_or(""))),
        ),
    );
    let claims = index(&m.claims, "ResourceClaim", |c| &c.metadata)?;
    let templates = index(&m.templates, "ResourceClaimTemplate", |t| &t.metadata)?;
    let pod_groups = pod_group_members(m, all_replicas)?;
    let held = if m.kueue.is_empty() {
        BTreeMap::new()
    } else {
        kueue_admission(m, &templates)
    };
    // A group's claim from a template: one for all its pods.
    let mut group_claims: HashMap<String, ResourceClaim> = HashMap::new();
    let mut plan = Plan::default();
    for (key, entry) in &claims {
        plan.provenance.insert(
            key.clone(),
            Provenance {
                object: format!("ResourceClaim {key} ({})", entry.origin),
                spec_path: "spec",
            },
        );
    }
    let mut used = HashSet::new();
    let mut units: Vec<(usize, Unit)> = Vec::new();
    for entry in &m.workloads {
        let w = &entry.object;
        let object = w
            .group
            .as_ref()
            .map_or_else(|| w.describe(), |g| g.object.clone());
        if let Some(why) = held.get(&object) {
            if !plan.held.contains(&object) {
                plan.notes.push(format!(
                    "{object}: Kueue would not admit it ({why}): it stays suspended and none of its pods runs"
                ));
                plan.held.push(object);
            }
            continue;
        }
        let fail = |field: String, message: String| ManifestError::Field {
            object: w.describe(),
            origin: entry.origin.clone(),
            field,
            message,
        };
        let template_named = |name: &str, at: &str| {
            let key = format!("{}/{name}", w.namespace);
            match templates.get(&key) {
                Some(found) => Ok((key, *found)),
                None => Err(fail(
                    format!("{at}.resourceClaimTemplateName"),
                    format!("ResourceClaimTemplate {key} is not in the inputs (give it with -f)"),
                )),
            }
        };
        // No node serves the extended resources itself offline (no device plugin).
        let extended_requests = extended::requests(&w.containers, &extended_classes, |_| false);
        let unserved = extended::unserved(&w.containers, &extended_classes);
        let in_group = match &w.pod_group {
            Some(name) => {
                let key = format!("{}/{name}", w.namespace);
                let (group, pods) = pod_groups.get(&key).ok_or_else(|| {
                    fail(
                        format!("{}.schedulingGroup.podGroupName", w.spec_path),
                        format!("PodGroup {key} is not in the inputs (give it with -f)"),
                    )
                })?;
                Some((
                    &group.object,
                    Group {
                        object: group.object.describe(),
                        pods: *pods,
                        gang: group.object.min_count.map(|n| controllers::Gang {
                            min_count: n,
                            by: format!(
                                "{}: spec.schedulingPolicy.gang.minCount",
                                group.object.describe()
                            ),
                        }),
                    },
                ))
            }
            None => None,
        };
        let group = in_group
            .as_ref()
            .map(|(_, g)| g.clone())
            .or_else(|| w.group.clone());
        if w.claims.is_empty()
            && extended_requests.is_empty()
            && unserved.is_empty()
            && group.is_none()
        {
            plan.notes.push(format!(
                "{}: no {}.resourceClaims and no extended resource a DeviceClass backs; nothing to allocate",
                w.describe(),
                w.spec_path
            ));
            continue;
        }
        plan.notes.extend(replica_note(w, all_replicas));
        let total = w.replicas.count();
        let pods = if all_replicas { total } else { 1 };
        for replica in 0..pods {
            let pod = pod_name(w, replica);
            let pod_uid = uid(&format!("Pod/{}/{pod}", w.namespace));
            let mut pod_claims = Vec::new();
            for (i, pc) in w.claims.iter().enumerate() {
                let at = format!("{}.resourceClaims[{i}]", w.spec_path);
                let shared = in_group
                    .as_ref()
                    .filter(|(g, _)| g.claims.contains(pc))
                    .map(|(g, _)| *g);
                if let (Some(g), ClaimRef::Template(name)) = (shared, &pc.source) {
                    let group_key = format!("{}/{}/{}", g.namespace, g.name, pc.name);
                    if let Some(claim) = group_claims.get(&group_key) {
                        pod_claims.push(claim.clone());
                        continue;
                    }
                    let (key, found) = template_named(name, &at)?;
                    let claim = pod_group::claim_for_group(g, &pc.name, &found.object);
                    plan.provenance.insert(
                        claim_key(&claim),
                        Provenance {
                            object: format!(
                                "ResourceClaimTemplate {key} ({}), claim {} of {}",
                                found.origin,
                                pc.name,
                                g.describe()
                            ),
                            spec_path: "spec.spec",
                        },
                    );
                    plan.generated.push(claim.clone());
                    group_claims.insert(group_key, claim.clone());
                    pod_claims.push(claim);
                    continue;
                }
                match &pc.source {
                    ClaimRef::Named(name) => {
                        let key = format!("{}/{name}", w.namespace);
                        let found = claims.get(&key).ok_or_else(|| {
                            fail(
                                format!("{at}.resourceClaimName"),
                                format!(
                                    "ResourceClaim {key} is not in the inputs (give it with -f)"
                                ),
                            )
                        })?;
                        used.insert(key);
                        pod_claims.push(found.object.clone());
                    }
                    ClaimRef::Template(name) => {
                        let (key, found) = template_named(name, &at)?;
                        let claim = claim_from_template(
                            &pod,
                            &pod_uid,
                            &w.namespace,
                            &pc.name,
                            &found.object,
                        );
                        plan.provenance.insert(
                            claim_key(&claim),
                            Provenance {
                                object: format!(
                                    "ResourceClaimTemplate {key} ({}), claim {} of pod {pod}",
                                    found.origin, pc.name
                                ),
                                spec_path: "spec.spec",
                            },
                        );
                        plan.generated.push(claim.clone());
                        pod_claims.push(claim);
                    }
                }
            }
            // The scheduler's claim for the pod's extended resources, last.
            if !extended_requests.is_empty() {
                let base = format!("{pod}-extended-resources-");
                let name = generated_name(&base, &format!("{}/{pod}/extended", w.namespace));
                let claim = extended::claim(
                    &pod,
                    &pod_uid,
                    &w.namespace,
                    name,
                    extended_requests.clone(),
                );
                plan.provenance.insert(
                    claim_key(&claim),
                    Provenance {
                        object: format!(
                            "the extended resources of pod {pod} ({}, containers' resources)",
                            entry.origin
                        ),
                        spec_path: "spec",
                    },
                );
                plan.generated.push(claim.clone());
                pod_claims.push(claim);
            }
            let title = match (w.kind, all_replicas) {
                ("Pod", _) => format!("Pod {}/{pod}", w.namespace),
                ("VirtualMachineInstance" | "VirtualMachine", _) => {
                    format!(
                        "Pod {}/{pod} (virt-launcher of {})",
                        w.namespace,
                        w.describe()
                    )
                }
                (_, true) => format!(
                    "Pod {}/{pod} ({}, replica {} of {total})",
                    w.namespace,
                    w.describe(),
                    replica + 1
                ),
                (_, false) => format!("Pod {}/{pod} of {}", w.namespace, w.describe()),
            };
            units.push((
                entry.seq,
                Unit {
                    title: Some(title),
                    workload: Some((w.describe(), total)),
                    group: group.clone(),
                    unserved: unserved.clone(),
                    claims: pod_claims,
                    placement: w.placement.clone(),
                },
            ));
        }
    }
    // Claims no pod uses are allocated together, as one pod's (what `match CLAIM.yaml` did).
    let unused: Vec<&Entry<ResourceClaim>> = m
        .claims
        .iter()
        .filter(|e| !used.contains(&claim_key(&e.object)))
        .collect();
    if let Some(first) = unused.first() {
        units.push((
            first.seq,
            Unit {
                title: None,
                workload: None,
                group: None,
                unserved: vec![],
                claims: unused.iter().map(|e| e.object.clone()).collect(),
                placement: placement::PodPlacement::default(),
            },
        ));
    }
    units.sort_by_key(|(seq, _)| *seq);
    plan.units = gangs_together(units.into_iter().map(|(_, u)| u).collect());
    Ok(plan)
}

/// Kueue's verdict on each queued workload: the objects it would not admit.
fn kueue_admission(
    m: &Manifests,
    templates: &BTreeMap<String, &Entry<ResourceClaimTemplate>>,
) -> BTreeMap<String, String> {
    let mut order: Vec<kueue::Queued> = Vec::new();
    for w in m.workloads.iter().map(|e| &e.object) {
        let Some(queue) = &w.queue else { continue };
        let object = w
            .group
            .as_ref()
            .map_or_else(|| w.describe(), |g| g.object.clone());
        // A missing template is the plan's error, below.
        let claims: Vec<(&PodClaim, Option<&ResourceClaimTemplate>)> = w
            .claims
            .iter()
            .filter_map(|pc| match &pc.source {
                ClaimRef::Named(_) => Some((pc, None)),
                ClaimRef::Template(t) => templates
                    .get(&format!("{}/{t}", w.namespace))
                    .map(|e| (pc, Some(&e.object))),
            })
            .collect();
        let pods = w.replicas.count() as f64;
        let usage = kueue::pod_usage(&w.containers, &claims, m.kueue.device_classes.as_ref())
            .map(|u| u.into_iter().map(|(k, v)| (k, v * pods)).collect());
        let at = match order.iter().position(|q| q.object == object) {
            Some(at) => {
                let total = &mut order[at].usage;
                *total = match (std::mem::replace(total, Ok(BTreeMap::new())), usage) {
                    (Ok(mut sum), Ok(more)) => {
                        for (k, v) in more {
                            *sum.entry(k).or_default() += v;
                        }
                        Ok(sum)
                    }
                    (Err(why), _) | (_, Err(why)) => Err(why),
                };
                at
            }
            None => {
                order.push(kueue::Queued {
                    object,
                    queue: format!("{}/{queue}", w.namespace),
                    usage,
                    workload_priority_class: w.kueue_priority_class.clone(),
                    pod_priority_class: None,
                    created: w.created.clone(),
                });
                order.len() - 1
            }
        };
        // Kueue takes the class of the first pod set that names one.
        let queued = &mut order[at];
        if queued.pod_priority_class.is_none() {
            queued.pod_priority_class = w.priority_class_name.clone();
        }
    }
    kueue::admit(&m.kueue, &order)
}

/// Units in input order, except that the pods of one group follow its first: a gang's pods
/// are placed (or given back) together.
fn gangs_together(units: Vec<Unit>) -> Vec<Unit> {
    let mut order: Vec<Vec<Unit>> = Vec::new();
    let mut slot: HashMap<String, usize> = HashMap::new();
    for unit in units {
        match unit.group.as_ref().map(|g| g.object.clone()) {
            Some(object) => match slot.get(&object) {
                Some(&i) => order[i].push(unit),
                None => {
                    slot.insert(object, order.len());
                    order.push(vec![unit]);
                }
            },
            None => order.push(vec![unit]),
        }
    }
    order.into_iter().flatten().collect()
}

/// Each PodGroup the workloads' pods name, with how many pods name it.
fn pod_group_members(
    m: &Manifests,
    all_replicas: bool,
) -> Result<HashMap<String, (&Entry<pod_group::PodGroup>, u64)>, ManifestError> {
    let mut out: HashMap<String, (&Entry<pod_group::PodGroup>, u64)> = HashMap::new();
    for entry in &m.pod_groups {
        let key = format!("{}/{}", entry.object.namespace, entry.object.name);
        if let Some((first, _)) = out.get(&key) {
            return Err(ManifestError::Field {
                object: entry.object.describe(),
                origin: entry.origin.clone(),
                field: "metadata.name".into(),
                message: format!("Duplicate value: already defined in {}", first.origin),
            });
        }
        out.insert(key, (entry, 0));
    }
    for w in m.workloads.iter().map(|e| &e.object) {
        if let Some(name) = &w.pod_group
            && let Some((_, pods)) = out.get_mut(&format!("{}/{name}", w.namespace))
        {
            *pods += if all_replicas { w.replicas.count() } else { 1 };
        }
    }
    Ok(out)
}
