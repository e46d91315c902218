//! What users `kubectl apply -f`, read for `match` and `explain`: multi-document YAML or JSON
//! (also `kind: List`) holding Pods, workloads (Deployment, ReplicaSet, StatefulSet, DaemonSet,
//! Job, CronJob), KubeVirt's VirtualMachineInstances and VirtualMachines (their virt-launcher
//! pod holds their claims), and resource.k8s.io ResourceClaims, ResourceClaimTemplates, DeviceClasses and
//! ResourceSlices in v1beta1, v1beta2 or v1 ([`convert`] makes them v1 as the API server does,
//! [`validate`] applies its create-time checks). Other kinds are skipped with a note.
//!
//! A pod's claims are made the way kube-controller-manager's resourceclaim controller makes
//! them: `resourceClaimName` names an existing claim (shared, allocated once), and
//! `resourceClaimTemplateName` gets a claim of its own from the template, named
//! `<pod>-<pod claim>-<5 characters>`. Generated names are derived from the inputs (the API
//! server's are random), so the same manifests always give the same names.
//!
//! This module holds what is read (documents, workloads, [`Manifests`]); `documents` reads
//! sources into documents, `objects` adds each to [`Manifests`], `workload` reads pod specs,
//! `plan` makes the claims and units to allocate, `names` derives generated names.
pub mod controllers;
pub mod convert;
pub mod derived;
mod documents;
pub mod driver_config;
pub mod extended;
pub mod kueue;
mod names;
mod objects;
pub mod placement;
mod plan;
pub mod pod_group;
pub mod taint_rules;
#[cfg(test)]
mod tests;
pub mod validate;
pub mod validate_slice;
mod workload;

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde_json::Value;

use convert::FieldError;
pub use documents::{for_each_document, parse_text};
use names::uid;
pub use plan::{Plan, Provenance, Unit, allocation_of, claim_key, plan};
pub(crate) use plan::{claim_from_template, pod_owner};

/// The annotation kube-controller-manager puts on claims it makes from a template.
const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// Objects without a namespace go where `kubectl apply` puts them with a default context.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Where a document came from: file (`-` is stdin), YAML document and List item, from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub file: Arc<str>,
    pub document: usize,
    pub item: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, document {}", self.file, self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{file}: {message}")]
    Read { file: String, message: String },
    #[error("{origin}: {message}")]
    Document { origin: Origin, message: String },
    /// `ResourceClaim default/x (f.yaml, document 2): spec.devices...: Required value`.
    #[error("{object} ({origin}): {}", at_field(.field, .message))]
    Field {
        object: String,
        origin: Origin,
        field: String,
        message: String,
    },
}

fn at_field(field: &str, message: &str) -> String {
    if field.is_empty() {
        message.to_string()
    } else {
        format!("{field}: {message}")
    }
}

/// One document (or List item) of a source.
#[derive(Debug, Clone)]
pub struct Doc {
    pub value: Value,
    pub origin: Origin,
}

/// An object with where it came from; `seq` orders everything read.
#[derive(Debug, Clone)]
pub struct Entry<T> {
    pub object: T,
    pub origin: Origin,
    pub seq: usize,
}

/// A Pod, or a workload whose pod template may ask for claims.
#[derive(Debug, Clone)]
pub struct Workload {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// Field path of the pod spec (`spec`, `spec.template.spec`, ...).
    pub spec_path: String,
    pub claims: Vec<PodClaim>,
    /// Init containers then containers, with their resource requests (extended resources).
    pub containers: Vec<extended::ContainerResources>,
    pub replicas: Replicas,
    /// Node selection, tolerations, `nodeName`: which nodes the scheduler may put it on.
    pub placement: placement::PodPlacement,
    /// The pods' names where the controller's model gives them (one per replica).
    pub pod_names: Option<Vec<String>>,
    /// The object several pod templates make pods for (an MPIJob's launcher and workers).
    pub group: Option<Group>,
    /// `schedulingGroup.podGroupName` of the pod spec: the PodGroup it binds with.
    pub pod_group: Option<String>,
    /// The Kueue LocalQueue (`kueue.x-k8s.io/queue-name`) the object is queued in.
    pub queue: Option<String>,
    /// What Kueue orders a queue by: the object's WorkloadPriorityClass label
    /// (`kueue.x-k8s.io/priority-class`), its pods' `priorityClassName`, and its
    /// `metadata.creationTimestamp` (absent in files: made after everything that has one).
    pub kueue_priority_class: Option<String>,
    pub priority_class_name: Option<String>,
    pub created: Option<String>,
}

/// The workload object a pod belongs to, when it is more than one template's pods, or pods
/// that bind as a gang.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// `MPIJob ns/name`, `PodGroup ns/name`.
    pub object: String,
    /// Its pods, all templates together.
    pub pods: u64,
    pub gang: Option<controllers::Gang>,
}

impl Workload {
    fn describe(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One entry of a pod's `spec.resourceClaims`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    pub name: String,
    pub source: ClaimRef,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimRef {
    Named(String),
    Template(String),
}

/// How many pods a workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicas {
    /// `spec.replicas` of a Deployment, ReplicaSet or StatefulSet (1 for a Pod).
    Replicas(u64),
    /// Pods of a Job that run at once: parallelism, at most completions.
    Parallel(u64),
    /// A DaemonSet: one pod on every node; here, the one node.
    PerNode,
}

impl Replicas {
    fn count(self) -> u64 {
        match self {
            Self::Replicas(n) | Self::Parallel(n) => n,
            Self::PerNode => 1,
        }
    }
}

/// Everything read from the sources, converted to v1.
#[derive(Debug, Default)]
pub struct Manifests {
    pub claims: Vec<Entry<ResourceClaim>>,
    pub templates: Vec<Entry<ResourceClaimTemplate>>,
    pub classes: Vec<Entry<DeviceClass>>,
    pub slices: Vec<Entry<ResourceSlice>>,
    pub taint_rules: Vec<Entry<k8s_openapi::api::resource::v1::DeviceTaintRule>>,
    /// Nodes (core/v1): their labels and taints decide where pods may go.
    pub nodes: Vec<Entry<k8s_openapi::api::core::v1::Node>>,
    pub workloads: Vec<Entry<Workload>>,
    /// `scheduling.k8s.io` PodGroups: pods that bind together, and claims they share.
    pub pod_groups: Vec<Entry<pod_group::PodGroup>>,
    /// Kueue's queues and quotas, when given.
    pub kueue: kueue::Kueue,
    /// One line per skipped object.
    pub notes: Vec<String>,
    /// The API server's gates its create-time checks of objects read follow.
    pub gates: validate::ApiGates,
    next_seq: usize,
}

/// One claim's or template's device spec, with what a message about one of its fields names.
pub struct DeviceClaimRef<'m> {
    /// `ResourceClaim NAMESPACE/NAME` or `ResourceClaimTemplate NAMESPACE/NAME`.
    pub object: String,
    pub origin: &'m Origin,
    pub devices: Option<&'m k8s_openapi::api::resource::v1::DeviceClaim>,
    /// Path of `devices` in the object: `spec.devices` or `spec.spec.devices`.
    pub at: &'static str,
}

impl DeviceClaimRef<'_> {
    pub fn field_error(&self, field: String, message: String) -> ManifestError {
        ManifestError::Field {
            object: self.object.clone(),
            origin: self.origin.clone(),
            field,
            message,
        }
    }
}

impl Manifests {
    /// None read yet; objects read will be checked as an API server with these gates would.
    pub fn with_gates(gates: validate::ApiGates) -> Self {
        Manifests {
            gates,
            ..Manifests::default()
        }
    }

    /// Every claim's and template's device spec, claims first.
    pub fn device_claims(&self) -> impl Iterator<Item = DeviceClaimRef<'_>> {
        let label =
            |kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
                let name = meta
                    .name
                    .as_deref()
                    .or(meta.generate_name.as_deref())
                    .unwrap_or("<no name>");
                let namespace = meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
                format!("{kind} {namespace}/{name}")
            };
        let claims = self.claims.iter().map(move |e| DeviceClaimRef {
            object: label("ResourceClaim", &e.object.metadata),
            origin: &e.origin,
            devices: e.object.spec.as_ref().and_then(|s| s.devices.as_ref()),
            at: "spec.devices",
        });
        let templates = self.templates.iter().map(move |e| DeviceClaimRef {
            object: label("ResourceClaimTemplate", &e.object.metadata),
            origin: &e.origin,
            devices: e
                .object
                .spec
                .as_ref()
                .and_then(|s| s.spec.as_ref())
                .and_then(|s| s.devices.as_ref()),
            at: "spec.spec.devices",
        });
        claims.chain(templates)
    }
}

/// The namespace and name written in a document, for messages before it is decoded.
fn raw_identity(value: &Value, namespaced: bool) -> String {
    let meta = value.get("metadata");
    let get = |key: &str| meta.and_then(|m| m.get(key)).and_then(Value::as_str);
    let name = get("name")
        .or_else(|| get("generateName"))
        .unwrap_or("<no name>");
    if namespaced {
        format!("{}/{name}", get("namespace").unwrap_or(DEFAULT_NAMESPACE))
    } else {
        name.to_string()
    }
}

fn field_error(object: &str, origin: &Origin, e: FieldError) -> ManifestError {
    ManifestError::Field {
        object: object.to_string(),
        origin: origin.clone(),
        field: e.field,
        message: e.message,
    }
}
